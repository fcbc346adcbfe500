// The history view model over a real SQLite history written through storage's API: the runs table, the
// selection of at most two runs, and their loss curves equal to what was written — exactly, step by step,
// for runs shorter than the point budget; as bucket minima and maxima (spikes kept) for longer ones; with a
// gap where a loss is NaN.
#include "ui/history/history_model.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <stdexcept>
#include <vector>

#include "tests/ui/history/history_test_db.h"

namespace gantry::history {
namespace {

using testing_support::TestHistory;

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

std::vector<double> falling(size_t n, double from) {
  std::vector<double> v(n);
  for (size_t i = 0; i < n; ++i)
    v[i] = from - 0.01 * static_cast<double>(i) + 0.001 * static_cast<double>(i % 7);
  return v;
}

class History : public ::testing::Test {
 protected:
  void SetUp() override {
    a_loss_ = falling(120, 5.0);
    a_loss_[50] = kNaN;  // a diverged step
    b_loss_ = falling(300, 6.0);
    b_loss_[137] = 50.0;  // one spike
    a_ = h_.begin("tiny-dp2", 2, "dp=2 tp=1 pp=1 zero=1", 1.7e9);
    b_ = h_.begin("tiny-dp4", 4, "dp=4 tp=1 pp=1 zero=0", 1.7e9 + 100);
    ASSERT_GE(a_, 0);
    ASSERT_GE(b_, 0);
    ASSERT_TRUE(h_.write(a_, 0, a_loss_, 2, /*rank_steps=*/true)) << h_.db().error();
    ASSERT_TRUE(h_.write(b_, 0, b_loss_, 4, /*rank_steps=*/false))
        << h_.db().error();  // as a step-only cache
    ASSERT_TRUE(h_.db().finish_run(a_, RunStatus::finished, "", 1.7e9 + 50));
  }

