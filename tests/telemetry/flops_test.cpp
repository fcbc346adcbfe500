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

}  // namespace
}  // namespace gantry
