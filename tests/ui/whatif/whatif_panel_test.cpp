// The what-if panel really draws: a headless ImGui context (no window, no GL) runs frames of the panel
// over the real planner, and the tests read the vertices it put into the window's draw list (the memory
// bar against HBM) and press its Apply button with mouse input.
#include "ui/whatif/whatif_panel.h"

#include <gtest/gtest.h>
#include <imgui.h>

#include <cmath>
#include <fstream>
#include <functional>
#include <sstream>
#include <string>

#include "tests/ui/headless_imgui.h"
#include "tests/ui/whatif/tiny_run.h"

namespace gantry::whatif {
namespace {

using testing_support::tiny_run;

class Panel : public ::testing::Test {
 protected:
  // One frame of the panel in a fixed full-screen window; returns that window's draw list.
  ImDrawList* frame(const std::function<void()>& body) { return ui_.frame("what-if", body); }

  // Presses the left button at p and releases it, one frame each (as an operator's click arrives).
  std::optional<WhatIfApply> click(WhatIfModel& m, WhatIfPanelView& view, ImVec2 p) {
    std::optional<WhatIfApply> got;
    auto draw = [&] {
      frame([&] {
        if (auto a = whatif_panel(m, view)) got = a;
      });
    };
    ImGuiIO& io = ImGui::GetIO();
    io.MousePos = p;
    draw();
    io.MouseDown[0] = true;
    draw();
    io.MouseDown[0] = false;
    draw();
    return got;
  }

