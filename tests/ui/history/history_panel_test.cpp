// The history panel really draws: a headless ImGui context (no window, no GL) runs frames of the panel
// over a real SQLite history; clicking run rows selects them, and the overlay plot then draws each
// selected run's curve in its colour inside the plot area.
#include "ui/history/history_panel.h"

#include <gtest/gtest.h>
#include <imgui.h>

#include <cmath>
#include <functional>
#include <string>
#include <vector>

#include "tests/ui/headless_imgui.h"
#include "tests/ui/history/history_test_db.h"

namespace gantry::history {
namespace {

using testing_support::TestHistory;

class Panel : public ::testing::Test {
 protected:
  void SetUp() override {
    std::vector<double> a(80), b(200);
    for (size_t i = 0; i < a.size(); ++i) a[i] = 5.0 - 0.02 * static_cast<double>(i);
    for (size_t i = 0; i < b.size(); ++i) b[i] = 5.5 - 0.015 * static_cast<double>(i);
    a_ = h_.begin("short", 2, "dp=2 tp=1 pp=1 zero=0", 1.7e9);
    b_ = h_.begin("long", 4, "dp=4 tp=1 pp=1 zero=1", 1.7e9 + 60);
    ASSERT_TRUE(h_.write(a_, 0, a, 2, true)) << h_.db().error();
    ASSERT_TRUE(h_.write(b_, 0, b, 4, true)) << h_.db().error();
  }

  ImDrawList* frame(HistoryModel& m, HistoryPanelView& view, bool* changed = nullptr) {
    return ui_.frame("history", [&] {
      const bool c = history_panel(m, view);
      if (changed != nullptr) *changed = *changed || c;
    });
  }

  // Clicks the row of `run` (press and release, one frame each). Returns whether the panel reported a change.
  bool click_row(HistoryModel& m, HistoryPanelView& view, int64_t run) {
    const HistoryPanelView::Row* row = nullptr;
    for (const HistoryPanelView::Row& r : view.rows) {
      if (r.run_id == run) row = &r;
    }
    EXPECT_NE(row, nullptr) << "run " << run << " has no row";
    if (row == nullptr) return false;
    ImGuiIO& io = ImGui::GetIO();
    io.MousePos = ImVec2(row->min.x + 200, (row->min.y + row->max.y) / 2);  // across the row, not on the id
    bool changed = false;
    frame(m, view, &changed);
    io.MouseDown[0] = true;
    frame(m, view, &changed);
    io.MouseDown[0] = false;
    frame(m, view, &changed);
    io.MousePos = ImVec2(-1, -1);
    return changed;
  }

  TestHistory h_{"panel"};
  int64_t a_ = -1, b_ = -1;
  HeadlessImGui ui_{ImVec2(1200, 900)};
};

int vertices_inside(const ImDrawList* dl, uint32_t colour, ImVec2 min, ImVec2 max) {
  int n = 0;
  for (const ImDrawVert& v : dl->VtxBuffer) {
    n += v.col == colour && v.pos.x >= min.x - 2 && v.pos.x <= max.x + 2 && v.pos.y >= min.y - 2 &&
         v.pos.y <= max.y + 2;
  }
  return n;
}

TEST_F(Panel, ClickingRowsOverlaysTheirLossCurves) {
  HistoryModel m;
  ASSERT_TRUE(m.open(h_.path()).ok()) << m.error();
  HistoryPanelView view;
  ImDrawList* dl = frame(m, view);
  ASSERT_EQ(view.rows.size(), 2u);
  EXPECT_EQ(view.rows[0].run_id, b_);  // newest first
  EXPECT_EQ(vertices_inside(dl, history_series_colour(0), view.plot.plot_min, view.plot.plot_max), 0);

  EXPECT_TRUE(click_row(m, view, a_));
  EXPECT_EQ(m.selected(), std::vector<int64_t>{a_});
  EXPECT_TRUE(click_row(m, view, b_));
  ASSERT_EQ(m.selected(), (std::vector<int64_t>{a_, b_}));
  dl = frame(m, view);
  ASSERT_EQ(m.overlay().size(), 2u);
  EXPECT_EQ(m.overlay()[0].step.size(), 80u);
  EXPECT_EQ(m.overlay()[1].step.size(), 200u);
  // The plot fitted both curves: all 200 steps across, and each curve drawn in its colour inside it.
  EXPECT_EQ(view.plot.x_min, 0);
  EXPECT_EQ(view.plot.x_max, 199);
  EXPECT_GT(vertices_inside(dl, history_series_colour(0), view.plot.plot_min, view.plot.plot_max), 50);
  EXPECT_GT(vertices_inside(dl, history_series_colour(1), view.plot.plot_min, view.plot.plot_max), 50);
  // The short run's curve ends where its steps end: no vertex of its colour right of step 79 (inside the
  // data area; the legend swatch sits at the top-left).
  const float w = view.plot.plot_max.x - view.plot.plot_min.x;
  const float x79 = view.plot.plot_min.x + w * 79.0f / 199.0f;
  int past = 0;
  for (const ImDrawVert& v : dl->VtxBuffer) {
    past += v.col == history_series_colour(0) && v.pos.x > x79 + 3 && v.pos.y > view.plot.plot_min.y &&
            v.pos.y < view.plot.plot_max.y;
  }
  EXPECT_EQ(past, 0);

  // Clicking a selected row deselects it; its curve goes.
  EXPECT_TRUE(click_row(m, view, a_));
  EXPECT_EQ(m.selected(), std::vector<int64_t>{b_});
  dl = frame(m, view);
  EXPECT_EQ(m.overlay().size(), 1u);
  EXPECT_GT(vertices_inside(dl, history_series_colour(0), view.plot.plot_min, view.plot.plot_max), 50);
  EXPECT_EQ(vertices_inside(dl, history_series_colour(1), view.plot.plot_min, view.plot.plot_max), 0);
}

TEST_F(Panel, ThePlotAsksForAboutItsWidthInPoints) {
  HistoryModel m;
  ASSERT_TRUE(m.open(h_.path()).ok());
  HistoryPanelView view;
  frame(m, view);
  // 1200 px wide: the next power of two, 2048 points; a 100k-step run would come back in buckets of 64.
  EXPECT_EQ(m.max_points(), 2048);
  ImGui::GetIO().DisplaySize = ImVec2(400, 900);
  frame(m, view);
  EXPECT_EQ(m.max_points(), 512);
}

}  // namespace
}  // namespace gantry::history
