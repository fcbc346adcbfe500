// gantry-engine train: one process trains a config, printing one human line per step on stderr and,
// with --json, one JSON object per step on stdout.
#include <CLI/CLI.hpp>
#include <atomic>
#include <csignal>
#include <cstdio>
#include <filesystem>
#include <nlohmann/json.hpp>  // --json lines

#include "app/commands.h"
#include "app/step_lines.h"
#include "engine/core/checkpoint.h"
#include "engine/core/config.h"
#include "engine/core/train.h"
#ifdef GANTRY_HAVE_STORAGE
#include "app/history_writer.h"
#endif

namespace gantry {
namespace {

std::atomic<bool> g_stop{false};
extern "C" void on_stop_signal(int) {
  g_stop.store(true);
}

class StepPrinter final : public TrainObserver {
 public:
  explicit StepPrinter(bool json) : json_(json) {}
  void on_start(const std::string& summary) override { std::fprintf(stderr, "%s\n", summary.c_str()); }
  void on_step(const StepReport& r) override { step_line_print(step_line_of(r), json_); }
  void on_step_skipped(int64_t step, const std::string& reason) override {
    skipped_line_print(step, reason, json_);
  }
  void on_guard_rollback(const GuardRollback& r) override { rollback_line_print(r, json_); }
  void on_checkpoint(const CheckpointReport& c) override { checkpoint_line_print(c, json_); }

 private:
  bool json_;
};

// Hands every report to each of several observers, in order.
class Fanout final : public TrainObserver {
 public:
  explicit Fanout(std::vector<TrainObserver*> to) : to_(std::move(to)) {}
  void on_start(const std::string& s) override {
    for (TrainObserver* o : to_) o->on_start(s);
  }
  void on_run(const RunDescription& r) override {
    for (TrainObserver* o : to_) o->on_run(r);
  }
  void on_step(const StepReport& r) override {
    for (TrainObserver* o : to_) o->on_step(r);
  }
  void on_checkpoint(const CheckpointReport& c) override {
    for (TrainObserver* o : to_) o->on_checkpoint(c);
  }
  void on_checkpoint_failed(const CheckpointReport& c, const std::string& error) override {
    for (TrainObserver* o : to_) o->on_checkpoint_failed(c, error);
  }
  void on_step_skipped(int64_t step, const std::string& reason) override {
    for (TrainObserver* o : to_) o->on_step_skipped(step, reason);
  }
  void on_guard_rollback(const GuardRollback& r) override {
    for (TrainObserver* o : to_) o->on_guard_rollback(r);
  }

 private:
  std::vector<TrainObserver*> to_;
};

struct TrainArgs {
  std::string config;
  std::string resume;
  int64_t max_steps = -1;
  std::string out;
  bool json = false;
};

int train_main(const TrainArgs& a) {
  Result<Config> cfg = config_load(a.config);
  if (!cfg.ok()) {
    std::fprintf(stderr, "gantry-engine train: %s\n", cfg.error().c_str());
    return kExitBadInput;
  }
  TrainOptions opt;
  opt.out_dir = a.out.empty() ? "runs/" + std::filesystem::path(a.config).stem().string() : a.out;
  opt.resume = a.resume;
  if (a.resume == "latest") {
    // Resolved here, so that what `latest` passed over on the way is said, and a failure names the directory.
    Result<CheckpointLatest> latest =
        checkpoint_latest_explained((std::filesystem::path(opt.out_dir) / "checkpoints").string());
    if (!latest.ok()) {
      std::fprintf(stderr, "gantry-engine train: --resume latest: %s\n", latest.error().c_str());
      return kExitBadInput;
    }
    const std::string note = checkpoint_latest_note(latest.value());
    if (!note.empty()) std::fprintf(stderr, "%s\n", note.c_str());
    opt.resume = latest->dir;
  }
  opt.max_steps = a.max_steps;
  opt.stop = &g_stop;
  TrainProgress progress;  // after a failure: whether it was the data (bad input)
  opt.progress = &progress;
  bool resume_damaged = false;
  opt.resume_damaged = &resume_damaged;
  std::signal(SIGINT, on_stop_signal);
  std::signal(SIGTERM, on_stop_signal);

  StepPrinter printer(a.json);
  std::vector<TrainObserver*> observers = {&printer};
#ifdef GANTRY_HAVE_STORAGE
  // The run's history: <out>/history.sqlite, one run row per invocation.
  std::filesystem::create_directories(opt.out_dir);
  HistoryWriter history(opt.out_dir, std::filesystem::path(opt.out_dir).filename().string());
  observers.push_back(&history);
#endif
  Fanout fanout(observers);
  Result<TrainSummary> s = train_run(cfg.value(), opt, &fanout);
#ifdef GANTRY_HAVE_STORAGE
  history.finish(s.ok(), s.ok() && s->stopped_early, s.ok() ? "" : s.error());
#endif
  if (!s.ok()) {
    // A failed resume names its checkpoint; point at the one before it, which is still there.
    const std::string hint = opt.resume.empty() ? "" : checkpoint_earlier_hint(opt.resume);
    std::fprintf(stderr, "gantry-engine train: %s%s\n", s.error().c_str(), hint.c_str());
    const bool bad_data = progress.phase.load() == TrainPhase::kData;
    if (resume_damaged) return kExitCheckpointDamaged;  // an older checkpoint may load
    return a.resume.empty() && !bad_data ? kExitFailed : kExitBadInput;
  }
  std::fprintf(stderr, "done: step %lld, loss %.6f%s, checkpoint %s\n", static_cast<long long>(s->last_step),
               s->last_loss,
               s->last_val_loss ? (", val loss " + std::to_string(*s->last_val_loss)).c_str() : "",
               s->checkpoint_dir.c_str());
  return s->stopped_early ? kExitInterrupted : 0;
}

}  // namespace

void train_command_add(CLI::App& app, int* exit_code) {
  auto args = std::make_shared<TrainArgs>();
  CLI::App* sub = app.add_subcommand("train", "Train a model in this process (the CPU reference backend)");
  sub->add_option("--config", args->config, "Training config (TOML), e.g. assets/configs/tiny.toml")
      ->required()
      ->check(CLI::ExistingFile);
  sub->add_option("--resume", args->resume,
                  "Resume from 'latest' (newest under OUT/checkpoints) or a checkpoint dir");
  sub->add_option("--max-steps", args->max_steps,
                  "Stop after this optimizer step (the LR schedule still spans train.max_steps)")
      ->check(CLI::NonNegativeNumber);
  sub->add_option("--out", args->out, "Run folder for checkpoints and data (default runs/<config name>)");
  sub->add_flag("--json", args->json, "Also print one JSON object per step on stdout");
  sub->callback([args, exit_code] { *exit_code = train_main(*args); });
}

}  // namespace gantry