  HeadlessImGui ui_{ImVec2(1600, 1600)};
};

// The horizontal extent of the vertices of one colour inside a box.
struct Span {
  float lo = 1e9f, hi = -1e9f;
  int n = 0;
};
Span span_of(const ImDrawList* dl, uint32_t colour, ImVec2 min, ImVec2 max) {
  Span s;
  for (const ImDrawVert& v : dl->VtxBuffer) {
    if (v.col != colour || v.pos.x < min.x - 1 || v.pos.x > max.x + 1 || v.pos.y < min.y - 1 ||
        v.pos.y > max.y + 1)
      continue;
    s.lo = std::min(s.lo, v.pos.x);
    s.hi = std::max(s.hi, v.pos.x);
    ++s.n;
  }
  return s;
}

TEST_F(Panel, MemoryBarsStackEachBucketToScaleAgainstHbm) {
  WhatIfModel m;
  m.form.preset = "llama3-8b";
  m.form.gpus = 8;
  m.form.global_batch = 64;
  m.evaluate();
  ASSERT_FALSE(m.candidates().empty());
  // The form's layout (no sharding, 8B parameters' state on every GPU) does not fit: it ranks last.
  m.select(static_cast<int>(m.candidates().size()) - 1);
  const Plan& p = m.selection()->plan;
  ASSERT_FALSE(p.fits);
  WhatIfPanelView view;
  ImDrawList* dl = frame([&] { whatif_panel(m, view); });
  EXPECT_EQ(view.rows_drawn, static_cast<int>(m.candidates().size()));
  const float width = view.memory_max.x - view.memory_min.x;
  ASSERT_GT(width, 500);
  // Over HBM: the bar's full width is the total, and the HBM line stands inside it at hbm / total.
  EXPECT_NEAR(view.hbm_x - view.memory_min.x, width * p.hbm_bytes / p.memory.total(), 1.0);
  const std::vector<MemoryBar> bars = whatif_memory_bars(p);
  float x = view.memory_min.x;
  for (size_t i = 0; i < bars.size(); ++i) {
    const float w = static_cast<float>(width * bars[i].bytes / p.memory.total());
    const Span s = span_of(dl, whatif_bucket_colour(static_cast<int>(i)), view.memory_min, view.memory_max);
    if (w < 0.5f) {
      x += w;
      continue;
    }
    ASSERT_GE(s.n, 4) << bars[i].name;
    EXPECT_NEAR(s.lo, x, 1.0) << bars[i].name;
    EXPECT_NEAR(s.hi, x + w, 1.0) << bars[i].name;
    x += w;
  }
  EXPECT_NEAR(x, view.memory_max.x, 1.0);
  const Span hbm = span_of(dl, whatif_hbm_colour(), ImVec2(view.hbm_x - 3, view.memory_min.y - 5),
                           ImVec2(view.hbm_x + 3, view.memory_max.y + 5));
  EXPECT_GE(hbm.n, 2);

  // A layout that fits: the bar spans HBM, the buckets end short of the line.
  m.select(0);
  ASSERT_TRUE(m.selection()->plan.fits);
  frame([&] { whatif_panel(m, view); });
  EXPECT_NEAR(view.hbm_x, view.memory_max.x, 1.0);
}

TEST_F(Panel, ApplyReportsTheSelectedLayoutAndOnlyWhenTheRunCanResumeOnIt) {
  WhatIfModel m;
  ASSERT_TRUE(m.load_run(tiny_run({{"dp", 2}, {"tp", 1}, {"pp", 1}, {"zero", 1}})).ok());
  m.form.gpus = 4;
  m.form.layout.micro_batch = 4;
  m.evaluate();
  ASSERT_TRUE(m.issues().empty()) << m.issues()[0].message;
  int applicable = -1, blocked = -1;
  for (int i = 0; i < static_cast<int>(m.candidates().size()); ++i) {
    if (m.apply(i) && applicable < 0) applicable = i;
    if (!m.apply(i) && blocked < 0) blocked = i;
  }
  ASSERT_GE(applicable, 0);
  ASSERT_GE(blocked, 0);

  WhatIfPanelView view;
  m.select(applicable);
  frame([&] { whatif_panel(m, view); });
  ASSERT_TRUE(view.apply_enabled);
  ASSERT_GT(view.apply_max.x, view.apply_min.x);
  const ImVec2 centre((view.apply_min.x + view.apply_max.x) / 2, (view.apply_min.y + view.apply_max.y) / 2);
  std::optional<WhatIfApply> got = click(m, view, centre);
  ASSERT_TRUE(got.has_value());
  EXPECT_EQ(got->layout(), m.apply(applicable)->layout());
  EXPECT_EQ(got->run_id, 7);
  EXPECT_EQ(got->dp, 4);

  // A layout the engine cannot resume on: the button is drawn but inert.
  m.select(blocked);
  frame([&] { whatif_panel(m, view); });
  EXPECT_FALSE(view.apply_enabled);
  const ImVec2 at((view.apply_min.x + view.apply_max.x) / 2, (view.apply_min.y + view.apply_max.y) / 2);
  EXPECT_FALSE(click(m, view, at).has_value());
}

TEST_F(Panel, AButtonHookSeesApplyAndDecidesThePress) {
  WhatIfModel m;
  ASSERT_TRUE(m.load_run(tiny_run("dp=2 tp=1 pp=1 zero=0")).ok());
  ASSERT_NE(m.selection(), nullptr);
  std::vector<std::string> labels;
  bool apply_enabled = false;
  WhatIfPanelView view;
  std::optional<WhatIfApply> got;
  frame([&] {
    got = whatif_panel(m, view, [&](const char* label, bool enabled) {
      labels.push_back(label);
      if (std::string(label) == "Apply") apply_enabled = enabled;
      return enabled;  // as a script pressing every enabled button
    });
  });
  EXPECT_EQ(labels, std::vector<std::string>{"Apply"});
  EXPECT_EQ(apply_enabled, m.apply(m.selected()).has_value());
  EXPECT_EQ(got.has_value(), apply_enabled);
}

TEST_F(Panel, AnInvalidFormDrawsItsIssuesAndNoTable) {
  WhatIfModel m;
  m.form.gpu = "tpu-v9";
  m.form.layout.zero = 5;
  m.evaluate();
  ASSERT_EQ(m.issues().size(), 2u);
  ASSERT_FALSE(m.issues().empty());
  WhatIfPanelView view;
  ImDrawList* dl = frame([&] { whatif_panel(m, view); });
  EXPECT_EQ(view.rows_drawn, 0);
  EXPECT_FALSE(view.apply_enabled);
  EXPECT_EQ(view.apply_max.x, 0);
  // The issue line is drawn in the issue colour.
  int issue_vertices = 0;
  for (const ImDrawVert& v : dl->VtxBuffer) issue_vertices += v.col == IM_COL32(255, 110, 90, 255);
  EXPECT_GT(issue_vertices, 20);
}

}  // namespace
}  // namespace gantry::whatif
