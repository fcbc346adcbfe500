// The Stragglers panel's list: one row per rank, the slowest first, from the coordinator's scores in
// GET /v1/runs/{id}/ranks ("straggler": {relative, individual, flagged, slow_phase, excess_s, excess, ...}).
// Where the coordinator gives no scores (an older coordinator, or a rank not scored yet) the row falls back
// to the rank's latest busy time (else step time) against the fastest rank's and the median rank's, and says
// so. Slowest means the most excess time: a rank's busy time over the median rank's, since in synchronous
// data parallelism every rank's step time is the same.
//
//   std::vector<StragglerRow> rows = straggler_rows(snapshot.ranks);   // ordered for display
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "ui/console/console_state.h"

namespace gantry::console {

struct StragglerRow {
  int32_t rank = 0;
  std::string node;
  double score = 1;         // 1 = as fast as the fastest rank, lower = slower; NaN = not known
  double individual = 1;    // against the rank's own best (coordinator only; NaN otherwise)
  bool flagged = false;     // the coordinator flagged it
  std::string slow_phase;   // "" = not named
  double step_seconds = 0;  // latest step time
  double busy_seconds = 0;  // latest busy time (0 = not given)
  double excess_s = 0;      // time over the median rank's; NaN = not known
  std::string excess;       // "forward +0.24 s" (the coordinator's words), "busy +0.24 s" (ours), "-"
  bool scored_by_coordinator = false;
};

// Order: flagged ranks first, then by excess time descending (unknown last), then by rank. Ties keep rank
// order, so the list does not shuffle between frames.
std::vector<StragglerRow> straggler_rows(const std::vector<RankView>& ranks);

// The nodes that hold at least one flagged rank, in first-appearance order of `rows`.
std::vector<std::string> straggler_nodes(const std::vector<StragglerRow>& rows);

}  // namespace gantry::console
