// Run comparison's arithmetic (issue 21), apart from the model and the panel so it can be tested alone:
// TensorBoard's debiased exponential moving average, the log scale's transform, and linking two plots' x
// ranges (zoom and pan in one moves the other).
//
//   std::vector<double> s = ema_smooth(values, 0.6);   // the slider's weight, 0 = none
//   std::vector<double> l = log10_values(values);      // <= 0 and NaN: NaN (a gap)
//   if (changed_a) link_x(view_a, view_b);             // after drawing both plots
#pragma once

#include <span>
#include <vector>

namespace gantry::plot {
struct PlotView;
}

namespace gantry::history {

// TensorBoard's smoothing: last = last·w + (1 − w)·y over the finite values in order, divided by the
// debias factor 1 − w^n (n = finite values so far), so the start is not pulled towards 0. A NaN or infinite
// value is passed through as it is and does not move the average. w is clamped to [0, 0.999]; w = 0 gives
// the values back.
std::vector<double> ema_smooth(std::span<const double> y, double weight);

// log10 of each value; a value <= 0 or NaN has no logarithm and becomes NaN (a gap, never a clamp).
std::vector<double> log10_values(std::span<const double> y);

// Makes `to` show the x range `from` shows (its fit and follow modes too): the linked zoom.
void link_x(const plot::PlotView& from, plot::PlotView& to);

}  // namespace gantry::history
