// The rendezvous store: StoreServer's poll loop on one thread, StoreClients on socketpairs from others.
// Blocking gets, waits that time out naming the missing keys, many clients at once, and clients that
// misbehave (garbage, half a frame, too much data) dropped without disturbing the rest.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "engine/core/comm/frame.h"
#include "engine/core/comm/store_client.h"
#include "engine/core/comm/store_server.h"

namespace gantry {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;
using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

std::vector<uint8_t> bytes(const std::string& s) {
  return std::vector<uint8_t>(s.begin(), s.end());
}

// A StoreServer served by its own thread. Clients are added before start(); the test talks to the
// client ends. Everything the server reports is collected under a lock.
class ServerThread {
 public:
  explicit ServerThread(StoreServerOptions options = {}) : server_(std::move(options)) {}
  ~ServerThread() { stop(); }

  // Returns the client end of a new connection.
  int connect(const std::string& name) {
    int fds[2];
    EXPECT_EQ(::socketpair(AF_UNIX, SOCK_STREAM, 0, fds), 0);
    server_.add_client(fds[0], name);
    client_fds_.push_back(fds[1]);
    return fds[1];
  }
  void start() {
    thread_ = std::thread([this] {
      while (!stop_) {
        Status st = server_.poll_once(50ms);
        EXPECT_TRUE(st.ok()) << st.message();
        std::lock_guard<std::mutex> lock(mu_);
        for (auto& g : server_.take_gone()) gone_.push_back(g);
      }
    });
  }
  void stop() {
    if (thread_.joinable()) {
      stop_ = true;
      server_.wake();
      thread_.join();
    }
    for (int fd : client_fds_) ::close(fd);
    client_fds_.clear();
  }
  std::vector<StoreClientGone> gone() {
    std::lock_guard<std::mutex> lock(mu_);
    return gone_;
  }
  // Waits until the server has dropped `n` clients.
  bool wait_gone(size_t n, std::chrono::milliseconds limit) {
    auto until = Clock::now() + limit;
    while (Clock::now() < until) {
      if (gone().size() >= n) return true;
      std::this_thread::sleep_for(5ms);
    }
    return false;
  }
  StoreServer& server() { return server_; }  // only after stop()

