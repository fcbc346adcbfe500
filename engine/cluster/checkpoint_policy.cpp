#include "engine/cluster/checkpoint_policy.h"

#include <filesystem>

#include "engine/core/checkpoint.h"  // checkpoint_list: the committed checkpoints, oldest first

namespace gantry {

namespace fs = std::filesystem;

bool CheckpointPolicy::due(int64_t step) {
  if (o_.every_steps <= 0 || step < next_) return false;
  // The next multiple past this step: several steps in one beat make one checkpoint, not a queue of them.
  next_ = (step / o_.every_steps + 1) * o_.every_steps;
  return true;
}

void CheckpointPolicy::restart_at(int64_t step) {
  if (o_.every_steps > 0) next_ = (step / o_.every_steps + 1) * o_.every_steps;
}

void CheckpointPolicy::set_every_steps(int64_t every) {
  if (every <= 0 || every == o_.every_steps) return;
  const int64_t last_due = o_.every_steps > 0 ? next_ - o_.every_steps : 0;
  o_.every_steps = every;
  next_ = last_due + every;
}

std::string_view checkpoint_policy_mode_name(CheckpointPolicyMode m) {
  return m == CheckpointPolicyMode::kYoungDaly ? "young_daly" : "fixed";
}

std::optional<CheckpointPolicyMode> checkpoint_policy_mode_from_name(std::string_view name) {
  if (name == "fixed") return CheckpointPolicyMode::kFixed;
  if (name == "young_daly") return CheckpointPolicyMode::kYoungDaly;
  return std::nullopt;
}

Result<std::vector<std::string>> checkpoint_prune(const std::string& root, int keep) {
  std::vector<std::string> gone;
  if (keep < 1) return gone;
  std::error_code ec;
  const fs::path base = fs::weakly_canonical(root, ec);
  if (ec) return Status::error("cannot resolve the checkpoints folder " + root + ": " + ec.message());
  const std::vector<std::string> all = checkpoint_list(root);
  if (all.size() <= static_cast<size_t>(keep)) return gone;
  for (size_t k = 0; k + static_cast<size_t>(keep) < all.size(); ++k) {
    const fs::path dir(all[k]);
    // Never follow a link out of the run's folder, and never delete anything but a step_* directory in it.
    const fs::file_status st = fs::symlink_status(dir, ec);
    if (ec || !fs::is_directory(st) || fs::weakly_canonical(dir.parent_path(), ec) != base ||
        dir.filename().string().rfind("step_", 0) != 0) {
      continue;
    }
    fs::remove_all(dir, ec);
    if (ec) return Status::error("cannot delete the old checkpoint " + dir.string() + ": " + ec.message());
    gone.push_back(dir.string());
  }
  return gone;
}

}  // namespace gantry
