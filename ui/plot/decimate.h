// Min/max-per-pixel decimation of one line series, so a plot of a million points draws O(width)
// vertices and still shows every spike.
//
// The visible x range [x0, x1] is split into `width` equal columns (one per pixel). Each column keeps
// the minimum and maximum y of its points — exactly, so no spike is ever lost — and the first and last
// y, so the line entering and leaving the column joins its neighbours where the data does. NaN in y is
// a gap: it breaks the line between the points around it but erases nothing else in its column.
// When the visible range holds no more points than there are columns, drawing the raw points is both
// cheaper and exact: `decimate` then says so (`raw`) and produces no columns.
//
//   Decimation d;                                        // reuse across frames: no allocation
//   decimate(x, y, view.x_min, view.x_max, 800, d);       // O(log n + visible points)
//   if (d.raw) { draw points [d.begin, d.end) }           // with NaN breaks
//   else for (int c = 0; c < 800; ++c) if (d.columns[c].has_data) { ... }
//
// x must be ascending (equal values allowed); it is never NaN.
#pragma once

#include <cstddef>
#include <span>
#include <vector>

namespace gantry::plot {

// One pixel column of a decimated series. The y fields are meaningful only when has_data.
struct DecimatedColumn {
  double y_min = 0;    // smallest non-NaN y of the column's points
  double y_max = 0;    // largest
  double y_first = 0;  // y of the column's first non-NaN point (where the line enters)
  double y_last = 0;   // y of its last non-NaN point (where the line leaves)
  bool has_data = false;
  // The line reaches this column's first point from the previous non-NaN point (in an earlier column,
  // or the point just left of x0): true when that point exists and no NaN lies between the two.
  bool joins_previous = false;
};

// The point just outside the visible range on one side, so the line runs on to the plot's edge.
struct EdgePoint {
  double x = 0, y = 0;
  // left: the point before the range exists and is not NaN (whether the line reaches the first visible
  // point from it is that column's joins_previous). right: the point after the range exists, is not NaN
  // and the line reaches it from the last non-NaN point before it (visible, or `left`) with no NaN between.
  bool valid = false;
};

struct Decimation {
  // Index range of the points with x in [x0, x1] (binary search over x).
  size_t begin = 0, end = 0;
  // true: the visible points fit in the width; draw [begin, end) as they are, and `columns` is empty.
  bool raw = false;
  std::vector<DecimatedColumn> columns;  // `width` entries when !raw
  // The neighbours of the visible range, for the line segments that leave the plot.
  EdgePoint left, right;
  // Extremes of the non-NaN y in [x0, x1] (for fitting the y axis); has_y false when there are none.
  double y_min = 0, y_max = 0;
  bool has_y = false;
};

// Index of the first point with x >= v (x ascending).
size_t decimate_lower_bound(std::span<const double> x, double v);

// The column of a point at x: floor((x − x0) · (width / (x1 − x0))), clamped to [0, width − 1] (so the point
// at x1 falls in the last column). Column c thus covers about [x0 + c·dx, x0 + (c+1)·dx), dx = (x1 −
// x0)/width.
inline int decimate_column(double x, double x0, double x1, int width) {
  const double c = (x - x0) * (width / (x1 - x0));
  if (!(c >= 0)) return 0;
  if (c >= width - 1) return width - 1;
  return static_cast<int>(c);
}

// Decimates points with x in [x0, x1] into `width` columns, or marks the range raw when it holds at most
// `width` points and allow_raw is true. A point's column is decimate_column(x, x0, x1, width). Only the
// first min(x.size(), y.size()) points count. width < 1, x1 <= x0 or a non-finite bound gives a raw result
// with begin == end (nothing to draw). O(log n) to find the range plus O(visible points + width).
void decimate(std::span<const double> x, std::span<const double> y, double x0, double x1, int width,
              Decimation& out, bool allow_raw = true);

}  // namespace gantry::plot
