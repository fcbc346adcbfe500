// A run's goodput ledger (docs/CLUSTER.md, "Goodput"): every second of its wall time, from its submission to
// its end (or now), in exactly one category, so that the categories sum to the wall time by construction;
// ETTR (effective training time ratio) = productive / wall. And the Young/Daly checkpoint interval from the
// run's measured checkpoint cost and failure rate.
//
// Pure arithmetic over facts the coordinator records anyway (its generation events, the failure notices,
// pause and resume events, the checkpoint catalog), so the ledger is derived from stored history on every
// query and survives a coordinator restart with nothing of its own to keep.
//
//   GoodputInput in{.created_unix = 100, .end_unix = 200};
//   in.generations.push_back({.generation = 1, .placed_unix = 100, .first_step_start = 103, .last_progress =
//   200}); GoodputLedger l = goodput_ledger(in);   // l.seconds(kWaiting) == 3, l.seconds(kProductive) == 97
//
// The timeline is painted in layers, each over what the one before left:
//   1. a generation's window [placed, next placed or end): until its first step starts, waiting (the first
//      generation: queued, placing, starting its processes) or restore (a later one: re-form and restore);
//      from its first step to its last progress (the end of its last step record), productive; the part of
//      that after the checkpoint the next generation restored from, recomputed; after its last progress, up
//      to the coordinator's first notice of a failure, detection; after the notice (or after the last
//      progress of a generation that was moved without a failure), restore until the next generation is
//      placed; after a run's end (stopped, failed, finished, interrupted), waiting up to that end (the
//      final checkpoint, the processes' exit) and paused from there to a resume-from;
//   2. pauses (an operator's pause until its resume) over productive time;
//   3. each checkpoint's stall over productive or waiting time.
#pragma once

#include <array>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace gantry {

enum class GoodputCategory : uint8_t {
  kProductive,       // training steps that were kept
  kCheckpointStall,  // training stopped for a checkpoint
  kDetection,        // a failure until the coordinator noticed it
  kRestore,     // the notice (or a move) until the next generation's first step: teardown, re-form, restore
  kRecomputed,  // steps trained and then rolled back: trained again after a restore from an older checkpoint
  kPaused,      // paused by an operator, or stopped until a resume-from
  kWaiting,     // queued, placing and starting before the first step; winding down after the last
};
inline constexpr int kGoodputCategoryCount = 7;
// "productive", "checkpoint_stall", "detection", "restore", "recomputed", "paused", "waiting"
std::string_view goodput_category_name(GoodputCategory c);

// Why a generation was placed.
enum class GoodputCause : uint8_t { kSubmit, kRecovery, kResume, kQuarantine };
std::string_view goodput_cause_name(GoodputCause c);  // "submit", "recovery", "resume", "quarantine"

struct GoodputGeneration {
  int generation = 0;
  GoodputCause cause = GoodputCause::kSubmit;
  double placed_unix = 0;
  int64_t from_step = -1;                  // the checkpoint step it restored; -1 = none (from the start)
  std::optional<double> first_step_start;  // when its first step began; none = it never stepped (yet)
  std::optional<double> last_progress;     // the end of its last step record; none = not known
};

// The coordinator's first word of a failure (node_failed, node_lost, ...).
struct GoodputNotice {
  double time_unix = 0;
  std::string kind, node, message;
};

// A fault injected by an operator (`ctl inject`): labels the failure it caused.
struct GoodputFault {
  double time_unix = 0;
  std::string fault;  // "kill", "hang", ...
  int rank = -1;
  std::string node;
};

struct GoodputCheckpoint {
  int64_t step = 0;
  double time_unix = 0;           // when its write ended
  double write_s = 0;             // from the start of its write (the step boundary) to that end
  std::optional<double> stall_s;  // none = not known (catalogued by an older build)
  bool committed = true;
};

struct GoodputPauseMark {
  double time_unix = 0;
  bool paused = true;  // true: a pause took effect; false: a resume
};

struct GoodputInput {
  double created_unix = 0;
  double end_unix = 0;  // the run's end, or now while it is live
  bool live = false;
  std::vector<GoodputGeneration> generations;  // in placement order
  std::vector<GoodputNotice> notices;
  std::vector<GoodputFault> faults;
  std::vector<GoodputCheckpoint> checkpoints;
  std::vector<GoodputPauseMark> pauses;
  std::vector<double> ended_unix;  // each time the run reached an end state
  // The end time of the step record at each step a generation restored from: where the lost work starts
  // when the checkpoint's catalog entry is missing (its gang died before the commit's record was sent).
  std::map<int64_t, double> step_end_unix;
};

struct GoodputFailure {
  int generation = 0;    // the generation that failed
  double time_unix = 0;  // the coordinator's notice
  bool noticed = true;   // false: no notice was recorded; the next placement stands in for it
  std::string kind, node, message;
  std::string fault;  // the injected fault that caused it, "" = none known
  int fault_rank = -1;
  std::string fault_node;
  double detection_s = 0, restore_s = 0, recomputed_s = 0;
  bool recovered = false;  // a next generation was placed and trained
  double cost_s() const { return detection_s + restore_s + recomputed_s; }
};

struct GoodputSpan {
  double begin = 0, end = 0;
  GoodputCategory category = GoodputCategory::kWaiting;
};

struct GoodputLedger {
  bool known = false;  // false: no generation is recorded (a history from before the ledger)
  std::string why_unknown;
  double wall_s = 0;
  std::array<double, kGoodputCategoryCount> seconds{};
  std::vector<GoodputFailure> failures;
  std::vector<GoodputSpan> spans;     // the painted timeline, in time order, adjacent spans merged
  int checkpoints_stall_unknown = 0;  // checkpoints whose stall is not known (not counted as stall)

  double of(GoodputCategory c) const { return seconds[static_cast<size_t>(c)]; }
  // productive / wall; none when the wall is 0 or the ledger is not known.
  std::optional<double> ettr() const;
};

GoodputLedger goodput_ledger(const GoodputInput& in);

// Young/Daly's first-order optimum checkpoint interval, sqrt(2 · C · MTBF): C the checkpoint cost (the
// median stall of the run's checkpoints), MTBF the run's wall time over its failures. Unknown (with why)
// until both are measured: no prior is assumed, so a run without a failure has no recommendation.
struct YoungDaly {
  std::optional<double> checkpoint_cost_s, mtbf_s, interval_s, step_s;
  std::optional<int64_t> interval_steps;  // interval_s over the mean step time, at least 1
  std::string why_unknown;                // "" when interval_s is known
};
YoungDaly young_daly(std::vector<double> stalls_s, int failures, double wall_s, std::optional<double> step_s);

}  // namespace gantry
