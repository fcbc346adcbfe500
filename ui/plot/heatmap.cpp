// The rank × step heatmap model, its per-frame grid and the colour ramp: see heatmap.h.
#include "ui/plot/heatmap.h"

#include <algorithm>
#include <array>

namespace gantry::plot {
namespace {

// max ignoring NaN: a missing value never hides a present one.
inline float nan_max(float a, float b) {
  return (std::isnan(a) || b > a) ? b : a;
}

void bucket_merge(float* dst, const float* a, const float* b, int n) {
  if (b == nullptr) {
    std::copy(a, a + n, dst);
    return;
  }
  for (int r = 0; r < n; ++r) dst[r] = nan_max(a[r], b[r]);
}

}  // namespace

HeatmapModel::HeatmapModel(int ranks, int64_t first_step)
    : ranks_(std::max(ranks, 1)), first_step_(first_step) {
  levels_.resize(1);
}

void HeatmapModel::clear() {
  steps_ = 0;
  levels_.assign(1, {});
}

void HeatmapModel::reserve(int64_t steps) {
  for (int k = 0; steps > 0; ++k) {
    const int64_t buckets = (steps + (int64_t{1} << k) - 1) >> k;
    if (static_cast<size_t>(k) < levels_.size())
      levels_[static_cast<size_t>(k)].reserve(static_cast<size_t>(buckets * ranks_));
    if (buckets <= 1) break;
  }
  reserved_steps_ = std::max(reserved_steps_, steps);
}

void HeatmapModel::grow(int64_t steps) {
  if (steps <= steps_) return;
  steps_ = steps;
  // Existing levels gain NaN buckets: correct, since nothing is stored in the new steps yet.
  for (size_t k = 0; k < levels_.size(); ++k) {
    const int64_t buckets = (steps_ + (int64_t{1} << k) - 1) >> k;
    levels_[k].resize(static_cast<size_t>(buckets * ranks_), NAN);
  }
  // Add levels until the top one is a single bucket; each new one is built whole from the one below
  // (it appears only when the step count doubles, so this is amortised O(1) per step).
  while (static_cast<int64_t>(levels_.back().size()) > ranks_) {
    const std::vector<float>& below = levels_.back();
    const int64_t below_buckets = static_cast<int64_t>(below.size()) / ranks_;
    std::vector<float> level;
    const int64_t k = static_cast<int64_t>(levels_.size());
    level.reserve(static_cast<size_t>(((reserved_steps_ + (int64_t{1} << k) - 1) >> k) * ranks_));
    level.resize(static_cast<size_t>((below_buckets + 1) / 2 * ranks_));
    for (int64_t b = 0; b < (below_buckets + 1) / 2; ++b) {
      const float* lo = &below[static_cast<size_t>(2 * b * ranks_)];
      const float* hi = 2 * b + 1 < below_buckets ? lo + ranks_ : nullptr;
      bucket_merge(&level[static_cast<size_t>(b * ranks_)], lo, hi, ranks_);
    }
    levels_.push_back(std::move(level));
  }
}

void HeatmapModel::propagate(int rank, int64_t index) {
  for (size_t k = 1; k < levels_.size(); ++k) {
    const std::vector<float>& below = levels_[k - 1];
    const int64_t b = index >> k;
    const size_t lo = static_cast<size_t>((2 * b) * ranks_ + rank);
    const size_t hi = lo + static_cast<size_t>(ranks_);
    // Recomputed from both children (not max-ed in), so overwriting a cell with a smaller value is right.
    levels_[k][static_cast<size_t>(b * ranks_ + rank)] =
        hi < below.size() ? nan_max(below[lo], below[hi]) : below[lo];
  }
}

bool HeatmapModel::set(int rank, int64_t step, float value) {
  if (rank < 0 || rank >= ranks_ || step < first_step_) return false;
  const int64_t index = step - first_step_;
  grow(index + 1);
  levels_[0][static_cast<size_t>(index * ranks_ + rank)] = value;
  propagate(rank, index);
  return true;
}

bool HeatmapModel::append_step(int64_t step, std::span<const float> values) {
  if (step < first_step_ || values.size() != static_cast<size_t>(ranks_)) return false;
  const int64_t index = step - first_step_;
  grow(index + 1);
  std::copy(values.begin(), values.end(), levels_[0].begin() + index * ranks_);
  // One pass per level over contiguous rows: O(ranks · levels).
  for (size_t k = 1; k < levels_.size(); ++k) {
    const std::vector<float>& below = levels_[k - 1];
    const int64_t b = index >> k;
    const size_t lo = static_cast<size_t>((2 * b) * ranks_);
    const float* hi = lo + static_cast<size_t>(ranks_) < below.size() ? &below[lo + ranks_] : nullptr;
    bucket_merge(&levels_[k][static_cast<size_t>(b * ranks_)], &below[lo], hi, ranks_);
  }
  return true;
}

float HeatmapModel::value(int rank, int64_t step) const {
  return bucket_max(0, rank, step - first_step_);
}

float HeatmapModel::bucket_max(int level, int rank, int64_t bucket) const {
  if (rank < 0 || rank >= ranks_) return NAN;
  const float* row = bucket_row(level, bucket);
  return row == nullptr ? NAN : row[rank];
}

const float* HeatmapModel::bucket_row(int level, int64_t bucket) const {
  if (level < 0 || level >= levels() || bucket < 0) return nullptr;
  const std::vector<float>& l = levels_[static_cast<size_t>(level)];
  if (bucket >= static_cast<int64_t>(l.size()) / ranks_) return nullptr;
  return &l[static_cast<size_t>(bucket * ranks_)];
}

void HeatmapModel::grid(int64_t step_lo, int64_t step_hi, int max_cols, int max_rows,
                        HeatmapGrid& out) const {
  heatmap_grid(*this, step_lo, step_hi, max_cols, max_rows, out);
}

void heatmap_grid(const HeatmapModel& model, int64_t step_lo, int64_t step_hi, int max_cols, int max_rows,
                  HeatmapGrid& out) {
  out.cells.clear();
  out.cols = out.rows = 0;
  out.steps_per_col = 1;
  out.ranks_per_row = 1;
  out.step_origin = model.first_step();
  out.value_min = out.value_max = NAN;
  step_lo = std::max(step_lo, model.first_step());
  step_hi = std::min(step_hi, model.step_end());
  if (step_hi <= step_lo || max_cols < 1 || max_rows < 1) return;

  // The smallest power-of-two cell width whose aligned columns covering [step_lo, step_hi) fit.
  const int64_t lo = step_lo - model.first_step(), hi = step_hi - model.first_step();
  int level = 0;
  int64_t first_bucket = lo, cols = hi - lo;
  while (cols > max_cols) {
    ++level;
    first_bucket = lo >> level;
    cols = ((hi - 1) >> level) - first_bucket + 1;
  }
  const int ranks = model.ranks();
  const int per_row = (ranks + max_rows - 1) / max_rows;
  const int rows = (ranks + per_row - 1) / per_row;
  out.steps_per_col = int64_t{1} << level;
  out.step_origin = model.first_step() + first_bucket * out.steps_per_col;
  out.ranks_per_row = per_row;
  out.cols = static_cast<int>(cols);
  out.rows = rows;
  out.cells.assign(static_cast<size_t>(rows) * static_cast<size_t>(cols), NAN);

  float vmin = INFINITY, vmax = -INFINITY;
  for (int c = 0; c < out.cols; ++c) {
    const float* row = model.bucket_row(level, first_bucket + c);
    if (row == nullptr) continue;
    for (int r = 0; r < rows; ++r) {
      const int r0 = r * per_row, r1 = std::min(ranks, r0 + per_row);
      float m = NAN;
      for (int k = r0; k < r1; ++k) m = nan_max(m, row[k]);
      out.cells[static_cast<size_t>(r) * static_cast<size_t>(cols) + static_cast<size_t>(c)] = m;
      if (!std::isnan(m)) {
        vmin = std::min(vmin, m);
        vmax = std::max(vmax, m);
      }
    }
  }
  if (vmin <= vmax) {
    out.value_min = vmin;
    out.value_max = vmax;
  }
}

// ---- colour ------------------------------------------------------------------------------------------

namespace {

// sRGB transfer function: linear light → encoded 0..255.
uint8_t srgb_encode(double v) {
  v = std::clamp(v, 0.0, 1.0);
  const double e = v <= 0.0031308 ? 12.92 * v : 1.055 * std::pow(v, 1 / 2.4) - 0.055;
  return static_cast<uint8_t>(std::lround(e * 255));
}

uint32_t pack(uint8_t r, uint8_t g, uint8_t b, uint8_t a = 255) {
  return uint32_t{r} | (uint32_t{g} << 8) | (uint32_t{b} << 16) | (uint32_t{a} << 24);
}

// The ramp at t: OKLCh with lightness linear in t (0.22 → 0.94), chroma highest mid-ramp, and hue turning
// from violet (290°) through magenta, red and orange to yellow (100°). Converted OKLab → linear sRGB with
// the colour space's defining matrices. Every colour is inside sRGB, so no channel clips and lightness
// (hence luminance) rises monotonically.
uint32_t ramp_exact(double t) {
  constexpr double kPi = 3.14159265358979323846;
  const double L = 0.22 + 0.72 * t;
  const double C = 0.09 + 0.08 * std::sin(kPi * t);
  const double h = (290 + 170 * t) * kPi / 180;
  const double a = C * std::cos(h), b = C * std::sin(h);
  const double l_ = L + 0.3963377774 * a + 0.2158037573 * b;
  const double m_ = L - 0.1055613458 * a - 0.0638541728 * b;
  const double s_ = L - 0.0894841775 * a - 1.2914855480 * b;
  const double l = l_ * l_ * l_, m = m_ * m_ * m_, s = s_ * s_ * s_;
  return pack(srgb_encode(4.0767416621 * l - 3.3077115913 * m + 0.2309699292 * s),
              srgb_encode(-1.2684380046 * l + 2.6097574011 * m - 0.3413193965 * s),
              srgb_encode(-0.0041960863 * l - 0.7034186147 * m + 1.7076147010 * s));
}

constexpr int kRampSize = 256;

const std::array<uint32_t, kRampSize>& ramp_table() {
  // Built once: the heatmap maps up to a few hundred thousand cells a frame.
  static const std::array<uint32_t, kRampSize> table = [] {
    std::array<uint32_t, kRampSize> t{};
    for (int i = 0; i < kRampSize; ++i) t[static_cast<size_t>(i)] = ramp_exact(i / double(kRampSize - 1));
    return t;
  }();
  return table;
}

}  // namespace

uint32_t colour_missing() {
  return pack(90, 90, 90);
}

uint32_t colour_ramp(double t) {
  if (std::isnan(t)) return colour_missing();
  t = std::clamp(t, 0.0, 1.0);
  return ramp_table()[static_cast<size_t>(std::lround(t * (kRampSize - 1)))];
}

uint32_t colour_scale_map(double min, double max, double value) {
  if (std::isnan(value)) return colour_missing();
  if (!(max > min)) return colour_ramp(0.5);
  return colour_ramp((value - min) / (max - min));
}

}  // namespace gantry::plot