 private:
  StoreServer server_;
  std::thread thread_;
  std::atomic<bool> stop_{false};
  std::mutex mu_;
  std::vector<StoreClientGone> gone_;
  std::vector<int> client_fds_;
};

TEST(Store, SetThenGetFromAnotherClient) {
  ServerThread srv;
  StoreClient a(srv.connect("rank 0")), b(srv.connect("rank 1"));
  srv.start();
  ASSERT_TRUE(a.set("k", bytes(std::string("value\0nul", 9)), 2s).ok());
  Result<std::vector<uint8_t>> v = b.get("k", 2s);
  ASSERT_TRUE(v.ok()) << v.error();
  EXPECT_EQ(v.value(), bytes(std::string("value\0nul", 9)));
  ASSERT_TRUE(a.set("k", bytes("v2"), 2s).ok());  // overwrite
  EXPECT_EQ(b.get("k", 2s).value(), bytes("v2"));
  ASSERT_TRUE(b.set("empty", {}, 2s).ok());
  EXPECT_TRUE(a.get("empty", 2s).value().empty());
}

TEST(Store, GetBlocksUntilAnotherClientSets) {
  ServerThread srv;
  StoreClient a(srv.connect("rank 0")), b(srv.connect("rank 1"));
  srv.start();
  auto t0 = Clock::now();
  std::thread setter([&] {
    std::this_thread::sleep_for(150ms);
    EXPECT_TRUE(a.set("late", bytes("here"), 2s).ok());
  });
  Result<std::vector<uint8_t>> v = b.get("late", 5s);
  auto waited = Clock::now() - t0;
  setter.join();
  ASSERT_TRUE(v.ok()) << v.error();
  EXPECT_EQ(v.value(), bytes("here"));
  EXPECT_GE(waited, 140ms);
  EXPECT_LT(waited, 2s);
}

TEST(Store, WaitTimesOutNamingTheMissingKeys) {
  ServerThread srv;
  StoreClient a(srv.connect("rank 0"));
  srv.start();
  ASSERT_TRUE(a.set("rank/0", bytes("x"), 2s).ok());
  auto t0 = Clock::now();
  Status st = a.wait({"rank/0", "rank/1", "rank/2"}, 200ms);
  auto waited = Clock::now() - t0;
  ASSERT_FALSE(st.ok());
  EXPECT_THAT(st.message(), HasSubstr("timeout"));
  EXPECT_THAT(st.message(), HasSubstr("\"rank/1\", \"rank/2\""));
  EXPECT_THAT(st.message(), HasSubstr("1 of 3 keys set"));
  EXPECT_GE(waited, 190ms);
  EXPECT_LT(waited, 2s);
  // The connection stays usable after a timed-out wait.
  EXPECT_TRUE(a.wait({"rank/0"}, 1s).ok());
  EXPECT_THAT(a.get("never", 100ms).error(), HasSubstr("\"never\""));
}

TEST(Store, ManyClientsMeetThroughOneServer) {
  constexpr int n = 16;
  ServerThread srv;
  std::vector<std::unique_ptr<StoreClient>> clients;
  for (int r = 0; r < n; ++r)
    clients.push_back(std::make_unique<StoreClient>(srv.connect("rank " + std::to_string(r))));
  srv.start();
  std::vector<std::thread> threads;
  std::vector<std::string> errors(n);
  for (int r = 0; r < n; ++r) {
    threads.emplace_back([&, r] {
      StoreClient& c = *clients[static_cast<size_t>(r)];
      if (Status st = c.set("addr/" + std::to_string(r), bytes("rank-" + std::to_string(r)), 5s); !st.ok()) {
        errors[static_cast<size_t>(r)] = st.message();
        return;
      }
      for (int p = 0; p < n; ++p) {
        Result<std::vector<uint8_t>> v = c.get("addr/" + std::to_string(p), 5s);
        if (!v.ok() || v.value() != bytes("rank-" + std::to_string(p))) {
          errors[static_cast<size_t>(r)] = v.ok() ? "wrong value for " + std::to_string(p) : v.error();
          return;
        }
      }
    });
  }
  for (auto& t : threads) t.join();
  for (int r = 0; r < n; ++r) EXPECT_EQ(errors[static_cast<size_t>(r)], "") << "rank " << r;
}

TEST(Store, GarbageFromOneClientDropsOnlyThatClient) {
  ServerThread srv;
  int bad_fd = srv.connect("rank 1");
  StoreClient good(srv.connect("rank 0"));
  srv.start();
  const char garbage[] = "GET / HTTP/1.1\r\n\r\n";
  ASSERT_EQ(::write(bad_fd, garbage, sizeof garbage - 1), static_cast<ssize_t>(sizeof garbage - 1));
  ASSERT_TRUE(srv.wait_gone(1, 2s));
  auto gone = srv.gone();
  EXPECT_EQ(gone[0].name, "rank 1");
  EXPECT_THAT(gone[0].reason, HasSubstr("bad magic"));
  EXPECT_FALSE(gone[0].clean);
  EXPECT_TRUE(good.set("still", bytes("fine"), 2s).ok());
  // The server closed its end: the misbehaving client sees the stream end.
  char c;
  EXPECT_EQ(::read(bad_fd, &c, 1), 0);
}

TEST(Store, TruncatedFrameAndOrderlyCloseAreTold) {
  ServerThread srv;
  int half = srv.connect("rank 0");
  int quiet = srv.connect("rank 1");
  srv.start();
  auto f = frame_encode(static_cast<uint8_t>(FrameType::store_set), std::vector<uint8_t>(100, 1));
  ASSERT_EQ(::write(half, f.data(), 50), 50);
  ::shutdown(half, SHUT_WR);
  ::shutdown(quiet, SHUT_WR);
  ASSERT_TRUE(srv.wait_gone(2, 2s));
  for (const auto& g : srv.gone()) {
    if (g.name == "rank 0") {
      EXPECT_THAT(g.reason, HasSubstr("truncated frame"));
      EXPECT_FALSE(g.clean);
    } else {
      EXPECT_EQ(g.reason, "peer closed");
      EXPECT_TRUE(g.clean);
    }
  }
}

TEST(Store, RefusesValuesBeyondItsLimitAndOversizedFrames) {
  StoreServerOptions opt;
  opt.max_store_bytes = 1000;
  opt.max_payload = 4096;
  ServerThread srv(opt);
  StoreClient a(srv.connect("rank 0"));
  StoreClient b(srv.connect("rank 1"));
  srv.start();
  Status st = a.set("big", std::vector<uint8_t>(2000, 0), 2s);
  ASSERT_FALSE(st.ok());
  EXPECT_THAT(st.message(), HasSubstr("refused"));
  EXPECT_TRUE(a.set("small", std::vector<uint8_t>(100, 0), 2s).ok());  // still served
  st = b.set("huge", std::vector<uint8_t>(8192, 0), 2s);  // over the frame limit: a protocol error
  ASSERT_FALSE(st.ok());
  EXPECT_THAT(st.message(), HasSubstr("peer closed"));
  ASSERT_TRUE(srv.wait_gone(1, 2s));
  EXPECT_THAT(srv.gone()[0].reason, HasSubstr("oversized frame"));
}

TEST(Store, ClientFailsPromptlyWhenTheServerIsGone) {
  int fds[2];
  ASSERT_EQ(::socketpair(AF_UNIX, SOCK_STREAM, 0, fds), 0);
  ::close(fds[0]);
  StoreClient c(fds[1]);
  auto t0 = Clock::now();
  Status st = c.wait({"k"}, 5s);
  ASSERT_FALSE(st.ok());
  EXPECT_THAT(st.message(), HasSubstr("peer closed"));
  EXPECT_LT(Clock::now() - t0, 1s);
  EXPECT_THAT(c.set("k", {}, 1s).message(), HasSubstr("unusable"));  // sticky
  ::close(fds[1]);
}

TEST(Store, OtherFrameTypesGoToTheLauncherHook) {
  std::vector<uint8_t> seen_types;
  std::mutex mu;
  StoreServerOptions opt;
  opt.on_frame = [&](int, const Frame& f) {
    std::lock_guard<std::mutex> lock(mu);
    seen_types.push_back(f.type);
  };
  ServerThread srv(opt);
  int fd = srv.connect("rank 0");
  srv.start();
  ASSERT_TRUE(frame_send(fd, 0x21, bytes("heartbeat"), 1s).ok());
  StoreClient c(fd);
  ASSERT_TRUE(c.set("after", bytes("x"), 2s).ok());  // store traffic still flows on the same socket
  std::lock_guard<std::mutex> lock(mu);
  EXPECT_EQ(seen_types, std::vector<uint8_t>{0x21});
}

TEST(Store, LauncherSideSetWakesWaiters) {
  ServerThread srv;
  StoreClient a(srv.connect("rank 0"));
  StoreServer& server = srv.server();
  // No server thread here: the test drives the loop by hand, as a launcher's own poll loop would.
  std::atomic<bool> done{false};
  std::thread client([&] {
    Result<std::vector<uint8_t>> v = a.get("nccl/id", 5s);
    EXPECT_TRUE(v.ok() && v.value() == bytes("id")) << (v.ok() ? "wrong value" : v.error());
    done = true;
  });
  auto t0 = Clock::now();
  while (Clock::now() - t0 < 100ms) ASSERT_TRUE(server.poll_once(10ms).ok());  // the get is now waiting
  EXPECT_FALSE(done);
  server.set("nccl/id", bytes("id"));
  while (!done && Clock::now() - t0 < 3s) ASSERT_TRUE(server.poll_once(10ms).ok());
  client.join();
  EXPECT_TRUE(done);
}

}  // namespace
}  // namespace gantry
