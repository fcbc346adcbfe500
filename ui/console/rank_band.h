// The min / median / max band of the rank grid's metric across ranks, one point per step, built on the
// network thread as rows arrive (DataSource) and published with the snapshot, so the Run panel draws it
// without computing it. Rows whose every rank has reported are final and never computed again; the rows
// after them are recomputed as late cells fill in. The excess view (each rank over the step's median) has
// its band beside: min and max minus the median (its median is 0).
//
//   RankBand band;
//   grid.add(records);
//   band.update(grid, world);      // O(ranks) per row not final yet
#pragma once

#include <cstddef>
#include <vector>

#include "ui/console/step_log.h"

namespace gantry::console {

struct RankBand {
  std::vector<double> step, min, median, max;        // per grid row; NaN where no rank has reported
  std::vector<double> excess_min, excess_max, zero;  // the excess view's band (zero: its median)
  size_t final_rows = 0;                             // rows complete for `world` ranks when last updated

  // Brings the band up to the grid: rows from final_rows on are (re)computed. A grid that lost rows (a
  // rewind) or another grid (another first step) starts it over.
  void update(const RankStepGrid& grid, int world);
  size_t size() const { return step.size(); }

 private:
  int64_t first_step_ = -1;
};

}  // namespace gantry::console
