#include "telemetry/flops.h"

#include <gtest/gtest.h>

namespace gantry {
namespace {

TEST(Flops, Gpt2SmallPerTokenByHand) {
  // GPT-2 124M with vocab 50304 (llm.c's count): N = 124,475,904; L = 12, d = 768, T = 1024.
  // 6N = 746,855,424; 6·L·d·T = 6·12·768·1024 = 56,623,104; sum = 803,478,528.
  FlopsModel m{.params = 124475904, .layers = 12, .width = 768, .seq_len = 1024};
  EXPECT_DOUBLE_EQ(flops_per_token(m), 803478528.0);
}

TEST(Flops, MfuAgainstH100Peak) {
  // 500k tokens/s × 803.48 MFLOP/token = 401.74 TFLOP/s; ÷ 989 TFLOP/s = 0.40621...
  MfuFigure f = mfu(500000.0, 803478528.0, device_peak("h100-sxm"));
  EXPECT_NEAR(f.achieved_flops, 401.739264e12, 1e3);
  EXPECT_NEAR(f.ratio, 401.739264 / 989.0, 1e-12);
  EXPECT_NE(mfu_formula(f).find("989 TFLOP/s"), std::string::npos);
}

TEST(Flops, UnknownDeviceGivesNoRatio) {
  MfuFigure f = mfu(1000.0, 1e6, device_peak("toaster"));
  EXPECT_EQ(f.ratio, 0.0);
  EXPECT_EQ(f.peak.name, "unknown");
}

TEST(Flops, PeakTable) {
  EXPECT_DOUBLE_EQ(device_peak("h100-sxm").bf16_flops, 989e12);
  EXPECT_DOUBLE_EQ(device_peak("h100-pcie").bf16_flops, 756e12);
  EXPECT_DOUBLE_EQ(device_peak("h200").bf16_flops, 989e12);
  EXPECT_DOUBLE_EQ(device_peak("a100").bf16_flops, 312e12);
  EXPECT_DOUBLE_EQ(device_peak("b200").bf16_flops, 2250e12);
}

TEST(Flops, ConfiguredCpuPeak) {
  // 2 cores × 2.1 GHz × 32 fp32 FLOP/cycle (two 256-bit FMA pipes) = 134.4 GFLOP/s, as an operator would
  // configure it. 8,400 tokens/s × 6·120,576 + 6·2·64·64 (the tiny config) = 6.4851...e9 FLOP/s.
  const DevicePeak cpu = device_peak_cpu(134.4e9);
  EXPECT_EQ(cpu.name, "cpu (configured)");
  const double f = flops_per_token({.params = 120576, .layers = 2, .width = 64, .seq_len = 64});
  EXPECT_DOUBLE_EQ(f, 6.0 * 120576 + 6.0 * 2 * 64 * 64);  // 772,608
  const MfuFigure m = mfu(8400.0, f, cpu);
  EXPECT_NEAR(m.ratio, 8400.0 * 772608.0 / 134.4e9, 1e-15);  // 0.048288
  // A sub-TFLOP/s peak keeps its digits (it printed as "0 TFLOP/s" once).
  EXPECT_NE(mfu_formula(m).find("cpu (configured) 0.1344 TFLOP/s"), std::string::npos) << mfu_formula(m);
  EXPECT_EQ(device_peak_cpu(-1).bf16_flops, 0.0);
}

TEST(Flops, HfuCountsRecomputation) {
  // GPT-2 small on an H100 SXM at 500k tokens/s with full activation recomputation: the hardware runs
  // 803,478,528 × 4/3 = 1,071,304,704 FLOP/token → 535.652352 TFLOP/s → HFU 0.541610...
  const double f = 803478528.0;
  EXPECT_DOUBLE_EQ(hardware_flops_per_token(f, 0.0), f);
  EXPECT_DOUBLE_EQ(hardware_flops_per_token(f, 1.0), 1071304704.0);
  const HfuFigure h = hfu(500000.0, f, device_peak("h100-sxm"), 1.0);
  EXPECT_NEAR(h.achieved_flops, 535.652352e12, 1e3);
  EXPECT_NEAR(h.ratio, 535.652352 / 989.0, 1e-12);
  EXPECT_NE(hfu_formula(h).find("r = 1"), std::string::npos) << hfu_formula(h);
  EXPECT_NE(hfu_formula(h).find("h100-sxm 989 TFLOP/s"), std::string::npos);
  // No recomputation: HFU equals MFU; out-of-range fractions are clamped.
  EXPECT_DOUBLE_EQ(hfu(500000.0, f, device_peak("a100"), 0.0).ratio,
                   mfu(500000.0, f, device_peak("a100")).ratio);
  EXPECT_DOUBLE_EQ(hfu(1.0, 3.0, device_peak("a100"), 7.0).hardware_flops_per_token, 4.0);
  // Half the layers recomputed: 1 + 0.5/3.
  EXPECT_DOUBLE_EQ(hardware_flops_per_token(6.0, 0.5), 7.0);
}

TEST(Flops, DeviceKeyFromCudaName) {
  EXPECT_EQ(device_key_from_name("NVIDIA H100 80GB HBM3"), "h100-sxm");
  EXPECT_EQ(device_key_from_name("NVIDIA H100 PCIe"), "h100-pcie");
  EXPECT_EQ(device_key_from_name("NVIDIA H100 NVL"), "unknown");
  EXPECT_EQ(device_key_from_name("NVIDIA H200"), "h200");
  EXPECT_EQ(device_key_from_name("NVIDIA GH200 480GB"), "gh200");
  EXPECT_EQ(device_key_from_name("NVIDIA A100-SXM4-80GB"), "a100");
  EXPECT_EQ(device_key_from_name("NVIDIA B200"), "b200");
  EXPECT_EQ(device_key_from_name("NVIDIA GeForce RTX 4090"), "unknown");
}

}  // namespace
}  // namespace gantry
