// The Run panel's Goodput section: ETTR, a stacked bar of where the run's wall time went, the failures on a
// timeline of the run (each a mark at its notice, its cost in the tooltip), and the Young/Daly interval.
#include <imgui.h>

#include <algorithm>
#include <cstdio>

#include "ui/console/panels.h"

namespace gantry::console {
namespace {

// One colour per category, in kGoodputNames' order: productive green, stall blue, the failure's three
// parts warm, paused and waiting grey.
constexpr std::array<uint32_t, kGoodputParts> kColours = {
    IM_COL32(110, 200, 110, 255), IM_COL32(90, 150, 240, 255), IM_COL32(240, 80, 80, 255),
    IM_COL32(250, 150, 60, 255),  IM_COL32(230, 200, 70, 255), IM_COL32(150, 150, 150, 255),
    IM_COL32(95, 95, 110, 255)};

std::string percent(const std::optional<double>& f) {
  if (!f) return "unknown";
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f %%", 100 * *f);
  return buf;
}

}  // namespace

void draw_goodput(const GoodputView& g, PanelContext& ctx) {
  ctx.frame.panels.push_back("Goodput");
  if (!g.have) {
    ImGui::TextDisabled("goodput: unknown%s%s", g.error.empty() ? "" : " (",
                        g.error.empty() ? "" : (g.error + ")").c_str());
    return;
  }
  ImGui::Text("goodput: ETTR %s of %s wall%s   %zu failure%s", percent(g.ettr).c_str(),
              goodput_seconds_text(g.wall_s > 0 ? std::optional<double>(g.wall_s) : std::nullopt).c_str(),
              g.live ? " (to now)" : "", g.failures.size(), g.failures.size() == 1 ? "" : "s");
  if (!g.known) {
    ImGui::TextDisabled("ledger unknown: %s", g.why_unknown.c_str());
    return;
  }
  ImDrawList* dl = ImGui::GetWindowDrawList();
  const float w = std::max(50.0f, ImGui::GetContentRegionAvail().x);
  const float h = ImGui::GetTextLineHeight();

  // The stacked bar: each category's share of the wall, left to right.
  const ImVec2 bar = ImGui::GetCursorScreenPos();
  ImGui::InvisibleButton("##goodput_bar", ImVec2(w, h));
  const bool bar_hovered = ImGui::IsItemHovered();
  float x = bar.x;
  for (const GoodputBarPart& p : goodput_bar(g)) {
    const float x1 = std::min(bar.x + w, x + static_cast<float>(p.fraction) * w);
    dl->AddRectFilled(ImVec2(x, bar.y), ImVec2(std::max(x1, x + 1), bar.y + h),
                      kColours[static_cast<size_t>(p.category)]);
    x = x1;
  }
  dl->AddRect(bar, ImVec2(bar.x + w, bar.y + h), ImGui::GetColorU32(ImGuiCol_Border));
  if (bar_hovered) {
    ImGui::BeginTooltip();
    for (int k = 0; k < kGoodputParts; ++k) {
      const std::optional<double>& s = g.seconds[static_cast<size_t>(k)];
      ImGui::TextColored(ImGui::ColorConvertU32ToFloat4(kColours[static_cast<size_t>(k)]), "%-16s %s  %s",
                         kGoodputNames[static_cast<size_t>(k)], goodput_seconds_text(s).c_str(),
                         s && g.wall_s > 0 ? percent(*s / g.wall_s).c_str() : "");
    }
    ImGui::EndTooltip();
  }
  // The legend, one coloured word per category that has time.
  for (int k = 0; k < kGoodputParts; ++k) {
    const std::optional<double>& s = g.seconds[static_cast<size_t>(k)];
    if (!s || !(*s > 0)) continue;
    ImGui::TextColored(ImGui::ColorConvertU32ToFloat4(kColours[static_cast<size_t>(k)]), "%s %s",
                       kGoodputNames[static_cast<size_t>(k)], goodput_seconds_text(s).c_str());
    ImGui::SameLine();
  }
  ImGui::NewLine();

  // The failures on the run's timeline: a mark at each notice, coloured by whether it recovered.
  if (!g.failures.empty() && g.end_unix_s > g.created_unix_s) {
    const ImVec2 line = ImGui::GetCursorScreenPos();
    ImGui::InvisibleButton("##goodput_failures", ImVec2(w, h));
    const float mid = line.y + h / 2;
    dl->AddLine(ImVec2(line.x, mid), ImVec2(line.x + w, mid), ImGui::GetColorU32(ImGuiCol_TextDisabled));
    const double span = g.end_unix_s - g.created_unix_s;
    const float mouse_x = ImGui::GetIO().MousePos.x;
    const GoodputFailureView* hovered = nullptr;
    for (const GoodputFailureView& f : g.failures) {
      const float fx = line.x + static_cast<float>((f.time_unix_s - g.created_unix_s) / span) * w;
      // The mark's width is its cost on the same scale (at least a few pixels, so a quick one shows).
      const float cw = std::max(3.0f, static_cast<float>(f.cost_s / span) * w);
      dl->AddRectFilled(ImVec2(fx - 1, line.y), ImVec2(fx - 1 + cw, line.y + h),
                        f.recovered ? kColours[3] : kColours[2]);
      if (ImGui::IsItemHovered() && mouse_x >= fx - 3 && mouse_x <= fx + cw + 2) hovered = &f;
    }
    if (hovered != nullptr) {
      const GoodputFailureView& f = *hovered;
      ImGui::BeginTooltip();
      ImGui::Text("generation %d failed at +%.1f s: %s%s%s on %s", f.generation,
                  f.time_unix_s - g.created_unix_s, f.kind.c_str(), f.fault.empty() ? "" : ", injected ",
                  f.fault.c_str(), f.node.empty() ? "?" : f.node.c_str());
      ImGui::TextWrapped("%s", f.message.c_str());
      ImGui::Text("detection %.2f s, restore %.2f s, recomputed %.2f s: cost %.2f s%s", f.detection_s,
                  f.restore_s, f.recomputed_s, f.cost_s, f.recovered ? "" : " (not recovered)");
      ImGui::EndTooltip();
    }
  }

  // Young/Daly: the recommended interval, or why there is none.
  const std::string every = g.checkpoint_every_steps > 0
                                ? "every " + std::to_string(g.checkpoint_every_steps) + " steps"
                                : std::string("no periodic checkpoints");
  if (g.interval_s) {
    ImGui::Text("checkpoint policy %s, %s; Young/Daly recommends %s%s", g.policy.c_str(), every.c_str(),
                goodput_seconds_text(g.interval_s).c_str(),
                g.interval_steps ? (" = " + std::to_string(*g.interval_steps) + " steps").c_str() : "");
  } else {
    ImGui::TextDisabled("checkpoint policy %s, %s; Young/Daly interval unknown: %s", g.policy.c_str(),
                        every.c_str(), g.interval_why.c_str());
  }
}

}  // namespace gantry::console
