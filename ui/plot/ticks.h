// "Nice" axis ticks and their compact labels.
//
// Steps are 1, 2 or 5 × 10^k, chosen so that about `target` ticks fall in the range; tick values are
// whole multiples of the step, so they read as round numbers (0, 0.25 is never chosen; 0, 0.2, 0.4 is).
// Labels are short: SI suffixes for large values (1.2k, 3M, 4.5G), as many decimals as the step needs for
// small ones (0.05, 0.10, 0.15), and an exponent where decimals would run long (2.5e-06).
//
//   std::vector<Tick> t = ticks_nice(0.0, 1234.0, 5);   // 0, 200, ..., 1.2k
//   for (const Tick& k : t) draw(k.value, k.label);
//   std::string s = format_value(0.0123456);              // "0.01235": hover readouts, 4 significant
#pragma once

#include <string>
#include <vector>

namespace gantry::plot {

struct Tick {
  double value = 0;
  std::string label;
};

// The 1/2/5 × 10^k step giving about `target` intervals across `span` (> 0). target < 1 counts as 1.
double ticks_step(double span, int target);

// Ticks at every multiple of ticks_step(hi − lo, target) in [lo, hi], labelled with tick_label.
// Empty when the range is empty or not finite. A zero-width range (lo == hi) gives the one tick lo.
std::vector<Tick> ticks_nice(double lo, double hi, int target);

// Ticks for a quantity that is a whole number (steps, ranks): as ticks_nice, with a step of at least 1, so
// every tick is an integer and its label has no decimals ("3", never "3.0" or "2.5"). Empty when the range
// holds no integer.
std::vector<Tick> ticks_integer(double lo, double hi, int target);

// Label for a tick value on an axis with this step: as few characters as keep neighbouring ticks distinct.
// Below 1e3 every label of an axis has the same decimals (0.05, 0.10); from 1e3 an SI suffix (k, M, G, T,
// P) with trailing zeros dropped (1k, 1.2k); an exponent when the step is below 1e-4 or the value is 1e18
// or more.
std::string tick_label(double value, double step);

// A value for reading (hover, legends): `significant` digits (trailing zeros dropped), SI suffix from 1e3
// up, exponent below 1e-4. NaN reads "n/a" (absent: ImGui's default font has ASCII only), infinities
// "inf" / "-inf".
std::string format_value(double value, int significant = 4);

}  // namespace gantry::plot
