// Layout search: every valid layout of a model on a cluster (tp, cp, pp, virtual stages, ZeRO stage,
// micro-batch, recomputation; dp follows), evaluated with plan_evaluate, those that do not fit in HBM
// dropped, the rest ranked by predicted tokens/s or by goodput (tokens/s × the expected share of useful
// time under failures). The model, cluster, global batch and training setup stay as given.
//
//   SearchOptions o{.top = 5, .rank = SearchRank::kTokensPerSecond};
//   Result<SearchResult> r = plan_search(input, o);  // input.layout gives flash attention and HSDP
//   for (const Plan& p : r->plans) ...              // best first
#pragma once

#include <vector>

#include "engine/plan/planner.h"
#include "telemetry/status.h"

namespace gantry {

enum class SearchRank {
  kTokensPerSecond,  // predicted tokens/s
  kGoodput,          // tokens/s × goodput: throughput net of checkpoints, failures and restarts
};
const char* search_rank_name(SearchRank r);  // "tokens", "goodput"

struct SearchOptions {
  int top = 10;
  SearchRank rank = SearchRank::kTokensPerSecond;
  std::vector<int> micro_batches = {1, 2, 4, 8};
  int max_vp = 4;  // virtual stages tried: 1, 2, ..., max_vp (powers of two)
  int max_cp = 8;  // context parallel degrees tried: 1, 2, ..., max_cp (powers of two)
};

struct SearchResult {
  std::vector<Plan> plans;  // at most `top`, fitting in HBM, best first
  int evaluated = 0;        // layouts that passed validation
  int fitting = 0;          // of those, how many fit in HBM
};

// The input's model, cluster and training are kept; from its layout only flash_attention and hsdp are
// used (sequence parallelism is on whenever tp > 1, as it never costs bytes). tp stays within a node.
Result<SearchResult> plan_search(const PlanInput& input, const SearchOptions& options);

}  // namespace gantry
