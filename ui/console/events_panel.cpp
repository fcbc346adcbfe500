// The Events panel: the followed run's events, filterable by a substring of their kind, node or message.
#include <imgui.h>

#include <algorithm>
#include <cctype>
#include <ctime>
#include <string>

#include "ui/console/panels.h"

namespace gantry::console {
namespace {

bool contains_folded(const std::string& text, const std::string& needle) {
  if (needle.empty()) return true;
  auto fold = [](char c) { return static_cast<char>(std::tolower(static_cast<unsigned char>(c))); };
  return std::search(text.begin(), text.end(), needle.begin(), needle.end(),
                     [&](char a, char b) { return fold(a) == fold(b); }) != text.end();
}

ImVec4 kind_colour(const std::string& kind) {
  if (kind.find("fail") != std::string::npos || kind.find("lost") != std::string::npos)
    return ImVec4(1, 0.45f, 0.4f, 1);
  if (kind.find("straggler") != std::string::npos || kind.find("quarantine") != std::string::npos)
    return ImVec4(1, 0.7f, 0.3f, 1);
  if (kind.find("checkpoint") != std::string::npos) return ImVec4(0.5f, 0.9f, 0.5f, 1);
  return ImVec4(0.7f, 0.8f, 1, 1);
}

// When it happened, in the operator's local time: "14:03:27" (the date too when not today).
std::string event_time(double unix_s, double now_unix_s) {
  if (!(unix_s > 0)) return "--:--:--";
  const std::time_t t = static_cast<std::time_t>(unix_s), now = static_cast<std::time_t>(now_unix_s);
  std::tm tm{}, today{};
  localtime_r(&t, &tm);
  localtime_r(&now, &today);
  char buf[32];
  const bool same_day = tm.tm_year == today.tm_year && tm.tm_yday == today.tm_yday;
  std::strftime(buf, sizeof buf, same_day ? "%H:%M:%S" : "%m-%d %H:%M:%S", &tm);
  return buf;
}

}  // namespace

void EventsPanel::draw(const ConsoleSnapshot& s, PanelContext& ctx) {
  ctx.frame.panels.push_back("Events");
  ImGui::SetNextItemWidth(-1);
  ImGui::InputTextWithHint("##filter", "filter (kind, node or message)", filter_, sizeof filter_);
  const std::string needle = filter_;
  if (!ImGui::BeginChild("##event-list", ImVec2(0, 0), false, ImGuiWindowFlags_HorizontalScrollbar)) {
    ImGui::EndChild();
    return;
  }
  std::vector<const EventView*> shown;
  for (const EventView& e : s.events) {
    const EventRecord& r = e.record;
    if (contains_folded(r.kind, needle) || contains_folded(r.message, needle) ||
        contains_folded(r.node, needle))
      shown.push_back(&e);
  }
  ImGuiListClipper clip;  // only the visible lines are laid out
  clip.Begin(static_cast<int>(shown.size()));
  while (clip.Step()) {
    for (int i = clip.DisplayStart; i < clip.DisplayEnd; ++i) {
      const EventRecord& r = shown[static_cast<size_t>(i)]->record;
      ImGui::TextDisabled("%s", event_time(r.time_unix_s, ctx.now_unix_s).c_str());
      ImGui::SameLine();
      if (r.step >= 0)
        ImGui::Text("%6lld", static_cast<long long>(r.step));
      else
        ImGui::TextDisabled("     -");
      ImGui::SameLine();
      ImGui::TextColored(kind_colour(r.kind), "%s", r.kind.c_str());
      ImGui::SameLine();
      if (r.rank >= 0) {
        ImGui::Text("r%d", r.rank);
        ImGui::SameLine();
      }
      ImGui::TextUnformatted(r.message.c_str());
    }
  }
  if (s.events.size() != seen_ &&
      ImGui::GetScrollY() >= ImGui::GetScrollMaxY() - ImGui::GetTextLineHeight() * 2)
    ImGui::SetScrollHereY(1.0f);
  seen_ = s.events.size();
  ImGui::EndChild();
}

}  // namespace gantry::console
