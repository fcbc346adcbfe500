// The console's goodput view: the coordinator's reply parsed, unknown figures kept unknown (never 0), and
// the bar's parts as shares of the wall.
#include "ui/console/goodput_view.h"

#include <gtest/gtest.h>

namespace gantry::console {
namespace {

using json = nlohmann::json;

TEST(GoodputView, ParsesTheReplyAndTheBarIsEachCategorysShareOfTheWall) {
  const json reply = {{"known", true},
                      {"live", false},
                      {"created_unix_s", 100.0},
                      {"end_unix_s", 200.0},
                      {"wall_s", 100.0},
                      {"ettr", 0.8},
                      {"seconds",
                       {{"productive", 80.0},
                        {"checkpoint_stall", 2.0},
                        {"detection", 1.0},
                        {"restore", 4.0},
                        {"recomputed", 5.0},
                        {"paused", 0.0},
                        {"waiting", 8.0}}},
                      {"failures",
                       {{{"generation", 1},
                         {"time_unix_s", 150.0},
                         {"kind", "node_failed"},
                         {"node", "node-1"},
                         {"fault", "kill"},
                         {"detection_s", 1.0},
                         {"restore_s", 4.0},
                         {"recomputed_s", 5.0},
                         {"cost_s", 10.0},
                         {"recovered", true}}}},
                      {"young_daly",
                       {{"checkpoint_cost_s", 2.0},
                        {"mtbf_s", 100.0},
                        {"interval_s", 20.0},
                        {"interval_steps", 40},
                        {"policy", "young_daly"},
                        {"checkpoint_every_steps", 40}}}};
  const GoodputView g = goodput_from_json(reply);
  ASSERT_TRUE(g.have);
  ASSERT_TRUE(g.known);
  EXPECT_DOUBLE_EQ(*g.ettr, 0.8);
  ASSERT_EQ(g.failures.size(), 1u);
  EXPECT_EQ(g.failures[0].fault, "kill");
  EXPECT_DOUBLE_EQ(g.failures[0].cost_s, 10);
  EXPECT_EQ(*g.interval_steps, 40);
  EXPECT_EQ(g.policy, "young_daly");
  const std::vector<GoodputBarPart> bar = goodput_bar(g);
  ASSERT_EQ(bar.size(), 6u);  // paused has no time: no part
  EXPECT_EQ(bar[0].category, 0);
  EXPECT_DOUBLE_EQ(bar[0].fraction, 0.8);
  double sum = 0;
  for (const GoodputBarPart& p : bar) sum += p.fraction;
  EXPECT_DOUBLE_EQ(sum, 1.0);
}

TEST(GoodputView, UnknownFiguresStayUnknownAndDrawNoBar) {
  const GoodputView g =
      goodput_from_json({{"known", false},
                         {"why_unknown", "no generation"},
                         {"wall_s", 10.0},
                         {"ettr", nullptr},
                         {"seconds", {{"productive", nullptr}}},
                         {"young_daly", {{"interval_s", nullptr}, {"why_unknown", "no failure"}}}});
  ASSERT_TRUE(g.have);
  EXPECT_FALSE(g.known);
  EXPECT_FALSE(g.ettr.has_value());
  EXPECT_FALSE(g.seconds[0].has_value());
  EXPECT_EQ(goodput_seconds_text(g.seconds[0]), "unknown");
  EXPECT_EQ(goodput_seconds_text(1.5), "1.50 s");
  EXPECT_FALSE(g.interval_s.has_value());
  EXPECT_EQ(g.interval_why, "no failure");
  EXPECT_TRUE(goodput_bar(g).empty());
  EXPECT_FALSE(goodput_from_json(json::array()).have);
}

}  // namespace
}  // namespace gantry::console
