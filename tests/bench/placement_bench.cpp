// placement_bench: how long gang placement (engine/cluster/placement.h) takes on a 12,500-node cluster.
//
//   placement_bench [--nodes 12500] [--slots 8] [--reps 20]
//
// The cluster: nodes of --slots slots; every 50th node quarantined, every 97th lost, every 10th a spare,
// and a quarter of the nodes half busy with other runs' slots. Jobs swept: a small one (dp 64), half the
// free healthy slots, all of them (the largest that fits without spares), and one that needs spares. Each
// job is placed once to warm up, then --reps times; the median and the minimum are reported. #wrong counts
// placements that break an invariant (a rank on an unusable node, a slot used twice, a tp group split).
// One JSON line per job.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <set>
#include <string>
#include <vector>

#include "engine/cluster/placement.h"

namespace {

using namespace gantry;
using Clock = std::chrono::steady_clock;

int wrong_count(const std::vector<PlacementNode>& nodes, const Placement& p, int tp) {
  int wrong = 0;
  std::set<std::pair<int, int>> used;
  for (size_t r = 0; r < p.ranks.size(); ++r) {
    const PlacedRank& x = p.ranks[r];
    const PlacementNode& n = nodes[static_cast<size_t>(x.node)];
    if (n.state == NodeState::quarantined || n.state == NodeState::lost) ++wrong;
    if (std::find(n.busy.begin(), n.busy.end(), x.slot) != n.busy.end()) ++wrong;
    if (!used.insert({x.node, x.slot}).second) ++wrong;
    if (r % static_cast<size_t>(tp) != 0 && p.ranks[r - 1].node != x.node) ++wrong;  // a tp group split
  }
  return wrong;
}

}  // namespace

int main(int argc, char** argv) {
  int n_nodes = 12500, slots = 8, reps = 20;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!std::strcmp(argv[i], "--nodes"))
      n_nodes = std::atoi(argv[i + 1]);
    else if (!std::strcmp(argv[i], "--slots"))
      slots = std::atoi(argv[i + 1]);
    else if (!std::strcmp(argv[i], "--reps"))
      reps = std::atoi(argv[i + 1]);
    else {
      std::fprintf(stderr, "placement_bench: unknown option %s (known: --nodes, --slots, --reps)\n", argv[i]);
      return 2;
    }
  }
  std::vector<PlacementNode> nodes;
  int free_healthy = 0, free_spare = 0;
  for (int i = 0; i < n_nodes; ++i) {
    PlacementNode n{.id = "gpu-" + std::to_string(i), .slots = slots};
    if (i % 50 == 0)
      n.state = NodeState::quarantined;
    else if (i % 97 == 0)
      n.state = NodeState::lost;
    else if (i % 10 == 0)
      n.state = NodeState::spare;
    if (i % 4 == 1)
      for (int s = 0; s < slots / 2; ++s) n.busy.push_back(2 * s);
    const int free = slots - static_cast<int>(n.busy.size());
    if (n.state == NodeState::healthy) free_healthy += free;
    if (n.state == NodeState::spare) free_spare += free;
    nodes.push_back(std::move(n));
  }
  struct Job {
    const char* name;
    GangLayout layout;
  };
  const int tp = slots >= 4 ? 4 : 1;
  const std::vector<Job> jobs = {
      {"dp64", {.dp = 64}},
      {"half", {.dp = free_healthy / 2}},
      {"all_healthy", {.dp = free_healthy}},
      {"tp_groups", {.dp = free_healthy / 4 / tp, .tp = tp}},
      {"needs_spares", {.dp = free_healthy + free_spare / 2}},
  };
  std::printf("placement_bench: %d nodes x %d slots (%d free healthy, %d free spare), %d reps, CPU\n",
              n_nodes, slots, free_healthy, free_spare, reps);
  for (const Job& j : jobs) {
    Result<Placement> warm = placement_assign(nodes, j.layout);
    if (!warm.ok()) {
      std::fprintf(stderr, "placement_bench: %s: %s\n", j.name, warm.error().c_str());
      return 1;
    }
    std::vector<double> ms;
    int wrong = wrong_count(nodes, warm.value(), j.layout.tp);
    for (int r = 0; r < reps; ++r) {
      const auto t0 = Clock::now();
      Result<Placement> p = placement_assign(nodes, j.layout);
      ms.push_back(std::chrono::duration<double, std::milli>(Clock::now() - t0).count());
      if (!p.ok() || p->ranks.size() != warm->ranks.size()) ++wrong;
    }
    std::sort(ms.begin(), ms.end());
    const int ranks = j.layout.dp * j.layout.tp * j.layout.pp;
    std::printf(
        "{\"bench\":\"placement\",\"job\":\"%s\",\"nodes\":%d,\"slots\":%d,\"dp\":%d,\"tp\":%d,\"ranks\":%d,"
        "\"spares_used\":%d,\"ms_median\":%.3f,\"ms_min\":%.3f,\"reps\":%d,\"wrong\":%d,\"device\":\"cpu\"}"
        "\n",
        j.name, n_nodes, slots, j.layout.dp, j.layout.tp, ranks, warm->spares_used(), ms[ms.size() / 2],
        ms.front(), reps, wrong);
  }
  return 0;
}
