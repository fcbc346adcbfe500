// gantry-engine worker: one rank of a gang. `gantry-engine run` starts it (GANTRY_STORE_FD and torchrun's
// variables set); it can also be started once per rank by torchrun or srun, given a rendezvous address
// (--rendezvous HOST:PORT, or MASTER_ADDR and MASTER_PORT), where rank 0 serves the store and prints the
// step lines. The logic is engine/core/worker/worker_runtime.h.
#include <CLI/CLI.hpp>
#include <algorithm>
#include <cstdio>
#include <filesystem>

#include "app/commands.h"
#include "app/step_lines.h"
#include "engine/core/config.h"     // kCollectiveTimeoutMinS/MaxS
#include "engine/core/sampler.h"    // SkippedBatches, sampler_skip_batch
#include "engine/core/sdc_check.h"  // SdcMismatch, for the line printed without a launcher
#include "engine/core/worker/worker_env.h"
#include "engine/core/worker/worker_runtime.h"

namespace gantry {
namespace {

struct WorkerArgs {
  std::string config;
  int tp = 1;
  int pp = 1;
  int vp = 0;  // 0 = the config's train.vp
  int zero = 0;
  std::string out;
  std::string resume;
  int64_t max_steps = -1;
  std::string rendezvous;
  bool json = false;
  double join_timeout_s = 60;
  double collective_timeout_s = 0;  // 0 = the config's train.collective_timeout_s
  std::string skip_batches;         // "FIRST:COUNT,..." (TrainOptions::skip_batches)
};

// "6:2,11:1" -> {{6, 2}, {11, 1}}; an error names the part that is not FIRST:COUNT.
Result<std::vector<SkippedBatches>> skip_batches_parse(const std::string& text) {
  std::vector<SkippedBatches> out;
  size_t at = 0;
  while (at < text.size()) {
    const size_t end = std::min(text.find(',', at), text.size());
    const std::string part = text.substr(at, end - at);
    unsigned long long first = 0, count = 0;
    int used = 0;
    if (std::sscanf(part.c_str(), "%llu:%llu%n", &first, &count, &used) != 2 ||
        used != static_cast<int>(part.size()) || count == 0 || part[0] == '-') {
      return Status::error("--skip-batches: '" + part +
                           "' is not FIRST:COUNT (a global batch index and a count >= 1, e.g. 6:2,11:1)");
    }
    for (unsigned long long k = 0; k < count; ++k) sampler_skip_batch(out, first + k);
    at = end + 1;
  }
  return out;
}

// Rank 0's lines when no launcher prints them (external launchers).
class Rank0Printer final : public TrainObserver {
 public:
  explicit Rank0Printer(bool json) : json_(json) {}
  void on_start(const std::string& summary) override { std::fprintf(stderr, "%s\n", summary.c_str()); }
  void on_step(const StepReport& r) override { step_line_print(step_line_of(r), json_); }
  void on_checkpoint(const CheckpointReport& c) override { checkpoint_line_print(c, json_); }
  void on_step_skipped(int64_t step, const std::string& reason) override {
    skipped_line_print(step, reason, json_);
  }
  void on_sdc_mismatch(const SdcMismatch& m) override {
    for (size_t k = 0; k < m.suspect_ranks.size(); ++k)
      sdc_mismatch_line_print(m.step, m.suspect_ranks[k], m.suspect_hosts[k], m.message, json_);
  }

