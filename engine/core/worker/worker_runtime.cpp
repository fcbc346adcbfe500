#include "engine/core/worker/worker_runtime.h"

#include <arpa/inet.h>    // inet_ntop: the address peers reach this rank's Gloo pairs on
#include <fcntl.h>        // fcntl: close-on-exec, non-blocking connect
#include <netdb.h>        // getaddrinfo
#include <netinet/in.h>   // sockaddr_in(6)
#include <netinet/tcp.h>  // TCP_NODELAY: store requests are small and latency-bound
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>  // fstat: GANTRY_STORE_FD must be a socket
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "engine/core/comm/communicator.h"
#include "engine/core/comm/store_client.h"
#include "engine/core/comm/store_server.h"
#include "engine/core/config.h"
#include "engine/core/parallel/parallel_dims.h"
#include "engine/core/parallel/tensor_parallel.h"
#include "engine/core/sdc_check.h"
#include "engine/core/step_records.h"
#include "engine/core/train_checkpoints.h"  // checkpoint_cost_text
#include "engine/core/worker/rendezvous_server.h"
#include "engine/core/worker/worker_frames.h"
#include "telemetry/host.h"
#include "telemetry/record_codec.h"
#include "telemetry/records.h"
#ifdef GANTRY_HAVE_GLOO
#include "engine/core/comm/gloo_communicator.h"
#endif
#ifdef GANTRY_HAVE_NCCL
#include "engine/core/comm/nccl_communicator.h"
#endif

namespace gantry {
namespace {

using Clock = std::chrono::steady_clock;
using namespace std::chrono_literals;

// Frames to the launcher are small and its poll loop drains them continuously; a send that cannot finish
// in this long means the launcher is stuck or gone.
constexpr std::chrono::milliseconds kSendTimeout = 10s;
// External launch: how long rank 0 keeps serving the store after its own training ended, for peers that
// still have a request in flight (a checkpoint report, their goodbye).
constexpr std::chrono::milliseconds kServeAfterDone = 30s;

std::atomic<bool> g_stop{false};
extern "C" void worker_on_stop_signal(int) {
  g_stop.store(true);
}

void install_stop_handlers() {
  struct sigaction sa = {};
  sa.sa_handler = worker_on_stop_signal;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART;  // a blocking read in the training loop must not fail with EINTR
  sigaction(SIGINT, &sa, nullptr);
  sigaction(SIGTERM, &sa, nullptr);
}

// The numeric address of this end of a connected socket: the interface that reaches rank 0 is the one
// the peers can reach this rank's Gloo pairs on.
std::string local_address(int fd) {
  sockaddr_storage ss = {};
  socklen_t len = sizeof ss;
  char buf[INET6_ADDRSTRLEN] = "";
  if (::getsockname(fd, reinterpret_cast<sockaddr*>(&ss), &len) != 0) return "127.0.0.1";
  if (ss.ss_family == AF_INET) {
    ::inet_ntop(AF_INET, &reinterpret_cast<sockaddr_in*>(&ss)->sin_addr, buf, sizeof buf);
  } else if (ss.ss_family == AF_INET6) {
    ::inet_ntop(AF_INET6, &reinterpret_cast<sockaddr_in6*>(&ss)->sin6_addr, buf, sizeof buf);
  } else {
    return "127.0.0.1";
  }
  return buf;
}

// ---- operator actions: the launcher's commands, for rank 0's TrainControl -----------------------------

// Rank 0's answer to train_run's poll at each step boundary: the next command the launcher (or agent) sent,
// one per boundary in the order they came. Read without blocking from the inherited socket, whose only
// reader is the StoreClient (store_client.h keeps commands that arrive while a request waits).
class CommandControl final : public TrainControl {
 public:
  CommandControl(StoreClient* frames, int rank, TrainLiveFaults* faults)
      : frames_(frames), rank_(rank), faults_(faults) {}

  TrainAction poll() override {
    std::vector<Frame> got;
    Status st = frames_->take_frames(&got);
    if (!st.ok() && !warned_) {
      warned_ = true;  // the launcher is gone: it killed us on its way out, or will; train on meanwhile
      std::fprintf(stderr, "gantry-engine worker (rank %d): warning: no more commands: %s\n", rank_,
                   st.message().c_str());
    }
    for (const Frame& f : got) {
      if (f.type == static_cast<uint8_t>(FrameType::worker_inject)) {
        apply_inject(f);
        continue;
      }
      if (f.type != static_cast<uint8_t>(FrameType::worker_command)) continue;  // a newer launcher's frame
      Result<WorkerCommand> c = worker_command_decode(f.payload);
      if (!c.ok()) {
        std::fprintf(stderr, "gantry-engine worker (rank %d): warning: ignored a command: %s\n", rank_,
                     c.error().c_str());
        continue;
      }
      queue_.push_back(std::move(c.value()));
    }
    if (queue_.empty()) return TrainAction::none;
    taken_ = std::move(queue_.front());
    queue_.pop_front();
    return taken_.action;
  }
  // The command whose action train_run took last: the event reporting it names its request.
  const WorkerCommand& taken() const { return taken_; }

