// The flight recorder keeps the last N collectives, oldest first, each closed by leave().
#include "engine/core/comm/flight_recorder.h"

#include <gtest/gtest.h>

namespace gantry {
namespace {

TEST(FlightRecorder, KeepsTheLastNInOrderAndMarksTheOpenOne) {
  FlightRecorder fr(4);
  EXPECT_TRUE(fr.snapshot().empty());
  fr.leave(true);  // nothing open: no effect
  EXPECT_TRUE(fr.snapshot().empty());
  for (uint64_t seq = 1; seq <= 6; ++seq) {
    fr.enter(seq, seq % 2 ? "all_reduce" : "all_gather", seq * 100);
    if (seq < 6) fr.leave(seq != 3);
  }
  const std::vector<CollectiveRecord> got = fr.snapshot();
  ASSERT_EQ(got.size(), 4u);
  for (size_t k = 0; k < got.size(); ++k) EXPECT_EQ(got[k].seq, 3 + k);
  EXPECT_EQ(got[0].op, "all_reduce");
  EXPECT_EQ(got[1].op, "all_gather");
  EXPECT_EQ(got[1].bytes, 400u);
  EXPECT_FALSE(got[0].ok);  // #3 failed
  EXPECT_TRUE(got[1].ok);
  EXPECT_GT(got[2].left_unix_ms, 0);
  EXPECT_GE(got[2].left_unix_ms, got[2].entered_unix_ms);
  EXPECT_EQ(got[3].left_unix_ms, 0);  // #6 still inside
  EXPECT_GT(got[3].entered_unix_ms, 0);
}

}  // namespace
}  // namespace gantry
