#include "engine/cluster/goodput.h"

#include <algorithm>
#include <cmath>

namespace gantry {
namespace {

using Cat = GoodputCategory;

constexpr uint32_t bit(Cat c) {
  return 1u << static_cast<unsigned>(c);
}
constexpr uint32_t kAny = 0xffffffffu;

// The wall time as contiguous spans, repainted piece by piece: a paint changes only the spans whose
// category is in `over`, so later layers (pauses, stalls) cannot eat a failure's time.
class Timeline {
 public:
  Timeline(double begin, double end) : begin_(begin), end_(std::max(begin, end)) {
    spans_.push_back({begin_, end_, Cat::kWaiting});
  }

  void paint(double a, double b, Cat c, uint32_t over = kAny) {
    a = std::max(a, begin_);
    b = std::min(b, end_);
    if (!(a < b)) return;
    std::vector<GoodputSpan> out;
    out.reserve(spans_.size() + 2);
    for (const GoodputSpan& s : spans_) {
      if (s.end <= a || s.begin >= b || (bit(s.category) & over) == 0) {
        out.push_back(s);
        continue;
      }
      if (s.begin < a) out.push_back({s.begin, a, s.category});
      out.push_back({std::max(s.begin, a), std::min(s.end, b), c});
      if (s.end > b) out.push_back({b, s.end, s.category});
    }
    spans_ = std::move(out);
  }

  double sum(Cat c, double a, double b) const {
    double t = 0;
    for (const GoodputSpan& s : spans_)
      if (s.category == c) t += std::max(0.0, std::min(s.end, b) - std::max(s.begin, a));
    return t;
  }

  std::vector<GoodputSpan> merged() const {
    std::vector<GoodputSpan> out;
    for (const GoodputSpan& s : spans_) {
      if (!(s.begin < s.end)) continue;
      if (!out.empty() && out.back().category == s.category && out.back().end == s.begin)
        out.back().end = s.end;
      else
        out.push_back(s);
    }
    return out;
  }

