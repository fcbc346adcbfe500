// Gloo's rendezvous store interface answered by our StoreClient, so Gloo's TCP device exchanges its pair
// addresses through the worker's inherited socket and the launcher, never through a TCP store of its
// own (DESIGN.md: workers have no network library of their own). Built only where Gloo is installed
// (GANTRY_HAVE_GLOO).
//
//   StoreClient client(fd);
//   GlooStore store(client, "dp/", std::chrono::seconds(30));   // every key becomes "dp/<key>"
//   context->connectFullMesh(store, device);
//
// Gloo's Store interface cannot return errors, so failures are thrown as gloo::IoException carrying our
// message; gloo_communicator_create catches them and returns a Status. Nothing else sees the exception.
#pragma once

#include <gloo/rendezvous/store.h>  // gloo::rendezvous::Store, the interface implemented here

#include <chrono>
#include <string>
#include <vector>

#include "engine/core/comm/store_client.h"

namespace gantry {

class GlooStore : public gloo::rendezvous::Store {
 public:
  // `prefix` namespaces the keys so several communicators (one per parallel axis) can rendezvous over the
  // same socket; `timeout` bounds get() and the wait() overload that has none.
  GlooStore(StoreClient& client, std::string prefix, std::chrono::milliseconds timeout)
      : client_(client), prefix_(std::move(prefix)), timeout_(timeout) {}

  void set(const std::string& key, const std::vector<char>& data) override;
  std::vector<char> get(const std::string& key) override;
  void wait(const std::vector<std::string>& keys) override;
  void wait(const std::vector<std::string>& keys, const std::chrono::milliseconds& timeout) override;

 private:
  StoreClient& client_;
  std::string prefix_;
  std::chrono::milliseconds timeout_;
};

}  // namespace gantry
