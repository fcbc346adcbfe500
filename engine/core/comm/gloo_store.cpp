#include "engine/core/comm/gloo_store.h"

#include <gloo/common/error.h>  // gloo::IoException: how a Store reports failure to Gloo

#include <span>

namespace gantry {

void GlooStore::set(const std::string& key, const std::vector<char>& data) {
  std::span<const uint8_t> bytes(reinterpret_cast<const uint8_t*>(data.data()), data.size());
  Status st = client_.set(prefix_ + key, bytes, timeout_);
  if (!st.ok()) throw gloo::IoException(st.message());
}

std::vector<char> GlooStore::get(const std::string& key) {
  // Gloo calls get() for keys another rank may not have set yet: the server-side wait makes it block
  // until the key appears, as Gloo's own stores do.
  Result<std::vector<uint8_t>> value = client_.get(prefix_ + key, timeout_);
  if (!value.ok()) throw gloo::IoException(value.error());
  return std::vector<char>(value->begin(), value->end());
}

void GlooStore::wait(const std::vector<std::string>& keys) {
  wait(keys, timeout_);
}

void GlooStore::wait(const std::vector<std::string>& keys, const std::chrono::milliseconds& timeout) {
  std::vector<std::string> full;
  full.reserve(keys.size());
  for (const auto& k : keys) full.push_back(prefix_ + k);
  // Gloo passes the context's timeout, which gloo_communicator_create sets to ours.
  Status st = client_.wait(full, timeout.count() > 0 ? timeout : timeout_);
  if (!st.ok()) throw gloo::IoException(st.message());
}

}  // namespace gantry
