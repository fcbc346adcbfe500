// Plot export (issue 21): the widgets, drawn in a headless ImGui context, write the CSV of what they show
// when asked, queue a PNG capture of their rectangle, and refuse what cannot be done with the reason.
// (The PNG's pixels are read back under Xvfb: console_window_test.)
#include "ui/plot/plot_export.h"

#include <gtest/gtest.h>
#include <imgui.h>

#include <cfloat>
#include <cmath>
#include <filesystem>
#include <sstream>
#include <string>
#include <vector>

#include "tests/file_text.h"  // slurp
#include "tests/scratch_dir.h"
#include "tests/ui/headless_imgui.h"

namespace gantry::plot {
namespace {

namespace fs = std::filesystem;

using testing_support::slurp;

std::vector<std::string> lines_of(const std::string& text) {
  std::vector<std::string> out;
  std::stringstream ss(text);
  for (std::string line; std::getline(ss, line);) out.push_back(line);
  return out;
}

class Export : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = testing_support::scratch_dir("export");
    plot_exports_set_current(&exports_);
  }
  void TearDown() override { plot_exports_set_current(nullptr); }
  void frame(const std::function<void()>& body) { ui_.frame("plots", body); }

  HeadlessImGui ui_{ImVec2(1280, 800)};
  PlotExports exports_;
  fs::path dir_;
};

// Two series on different steps, a NaN, a hidden series and an x range narrower than the data: the CSV holds
// exactly the visible points, row by x, an unknown value empty (never 0), the units in the header.
TEST_F(Export, TheCsvHoldsTheVisibleSeriesRowByXWithUnknownsEmpty) {
  const std::vector<double> x1 = {1, 2, 3, 4, 5}, y1 = {0.5, NAN, 0.25, 0.125, 1.0 / 3};
  const std::vector<double> x2 = {2, 4, 6}, y2 = {20, 40, 60};
  const std::vector<double> x3 = {1, 2, 3}, y3 = {7, 7, 7};
  const PlotSeries series[] = {{"max", x1.data(), y1.data(), x1.size(), IM_COL32(255, 0, 0, 255)},
                               {"mean, all ranks", x2.data(), y2.data(), x2.size(), IM_COL32(0, 0, 255, 255)},
                               {"min", x3.data(), y3.data(), x3.size(), IM_COL32(0, 255, 0, 255)}};
  PlotView view{.fit_x = false, .x_label = "step", .y_unit = "s"};
  view.x_min = 2;
  view.x_max = 5;
  view.hidden = {"min"};
  const fs::path csv = dir_ / "band.csv";
  exports_.request("band", csv.string());
  frame([&] { plot_lines("##band", view, series, {}, ImVec2(600, 300)); });
  ASSERT_EQ(exports_.outcomes().size(), 1u);
  EXPECT_EQ(exports_.outcomes()[0].error, "");
  EXPECT_EQ(exports_.outcomes()[0].plot, "band");
  const std::vector<std::string> rows = lines_of(slurp(csv));
  const std::vector<std::string> want = {"step,max (s),\"mean, all ranks (s)\"", "2,,20", "3,0.25,",
                                         "4,0.125,40", "5,0.33333333333333331,"};
  EXPECT_EQ(rows, want);
  // Every value reads back to the series' own double.
  EXPECT_EQ(std::stod("0.33333333333333331"), 1.0 / 3);
  // Asked once, written once: the next frame writes nothing more.
  frame([&] { plot_lines("##band", view, series, {}, ImVec2(600, 300)); });
  EXPECT_EQ(exports_.outcomes().size(), 1u);
}

// A PNG is queued with the widget's rectangle (the pixels are read by the window's owner after rendering);
// another plot's request waits for that plot.
TEST_F(Export, APngIsQueuedWithTheWidgetsRectangleAndOnlyForItsPlot) {
  const std::vector<double> x = {0, 1, 2}, y = {1, 2, 3};
  const PlotSeries series[] = {{"loss", x.data(), y.data(), x.size(), IM_COL32(255, 0, 0, 255)}};
  PlotView a, b;
  exports_.request("loss", (dir_ / "loss.png").string());
  exports_.request("grad", (dir_ / "grad.csv").string());
  frame([&] { plot_lines("##loss", a, series, {}, ImVec2(500, 200)); });
  std::vector<PngCapture> caps = exports_.take_captures();
  ASSERT_EQ(caps.size(), 1u);
  EXPECT_EQ(caps[0].plot, "loss");
  EXPECT_EQ(caps[0].path, (dir_ / "loss.png").string());
  EXPECT_FLOAT_EQ(caps[0].max.x - caps[0].min.x, 500);
  EXPECT_FLOAT_EQ(caps[0].max.y - caps[0].min.y, 200);
  EXPECT_TRUE(exports_.take_captures().empty()) << "taken once";
  EXPECT_TRUE(exports_.outcomes().empty()) << "grad was not drawn";
  frame([&] { plot_lines("##grad", b, series, {}, ImVec2(500, 200)); });
  ASSERT_EQ(exports_.outcomes().size(), 1u);
  EXPECT_EQ(lines_of(slurp(dir_ / "grad.csv")), (std::vector<std::string>{"x,loss", "0,1", "1,2", "2,3"}));
}

