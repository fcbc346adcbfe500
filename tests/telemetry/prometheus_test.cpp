#include "telemetry/prometheus.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <sstream>

#include "telemetry/flops.h"

namespace gantry {
namespace {

int count_lines_starting(const std::string& text, const std::string& prefix) {
  std::istringstream in(text);
  int n = 0;
  for (std::string line; std::getline(in, line);) n += line.rfind(prefix, 0) == 0;
  return n;
}

TEST(Prometheus, FamilyHelpTypeAndEscaping) {
  PrometheusWriter w;
  ASSERT_TRUE(w.family("gantry_events_total", MetricType::counter, "Events seen.\nBy kind \\ all."));
  ASSERT_TRUE(w.sample({{"kind", "straggler"}}, 3));
  ASSERT_TRUE(w.sample({{"kind", "say \"hi\"\\\n"}}, 1));
  ASSERT_TRUE(w.family("gantry_loss", MetricType::gauge, "Loss."));
  ASSERT_TRUE(w.sample({}, std::numeric_limits<double>::quiet_NaN()));
  ASSERT_TRUE(w.family("gantry_grad_norm", MetricType::gauge, "Norm."));
  ASSERT_TRUE(w.sample({}, std::numeric_limits<double>::infinity()));
  EXPECT_TRUE(w.ok()) << w.error();
  EXPECT_EQ(w.text(),
            "# HELP gantry_events_total Events seen.\\nBy kind \\\\ all.\n"
            "# TYPE gantry_events_total counter\n"
            "gantry_events_total{kind=\"straggler\"} 3\n"
            "gantry_events_total{kind=\"say \\\"hi\\\"\\\\\\n\"} 1\n"
            "# HELP gantry_loss Loss.\n"
            "# TYPE gantry_loss gauge\n"
            "gantry_loss NaN\n"
            "# HELP gantry_grad_norm Norm.\n"
            "# TYPE gantry_grad_norm gauge\n"
            "gantry_grad_norm +Inf\n");
}

TEST(Prometheus, NamingRulesAreEnforced) {
  const auto refused = [](std::string_view name, MetricType t, const std::string& needle) {
    std::string why;
    EXPECT_FALSE(prometheus_name_ok(name, t, &why)) << name;
    EXPECT_NE(why.find(needle), std::string::npos) << why;
  };
  refused("step_seconds", MetricType::gauge, "gantry_");
  refused("gantry_", MetricType::gauge, "gantry_");
  refused("gantry_tokens", MetricType::counter, "_total");
  refused("gantry_loss_total", MetricType::gauge, "only counters");
  refused("gantry_step_ms", MetricType::gauge, "base units");
  refused("gantry_mfu_percent", MetricType::gauge, "base units");
  refused("gantry_memory_mib", MetricType::gauge, "base units");
  refused("gantry_step_ms_total", MetricType::counter, "base units");
  refused("gantry_bad-name", MetricType::gauge, "invalid character");
  std::string why;
  EXPECT_TRUE(prometheus_name_ok("gantry_step_seconds", MetricType::gauge, &why)) << why;
  EXPECT_TRUE(prometheus_name_ok("gantry_tokens_total", MetricType::counter, &why)) << why;

  PrometheusWriter w;
  EXPECT_FALSE(w.family("gantry_x_ms", MetricType::gauge, "bad"));
  EXPECT_FALSE(w.sample({}, 1)) << "samples of a refused family are dropped";
  EXPECT_FALSE(w.ok());
  EXPECT_EQ(w.text(), "");

  PrometheusWriter d;
  ASSERT_TRUE(d.family("gantry_a", MetricType::gauge, "a"));
  ASSERT_TRUE(d.family("gantry_b", MetricType::gauge, "b"));
  EXPECT_FALSE(d.family("gantry_a", MetricType::gauge, "a again"));
  EXPECT_NE(d.error().find("contiguous"), std::string::npos);

  PrometheusWriter l;
  ASSERT_TRUE(l.family("gantry_a", MetricType::gauge, "a"));
  EXPECT_FALSE(l.sample({{"__name__", "x"}}, 1));
  EXPECT_FALSE(l.sample({{"rank", "1"}, {"rank", "2"}}, 1));
  EXPECT_FALSE(l.sample({{"1rank", "1"}}, 1));
}

TEST(Prometheus, BoundedRanksPickTheSlowest) {
  std::vector<double> t(1000, 0.5);
  t[17] = 0.9;
  t[400] = 0.7;
  t[999] = std::numeric_limits<double>::quiet_NaN();
  const std::vector<size_t> pick = prometheus_bounded_ranks(t, 3);
  EXPECT_EQ(pick, (std::vector<size_t>{17, 400, 0}));  // ties broken by the lower rank; NaN last
  EXPECT_EQ(prometheus_bounded_ranks(t, 0).size(), 0u);
  EXPECT_EQ(prometheus_bounded_ranks(t, 5000).size(), 1000u);
}

TEST(Prometheus, RankStepsAreBoundedAndAggregated) {
  std::vector<RankStepRecord> latest;
  for (int r = 0; r < 1000; ++r) {
    RankStepRecord x;
    x.rank = r;
    x.host = "n" + std::to_string(r / 8);
    x.total_s = r == 123 ? 2.0 : 1.0 + 1e-4 * r;
    x.phases.forward = x.total_s / 2;
    x.mem_peak_bytes = 1u << 30;
    if (r == 123) x.power_watts = 700;
    if (r == 123) x.mfu = 0.25;  // the only rank whose peak is known
    latest.push_back(x);
  }
  PrometheusWriter w;
  prometheus_write_rank_steps(w, latest, 16);
  ASSERT_TRUE(w.ok()) << w.error();
  const std::string& t = w.text();
  EXPECT_EQ(count_lines_starting(t, "gantry_rank_step_seconds{"), 16);
  EXPECT_EQ(count_lines_starting(t, "gantry_rank_phase_seconds{"), 16 * kPhaseCount);
  EXPECT_NE(t.find("gantry_rank_step_seconds{rank=\"123\",host=\"n15\"} 2\n"), std::string::npos) << t;
  EXPECT_NE(t.find("gantry_rank_power_watts{rank=\"123\",host=\"n15\"} 700\n"), std::string::npos);
  EXPECT_EQ(count_lines_starting(t, "gantry_rank_power_watts{"), 1);
  EXPECT_EQ(t.find("gantry_rank_temperature_celsius"), std::string::npos) << "no NVML readings, no family";
  EXPECT_NE(t.find("gantry_rank_mfu_ratio{rank=\"123\",host=\"n15\"} 0.25\n"), std::string::npos) << t;
  EXPECT_EQ(count_lines_starting(t, "gantry_rank_mfu_ratio{"), 1) << "an unknown MFU is no sample, not 0";
  EXPECT_EQ(t.find("gantry_rank_hfu_ratio"), std::string::npos);
  EXPECT_NE(t.find("gantry_ranks_reporting 1000\n"), std::string::npos);
  EXPECT_NE(t.find("gantry_rank_series_omitted 984\n"), std::string::npos);
  EXPECT_NE(t.find("gantry_step_seconds{stat=\"max\"} 2\n"), std::string::npos);
  EXPECT_NE(t.find("gantry_step_seconds{stat=\"min\"} 1\n"), std::string::npos);
  EXPECT_NE(t.find("gantry_rank_memory_peak_bytes{rank=\"123\",host=\"n15\"} 1073741824\n"),
            std::string::npos);
  // Every family is declared once, right before its samples.
  EXPECT_EQ(count_lines_starting(t, "# TYPE gantry_rank_step_seconds gauge"), 1);
}

TEST(Prometheus, StepFamiliesCarryThePeakAndFormula) {
  StepRecord s;
  s.step = 42;
  s.loss = 2.5;
  s.mfu = 0.4;
  s.hfu = 0.5;
  s.tokens_per_s = 5e5;
  const MfuFigure m = mfu(5e5, 803478528.0, device_peak("h100-sxm"));
  const HfuFigure h = hfu(5e5, 803478528.0, device_peak("h100-sxm"), 1.0);
  PrometheusWriter w;
  prometheus_write_step(w, s, "h100-sxm", mfu_formula(m), hfu_formula(h));
  ASSERT_TRUE(w.ok()) << w.error();
  EXPECT_NE(w.text().find("gantry_mfu_ratio{peak=\"h100-sxm\"} 0.4\n"), std::string::npos) << w.text();
  EXPECT_NE(w.text().find("# HELP gantry_mfu_ratio Model FLOP utilisation 0-1: MFU = tokens/s"),
            std::string::npos);
  EXPECT_NE(w.text().find("gantry_step 42\n"), std::string::npos);
  EXPECT_NE(w.text().find("gantry_tokens_per_second 500000\n"), std::string::npos);
  EXPECT_EQ(w.text().find("gantry_validation_loss"), std::string::npos);
}

TEST(Prometheus, UnknownUtilisationIsLeftOutNotZero) {
  StepRecord s;
  s.step = 7;
  PrometheusWriter w;
  prometheus_write_step(w, s, "unknown", "", "");
  ASSERT_TRUE(w.ok()) << w.error();
  EXPECT_EQ(w.text().find("gantry_mfu_ratio"), std::string::npos) << w.text();
  EXPECT_EQ(w.text().find("gantry_hfu_ratio"), std::string::npos) << w.text();
  EXPECT_NE(w.text().find("gantry_step 7\n"), std::string::npos);
}

}  // namespace
}  // namespace gantry
