// The widgets really draw: a headless ImGui context (no window, no GL) runs frames, and the tests read the
// vertices the widgets put into the window's draw list, and drive them with mouse input.
#include "ui/plot/plot_widget.h"

#include <gtest/gtest.h>
#include <imgui.h>

#include <cmath>
#include <functional>
#include <random>
#include <vector>

#include "tests/ui/headless_imgui.h"

namespace gantry::plot {
namespace {

constexpr uint32_t kRed = IM_COL32(250, 40, 40, 255);
constexpr uint32_t kBlue = IM_COL32(40, 90, 250, 255);
constexpr uint32_t kGreen = IM_COL32(40, 230, 90, 255);

class Widgets : public ::testing::Test {
 protected:
  // One frame with `body` inside a fixed full-screen window; returns that window's draw list, which
  // stays readable until the next frame.
  ImDrawList* frame(const std::function<void()>& body) { return ui_.frame("plots", body); }

  HeadlessImGui ui_{ImVec2(1280, 800)};
};

struct Box {
  ImVec2 min, max;
  // The slack admits a line's anti-aliased fringe (thickness / 2 + 1 px, transparent at its edge).
  bool contains(ImVec2 p, float slack = 1.6f) const {
    return p.x >= min.x - slack && p.x <= max.x + slack && p.y >= min.y - slack && p.y <= max.y + slack;
  }
};

struct Count {
  int inside = 0, outside = 0;
};

// Vertices of exactly this colour, inside and outside the box.
Count vertices_of(const ImDrawList* dl, uint32_t colour, Box box) {
  Count n;
  for (const ImDrawVert& v : dl->VtxBuffer) {
    if (v.col != colour) continue;
    (box.contains(v.pos) ? n.inside : n.outside)++;
  }
  return n;
}

struct Series {
  std::vector<double> x, y;
  PlotSeries view(const char* name, uint32_t colour) const {
    return {name, x.data(), y.data(), x.size(), colour};
  }
};

Series sine(size_t n, double phase = 0) {
  Series s;
  for (size_t i = 0; i < n; ++i) {
    s.x.push_back(static_cast<double>(i));
    s.y.push_back(std::sin(i * 0.01 + phase));
  }
  return s;
}

TEST_F(Widgets, LinesDrawInsideThePlotRectangle) {
  const Series a = sine(2000), b = sine(2000, 1.0);
  const PlotSeries series[] = {a.view("a", kRed), b.view("b", kBlue)};
  const PlotMarker markers[] = {{500, "checkpoint", kGreen}};
  PlotView view;
  ImDrawList* dl = frame([&] { plot_lines("p", view, series, markers, ImVec2(800, 300)); });
  const Box plot{view.plot_min, view.plot_max};
  EXPECT_GT(plot.max.x - plot.min.x, 600);
  EXPECT_GT(plot.max.y - plot.min.y, 200);
  EXPECT_EQ(view.x_min, 0);  // fitted to the data
  EXPECT_EQ(view.x_max, 1999);
  EXPECT_LT(view.y_min, -0.99);
  EXPECT_GT(view.y_max, 0.99);
  for (uint32_t c : {kRed, kBlue}) {
    const Count n = vertices_of(dl, c, plot);
    EXPECT_GT(n.inside, 100);
    EXPECT_EQ(n.outside, 0);
  }
  // The marker's line stands at x = 500.
  const float marker_px = plot.min.x + static_cast<float>(500.0 / 1999.0 * (plot.max.x - plot.min.x));
  bool found = false;
  for (const ImDrawVert& v : dl->VtxBuffer) {
    if ((v.col & 0x00FFFFFF) == (kGreen & 0x00FFFFFF) && std::fabs(v.pos.x - marker_px) < 2) found = true;
  }
  EXPECT_TRUE(found);
}

TEST_F(Widgets, AHiddenSeriesDrawsNothing) {
  const Series a = sine(500), b = sine(500, 2.0);
  const PlotSeries series[] = {a.view("a", kRed), b.view("b", kBlue)};
  PlotView view{.hidden = {"b"}};
  ImDrawList* dl = frame([&] { plot_lines("p", view, series, {}, ImVec2(600, 300)); });
  const Box everywhere{ImVec2(-1e9f, -1e9f), ImVec2(1e9f, 1e9f)};
  EXPECT_GT(vertices_of(dl, kRed, everywhere).inside, 0);
  EXPECT_EQ(vertices_of(dl, kBlue, everywhere).inside, 0);
  view.set_hidden("b", false);
  dl = frame([&] { plot_lines("p", view, series, {}, ImVec2(600, 300)); });
  EXPECT_GT(vertices_of(dl, kBlue, everywhere).inside, 0);
}

TEST_F(Widgets, AMillionPointsDrawAsOrderWidthVerticesAndKeepTheirSpike) {
  const size_t n = 1000000;
  Series s;
  s.x.resize(n);
  s.y.resize(n);
  std::mt19937 rng(1);
  std::uniform_real_distribution<double> u(0, 1);
  for (size_t i = 0; i < n; ++i) {
    s.x[i] = static_cast<double>(i);
    s.y[i] = u(rng);
  }
  s.y[777777] = 40;  // one straggler step among a million
  const PlotSeries series[] = {s.view("step time", kRed)};
  PlotView view;
  ImDrawList* dl = frame([&] { plot_lines("p", view, series, {}, ImVec2(900, 300)); });
  const Box plot{view.plot_min, view.plot_max};
  const float width = plot.max.x - plot.min.x;
  const Count c = vertices_of(dl, kRed, plot);
  EXPECT_GT(c.inside, static_cast<int>(width));                 // every column drew something
  EXPECT_LT(c.inside, static_cast<int>(12 * width));            // and only a few vertices each
  EXPECT_LT(dl->VtxBuffer.Size, static_cast<int>(20 * width));  // axes and labels included
  // The spike reaches the top of the fitted plot, in its own column.
  const float spike_x = plot.min.x + static_cast<float>(777777.0 / (n - 1) * width);
  float top = 1e9f;
  for (const ImDrawVert& v : dl->VtxBuffer) {
    if (v.col == kRed && std::fabs(v.pos.x - spike_x) < 2) top = std::min(top, v.pos.y);
  }
  EXPECT_LT(top, plot.min.y + 0.1f * (plot.max.y - plot.min.y));
}

// Whether any triangle of this colour spans pixel x (the line crosses it).
bool line_crosses(const ImDrawList* dl, uint32_t colour, float x) {
  for (int i = 0; i + 2 < dl->IdxBuffer.Size; i += 3) {
    // Commands of one draw list share one vertex range unless VtxOffset moved: small lists here.
    const ImDrawVert* v[3] = {&dl->VtxBuffer[dl->IdxBuffer[i]], &dl->VtxBuffer[dl->IdxBuffer[i + 1]],
                              &dl->VtxBuffer[dl->IdxBuffer[i + 2]]};
    if (v[0]->col != colour && v[1]->col != colour && v[2]->col != colour) continue;
    float lo = 1e9f, hi = -1e9f;
    for (const ImDrawVert* p : v) {
      lo = std::min(lo, p->pos.x);
      hi = std::max(hi, p->pos.x);
    }
    if (lo < x - 1 && hi > x + 1) return true;
  }
  return false;
}

TEST_F(Widgets, NaNLeavesAGapInTheLine) {
  Series s;
  for (int i = 0; i <= 20; ++i) {
    s.x.push_back(i);
    s.y.push_back(i % 3);
  }
  const PlotSeries series[] = {s.view("s", kRed)};
  PlotView view;
  ImDrawList* dl = frame([&] { plot_lines("p", view, series, {}, ImVec2(600, 300)); });
  const float w = view.plot_max.x - view.plot_min.x;
  const float at_9_5 = view.plot_min.x + 9.5f / 20 * w;
  EXPECT_TRUE(line_crosses(dl, kRed, at_9_5));
  s.y[10] = NAN;
  dl = frame([&] { plot_lines("p", view, series, {}, ImVec2(600, 300)); });
  EXPECT_FALSE(line_crosses(dl, kRed, at_9_5));
  EXPECT_FALSE(line_crosses(dl, kRed, view.plot_min.x + 10.5f / 20 * w));
  EXPECT_TRUE(line_crosses(dl, kRed, view.plot_min.x + 12.5f / 20 * w));
}

TEST_F(Widgets, ClickingALegendEntryTogglesItsSeries) {
  const Series a = sine(300), b = sine(300, 1.0);
  const PlotSeries series[] = {a.view("a", kRed), b.view("b", kBlue)};
  PlotView view;
  auto draw = [&] { return frame([&] { plot_lines("p", view, series, {}, ImVec2(600, 300)); }); };
  draw();
  ImGuiIO& io = ImGui::GetIO();
  // The second legend row, near the plot's top-left corner.
  const float line_h = ImGui::GetTextLineHeight();
  io.MousePos = ImVec2(view.plot_min.x + 12, view.plot_min.y + 4 + line_h + 1 + line_h / 2);
  draw();  // the window becomes hovered
  io.MouseDown[0] = true;
  ImDrawList* dl = draw();
  EXPECT_TRUE(view.is_hidden("b"));
  EXPECT_FALSE(view.is_hidden("a"));
  io.MouseDown[0] = false;
  dl = draw();
  const Box everywhere{ImVec2(-1e9f, -1e9f), ImVec2(1e9f, 1e9f)};
  EXPECT_EQ(vertices_of(dl, kBlue, everywhere).inside, 0);
  io.MouseDown[0] = true;
  draw();
  io.MouseDown[0] = false;
  dl = draw();
  EXPECT_FALSE(view.is_hidden("b"));
  EXPECT_GT(vertices_of(dl, kBlue, everywhere).inside, 0);
}

TEST_F(Widgets, WheelZoomsDragPansDoubleClickFits) {
  const Series a = sine(1001);
  const PlotSeries series[] = {a.view("a", kRed)};
  PlotView view;
  auto draw = [&] { frame([&] { plot_lines("p", view, series, {}, ImVec2(800, 300)); }); };
  draw();
  ImGuiIO& io = ImGui::GetIO();
  const float w = view.plot_max.x - view.plot_min.x;
  io.MousePos = ImVec2(view.plot_min.x + w / 2, (view.plot_min.y + view.plot_max.y) / 2);
  draw();
  EXPECT_TRUE(view.hovered);
  EXPECT_NEAR(view.hover_x, 500, 2);
  // Zoom in around the mouse: the middle stays in the middle.
  io.MouseWheel = 1;
  draw();
  io.MouseWheel = 0;
  EXPECT_FALSE(view.fit_x);
  EXPECT_TRUE(view.fit_y);
  EXPECT_NEAR(view.x_max - view.x_min, 1000 * 0.85, 1e-6);
  EXPECT_NEAR((view.x_min + view.x_max) / 2, 500, 1);
  // Ctrl + wheel zooms y only.
  const double x_width = view.x_max - view.x_min, y_height = view.y_max - view.y_min;
  io.KeyCtrl = true;
  io.MouseWheel = -1;
  draw();
  io.MouseWheel = 0;
  io.KeyCtrl = false;
  EXPECT_FALSE(view.fit_y);
  EXPECT_NEAR(view.x_max - view.x_min, x_width, 1e-9);
  EXPECT_NEAR(view.y_max - view.y_min, y_height / 0.85, 1e-9);
  // Drag 100 px to the right: the view moves 100 px worth of x to the left.
  const double x_min = view.x_min, per_px = (view.x_max - view.x_min) / std::floor(w);
  io.MouseDown[0] = true;
  draw();
  io.MousePos.x += 100;
  draw();
  io.MouseDown[0] = false;
  draw();
  EXPECT_NEAR(view.x_min, x_min - 100 * per_px, 1e-6);
  // Double-click: fit everything again.
  for (int i = 0; i < 2; ++i) {
    io.MouseDown[0] = true;
    draw();
    io.MouseDown[0] = false;
    draw();
  }
  EXPECT_TRUE(view.fit_x);
  EXPECT_TRUE(view.fit_y);
  EXPECT_EQ(view.x_min, 0);
  EXPECT_EQ(view.x_max, 1000);
}

TEST_F(Widgets, FollowLatestKeepsTheNewestPointAtTheRightEdge) {
  Series s = sine(1000);
  PlotView view{.fit_x = false, .follow_latest = true, .follow_width = 100};
  const PlotSeries first[] = {s.view("s", kRed)};
  frame([&] { plot_lines("p", view, first, {}, ImVec2(600, 300)); });
  EXPECT_EQ(view.x_max, 999);
  EXPECT_EQ(view.x_min, 899);
  for (int i = 1000; i < 2000; ++i) {
    s.x.push_back(i);
    s.y.push_back(0);
  }
  const PlotSeries grown[] = {s.view("s", kRed)};
  frame([&] { plot_lines("p", view, grown, {}, ImVec2(600, 300)); });
  EXPECT_EQ(view.x_max, 1999);
  EXPECT_EQ(view.x_min, 1899);
}

TEST_F(Widgets, HeatmapDrawsCellsScaleAndHoverReadout) {
  const int ranks = 64;
  HeatmapModel model(ranks);
  std::vector<float> row(ranks, 1.0f);
  for (int64_t s = 0; s < 1000; ++s) {
    row[13] = s >= 596 && s < 608 ? 5.0f : 1.0f;  // rank 13 straggles for a few steps
    row[40] = s < 100 ? NAN : 1.5f;               // rank 40 joined late
    model.append_step(s, row);
  }
  HeatmapView view{.value_label = "step time", .unit = "s"};
  ImDrawList* dl = frame([&] { heatmap_widget("h", view, model, ImVec2(700, 300)); });
  const Box map{view.map_min, view.map_max};
  EXPECT_EQ(view.step_lo, 0);
  EXPECT_EQ(view.step_hi, 1000);
  EXPECT_EQ(view.scale.min, 1.0);
  EXPECT_EQ(view.scale.max, 5.0);
  EXPECT_LE(view.grid.cols, static_cast<int>((map.max.x - map.min.x) / view.min_cell_px));
  // The straggler's cell is drawn in the hottest colour, inside the map; missing cells in their own grey.
  const Count hot = vertices_of(dl, colour_ramp(1), map);
  EXPECT_GE(hot.inside, 4);
  const Count missing = vertices_of(dl, colour_missing(), map);
  EXPECT_GE(missing.inside, 4);
  // Outside the map the grey appears once: the scale bar's "none" swatch, right of the map.
  EXPECT_EQ(missing.outside, 4);
  const Box right_of_map{ImVec2(map.max.x + 2, map.min.y), ImVec2(1e9f, 1e9f)};
  EXPECT_EQ(vertices_of(dl, colour_missing(), right_of_map).inside, 4);
  EXPECT_GT(vertices_of(dl, colour_ramp(0), map).inside, 0);
  // Hover over rank 13 at step 602: the readout names the cell and its maximum. (ImGui floors the mouse
  // position to whole pixels, about two steps here: the slow stretch is wider than that.)
  ImGuiIO& io = ImGui::GetIO();
  const float w = map.max.x - map.min.x, h = map.max.y - map.min.y;
  io.MousePos = ImVec2(map.min.x + (602.5f / 1000) * w, map.min.y + (13.5f / ranks) * h);
  frame([&] { heatmap_widget("h", view, model, ImVec2(700, 300)); });
  frame([&] { heatmap_widget("h", view, model, ImVec2(700, 300)); });
  ASSERT_TRUE(view.hovered);
  EXPECT_LE(view.hover_rank_lo, 13);
  EXPECT_GT(view.hover_rank_hi, 13);
  EXPECT_LE(view.hover_step_lo, 602);
  EXPECT_GT(view.hover_step_hi, 600);
  EXPECT_EQ(view.hover_value, 5.0f);
  // A fixed scale is kept as given.
  view.scale = {.auto_range = false, .min = 0, .max = 10};
  frame([&] { heatmap_widget("h", view, model, ImVec2(700, 300)); });
  EXPECT_EQ(view.scale.max, 10);
}

TEST_F(Widgets, HeatmapFollowsTheNewestStepsAndZoomsAndFits) {
  HeatmapModel model(8);
  const std::vector<float> row(8, 1.0f);
  for (int64_t s = 0; s < 500; ++s) model.append_step(s, row);
  HeatmapView view{.fit = false, .follow_latest = true, .follow_steps = 100};
  auto draw = [&] { frame([&] { heatmap_widget("h", view, model, ImVec2(600, 200)); }); };
  draw();
  EXPECT_EQ(view.step_lo, 400);
  EXPECT_EQ(view.step_hi, 500);
  for (int64_t s = 500; s < 800; ++s) model.append_step(s, row);
  draw();
  EXPECT_EQ(view.step_lo, 700);
  EXPECT_EQ(view.step_hi, 800);
  // Zooming while following narrows the window and keeps its right edge on the newest step.
  ImGuiIO& io = ImGui::GetIO();
  io.MousePos = ImVec2((view.map_min.x + view.map_max.x) / 2, (view.map_min.y + view.map_max.y) / 2);
  draw();
  io.MouseWheel = 1;
  draw();
  io.MouseWheel = 0;
  EXPECT_TRUE(view.follow_latest);
  EXPECT_EQ(view.step_hi, 800);
  EXPECT_EQ(view.step_lo, 800 - 85);
  // Dragging pans back in time and stops following.
  io.MouseDown[0] = true;
  draw();
  io.MousePos.x += 200;
  draw();
  io.MouseDown[0] = false;
  draw();
  EXPECT_FALSE(view.follow_latest);
  EXPECT_LT(view.step_hi, 800);
  // Double-click fits everything.
  for (int i = 0; i < 2; ++i) {
    io.MouseDown[0] = true;
    draw();
    io.MouseDown[0] = false;
    draw();
  }
  EXPECT_TRUE(view.fit);
  EXPECT_EQ(view.step_lo, 0);
  EXPECT_EQ(view.step_hi, 800);
}

TEST_F(Widgets, InfiniteSamplesLeaveEveryVertexFinite) {
  Series s = sine(100);
  s.y[10] = INFINITY;
  s.y[20] = -INFINITY;
  const PlotSeries series[] = {s.view("s", kRed)};
  PlotView view;
  ImDrawList* dl = frame([&] { plot_lines("p", view, series, {}, ImVec2(400, 200)); });
  EXPECT_TRUE(std::isfinite(view.y_min) && std::isfinite(view.y_max));
  EXPECT_GT(vertices_of(dl, kRed, Box{view.plot_min, view.plot_max}).inside, 0);
  for (const ImDrawVert& v : dl->VtxBuffer) {
    EXPECT_TRUE(std::isfinite(v.pos.x) && std::isfinite(v.pos.y));
  }
}

TEST_F(Widgets, EmptyInputsDrawAFrameAndNoData) {
  HeatmapModel model(4);
  HeatmapView heat;
  PlotView view;
  ImDrawList* dl = frame([&] {
    heatmap_widget("h", heat, model, ImVec2(300, 200));
    plot_lines("p", view, {}, {}, ImVec2(300, 200));
  });
  EXPECT_EQ(heat.grid.cols, 0);
  EXPECT_GT(dl->VtxBuffer.Size, 0);  // background, border, axes
  for (const ImDrawVert& v : dl->VtxBuffer) {
    EXPECT_TRUE(std::isfinite(v.pos.x) && std::isfinite(v.pos.y));
  }
}

TEST_F(Widgets, HeatmapStaysUnder16BitIndicesWithoutVtxOffset) {
  ImGui::GetIO().BackendFlags &= ~ImGuiBackendFlags_RendererHasVtxOffset;
  const int ranks = 1024;
  HeatmapModel model(ranks);
  std::vector<float> row(ranks);
  std::mt19937 rng(6);
  std::uniform_real_distribution<float> u(0, 1);
  for (int64_t s = 0; s < 3000; ++s) {
    for (float& v : row) v = u(rng);
    model.append_step(s, row);
  }
  HeatmapView view;
  // ImGui itself aborts at Render if the window's list passed 65,535 vertices: reaching the checks is half
  // the test.
  ImDrawList* dl = frame([&] { heatmap_widget("h", view, model, ImVec2(1200, 700)); });
  EXPECT_LE(view.grid.rows * view.grid.cols, 6000);
  EXPECT_GT(view.grid.rows * view.grid.cols, 1000);
  EXPECT_LT(dl->VtxBuffer.Size, 65536);
}

TEST_F(Widgets, HeatmapVerticesAreBoundedByPixelsNotSteps) {
  const int ranks = 1024;
  HeatmapModel model(ranks);
  std::vector<float> row(ranks);
  std::mt19937 rng(5);
  std::uniform_real_distribution<float> u(0, 1);
  for (int64_t s = 0; s < 4000; ++s) {
    for (float& v : row) v = u(rng);  // noise: no two neighbours share a colour, the worst case
    model.append_step(s, row);
  }
  HeatmapView view;
  ImDrawList* dl = frame([&] { heatmap_widget("h", view, model, ImVec2(600, 300)); });
  const float cells = (view.map_max.x - view.map_min.x) * (view.map_max.y - view.map_min.y) /
                      (view.min_cell_px * view.min_cell_px);
  EXPECT_GT(view.grid.rows * view.grid.cols, 1000);
  EXPECT_LT(dl->VtxBuffer.Size, static_cast<int>(4 * cells + 5000));
}

}  // namespace
}  // namespace gantry::plot

namespace gantry::plot {
namespace {

// Markers close together: their labels go to rows under each other, and what has no row left is hidden (its
// line stays, its label shows on hover), so no label overprints another.
TEST(MarkerLabels, CloseMarkersStackAndNeverOverprint) {
  const std::vector<float> x = {10, 20, 30, 200, 205};
  const std::vector<float> w = {50, 50, 50, 20, 20};
  const std::vector<int> rows = marker_label_rows(x, w, 2);
  EXPECT_EQ(rows, (std::vector<int>{0, 1, -1, 0, 1}));
  // Every pair of labels placed in one row is apart.
  for (size_t i = 0; i < x.size(); ++i)
    for (size_t j = i + 1; j < x.size(); ++j)
      if (rows[i] >= 0 && rows[i] == rows[j]) {
        EXPECT_LE(x[i] + w[i], x[j]) << i << " " << j;
      }
  // Far apart: all in the top row.
  EXPECT_EQ(marker_label_rows(std::vector<float>{0, 100, 200}, std::vector<float>{30, 30, 30}, 3),
            (std::vector<int>{0, 0, 0}));
}

}  // namespace
}  // namespace gantry::plot