 private:
  bool json_;
};

int worker_main(const WorkerArgs& a) {
  Result<std::vector<SkippedBatches>> skip = skip_batches_parse(a.skip_batches);
  if (!skip.ok()) {
    std::fprintf(stderr, "gantry-engine worker: %s\n", skip.error().c_str());
    return kExitBadInput;
  }
  Result<WorkerEnv> env = worker_env_read();
  if (!env.ok()) {
    std::fprintf(stderr, "gantry-engine worker: %s\n", env.error().c_str());
    return kExitBadInput;
  }
  const bool launched = env->store_fd >= 0 && a.rendezvous.empty();
  Rank0Printer printer(a.json);
  WorkerOptions o;
  o.config_path = a.config;
  o.out_dir = a.out.empty() ? "runs/" + std::filesystem::path(a.config).stem().string() : a.out;
  o.resume = a.resume;
  o.max_steps = a.max_steps;
  o.zero = a.zero;
  o.tp = a.tp;
  o.pp = a.pp;
  o.vp = a.vp;
  o.rendezvous = a.rendezvous;
  o.join_timeout = std::chrono::milliseconds(static_cast<int64_t>(a.join_timeout_s * 1e3));
  o.collective_timeout = std::chrono::milliseconds(static_cast<int64_t>(a.collective_timeout_s * 1e3));
  o.local = !launched && env->rank == 0 ? &printer : nullptr;
  o.skip_batches = skip.value();
  WorkerResult r = worker_run(o, env.value());
  // The launcher prints what it received; without one (or when it could not be told), say it here.
  if (!r.reported && (r.code != kWorkerExitOk || env->rank == 0)) {
    if (r.code == kWorkerExitOk) {
      std::fprintf(stderr, "%s\n", r.message.c_str());
    } else {
      std::fprintf(stderr, "gantry-engine worker: %s\n", r.message.c_str());
    }
  }
  return r.code;
}

}  // namespace

void worker_command_add(CLI::App& app, int* exit_code) {
  auto args = std::make_shared<WorkerArgs>();
  CLI::App* sub = app.add_subcommand("worker",
                                     "One rank of a gang: started by `gantry-engine run`, or per rank by "
                                     "torchrun/srun with --rendezvous HOST:PORT");
  sub->add_option("--config", args->config, "Training config (TOML); every rank must be given the same")
      ->required()
      ->check(CLI::ExistingFile);
  sub->add_option("--zero", args->zero, "ZeRO stage over the dp axis (0-3)")->check(CLI::Range(0, 3));
  sub->add_option("--tp", args->tp, "Tensor-parallel degree (CPU and CUDA backends); dp = world / (tp x pp)")
      ->check(CLI::Range(1, 4096));
  sub->add_option("--vp", args->vp,
                  "Virtual stages per pp rank (train.pp_schedule \"interleaved\"); default train.vp")
      ->check(CLI::Range(1, 4096));
  sub->add_option("--pp", args->pp, "Pipeline-parallel degree (CPU and CUDA backends; train.pp_schedule)")
      ->check(CLI::Range(1, 4096));
  sub->add_option("--out", args->out, "Run folder, shared by every rank (default runs/<config name>)");
  sub->add_option("--resume", args->resume,
                  "Resume from 'latest' (newest under OUT/checkpoints) or a checkpoint dir");
  sub->add_option("--max-steps", args->max_steps, "Stop after this optimizer step; -1 = train.max_steps")
      ->check(CLI::Range(int64_t{-1}, INT64_MAX));
  sub->add_option("--rendezvous", args->rendezvous,
                  "HOST:PORT where rank 0 serves the rendezvous store (external launchers; default "
                  "MASTER_ADDR:MASTER_PORT)");
  sub->add_option("--skip-batches", args->skip_batches,
                  "Global batches the data cursor passes over, FIRST:COUNT[,FIRST:COUNT...] (a coordinator's "
                  "rollback past a streak of skipped steps)");
  sub->add_flag("--json", args->json,
                "Rank 0 without a launcher: also print one JSON object per step on stdout");
  sub->add_option("--join-timeout", args->join_timeout_s,
                  "Seconds to reach the store and meet the other ranks")
      ->check(CLI::PositiveNumber);
  // --timeout: the flag's name before train.collective_timeout_s existed, kept for scripts that use it.
  sub->add_option("--collective-timeout,--timeout", args->collective_timeout_s,
                  "Seconds any collective or store wait may take before the gang fails (default: the "
                  "config's train.collective_timeout_s)")
      ->check(CLI::Range(kCollectiveTimeoutMinS, kCollectiveTimeoutMaxS));
  sub->callback([args, exit_code] { *exit_code = worker_main(*args); });
}

}  // namespace gantry