 private:
  double begin_, end_;
  std::vector<GoodputSpan> spans_;
};

}  // namespace

std::string_view goodput_category_name(GoodputCategory c) {
  switch (c) {
    case Cat::kProductive:
      return "productive";
    case Cat::kCheckpointStall:
      return "checkpoint_stall";
    case Cat::kDetection:
      return "detection";
    case Cat::kRestore:
      return "restore";
    case Cat::kRecomputed:
      return "recomputed";
    case Cat::kPaused:
      return "paused";
    case Cat::kWaiting:
      return "waiting";
  }
  return "waiting";
}

std::string_view goodput_cause_name(GoodputCause c) {
  switch (c) {
    case GoodputCause::kSubmit:
      return "submit";
    case GoodputCause::kRecovery:
      return "recovery";
    case GoodputCause::kResume:
      return "resume";
    case GoodputCause::kQuarantine:
      return "quarantine";
  }
  return "submit";
}

std::optional<double> GoodputLedger::ettr() const {
  if (!known || !(wall_s > 0)) return std::nullopt;
  return of(Cat::kProductive) / wall_s;
}

GoodputLedger goodput_ledger(const GoodputInput& in) {
  GoodputLedger out;
  const double begin = in.created_unix, end = std::max(in.created_unix, in.end_unix);
  out.wall_s = end - begin;
  if (in.generations.empty()) {
    out.why_unknown = "no generation of this run is recorded (its history predates the goodput ledger)";
    return out;
  }
  out.known = true;
  Timeline t(begin, end);
  const auto first_in = [](const auto& list, double a, double b, auto time_of) -> const auto* {
    using T = std::remove_reference_t<decltype(list.front())>;
    const T* best = nullptr;
    for (const T& x : list) {
      const double at = time_of(x);
      if (at >= a && at < b && (best == nullptr || at < time_of(*best))) best = &x;
    }
    return best;
  };
  const auto checkpoint_at = [&](int64_t step) -> const GoodputCheckpoint* {
    for (const GoodputCheckpoint& c : in.checkpoints)
      if (c.committed && c.step == step) return &c;
    return nullptr;
  };

  struct Window {
    double lo, hi;     // [placed, next placed or end)
    double train_end;  // the end of its training (its last progress), lo when it never stepped
    const GoodputNotice* notice;
    bool failed;     // a failure ended it (a notice, or a recovery placed after it)
    double noticed;  // the notice's time, or the next placement's when none was recorded
  };
  std::vector<Window> w(in.generations.size());
  const size_t n = in.generations.size();
  for (size_t g = 0; g < n; ++g) {
    const GoodputGeneration& gen = in.generations[g];
    const GoodputGeneration* next = g + 1 < n ? &in.generations[g + 1] : nullptr;
    Window& win = w[g];
    win.lo = std::clamp(gen.placed_unix, begin, end);
    win.hi = next ? std::clamp(next->placed_unix, win.lo, end) : end;
    win.notice = first_in(in.notices, win.lo, win.hi + (next ? 0.0 : 1e-9),
                          [](const GoodputNotice& x) { return x.time_unix; });
    const double* ended =
        first_in(in.ended_unix, win.lo, win.hi + (next ? 0.0 : 1e-9), [](double x) { return x; });
    win.failed = win.notice != nullptr || (next != nullptr && next->cause == GoodputCause::kRecovery);
    win.noticed = win.notice ? win.notice->time_unix : win.hi;

    // Until its first step: placing and starting (the first generation), or re-forming and restoring.
    const Cat before_first = g == 0 ? Cat::kWaiting : Cat::kRestore;
    if (!gen.first_step_start) {
      t.paint(win.lo, win.hi, before_first);
      win.train_end = win.lo;
      if (ended && next) t.paint(*ended, win.hi, Cat::kPaused);
      continue;
    }
    const double s = std::clamp(*gen.first_step_start, win.lo, win.hi);
    t.paint(win.lo, s, before_first);
    double train_end = std::clamp(gen.last_progress.value_or(s), s, win.hi);
    // The last generation of a live run that has not failed is training now: its step in flight counts.
    if (!next && in.live && !win.failed && !ended) train_end = win.hi;
    win.train_end = train_end;
    t.paint(s, train_end, Cat::kProductive);
    if (next) {
      // Trained past the checkpoint the next generation restored from: that work was done again.
      double lost_from = s;
      if (const GoodputCheckpoint* c = next->from_step >= 0 ? checkpoint_at(next->from_step) : nullptr) {
        lost_from = c->time_unix - c->write_s + c->stall_s.value_or(0);  // after its stall: that was kept
      } else if (auto e = in.step_end_unix.find(next->from_step); e != in.step_end_unix.end()) {
        lost_from = e->second;  // not catalogued: from the end of the step it holds
      }
      lost_from = std::clamp(lost_from, s, train_end);
      t.paint(lost_from, train_end, Cat::kRecomputed);
    }
    double cur = train_end;
    if (win.failed && win.noticed > cur) {
      t.paint(cur, win.noticed, Cat::kDetection);
      cur = win.noticed;
    }
    // A run that ended and was resumed from stood still from its end to the resume; the last generation's
    // end is the run's (its database row's time, a moment after the event's).
    const double tail_end = ended && next ? std::max(*ended, cur) : win.hi;
    // After the training: a teardown on the way to the next generation (or to the one a live run's recovery
    // is placing) is restore; an end's is waiting.
    const bool to_next = !ended && (next != nullptr || (in.live && win.failed));
    t.paint(cur, tail_end, to_next ? Cat::kRestore : Cat::kWaiting);
    if (ended && next) t.paint(tail_end, win.hi, Cat::kPaused);
  }

  // Pauses over training time: from a pause to the next resume, or to the end.
  std::vector<GoodputPauseMark> marks = in.pauses;
  std::stable_sort(marks.begin(), marks.end(), [](const GoodputPauseMark& a, const GoodputPauseMark& b) {
    return a.time_unix < b.time_unix;
  });
  std::optional<double> paused_at;
  for (const GoodputPauseMark& m : marks) {
    if (m.paused && !paused_at) paused_at = m.time_unix;
    if (!m.paused && paused_at) {
      t.paint(*paused_at, m.time_unix, Cat::kPaused, bit(Cat::kProductive));
      paused_at.reset();
    }
  }
  if (paused_at) t.paint(*paused_at, end, Cat::kPaused, bit(Cat::kProductive));

  // Checkpoint stalls: the stall starts at the step boundary its write starts from.
  for (const GoodputCheckpoint& c : in.checkpoints) {
    if (!c.stall_s) {
      ++out.checkpoints_stall_unknown;
      continue;
    }
    const double a = c.time_unix - c.write_s;
    t.paint(a, a + std::max(0.0, *c.stall_s), Cat::kCheckpointStall,
            bit(Cat::kProductive) | bit(Cat::kWaiting));
  }

  out.spans = t.merged();
  for (const GoodputSpan& s : out.spans) out.seconds[static_cast<size_t>(s.category)] += s.end - s.begin;

  for (size_t g = 0; g < n; ++g) {
    const Window& win = w[g];
    if (!win.failed) continue;
    GoodputFailure f;
    f.generation = in.generations[g].generation;
    f.time_unix = win.noticed;
    f.noticed = win.notice != nullptr;
    if (win.notice) {
      f.kind = win.notice->kind;
      f.node = win.notice->node;
      f.message = win.notice->message;
    } else {
      f.kind = "failure";
      f.message = "no notice of the failure was recorded; the next placement stands in for it";
    }
    if (const GoodputFault* fault = first_in(in.faults, win.lo, win.noticed + 1e-9,
                                             [](const GoodputFault& x) { return x.time_unix; })) {
      f.fault = fault->fault;
      f.fault_rank = fault->rank;
      f.fault_node = fault->node;
    }
    f.detection_s = t.sum(Cat::kDetection, win.lo, win.hi);
    f.recomputed_s = t.sum(Cat::kRecomputed, win.lo, win.hi);
    f.restore_s = t.sum(Cat::kRestore, win.noticed, win.hi);
    if (g + 1 < n) {
      const GoodputGeneration& next = in.generations[g + 1];
      const double next_first =
          next.first_step_start ? std::clamp(*next.first_step_start, w[g + 1].lo, w[g + 1].hi) : w[g + 1].hi;
      f.restore_s += t.sum(Cat::kRestore, w[g + 1].lo, next_first);
      f.recovered = next.first_step_start.has_value();
    }
    out.failures.push_back(std::move(f));
  }
  return out;
}

YoungDaly young_daly(std::vector<double> stalls_s, int failures, double wall_s,
                     std::optional<double> step_s) {
  YoungDaly y;
  if (step_s && *step_s > 0) y.step_s = step_s;
  std::vector<double> known;
  for (double s : stalls_s)
    if (std::isfinite(s) && s >= 0) known.push_back(s);
  if (!known.empty()) {
    std::sort(known.begin(), known.end());
    const size_t m = known.size() / 2;
    y.checkpoint_cost_s = known.size() % 2 == 1 ? known[m] : 0.5 * (known[m - 1] + known[m]);
  }
  if (failures > 0 && wall_s > 0) y.mtbf_s = wall_s / failures;
  if (!y.checkpoint_cost_s) {
    y.why_unknown = "no checkpoint of this run has a measured stall yet";
  } else if (!y.mtbf_s) {
    y.why_unknown = "no failure observed yet: the failure rate is unknown (no prior is assumed)";
  } else {
    y.interval_s = std::sqrt(2.0 * *y.checkpoint_cost_s * *y.mtbf_s);
    if (y.step_s) y.interval_steps = std::max<int64_t>(1, std::llround(*y.interval_s / *y.step_s));
  }
  return y;
}

}  // namespace gantry
