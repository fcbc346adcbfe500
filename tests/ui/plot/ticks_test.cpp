// Axis ticks are round numbers (1/2/5 × 10^k apart) that cover the range, and read compactly.
#include "ui/plot/ticks.h"

#include <gtest/gtest.h>

#include <cmath>

namespace gantry::plot {
namespace {

// m × 10^k with m in {1, 2, 5}.
bool is_nice_step(double step) {
  const double k = std::floor(std::log10(step) + 1e-9);
  const double m = step / std::pow(10.0, k);
  return std::fabs(m - 1) < 1e-9 || std::fabs(m - 2) < 1e-9 || std::fabs(m - 5) < 1e-9;
}

TEST(Ticks, StepsAreNiceAndGiveAboutTheTargetCount) {
  for (double span : {1e-7, 3e-3, 0.7, 1.0, 7.3, 42.0, 999.0, 1234.5, 8.8e6, 3e12}) {
    for (int target : {2, 5, 8, 12}) {
      const double step = ticks_step(span, target);
      EXPECT_TRUE(is_nice_step(step)) << span << " " << target << " -> " << step;
      const double intervals = span / step;
      EXPECT_LE(intervals, target + 1e-9) << span << " " << target;
      EXPECT_GT(intervals, target / 5.0) << span << " " << target;  // 1→2→5→10: at worst 2.5× off
    }
  }
  EXPECT_EQ(ticks_step(10, 5), 2);
  EXPECT_EQ(ticks_step(100, 10), 10);
  EXPECT_DOUBLE_EQ(ticks_step(1, 4), 0.5);
}

TEST(Ticks, TicksAreMultiplesOfTheStepAndCoverTheRange) {
  const struct {
    double lo, hi;
  } ranges[] = {{0, 1}, {-3.7, 12.2}, {0.001, 0.0042}, {1e5, 1.7e5}, {-1e9, -2e8}, {0.3, 0.6}, {99, 101}};
  for (const auto& r : ranges) {
    const std::vector<Tick> t = ticks_nice(r.lo, r.hi, 6);
    ASSERT_GE(t.size(), 2u) << r.lo << ".." << r.hi;
    const double step = t[1].value - t[0].value;
    const double slack = step * 1e-6;
    for (size_t i = 0; i < t.size(); ++i) {
      EXPECT_GE(t[i].value, r.lo - slack);
      EXPECT_LE(t[i].value, r.hi + slack);
      const double k = t[i].value / step;
      EXPECT_NEAR(k, std::round(k), 1e-6) << "tick " << t[i].value << " is not a multiple of " << step;
      if (i > 0) {
        EXPECT_NEAR(t[i].value - t[i - 1].value, step, slack);
      }
    }
    // Covering: no gap wider than one step at either end.
    EXPECT_LE(t.front().value - r.lo, step + slack);
    EXPECT_LE(r.hi - t.back().value, step + slack);
  }
  // Exact ends are kept despite floating-point division (0.3 / 0.1 is not 3).
  const std::vector<Tick> t = ticks_nice(0.3, 0.6, 3);
  ASSERT_FALSE(t.empty());
  EXPECT_EQ(t.front().label, "0.3");
  EXPECT_EQ(t.back().label, "0.6");
}

TEST(Ticks, DegenerateRanges) {
  EXPECT_TRUE(ticks_nice(1, 0, 5).empty());
  EXPECT_TRUE(ticks_nice(NAN, 1, 5).empty());
  EXPECT_TRUE(ticks_nice(0, INFINITY, 5).empty());
  const std::vector<Tick> one = ticks_nice(2.5, 2.5, 5);
  ASSERT_EQ(one.size(), 1u);
  EXPECT_EQ(one[0].value, 2.5);
}

TEST(Ticks, ZeroIsExactlyZero) {
  const std::vector<Tick> t = ticks_nice(-0.3, 0.3, 6);
  bool saw_zero = false;
  for (const Tick& k : t) {
    if (k.label == "0") {
      saw_zero = true;
      EXPECT_EQ(k.value, 0.0);
      EXPECT_FALSE(std::signbit(k.value));
    }
    EXPECT_NE(k.label, "-0.0");
    EXPECT_NE(k.label, "-0");
  }
  EXPECT_TRUE(saw_zero);
}

TEST(Ticks, LabelsAreCompact) {
  EXPECT_EQ(tick_label(1200, 200), "1.2k");
  EXPECT_EQ(tick_label(1000, 200), "1k");
  EXPECT_EQ(tick_label(800, 200), "800");
  EXPECT_EQ(tick_label(3e6, 1e6), "3M");
  EXPECT_EQ(tick_label(2.5e9, 5e8), "2.5G");
  EXPECT_EQ(tick_label(-4e12, 1e12), "-4T");
  EXPECT_EQ(tick_label(0.15, 0.05), "0.15");
  EXPECT_EQ(tick_label(0.1, 0.05), "0.10");  // same decimals as its neighbours
  EXPECT_EQ(tick_label(3, 1), "3");
  EXPECT_EQ(tick_label(2.5e-6, 5e-7), "2.5e-06");
  EXPECT_EQ(tick_label(0, 0.1), "0");
  // Neighbouring labels always differ.
  for (double lo : {0.0, 0.001, 7.0, 1e3, 12345.0, 1e6, 3.3e9}) {
    for (double span : {1e-5, 0.01, 1.0, 77.0, 1e4, 5e6}) {
      const std::vector<Tick> t = ticks_nice(lo, lo + span, 7);
      for (size_t i = 1; i < t.size(); ++i) EXPECT_NE(t[i].label, t[i - 1].label) << lo << " + " << span;
    }
  }
}

// Ranks and steps are whole numbers: 4 ranks on a tall axis gave ticks every 0.5 and, once the halves were
// dropped, labels "1.0", "2.0". Integer ticks step by at least 1 and carry no decimals.
TEST(Ticks, IntegerAxesHaveWholeTicksWithoutDecimals) {
  const std::vector<Tick> nice = ticks_nice(0, 3, 10);
  ASSERT_GT(nice.size(), 4u);  // the old rank axis: halves
  EXPECT_EQ(nice[2].label, "1.0");
  const std::vector<Tick> ranks = ticks_integer(0, 3, 10);
  ASSERT_EQ(ranks.size(), 4u);
  for (size_t i = 0; i < ranks.size(); ++i) {
    EXPECT_EQ(ranks[i].value, static_cast<double>(i));
    EXPECT_EQ(ranks[i].label, std::to_string(i));
  }
  const std::vector<Tick> steps = ticks_integer(1, 1000, 5);
  ASSERT_FALSE(steps.empty());
  EXPECT_EQ(steps[0].label, "200");  // 200, 400, ..., 1k
  for (const Tick& t : ticks_integer(2.3, 7.9, 20)) {
    EXPECT_EQ(t.value, std::floor(t.value));
    EXPECT_EQ(t.label.find('.'), std::string::npos) << t.label;
  }
  ASSERT_EQ(ticks_integer(5, 5, 3).size(), 1u);     // one rank: one tick
  EXPECT_TRUE(ticks_integer(0.2, 0.8, 3).empty());  // no whole number in range
}

TEST(Ticks, ValuesReadWithFourSignificantDigits) {
  EXPECT_EQ(format_value(0.0123456), "0.01235");
  EXPECT_EQ(format_value(12.5), "12.5");
  EXPECT_EQ(format_value(1234567), "1.235M");
  EXPECT_EQ(format_value(999960), "1M");  // rounding carries into the next unit, not "1000k"
  EXPECT_EQ(format_value(-2048), "-2.048k");
  EXPECT_EQ(format_value(3.2e-6), "3.200e-06");
  EXPECT_EQ(format_value(0), "0");
  EXPECT_EQ(format_value(NAN), "n/a");
  EXPECT_EQ(format_value(-INFINITY), "-inf");
  EXPECT_EQ(format_value(0.5, 2), "0.5");
}

}  // namespace
}  // namespace gantry::plot
