// A stand-in worker for gang_test: speaks the launcher's protocol without training, and misbehaves in the
// way argv[1] names, so every one of the launcher's failure paths can be driven in milliseconds.
//
//   ok            hello, one batch of records, goodbye (code 0), exit 0; first checks its environment
//   fail_rank1    rank 1: hello, goodbye with code 1 and a message, exit 1; the others wait to be stopped
//   bad_input     hello, goodbye with code 2, exit 2
//   no_hello      sleep, never says hello
//   close_socket  hello, closes its socket, keeps running
//   garbage       hello, then bytes that are not a frame
//   wrong_rank    rank 1's hello claims rank 101; the others wait to be stopped
//   ignore_term   hello, ignores SIGTERM, sleeps (only SIGKILL ends it)
//   stop_on_term  hello, on SIGTERM says goodbye with 130 and exits 130
//   crash_rank1   rank 1 is SIGKILLed by itself after hello; the others wait to be stopped
#include <fcntl.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>

#include "engine/core/comm/frame.h"  // frame_encode: half a frame for crash_mid_frame
#include "engine/core/comm/store_client.h"
#include "engine/core/worker/worker_env.h"
#include "engine/core/worker/worker_frames.h"
#include "telemetry/record_codec.h"

using namespace gantry;
using namespace std::chrono_literals;

namespace {

volatile sig_atomic_t g_term = 0;
extern "C" void on_term(int) {
  g_term = 1;
}

[[noreturn]] void sleep_forever() {
  for (;;) std::this_thread::sleep_for(1s);
}

// Exit code 20+: the environment the launcher gave this worker is wrong (gang_test reads the code).
int check_environment(const WorkerEnv& env) {
  if (env.store_fd < 0) return 20;
  if (std::getenv("MASTER_ADDR") == nullptr || std::string(std::getenv("MASTER_ADDR")) != "127.0.0.1")
    return 21;
  if (env.local_rank != env.rank || env.local_world != env.world) return 22;
  const char* extra = std::getenv("GANG_TEST_EXTRA");
  if (extra == nullptr || std::string(extra) != "yes") return 23;
  const char* cuda = std::getenv("CUDA_VISIBLE_DEVICES");
  if (cuda == nullptr || std::string(cuda) != "dev" + std::to_string(env.rank)) return 24;
  // Nothing but stdin/out/err and the store socket may be inherited.
  for (int fd = 3; fd < 1024; ++fd) {
    if (fd != env.store_fd && ::fcntl(fd, F_GETFD) != -1) return 25;
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  const std::string mode = argc > 1 ? argv[1] : "ok";
  Result<WorkerEnv> env = worker_env_read();
  if (!env.ok()) {
    std::fprintf(stderr, "fake worker: %s\n", env.error().c_str());
    return 10;
  }
  const int rank = env->rank;
  if (mode == "no_hello") sleep_forever();
  if (mode == "ignore_term") ::signal(SIGTERM, SIG_IGN);
  if (mode == "stop_on_term") ::signal(SIGTERM, on_term);
  StoreClient store(env->store_fd);
  const int hello_rank = mode == "wrong_rank" && rank == 1 ? 101 : rank;
  if (!store
           .send(FrameType::worker_hello,
                 worker_hello_encode(
                     {.rank = hello_rank, .world = env->world, .pid = ::getpid(), .host = "fake"}),
                 5s)
           .ok()) {
    return 11;
  }
  auto goodbye = [&](int code, const std::string& msg) {
    store.send(FrameType::worker_exit, worker_exit_encode({code, msg}), 5s);
    return code;
  };
  if (mode == "ok") {
    if (int bad = check_environment(env.value()); bad != 0) return bad;
    RecordBatch b;
    b.rank_steps.push_back({.step = 1, .rank = rank, .host = "fake", .total_s = 0.5, .tokens = 8});
    std::vector<uint8_t> wire;
    record_batch_encode(b, &wire);
    store.send(FrameType::worker_records, wire, 5s);
    return goodbye(0, "done: rank " + std::to_string(rank));
  }
  if (mode == "fail_rank1" && rank == 1) return goodbye(1, "rank 1: something broke");
  if (mode == "bad_input") return goodbye(2, "rank " + std::to_string(rank) + ": bad config");
  if (mode == "close_socket") {
    ::close(env->store_fd);
    sleep_forever();
  }
  if (mode == "garbage") {
    const char junk[] = "this is not a frame header at all";
    [[maybe_unused]] ssize_t w = ::write(env->store_fd, junk, sizeof junk);
    sleep_forever();
  }
  if (mode == "crash_rank1" && rank == 1) ::raise(SIGKILL);
  if (mode == "crash_mid_frame_rank1" && rank == 1) {
    // Killed while sending: half of a records frame on the socket, then SIGKILL. The socket closes as the
    // process dies, before its exit status can be collected: the launcher must still name the signal.
    RecordBatch b;
    b.rank_steps.push_back({.step = 1, .rank = rank, .host = "fake", .total_s = 0.5, .tokens = 8});
    std::vector<uint8_t> wire;
    record_batch_encode(b, &wire);
    const std::vector<uint8_t> frame = frame_encode(static_cast<uint8_t>(FrameType::worker_records), wire);
    [[maybe_unused]] ssize_t w = ::write(env->store_fd, frame.data(), frame.size() / 2);
    ::raise(SIGKILL);
  }
  // Heartbeats every 20 ms at a step that grows, as a worker's heartbeat thread sends them.
  // "beat_mute_rank1": rank 1 falls silent after 5 beats and keeps running (a stall that is not a SIGSTOP);
  // the others beat on. "beat_then_done": every rank beats for 1 s (many hang timeouts of the test) doing
  // nothing else, then says its beats are over (interval 0), waits another 0.5 s and exits 0.
  if (mode == "beat_mute_rank1" || mode == "beat_then_done") {
    for (int k = 0;; ++k) {
      const bool done = mode == "beat_then_done" && k == 50;
      if (!(mode == "beat_mute_rank1" && rank == 1 && k >= 5)) {
        WorkerHeartbeat h{.step = k,
                          .phase = TrainPhase::kStep,
                          .collectives = static_cast<uint64_t>(k),
                          .interval_ms = done ? 0u : 20u,
                          .timeout_ms = 60000};
        store.send(FrameType::worker_heartbeat, worker_heartbeat_encode(h), 5s);
      }
      if (done) {
        std::this_thread::sleep_for(500ms);
        return goodbye(0, "done: rank " + std::to_string(rank));
      }
      std::this_thread::sleep_for(20ms);
    }
  }
  if (mode == "stop_on_term") {
    while (!g_term) std::this_thread::sleep_for(10ms);
    return goodbye(130, "stopped at step 7");
  }
  sleep_forever();
}
