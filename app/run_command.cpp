// gantry-engine run: the local launcher. Starts --nproc workers of this binary as one gang (data parallel
// over all of them), serves their rendezvous, prints rank 0's figures one line per step on stderr (and
// with --json one JSON object per step on stdout), and keeps every rank's step records in
// <out>/history.sqlite. The gang semantics (join timeout, a failed rank stops all, Ctrl-C) are in
// engine/core/worker/gang.h.
#include <CLI/CLI.hpp>
#include <algorithm>
#include <atomic>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <filesystem>
#include <nlohmann/json.hpp>  // step_skipped events' payload

#include "app/commands.h"
#include "app/step_lines.h"
#include "engine/core/checkpoint.h"
#include "engine/core/config.h"
#include "engine/core/parallel/parallel_dims.h"
#include "engine/core/parallel/pipeline_schedule.h"
#include "engine/core/parallel/tensor_parallel.h"
#include "engine/core/train.h"
#include "engine/core/worker/gang.h"
#include "engine/core/worker/worker_runtime.h"
#include "telemetry/clock.h"
#include "telemetry/record_json.h"  // --json-ranks
#ifdef GANTRY_HAVE_STORAGE
#include "app/history_writer.h"
#endif

namespace gantry {
namespace {

static_assert(kWorkerExitFailed == kExitFailed && kWorkerExitBadInput == kExitBadInput &&
                  kWorkerExitInterrupted == kExitInterrupted &&
                  kWorkerExitCheckpointDamaged == kExitCheckpointDamaged,
              "the worker's exit codes are passed on as gantry-engine's");

std::atomic<bool> g_stop{false};
std::atomic<bool> g_kill{false};
// The first Ctrl-C stops the gang at a step boundary with a checkpoint; a second one kills it now.
extern "C" void run_on_stop_signal(int) {
  if (g_stop.exchange(true)) g_kill.store(true);
}

struct RunArgs {
  int nproc = 1;
  std::string config;
  int zero = 0;
  int tp = 1;  // tensor-parallel degree; dp = nproc / (tp x pp)
  int pp = 1;  // pipeline-parallel degree (train.pp_schedule)
  int vp = 0;  // virtual stages per pp rank (train.pp_schedule "interleaved"); 0 = the config's train.vp
  std::string out;
  std::string resume;
  int64_t max_steps = -1;
  bool json = false;
  bool json_ranks =
      false;  // also every rank's step record (its phases): where a data-parallel step's time goes
  double join_timeout_s = 60;
  double stop_grace_s = 60;
  double collective_timeout_s = 0;  // 0 = the config's train.collective_timeout_s
  double hang_timeout_s = 10;       // 0 = off (gang.h's hang_timeout)
};

std::chrono::milliseconds ms_of(double seconds) {
  return std::chrono::milliseconds(static_cast<int64_t>(seconds * 1e3));
}

std::string seconds_arg(double s) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%g", s);
  return buf;
}

constexpr int kMaxNproc = 4096;  // --nproc's bound (and each of --tp, --pp, --vp's)

int run_main(const RunArgs& a) {
  namespace fs = std::filesystem;
  Result<Config> cfg = config_load(a.config);
  if (!cfg.ok()) {
    std::fprintf(stderr, "gantry-engine run: %s\n", cfg.error().c_str());
    return kExitBadInput;
  }
  if (a.vp > 0) cfg->train.vp = a.vp;
  if (a.tp * a.pp > kMaxNproc) {  // no worker count --nproc takes is a multiple of it
    std::fprintf(stderr,
                 "gantry-engine run: tp x pp = %d x %d = %d ranks is more than --nproc can be (at most %d): "
                 "lower --tp or --pp so that tp x pp <= %d\n",
                 a.tp, a.pp, a.tp * a.pp, kMaxNproc, kMaxNproc);
    return kExitBadInput;
  }
  if (a.nproc % (a.tp * a.pp) != 0) {  // else dp = nproc / (tp x pp) would round down and name a wrong layout
    std::fprintf(
        stderr,
        "gantry-engine run: --nproc %d is not a multiple of tp x pp = %d x %d = %d: the data-parallel "
        "degree nproc / (tp x pp) must be whole; choose --nproc as a multiple of %d\n",
        a.nproc, a.tp, a.pp, a.tp * a.pp, a.tp * a.pp);
    return kExitBadInput;
  }
  Result<ParallelDims> dims = ParallelDims::make(
      {.world = a.nproc, .rank = 0, .dp = a.nproc / (a.tp * a.pp), .tp = a.tp, .pp = a.pp, .zero = a.zero});
  Status layout = dims.ok() ? tensor_parallel_check(cfg->model, dims.value(), cfg->train.backend,
                                                    cfg->train.sequence_parallel)
                            : dims.status();
  if (layout.ok()) layout = train_layout_check(cfg.value(), dims->dp);
  if (layout.ok()) {
    // The pipeline's micro-batches are the gradient-accumulation ones (train.cpp).
    const int share = cfg->train.global_batch / dims->dp, B = std::min(cfg->train.micro_batch, share);
    layout = pipeline_check(cfg.value(), dims.value(), share / B, cfg->train.vp);
  }
  if (!layout.ok()) {
    std::fprintf(stderr, "gantry-engine run: --nproc %d --tp %d --pp %d --vp %d --zero %d: %s\n", a.nproc,
                 a.tp, a.pp, cfg->train.vp, a.zero, layout.message().c_str());
    return kExitBadInput;
  }
  // Workers get absolute paths: they agree on them whatever their working directory.
  const fs::path out = fs::absolute(a.out.empty() ? "runs/" + fs::path(a.config).stem().string() : a.out);
  std::error_code ec;
  fs::create_directories(out, ec);
  if (ec) {
    std::fprintf(stderr, "gantry-engine run: cannot create the run folder %s: %s\n", out.c_str(),
                 ec.message().c_str());
    return kExitBadInput;
  }

  GangOptions g;
  g.nproc = a.nproc;
  g.args = {"worker",
            "--config",
            fs::absolute(a.config).string(),
            "--out",
            out.string(),
            "--zero",
            std::to_string(a.zero),
            "--tp",
            std::to_string(a.tp),
            "--pp",
            std::to_string(a.pp),
            "--vp",
            std::to_string(cfg->train.vp),
            "--max-steps",
            std::to_string(a.max_steps),
            "--join-timeout",
            seconds_arg(a.join_timeout_s)};
  if (a.collective_timeout_s > 0) {
    g.args.push_back("--collective-timeout");
    g.args.push_back(seconds_arg(a.collective_timeout_s));
  }
  // The checkpoint every rank resumes from, resolved once here: the ranks agree on it, `latest` says what
  // it passed over, and a refused checkpoint is named with the one before it.
  std::string resume;
  if (a.resume == "latest") {
    Result<CheckpointLatest> latest = checkpoint_latest_explained((out / "checkpoints").string());
    if (!latest.ok()) {
      std::fprintf(stderr, "gantry-engine run: --resume latest: %s\n", latest.error().c_str());
      return kExitBadInput;
    }
    const std::string note = checkpoint_latest_note(latest.value());
    if (!note.empty()) std::fprintf(stderr, "%s\n", note.c_str());
    resume = latest->dir;
  } else if (!a.resume.empty()) {
    resume = fs::absolute(a.resume).string();
  }
  if (!resume.empty()) {
    g.args.push_back("--resume");
    g.args.push_back(resume);
  }
  if (cfg->train.backend == "cuda") {
    // One device per worker, counted without initialising CUDA here (it would not survive the fork).
    g.cuda_devices = gang_cuda_devices();
    if (static_cast<int>(g.cuda_devices.size()) < a.nproc) {
      std::fprintf(
          stderr,
          "gantry-engine run: --nproc %d with train.backend = \"cuda\" needs a GPU per worker, but %zu %s "
          "visible (CUDA_VISIBLE_DEVICES or /proc/driver/nvidia/gpus): lower --nproc\n",
          a.nproc, g.cuda_devices.size(), g.cuda_devices.size() == 1 ? "is" : "are");
      return kExitBadInput;
    }
    g.cuda_devices.resize(static_cast<size_t>(a.nproc));
  }
  g.join_timeout = ms_of(a.join_timeout_s);
  g.hang_timeout = ms_of(a.hang_timeout_s);
  g.stop_grace = ms_of(a.stop_grace_s);
  g.stop = &g_stop;
  g.kill_now = &g_kill;
  std::signal(SIGINT, run_on_stop_signal);
  std::signal(SIGTERM, run_on_stop_signal);

#ifdef GANTRY_HAVE_STORAGE
  HistoryWriter history(out.string(), out.filename().string(), a.nproc,
                        "dp=" + std::to_string(dims->dp) + " tp=" + std::to_string(a.tp) +
                            " pp=" + std::to_string(a.pp) + " zero=" + std::to_string(a.zero));
#endif
  const int64_t last_step = a.max_steps >= 0 ? a.max_steps : cfg->train.max_steps;
  g.on_spawn = [](int rank, int64_t pid) {
    std::fprintf(stderr, "rank %d pid %lld\n", rank, static_cast<long long>(pid));
  };
  g.on_run = [&](int, const WorkerRun& run) {
    std::fprintf(stderr, "%s\n", run.summary.c_str());
#ifdef GANTRY_HAVE_STORAGE
    history.on_run({.config_toml = run.config_toml,
                    .code_version = run.code_version,
                    .data_version = run.data_version,
                    .backend = run.backend,
                    .params = run.params,
                    .peak_name = run.peak_name,
                    .peak_flops = run.peak_flops,
                    .flops_per_token = run.flops_per_token,
                    .mfu_formula = run.mfu_formula});
#endif
  };
  g.on_records = [&](int, const RecordBatch& batch) {
    if (a.json_ranks) {
      // The telemetry codec's own form ({"rank_step": {...}}), so a reader parses it as the history does.
      for (const RankStepRecord& r : batch.rank_steps) {
        std::printf("%s\n", nlohmann::json{{"rank_step", r}}.dump().c_str());
      }
      std::fflush(stdout);
    }
    for (const StepRecord& s : batch.steps) {
      step_line_print({.step = s.step,
                       .last_step = last_step,
                       .loss = s.loss,
                       .grad_norm = s.grad_norm,
                       .lr = s.lr,
                       .tokens_per_s = s.tokens_per_s,
                       .step_s = s.step_s,
                       .val_loss = s.val_loss,
                       .mfu = s.mfu},
                      a.json);
    }
    for (const EventRecord& e : batch.events) {
      if (e.kind == "step_skipped" && e.rank <= 0) {
        // Every rank skips together (the gang's reduced loss and norm decide): rank 0's event speaks for all.
        nlohmann::json p = nlohmann::json::parse(e.payload, nullptr, /*allow_exceptions=*/false);
        skipped_line_print(e.step, p.is_object() ? p.value("reason", "") : e.message, a.json);
      }
      if (e.kind == "sdc_mismatch") {
        // Each rank the check names reports itself: one line per suspect.
        sdc_mismatch_line_print(e.step, e.rank, e.node, e.message, a.json);
      }
    }
    for (const CheckpointRecord& c : batch.checkpoints) {
      if (c.state == CheckpointState::kCommitted && c.rank == kCheckpointAllRanks) {
        checkpoint_line_print({.step = c.step,
                               .dir = c.dir,
                               .bytes = c.bytes,
                               .seconds = c.write_s,
                               .async = c.async,
                               .stall_s = c.stall_s,
                               .write_s = c.write_s,
                               .waited_s = c.waited_s},
                              a.json);
      } else if (c.state == CheckpointState::kFailed) {
        std::fprintf(stderr, "checkpoint step %lld failed on rank %d: %s\n", static_cast<long long>(c.step),
                     c.rank, c.message.c_str());
      }
    }
#ifdef GANTRY_HAVE_STORAGE
    history.ingest(batch);
#endif
  };

  GangResult r = gang_run(g);

#ifdef GANTRY_HAVE_STORAGE
  if (r.failed_rank >= 0) {
    RecordBatch failed;
    const double now = unix_now_s();
    failed.events.push_back({.time_unix_s = now,
                             .kind = "rank_failed",
                             .rank = r.failed_rank,
                             .node = r.workers[static_cast<size_t>(r.failed_rank)].host,
                             .message = r.error});
    history.ingest(failed);
  }
  const bool stopped = r.interrupted || r.stopped;  // by Ctrl-C, or an operator's stop action
  history.finish(r.code == 0 || stopped, stopped, r.code == 0 ? "" : r.error);
#endif
  if (r.interrupted || r.stopped) {
    // Rank 0's goodbye says where it stopped and which checkpoint holds it.
    std::fprintf(stderr, "gantry-engine run: %s\n",
                 r.final_message.empty() ? "stopped by a signal" : r.final_message.c_str());
    for (const GangWorker& w : r.workers) {
      if (w.killed_by_launcher) {
        std::fprintf(stderr,
                     "  rank %d (pid %lld) did not stop within %g s and was killed: its last checkpoint may "
                     "be older\n",
                     w.rank, static_cast<long long>(w.pid), a.stop_grace_s);
      }
    }
    return kExitInterrupted;
  }
  if (r.code != 0) {
    std::fprintf(stderr, "gantry-engine run: %s\n", r.error.c_str());
    // The rest of the gang, for the operator who wants to know how each rank ended.
    for (const GangWorker& w : r.workers) {
      if (w.rank == r.failed_rank || w.pid < 0) continue;
      std::string how = w.exited ? "exited with code " + std::to_string(w.code)
                                 : "ended by " + signal_name(w.signal) +
                                       (w.killed_by_launcher ? " (after the grace period)" : "");
      if (w.said_goodbye && !w.goodbye.message.empty()) how += ": " + w.goodbye.message;
      std::fprintf(stderr, "  rank %d (pid %lld) %s\n", w.rank, static_cast<long long>(w.pid), how.c_str());
    }
    // A checkpoint the workers refused (exit code 2 before any step) is named by them; point at the one
    // before it, as `train` does, last, where the operator looks.
    const std::string hint = (r.code == kExitBadInput || r.code == kExitCheckpointDamaged) && !resume.empty()
                                 ? checkpoint_earlier_hint(resume)
                                 : "";
    if (!hint.empty()) std::fprintf(stderr, "%s\n", hint.c_str() + 1);  // without its leading newline
    return r.code;
  }
  std::fprintf(stderr, "%s\n", r.final_message.empty() ? "done" : r.final_message.c_str());
  return 0;
}

}  // namespace