 private:
  void apply_inject(const Frame& f) {
    Result<WorkerInject> i = worker_inject_decode(f.payload);
    if (!i.ok()) {
      std::fprintf(stderr, "gantry-engine worker (rank %d): warning: ignored a fault: %s\n", rank_,
                   i.error().c_str());
      return;
    }
    if (i->kind == WorkerInject::Kind::kSlow) {
      faults_->forward_delay_ms.store(i->delay_ms);
      std::fprintf(stderr, "gantry-engine worker (rank %d): injected fault: forward slowed by %u ms\n", rank_,
                   i->delay_ms);
    } else {
      faults_->nan_next_step.store(true);
      std::fprintf(stderr, "gantry-engine worker (rank %d): injected fault: NaN gradients next step\n",
                   rank_);
    }
  }

  StoreClient* frames_;
  int rank_;
  TrainLiveFaults* faults_;
  std::deque<WorkerCommand> queue_;
  WorkerCommand taken_;
  bool warned_ = false;
};

std::string json_escape(const std::string& in) {
  std::string out;
  for (char ch : in) {
    if (ch == '"' || ch == '\\') out += '\\';
    if (static_cast<unsigned char>(ch) < 0x20) continue;  // control characters are dropped
    out += ch;
  }
  return out;
}

// ---- the heartbeat: where this rank is, from a thread that never waits on a collective ------------------

// A rank that stops answering (SIGSTOP, a stalled device, a deadlock) is the one whose heartbeats stop or
// fall behind in collectives, whatever its peers are stuck in: the launcher names it from these
// (hang_blame.h). The frames share the launcher's socket; StoreClient::send does not wait behind a store
// request in flight, so a rank in a checkpoint's store wait keeps beating. It starts once the
// communicator exists: creating one writes to the same socket through a StoreClient of its own, which a
// beat must not cut into.
class Heartbeat {
 public:
  // `watched_within`: the shortest silence the launcher calls a hang (the collective timeout, or its hang
  // timeout when shorter).
  Heartbeat(StoreClient* to, const TrainProgress* progress, const Communicator* comm,
            std::chrono::milliseconds timeout, std::chrono::milliseconds watched_within)
      : to_(to),
        progress_(progress),
        comm_(comm),
        timeout_(timeout),
        // Several beats within half a timeout, so a silent rank stands out before its peers give up; at
        // most one a second, so a long timeout costs the launcher nothing.
        interval_(
            std::clamp(watched_within / 4, std::chrono::milliseconds(100), std::chrono::milliseconds(1000))) {
    thread_ = std::thread([this] {
      std::unique_lock<std::mutex> lock(wake_mu_);
      while (!quit_) {
        lock.unlock();
        beat();
        lock.lock();
        wake_.wait_for(lock, interval_, [this] { return quit_; });
      }
    });
  }
  ~Heartbeat() {
    {
      std::lock_guard<std::mutex> lock(wake_mu_);
      quit_ = true;
    }
    wake_.notify_all();
    thread_.join();
    // "No more beats": what the worker does from here to its exit (the history, the goodbye) is not a
    // hang, however long it takes; its exit is the launcher's to see.
    beat(/*last=*/true);
  }
  Heartbeat(const Heartbeat&) = delete;
  Heartbeat& operator=(const Heartbeat&) = delete;

  // Sends one beat now (the thread's, and a failing worker's last before its goodbye). A failed send is
  // left to the records' warning: the launcher is slow or gone.
  void beat(bool last = false) {
    WorkerHeartbeat h{.step = progress_->step.load(),
                      .phase = progress_->phase.load(),
                      .interval_ms = last ? 0u : static_cast<uint32_t>(interval_.count()),
                      .timeout_ms = static_cast<uint32_t>(std::min<int64_t>(timeout_.count(), UINT32_MAX))};
    const CommProgress p = comm_->progress();
    h.collectives = p.entered;
    h.in_collective = p.inside;
    h.timed_out = p.timed_out;
    h.recent = comm_->flight_record();
    (void)to_->send(FrameType::worker_heartbeat, worker_heartbeat_encode(h), kSendTimeout);
  }

