// The local launcher: starts N workers on this machine as one gang and watches them until all are gone.
// `gantry-engine run` uses it directly; the node agent will use it for its node's share of a job.
//
// Each worker is a fork+exec of a binary (by default this one, /proc/self/exe) with its own end of an
// AF_UNIX socketpair, whose number it finds in GANTRY_STORE_FD, and torchrun's variables (RANK,
// WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR=127.0.0.1). The launcher's ends are served by one
// StoreServer in one poll loop on the calling thread: rendezvous requests, and the workers' frames
// (hello, step records, exit; engine/core/worker/worker_frames.h) through the callbacks below. The same
// loop reaps children with waitpid(WNOHANG).
//
// Gang semantics: every worker must say hello within the join timeout. If one exits non-zero, dies by a
// signal, closes its socket while still running, breaks the protocol, or fails to join in time, the
// launcher stops the others (SIGTERM, a grace period, SIGKILL), reaps every one, and the result names the
// rank and the cause. A rank that failed because a collective timed out, or because its peers vanished,
// is a victim: when the gang fails that way, the launcher names the rank the others waited for instead
// (hang_blame.h: a stopped process, heartbeats that stopped, a rank that never entered the collective),
// from what it saw when the failure came: /proc/PID/stat and each worker's heartbeats. When *stop becomes
// true (the caller's SIGINT/SIGTERM handler) the workers get SIGTERM (they stop together at the next step
// boundary and checkpoint), a longer grace, then SIGKILL. Every path reaps every child; workers also die with
// the launcher (PR_SET_PDEATHSIG), so none outlives even a SIGKILLed launcher.
//
//   GangOptions g{.nproc = 4, .args = {"worker", "--config", cfg}, .join_timeout = 60s, .stop = &g_stop};
//   g.on_records = [&](int rank, const RecordBatch& b) { history.ingest(b); };
//   GangResult r = gang_run(g);
//   if (r.code != 0) fprintf(stderr, "%s\n", r.error.c_str());   // "rank 2 (pid 4711) was killed by signal 9
//   ..."
//
// Operator actions for a running gang: send() from any thread; the launcher's loop delivers each as a
// worker_command frame (worker_frames.h) within one poll interval (50 ms). Actions go to rank 0, whose
// TrainControl decides for the whole gang (train.h); sending to another rank is allowed but has no effect
// there.
//
//   GangCommands commands;
//   g.commands = &commands;
//   ... from another thread: commands.send(0, {.action = TrainAction::pause, .id = 7, .from = "ctl"});
//
// The calling process must not have initialised CUDA (CUDA does not survive fork): count devices with
// gang_cuda_devices(), which does not.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "engine/core/worker/worker_frames.h"
#include "telemetry/records.h"

namespace gantry {

class GangCommands {
 public:
  // Queues a command for `rank` (a global rank: first_rank .. first_rank + nproc - 1 of the gang).
  void send(int rank, WorkerCommand command);
  // The launcher's side: everything queued so far, in order.
  std::vector<std::pair<int, WorkerCommand>> take();

  // A signal for `rank`'s process, sent by the launcher (which alone knows the pid): the cluster's fault
  // injection (SIGKILL for "kill", SIGSTOP for "hang"), which must look to the gang exactly as the real
  // failure does. A rank no longer alive is skipped.
  void signal(int rank, int sig);
  std::vector<std::pair<int, int>> take_signals();
  // A drill's fault for `rank` (`ctl inject RUN slow|nan`), delivered as a worker_inject frame.
  void inject(int rank, WorkerInject fault);
  std::vector<std::pair<int, WorkerInject>> take_injects();

