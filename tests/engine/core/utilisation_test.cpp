// Where a run's peak comes from (the CUDA device's name, train.peak_tflops, or nowhere) and that an unknown
// peak gives no MFU at all rather than 0.
#include "engine/core/utilisation.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

namespace gantry {
namespace {

using ::testing::HasSubstr;

Config gpt2_small() {
  Config c;
  c.model = {.n_layer = 12, .n_head = 12, .n_embd = 768, .vocab_size = 50257, .seq_len = 1024};
  return c;
}

TEST(Utilisation, CudaPeakComesFromTheDeviceName) {
  const RunUtilisation u = run_utilisation(gpt2_small(), 124439808, "NVIDIA H100 80GB HBM3");
  EXPECT_EQ(u.peak_name, "h100-sxm");
  EXPECT_EQ(u.peak_flops, 989e12);
  EXPECT_DOUBLE_EQ(u.flops_per_token, 6.0 * 124439808 + 6.0 * 12 * 768 * 1024);  // 6N + 6LdT
  ASSERT_TRUE(u.mfu(500000).has_value());
  EXPECT_NEAR(*u.mfu(500000), 500000 * u.flops_per_token / 989e12, 1e-12);
  EXPECT_EQ(u.hfu(500000), u.mfu(500000)) << "the engine recomputes nothing: HFU = MFU";
  EXPECT_THAT(u.formula, HasSubstr("peak = h100-sxm 989 TFLOP/s"));
}

TEST(Utilisation, ConfiguredPeakOverridesTheTableAndServesACpu) {
  Config c = gpt2_small();
  c.train.peak_tflops = 700;
  const RunUtilisation gpu = run_utilisation(c, 124439808, "NVIDIA H100 80GB HBM3");
  EXPECT_EQ(gpu.peak_name, "configured");
  EXPECT_EQ(gpu.peak_flops, 700e12);
  c.train.peak_tflops = 0.1344;
  const RunUtilisation cpu = run_utilisation(c, 124439808, "");
  EXPECT_EQ(cpu.peak_name, "cpu (configured)");
  EXPECT_THAT(cpu.formula, HasSubstr("cpu (configured) 0.1344 TFLOP/s"));
  EXPECT_TRUE(cpu.mfu(10).has_value());
}

TEST(Utilisation, UnknownPeakIsNoFigureNotZero) {
  const RunUtilisation cpu = run_utilisation(gpt2_small(), 124439808, "");
  EXPECT_FALSE(cpu.known());
  EXPECT_FALSE(cpu.mfu(1e6).has_value());
  EXPECT_FALSE(cpu.hfu(1e6).has_value());
  EXPECT_THAT(cpu.formula, HasSubstr("MFU n/a"));
  EXPECT_THAT(cpu.formula, HasSubstr("train.peak_tflops"));
  // A GPU the table does not know (H100 NVL's peak differs): no guess.
  const RunUtilisation nvl = run_utilisation(gpt2_small(), 124439808, "NVIDIA H100 NVL");
  EXPECT_FALSE(nvl.mfu(1e6).has_value());
  EXPECT_EQ(mfu_text(std::nullopt), "n/a");
  EXPECT_EQ(mfu_text(0.4123), "41.2%");
}

TEST(Utilisation, PlannedCudaRunNamesThePerDevicePeak) {
  Config c = gpt2_small();
  c.train.backend = "cuda";
  const RunUtilisation u = run_utilisation_planned(c, 124439808);
  EXPECT_EQ(u.peak_name, "per device");
  EXPECT_EQ(u.peak_flops, 0);
  EXPECT_THAT(u.formula, HasSubstr("each rank's GPU"));
  c.train.backend = "cpu";
  EXPECT_THAT(run_utilisation_planned(c, 124439808).formula, HasSubstr("MFU n/a"));
}

}  // namespace
}  // namespace gantry