// What cannot be written is an outcome with the reason, not a silent nothing.
TEST_F(Export, AnUnwritablePathOrAnUnknownFormatIsRefusedWithTheReason) {
  const std::vector<double> x = {0, 1}, y = {1, 2};
  const PlotSeries series[] = {{"loss", x.data(), y.data(), x.size(), IM_COL32(255, 0, 0, 255)}};
  PlotView view;
  exports_.request("loss", (dir_ / "no-such-folder" / "loss.csv").string());
  exports_.request("loss", (dir_ / "loss.txt").string());
  frame([&] { plot_lines("##loss", view, series, {}, ImVec2(500, 200)); });
  ASSERT_EQ(exports_.outcomes().size(), 2u);
  EXPECT_NE(exports_.outcomes()[0].error.find("must end in .csv or .png"), std::string::npos)
      << exports_.outcomes()[0].error;
  EXPECT_NE(exports_.outcomes()[1].error.find("cannot write"), std::string::npos)
      << exports_.outcomes()[1].error;
}

// The heatmap's CSV: one row per cell it drew, ranks and steps half-open, a missing cell empty.
TEST_F(Export, TheHeatmapCsvHoldsEachDrawnCell) {
  HeatmapModel model(3);
  model.set(0, 0, 1.5f);
  model.set(2, 0, 2.5f);
  model.set(0, 1, 0.5f);  // rank 1 reports nothing; ranks 1 and 2 at step 1 neither
  HeatmapView view{.value_label = "busy", .unit = "s"};
  const fs::path csv = dir_ / "heat.csv";
  exports_.request("heat", csv.string());
  frame([&] { heatmap_widget("##heat", view, model, ImVec2(400, 200)); });
  ASSERT_EQ(exports_.outcomes().size(), 1u);
  EXPECT_EQ(exports_.outcomes()[0].error, "");
  const std::vector<std::string> want = {"rank_lo,rank_hi,step_lo,step_hi,busy (s)",
                                         "0,1,0,1,1.5",
                                         "0,1,1,2,0.5",
                                         "1,2,0,1,",
                                         "1,2,1,2,",
                                         "2,3,0,1,2.5",
                                         "2,3,1,2,"};
  EXPECT_EQ(lines_of(slurp(csv)), want);
}

// The operator's path: a right click on the plot opens the menu, "Export CSV" writes NAME-TIME.csv into the
// exports folder (created on demand) with the plot's data, and the menu then names the file.
TEST_F(Export, TheRightClickMenuWritesIntoTheExportsFolder) {
  PlotExports exports((dir_ / "exports").string());
  plot_exports_set_current(&exports);
  const std::vector<double> x = {1, 2}, y = {0.5, 0.25};
  const PlotSeries series[] = {{"loss", x.data(), y.data(), x.size(), IM_COL32(255, 0, 0, 255)}};
  PlotView view{.x_label = "step"};
  ImGuiIO& io = ImGui::GetIO();
  const auto frame_at = [&](ImVec2 mouse, bool right, bool left) {
    io.MousePos = mouse;
    io.MouseDown[1] = right;
    io.MouseDown[0] = left;
    frame([&] { plot_lines("##loss", view, series, {}, ImVec2(500, 200)); });
  };
  const ImVec2 over(250, 100);
  frame_at(over, false, false);
  frame_at(over, true, false);   // press
  frame_at(over, false, false);  // release: the menu opens
  frame_at(over, false, false);  // drawn where the mouse was
  // "Export CSV" is the menu's first line, a window padding in from its corner at the mouse.
  const ImGuiStyle& st = ImGui::GetStyle();
  const ImVec2 item(over.x + st.WindowPadding.x + 10, over.y + st.WindowPadding.y + ImGui::GetFontSize() / 2);
  frame_at(item, false, false);
  frame_at(item, false, true);
  frame_at(item, false, false);
  frame_at(ImVec2(-FLT_MAX, -FLT_MAX), false, false);  // the request is carried out when the plot is drawn
  ASSERT_EQ(exports.outcomes().size(), 1u);
  const ExportOutcome& o = exports.outcomes()[0];
  EXPECT_EQ(o.error, "");
  EXPECT_EQ(fs::path(o.path).parent_path(), dir_ / "exports");
  EXPECT_EQ(fs::path(o.path).filename().string().rfind("loss-", 0), 0u) << o.path;
  EXPECT_EQ(fs::path(o.path).extension(), ".csv");
  EXPECT_EQ(lines_of(slurp(o.path)), (std::vector<std::string>{"step,loss", "1,0.5", "2,0.25"}));
  plot_exports_set_current(&exports_);
}

TEST(PlotName, IsTheIdWithoutItsHashes) {
  EXPECT_EQ(plot_name("##loss overlay"), "loss overlay");
  EXPECT_EQ(plot_name("heat"), "heat");
  ExportFormat f = ExportFormat::kCsv;
  EXPECT_TRUE(export_format_of("a/B.PNG", &f));
  EXPECT_EQ(f, ExportFormat::kPng);
  EXPECT_FALSE(export_format_of("a.csv.gz", &f));
}

}  // namespace
}  // namespace gantry::plot