 private:
  std::mutex mu_;
  std::vector<std::pair<int, WorkerCommand>> queue_;
  std::vector<std::pair<int, int>> signals_;
  std::vector<std::pair<int, WorkerInject>> injects_;
};

struct GangOptions {
  int nproc = 1;
  // A node agent's share of a larger job: these nproc workers are global ranks first_rank .. first_rank +
  // nproc - 1 of `world` (0 = nproc), with LOCAL_RANK 0 .. nproc - 1. gantry-engine run leaves both alone.
  int first_rank = 0;
  int world = 0;
  std::string exe = "/proc/self/exe";  // the worker binary; this one by default
  std::vector<std::string> args;       // argv after argv[0], e.g. {"worker", "--config", path}
  std::vector<std::pair<std::string, std::string>> env;  // extra variables for every worker
  // Non-empty: worker r gets CUDA_VISIBLE_DEVICES=cuda_devices[r] (needs at least nproc entries).
  std::vector<std::string> cuda_devices;
  std::chrono::milliseconds join_timeout{std::chrono::seconds(60)};
  // After SIGTERM for a stop request: time for the gang to reach a step boundary and checkpoint.
  std::chrono::milliseconds stop_grace{std::chrono::seconds(60)};
  // After SIGTERM because a rank failed: the others cannot finish a collective, so nothing is saved by
  // waiting long; the time lets those at a step boundary exit on their own and report.
  std::chrono::milliseconds fail_grace{std::chrono::seconds(3)};
  const std::atomic<bool>* stop = nullptr;  // set by the caller's signal handler
  // Set by the caller on a second Ctrl-C: the operator will not wait out the grace period; SIGKILL now.
  const std::atomic<bool>* kill_now = nullptr;
  GangCommands* commands = nullptr;  // operator actions to deliver; may be null
  // Hang detection while the gang runs (0 = off: a hang is then found only when a peer's collective times
  // out). A worker's heartbeat comes from a thread of its own that never waits on a collective, every
  // interval_ms, through compute, checkpoints and collectives alike; a rank whose heartbeats stop for this
  // long while its process has not exited is hung (SIGSTOPped, a stuck syscall, a debugger): the gang
  // fails at once naming that rank, its last step, phase and collective. A rank that is merely slow keeps
  // beating, and so do its peers waiting for it, so neither is ever called hung. A worker that says its
  // beats have ended (interval 0, on its way out) is not expected to beat again.
  std::chrono::milliseconds hang_timeout{0};

  // Called on the calling thread, from inside the loop.
  std::function<void(int rank, int64_t pid)> on_spawn;
  std::function<void(const WorkerHello&)> on_hello;
  std::function<void(int rank, const WorkerRun&)> on_run;
  std::function<void(int rank, const RecordBatch&)> on_records;
  std::function<void(int rank, const WorkerHeartbeat&)> on_heartbeat;
};

struct GangWorker {
  int rank = 0;  // global rank
  int64_t pid = -1;
  bool joined = false;
  bool exited = false;                 // normal exit (else a signal)
  int code = -1;                       // exit code when exited
  int signal = 0;                      // the signal that ended it
  bool signalled_by_launcher = false;  // it was sent SIGTERM or SIGKILL because the gang was stopping
  bool killed_by_launcher = false;     // it outlived the grace period and was SIGKILLed
  bool said_goodbye = false;           // a worker_exit frame arrived
  WorkerExit goodbye;                  // its code and message
  bool has_heartbeat = false;          // a worker_heartbeat frame arrived
  WorkerHeartbeat heartbeat;           // the newest
  std::string host;
};

struct GangResult {
  // What the launcher should exit with: 0, 1 (a rank failed), 2, 4 or 5 (the failed rank's exit code:
  // bad input, the step guard's streak, a damaged checkpoint to resume from), 130.
  int code = 0;
  bool interrupted = false;  // *stop became true
  // The workers stopped together at an operator's stop action (each exited 130 after its goodbye); the
  // code is then 130 as for an interruption.
  bool stopped = false;
  int failed_rank = -1;  // global rank: the culprit, when a hang was blamed on another rank
  // How likely the failure is the root cause when several gangs of one run fail together (a rank killed
  // by a signal takes its peers down, never the reverse): lower is likelier; -1 when nothing failed.
  int failed_cause_rank = -1;
  std::string error;  // names the failed rank and the cause; "" when code is 0 or 130
  // The gang failed waiting for failed_rank, which stopped answering; also when the gang was told to stop
  // (interrupted) and found one of its ranks stopped or silent: another node's failure was then its doing.
  bool hang = false;
  // The hang was found by hang_timeout (failed_rank's heartbeats stopped while the gang ran), not after a
  // collective timed out: how long it had been silent and its /proc state then ('T': stopped; 0 unknown).
  bool hang_by_timeout = false;
  int64_t hang_silent_ms = 0;
  char hang_process_state = 0;
  std::string final_message;  // rank 0's last word (worker_exit): "done: step ..." on success
  std::vector<GangWorker> workers;
};

// Runs the gang to its end. Never leaves a child behind: a failure to start worker k (socketpair, fork)
// stops and reaps the k already started and is reported like a rank's failure.
GangResult gang_run(const GangOptions& options);

// The CUDA devices this process may give out, without initialising CUDA: the entries of
// CUDA_VISIBLE_DEVICES when it is set, else "0".."n-1" for the n entries of /proc/driver/nvidia/gpus.
std::vector<std::string> gang_cuda_devices();

// "SIGKILL", "SIGSEGV", ..., or "signal 42".
std::string signal_name(int sig);

}  // namespace gantry