 private:
  StoreClient* to_;
  const TrainProgress* progress_;
  const Communicator* comm_;  // outlives this (HeartbeatStop)
  const std::chrono::milliseconds timeout_;
  const std::chrono::milliseconds interval_;
  std::mutex wake_mu_;
  std::condition_variable wake_;
  bool quit_ = false;
  std::thread thread_;
};

// Stops the heartbeat before the communicator it reads is destroyed.
struct HeartbeatStop {
  std::unique_ptr<Heartbeat>& heartbeat;
  ~HeartbeatStop() { heartbeat.reset(); }
};

// ---- test faults inside an asynchronous checkpoint (worker_env.h) -------------------------------------

CheckpointHook checkpoint_fault_hook(const WorkerFault& f, int rank) {
  if (f.kind == WorkerFault::kill_in_checkpoint) {
    return [f, rank](CheckpointStage stage, int64_t step) {
      if (stage != f.stage || step != f.step) return;
      std::fprintf(stderr,
                   "gantry-engine worker (rank %d): %s: kill -9 at stage %s of checkpoint step %lld "
                   "(test fault)\n",
                   rank, kWorkerFaultVariable, checkpoint_stage_name(stage), static_cast<long long>(step));
      ::kill(::getpid(), SIGKILL);  // as kill -9 from outside: no handler, no flushing, no destructors
    };
  }
  if (f.kind == WorkerFault::hold_checkpoint) {
    struct Gate {
      std::mutex mu;
      std::condition_variable cv;
      bool asked = false;  // the train loop asked for the next checkpoint
    };
    auto gate = std::make_shared<Gate>();
    return [f, gate](CheckpointStage stage, int64_t step) {
      std::unique_lock<std::mutex> lock(gate->mu);
      if (stage == CheckpointStage::kWaitPrevious) {
        gate->asked = true;
        gate->cv.notify_all();
      } else if (stage == CheckpointStage::kWrite && step == f.step) {
        gate->cv.wait_for(lock, std::chrono::seconds(60), [&] { return gate->asked; });
      }
    };
  }
  return {};
}

// ---- the observer: reports to records, records to the launcher ----------------------------------------

class WorkerObserver final : public TrainObserver {
 public:
  WorkerObserver(const WorkerEnv& env, StoreClient* launcher, int device, WorkerFault fault,
                 TrainObserver* local)
      : env_(env), launcher_(launcher), device_(device), fault_(fault), local_(local), host_(host_name()) {}

  void on_start(const std::string& summary) override {
    summary_ = summary;
    if (local_) local_->on_start(summary);
  }
  void on_run(const RunDescription& run) override {
    if (env_.rank == 0) {
      send(FrameType::worker_run, worker_run_encode({.summary = summary_,
                                                     .config_toml = run.config_toml,
                                                     .code_version = run.code_version,
                                                     .data_version = run.data_version,
                                                     .backend = run.backend,
                                                     .params = run.params,
                                                     .peak_name = run.peak_name,
                                                     .peak_flops = run.peak_flops,
                                                     .flops_per_token = run.flops_per_token,
                                                     .mfu_formula = run.mfu_formula}));
    }
    if (local_) local_->on_run(run);
  }
  void on_step(const StepReport& r) override {
    steps_seen_ = true;
    RecordBatch batch;
    // The node's device index, not the in-process one (always 0 after pinning).
    batch.rank_steps.push_back(rank_step_record(r, host_, device_, env_.world));
    // The global figures are the same on every rank: one copy is enough.
    if (env_.rank == 0) batch.steps.push_back(step_record(r, unix_now_s()));
    send_batch(batch);
    // A pipeline stage's bubble is this rank's own figure (the record has no field for it yet; its wait is
    // inside comm_exposed): one line on stderr, beside the ideal pipeline's under its schedule
    // (pipeline_schedule_bubble: (p-1)/(m+p-1), interleaved (p-1)/(v·m+p-1), ZB-H1 (p-1)/(3m+p-1)).
    if (r.phases.bubble && r.phases.bubble_formula) {
      std::string split;  // ZB-H1: how its backward divides
      if (r.phases.weight_pass_s) {
        char b[96];
        std::snprintf(b, sizeof b, "; weight passes %.2f ms of the backward's %.2f ms",
                      1e3 * *r.phases.weight_pass_s, 1e3 * r.phases.backward_s);
        split = b;
      }
      if (!r.phases.message_placement.empty()) split += "; messages placed by " + r.phases.message_placement;
      std::fprintf(stderr, "rank %d step %lld: pipeline bubble %.1f %% measured, formula %.1f %%%s\n",
                   env_.rank, static_cast<long long>(r.step), 100 * *r.phases.bubble,
                   100 * *r.phases.bubble_formula, split.c_str());
    }
    if (local_) local_->on_step(r);
    if (fault_.kind == WorkerFault::exit_after_step && r.step >= fault_.step) {
      std::fprintf(stderr, "gantry-engine worker (rank %d): %s: exiting after step %lld (test fault)\n",
                   env_.rank, kWorkerFaultVariable, static_cast<long long>(r.step));
      // A crash, as the test wants it: no goodbye frame, no destructors, no flushing of the run.
      ::_exit(kWorkerExitTestFault);
    }
  }
  // Rank 0 commits a checkpoint for the gang (train.h): its record speaks for every shard. A failure is
  // reported by the rank it happened on (rank 0's names the rank that failed it).
  void on_checkpoint(const CheckpointReport& c) override {
    if (env_.rank == 0) {
      RecordBatch batch;
      batch.checkpoints.push_back(checkpoint_committed_record(c, host_, env_.world, unix_now_s()));
      send_batch(batch);
    }
    if (local_) local_->on_checkpoint(c);
  }
  void on_checkpoint_failed(const CheckpointReport& c, const std::string& error) override {
    RecordBatch batch;
    batch.checkpoints.push_back(checkpoint_failed_record(c, error, env_.rank, host_, unix_now_s()));
    send_batch(batch);
    if (local_) local_->on_checkpoint_failed(c, error);
  }

