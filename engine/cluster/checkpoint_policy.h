// The coordinator's checkpoint policy for one run, set at submit (`checkpoint_every_steps`, `keep_last`):
// when the run reports a step that is a multiple of every_steps the coordinator asks for a checkpoint (the
// operator's checkpoint action, from "policy"), and after a newer checkpoint commits it deletes the run's
// committed checkpoints older than the newest keep_last, inside the run's own checkpoints folder only.
//
//   CheckpointPolicy p({.every_steps = 50, .keep_last = 3});
//   if (p.due(step)) queue_checkpoint_action("policy");
//   on a committed checkpoint: Result<std::vector<std::string>> gone = checkpoint_prune(run_dir +
//   "/checkpoints", 3);
//
// The action takes effect at the first step boundary rank 0 reaches after it arrives (a heartbeat and a
// step later), so the checkpoint lands at the trigger step or a little after: the policy bounds the work
// lost to a failure by about every_steps steps, it does not pick exact steps (train.checkpoint_every in
// the config does, inside the trainer).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "telemetry/status.h"

namespace gantry {

// fixed: every_steps as submitted. young_daly: every_steps as submitted until the run has failed, then the
// Young/Daly interval (goodput.h) from its measured checkpoint stall and failure rate, set by the
// coordinator through set_every_steps.
enum class CheckpointPolicyMode : uint8_t { kFixed, kYoungDaly };
std::string_view checkpoint_policy_mode_name(CheckpointPolicyMode m);  // "fixed", "young_daly"
std::optional<CheckpointPolicyMode> checkpoint_policy_mode_from_name(std::string_view name);

struct CheckpointPolicyOptions {
  int64_t every_steps = 0;  // 0 = no periodic checkpoints
  int keep_last = 0;        // 0 = keep every checkpoint
  CheckpointPolicyMode mode = CheckpointPolicyMode::kFixed;
};

class CheckpointPolicy {
 public:
  explicit CheckpointPolicy(CheckpointPolicyOptions options = {}) : o_(options), next_(options.every_steps) {}

  const CheckpointPolicyOptions& options() const { return o_; }

  // True once per multiple of every_steps, on the first step reported at or past it.
  bool due(int64_t step);
  // The run goes on from a checkpoint at `step` (a move, a resume): the next one is due every_steps on.
  void restart_at(int64_t step);
  // A new interval (young_daly) from the run's newest step on: the next checkpoint is due `every` steps after
  // the last one that was due, or at once when that is already past.
  void set_every_steps(int64_t every);

 private:
  CheckpointPolicyOptions o_;
  int64_t next_ = 0;
};

// Deletes the committed step_* directories under `root` except the newest `keep` (keep >= 1), and
// returns the deleted paths. Only real directories directly under `root` are touched (a symbolic link
// named step_* is left alone); an error names the directory that could not be removed.
Result<std::vector<std::string>> checkpoint_prune(const std::string& root, int keep);

}  // namespace gantry
