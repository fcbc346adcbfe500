#include "engine/core/train.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <limits>
#include <thread>
#include <vector>

#include "engine/core/backend.h"
#include "engine/core/checkpoint.h"
#include "engine/core/comm/communicator.h"
#include "engine/core/corpus.h"
#include "engine/core/data_cursor_log.h"
#include "engine/core/fatal.h"
#include "engine/core/gpt.h"
#include "engine/core/memory_copy.h"
#include "engine/core/optim.h"
#include "engine/core/parallel/pipeline_schedule.h"
#include "engine/core/parallel/shard_plan.h"
#include "engine/core/parallel/tensor_parallel.h"
#include "engine/core/rng.h"
#include "engine/core/sampler.h"
#include "engine/core/sdc_check.h"
#include "engine/core/step_guard.h"
#include "engine/core/token_dataset.h"
#include "engine/core/train_checkpoints.h"
#include "engine/core/utilisation.h"
#include "engine/core/version.h"
#include "engine/core/xxhash64.h"

namespace gantry {
namespace fs = std::filesystem;

namespace {

struct Splits {
  TokenDataset train;
  TokenDataset val;
};

// The data directory of the run; the synthetic corpus is written there on first use, deterministically.
Result<std::string> prepare_data_dir(const Config& c, const std::string& out_dir) {
  if (c.data.kind == "shards") return c.data.dir;
  const std::string dir = (fs::path(out_dir) / "data").string();
  if (token_shard_glob(dir, c.data.train_prefix).ok() && token_shard_glob(dir, c.data.val_prefix).ok())
    return dir;
  SyntheticSpec spec{.vocab = c.model.vocab_size,
                     .branching = c.data.synthetic_branching,
                     .seed = c.data.synthetic_seed,
                     .train_tokens = c.data.synthetic_train_tokens,
                     .val_tokens = c.data.synthetic_val_tokens};
  Result<CorpusStats> w = corpus_write_synthetic(spec, dir);
  if (!w.ok()) return w.status();
  return dir;
}

Result<TokenDataset> open_split(const Config& c, const std::string& dir, const std::string& prefix) {
  Result<std::vector<std::string>> paths = token_shard_glob(dir, prefix);
  if (!paths.ok()) return paths.status();
  Result<TokenDataset> ds = TokenDataset::open(paths.value(), c.model.seq_len);
  if (!ds.ok()) return ds.status();
  if (ds->max_token() >= static_cast<uint32_t>(c.model.vocab_size)) {
    return Status::error("data in '" + dir + "' (" + prefix + "*.bin) holds token " +
                         std::to_string(ds->max_token()) +
                         " but model.vocab_size = " + std::to_string(c.model.vocab_size) +
                         ": raise model.vocab_size above the largest token");
  }
  return ds;
}

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

namespace {

Result<TrainSummary> train_run_unguarded(const Config& c, const TrainOptions& opt, TrainObserver* observer) {
  TrainProgress own_progress;
  TrainProgress& progress = opt.progress != nullptr ? *opt.progress : own_progress;
  auto enter = [&](TrainPhase p) { progress.phase.store(p); };
  enter(TrainPhase::kSetup);
  Status valid = config_validate(c);
  if (!valid.ok()) return valid;
  TrainObserver quiet;
  if (observer == nullptr) observer = &quiet;

  std::error_code ec;
  fs::create_directories(opt.out_dir, ec);
  if (ec) return Status::error("cannot create output directory '" + opt.out_dir + "': " + ec.message());
  // In a gang, rank 0 writes the synthetic corpus while the others wait, so no two ranks write one file.
  const DistContext* gang_ctx = opt.dist != nullptr && opt.dist->dims.world > 1 ? opt.dist : nullptr;
  // The communicator every rank of the gang is in: the world's under tensor or pipeline parallelism, else
  // the dp axis'.
  Communicator* gang_comm =
      gang_ctx == nullptr ? nullptr : (gang_ctx->world != nullptr ? gang_ctx->world : gang_ctx->dp);
  if (opt.dist != nullptr) {
    if (Status s = tensor_parallel_check(c.model, opt.dist->dims, c.train.backend, c.train.sequence_parallel);
        !s.ok())
      return s;
  }
  if (gang_ctx != nullptr && gang_ctx->dims.pp > 1 && (gang_ctx->pp == nullptr || gang_ctx->world == nullptr))
    return Status::error("a pipeline-parallel gang needs its pp and world communicators");
  if (gang_ctx != nullptr && gang_ctx->dims.tp > 1 && (gang_ctx->tp == nullptr || gang_ctx->world == nullptr))
    return Status::error("a tensor-parallel gang needs its tp and world communicators");
  if (gang_ctx != nullptr && gang_comm == nullptr)
    return Status::error("a gang of ranks needs its dp communicator");
  // Only the data's own failures count as kData (bad input); the barrier between is the gang's.
  enter(TrainPhase::kData);
  Result<std::string> data_dir = gang_ctx == nullptr || gang_ctx->dims.rank == 0
                                     ? prepare_data_dir(c, opt.out_dir)
                                     : Result<std::string>("");
  if (gang_ctx != nullptr) {
    enter(TrainPhase::kSetup);
    Status st = gang_comm->barrier(gang_ctx->timeout);
    if (!st.ok()) return st;
    enter(TrainPhase::kData);
    if (gang_ctx->dims.rank != 0) data_dir = prepare_data_dir(c, opt.out_dir);
  }
  if (!data_dir.ok()) return data_dir.status();
  Result<TokenDataset> train = open_split(c, data_dir.value(), c.data.train_prefix);
  if (!train.ok()) return train.status();
  Result<TokenDataset> val = open_split(c, data_dir.value(), c.data.val_prefix);
  if (!val.ok()) return val.status();
  enter(TrainPhase::kSetup);

  // The layout: dp ranks split the global batch; each runs micro-batches of at most train.micro_batch.
  const DistContext* dist = opt.dist;
  const ParallelDims dims = dist != nullptr ? dist->dims : ParallelDims{};
  if (dims.dp > 1 && dist->dp == nullptr)
    return Status::error("a data-parallel run needs its dp communicator");
  const int T = c.model.seq_len, dp = dims.dp, dp_rank = dims.dp_rank();
  if (Status s = train_layout_check(c, dp); !s.ok()) return s;
  const int share = c.train.global_batch / dp;
  const int B = std::min(c.train.micro_batch, share);
  const int accum = share / B;
  if (Status s = pipeline_check(c, dims, accum, c.train.vp); !s.ok()) return s;
  const std::chrono::milliseconds comm_timeout =
      dist != nullptr ? dist->timeout : std::chrono::milliseconds(0);
  const size_t bucket_bytes = static_cast<size_t>(c.train.dp_bucket_mb * 1024.0 * 1024.0);
  Result<std::unique_ptr<Backend>> created =
      backend_create(c.train.backend, c.model, B,
                     {.threads = c.train.threads,
                      .cuda_graphs = c.train.cuda_graphs,
                      .deterministic = c.train.deterministic,
                      .dp = dist != nullptr ? dist->dp : nullptr,
                      .tp = dist != nullptr && dims.tp > 1 ? dist->tp : nullptr,
                      .sequence_parallel = c.train.sequence_parallel,
                      .pp = dist != nullptr && dims.pp > 1 ? dist->pp : nullptr,
                      .pp_schedule = c.train.pp_schedule,
                      .vp = c.train.vp,
                      .zero = dims.zero,
                      .bucket_bytes = bucket_bytes,
                      .comm_timeout = dist != nullptr ? dist->timeout : std::chrono::milliseconds(120000)});
  if (!created.ok()) return created.status();
  std::unique_ptr<Backend> backend = std::move(created.value());
  const TensorTable& table = backend->params();
  // FLOPs per token are the whole model's: under tensor or pipeline parallelism the table is a share.
  const RunUtilisation util =
      run_utilisation(c, dims.tp > 1 || dims.pp > 1 ? gpt_param_table(c.model).numel() : table.numel(),
                      backend->device_name());
  CheckpointGang gang{
      .store = dist != nullptr ? dist->store : nullptr, .layout = dims, .timeout = comm_timeout};
  if (dims.world > 1 && gang.store == nullptr)
    return Status::error("a gang of ranks needs the launcher's store");
  CheckpointGang* ckpt_gang = dims.world > 1 ? &gang : nullptr;
  if (c.train.guard_spike_factor > 0 && !backend->honours_max_loss()) {
    return Status::error(
        "train.guard_spike_factor: the " + backend->name() +
        " backend cannot skip an update on the loss yet (its fused update reads only the gradient "
        "norm); set it to 0 (NaN/Inf steps are still skipped)");
  }
  StepGuard guard(c.train);
  SdcCheck sdc(c.train.sdc_check_every, dims, dist != nullptr ? dist->dp : nullptr, comm_timeout, *backend,
               opt.test_flip_bit_step);

  Rng rng{c.train.seed};
  int64_t step = 0;
  // Batches the data cursor passes over (rollbacks, this run's and the checkpoint's); sorted.
  std::vector<SkippedBatches> skipped_batches = opt.test_skip_batches;
  for (const SkippedBatches& r : opt.skip_batches) {
    for (uint64_t k = 0; k < r.count; ++k) sampler_skip_batch(skipped_batches, r.first + k);
  }
  const std::string ckpt_root = (fs::path(opt.out_dir) / "checkpoints").string();
  if (opt.resume.empty()) {
    // Every rank draws the same initial parameters and keeps the part it holds.
    std::vector<float> init(table.numel());
    if (dims.tp > 1) {
      // The whole model drawn as one process draws it, then this tp rank's share cut out of it.
      const TensorTable whole = gpt_param_table(c.model);
      std::vector<float> all(whole.numel());
      gpt_init_params(c.model, whole, rng.next_u64(), all.data());
      if (dims.pp > 1) {
        // tp x pp: the tp share, then the stage's tensors of it.
        const TensorTable tp_whole = gpt_param_table(c.model, dims.tp);
        std::vector<float> tp_share(tp_whole.numel());
        tensor_parallel_slice(c.model, dims.tp, dims.tp_rank(), all.data(), tp_share.data());
        pipeline_slice(tp_whole, tp_share.data(), table, init.data());
      } else {
        tensor_parallel_slice(c.model, dims.tp, dims.tp_rank(), all.data(), init.data());
      }
    } else if (dims.pp > 1) {
      // The same for a pipeline stage: its tensors cut out of the whole model.
      const TensorTable whole = gpt_param_table(c.model);
      std::vector<float> all(whole.numel());
      gpt_init_params(c.model, whole, rng.next_u64(), all.data());
      pipeline_slice(whole, all.data(), table, init.data());
    } else {
      gpt_init_params(c.model, table, rng.next_u64(), init.data());
    }
    for (const FlatRange& r : backend->held_ranges(StateBuffer::kParams)) {
      backend->write_state(StateBuffer::kParams, r.offset, r.count, init.data() + r.offset);
    }
  } else {
    Result<std::string> dir =
        opt.resume == "latest" ? checkpoint_latest(ckpt_root) : Result<std::string>(opt.resume);
    if (!dir.ok()) return dir.status();
    std::string damaged;
    Result<CheckpointMeta> meta = checkpoint_load(dir.value(), *backend, c, train->data_version(), &damaged);
    // The gang agrees on the load before its first collective: a rank refused alone would otherwise
    // leave its peers to fail on "peer closed", named as the cause (train_checkpoints.h).
    if (Status agreed =
            checkpoint_load_agree(meta.ok() ? Status{} : meta.status(), !damaged.empty(), dir.value(),
                                  dist == nullptr          ? nullptr
                                  : dist->world != nullptr ? dist->world
                                                           : dist->dp,
                                  dist != nullptr ? dist->store : nullptr, comm_timeout, opt.resume_damaged);
        !agreed.ok())
      return agreed;
    step = meta->step;
    rng.state = meta->rng_state;
    for (const SkippedBatches& r : meta->skipped_batches) {
      for (uint64_t k = 0; k < r.count; ++k) sampler_skip_batch(skipped_batches, r.first + k);
    }
  }
  progress.step.store(step);
  // Which samples this rank reads at each step, from here (engine/core/data_cursor_log.h).
  DataCursorLog cursor_log(c.train.data_cursor_log ? opt.out_dir : "", dims.rank, dp, dp_rank, step);

  const int64_t last_step = opt.max_steps >= 0 ? opt.max_steps : c.train.max_steps;
  TrainSummary summary;
  summary.first_step = step;
  summary.params = table.numel();
  {
    char buf[768];
    std::snprintf(
        buf, sizeof buf,
        "gantry %s | backend %s, %.2f GB allocated up front | %zu parameters | %d layers, d %d, %d heads, "
        "T %d, vocab %d | global batch %d = %d ranks x %d micro x %d | %llu train windows | steps %lld..%lld",
        code_version(), backend->name().c_str(), static_cast<double>(backend->memory_bytes()) / 1e9,
        table.numel(), c.model.n_layer, c.model.n_embd, c.model.n_head, T, c.model.vocab_size,
        c.train.global_batch, dp, B, accum, static_cast<unsigned long long>(train->num_windows()),
        static_cast<long long>(step), static_cast<long long>(last_step));
    std::string summary_text = buf;
    summary_text += "\n" + util.formula;
    if (dims.world > 1) {
      const bool gpu = c.train.backend == "cuda";
      if (dims.pp > 1) {
        PipelineSchedule ps{};
        pipeline_schedule_from_name(c.train.pp_schedule, &ps);
        summary_text += "\npipeline: " + c.train.pp_schedule + ", vp " + std::to_string(c.train.vp) + ", " +
                        std::to_string(accum) + " micro-batches, ideal bubble " +
                        std::to_string(pipeline_schedule_bubble(ps, dims.pp, c.train.vp, accum)) + " | " +
                        pipeline_partition(c.model, dims.pp * c.train.vp,
                                           gpu ? ClassifierGradStage::kLast : ClassifierGradStage::kFirst)
                            .describe();
      }
      // The plan the backend's state holds: the GPU's stage begins a bucket at each interleaved chunk's first
      // block (as backend_cuda.cu builds it); the CPU's reduces after its schedule and cuts no such buckets.
      const std::vector<int> bucket_starts =
          gpu && dims.pp > 1 ? pipeline_chunk_bucket_starts(pipeline_partition(c.model, dims.pp * c.train.vp,
                                                                               ClassifierGradStage::kLast),
                                                            dims.pp, dims.pp_rank())
                             : std::vector<int>{};
      summary_text +=
          "\nlayout " + dims.describe() +
          (dims.tp > 1 && c.train.sequence_parallel ? ", sequence parallel" : "") + " | " +
          shard_memory_text(shard_plan_make(table, dp, dp_rank, dims.zero, bucket_bytes, bucket_starts)) +
          "\n" + sdc.describe();
      if (backend->name() != "cpu") {
        // The GPU keeps a bf16 copy beside the fp32 master weights: its own bytes, not the fp32 formula's.
        const StateBytes held = backend->state_bytes();
        char line[200];
        std::snprintf(line, sizeof line,
                      "\n%s state on this rank: params %.3f MB, grads %.3f MB, AdamW %.3f MB",
                      backend->name().c_str(), static_cast<double>(held.params) / 1e6,
                      static_cast<double>(held.grads) / 1e6, static_cast<double>(held.optimizer) / 1e6);
        summary_text += line;
      }
    }
    observer->on_start(summary_text);
    char version[24];
    std::snprintf(version, sizeof version, "%016llx", static_cast<unsigned long long>(train->data_version()));
    observer->on_run({.config_toml = config_dump(c),
                      .code_version = code_version(),
                      .data_version = version,
                      .backend = backend->name(),
                      .params = table.numel(),
                      .peak_name = util.peak_name,
                      .peak_flops = util.peak_flops,
                      .flops_per_token = util.flops_per_token,
                      .mfu_formula = util.formula});
  }

  std::vector<int32_t> inputs(static_cast<size_t>(B) * T), targets(static_cast<size_t>(B) * T);
  // Declared after the backend, so a write still in flight ends before the backend does.
  TrainCheckpoints checkpoints(c, ckpt_root, *backend, ckpt_gang, observer, opt.test_checkpoint_hook);
  auto write_checkpoint = [&](double loss, bool from_action, bool final) -> Status {
    enter(TrainPhase::kCheckpoint);
    CheckpointMeta meta{.step = step,
                        .sampler_seed = c.train.seed,
                        .rng_state = rng.state,
                        .config = c,
                        .data_version = train->data_version(),
                        .code_version = code_version(),
                        .loss = loss,
                        .skipped_batches = skipped_batches};
    Status s = checkpoints.write(meta, from_action, final);
    summary.checkpoint_dir = checkpoints.last_dir();
    return s;
  };
  MemoryCopies memory(c.train.memory_copy_every, opt.memory_dir, *backend, ckpt_gang,
                      c.train.memory_copy_async);
  // A copy that fails is said and training goes on: the disk checkpoints still stand behind it.
  auto write_memory_copy = [&](double loss) {
    enter(TrainPhase::kCheckpoint);
    Result<double> w = memory.write({.step = step,
                                     .sampler_seed = c.train.seed,
                                     .rng_state = rng.state,
                                     .config = c,
                                     .data_version = train->data_version(),
                                     .code_version = code_version(),
                                     .loss = loss});
    if (!w.ok())
      std::fprintf(stderr, "rank %d: the in-memory copy of step %lld failed: %s\n", dims.rank,
                   static_cast<long long>(step), w.error().c_str());
  };
  // An asynchronous copy that has finished; one that failed is said, and training goes on.
  auto collect_memory_copy = [&](bool wait) {
    if (Status s = memory.collect(wait); !s.ok())
      std::fprintf(stderr, "rank %d: an in-memory copy failed: %s\n", dims.rank, s.message().c_str());
  };

  double last_loss = 0;
  // The step a periodic checkpoint was due at and deferred from (train.checkpoint_defer_when_busy); -1 =
  // none is waiting.
  int64_t checkpoint_deferred_from = -1;
  // The streak of skipped steps in progress: its first step (1-based) and the batches it read.
  int64_t streak_first_step = 0;
  std::vector<SkippedBatches> streak_batches;
  // Restores the newest committed checkpoint from before the streak and moves the data cursor past the
  // streak's batches; an error with the reason when the run must stop instead.
  auto roll_back = [&](const GuardVerdict& verdict) -> Status {
    const std::string streak = "step " + std::to_string(step) + ": " + std::to_string(guard.skips_in_row()) +
                               " steps in a row skipped by the step guard (train.guard_max_skips_in_row = " +
                               std::to_string(guard.max_skips_in_row()) + "), the last: " + verdict.reason +
                               ": training diverged; stopping";
    const std::string advice =
        ": resume from the last checkpoint, with a lower optim.lr or optim.grad_clip set";
    if (c.train.guard_on_streak == "stop")
      return Status::error(streak + " (train.guard_on_streak = \"stop\")" + advice);
    if (summary.guard_rollbacks >= c.train.guard_max_rollbacks) {
      return Status::error(streak + " after " + std::to_string(summary.guard_rollbacks) +
                           " rollbacks (train.guard_max_rollbacks = " +
                           std::to_string(c.train.guard_max_rollbacks) + ")" + advice);
    }
    if (dims.world > 1 && opt.launcher_rolls_back) {
      // Every rank restores together from storage they all reach: the coordinator's recovery does that,
      // from the newest checkpoint committed before the streak (a write in flight is one of them).
      if (Status s = checkpoints.collect(/*wait=*/true); !s.ok()) return s;
      observer->on_guard_streak({.from_step = step,
                                 .to_step = streak_first_step - 1,
                                 .skips = guard.skips_in_row(),
                                 .skipped = streak_batches,
                                 .rollback = static_cast<int>(summary.guard_rollbacks + 1),
                                 .reason = verdict.reason});
      return Status::error(streak +
                           " (a gang: its coordinator rolls it back to a checkpoint at or before step " +
                           std::to_string(streak_first_step - 1) + ", passing over the streak's batches)");
    }
    if (dims.world > 1) {
      // Every rank would have to restore together from storage they all reach: the coordinator's recovery.
      return Status::error(streak +
                           " (a gang does not roll back by itself yet: the coordinator's recovery "
                           "resumes from the last checkpoint)" +
                           advice);
    }
    if (Status s = checkpoints.collect(/*wait=*/true); !s.ok()) return s;
    std::string target;
    for (const std::string& dir : checkpoint_list(ckpt_root)) {
      const int64_t at = checkpoint_dir_step(dir);
      if (at >= 0 && at < streak_first_step) target = dir;  // oldest first: the last one wins
    }
    if (target.empty()) {
      return Status::error(streak + ": no committed checkpoint under '" + ckpt_root + "' at or before step " +
                           std::to_string(streak_first_step - 1) +
                           " to roll back to (set train.checkpoint_every, or train.guard_on_streak = "
                           "\"stop\")" +
                           advice);
    }
    enter(TrainPhase::kSetup);
    Result<CheckpointMeta> meta = checkpoint_load(target, *backend, c, train->data_version());
    if (!meta.ok())
      return Status::error(streak + ": rolling back to '" + target + "' failed: " + meta.error());
    GuardRollback rb{.from_step = step,
                     .to_step = meta->step,
                     .dir = target,
                     .skips = guard.skips_in_row(),
                     .skipped = streak_batches,
                     .rollback = static_cast<int>(summary.guard_rollbacks + 1),
                     .reason = verdict.reason};
    step = meta->step;
    rng.state = meta->rng_state;
    last_loss = meta->loss;
    progress.step.store(step);
    cursor_log.rolled_back(step);
    guard = StepGuard(c.train);
    ++summary.guard_rollbacks;
    observer->on_guard_rollback(rb);
    streak_first_step = 0;
    streak_batches.clear();
    checkpoint_deferred_from = -1;  // a checkpoint due after the step rolled back to is no longer due
    return {};
  };
  // The gang's decision at a step boundary: rank 0's action and every rank's stop flag, in one sum, so
  // every rank acts on the same thing at the same step.
  struct Decision {
    TrainAction action = TrainAction::none;
    bool stop = false;
    bool writer_busy = false;  // some rank's async checkpoint write is still in flight
    bool memory_busy = false;  // some rank's async in-memory copy is still being written
  };
  auto decide = [&]() -> Result<Decision> {
    float v[4] = {0.0f, opt.stop != nullptr && opt.stop->load() ? 1.0f : 0.0f,
                  checkpoints.in_flight() ? 1.0f : 0.0f, memory.in_flight() ? 1.0f : 0.0f};
    // Every rank polls (its own control also takes the drills' faults for that rank); rank 0's answer alone
    // is the gang's action.
    if (opt.control != nullptr) {
      const TrainAction a = opt.control->poll();
      if (dims.rank == 0) v[0] = static_cast<float>(a);
    }
    if (gang_comm != nullptr) {
      Status st = gang_comm->all_reduce_host(v, 4, comm_timeout);
      if (!st.ok()) return st;
    }
    Decision d{.action = static_cast<TrainAction>(static_cast<int>(v[0])),
               .stop = v[1] > 0,
               .writer_busy = v[2] > 0,
               .memory_busy = v[3] > 0};
    if (d.action == TrainAction::stop) d.stop = true;
    return d;
  };
  // Applies a checkpoint action; true when the loop must stop.
  bool paused = false;
  auto apply = [&](const Decision& d) -> Result<bool> {
    if (d.stop) {
      if (d.action == TrainAction::stop) observer->on_action(TrainAction::stop, step);
      return true;
    }
    switch (d.action) {
      case TrainAction::checkpoint: {
        // on_action follows the checkpoint's report (TrainCheckpoints), once it is committed.
        Status s = write_checkpoint(last_loss, /*from_action=*/true, /*final=*/false);
        if (!s.ok()) return s;
        break;
      }
      case TrainAction::pause:
        if (!paused) observer->on_action(d.action, step);
        paused = true;
        break;
      case TrainAction::resume:
        if (paused) observer->on_action(d.action, step);
        paused = false;
        break;
      default:
        break;
    }
    return false;
  };

  while (step < last_step) {
    // The step's time starts here: the boundary's agreement is a collective that also waits for whatever
    // the communicator still has queued from the step before (unless an action holds the gang here: a
    // checkpoint to write, a pause).
    auto t0 = std::chrono::steady_clock::now();
    enter(TrainPhase::kBoundary);
    if (Status s = checkpoints.collect(/*wait=*/false); !s.ok()) return s;
    collect_memory_copy(/*wait=*/false);
    Result<Decision> d = decide();
    if (!d.ok()) return d.status();
    Result<bool> stop = apply(d.value());
    const bool held = d->action != TrainAction::none;
    // Paused: the gang holds at this boundary, deciding again every 50 ms until resume or stop.
    while (stop.ok() && !stop.value() && paused) {
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
      if (Status s = checkpoints.collect(/*wait=*/false); !s.ok()) return s;
      collect_memory_copy(/*wait=*/false);
      d = decide();
      if (!d.ok()) return d.status();
      stop = apply(d.value());
    }
    if (!stop.ok()) return stop.status();
    if (stop.value()) {
      summary.stopped_early = true;
      break;
    }
    if (held) t0 = std::chrono::steady_clock::now();
    enter(TrainPhase::kStep);
    double data_wait = 0;
    double test_delay_s = 0;  // opt.test_forward_delay, as slept
    const uint64_t batch = sampler_batch(static_cast<uint64_t>(step), skipped_batches);
    backend->begin_step(accum);
    for (int micro = 0; micro < accum; ++micro) {
      const auto d0 = std::chrono::steady_clock::now();
      SampleRange r = sampler_micro_batch(batch, c.train.global_batch, dp, dp_rank, B, micro);
      for (uint64_t k = 0; k < r.count; ++k) {
        const uint64_t w = sampler_window(c.train.seed, r.first + k, train->num_windows());
        train->window(w, inputs.data() + k * T, targets.data() + k * T);
        cursor_log.add(r.first + k, w);
      }
      data_wait += seconds_since(d0);
      const std::chrono::milliseconds delay =
          std::max(opt.test_forward_delay,
                   std::chrono::milliseconds(opt.live_faults ? opt.live_faults->forward_delay_ms.load() : 0));
      if (micro == 0 && delay.count() > 0) {
        const auto s0 = std::chrono::steady_clock::now();
        std::this_thread::sleep_for(delay);
        test_delay_s = seconds_since(s0);
      }
      // Each sequence weighs 1/global_batch, so summing the ranks' gradients gives the global mean.
      float grad_scale = static_cast<float>(r.count) / static_cast<float>(c.train.global_batch);
      const bool test_nan =
          opt.test_nan_grad_step > 0 && batch + 1 >= static_cast<uint64_t>(opt.test_nan_grad_step) &&
          batch + 1 < static_cast<uint64_t>(opt.test_nan_grad_step + opt.test_nan_grad_count);
      if (micro == 0 && (test_nan || (opt.live_faults && opt.live_faults->nan_next_step.exchange(false))))
        grad_scale = std::numeric_limits<float>::quiet_NaN();
      backend->forward_backward(inputs.data(), targets.data(), static_cast<int>(r.count), grad_scale);
    }
    const double lr = lr_at(c, step);
    backend->optimizer_step({.lr = lr,
                             .beta1 = c.optim.beta1,
                             .beta2 = c.optim.beta2,
                             .eps = c.optim.eps,
                             .weight_decay = c.optim.weight_decay,
                             .grad_clip = c.optim.grad_clip,
                             .step = step + 1,
                             // -infinity: the test's reference skip, through the guard's own path.
                             .max_loss = opt.test_skip_update_step == step + 1
                                             ? -std::numeric_limits<double>::infinity()
                                             : guard.loss_limit()});
    const StepStats stats = backend->step_stats();
    const double loss = stats.loss, norm = stats.grad_norm;
    // The loss and norm are the gang's reduced ones (the same bits on every rank): every rank skips together.
    GuardVerdict verdict = guard.judge(loss, norm);
    if (!verdict.skip && opt.test_skip_update_step == step + 1) verdict = {true, "test: update skipped"};
    if (verdict.skip && stats.updated) {
      // A backend that skips on the norm only (CUDA) with a non-finite loss and a finite norm.
      return Status::error("step " + std::to_string(step + 1) + ": " + verdict.reason +
                           " but the backend updated the parameters: training diverged; resume from the last "
                           "checkpoint with a lower optim.lr");
    }
    if (!verdict.skip && !stats.updated) {
      return Status::error("step " + std::to_string(step + 1) + ": the backend skipped the update (loss " +
                           std::to_string(loss) + ", grad norm " + std::to_string(norm) +
                           ") where the step guard would not");
    }
    guard.record(loss, verdict.skip);
    ++step;
    progress.step.store(step);
    cursor_log.step_done(step, batch);
    if (verdict.skip) {
      ++summary.skipped_steps;
      if (guard.skips_in_row() == 1) {
        streak_first_step = step;
        streak_batches.clear();
      }
      sampler_skip_batch(streak_batches, batch);
      observer->on_step_skipped(step, verdict.reason);
    } else {
      last_loss = loss;
    }

    StepReport rep{.step = step,
                   .last_step = last_step,
                   .loss = loss,
                   .grad_norm = norm,
                   .lr = lr,
                   .tokens = static_cast<int64_t>(c.train.global_batch) * T,
                   .rank_tokens = static_cast<int64_t>(share) * T,
                   .rank = dims.rank,
                   .data_wait_s = data_wait,
                   .phases = backend->phase_times(),
                   .device = backend->device_health()};
    rep.skipped = verdict.reason;
    rep.phases.forward_s += test_delay_s;
    if (c.train.val_every > 0 && step % c.train.val_every == 0) {
      enter(TrainPhase::kValidation);
      // The same val_batches x micro_batch windows whatever the layout, in chunks the backend takes; every
      // rank evaluates all of them (ZeRO 3's gathers need every rank in each forward pass anyway).
      const int windows = c.train.val_batches * c.train.micro_batch;
      double vsum = 0;
      for (int first = 0; first < windows; first += B) {
        const int n = std::min(B, windows - first);
        for (int k = 0; k < n; ++k) {
          const uint64_t w = static_cast<uint64_t>(first + k) % val->num_windows();
          val->window(w, inputs.data() + static_cast<size_t>(k) * T,
                      targets.data() + static_cast<size_t>(k) * T);
        }
        vsum += static_cast<double>(backend->forward_loss(inputs.data(), targets.data(), n)) * n;
      }
      rep.val_loss = vsum / windows;
      summary.last_val_loss = rep.val_loss;
    }
    // Inside the step's time: the check's cost shows in the throughput it costs.
    if (Status s = sdc.after_step(step); !s.ok()) return s;
    const double secs = seconds_since(t0);
    rep.step_s = secs;
    rep.tokens_per_s = static_cast<double>(rep.tokens) / secs;
    const double per_device = rep.tokens_per_s / std::max(1, dims.world);
    rep.mfu = util.mfu(per_device);
    rep.hfu = util.hfu(per_device);
    const double rank_rate = static_cast<double>(rep.rank_tokens) / secs;
    rep.rank_mfu = util.mfu(rank_rate);
    rep.rank_hfu = util.hfu(rank_rate);
    observer->on_step(rep);
    if (sdc.found()) return sdc.stop(observer);
    if (verdict.skip && guard.exhausted()) {
      // The streak's batches are passed over from now on: a replay must not meet them again.
      std::vector<SkippedBatches> before = skipped_batches;
      for (const SkippedBatches& r : streak_batches) {
        for (uint64_t k = 0; k < r.count; ++k) sampler_skip_batch(skipped_batches, r.first + k);
      }
      if (Status s = roll_back(verdict); !s.ok()) {
        skipped_batches = before;
        return s;
      }
      continue;
    }

    if (c.train.checkpoint_every > 0 && step < last_step &&
        (step % c.train.checkpoint_every == 0 || checkpoint_deferred_from >= 0)) {
      // Deferred while any rank's write was in flight at this step's boundary (every rank sees the same
      // sum, so every rank takes the same step).
      if (c.train.checkpoint_defer_when_busy && d->writer_busy) {
        if (checkpoint_deferred_from < 0) checkpoint_deferred_from = step;
      } else {
        checkpoints.set_deferred_from(checkpoint_deferred_from);
        checkpoint_deferred_from = -1;
        Status s = write_checkpoint(loss, /*from_action=*/false, /*final=*/false);
        if (!s.ok()) return s;
      }
    }
    if (memory.due(step) && step < last_step) {
      // Every rank saw the same memory_busy at this step's boundary, so every rank skips alike.
      if (d->memory_busy)
        memory.skip();
      else
        write_memory_copy(loss);
    }
  }
  collect_memory_copy(/*wait=*/true);
  if (memory.on())
    std::fprintf(
        stderr,
        "rank %d: in-memory copies: %lld written, %lld skipped (the one before was still being written)\n",
        dims.rank, static_cast<long long>(memory.written()), static_cast<long long>(memory.skipped()));
  if (step > summary.first_step || opt.resume.empty()) {
    checkpoints.set_deferred_from(checkpoint_deferred_from);  // a deferred one that the end overtook
    Status s = write_checkpoint(last_loss, /*from_action=*/false, /*final=*/true);
    if (!s.ok()) return s;
  } else if (Status s = checkpoints.collect(/*wait=*/true); !s.ok()) {
    return s;
  }
  summary.checkpoint_dir = checkpoints.last_dir();

  std::vector<float> final_params(table.numel());
  backend->gather_params(final_params.data());
  summary.params_xxh64 = xxhash64(final_params.data(), final_params.size() * sizeof(float));
  summary.last_step = step;
  summary.last_loss = last_loss;
  summary.skipped_batches = skipped_batches;
  summary.sdc_checks = sdc.checks();
  summary.sdc_check_s = sdc.check_seconds();
  summary.sdc_hash_s = sdc.hash_seconds();
  enter(TrainPhase::kDone);
  return summary;
}

}  // namespace

const char* train_phase_name(TrainPhase p) {
  switch (p) {
    case TrainPhase::kSetup:
      return "setup";
    case TrainPhase::kData:
      return "data";
    case TrainPhase::kBoundary:
      return "step boundary";
    case TrainPhase::kStep:
      return "step";
    case TrainPhase::kValidation:
      return "validation";
    case TrainPhase::kCheckpoint:
      return "checkpoint";
    case TrainPhase::kDone:
      return "done";
  }
  return "?";
}

const char* train_action_name(TrainAction a) {
  switch (a) {
    case TrainAction::none:
      return "none";
    case TrainAction::checkpoint:
      return "checkpoint";
    case TrainAction::pause:
      return "pause";
    case TrainAction::resume:
      return "resume";
    case TrainAction::stop:
      return "stop";
  }
  return "?";
}

Status train_layout_check(const Config& c, int dp) {
  if (dp < 1) return Status::error("dp " + std::to_string(dp) + " must be at least 1");
  if (c.train.global_batch % dp != 0) {
    return Status::error("train.global_batch = " + std::to_string(c.train.global_batch) +
                         " cannot be split over " + std::to_string(dp) +
                         " data-parallel ranks: make it a multiple of " + std::to_string(dp) +
                         ", or choose a dp that divides " + std::to_string(c.train.global_batch));
  }
  const int share = c.train.global_batch / dp;
  const int B = std::min(c.train.micro_batch, share);
  if (share % B != 0) {
    return Status::error("train.global_batch = " + std::to_string(c.train.global_batch) + " over " +
                         std::to_string(dp) + " ranks gives " + std::to_string(share) +
                         " sequences per rank, which train.micro_batch = " + std::to_string(B) +
                         " does not divide: choose a micro-batch that divides " + std::to_string(share));
  }
  return Status();
}

Result<TrainSummary> train_run(const Config& c, const TrainOptions& opt, TrainObserver* observer) {
  try {
    return train_run_unguarded(c, opt, observer);
  } catch (const FatalError& e) {
    return Status::error(e.what());
  }
}

}  // namespace gantry
