// What a step looks like to a user, shared by the commands that print steps (train, run, worker): one human
// line on stderr, and with --json one JSON object on stdout with the same keys as `train --json`.
//
//   StepLine s{.step = 5, .last_step = 100, .loss = 3.2, ...};
//   step_line_print(s, json);
#pragma once

#include <cstdint>
#include <cstdio>
#include <nlohmann/json.hpp>  // the --json lines
#include <optional>
#include <string>

#include "engine/core/train.h"              // CheckpointReport, StepReport
#include "engine/core/train_checkpoints.h"  // checkpoint_cost_text

namespace gantry {

struct StepLine {
  int64_t step = 0;
  int64_t last_step = 0;
  double loss = 0;
  double grad_norm = 0;
  double lr = 0;
  double tokens_per_s = 0;
  double step_s = 0;  // seconds; the human line shows milliseconds
  std::optional<double> val_loss;
  std::optional<double> mfu;  // 0..1; absent when the device's peak is unknown: printed "n/a", JSON null
};

// A step as the training loop reports it to its observer (train, and a worker's rank 0 without a launcher).
inline StepLine step_line_of(const StepReport& r) {
  return {.step = r.step,
          .last_step = r.last_step,
          .loss = r.loss,
          .grad_norm = r.grad_norm,
          .lr = r.lr,
          .tokens_per_s = r.tokens_per_s,
          .step_s = r.step_s,
          .val_loss = r.val_loss,
          .mfu = r.mfu};
}

inline void step_line_print(const StepLine& r, bool json) {
  std::fprintf(stderr, "step %6lld/%lld | loss %.6f | grad norm %.4f | lr %.3e | %9.0f tok/s | %8.1f ms",
               static_cast<long long>(r.step), static_cast<long long>(r.last_step), r.loss, r.grad_norm, r.lr,
               r.tokens_per_s, r.step_s * 1e3);
  // Never 0 for unknown: a CPU without train.peak_tflops has no peak to divide by.
  if (r.mfu) {
    std::fprintf(stderr, " | mfu %.1f%%", 100 * *r.mfu);
  } else {
    std::fprintf(stderr, " | mfu n/a");
  }
  if (r.val_loss) std::fprintf(stderr, " | val loss %.6f", *r.val_loss);
  std::fprintf(stderr, "\n");
  if (json) {
    nlohmann::json j = {{"step", r.step},
                        {"loss", r.loss},
                        {"grad_norm", r.grad_norm},
                        {"lr", r.lr},
                        {"tokens_per_s", r.tokens_per_s},
                        {"step_s", r.step_s},
                        {"mfu", r.mfu ? nlohmann::json(*r.mfu) : nlohmann::json(nullptr)}};
    if (r.val_loss) j["val_loss"] = *r.val_loss;
    std::printf("%s\n", j.dump().c_str());
    std::fflush(stdout);
  }
}

// A committed checkpoint and what it cost training (stall, write, wait: train.h CheckpointReport).
inline void checkpoint_line_print(const CheckpointReport& c, bool json) {
  std::fprintf(stderr, "checkpoint step %lld -> %s (%.1f MB; %s)\n", static_cast<long long>(c.step),
               c.dir.c_str(), static_cast<double>(c.bytes) / 1e6, checkpoint_cost_text(c).c_str());
  if (json) {
    nlohmann::json j = {{"event", "checkpoint"}, {"step", c.step},        {"dir", c.dir},
                        {"bytes", c.bytes},      {"async", c.async},      {"stall_s", c.stall_s},
                        {"write_s", c.write_s},  {"waited_s", c.waited_s}};
    j["copy_s"] = c.copy_s ? nlohmann::json(*c.copy_s) : nlohmann::json(nullptr);
    if (c.deferred_from >= 0) j["deferred_from"] = c.deferred_from;
    std::printf("%s\n", j.dump().c_str());
    std::fflush(stdout);
  }
}

// The step guard skipped a step's update (engine/core/step_guard.h); printed before that step's line.
inline void skipped_line_print(int64_t step, const std::string& reason, bool json) {
  std::fprintf(stderr, "step %6lld skipped: %s (no update; the batch is consumed)\n",
               static_cast<long long>(step), reason.c_str());
  if (json) {
    nlohmann::json j = {{"event", "step_skipped"}, {"step", step}, {"reason", reason}};
    std::printf("%s\n", j.dump().c_str());
    std::fflush(stdout);
  }
}

// The step guard rolled back after a streak of skipped steps (engine/core/step_guard.h).
inline void rollback_line_print(const GuardRollback& r, bool json) {
  std::fprintf(stderr, "guard rollback: %s\n", guard_rollback_message(r).c_str());
  if (json) {
    nlohmann::json j = nlohmann::json::parse(guard_rollback_payload(r));
    j["event"] = "guard_rollback";
    std::printf("%s\n", j.dump().c_str());
    std::fflush(stdout);
  }
}

// The silent-data-corruption check named a rank (engine/core/sdc_check.h): one line per named rank; the run
// stops after it.
inline void sdc_mismatch_line_print(int64_t step, int rank, const std::string& node,
                                    const std::string& message, bool json) {
  std::fprintf(stderr, "sdc mismatch at step %lld, rank %d (host %s): %s\n", static_cast<long long>(step),
               rank, node.empty() ? "unknown" : node.c_str(), message.c_str());
  if (json) {
    nlohmann::json j = {
        {"event", "sdc_mismatch"}, {"step", step}, {"rank", rank}, {"node", node}, {"message", message}};
    std::printf("%s\n", j.dump().c_str());
    std::fflush(stdout);
  }
}

}  // namespace gantry
