// The worker runtime's frames: round trips, malformed payloads refused with a message, and
// StoreClient::send multiplexing one-way frames with store requests on one socket.
#include "engine/core/worker/worker_frames.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <thread>

#include "engine/core/comm/store_client.h"
#include "engine/core/comm/store_server.h"

namespace gantry {
namespace {

using namespace std::chrono_literals;
using ::testing::HasSubstr;

TEST(WorkerFrames, HelloRoundTrip) {
  WorkerHello h{.rank = 3, .world = 8, .local_rank = 1, .pid = 123456, .device = -1, .host = "node-3"};
  Result<WorkerHello> got = worker_hello_decode(worker_hello_encode(h));
  ASSERT_TRUE(got.ok()) << got.error();
  EXPECT_EQ(got->rank, 3);
  EXPECT_EQ(got->world, 8);
  EXPECT_EQ(got->local_rank, 1);
  EXPECT_EQ(got->pid, 123456);
  EXPECT_EQ(got->device, -1);
  EXPECT_EQ(got->host, "node-3");
}

TEST(WorkerFrames, ExitAndRunRoundTrip) {
  Result<WorkerExit> e = worker_exit_decode(worker_exit_encode({130, "stopped at step 7"}));
  ASSERT_TRUE(e.ok()) << e.error();
  EXPECT_EQ(e->code, 130);
  EXPECT_EQ(e->message, "stopped at step 7");
  WorkerRun r{.summary = "gantry x",
              .config_toml = "[model]\n",
              .code_version = "abc",
              .data_version = "00ff",
              .backend = "cpu",
              .params = 3952,
              .peak_name = "cpu (configured)",
              .peak_flops = 134.4e9,
              .flops_per_token = 772608,
              .mfu_formula = "MFU = tokens/s x ..."};
  Result<WorkerRun> got = worker_run_decode(worker_run_encode(r));
  ASSERT_TRUE(got.ok()) << got.error();
  EXPECT_EQ(got->summary, "gantry x");
  EXPECT_EQ(got->config_toml, "[model]\n");
  EXPECT_EQ(got->code_version, "abc");
  EXPECT_EQ(got->data_version, "00ff");
  EXPECT_EQ(got->backend, "cpu");
  EXPECT_EQ(got->params, 3952u);
  EXPECT_EQ(got->peak_name, "cpu (configured)");
  EXPECT_EQ(got->peak_flops, 134.4e9);
  EXPECT_EQ(got->flops_per_token, 772608.0);
  EXPECT_EQ(got->mfu_formula, "MFU = tokens/s x ...");
}

TEST(WorkerFrames, MalformedPayloadsAreRefused) {
  std::vector<uint8_t> hello = worker_hello_encode({.host = "h"});
  std::vector<uint8_t> shorter(hello.begin(), hello.end() - 1);
  Result<WorkerHello> h = worker_hello_decode(shorter);
  ASSERT_FALSE(h.ok());
  EXPECT_THAT(h.error(),
              HasSubstr("worker_hello frame of " + std::to_string(shorter.size()) + " bytes is malformed"));
  std::vector<uint8_t> longer = hello;
  longer.push_back(0);
  EXPECT_FALSE(worker_hello_decode(longer).ok());
  EXPECT_FALSE(worker_exit_decode(std::vector<uint8_t>{1, 0}).ok());
  std::vector<uint8_t> run = worker_run_encode({});
  run.pop_back();
  EXPECT_FALSE(worker_run_decode(run).ok());
}

// One socket, as the worker has it: one-way frames between store requests arrive at on_frame, in order,
// and the store keeps answering.
TEST(StoreClientSend, OneWayFramesShareTheSocketWithStoreRequests) {
  int sp[2];
  ASSERT_EQ(::socketpair(AF_UNIX, SOCK_STREAM, 0, sp), 0);
  std::vector<uint8_t> seen_types;
  std::vector<std::string> hosts;
  StoreServerOptions so;
  so.on_frame = [&](int, const Frame& f) {
    seen_types.push_back(f.type);
    if (f.type == static_cast<uint8_t>(FrameType::worker_hello))
      hosts.push_back(worker_hello_decode(f.payload)->host);
  };
  StoreServer server(std::move(so));
  server.add_client(sp[0], "rank 0");
  std::atomic<bool> done{false};
  std::thread loop([&] {
    while (!done.load()) server.poll_once(10ms);
  });

  StoreClient client(sp[1]);
  EXPECT_TRUE(client.send(FrameType::worker_hello, worker_hello_encode({.host = "first"}), 1s).ok());
  const std::vector<uint8_t> value = {1, 2, 3};
  EXPECT_TRUE(client.set("k", value, 1s).ok());
  EXPECT_TRUE(client.send(FrameType::worker_hello, worker_hello_encode({.host = "second"}), 1s).ok());
  Result<std::vector<uint8_t>> got = client.get("k", 1s);
  ASSERT_TRUE(got.ok()) << got.error();
  EXPECT_EQ(got.value(), value);
  EXPECT_TRUE(client.send(FrameType::worker_exit, worker_exit_encode({0, "bye"}), 1s).ok());
  // The get above was answered after both hellos were read; the exit may need one more round.
  for (int i = 0; i < 100 && seen_types.size() < 3; ++i) std::this_thread::sleep_for(10ms);
  done.store(true);
  server.wake();
  loop.join();
  ASSERT_EQ(seen_types.size(), 3u);
  EXPECT_EQ(seen_types[0], static_cast<uint8_t>(FrameType::worker_hello));
  EXPECT_EQ(seen_types[2], static_cast<uint8_t>(FrameType::worker_exit));
  EXPECT_EQ(hosts, (std::vector<std::string>{"first", "second"}));
  ::close(sp[1]);
}

TEST(WorkerFrames, CommandRoundTripAndBadAction) {
  Result<WorkerCommand> c =
      worker_command_decode(worker_command_encode({.action = TrainAction::pause, .id = 42, .from = "ctl"}));
  ASSERT_TRUE(c.ok()) << c.error();
  EXPECT_EQ(c->action, TrainAction::pause);
  EXPECT_EQ(c->id, 42u);
  EXPECT_EQ(c->from, "ctl");
  std::vector<uint8_t> bad = worker_command_encode({.action = TrainAction::stop, .id = 1, .from = ""});
  bad[0] = 9;
  Result<WorkerCommand> b = worker_command_decode(bad);
  ASSERT_FALSE(b.ok());
  EXPECT_THAT(b.error(), HasSubstr("action 9: expected 1 (checkpoint)"));
  bad.pop_back();
  EXPECT_THAT(worker_command_decode(bad).error(), HasSubstr("malformed"));
}

// A command that arrives while a store request waits for its reply is kept, not taken for a protocol
// error; one that arrives between requests is read by take_frames without blocking.
TEST(StoreClientTakeFrames, CommandsDuringARequestAreKeptAndLaterOnesRead) {
  int sp[2];
  ASSERT_EQ(::socketpair(AF_UNIX, SOCK_STREAM, 0, sp), 0);
  StoreServer server({.on_frame = [](int, const Frame&) {}});
  const int client_id = server.add_client(sp[0], "rank 0");
  server.set("k", {7});
  StoreClient client(sp[1]);
  std::vector<Frame> got;
  ASSERT_TRUE(client.take_frames(&got).ok());
  EXPECT_TRUE(got.empty());  // nothing sent: returns at once

  // Queued before the get's reply, so it reaches the client while get() waits.
  ASSERT_TRUE(server
                  .send(client_id, static_cast<uint8_t>(FrameType::worker_command),
                        worker_command_encode({.action = TrainAction::checkpoint, .id = 1, .from = "a"}))
                  .ok());
  std::atomic<bool> done{false};
  std::thread loop([&] {
    while (!done.load()) server.poll_once(10ms);
  });
  Result<std::vector<uint8_t>> v = client.get("k", 2s);
  done.store(true);
  server.wake();
  loop.join();
  ASSERT_TRUE(v.ok()) << v.error();
  EXPECT_EQ(v.value(), std::vector<uint8_t>{7});

  ASSERT_TRUE(server
                  .send(client_id, static_cast<uint8_t>(FrameType::worker_command),
                        worker_command_encode({.action = TrainAction::stop, .id = 2, .from = "b"}))
                  .ok());
  server.poll_once(10ms);  // flushes it
  for (int i = 0; i < 100 && got.size() < 2; ++i) {
    ASSERT_TRUE(client.take_frames(&got).ok());
    if (got.size() < 2) std::this_thread::sleep_for(5ms);
  }
  ASSERT_EQ(got.size(), 2u);
  EXPECT_EQ(worker_command_decode(got[0].payload)->action, TrainAction::checkpoint);
  EXPECT_EQ(worker_command_decode(got[1].payload)->action, TrainAction::stop);
  EXPECT_EQ(worker_command_decode(got[1].payload)->from, "b");
  ::close(sp[1]);
}

TEST(WorkerFrames, HeartbeatRoundTripAndBadPhase) {
  WorkerHeartbeat h{.step = 41,
                    .phase = TrainPhase::kStep,
                    .collectives = 1234567890123ull,
                    .in_collective = true,
                    .timed_out = true,
                    .interval_ms = 750,
                    .timeout_ms = 3000};
  Result<WorkerHeartbeat> got = worker_heartbeat_decode(worker_heartbeat_encode(h));
  ASSERT_TRUE(got.ok()) << got.error();
  EXPECT_EQ(got->step, 41);
  EXPECT_EQ(got->phase, TrainPhase::kStep);
  EXPECT_EQ(got->collectives, 1234567890123ull);
  EXPECT_TRUE(got->in_collective);
  EXPECT_TRUE(got->timed_out);
  EXPECT_EQ(got->interval_ms, 750u);
  EXPECT_EQ(got->timeout_ms, 3000u);
  std::vector<uint8_t> bad = worker_heartbeat_encode(h);
  bad[8] = 99;  // the phase
  EXPECT_THAT(worker_heartbeat_decode(bad).error(), HasSubstr("phase 99"));
  bad.pop_back();
  EXPECT_THAT(worker_heartbeat_decode(bad).error(), HasSubstr("malformed"));
}

TEST(WorkerFrames, InjectRoundTripAndBadKind) {
  Result<WorkerInject> slow =
      worker_inject_decode(worker_inject_encode({.kind = WorkerInject::Kind::kSlow, .delay_ms = 500}));
  ASSERT_TRUE(slow.ok()) << slow.error();
  EXPECT_EQ(slow->kind, WorkerInject::Kind::kSlow);
  EXPECT_EQ(slow->delay_ms, 500u);
  Result<WorkerInject> nan = worker_inject_decode(worker_inject_encode({.kind = WorkerInject::Kind::kNan}));
  ASSERT_TRUE(nan.ok()) << nan.error();
  EXPECT_EQ(nan->kind, WorkerInject::Kind::kNan);
  std::vector<uint8_t> bad = worker_inject_encode({.kind = WorkerInject::Kind::kNan});
  bad[0] = 7;
  EXPECT_THAT(worker_inject_decode(bad).error(), HasSubstr("fault 7"));
  bad.pop_back();
  EXPECT_THAT(worker_inject_decode(bad).error(), HasSubstr("malformed"));
}

// The flight recorder rides on the heartbeat; a beat of an older worker (ending before it) still decodes,
// and a count past what the frame holds is refused rather than allocated.
TEST(WorkerFrames, HeartbeatCarriesTheFlightRecorder) {
  WorkerHeartbeat h{.step = 7, .phase = TrainPhase::kStep, .collectives = 41, .in_collective = true};
  h.recent = {
      {.seq = 40, .op = "all_reduce", .bytes = 4096, .entered_unix_ms = 100, .left_unix_ms = 105},
      {.seq = 41, .op = "barrier", .bytes = 0, .entered_unix_ms = 110, .left_unix_ms = 0, .ok = false}};
  Result<WorkerHeartbeat> got = worker_heartbeat_decode(worker_heartbeat_encode(h));
  ASSERT_TRUE(got.ok()) << got.error();
  ASSERT_EQ(got->recent.size(), 2u);
  EXPECT_EQ(got->recent[0].seq, 40u);
  EXPECT_EQ(got->recent[0].op, "all_reduce");
  EXPECT_EQ(got->recent[0].bytes, 4096u);
  EXPECT_EQ(got->recent[0].left_unix_ms, 105);
  EXPECT_TRUE(got->recent[0].ok);
  EXPECT_EQ(got->recent[1].op, "barrier");
  EXPECT_EQ(got->recent[1].entered_unix_ms, 110);
  EXPECT_FALSE(got->recent[1].ok);

  std::vector<uint8_t> old = worker_heartbeat_encode({.step = 3});
  old.resize(old.size() - 4);  // no recorder count: as an older worker sends it
  Result<WorkerHeartbeat> older = worker_heartbeat_decode(old);
  ASSERT_TRUE(older.ok()) << older.error();
  EXPECT_EQ(older->step, 3);
  EXPECT_TRUE(older->recent.empty());

  std::vector<uint8_t> lying = worker_heartbeat_encode({.step = 3});
  lying[lying.size() - 1] = 0x7f;  // a count of about two billion entries in a frame of none
  EXPECT_THAT(worker_heartbeat_decode(lying).error(), HasSubstr("malformed"));
}

// A heartbeat must go out while a store request waits for its reply (a rank in a checkpoint's store wait
// is not silent): send() used to wait behind the request for the whole of its wait.
TEST(StoreClientSend, OneWayFramesDoNotWaitBehindAPendingRequest) {
  int sp[2];
  ASSERT_EQ(::socketpair(AF_UNIX, SOCK_STREAM, 0, sp), 0);
  std::atomic<bool> get_pending{false};      // the server holds the get, waiting for its key
  std::atomic<bool> beat_during_get{false};  // a heartbeat arrived while it did
  // on_frame runs inside poll_once, on the loop thread, after the server was built.
  StoreServer server({.on_frame = [&](int, const Frame& f) {
    if (f.type == static_cast<uint8_t>(FrameType::worker_heartbeat) && server.waiter_count() == 1)
      beat_during_get.store(true);
  }});
  server.add_client(sp[0], "rank 0");
  std::atomic<bool> done{false};
  std::thread loop([&] {
    bool released = false;
    while (!done.load()) {
      server.poll_once(10ms);
      if (server.waiter_count() == 1) get_pending.store(true);
      // The key the get waits for appears only once a heartbeat came in beside it.
      if (beat_during_get.load() && !released) {
        server.set("late", {1});
        released = true;
      }
    }
  });
  StoreClient client(sp[1]);
  std::thread getter([&] {
    Result<std::vector<uint8_t>> v = client.get("late", 20s);
    EXPECT_TRUE(v.ok()) << "the heartbeat never reached the server while the get waited: " << v.error();
  });
  while (!get_pending.load()) std::this_thread::sleep_for(1ms);
  EXPECT_TRUE(client.send(FrameType::worker_heartbeat, worker_heartbeat_encode({}), 20s).ok());
  getter.join();
  done.store(true);
  server.wake();
  loop.join();
  EXPECT_TRUE(beat_during_get.load());
  ::close(sp[1]);
}

TEST(StoreClientSend, StoreFrameTypesAreRefused) {
  int sp[2];
  ASSERT_EQ(::socketpair(AF_UNIX, SOCK_STREAM, 0, sp), 0);
  StoreClient client(sp[1]);
  Status st = client.send(FrameType::store_set, std::vector<uint8_t>{}, 1s);
  ASSERT_FALSE(st.ok());
  EXPECT_THAT(st.message(), HasSubstr("use set/get/wait"));
  ::close(sp[0]);
  ::close(sp[1]);
}

TEST(StoreClientSend, ClosedPeerBreaksTheConnectionForLaterCalls) {
  int sp[2];
  ASSERT_EQ(::socketpair(AF_UNIX, SOCK_STREAM, 0, sp), 0);
  ::close(sp[0]);
  StoreClient client(sp[1]);
  Status st = client.send(FrameType::worker_hello, worker_hello_encode({}), 1s);
  ASSERT_FALSE(st.ok());
  EXPECT_THAT(st.message(), HasSubstr("store send"));
  Status later = client.set("k", std::vector<uint8_t>{1}, 1s);
  ASSERT_FALSE(later.ok());
  EXPECT_THAT(later.message(), HasSubstr("unusable"));
  ::close(sp[1]);
}

}  // namespace
}  // namespace gantry