void run_command_add(CLI::App& app, int* exit_code) {
  auto args = std::make_shared<RunArgs>();
  CLI::App* sub = app.add_subcommand(
      "run",
      "Train with N worker processes on this machine (data parallel; one GPU each with the cuda backend)");
  sub->add_option("--nproc", args->nproc, "Worker processes (the dp degree)")
      ->required()
      ->check(CLI::Range(1, kMaxNproc));
  sub->add_option("--config", args->config, "Training config (TOML), e.g. assets/configs/tiny.toml")
      ->required()
      ->check(CLI::ExistingFile);
  sub->add_option("--zero", args->zero,
                  "ZeRO stage over the dp axis: 0 none, 1 optimizer state, 2 + gradients, 3 + "
                  "parameters")
      ->check(CLI::Range(0, 3));
  sub->add_option(
         "--tp", args->tp,
         "Tensor-parallel degree (CPU and CUDA backends): dp = nproc / (tp x pp); tp must divide the heads")
      ->check(CLI::Range(1, kMaxNproc));
  sub->add_option(
         "--pp", args->pp,
         "Pipeline-parallel degree (CPU and CUDA backends): dp = nproc / (tp x pp); train.pp_schedule "
         "picks GPipe, 1F1B, interleaved (with --vp) or ZB-H1, train.micro_batch the micro-batch count")
      ->check(CLI::Range(1, kMaxNproc));
  sub->add_option("--vp", args->vp,
                  "Virtual pipeline stages per rank (train.pp_schedule \"interleaved\"); default train.vp")
      ->check(CLI::Range(1, kMaxNproc));
  sub->add_option("--out", args->out,
                  "Run folder for checkpoints, data and history.sqlite (default runs/<config name>)");
  sub->add_option("--resume", args->resume,
                  "Resume from 'latest' (newest under OUT/checkpoints) or a checkpoint dir");
  sub->add_option("--max-steps", args->max_steps,
                  "Stop after this optimizer step (the LR schedule still spans train.max_steps)")
      ->check(CLI::NonNegativeNumber);
  sub->add_flag("--json", args->json, "Also print one JSON object per step on stdout");
  sub->add_flag(
      "--json-ranks", args->json_ranks,
      "Also print each rank's step record (phase times, memory) as {\"rank_step\": {...}} on stdout");
  sub->add_option(
         "--join-timeout", args->join_timeout_s,
         "Seconds every worker has to start and join; a rank that has not joined by then fails the gang")
      ->check(CLI::PositiveNumber);
  sub->add_option("--collective-timeout", args->collective_timeout_s,
                  "Seconds any collective or store wait may take before the gang fails, naming the rank that "
                  "stopped answering (default: the config's train.collective_timeout_s, 120 s if unset)")
      ->check(CLI::Range(kCollectiveTimeoutMinS, kCollectiveTimeoutMaxS));
  sub->add_option("--hang-timeout", args->hang_timeout_s,
                  "Seconds a running worker may send no heartbeat (its own thread beats through compute, "
                  "checkpoints and collectives) before the gang fails naming it as hung; 0 = off")
      ->check(CLI::Range(0.0, 3600.0));
  sub->add_option(
         "--stop-grace", args->stop_grace_s,
         "After Ctrl-C or SIGTERM, seconds the workers have to checkpoint and exit before they are killed "
         "(a second Ctrl-C kills them at once)")
      ->check(CLI::PositiveNumber);
  sub->callback([args, exit_code] { *exit_code = run_main(*args); });
}

}  // namespace gantry
