#include "engine/cluster/placement.h"

#include <algorithm>
#include <cstdint>
#include <numeric>
#include <unordered_set>

namespace gantry {
namespace {

// A node the job may use, with its free slots counted in whole tp groups.
struct Candidate {
  int node = 0;
  int free = 0;    // free slots
  int groups = 0;  // free / tp: tp groups it can hold
};

// Largest first, then input order: the order in which nodes are taken.
bool by_groups_desc(const Candidate& a, const Candidate& b) {
  return a.groups != b.groups ? a.groups > b.groups : a.node < b.node;
}

// Chooses from `pool` the fewest nodes that hold `want` groups: the largest ones, except that the last is
// the smallest node still big enough for what remains (so a whole free node is not broken into when a
// half-busy one will do). Adds the groups each chosen node takes to `groups_on`. The pool must hold at
// least `want` groups in all.
void choose(std::vector<Candidate> pool, int want, std::vector<int>& groups_on) {
  std::sort(pool.begin(), pool.end(), by_groups_desc);
  int remaining = want;
  size_t i = 0;
  for (; i < pool.size() && remaining > 0; ++i) {
    if (pool[i].groups >= remaining) break;  // pool[i] could take the rest: pick the best fit from here
    groups_on[pool[i].node] += pool[i].groups;
    remaining -= pool[i].groups;
  }
  if (remaining <= 0) return;
  size_t best = i;
  for (size_t j = i; j < pool.size() && pool[j].groups >= remaining; ++j) {
    if (pool[j].groups < pool[best].groups) best = j;  // strict: among equals keep the earliest node
  }
  groups_on[pool[best].node] += remaining;
}

std::string describe_layout(const GangLayout& l, int64_t world) {
  return "dp " + std::to_string(l.dp) + " x tp " + std::to_string(l.tp) + " x pp " + std::to_string(l.pp) +
         " (" + std::to_string(world) + (world == 1 ? " rank)" : " ranks)");
}

// "0-3,6-7" for {0,1,2,3,6,7}.
std::string ranges(const std::vector<int>& sorted) {
  std::string out;
  for (size_t i = 0; i < sorted.size();) {
    size_t j = i;
    while (j + 1 < sorted.size() && sorted[j + 1] == sorted[j] + 1) ++j;
    if (!out.empty()) out += ",";
    out += std::to_string(sorted[i]);
    if (j > i) out += "-" + std::to_string(sorted[j]);
    i = j + 1;
  }
  return out;
}

// At most this many nodes are named in a refusal; a 12,500-node cluster gets "... and 12,492 more".
constexpr size_t kNamedNodes = 8;

// "gpu-01 4 free, gpu-03 2 free (spare), ... and 3 more", largest first.
std::string list_free(std::vector<Candidate> usable, const std::vector<PlacementNode>& nodes) {
  std::sort(usable.begin(), usable.end(), [](const Candidate& a, const Candidate& b) {
    return a.free != b.free ? a.free > b.free : a.node < b.node;
  });
  std::string out;
  for (size_t i = 0; i < usable.size() && i < kNamedNodes; ++i) {
    const PlacementNode& n = nodes[usable[i].node];
    if (i) out += ", ";
    out += n.id + " " + std::to_string(usable[i].free) + " free";
    if (n.state == NodeState::spare) out += " (spare)";
  }
  if (usable.size() > kNamedNodes)
    out += ", ... and " + std::to_string(usable.size() - kNamedNodes) + " more";
  return out;
}

}  // namespace

std::string_view node_state_name(NodeState s) {
  switch (s) {
    case NodeState::healthy:
      return "healthy";
    case NodeState::quarantined:
      return "quarantined";
    case NodeState::lost:
      return "lost";
    case NodeState::spare:
      return "spare";
    case NodeState::unhealthy:
      return "unhealthy";
  }
  return "unknown";
}

Result<NodeState> node_state_parse(std::string_view s) {
  if (s == "healthy" || s == "ok") return NodeState::healthy;
  if (s == "quarantined") return NodeState::quarantined;
  if (s == "lost") return NodeState::lost;
  if (s == "spare") return NodeState::spare;
  if (s == "unhealthy") return NodeState::unhealthy;
  return Status::error("node state \"" + std::string(s) +
                       "\" is not one of healthy, quarantined, lost, spare, unhealthy");
}

int Placement::spares_used() const {
  return static_cast<int>(
      std::count_if(nodes.begin(), nodes.end(), [](const PlacedNode& n) { return n.spare; }));
}

Result<Placement> placement_assign(const std::vector<PlacementNode>& nodes, const GangLayout& layout) {
  // --- the layout ---
  if (layout.dp < 1 || layout.tp < 1 || layout.pp < 1) {
    return Status::error("placement: dp " + std::to_string(layout.dp) + ", tp " + std::to_string(layout.tp) +
                         ", pp " + std::to_string(layout.pp) + ": every degree must be at least 1");
  }
  const int64_t product = static_cast<int64_t>(layout.dp) * layout.tp * layout.pp;
  // Far above any cluster (100k GPUs), and keeps every count below in int.
  constexpr int64_t kMaxWorld = int64_t{1} << 24;
  if (product > kMaxWorld) {
    return Status::error("placement: dp " + std::to_string(layout.dp) + " x tp " + std::to_string(layout.tp) +
                         " x pp " + std::to_string(layout.pp) + " = " + std::to_string(product) +
                         " ranks is more than the " + std::to_string(kMaxWorld) + " a job may have");
  }
  if (layout.world != 0 && layout.world != product) {
    return Status::error("placement: dp " + std::to_string(layout.dp) + " x tp " + std::to_string(layout.tp) +
                         " x pp " + std::to_string(layout.pp) + " = " + std::to_string(product) +
                         " but world is " + std::to_string(layout.world) +
                         ": the degrees must multiply to the world size (or leave world 0)");
  }
  const int world = static_cast<int>(product);
  const int tp = layout.tp;
  const int groups_needed = world / tp;

  // --- the nodes ---
  std::unordered_set<std::string_view> ids;
  std::vector<Candidate> healthy, spare;
  std::vector<int> excluded;  // quarantined, lost or unhealthy
  int64_t busy_total = 0;
  for (size_t i = 0; i < nodes.size(); ++i) {
    const PlacementNode& n = nodes[i];
    const std::string where =
        "placement: node " + std::to_string(i) + (n.id.empty() ? "" : " (\"" + n.id + "\")");
    if (n.id.empty()) return Status::error(where + ": id is empty; every node needs a unique id");
    if (!ids.insert(n.id).second)
      return Status::error(where + ": id is used by an earlier node; ids must be unique");
    if (n.slots < 0)
      return Status::error(where + ": slots " + std::to_string(n.slots) + " must be at least 0");
    std::vector<int> busy = n.busy;
    std::sort(busy.begin(), busy.end());
    for (size_t b = 0; b < busy.size(); ++b) {
      if (busy[b] < 0 || busy[b] >= n.slots) {
        return Status::error(where + ": busy slot " + std::to_string(busy[b]) + " is outside [0, " +
                             std::to_string(n.slots) + ")");
      }
      if (b && busy[b] == busy[b - 1]) {
        return Status::error(where + ": busy slot " + std::to_string(busy[b]) + " is listed twice");
      }
    }
    busy_total += static_cast<int64_t>(busy.size());
    const int free = n.slots - static_cast<int>(busy.size());
    const Candidate c{.node = static_cast<int>(i), .free = free, .groups = free / tp};
    switch (n.state) {
      case NodeState::healthy:
        healthy.push_back(c);
        break;
      case NodeState::spare:
        spare.push_back(c);
        break;
      case NodeState::quarantined:
      case NodeState::lost:
      case NodeState::unhealthy:
        excluded.push_back(static_cast<int>(i));
        break;
    }
  }

  auto sum = [](const std::vector<Candidate>& v, int Candidate::*field) {
    return std::accumulate(v.begin(), v.end(), int64_t{0},
                           [field](int64_t s, const Candidate& c) { return s + c.*field; });
  };
  const int64_t healthy_groups = sum(healthy, &Candidate::groups);
  const int64_t spare_groups = sum(spare, &Candidate::groups);

  if (healthy_groups + spare_groups < groups_needed) {
    std::vector<Candidate> usable = healthy;
    usable.insert(usable.end(), spare.begin(), spare.end());
    const int64_t free_slots = sum(usable, &Candidate::free);
    const int largest =
        usable.empty() ? 0 : std::max_element(usable.begin(), usable.end(), [](auto& a, auto& b) {
                               return a.free < b.free;
                             })->free;
    std::string why = "cannot place " + describe_layout(layout, world) + ": ";
    if (free_slots < world) {
      why += "needs " + std::to_string(world) + " free slots, the usable nodes have " +
             std::to_string(free_slots);
    } else if (largest < tp) {
      why += "tp " + std::to_string(tp) + " needs " + std::to_string(tp) +
             " free slots on one node for each tensor-parallel group, the largest free node has " +
             std::to_string(largest);
    } else {
      why += "tp " + std::to_string(tp) + " keeps each group of " + std::to_string(tp) +
             " ranks on one node: " + std::to_string(groups_needed) +
             " groups needed, the usable nodes hold " + std::to_string(healthy_groups + spare_groups);
    }
    why += "; usable: " + std::to_string(free_slots) + " free slots on " + std::to_string(usable.size()) +
           (usable.size() == 1 ? " node" : " nodes") + " (" + std::to_string(healthy.size()) + " healthy, " +
           std::to_string(spare.size()) + " spare)";
    if (!usable.empty()) why += ": " + list_free(usable, nodes);
    if (busy_total > 0) why += "; " + std::to_string(busy_total) + " slots busy with other runs";
    if (!excluded.empty()) {
      why += "; not used: ";
      for (size_t i = 0; i < excluded.size() && i < kNamedNodes; ++i) {
        const PlacementNode& n = nodes[excluded[i]];
        why += (i ? ", " : "") + n.id + " (" + std::string(node_state_name(n.state)) + ", " +
               std::to_string(n.slots) + " slots)";
      }
      if (excluded.size() > kNamedNodes)
        why += ", ... and " + std::to_string(excluded.size() - kNamedNodes) + " more";
    }
    return Status::error(why);
  }

  // --- choose: healthy nodes alone if they suffice, else all of them and as few spares as possible ---
  std::vector<int> groups_on(nodes.size(), 0);
  if (healthy_groups >= groups_needed) {
    choose(healthy, groups_needed, groups_on);
  } else {
    for (const Candidate& c : healthy) groups_on[c.node] = c.groups;
    choose(spare, groups_needed - static_cast<int>(healthy_groups), groups_on);
  }

  // --- assign ranks in order: healthy nodes first (input order), then spares ---
  Placement p;
  p.ranks.resize(world);
  std::vector<int> order;
  for (const auto* pool : {&healthy, &spare}) {
    for (const Candidate& c : *pool) {
      if (groups_on[c.node] > 0) order.push_back(c.node);
    }
  }
  int rank = 0;
  for (int node : order) {
    const PlacementNode& n = nodes[node];
    std::vector<bool> busy(n.slots, false);
    for (int b : n.busy) busy[b] = true;
    const int count = groups_on[node] * tp;
    p.nodes.push_back(
        {.node = node, .first_rank = rank, .ranks = count, .spare = n.state == NodeState::spare});
    int slot = 0;
    for (int local = 0; local < count; ++local, ++rank) {
      while (busy[slot]) ++slot;  // the node has count free slots, so this stays in range
      p.ranks[rank] = {.node = node, .slot = slot, .local_rank = local};
      ++slot;
    }
  }
  return p;
}

std::string placement_describe(const std::vector<PlacementNode>& nodes, const Placement& p) {
  std::string out;
  for (const PlacedNode& pn : p.nodes) {
    std::vector<int> slots;
    for (int r = pn.first_rank; r < pn.first_rank + pn.ranks; ++r) slots.push_back(p.ranks[r].slot);
    std::sort(slots.begin(), slots.end());
    if (!out.empty()) out += "\n";
    out += nodes[pn.node].id + (pn.spare ? " (spare)" : "") + ": ";
    out += pn.ranks == 1 ? "rank " + std::to_string(pn.first_rank)
                         : "ranks " + std::to_string(pn.first_rank) + "-" +
                               std::to_string(pn.first_rank + pn.ranks - 1);
    out += (slots.size() == 1 ? " on slot " : " on slots ") + ranges(slots);
  }
  return out;
}

}  // namespace gantry
