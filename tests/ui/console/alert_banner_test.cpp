// The alert banner's model: the followed run's alert events replayed into what fires now.
#include "ui/console/alert_banner.h"

#include <gtest/gtest.h>

namespace gantry::console {
namespace {

EventView ev(int64_t id, const std::string& kind, const std::string& rule, double t) {
  EventView e;
  e.id = id;
  e.record.run_id = 3;
  e.record.kind = kind;
  e.record.time_unix_s = t;
  e.record.message = kind + " " + rule;
  e.record.payload = rule.empty() ? "{}" : "{\"rule\": \"" + rule + "\"}";
  return e;
}

TEST(AlertBanner, ShowsWhatFiredAndWasNotClearedOncePerRule) {
  EXPECT_TRUE(alerts_firing({}).empty());
  const std::vector<EventView> events = {ev(1, "alert", "a", 10), ev(2, "checkpoint", "", 11),
                                         ev(3, "alert", "b", 12), ev(4, "alert_cleared", "a", 13),
                                         ev(5, "alert", "c", 14), ev(6, "alert_cleared", "c", 15),
                                         ev(7, "alert", "c", 16), ev(8, "alert", "", 17)};
  const std::vector<FiringAlert> f = alerts_firing(events);
  ASSERT_EQ(f.size(), 2u);
  EXPECT_EQ(f[0].rule, "b");
  EXPECT_EQ(f[0].message, "alert b");
  EXPECT_EQ(f[1].rule, "c");
  EXPECT_EQ(f[1].since_unix_s, 16);  // the second firing's
  // Everything cleared: no banner.
  std::vector<EventView> all = events;
  all.push_back(ev(9, "alert_cleared", "b", 18));
  all.push_back(ev(10, "alert_cleared", "c", 19));
  EXPECT_TRUE(alerts_firing(all).empty());
}

}  // namespace
}  // namespace gantry::console
