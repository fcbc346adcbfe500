#include "ui/console/console_app.h"

#include <imgui.h>

#include <chrono>

#include "telemetry/clock.h"
#include "ui/console/alert_banner.h"
#include "ui/console/layout_times.h"  // --dump-state's "layout"
#include "ui/console/memory_copy_view.h"

namespace gantry::console {
namespace {

// A panel window placed at (x, y, w, h), fractions of the area under the toolbar, the first time only.
bool begin_panel(const char* name, float x, float y, float w, float h, ImGuiWindowFlags flags = 0) {
  const ImGuiViewport* vp = ImGui::GetMainViewport();
  const float top = ImGui::GetFrameHeight();
  const ImVec2 area(vp->WorkSize.x, vp->WorkSize.y - top);
  ImGui::SetNextWindowPos(ImVec2(vp->WorkPos.x + x * area.x, vp->WorkPos.y + top + y * area.y),
                          ImGuiCond_FirstUseEver);
  ImGui::SetNextWindowSize(ImVec2(w * area.x, h * area.y), ImGuiCond_FirstUseEver);
  return ImGui::Begin(name, nullptr, flags | ImGuiWindowFlags_NoCollapse);
}

}  // namespace

void ConsoleApp::toolbar(const ConsoleSnapshot& s) {
  if (!ImGui::BeginMainMenuBar()) return;
  const ImVec4 colour = s.connected ? ImVec4(0.5f, 0.9f, 0.5f, 1) : ImVec4(1, 0.6f, 0.3f, 1);
  ImGui::TextColored(colour, "%s", s.connected ? "connected" : s.phase.c_str());
  ImGui::TextDisabled("%s%s", s.url.c_str(), s.embedded ? " (local cluster)" : "");
  if (!s.error.empty()) ImGui::TextColored(ImVec4(1, 0.5f, 0.4f, 1), "%s", s.error.c_str());
  if (s.can_submit_tiny) {
    if (clicks_.button("Submit tiny run", s.connected)) source_.request_submit_tiny();
    if (ImGui::IsItemHovered())
      ImGui::SetTooltip("tiny GPT on the built-in synthetic corpus, dp 4 over the local nodes");
  }
  // The run followed: any run of the cluster.
  const std::string label =
      s.run.id >= 0 ? "run " + std::to_string(s.run.id) + " (" + s.run.state + ")" : "no run";
  ImGui::SetNextItemWidth(ImGui::GetFontSize() * 12);
  if (ImGui::BeginCombo("##run", label.c_str())) {
    for (auto it = s.runs.rbegin(); it != s.runs.rend(); ++it) {
      const std::string item = "run " + std::to_string(it->id) + " " + it->name + " (" + it->state + ")";
      if (ImGui::Selectable(item.c_str(), it->id == s.run.id)) source_.follow(it->id);
    }
    ImGui::EndCombo();
  }
  // The banner: the newest alert firing for the followed run, and how many more (the Events panel has all).
  const std::vector<FiringAlert> firing = alerts_firing(s.events);
  if (!firing.empty()) {
    ImGui::TextColored(
        ImVec4(1, 0.35f, 0.3f, 1), "ALERT %s%s", firing.back().message.c_str(),
        firing.size() > 1 ? (" (+" + std::to_string(firing.size() - 1) + " more)").c_str() : "");
  }
  ImGui::EndMainMenuBar();
}

void ConsoleApp::close_dialog(const ConsoleSnapshot& s) {
  if (confirm_close && !ImGui::IsPopupOpen("Quit?")) ImGui::OpenPopup("Quit?");
  if (!ImGui::BeginPopupModal("Quit?", nullptr, ImGuiWindowFlags_AlwaysAutoResize)) return;
  ImGui::Text("This console started the local cluster at %s.", s.url.c_str());
  ImGui::TextUnformatted("Stopping it checkpoints and stops its runs.");
  if (clicks_.button("Stop the cluster and quit")) {
    close_confirmed = true;
    ImGui::CloseCurrentPopup();
  }
  ImGui::SameLine();
  if (clicks_.button("Quit, leave it running")) {
    close_confirmed = close_keep_cluster = true;
    ImGui::CloseCurrentPopup();
  }
  ImGui::SameLine();
  if (clicks_.button("Cancel##quit")) {
    confirm_close = false;
    ImGui::CloseCurrentPopup();
  }
  ImGui::EndPopup();
}

void ConsoleApp::draw(const ConsoleSnapshot& s) {
  frame_ = FrameRecord();
  PanelContext ctx{.source = source_, .clicks = clicks_, .frame = frame_, .now_unix_s = unix_now_s()};
  toolbar(s);
  // Left: cluster, actions, stragglers, what-if. Middle: the run. Right: checkpoints, events, history.
  if (begin_panel("Cluster", 0.0f, 0.0f, 0.26f, 0.28f)) cluster_.draw(s, ctx);
  ImGui::End();
  if (begin_panel("Actions", 0.0f, 0.28f, 0.26f, 0.18f)) actions_.draw(s, ctx);
  ImGui::End();
  if (begin_panel("Stragglers", 0.0f, 0.46f, 0.26f, 0.2f)) stragglers_.draw(s, ctx);
  ImGui::End();
  if (begin_panel("What-if", 0.0f, 0.66f, 0.26f, 0.34f)) whatif_.draw(s, ctx);
  ImGui::End();
  if (begin_panel("Run", 0.26f, 0.0f, 0.50f, 0.64f, ImGuiWindowFlags_NoScrollWithMouse)) run_.draw(s, ctx);
  ImGui::End();
  // Under the run: the per-rank timeline (the wheel zooms it).
  if (begin_panel("Timeline", 0.26f, 0.64f, 0.50f, 0.36f, ImGuiWindowFlags_NoScrollWithMouse))
    timeline_.draw(s, ctx);
  ImGui::End();
  if (begin_panel("Checkpoints", 0.76f, 0.0f, 0.24f, 0.22f)) checkpoints_.draw(s, ctx);
  ImGui::End();
  if (begin_panel("Events", 0.76f, 0.22f, 0.24f, 0.4f)) events_.draw(s, ctx);
  ImGui::End();
  // The wheel zooms the overlay plot, so it must not scroll the window.
  if (begin_panel("History", 0.76f, 0.62f, 0.24f, 0.38f, ImGuiWindowFlags_NoScrollWithMouse))
    history_.draw(s, ctx);
  ImGui::End();
  close_dialog(s);
}

nlohmann::json ConsoleApp::state_json(const ConsoleSnapshot& s) const {
  using json = nlohmann::json;
  json series = json::array();
  for (const SeriesRecord& r : frame_.series)
    series.push_back({{"name", r.name}, {"length", r.length}, {"rect", {r.x0, r.y0, r.x1, r.y1}}});
  json nodes = json::array();
  for (const NodeView& n : s.nodes) nodes.push_back({{"id", n.id}, {"state", n.state}, {"slots", n.slots}});
  json overlay = json::array();
  for (const history::OverlaySeries& o : history_.model().overlay())
    overlay.push_back({{"run", o.run_id}, {"name", o.name}, {"length", o.step.size()}});
  json events = json::object();
  for (const EventView& e : s.events) events[e.record.kind] = events.value(e.record.kind, 0) + 1;
  const MemoryCopyView mem = memory_copy_view(s.run.memory_copies, s.run.placement);
  json mem_shards = json::array();
  for (const MemoryShardView& m : mem.shards)
    mem_shards.push_back({{"rank", m.rank}, {"node", m.node}, {"peers", m.peers}});
  json alerts = json::array();
  for (const FiringAlert& a : alerts_firing(s.events))
    alerts.push_back({{"rule", a.rule}, {"run", a.run}, {"message", a.message}});
  const QuarantinePlan& q = stragglers_.plan();
  const json quarantine = {
      {"node", q.node}, {"enabled", q.enabled}, {"why_not", q.why_not}, {"moves", q.moves}};
  return {{"panels", frame_.panels},
          {"series", series},
          {"last_step", s.steps->last_step()},
          {"steps_held", s.steps->size()},
          {"gap_steps", s.steps->gap_steps()},
          {"heat_pages", s.heat->pages.size()},
          {"tile_cache_bytes", s.tile_cache_bytes},
          {"run", {{"id", s.run.id}, {"state", s.run.state}, {"name", s.run.name}, {"dp", s.run.dp}}},
          {"layout", layout_state_json(s)},  // issue 17: each rank's (dp, pp, tp), stage and tp group times
          {"connected", s.connected},
          {"url", s.url},
          {"embedded", s.embedded},
          {"error", s.error},
          {"nodes", nodes},
          {"events", events},
          {"checkpoints", s.checkpoints.size()},
          {"memory_copy",
           {{"step", mem.step ? json(*mem.step) : json(nullptr)},
            {"text", memory_copy_text(mem)},
            {"shards", mem_shards}}},
          {"goodput",
           {{"have", s.goodput.have},
            {"known", s.goodput.known},
            {"ettr", s.goodput.ettr ? json(*s.goodput.ettr) : json(nullptr)},
            {"bar_parts", goodput_bar(s.goodput).size()},
            {"failures", s.goodput.failures.size()}}},
          {"whatif",
           {{"run", whatif_.loaded_run()},
            {"candidates", whatif_.model().candidates().size()},
            {"apply_enabled", whatif_.apply_enabled()}}},
          {"timeline", timeline_.state_json()},
          {"history",
           {{"open", history_.model().is_open()},
            {"runs", history_.model().runs().size()},
            {"overlay", overlay}}},
          {"last_action",
           {{"what", s.last_action.what}, {"ok", s.last_action.ok}, {"message", s.last_action.message}}},
          {"alerts_firing", alerts},
          {"quarantine", quarantine}};
}

}  // namespace gantry::console
