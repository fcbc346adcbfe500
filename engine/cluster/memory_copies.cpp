#include "engine/cluster/memory_copies.h"

#include <algorithm>
#include <set>

namespace gantry {

void MemoryCopyTable::report(const std::string& node, std::vector<MemoryCopyHeld> held) {
  if (held.empty()) {
    by_node_.erase(node);
    return;
  }
  by_node_[node] = std::move(held);
}

void MemoryCopyTable::forget_node(const std::string& node) {
  by_node_.erase(node);
}

std::vector<MemoryCopySet> MemoryCopyTable::all(int64_t run) const {
  // step -> (world, rank -> nodes); by_node_ is in name order, so each holder list is too.
  std::map<int64_t, MemoryCopySet, std::greater<>> sets;
  for (const auto& [node, held] : by_node_) {
    for (const MemoryCopyHeld& h : held) {
      if (h.run != run) continue;
      MemoryCopySet& s = sets[h.step];
      s.step = h.step;
      s.world = std::max(s.world, h.world);
      std::vector<std::string>& nodes = s.holders[h.rank];
      if (std::find(nodes.begin(), nodes.end(), node) == nodes.end()) nodes.push_back(node);
    }
  }
  std::vector<MemoryCopySet> out;
  for (auto& [step, s] : sets) out.push_back(std::move(s));
  return out;
}

std::optional<MemoryCopySet> MemoryCopyTable::newest_complete(int64_t run, int64_t max_step) const {
  for (MemoryCopySet& s : all(run)) {
    if (s.step > max_step || s.world <= 0) continue;
    bool complete = true;
    for (int r = 0; r < s.world && complete; ++r) complete = s.holders.count(r) > 0;
    if (complete) return std::move(s);
  }
  return std::nullopt;
}

std::vector<MemoryCopyPull> MemoryCopyTable::pulls(int64_t run, const std::vector<std::string>& ring,
                                                   const std::map<int, std::string>& rank_node) const {
  std::vector<MemoryCopyPull> out;
  if (ring.size() < 2) return out;
  auto holds = [&](const std::string& node, int rank, int64_t step) {
    auto it = by_node_.find(node);
    if (it == by_node_.end()) return false;
    return std::any_of(it->second.begin(), it->second.end(), [&](const MemoryCopyHeld& h) {
      return h.run == run && h.rank == rank && h.step == step;
    });
  };
  for (const auto& [rank, node] : rank_node) {
    auto at = std::find(ring.begin(), ring.end(), node);
    auto own = by_node_.find(node);
    if (at == ring.end() || own == by_node_.end()) continue;
    const std::string& next = ring[static_cast<size_t>(at - ring.begin() + 1) % ring.size()];
    int64_t newest = -1;
    for (const MemoryCopyHeld& h : own->second)
      if (h.run == run && h.rank == rank) newest = std::max(newest, h.step);
    if (newest >= 0 && !holds(next, rank, newest))
      out.push_back({.to = next, .from = node, .run = run, .rank = rank, .step = newest});
  }
  return out;
}

std::vector<int64_t> MemoryCopyTable::runs_on(const std::string& node) const {
  std::set<int64_t> runs;
  if (auto it = by_node_.find(node); it != by_node_.end())
    for (const MemoryCopyHeld& h : it->second) runs.insert(h.run);
  return {runs.begin(), runs.end()};
}

const char* restore_source_name(RestoreSource s) {
  switch (s) {
    case RestoreSource::kMemory:
      return "memory";
    case RestoreSource::kDisk:
      return "disk";
    case RestoreSource::kStart:
      return "start";
  }
  return "start";
}

RestoreChoice restore_choose(const std::optional<MemoryCopySet>& memory, int64_t disk_step,
                             int64_t newest_seen) {
  if (memory && memory->step > disk_step) {
    return {.source = RestoreSource::kMemory,
            .step = memory->step,
            .why = "the in-memory copies at step " + std::to_string(memory->step) +
                   " are complete and newer than " +
                   (disk_step >= 0 ? "the newest disk checkpoint (step " + std::to_string(disk_step) + ")"
                                   : std::string("any disk checkpoint (none yet)"))};
  }
  std::string why;
  if (newest_seen > std::max<int64_t>(disk_step, memory ? memory->step : -1)) {
    why = "the in-memory copies at step " + std::to_string(newest_seen) +
          " are incomplete (a rank's every copy was lost with its node)";
  } else if (memory) {
    why = "the newest complete in-memory copies (step " + std::to_string(memory->step) +
          ") are no newer than the disk checkpoint";
  } else {
    why = "no complete in-memory copies";
  }
  if (disk_step >= 0) return {.source = RestoreSource::kDisk, .step = disk_step, .why = why};
  return {.source = RestoreSource::kStart, .step = 0, .why = why};
}

}  // namespace gantry
