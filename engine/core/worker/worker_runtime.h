// One rank of a gang: the worker's main logic, between its launcher and train_run. It connects to the
// rendezvous store, says hello, builds the layout (dp = world size, ZeRO stage from the command line) and
// the dp communicator (Gloo for the cpu backend, NCCL for cuda), and runs train_run with an observer that
// sends every step's records up to the launcher. Stopping: SIGINT/SIGTERM set the stop flag once training
// has begun (train_run then stops every rank at the same step boundary, after a checkpoint); before that
// they keep their default action, since a rank still starting up has nothing to save.
//
// Two ways in:
//   gantry-engine run      the launcher forks this worker with GANTRY_STORE_FD (its end of a socketpair) and
//                          torchrun-style variables; the launcher serves the store and receives the frames.
//   torchrun, srun, ...    no inherited socket: rank 0 serves the store on a TCP socket at the rendezvous
//                          address (--rendezvous HOST:PORT, else MASTER_ADDR:MASTER_PORT) in a thread, and
//                          every rank, rank 0 included, connects to it. Rank 0 prints the step lines itself.
//
//   Result<WorkerEnv> env = worker_env_read();
//   WorkerResult r = worker_run({.config_path = "tiny.toml", .out_dir = "runs/tiny", .zero = 1},
//   env.value()); return r.code;   // kWorkerExitOk, kWorkerExitFailed, kWorkerExitBadInput or
//   kWorkerExitInterrupted
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include "engine/core/train.h"
#include "engine/core/worker/worker_env.h"

namespace gantry {

// The worker's exit codes; the same numbers as gantry-engine's (app/commands.h), which the launcher
// passes on: 0 done, 1 failed, 2 bad input (config, layout, checkpoint choice), 5 the resume's checkpoint
// is damaged, 130 stopped by a signal after the checkpoint.
inline constexpr int kWorkerExitOk = 0;
inline constexpr int kWorkerExitFailed = 1;
inline constexpr int kWorkerExitBadInput = 2;
inline constexpr int kWorkerExitInterrupted = 130;
// A test fault's abrupt exit (worker_env.h: exit_after_step), distinct from every code above.
inline constexpr int kWorkerExitTestFault = 3;
// The step guard's streak in a gang under a coordinator (TrainOptions::launcher_rolls_back): every rank stops
// with it, and the coordinator rolls the run back from a checkpoint before the streak.
inline constexpr int kWorkerExitGuardStreak = 4;
// The checkpoint this gang was told to resume from is damaged (a shard missing, truncated or failing its
// checksum; the manifest broken), agreed by every rank (train_checkpoints.h): unlike a checkpoint that does
// not fit (2), an older one may load, and the coordinator's recovery falls back to it.
inline constexpr int kWorkerExitCheckpointDamaged = 5;

struct WorkerOptions {
  std::string config_path;
  std::string out_dir;
  std::string resume;  // "", "latest" or a checkpoint directory (train.h)
  int64_t max_steps = -1;
  int zero = 0;  // ZeRO stage over the dp axis
  int tp = 1;    // tensor-parallel degree; dp = world / (tp x pp)
  int pp = 1;    // pipeline-parallel degree (train.pp_schedule)
  int vp = 0;    // virtual stages per pp rank (interleaved schedule); 0 = the config's train.vp
  std::vector<SkippedBatches> skip_batches;  // TrainOptions::skip_batches (--skip-batches)
  std::string
      rendezvous;  // HOST:PORT for external launchers; "" = GANTRY_STORE_FD or MASTER_ADDR:MASTER_PORT
  std::chrono::milliseconds join_timeout{std::chrono::seconds(60)};  // reaching the store, meeting the peers
  // DistContext::timeout: every collective and store wait. 0 = the config's train.collective_timeout_s.
  std::chrono::milliseconds collective_timeout{0};
  // Also receives this rank's reports, e.g. the step printer when no launcher prints them (external
  // launchers). May be null.
  TrainObserver* local = nullptr;
};

struct WorkerResult {
  int code = kWorkerExitOk;
  std::string message;    // the final line: "done: ..." or the error
  bool reported = false;  // the launcher received it (worker_exit): the caller need not print it too
};

WorkerResult worker_run(const WorkerOptions& options, const WorkerEnv& env);

}  // namespace gantry
