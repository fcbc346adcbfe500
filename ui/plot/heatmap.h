// The rank × step heatmap model behind the console's per-rank step-time view, and its colour scale.
//
// Values arrive one (rank, step) at a time or one step (all ranks) at a time. The model keeps every value
// and, beside it, a pyramid of maxima over 2, 4, 8, … steps, so a frame can show any step range at any
// zoom by reading one stored maximum per cell: cells are power-of-two runs of steps aligned to the first
// step (so cells do not shift as a live run scrolls), and when there are more ranks than rows, runs of
// ranks too. A cell keeps its bucket's MAXIMUM, so one straggler's slow step still colours its cell.
// Cells with no value are NaN, drawn in their own colour, never as the scale's minimum; a cell spanning
// several ranks or steps is missing only when all of them are (the maximum ignores NaN).
//
//   HeatmapModel m(1024);                        // ranks 0..1023, steps from 0
//   m.append_step(step, step_time_by_rank);      // O(ranks · log steps): every step, live
//   m.set(rank, step, seconds);                  // or one cell at a time: O(log steps)
//   HeatmapGrid g;                               // reuse across frames
//   heatmap_grid(m, 0, m.step_end(), 800, 300, g);  // ≤ 800 columns, ≤ 300 rows
//   uint32_t rgba = colour_scale_map(g.value_min, g.value_max, g.at(row, col));  // auto range
//
// Memory: 2 × 4 bytes per (rank, step) — 1,024 ranks × 100,000 steps is ~0.8 GB; each level is one flat
// array laid out [step bucket][rank], so appending a step writes contiguous memory. Loading that much at
// once is bound by first touching the memory (see docs/PLOT.md); reserve() first to avoid regrowth.
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

namespace gantry::plot {

struct HeatmapGrid;

// What the heatmap widget draws from: a rank count, a step range and, per frame, a grid of cells for the
// range in view at no more than the cells that fit. HeatmapModel below keeps every value itself; the
// console's source is the coordinator's tile answers (ui/console/run_panel.cpp).
class HeatmapSource {
 public:
  virtual ~HeatmapSource() = default;
  virtual int ranks() const = 0;
  virtual int64_t first_step() const = 0;
  virtual int64_t step_end() const = 0;  // one past the newest step
  // Fills `out` for [step_lo, step_hi) with at most about max_cols × max_rows cells (see heatmap_grid).
  virtual void grid(int64_t step_lo, int64_t step_hi, int max_cols, int max_rows, HeatmapGrid& out) const = 0;
};

class HeatmapModel final : public HeatmapSource {
 public:
  // `ranks` rows (≥ 1); steps below first_step are refused.
  explicit HeatmapModel(int ranks, int64_t first_step = 0);

  // Sizes storage for steps [first_step, first_step + steps) at once, so a bulk load (a catch-up, a run
  // opened from history) neither reallocates nor copies as it grows. Optional: appends grow geometrically.
  void reserve(int64_t steps);

  // Stores one value (NaN clears the cell to missing). Writing a cell twice keeps the latest value.
  // Returns false (and stores nothing) for a rank out of range or a step below first_step.
  bool set(int rank, int64_t step, float value);
  // Stores one step for all ranks at once: values[r] for rank r; values.size() must equal ranks().
  bool append_step(int64_t step, std::span<const float> values);

  int ranks() const override { return ranks_; }
  int64_t first_step() const override { return first_step_; }
  // One past the highest step stored so far (first_step when empty).
  int64_t step_end() const override { return first_step_ + steps_; }
  void grid(int64_t step_lo, int64_t step_hi, int max_cols, int max_rows, HeatmapGrid& out) const override;
  // The stored value, NaN when missing or out of range.
  float value(int rank, int64_t step) const;
  // Maximum over steps [first_step + b·2^level, first_step + (b+1)·2^level) of one rank; NaN if none.
  float bucket_max(int level, int rank, int64_t bucket) const;
  // The maxima of all ranks for one bucket of one level (ranks() floats), nullptr when out of range.
  const float* bucket_row(int level, int64_t bucket) const;
  int levels() const { return static_cast<int>(levels_.size()); }
  // Forgets every value; ranks and first_step stay.
  void clear();

 private:
  void grow(int64_t steps);
  void propagate(int rank, int64_t index);

  int ranks_;
  int64_t first_step_;
  int64_t steps_ = 0;           // steps covered (highest index + 1)
  int64_t reserved_steps_ = 0;  // levels created later reserve for this many steps too
  // levels_[k][(index >> k) * ranks_ + rank] = max over 2^k steps; level 0 holds the values themselves.
  std::vector<std::vector<float>> levels_;
};

// What one frame shows: rows × cols cells of bucket maxima over the requested step range.
struct HeatmapGrid {
  int64_t step_origin = 0;    // first step of column 0 (aligned to a multiple of steps_per_col)
  int64_t steps_per_col = 1;  // a power of two
  int ranks_per_row = 1;      // row r covers ranks [r·ranks_per_row, (r+1)·ranks_per_row) ∩ [0, ranks)
  int cols = 0, rows = 0;
  std::vector<float> cells;                // [row * cols + col]; NaN = no value in the cell
  float value_min = NAN, value_max = NAN;  // extremes of the non-NaN cells (NaN when all are missing)

  float at(int row, int col) const { return cells[static_cast<size_t>(row) * cols + col]; }
  int64_t col_step_begin(int col) const { return step_origin + col * steps_per_col; }
  int row_rank_begin(int row) const { return row * ranks_per_row; }
};

// Fills `out` for steps [step_lo, step_hi) (clamped to the model's steps) with at most max_cols columns
// and max_rows rows: steps_per_col is the smallest power of two that fits, ranks_per_row the smallest
// integer. Columns are aligned to first_step, so the first and last may reach outside [step_lo, step_hi).
// Cost O(rows · cols · ranks_per_row), independent of how many steps each cell spans.
void heatmap_grid(const HeatmapModel& model, int64_t step_lo, int64_t step_hi, int max_cols, int max_rows,
                  HeatmapGrid& out);

// Colours: a ramp of our own from dark violet through magenta and orange to pale yellow, whose lightness
// rises evenly (it is built in OKLCh with lightness linear in t), so equal value steps look equal and the
// largest values stand out brightest. Colours are packed as ImGui's IM_COL32 (R in the low byte, A high).
uint32_t colour_ramp(double t);  // t in [0, 1]; clamped; NaN gives colour_missing()
uint32_t colour_missing();       // a neutral mid grey: no hue, so it reads apart from every ramp colour

struct ColourScale {
  bool auto_range = true;   // true: min and max follow the visible cells each frame
  double min = 0, max = 1;  // the fixed range when !auto_range (the widget writes the auto range here too)
};

// Maps value to a colour: t = (value − min) / (max − min), clamped; NaN → colour_missing(). A zero-width
// range maps every value to the middle of the ramp.
uint32_t colour_scale_map(double min, double max, double value);

}  // namespace gantry::plot
