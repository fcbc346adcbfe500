// Straggler scoring: which rank is slow, and in which phase. Scores follow NVIDIA resiliency-ext:
//
//   relative score   = fastest rank's median step time ÷ this rank's median   (1 = as fast as the best)
//   individual score = this rank's best window median ÷ its current median     (1 = as fast as it ever was)
//
// both over a sliding window of each rank's last `window_steps` steps. A rank is flagged when either
// score stays under its threshold for `windows_to_flag` evaluations in a row. The flag names the slow
// phase: the phase whose median exceeds the other ranks' (the median across ranks) by the most, so an
// operator can tell a slow GPU (forward, backward) from a slow link (comm_exposed) or slow storage
// (data_wait). Work is O(ranks × window) per evaluation and memory O(ranks × window).
//
//   StragglerScorer scorer({.window_steps = 20, .relative_threshold = 0.9, .windows_to_flag = 3});
//   for each record: scorer.add(r);
//   if (step % 20 == 0) {
//     StragglerReport rep = scorer.evaluate();
//     for (int rank : rep.flagged) events.push_back(straggler_event(rep, rank, run_id, now));
//   }
//
// In a synchronous job a slow rank makes every other rank wait in its collectives: their exposed
// communication grows and all step totals come out equal. Score on StragglerBasis::busy there (total
// minus exposed communication), which leaves the waiting out; the default, total, suits series where
// ranks do not wait for each other (independent replicas, or tests of the arithmetic).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "telemetry/records.h"

namespace gantry {

enum class StragglerBasis : uint8_t {
  total,  // RankStepRecord::total_s
  busy,   // total_s − phases.comm_exposed: time the rank itself needed
};

struct StragglerOptions {
  int window_steps = 20;            // samples kept per rank; ≥ 1
  int min_samples = 5;              // a rank with fewer samples in its window is not scored; 1..window_steps
  double relative_threshold = 0.9;  // 0..1; a relative score under it counts against the rank
  double individual_threshold = 0.9;
  int windows_to_flag = 3;  // consecutive evaluations under a threshold before the flag; ≥ 1
  StragglerBasis basis = StragglerBasis::total;
};

// "" when the options are usable, else a message naming the field and its allowed range.
std::string straggler_options_check(const StragglerOptions& o);

struct StragglerScore {
  int32_t rank = 0;
  int samples = 0;             // in the window
  double median_s = 0;         // of the basis
  double relative = 1;         // fastest median ÷ median
  double individual = 1;       // best median ever ÷ median
  int relative_windows = 0;    // evaluations in a row under relative_threshold
  int individual_windows = 0;  // evaluations in a row under individual_threshold
  bool flagged = false;
  Phase slow_phase = Phase::forward;  // meaningful when flagged (or slow_phase_excess_s > 0)
  double slow_phase_excess_s = 0;     // slow phase's median minus the reference median for that phase
  bool slow_phase_vs_self = false;    // true: no phase stood out against the other ranks, so the
                                      // reference is the rank's own phase medians at its best window
  PhaseSeconds phase_median_s;        // this rank's per-phase medians over the window
  double excess_s = 0;                // median_s minus the median across scored ranks (reference_median_s)
};

struct StragglerReport {
  int64_t evaluation = 0;  // 1 for the first evaluate()
  int32_t fastest_rank = -1;
  double fastest_median_s = 0;
  double reference_median_s = 0;       // the median across scored ranks of their basis medians
  PhaseSeconds phase_reference_s;      // per phase, the median across scored ranks of their medians
  std::vector<StragglerScore> scores;  // one per scored rank, in rank order
  std::vector<int32_t> flagged;        // ranks flagged in this evaluation, in rank order

  const StragglerScore* find(int32_t rank) const;  // nullptr when the rank was not scored
};

class StragglerScorer {
 public:
  // Options are used as given; check them first with straggler_options_check (out-of-range values are
  // clamped to the nearest allowed one so the scorer never misbehaves).
  explicit StragglerScorer(StragglerOptions options = {});

  // Adds one sample to the rank's window, dropping its oldest when the window is full. Records with a
  // negative rank or a non-finite total are ignored (false).
  bool add(const RankStepRecord& r);

  // Scores every rank with at least min_samples in its window, updates the streaks and flags. Ranks
  // without enough samples keep their streaks unchanged. Windows are not cleared: call this every
  // window_steps steps for non-overlapping windows, or more often for a smoother signal.
  StragglerReport evaluate();

  // Forgets a rank (replaced node, restarted worker): its window, best median and streaks.
  void reset_rank(int32_t rank);

  const StragglerOptions& options() const { return o_; }

 private:
  struct RankState {
    std::vector<float> basis;   // ring of window_steps samples
    std::vector<float> phases;  // ring of window_steps × kPhaseCount, sample-major
    int count = 0;              // samples held, ≤ window_steps
    int next = 0;               // ring position of the next write
    double best_median = 0;     // 0 = none yet
    PhaseSeconds best_phases;   // phase medians at the best window
    int relative_windows = 0;
    int individual_windows = 0;
  };
  StragglerOptions o_;
  std::vector<RankState> ranks_;  // indexed by rank
  int64_t evaluations_ = 0;
  std::vector<float> scratch_;
};

// A rank's excess as an operator reads it, the same in `ctl ranks` and the console's Stragglers panel: the
// slow phase and its time over the reference, "forward +0.24 s" (milliseconds under a tenth of a second:
// "backward +12.5 ms"); "-" when nothing exceeds it.
std::string straggler_excess_text(std::string_view phase, double excess_s);

// An event for a flagged rank: kind "straggler", the message names the scores and the slow phase, the
// payload is JSON with the numbers.
EventRecord straggler_event(const StragglerReport& report, int32_t rank, int64_t run_id, double time_unix_s,
                            int64_t step = -1);

}  // namespace gantry