  // Every rank reports the skip (the gang decides it together), as it reports actions.
  void on_step_skipped(int64_t step, const std::string& reason) override {
    RecordBatch batch;
    EventRecord e;
    e.time_unix_s = unix_now_s();
    e.step = step;
    e.kind = "step_skipped";
    e.rank = env_.rank;
    e.node = host_;
    e.message = "step " + std::to_string(step) + " skipped: " + reason;
    e.payload = "{\"reason\":\"" + json_escape(reason) + "\"}";
    batch.events.push_back(std::move(e));
    send_batch(batch);
    if (local_) local_->on_step_skipped(step, reason);
  }

  // Each rank the silent-data-corruption check names reports itself, so the event's rank and node are the
  // suspect's own (the coordinator quarantines that node when a majority agreed); the others only hear it.
  void on_sdc_mismatch(const SdcMismatch& m) override {
    if (m.named(env_.rank)) {
      RecordBatch batch;
      EventRecord e;
      e.time_unix_s = unix_now_s();
      e.step = m.step;
      e.kind = "sdc_mismatch";
      e.rank = env_.rank;
      e.node = host_;
      e.message = m.message;
      e.payload = m.payload;
      batch.events.push_back(std::move(e));
      send_batch(batch);
    }
    if (local_) local_->on_sdc_mismatch(m);
  }

  // Every rank reports an action taking effect, so the events show it at one step on every rank.
  void on_action(TrainAction action, int64_t step) override {
    if (action == TrainAction::stop) stopped_by_action_ = true;
    RecordBatch batch;
    EventRecord e;
    e.time_unix_s = unix_now_s();
    e.step = step;
    e.kind = std::string("action_") + train_action_name(action);
    e.rank = env_.rank;
    e.node = host_;
    e.message = std::string(train_action_name(action)) + " took effect after step " + std::to_string(step);
    e.payload = std::string("{\"action\":\"") + train_action_name(action) + "\"";
    if (control_ != nullptr && control_->taken().action == action) {
      e.payload += ",\"request\":" + std::to_string(control_->taken().id) + ",\"from\":\"" +
                   json_escape(control_->taken().from) + "\"";
    }
    e.payload += "}";
    batch.events.push_back(std::move(e));
    send_batch(batch);
    if (local_) local_->on_action(action, step);
  }

  // Every rank hears the streak; rank 0 reports it once. The exit code then says so (kWorkerExitGuardStreak).
  void on_guard_streak(const GuardRollback& r) override {
    guard_streak_ = true;
    if (env_.rank == 0) {
      RecordBatch batch;
      EventRecord e;
      e.time_unix_s = unix_now_s();
      e.step = r.from_step;
      e.kind = "guard_streak";
      e.rank = env_.rank;
      e.node = host_;
      e.message = "step " + std::to_string(r.from_step) + ": " + std::to_string(r.skips) +
                  " steps in a row skipped by the step guard (the last: " + r.reason +
                  "): the gang stops for its coordinator to roll it back to a checkpoint at or before step " +
                  std::to_string(r.to_step);
      e.payload = guard_rollback_payload(r);
      batch.events.push_back(std::move(e));
      send_batch(batch);
    }
    if (local_) local_->on_guard_streak(r);
  }

  void set_control(const CommandControl* control) { control_ = control; }
  bool guard_streak() const { return guard_streak_; }
  bool steps_seen() const { return steps_seen_; }
  bool stopped_by_action() const { return stopped_by_action_; }

 private:
  void send_batch(const RecordBatch& batch) {
    std::vector<uint8_t> wire;
    std::string error;
    if (!record_batch_encode(batch, &wire, &error)) return warn("cannot encode step records: " + error);
    send(FrameType::worker_records, wire);
  }
  void send(FrameType type, const std::vector<uint8_t>& payload) {
    if (launcher_ == nullptr) return;
    if (Status st = launcher_->send(type, payload, kSendTimeout); !st.ok()) warn(st.message());
  }
  // Training goes on without the launcher's copy of the records: if the launcher is really gone, it killed
  // this worker on its way out (PR_SET_PDEATHSIG), and a slow one only loses telemetry.
  void warn(const std::string& what) {
    if (warned_) return;
    warned_ = true;
    std::fprintf(stderr, "gantry-engine worker (rank %d): warning: %s (training goes on)\n", env_.rank,
                 what.c_str());
  }

