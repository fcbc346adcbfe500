// The Checkpoints panel's line about the followed run's in-memory copies (train.memory_copy_every,
// engine/cluster/memory_copies.h): the newest complete set the coordinator knows of (the run's
// "memory_copies", newest first), which node holds each rank's shard (its own node, from the run's
// placement) and which peers hold a copy of it; "—" when there is none. Apart from ImGui, so it is tested
// without a display.
//
//   const MemoryCopyView v = memory_copy_view(run.memory_copies, run.placement);
//   ImGui::TextUnformatted(memory_copy_text(v).c_str());   // "step 20: rank 0 node-0 + peer node-1, ..."
#pragma once

#include <algorithm>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "ui/console/console_state.h"  // ShareView

namespace gantry::console {

struct MemoryShardView {
  int rank = 0;
  std::string node;                // the rank's own node holding its copy; "" = not among the holders
  std::vector<std::string> peers;  // the other nodes holding a copy of it (the ring's next node)
};

struct MemoryCopyView {
  std::optional<int64_t> step;  // the newest complete set's; none = no complete set
  int world = 0;
  std::vector<MemoryShardView> shards;  // rank order
};

inline MemoryCopyView memory_copy_view(const nlohmann::json& copies,
                                       const std::vector<ShareView>& placement) {
  MemoryCopyView v;
  if (!copies.is_array()) return v;
  const nlohmann::json* newest = nullptr;
  for (const nlohmann::json& c : copies) {
    if (!c.is_object() || !c.value("complete", false) || !c.contains("step") ||
        !c["step"].is_number_integer())
      continue;
    if (newest == nullptr || c["step"].get<int64_t>() > (*newest)["step"].get<int64_t>()) newest = &c;
  }
  if (newest == nullptr) return v;
  v.step = (*newest)["step"].get<int64_t>();
  v.world = newest->value("world", 0);
  auto own_node = [&](int rank) -> std::string {
    for (const ShareView& s : placement)
      if (rank >= s.first_rank && rank < s.first_rank + s.ranks) return s.node;
    return "";
  };
  for (const nlohmann::json& r : newest->value("ranks", nlohmann::json::array())) {
    if (!r.is_object() || !r.contains("rank") || !r["rank"].is_number_integer()) continue;
    MemoryShardView sv{.rank = r["rank"].get<int>()};
    const std::string own = own_node(sv.rank);
    for (const nlohmann::json& n : r.value("nodes", nlohmann::json::array())) {
      if (!n.is_string()) continue;
      if (n.get<std::string>() == own)
        sv.node = own;
      else
        sv.peers.push_back(n.get<std::string>());
    }
    v.shards.push_back(std::move(sv));
  }
  std::sort(v.shards.begin(), v.shards.end(),
            [](const MemoryShardView& a, const MemoryShardView& b) { return a.rank < b.rank; });
  return v;
}

// "step 20: rank 0 node-0 + peer node-1, rank 1 node-1 + peer node-0" ("no peer copy yet" where the ring
// has not taken it; "not on its node" where the rank's own node lost it); "—" when there is no complete set.
inline std::string memory_copy_text(const MemoryCopyView& v) {
  if (!v.step) return "\u2014";
  std::string out = "step " + std::to_string(*v.step) + ":";
  for (size_t k = 0; k < v.shards.size(); ++k) {
    const MemoryShardView& s = v.shards[k];
    out += (k == 0 ? " rank " : ", rank ") + std::to_string(s.rank) + " " +
           (s.node.empty() ? std::string("not on its node") : s.node);
    if (s.peers.empty()) {
      out += " (no peer copy yet)";
    } else {
      for (size_t p = 0; p < s.peers.size(); ++p) out += (p == 0 ? " + peer " : ", ") + s.peers[p];
    }
  }
  return out;
}

}  // namespace gantry::console
