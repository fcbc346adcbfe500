// The coordinator's straggler policy for one run: every rank-step record the run's agents send is fed
// to a StragglerScorer (telemetry/straggler.h), the scorer is evaluated every `window_steps` steps of
// the run, and a rank that becomes flagged, or stops being flagged, turns into an event. The latest
// evaluation is what `GET /v1/runs/{id}/ranks` shows beside each rank.
//
//   Result<StragglerWatchOptions> o = straggler_watch_parse(body.contains("straggler") ? &body["straggler"] :
//   nullptr); StragglerWatch watch(o.value()); for each rank-step record of the run: watch.add(r); for
//   (EventRecord& e : watch.maybe_evaluate(run_id, now, node_of_rank)) record(e);
//
// The basis defaults to `busy` (a step's time minus its exposed communication): ranks of a synchronous
// job wait for each other in their collectives, so on `total` every rank would look as slow as the
// slowest. Work per evaluation is O(ranks x window), once per window_steps steps: O(ranks) per step.
#pragma once

#include <cstdint>
#include <functional>
#include <nlohmann/json.hpp>  // nlohmann::json: the options' and scores' API form
#include <string>
#include <vector>

#include "telemetry/records.h"
#include "telemetry/status.h"
#include "telemetry/straggler.h"

namespace gantry {

struct StragglerWatchOptions {
  bool enabled = true;  // scoring, flags and their events
  // The policy's action (off by default): a rank flagged (windows_to_flag windows in a row) has its node
  // quarantined, and the run moves off it (a spare, else a smaller dp). Switchable while the run lives
  // (POST /v1/runs/{id}/straggler).
  bool quarantine = false;
  // The scorer's defaults, but on the busy basis; thresholds of 0.75 (a rank 4/3 as slow as the fastest,
  // or as its own best) rather than 0.9, since step times on shared machines wander by 10 % on their own.
  StragglerOptions scoring{.window_steps = 20,
                           .min_samples = 5,
                           .relative_threshold = 0.75,
                           .individual_threshold = 0.75,
                           .windows_to_flag = 3,
                           .basis = StragglerBasis::busy};
};

// The submit body's "straggler" object (nullptr: the defaults). Errors name the field
// ('field "straggler.window_steps": expected an integer in [1, 100000], got "x" (a string)',
// 'straggler.min_samples must be in 1..10, got 20', 'unknown field "straggler.windw_steps" ...').
Result<StragglerWatchOptions> straggler_watch_parse(const nlohmann::json* object);
nlohmann::json straggler_watch_options_json(const StragglerWatchOptions& o);

class StragglerWatch {
 public:
  explicit StragglerWatch(StragglerWatchOptions options = {});

  const StragglerWatchOptions& options() const { return o_; }

  // The options changed while the run lives. New scoring options (or scoring turned on or off) start the
  // scores over, as a new placement does: ranks flagged until now get a "straggler_cleared" event saying
  // why. A change of `quarantine` alone keeps the scores and flags.
  std::vector<EventRecord> set_options(const StragglerWatchOptions& o, int64_t run_id, double time_unix_s,
                                       const std::function<std::string(int32_t)>& node_of);

  // The step of the latest evaluation (-1: none yet): a caller sees whether maybe_evaluate evaluated.
  int64_t evaluated_at_step() const { return evaluated_at_step_; }

  // The ranks flagged by the latest evaluation, in rank order.
  std::vector<int32_t> flagged_ranks() const;

  // One rank-step record of the run's current placement.
  void add(const RankStepRecord& r);

  // Evaluates when the run has reached the next multiple of window_steps (by the records added), and
  // returns a "straggler" event for each rank newly flagged and a "straggler_cleared" event for each rank
  // no longer flagged, with the rank's node from `node_of` and the step of the evaluation.
  std::vector<EventRecord> maybe_evaluate(int64_t run_id, double time_unix_s,
                                          const std::function<std::string(int32_t)>& node_of);

  // A new placement (a move, a resume): the ranks are on other devices now, so the scores start over. Ranks
  // flagged until now get a "straggler_cleared" event saying why.
  std::vector<EventRecord> reset(int64_t run_id, double time_unix_s,
                                 const std::function<std::string(int32_t)>& node_of,
                                 const std::string& why = "the run was placed again");

  // The rank's latest scores for the API (null when it has not been scored), and the run's summary:
  // options, evaluations, the step of the last one, the fastest rank, the flagged ranks.
  nlohmann::json rank_json(int32_t rank) const;
  nlohmann::json summary_json() const;
  int flagged_count() const;

 private:
  // A "straggler_cleared" event for `rank`, saying why.
  EventRecord cleared(int64_t run_id, double time_unix_s, int32_t rank, const std::string& node,
                      const std::string& why) const;

  StragglerWatchOptions o_;
  StragglerScorer scorer_;
  StragglerReport last_;            // the latest evaluation
  int64_t last_step_seen_ = -1;     // highest step among the records added
  int64_t evaluated_at_step_ = -1;  // the step of the latest evaluation
  int64_t next_evaluation_ = 0;     // evaluate once a record reaches this step
  std::vector<bool> flagged_;       // by rank, as of the latest evaluation
};

}  // namespace gantry