  WorkerEnv env_;
  StoreClient* launcher_;  // null: nobody receives records (external launchers)
  int device_;
  WorkerFault fault_;
  TrainObserver* local_;
  std::string host_;
  std::string summary_;
  bool steps_seen_ = false;
  bool stopped_by_action_ = false;
  bool guard_streak_ = false;
  bool warned_ = false;
  const CommandControl* control_ = nullptr;
};

// CUDA: one device per rank. gantry-engine run already narrowed CUDA_VISIBLE_DEVICES to one device; under
// torchrun or srun every rank sees the node's devices, so narrow it here to the LOCAL_RANK-th, before
// anything initialises CUDA. Afterwards the rank's device is always index 0.
Status pin_cuda_device(const WorkerEnv& env) {
  const char* visible = std::getenv("CUDA_VISIBLE_DEVICES");
  std::vector<std::string> list;
  if (visible != nullptr) {
    std::string s = visible;
    for (size_t pos = 0; pos <= s.size();) {
      size_t comma = s.find(',', pos);
      if (comma == std::string::npos) comma = s.size();
      if (comma > pos) list.push_back(s.substr(pos, comma - pos));
      pos = comma + 1;
    }
    if (list.size() == 1) return Status();
    if (static_cast<int>(list.size()) <= env.local_rank) {
      return Status::error("LOCAL_RANK " + std::to_string(env.local_rank) + " but CUDA_VISIBLE_DEVICES='" +
                           s + "' lists " + std::to_string(list.size()) +
                           " devices: give each rank on a node a device of its own");
    }
  }
  const std::string mine =
      list.empty() ? std::to_string(env.local_rank) : list[static_cast<size_t>(env.local_rank)];
  ::setenv("CUDA_VISIBLE_DEVICES", mine.c_str(), 1);
  return Status();
}

// The node's index of this rank's GPU, for the records (in-process it is always device 0 after pinning):
// CUDA_VISIBLE_DEVICES' one entry when it is a number, else the local rank.
int physical_device(const WorkerEnv& env) {
  const char* v = std::getenv("CUDA_VISIBLE_DEVICES");
  if (v != nullptr && *v != '\0' && std::strspn(v, "0123456789") == std::strlen(v) && std::strlen(v) < 6) {
    return std::atoi(v);
  }
  return env.local_rank;
}

// One communicator over `size` ranks of a group (`rank` this rank's index in it), rendezvousing under
// `prefix`.
Result<std::unique_ptr<Communicator>> create_comm(const Config& cfg, int rank, int size,
                                                  const std::string& prefix, int store_fd,
                                                  const std::string& gloo_host,
                                                  std::chrono::milliseconds timeout, bool* bad_input) {
  *bad_input = false;
  if (cfg.train.backend == "cpu") {
#ifdef GANTRY_HAVE_GLOO
    return gloo_communicator_create(rank, size, store_fd, prefix, timeout, {.hostname = gloo_host});
#else
    (void)rank, (void)size, (void)prefix, (void)store_fd, (void)gloo_host, (void)timeout;
    *bad_input = true;
    return Status::error(
        "train.backend = \"cpu\" needs the Gloo communicator, which this build lacks (Gloo was not found "
        "when it "
        "was configured: install libgloo-dev and rebuild, or use train.backend = \"cuda\" with NCCL)");
#endif
  }
  if (cfg.train.backend == "cuda") {
#ifdef GANTRY_HAVE_NCCL
    // The watchdog's bound (nccl_communicator.h): the launcher's hang timeout when it watches for hangs,
    // else the config's collective timeout.
    auto watchdog = std::chrono::milliseconds(static_cast<int64_t>(cfg.train.collective_timeout_s * 1e3));
    if (const char* h = std::getenv(kHangTimeoutVariable); h != nullptr) {
      char* end = nullptr;
      const long long ms = std::strtoll(h, &end, 10);
      if (end != h && *end == '\0' && ms > 0) watchdog = std::chrono::milliseconds(ms);
    }
    return nccl_communicator_create(rank, size, store_fd, prefix, timeout,
                                    {.device = 0, .watchdog_timeout = watchdog});
#else
    *bad_input = true;
    return Status::error(
        "train.backend = \"cuda\" needs the NCCL communicator, which this build lacks (built without CUDA or "
        "NCCL: "
        "rebuild where both are installed, or use train.backend = \"cpu\" with Gloo)");
#endif
  }
  *bad_input = true;
  return Status::error("train.backend = \"" + cfg.train.backend +
                       "\": no communicator for it (expected \"cpu\" or "
                       "\"cuda\")");
}

}  // namespace

WorkerResult worker_run(const WorkerOptions& options, const WorkerEnv& env) {
  const std::string who = "rank " + std::to_string(env.rank) + " of " + std::to_string(env.world);
  auto early = [&](int code, const std::string& msg) { return WorkerResult{code, who + ": " + msg, false}; };

  Result<WorkerFault> fault = WorkerFault{};
  if (const char* f = std::getenv(kWorkerFaultVariable); f != nullptr)
    fault = worker_fault_parse(f, env.rank);
  if (!fault.ok()) return early(kWorkerExitBadInput, fault.error());
  if (fault->kind == WorkerFault::exit_at_start) {
    return early(kWorkerExitFailed, std::string(kWorkerFaultVariable) + ": exit_at_start (test fault)");
  }
  if (fault->kind == WorkerFault::hang_at_start) {
    std::fprintf(stderr, "gantry-engine worker (%s): %s: hanging before joining (test fault)\n", who.c_str(),
                 kWorkerFaultVariable);
    for (;;) std::this_thread::sleep_for(1s);  // until the launcher's SIGTERM (default action) ends it
  }

  // ---- reach the store -----------------------------------------------------------------------------
  const auto join_deadline = Clock::now() + options.join_timeout;
  int store_fd = -1;
  int frames_fd = -1;  // the launcher's socket (frames both ways); -1 = none (external launchers)
  bool own_fd = false;
  bool attached = false;  // a gantry-engine launcher on the other end receives our frames
  std::string gloo_host = "127.0.0.1";
  std::unique_ptr<RendezvousServer> server;
  if (env.store_fd >= 0 && options.rendezvous.empty()) {
    struct stat st = {};
    if (::fstat(env.store_fd, &st) != 0 || !S_ISSOCK(st.st_mode)) {
      return early(kWorkerExitBadInput, "GANTRY_STORE_FD = " + std::to_string(env.store_fd) +
                                            " is not an open socket: it must name the socket inherited from "
                                            "gantry-engine run (unset it to rendezvous over TCP instead)");
    }
    // Anything this worker starts must not hold the launcher's socket open after the worker dies.
    ::fcntl(env.store_fd, F_SETFD, FD_CLOEXEC);
    frames_fd = env.store_fd;
    attached = true;
    if (env.rendezvous.empty()) {
      store_fd = env.store_fd;  // gantry-engine run: the launcher serves the store on the same socket
    } else {
      // A node agent's worker: the run's ranks on every node meet in the coordinator's store.
      Result<HostPort> at = host_port_parse(env.rendezvous, kRendezvousVariable);
      if (!at.ok()) return early(kWorkerExitBadInput, at.error());
      Result<int> fd = rendezvous_connect(at.value(), join_deadline);
      if (!fd.ok()) return early(kWorkerExitFailed, fd.error());
      store_fd = fd.value();
      own_fd = true;
      gloo_host = local_address(store_fd);
    }
  } else {
    HostPort at;
    if (!options.rendezvous.empty()) {
      Result<HostPort> hp = host_port_parse(options.rendezvous, "--rendezvous");
      if (!hp.ok()) return early(kWorkerExitBadInput, hp.error());
      at = hp.value();
    } else if (!env.master_addr.empty() && env.master_port > 0) {
      at = {env.master_addr, env.master_port};
    } else {
      return early(
          kWorkerExitBadInput,
          "no rendezvous address: pass --rendezvous HOST:PORT (rank 0's host and a free port) or set "
          "MASTER_ADDR and MASTER_PORT (MASTER_ADDR " +
              (env.master_addr.empty() ? std::string("unset") : "'" + env.master_addr + "'") +
              ", MASTER_PORT " + (env.master_port > 0 ? std::to_string(env.master_port) : "unset") + ")");
    }
    if (env.rank == 0) {
      Result<std::unique_ptr<RendezvousServer>> s = RendezvousServer::start(at);
      if (!s.ok()) return early(kWorkerExitFailed, s.error());
      server = std::move(s.value());
    }
    Result<int> fd = rendezvous_connect(at, join_deadline);
    if (!fd.ok()) return early(kWorkerExitFailed, fd.error());
    store_fd = fd.value();
    own_fd = true;
    gloo_host = local_address(store_fd);
  }
  StoreClient store(store_fd);
  // The launcher's frames share the store's client when they share its socket (the client serialises
  // them with the requests); an agent's worker has a socket for each.
  std::unique_ptr<StoreClient> frames_own;
  StoreClient* frames = nullptr;
  if (attached) {
    if (frames_fd == store_fd) {
      frames = &store;
    } else {
      frames_own = std::make_unique<StoreClient>(frames_fd);
      frames = frames_own.get();
    }
  }
  WorkerResult result;
  TrainProgress progress;
  std::unique_ptr<Heartbeat> heartbeat;  // while attached to a launcher and the communicator exists
  auto finish = [&](int code, const std::string& message) {
    result.code = code;
    result.message = message;
    // The launcher judges a hang from the newest beats: this one says whether our collective timed out.
    if (heartbeat && code != kWorkerExitOk) heartbeat->beat();
    if (attached) {
      result.reported =
          frames->send(FrameType::worker_exit, worker_exit_encode({code, message}), kSendTimeout).ok();
    }
  };

  // ---- say hello, then set up the layout and the communicator -------------------------------------------
  Result<Config> cfg = config_load(options.config_path);
  if (cfg.ok() && options.vp > 0) cfg->train.vp = options.vp;
  int device = -1;
  if (cfg.ok() && cfg->train.backend == "cuda") {
    if (Status st = pin_cuda_device(env); !st.ok()) {
      cfg = Status::error(st.message());  // reported after the hello, like any bad input
    } else {
      device = physical_device(env);
    }
  }
  {
    WorkerHello hello{.rank = env.rank,
                      .world = env.world,
                      .local_rank = env.local_rank,
                      .pid = ::getpid(),
                      .device = device,
                      .host = host_name()};
    StoreClient* to = frames != nullptr ? frames : &store;  // over TCP the hello only proves the connection
    if (Status st = to->send(FrameType::worker_hello, worker_hello_encode(hello), kSendTimeout); !st.ok()) {
      finish(kWorkerExitFailed, who + ": cannot reach the launcher: " + st.message());
      if (own_fd) ::close(store_fd);
      return result;
    }
  }

  [&] {
    if (!cfg.ok()) return finish(kWorkerExitBadInput, who + ": " + cfg.error());
    if (cfg->train.backend == "cpu" && cfg->train.threads == 0 && env.local_world > 1) {
      // "All cores" means this rank's share of them: N ranks each spinning up every core would spend the
      // step fighting over them.
      const int cores = static_cast<int>(std::thread::hardware_concurrency());
      cfg->train.threads = std::max(1, cores / env.local_world);
    }
    const int tp = std::max(1, options.tp), pp = std::max(1, options.pp);
    Result<ParallelDims> dims = ParallelDims::make({.world = env.world,
                                                    .rank = env.rank,
                                                    .dp = env.world / (tp * pp),
                                                    .tp = tp,
                                                    .pp = pp,
                                                    .zero = options.zero});
    if (!dims.ok()) return finish(kWorkerExitBadInput, who + ": " + dims.error());
    if (Status s =
            tensor_parallel_check(cfg->model, dims.value(), cfg->train.backend, cfg->train.sequence_parallel);
        !s.ok())
      return finish(kWorkerExitBadInput, who + ": " + s.message());

    const auto left =
        std::max(std::chrono::milliseconds(1000),
                 std::chrono::duration_cast<std::chrono::milliseconds>(join_deadline - Clock::now()));
    bool bad_input = false;
    const ParallelDims& d = dims.value();
    // tp 1 and pp 1: the dp communicator is the whole gang (as before tensor parallelism). Otherwise a world
    // communicator, then one per tp group, one per pp group and one per dp group (the ranks of one tp x pp
    // coordinate), created in the same order on every rank, each group under a store prefix of its own
    // (ParallelDims::comm_prefix).
    const bool axes = tp > 1 || pp > 1;
    Result<std::unique_ptr<Communicator>> dp =
        !axes ? create_comm(cfg.value(), d.rank, d.dp, d.comm_prefix(ParallelAxis::kDp), store_fd, gloo_host,
                            left, &bad_input)
              : create_comm(cfg.value(), d.rank, d.world, d.comm_prefix(ParallelAxis::kWorld), store_fd,
                            gloo_host, left, &bad_input);
    if (!dp.ok()) return finish(bad_input ? kWorkerExitBadInput : kWorkerExitFailed, who + ": " + dp.error());
    std::unique_ptr<Communicator> tp_comm, dp_comm, pp_comm;
    const struct {
      ParallelAxis axis;
      int rank, size;
      std::unique_ptr<Communicator>* out;
    } groups[] = {{ParallelAxis::kTp, d.tp_rank(), tp, &tp_comm},
                  {ParallelAxis::kPp, d.pp_rank(), pp, &pp_comm},
                  {ParallelAxis::kDp, d.dp_rank(), d.dp, &dp_comm}};
    for (const auto& g : groups) {
      if (!axes || g.size == 1) continue;
      Result<std::unique_ptr<Communicator>> c = create_comm(
          cfg.value(), g.rank, g.size, d.comm_prefix(g.axis), store_fd, gloo_host, left, &bad_input);
      if (!c.ok()) return finish(kWorkerExitFailed, who + ": " + c.error());
      *g.out = std::move(c.value());
    }
    // The flag overrides the config.
    const std::chrono::milliseconds collective_timeout =
        options.collective_timeout.count() > 0
            ? options.collective_timeout
            : std::chrono::milliseconds(static_cast<int64_t>(cfg->train.collective_timeout_s * 1e3));
    if (frames != nullptr) {
      // The launcher's hang timeout (gang.h), when it watches for one: beats must come several times in it.
      std::chrono::milliseconds watched = collective_timeout;
      if (const char* h = std::getenv(kHangTimeoutVariable); h != nullptr) {
        char* end = nullptr;
        const long long ms = std::strtoll(h, &end, 10);
        if (end != h && *end == '\0' && ms > 0) watched = std::min(watched, std::chrono::milliseconds(ms));
      }
      heartbeat = std::make_unique<Heartbeat>(frames, &progress, dp->get(), collective_timeout, watched);
    }
    const HeartbeatStop stop_heartbeat{heartbeat};

    // ---- train ------------------------------------------------------------------------------------------
    DistContext ctx{.dims = dims.value(), .dp = dp->get(), .store = &store, .timeout = collective_timeout};
    if (axes) ctx.dp = dp_comm.get(), ctx.tp = tp_comm.get(), ctx.pp = pp_comm.get(), ctx.world = dp->get();
    WorkerObserver observer(env, frames, device, fault.value(), options.local);
    // Only rank 0's answer counts (train.h); every rank's control takes the drills' faults for it.
    std::unique_ptr<CommandControl> control;
    TrainLiveFaults live_faults;
    if (frames != nullptr) {
      control = std::make_unique<CommandControl>(frames, env.rank, &live_faults);
      if (env.rank == 0) observer.set_control(control.get());
    }
    TrainOptions topt{.out_dir = options.out_dir,
                      .resume = options.resume,
                      .max_steps = options.max_steps,
                      .stop = &g_stop,
                      .dist = &ctx,
                      .control = control.get(),
                      .progress = &progress,
                      .test_forward_delay = std::chrono::milliseconds(
                          fault->kind == WorkerFault::slow_forward ? fault->delay_ms : 0),
                      .live_faults = &live_faults,
                      .test_nan_grad_step = fault->kind == WorkerFault::nan_grad ? fault->step : 0,
                      .test_checkpoint_hook = checkpoint_fault_hook(fault.value(), env.rank),
                      .test_flip_bit_step = fault->kind == WorkerFault::flip_bit ? fault->step : 0};
    // The node agent's memory folder for this run's in-memory copies (agent_memory.h); unset: none.
    if (const char* mem = std::getenv("GANTRY_MEMORY_DIR"); mem != nullptr) topt.memory_dir = mem;
    // An agent's worker (its store is the coordinator's): the coordinator rolls the gang back at a streak.
    topt.launcher_rolls_back = attached && !env.rendezvous.empty();
    topt.skip_batches = options.skip_batches;
    install_stop_handlers();
    bool resume_damaged = false;
    topt.resume_damaged = &resume_damaged;
    Result<TrainSummary> s = train_run(cfg.value(), topt, &observer);
    if (!s.ok()) {
      if (resume_damaged) return finish(kWorkerExitCheckpointDamaged, who + ": " + s.error());
      // A checkpoint that cannot be resumed is the caller's choice gone wrong, as is data that cannot be
      // read; anything after the first step is a failure of the run.
      const bool bad_resume = !options.resume.empty() && !observer.steps_seen();
      const bool bad_data = progress.phase.load() == TrainPhase::kData;
      if (observer.guard_streak()) return finish(kWorkerExitGuardStreak, who + ": " + s.error());
      return finish(bad_resume || bad_data ? kWorkerExitBadInput : kWorkerExitFailed, who + ": " + s.error());
    }
    if (const char* faults = std::getenv(kWorkerFaultVariable); faults != nullptr && *faults != '\0') {
      // Every rank under a test fault: the tests compare the ranks' parameters (a gang whose ranks decided
      // a skip apart would differ).
      std::fprintf(stderr,
                   "gantry-engine worker (rank %d): %s: parameters xxh64 %016llx after %lld skipped\n",
                   env.rank, kWorkerFaultVariable, static_cast<unsigned long long>(s->params_xxh64),
                   static_cast<long long>(s->skipped_steps));
    }
    char sdc[128] = "";
    if (s->sdc_checks > 0) {
      const double n = static_cast<double>(s->sdc_checks);
      std::snprintf(sdc, sizeof sdc, ", %lld sdc checks (%.3f ms each, hashing %.3f ms)",
                    static_cast<long long>(s->sdc_checks), s->sdc_check_s * 1e3 / n, s->sdc_hash_s * 1e3 / n);
    }
    char line[640];
    std::snprintf(line, sizeof line, "done: step %lld, loss %.6f%s, checkpoint %s%s",
                  static_cast<long long>(s->last_step), s->last_loss,
                  s->last_val_loss ? (", val loss " + std::to_string(*s->last_val_loss)).c_str() : "",
                  s->checkpoint_dir.c_str(), sdc);
    if (s->stopped_early) {
      finish(kWorkerExitInterrupted,
             std::string(observer.stopped_by_action() ? "stopped by the operator" : "stopped by a signal") +
                 " at step " + std::to_string(s->last_step) + ", checkpoint " + s->checkpoint_dir);
    } else {
      finish(kWorkerExitOk, line);
    }
  }();
  if (own_fd) ::close(store_fd);
  if (server) server->wait_until_idle(kServeAfterDone);
  return result;
}

}  // namespace gantry
