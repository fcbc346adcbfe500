#include "telemetry/straggler.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <nlohmann/json.hpp>  // the straggler event's payload

namespace gantry {
namespace {

// Median of v (reordered in place); the mean of the middle two for an even count.
double median_of(float* v, size_t n) {
  if (n == 0) return 0;
  float* mid = v + n / 2;
  std::nth_element(v, mid, v + n);
  const double hi = *mid;
  if (n % 2) return hi;
  const double lo = *std::max_element(v, mid);
  return 0.5 * (lo + hi);
}

double median_of(std::vector<double>& v) {
  if (v.empty()) return 0;
  auto mid = v.begin() + static_cast<std::ptrdiff_t>(v.size() / 2);
  std::nth_element(v.begin(), mid, v.end());
  const double hi = *mid;
  if (v.size() % 2) return hi;
  return 0.5 * (*std::max_element(v.begin(), mid) + hi);
}

// The phase whose median exceeds the reference by the most; excess ≤ 0 when none does.
void slowest_phase(const PhaseSeconds& rank, const PhaseSeconds& ref, Phase* phase, double* excess) {
  *phase = Phase::forward;
  *excess = -INFINITY;
  for (int p = 0; p < kPhaseCount; ++p) {
    const double e = rank.get(static_cast<Phase>(p)) - ref.get(static_cast<Phase>(p));
    if (e > *excess) {
      *excess = e;
      *phase = static_cast<Phase>(p);
    }
  }
}

}  // namespace

std::string straggler_options_check(const StragglerOptions& o) {
  if (o.window_steps < 1)
    return "straggler.window_steps must be at least 1, got " + std::to_string(o.window_steps);
  if (o.min_samples < 1 || o.min_samples > o.window_steps) {
    return "straggler.min_samples must be in 1.." + std::to_string(o.window_steps) + ", got " +
           std::to_string(o.min_samples);
  }
  if (!(o.relative_threshold >= 0 && o.relative_threshold <= 1)) {
    return "straggler.relative_threshold must be in 0..1, got " + std::to_string(o.relative_threshold);
  }
  if (!(o.individual_threshold >= 0 && o.individual_threshold <= 1)) {
    return "straggler.individual_threshold must be in 0..1, got " + std::to_string(o.individual_threshold);
  }
  if (o.windows_to_flag < 1) {
    return "straggler.windows_to_flag must be at least 1, got " + std::to_string(o.windows_to_flag);
  }
  return "";
}

const StragglerScore* StragglerReport::find(int32_t rank) const {
  auto it = std::lower_bound(scores.begin(), scores.end(), rank,
                             [](const StragglerScore& s, int32_t r) { return s.rank < r; });
  return it != scores.end() && it->rank == rank ? &*it : nullptr;
}

StragglerScorer::StragglerScorer(StragglerOptions options) : o_(options) {
  o_.window_steps = std::max(1, o_.window_steps);
  o_.min_samples = std::clamp(o_.min_samples, 1, o_.window_steps);
  o_.windows_to_flag = std::max(1, o_.windows_to_flag);
  o_.relative_threshold = std::isnan(o_.relative_threshold) ? 0 : std::clamp(o_.relative_threshold, 0.0, 1.0);
  o_.individual_threshold =
      std::isnan(o_.individual_threshold) ? 0 : std::clamp(o_.individual_threshold, 0.0, 1.0);
}

bool StragglerScorer::add(const RankStepRecord& r) {
  const double basis = o_.basis == StragglerBasis::busy ? r.total_s - r.phases.comm_exposed : r.total_s;
  if (r.rank < 0 || !std::isfinite(basis)) return false;
  if (static_cast<size_t>(r.rank) >= ranks_.size()) ranks_.resize(static_cast<size_t>(r.rank) + 1);
  RankState& s = ranks_[static_cast<size_t>(r.rank)];
  const size_t w = static_cast<size_t>(o_.window_steps);
  if (s.basis.empty()) {
    s.basis.resize(w);
    s.phases.resize(w * kPhaseCount);
  }
  const size_t at = static_cast<size_t>(s.next);
  s.basis[at] = static_cast<float>(basis);
  for (int p = 0; p < kPhaseCount; ++p) {
    s.phases[at * kPhaseCount + static_cast<size_t>(p)] =
        static_cast<float>(r.phases.get(static_cast<Phase>(p)));
  }
  s.next = (s.next + 1) % o_.window_steps;
  s.count = std::min(s.count + 1, o_.window_steps);
  return true;
}

void StragglerScorer::reset_rank(int32_t rank) {
  if (rank >= 0 && static_cast<size_t>(rank) < ranks_.size()) ranks_[static_cast<size_t>(rank)] = RankState();
}

StragglerReport StragglerScorer::evaluate() {
  StragglerReport rep;
  rep.evaluation = ++evaluations_;

  // Pass 1: each scored rank's medians; the fastest rank.
  for (size_t rank = 0; rank < ranks_.size(); ++rank) {
    RankState& s = ranks_[rank];
    if (s.count < o_.min_samples) continue;
    const size_t n = static_cast<size_t>(s.count);  // the ring's first `count` slots hold the window
    StragglerScore sc;
    sc.rank = static_cast<int32_t>(rank);
    sc.samples = s.count;
    scratch_.assign(s.basis.begin(), s.basis.begin() + static_cast<std::ptrdiff_t>(n));
    sc.median_s = median_of(scratch_.data(), n);
    for (int p = 0; p < kPhaseCount; ++p) {
      scratch_.resize(n);
      for (size_t i = 0; i < n; ++i) scratch_[i] = s.phases[i * kPhaseCount + static_cast<size_t>(p)];
      sc.phase_median_s.at(static_cast<Phase>(p)) = median_of(scratch_.data(), n);
    }
    if (rep.fastest_rank < 0 || sc.median_s < rep.fastest_median_s) {
      rep.fastest_rank = sc.rank;
      rep.fastest_median_s = sc.median_s;
    }
    rep.scores.push_back(sc);
  }

  // The typical rank per phase: the median across ranks is not moved by the stragglers themselves.
  std::vector<double> across;
  across.reserve(rep.scores.size());
  for (int p = 0; p < kPhaseCount; ++p) {
    across.clear();
    for (const StragglerScore& sc : rep.scores)
      across.push_back(sc.phase_median_s.get(static_cast<Phase>(p)));
    rep.phase_reference_s.at(static_cast<Phase>(p)) = median_of(across);
  }
  across.clear();
  for (const StragglerScore& sc : rep.scores) across.push_back(sc.median_s);
  rep.reference_median_s = median_of(across);

  // Pass 2: scores, streaks, flags, slow phase.
  for (StragglerScore& sc : rep.scores) {
    RankState& s = ranks_[static_cast<size_t>(sc.rank)];
    // A zero median (an idle rank, or a test) is as fast as can be: score 1 rather than divide by zero.
    sc.excess_s = sc.median_s - rep.reference_median_s;
    sc.relative = sc.median_s > 0 ? std::min(1.0, rep.fastest_median_s / sc.median_s) : 1.0;
    if (s.best_median <= 0 || sc.median_s < s.best_median) {
      s.best_median = sc.median_s;
      s.best_phases = sc.phase_median_s;
    }
    sc.individual = sc.median_s > 0 ? std::min(1.0, s.best_median / sc.median_s) : 1.0;
    s.relative_windows = sc.relative < o_.relative_threshold ? s.relative_windows + 1 : 0;
    s.individual_windows = sc.individual < o_.individual_threshold ? s.individual_windows + 1 : 0;
    sc.relative_windows = s.relative_windows;
    sc.individual_windows = s.individual_windows;
    sc.flagged = s.relative_windows >= o_.windows_to_flag || s.individual_windows >= o_.windows_to_flag;

    slowest_phase(sc.phase_median_s, rep.phase_reference_s, &sc.slow_phase, &sc.slow_phase_excess_s);
    if (sc.slow_phase_excess_s <= 0 && s.best_median > 0) {
      // Slower than it was but not than the others (the whole job slowed): compare with its own best.
      slowest_phase(sc.phase_median_s, s.best_phases, &sc.slow_phase, &sc.slow_phase_excess_s);
      sc.slow_phase_vs_self = true;
    }
    if (sc.flagged) rep.flagged.push_back(sc.rank);
  }
  return rep;
}

std::string straggler_excess_text(std::string_view phase, double excess_s) {
  if (!(excess_s > 0) || phase.empty()) return "-";
  char buf[48];
  if (excess_s >= 0.1)
    std::snprintf(buf, sizeof buf, " +%.2f s", excess_s);
  else
    std::snprintf(buf, sizeof buf, " +%.1f ms", excess_s * 1e3);
  return std::string(phase) + buf;
}

EventRecord straggler_event(const StragglerReport& report, int32_t rank, int64_t run_id, double time_unix_s,
                            int64_t step) {
  EventRecord e;
  e.run_id = run_id;
  e.time_unix_s = time_unix_s;
  e.step = step;
  e.kind = "straggler";
  e.rank = rank;
  const StragglerScore* sc = report.find(rank);
  if (!sc) {
    e.message = "rank " + std::to_string(rank) + " was not scored";
    return e;
  }
  char buf[256];
  std::snprintf(
      buf, sizeof buf,
      "rank %d slow: relative %.3f, individual %.3f, median %.4f s; slow phase %.*s (+%.4f s vs %s)", rank,
      sc->relative, sc->individual, sc->median_s, static_cast<int>(phase_name(sc->slow_phase).size()),
      phase_name(sc->slow_phase).data(), sc->slow_phase_excess_s,
      sc->slow_phase_vs_self ? "its best window" : "the median rank");
  e.message = buf;
  const nlohmann::json payload = {{"relative", sc->relative},
                                  {"individual", sc->individual},
                                  {"median_s", sc->median_s},
                                  {"fastest_rank", report.fastest_rank},
                                  {"fastest_median_s", report.fastest_median_s},
                                  {"slow_phase", phase_name(sc->slow_phase)},
                                  {"slow_phase_excess_s", sc->slow_phase_excess_s},
                                  {"slow_phase_reference", sc->slow_phase_vs_self ? "self" : "ranks"},
                                  {"relative_windows", sc->relative_windows},
                                  {"individual_windows", sc->individual_windows}};
  e.payload = payload.dump();
  return e;
}

}  // namespace gantry
