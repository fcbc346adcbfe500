// The training loop: data, schedule, gradient accumulation, clipping, validation and checkpoints around a
// Backend. It reports through an observer and never prints: the caller decides what a line looks like.
//
//   TrainOptions opt{.out_dir = "runs/tiny", .resume = "latest"};
//   Result<TrainSummary> s = train_run(config, opt, &printer);
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "engine/core/backend.h"
#include "engine/core/checkpoint.h"  // CheckpointHook
#include "engine/core/config.h"
#include "engine/core/parallel/parallel_dims.h"
#include "engine/core/step_guard.h"  // GuardRollback
#include "telemetry/status.h"

namespace gantry {

class Communicator;
class StoreClient;
struct SdcMismatch;  // engine/core/sdc_check.h

// One rank of a gang, as the worker runtime sets it up (engine/core/worker). Absent = one process.
// Every rank calls train_run with the same config; the loop splits the global batch over dp, reduces
// gradients in buckets (config train.dp_bucket_mb) as the backward pass fills them, shards by
// dims.zero, and checkpoints with every rank writing its shard and rank 0 committing.
struct DistContext {
  ParallelDims dims;
  Communicator* dp = nullptr;  // the dp axis; may be null only when dims.dp == 1
  // Tensor parallel (parallel/tensor_parallel.h): the tp axis (null at tp 1) and the whole gang, for the
  // gang-wide agreements (start barrier, step-boundary decisions). world null: dp is the whole gang.
  Communicator* tp = nullptr;
  Communicator* world = nullptr;
  // Pipeline parallel (parallel/pipeline_schedule.h): the pp axis (null at pp 1); world is then required.
  Communicator* pp = nullptr;
  StoreClient* store = nullptr;  // the launcher's store: ranks report checkpoint shards, rank 0 commits
  std::chrono::milliseconds timeout{std::chrono::seconds(120)};  // every collective and store wait
};

struct StepReport {
  int64_t step = 0;       // optimizer steps done, counting this one
  int64_t last_step = 0;  // where this run stops
  double loss = 0;        // mean training loss over the global batch
  double grad_norm = 0;   // global L2 norm before clipping
  double lr = 0;
  double tokens_per_s = 0;
  double step_s = 0;        // wall time of this step, seconds
  int64_t tokens = 0;       // tokens in the global batch
  int64_t rank_tokens = 0;  // of those, the tokens this rank processed
  int rank = 0;             // global rank reporting (every rank reports its own phases; loss is global)
  double data_wait_s = 0;   // of step_s, the time spent reading the batch's windows
  PhaseTimes phases;  // forward, backward, optimizer, exposed communication, where the backend measures them
  DeviceHealth device;  // this rank's device after the step
  std::optional<double> val_loss;
  // The step guard skipped this step's update (engine/core/step_guard.h): why; empty when it updated.
  std::string skipped;
  // FLOP utilisation 0..1 (engine/core/utilisation.h), absent when the device's peak is unknown. The job's:
  // global tokens/s over world × peak; the rank's: its own tokens over its step time and one peak.
  std::optional<double> mfu, hfu;
  std::optional<double> rank_mfu, rank_hfu;
};

struct CheckpointReport {
  int64_t step = 0;
  std::string dir;
  uint64_t bytes = 0;
  double seconds = 0;  // the write's own time: write_s
  // What the checkpoint cost training (engine/core/checkpoint_async.h): stall_s is the time the train loop
  // was held (async: the wait for the checkpoint before it and the copy into host memory; sync: all of
  // it), write_s the writer's time to the commit, waited_s the part of stall_s spent waiting for a
  // checkpoint still in flight (0: none was).
  bool async = false;
  double stall_s = 0;
  double write_s = 0;
  double waited_s = 0;
  std::optional<double> copy_s;  // async: the copy into host memory by itself; unknown for a sync write
  // A periodic checkpoint due at this step and taken later, because a write was still in flight then
  // (train.checkpoint_defer_when_busy); -1 = taken when due.
  int64_t deferred_from = -1;
};

// What the run is, for observers that keep a history: handed over once, before the first step.
struct RunDescription {
  std::string config_toml;
  std::string code_version;
  std::string data_version;  // hex
  std::string backend;
  uint64_t params = 0;
  // How the run's MFU is computed (engine/core/utilisation.h); peak_flops 0 = unknown.
  std::string peak_name;
  double peak_flops = 0;
  double flops_per_token = 0;
  std::string mfu_formula;
};

// Operator actions (checkpoint now, pause, resume, stop) that take effect at a step boundary on every rank
// together.
enum class TrainAction : int { none = 0, checkpoint = 1, pause = 2, resume = 3, stop = 4 };
const char* train_action_name(TrainAction a);  // "none", "checkpoint", "pause", "resume", "stop"

// Where actions come from (the worker runtime, fed by the agent). Polled on every rank at each step
// boundary, and while paused; rank 0's answer is the gang's decision: it travels to every rank in the
// same small all-reduce as the ranks' stop flags, so no rank acts on its own.
class TrainControl {
 public:
  virtual ~TrainControl() = default;
  virtual TrainAction poll() = 0;
};

class TrainObserver {
 public:
  virtual ~TrainObserver() = default;
  virtual void on_start(const std::string& /*summary*/) {}
  virtual void on_run(const RunDescription&) {}
  virtual void on_step(const StepReport&) {}
  virtual void on_checkpoint(const CheckpointReport&) {}
  // This rank's checkpoint write failed (`error` says why; c.dir is the checkpoint's directory and
  // c.seconds the time until the failure); train_run returns the error next.
  virtual void on_checkpoint_failed(const CheckpointReport& /*c*/, const std::string& /*error*/) {}
  // An action took effect after `step` (every rank hears it; a checkpoint action's checkpoint is reported
  // through on_checkpoint first: an asynchronous one once it is committed, some steps later).
  virtual void on_action(TrainAction /*action*/, int64_t /*step*/) {}
  // The step guard skipped step `step`'s update (every rank hears it, at the same step), before its on_step.
  virtual void on_step_skipped(int64_t /*step*/, const std::string& /*reason*/) {}
  // The step guard rolled back after a streak of skipped steps (every rank hears it), after the last
  // skipped step's on_step; the next on_step is to_step + 1.
  virtual void on_guard_rollback(const GuardRollback& /*rollback*/) {}
  // A gang whose launcher rolls it back (TrainOptions::launcher_rolls_back) reached a streak: every rank
  // hears it (to_step: the newest step to restore, the one before the streak; dir ""), after the last
  // skipped step's on_step; train_run then returns the error that stops the gang for its coordinator.
  virtual void on_guard_streak(const GuardRollback& /*streak*/) {}
  // The silent-data-corruption check found replicas that disagree (engine/core/sdc_check.h): every rank
  // hears the same verdict at the same step, after that step's on_step; the run then stops with the reason.
  virtual void on_sdc_mismatch(const SdcMismatch& /*mismatch*/) {}
};

// Where a rank is in train_run. A watchdog thread reads it while the loop runs (the worker's heartbeat
// tells the launcher, which names the rank a hung gang waits for); the caller reads it after a failure:
// one in kData is the user's input (a missing or bad shard, a vocabulary too small), exit code 2.
enum class TrainPhase : uint32_t {
  kSetup = 0,       // building the backend, meeting the gang, restoring a checkpoint
  kData = 1,        // preparing and opening the token data
  kBoundary = 2,    // the gang's decision at a step boundary (a small all-reduce), or paused there
  kStep = 3,        // forward, backward, gradient reduction and the optimizer
  kValidation = 4,  // the validation pass
  kCheckpoint = 5,  // writing a checkpoint (shards, then rank 0's commit)
  kDone = 6,
};
const char* train_phase_name(TrainPhase p);  // "setup", "data", "boundary", "step", ...

struct TrainProgress {
  std::atomic<int64_t> step{0};  // optimizer steps done
  std::atomic<TrainPhase> phase{TrainPhase::kSetup};
};

// Faults a drill injects into a running rank (`ctl inject RUN slow|nan`), set from another thread and read by
// the train loop: from the next step on the forward pass sleeps forward_delay_ms (counted as forward time,
// as a slow device would be); nan_next_step makes the next step's gradients on this rank NaN, so the gang's
// norm is NaN and the step guard skips the step.
struct TrainLiveFaults {
  std::atomic<int64_t> forward_delay_ms{0};
  std::atomic<bool> nan_next_step{false};
};

struct TrainOptions {
  std::string out_dir;     // run folder: checkpoints/ and, for the synthetic corpus, data/
  std::string resume;      // "" (fresh), "latest" (newest under out_dir/checkpoints) or a checkpoint dir
  int64_t max_steps = -1;  // stop after this step; -1 = the config's train.max_steps
  const std::atomic<bool>* stop = nullptr;  // set (by a signal handler) to stop at the next step boundary;
                                            // in a gang, any rank's flag stops every rank at the same step
  const DistContext* dist = nullptr;        // null: one process
  TrainControl* control = nullptr;          // operator actions; null: none
  TrainProgress* progress = nullptr;        // where the loop is, for other threads and after a failure
  // Set when train_run fails because the resume's checkpoint is damaged (every refusing rank of the gang
  // found a shard or the manifest broken: checkpoint_load's `damaged`), so an older checkpoint may load;
  // left false for any other failure. May be null.
  bool* resume_damaged = nullptr;
  // Test-only (GANTRY_TEST_WORKER_FAULT slow_forward, worker_env.h): sleep this long before each step's
  // first forward pass and count it as forward time, so that this rank is a straggler with a slow device.
  std::chrono::milliseconds test_forward_delay{0};
  TrainLiveFaults* live_faults = nullptr;  // injected at run time; null: none
  // Test-only (GANTRY_TEST_WORKER_FAULT nan_grad): this rank's gradients of step test_nan_grad_step (1-based)
  // are NaN, so the gang's norm is NaN and the step guard skips the step. 0 = never.
  int64_t test_nan_grad_step = 0;
  // Test-only: the NaN gradients above last this many consecutive batches (bad data: tied to the batch
  // read, so a rollback that passes over them no longer meets them).
  int64_t test_nan_grad_count = 1;
  // Test-only: the data cursor passes over these batches from the start, as after a rollback: the
  // reference a rolled-back run must equal.
  std::vector<SkippedBatches> test_skip_batches;
  // Batches the data cursor passes over from the start, besides those the resumed checkpoint records: the
  // streaks' batches of a gang its coordinator rolled back (`worker --skip-batches`).
  std::vector<SkippedBatches> skip_batches;
  // A gang under a coordinator (an agent's workers): a streak of skipped steps stops the gang with
  // on_guard_streak, and the coordinator places it again from a checkpoint before the streak, passing over
  // the streak's batches (engine/cluster's recover()). false: a gang stops at the streak, saying so.
  bool launcher_rolls_back = false;
  // Test-only: the update of step test_skip_update_step is skipped as the guard skips one (the batch is
  // consumed, nothing updated), the reference a guarded run must equal. 0 = never.
  int64_t test_skip_update_step = 0;
  // Test-only (GANTRY_TEST_WORKER_FAULT kill_in_checkpoint, hold_checkpoint): called at each stage of an
  // asynchronous checkpoint write (checkpoint.h), from the train loop's thread or the writer's.
  CheckpointHook test_checkpoint_hook;
  // Test-only (GANTRY_TEST_WORKER_FAULT flip_bit): after the update of step test_flip_bit_step (1-based) this
  // rank flips one bit of its replicated parameters, so the next silent-data-corruption check names it.
  // 0 = never.
  int64_t test_flip_bit_step = 0;
  // Where this rank's in-memory copies go (train.memory_copy_every, memory_copy.h): the node agent's memory
  // folder for the run (GANTRY_MEMORY_DIR); "" = no agent keeps them, the copies are off.
  std::string memory_dir;
};

struct TrainSummary {
  int64_t first_step = 0;  // steps already done when this run started (resume)
  int64_t last_step = 0;
  double last_loss = 0;
  std::optional<double> last_val_loss;
  uint64_t params = 0;
  uint64_t params_xxh64 = 0;                    // fingerprint of the final parameters
  std::string checkpoint_dir;                   // the checkpoint written at the end
  bool stopped_early = false;                   // by options.stop
  int64_t skipped_steps = 0;                    // updates the step guard skipped
  int64_t guard_rollbacks = 0;                  // rollbacks after streaks of skipped steps
  std::vector<SkippedBatches> skipped_batches;  // batches the data cursor passed over (never read)
  int64_t sdc_checks = 0;  // silent-data-corruption checks made (engine/core/sdc_check.h)
  double sdc_check_s = 0;  // and this rank's wall time in them
  double sdc_hash_s = 0;   // of that, hashing
};

Result<TrainSummary> train_run(const Config& config, const TrainOptions& options, TrainObserver* observer);

// Whether `dp` data-parallel ranks can split the config's batch: dp divides train.global_batch, and the
// micro-batch divides each rank's share. Launchers check it before they start anything; the error names
// the numbers and what would fit.
Status train_layout_check(const Config& config, int dp);

}  // namespace gantry
