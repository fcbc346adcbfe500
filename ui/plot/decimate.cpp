// Min/max-per-pixel decimation: see decimate.h.
#include "ui/plot/decimate.h"

#include <algorithm>
#include <cmath>

namespace gantry::plot {

size_t decimate_lower_bound(std::span<const double> x, double v) {
  return static_cast<size_t>(std::lower_bound(x.begin(), x.end(), v) - x.begin());
}

void decimate(std::span<const double> x, std::span<const double> y, double x0, double x1, int width,
              Decimation& out, bool allow_raw) {
  out.columns.clear();
  out.begin = out.end = 0;
  out.raw = true;
  out.left = out.right = EdgePoint{};
  out.has_y = false;
  out.y_min = out.y_max = 0;
  if (width < 1 || !std::isfinite(x0) || !std::isfinite(x1) || !(x1 > x0)) return;

  const size_t n = std::min(x.size(), y.size());
  x = x.first(n);
  y = y.first(n);
  const size_t begin = decimate_lower_bound(x, x0);
  const size_t end = static_cast<size_t>(std::upper_bound(x.begin() + begin, x.end(), x1) - x.begin());
  out.begin = begin;
  out.end = end;
  if (begin > 0 && !std::isnan(y[begin - 1])) out.left = {x[begin - 1], y[begin - 1], true};

  // Whether the line arrives at the next non-NaN point: from `left`, then from each non-NaN point, and
  // broken by every NaN.
  bool reaching = out.left.valid;
  double lo = INFINITY, hi = -INFINITY;

  if (allow_raw && end - begin <= static_cast<size_t>(width)) {
    for (size_t i = begin; i < end; ++i) {
      const double v = y[i];
      if (std::isnan(v)) {
        reaching = false;
        continue;
      }
      lo = std::min(lo, v);
      hi = std::max(hi, v);
      reaching = true;
    }
  } else {
    out.raw = false;
    out.columns.assign(static_cast<size_t>(width), DecimatedColumn{});
    DecimatedColumn* cols = out.columns.data();
    const double scale = width / (x1 - x0);
    const double last_col = width - 1;
    // decimate_column, with the scale hoisted: x is within [x0, x1] here, so the result is ≥ 0.
    auto column_of = [&](double xv) { return static_cast<int>(std::min((xv - x0) * scale, last_col)); };
    // x ascends, so each column's points are one run [i, j): find its end by galloping search, then take
    // min and max over y alone, in a loop with no per-point column arithmetic and four independent
    // accumulators (min and max are ~4-cycle dependency chains otherwise). NaN never wins a comparison, so
    // it leaves the accumulators alone; a column holding NaN takes the slower exact path for its edges.
    size_t i = begin;
    while (i < end) {
      const int c = column_of(x[i]);
      // The run ends at the first index past column c, which lies in [a, b]: everything before a is in c.
      size_t step = 1, a = i + 1, b = i + 1;
      while (b < end && column_of(x[b]) <= c) {
        a = b + 1;
        b = std::min(end, b + step);
        step *= 2;
      }
      const auto first_past = std::partition_point(x.begin() + static_cast<std::ptrdiff_t>(a),
                                                   x.begin() + static_cast<std::ptrdiff_t>(b),
                                                   [&](double xv) { return column_of(xv) <= c; });
      const size_t j = static_cast<size_t>(first_past - x.begin());

      double mn[4] = {INFINITY, INFINITY, INFINITY, INFINITY};
      double mx[4] = {-INFINITY, -INFINITY, -INFINITY, -INFINITY};
      size_t nans = 0, k = i;
      for (; k + 4 <= j; k += 4) {
        for (int u = 0; u < 4; ++u) {
          const double v = y[k + u];
          mn[u] = v < mn[u] ? v : mn[u];
          mx[u] = v > mx[u] ? v : mx[u];
          nans += v != v;
        }
      }
      for (; k < j; ++k) {
        const double v = y[k];
        mn[0] = v < mn[0] ? v : mn[0];
        mx[0] = v > mx[0] ? v : mx[0];
        nans += v != v;
      }
      DecimatedColumn& col = cols[c];
      if (nans == j - i) {  // all NaN: the column stays empty, and the line is broken
        reaching = false;
        i = j;
        continue;
      }
      col.has_data = true;
      col.y_min = std::min(std::min(mn[0], mn[1]), std::min(mn[2], mn[3]));
      col.y_max = std::max(std::max(mx[0], mx[1]), std::max(mx[2], mx[3]));
      if (nans == 0) {
        col.y_first = y[i];
        col.y_last = y[j - 1];
        col.joins_previous = reaching;
        reaching = true;
      } else {
        bool first = true;
        for (k = i; k < j; ++k) {
          const double v = y[k];
          if (std::isnan(v)) {
            reaching = false;
            continue;
          }
          if (first) {
            col.y_first = v;
            col.joins_previous = reaching;
            first = false;
          }
          col.y_last = v;
          reaching = true;
        }
      }
      i = j;
    }
    for (const DecimatedColumn& col : out.columns) {
      if (!col.has_data) continue;
      lo = std::min(lo, col.y_min);
      hi = std::max(hi, col.y_max);
    }
  }
  if (lo <= hi) {
    out.has_y = true;
    out.y_min = lo;
    out.y_max = hi;
  }
  if (end < n && !std::isnan(y[end]) && reaching) out.right = {x[end], y[end], true};
}

}  // namespace gantry::plot
