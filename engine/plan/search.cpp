#include "engine/plan/search.h"

#include <algorithm>

namespace gantry {

namespace {

std::vector<int> powers_of_two_up_to(int limit) {
  std::vector<int> v;
  for (int x = 1; x <= limit; x *= 2) v.push_back(x);
  return v;
}

double score(const Plan& p, SearchRank rank) {
  return rank == SearchRank::kGoodput ? p.tokens_per_s * p.goodput : p.tokens_per_s;
}

}  // namespace

const char* search_rank_name(SearchRank r) {
  return r == SearchRank::kGoodput ? "goodput" : "tokens";
}

Result<SearchResult> plan_search(const PlanInput& input, const SearchOptions& options) {
  if (options.top < 1) return Status::error("top = " + std::to_string(options.top) + ": allowed >= 1");
  Status s = plan_model_validate(input.model);
  if (!s.ok()) return s;
  const int gpus = input.cluster.gpus;
  SearchResult out;
  std::vector<Plan> fitting;
  // Best first; among equals, the one that needs less memory.
  auto better = [&](const Plan& a, const Plan& b) {
    const double sa = score(a, options.rank), sb = score(b, options.rank);
    if (sa != sb) return sa > sb;
    return a.memory.total() < b.memory.total();
  };
  // Keep only the leaders as we go: tens of thousands of layouts are evaluated on large clusters.
  auto prune = [&] {
    std::sort(fitting.begin(), fitting.end(), better);
    if (static_cast<int>(fitting.size()) > options.top) fitting.resize(options.top);
  };
  for (int tp : powers_of_two_up_to(std::min(gpus, input.cluster.gpus_per_node))) {
    for (int cp : powers_of_two_up_to(std::min(options.max_cp, gpus / tp))) {
      for (int pp = 1; pp <= std::min(input.model.layers, gpus / (tp * cp)); ++pp) {
        if (gpus % (tp * cp * pp) != 0) continue;
        const int per_device = (input.model.layers + pp - 1) / pp;
        for (int vp : powers_of_two_up_to(std::min(options.max_vp, per_device))) {
          if (vp > 1 && pp == 1) continue;
          for (int zero = 0; zero <= 3; ++zero) {
            for (int mb : options.micro_batches) {
              for (Recompute rc : {Recompute::kNone, Recompute::kSelective, Recompute::kFull}) {
                if (rc == Recompute::kSelective && input.layout.flash_attention) continue;  // same as none
                PlanInput in = input;
                in.layout = PlanLayout{.tp = tp,
                                       .pp = pp,
                                       .vp = vp,
                                       .dp = 0,
                                       .cp = cp,
                                       .zero = zero,
                                       .hsdp = zero >= 1 ? input.layout.hsdp : 0,
                                       .sequence_parallel = tp > 1,
                                       .recompute = rc,
                                       .flash_attention = input.layout.flash_attention,
                                       .schedule = Schedule::k1F1B,
                                       .micro_batch = mb};
                Result<Plan> p = plan_evaluate(in);
                if (!p.ok()) continue;
                ++out.evaluated;
                if (!p->fits) continue;
                ++out.fitting;
                fitting.push_back(std::move(p.value()));
                if (static_cast<int>(fitting.size()) >= 4 * options.top + 64) prune();
              }
            }
          }
        }
      }
    }
  }
  prune();
  out.plans = std::move(fitting);
  return out;
}

}  // namespace gantry