  TestHistory h_{"model"};
  std::vector<double> a_loss_, b_loss_;
  int64_t a_ = -1, b_ = -1;
};

TEST_F(History, ListsTheRunsNewestFirst) {
  HistoryModel m;
  ASSERT_TRUE(m.open(h_.path()).ok()) << m.error();
  ASSERT_EQ(m.runs().size(), 2u);
  const HistoryRun& b = m.runs()[0];
  const HistoryRun& a = m.runs()[1];
  EXPECT_EQ(b.id, b_);
  EXPECT_EQ(b.name, "tiny-dp4");
  EXPECT_EQ(b.state, "running");
  EXPECT_EQ(b.last_step, 299);  // no rank-step records: found through the decimated query
  EXPECT_EQ(b.last_loss, b_loss_.back());
  EXPECT_EQ(b.layout, "dp=4 tp=1 pp=1 zero=0");
  EXPECT_EQ(b.start_unix_s, 1.7e9 + 100);
  EXPECT_EQ(a.id, a_);
  EXPECT_EQ(a.state, "finished");
  EXPECT_EQ(a.last_step, 119);
  EXPECT_EQ(a.last_loss, a_loss_.back());
  EXPECT_EQ(a.world_size, 2);
  EXPECT_TRUE(m.overlay().empty());
}

TEST_F(History, OverlayCurvesEqualWhatWasWritten) {
  HistoryModel m;
  ASSERT_TRUE(m.open(h_.path()).ok());
  ASSERT_TRUE(m.select(a_));
  ASSERT_TRUE(m.select(b_));
  ASSERT_EQ(m.overlay().size(), 2u);
  const OverlaySeries& a = m.overlay()[0];
  const OverlaySeries& b = m.overlay()[1];
  EXPECT_EQ(a.run_id, a_);
  EXPECT_EQ(a.name, "run " + std::to_string(a_) + ": tiny-dp2");
  EXPECT_EQ(a.bucket_steps, 1);
  EXPECT_EQ(b.bucket_steps, 1);
  // Every step, its own loss; the diverged step is a gap (NaN) at its own x.
  ASSERT_EQ(a.step.size(), a_loss_.size());
  ASSERT_EQ(a.loss.size(), a_loss_.size());
  for (size_t i = 0; i < a_loss_.size(); ++i) {
    EXPECT_EQ(a.step[i], static_cast<double>(i));
    if (std::isnan(a_loss_[i])) {
      EXPECT_TRUE(std::isnan(a.loss[i])) << i;
    } else {
      EXPECT_EQ(a.loss[i], a_loss_[i]) << i;
    }
  }
  ASSERT_EQ(b.step.size(), b_loss_.size());
  for (size_t i = 0; i < b_loss_.size(); ++i) {
    EXPECT_EQ(b.step[i], static_cast<double>(i));
    EXPECT_EQ(b.loss[i], b_loss_[i]) << i;
  }
}

TEST_F(History, ALongRunKeepsEveryBucketsMinimumAndMaximum) {
  HistoryModel m;
  ASSERT_TRUE(m.open(h_.path()).ok());
  m.set_max_points(64);  // 300 steps into buckets of 8: at most 64 of them
  ASSERT_TRUE(m.select(b_));
  const OverlaySeries& s = m.overlay()[0];
  ASSERT_EQ(s.bucket_steps, 8);
  const size_t buckets = (b_loss_.size() + 7) / 8;
  ASSERT_EQ(s.step.size(), 2 * buckets);
  for (size_t k = 0; k < buckets; ++k) {
    const size_t lo = 8 * k, hi = std::min(b_loss_.size(), lo + 8);
    const double mn = *std::min_element(b_loss_.begin() + lo, b_loss_.begin() + hi);
    const double mx = *std::max_element(b_loss_.begin() + lo, b_loss_.begin() + hi);
    const double p = s.loss[2 * k], q = s.loss[2 * k + 1];
    EXPECT_EQ(std::min(p, q), mn) << "bucket " << k;
    EXPECT_EQ(std::max(p, q), mx) << "bucket " << k;
    EXPECT_EQ(s.step[2 * k], static_cast<double>(lo));
    EXPECT_EQ(s.step[2 * k + 1], static_cast<double>(lo + 4));
  }
  EXPECT_EQ(*std::max_element(s.loss.begin(), s.loss.end()), 50.0);  // the spike survives
  EXPECT_TRUE(std::is_sorted(s.step.begin(), s.step.end()));
}

TEST_F(History, AtMostTheCapOfRunsAreSelected) {
  const int64_t c = h_.begin("third", 1, "dp=1 tp=1 pp=1 zero=0", 1.7e9 + 200);
  std::vector<double> c_loss = falling(10, 4.0);
  c_loss.back() = kNaN;  // it diverged on its last step
  ASSERT_TRUE(h_.write(c, 0, c_loss, 1, false));
  HistoryModel m;
  ASSERT_TRUE(m.open(h_.path()).ok());
  m.set_max_selected(2);  // the default compares kMaxSelected (8): a cap of two shows the eviction
  ASSERT_EQ(m.runs().size(), 3u);
  EXPECT_EQ(m.runs()[0].last_step, 9);
  EXPECT_TRUE(std::isnan(m.runs()[0].last_loss));
  EXPECT_TRUE(m.select(a_));
  EXPECT_TRUE(m.select(b_));
  EXPECT_TRUE(m.select(c));  // the earliest chosen (a) makes room
  EXPECT_EQ(m.selected(), (std::vector<int64_t>{b_, c}));
  ASSERT_EQ(m.overlay().size(), 2u);
  EXPECT_EQ(m.overlay()[0].run_id, b_);
  EXPECT_EQ(m.overlay()[1].run_id, c);
  ASSERT_EQ(m.overlay()[1].step.size(), 10u);  // steps 0..8, then the diverged step 9 as a gap
  EXPECT_EQ(m.overlay()[1].step.back(), 9);
  EXPECT_TRUE(std::isnan(m.overlay()[1].loss.back()));
  EXPECT_EQ(m.overlay()[1].loss[8], c_loss[8]);
  EXPECT_TRUE(m.toggle(b_));  // deselects
  EXPECT_EQ(m.selected(), (std::vector<int64_t>{c}));
  EXPECT_EQ(m.overlay().size(), 1u);
  EXPECT_FALSE(m.select(9999));  // no such run
  EXPECT_EQ(m.selected().size(), 1u);
  m.clear_selection();
  EXPECT_TRUE(m.overlay().empty());
}

TEST_F(History, RefreshSeesWhatTheWriterAddedSinceAndDropsGoneRuns) {
  HistoryModel m;
  ASSERT_TRUE(m.open(h_.path()).ok());
  ASSERT_TRUE(m.select(b_));
  ASSERT_EQ(m.overlay()[0].step.size(), 300u);
  ASSERT_TRUE(h_.write(b_, 300, falling(20, 3.0), 4, false));  // the writer goes on, on its own connection
  ASSERT_TRUE(m.refresh().ok()) << m.error();
  EXPECT_EQ(m.runs()[0].last_step, 319);
  EXPECT_EQ(m.overlay()[0].step.size(), 320u);
  EXPECT_EQ(m.overlay()[0].loss.back(), falling(20, 3.0).back());
}

TEST(HistoryOpen, AFileThatIsNotAHistoryIsRefusedWithItsPath) {
  HistoryModel m;
  const Status s = m.open("/nonexistent/dir/history.sqlite");
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("/nonexistent/dir/history.sqlite"), std::string::npos);
  EXPECT_FALSE(m.is_open());
  EXPECT_FALSE(m.refresh().ok());
}

}  // namespace
}  // namespace gantry::history
