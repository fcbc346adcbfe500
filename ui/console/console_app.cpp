#include "ui/console/console_app.h"

#include <imgui.h>

#include <chrono>
#include <iterator>

#include "telemetry/clock.h"
#include "ui/console/alert_banner.h"
#include "ui/console/layout_times.h"  // --dump-state's "layout"
#include "ui/console/memory_copy_view.h"

namespace gantry::console {
namespace {

// Set for one frame by "Reset layout": every panel goes back to its place in the default layout.
bool g_reset_layout = false;

// A panel window placed at (x, y, w, h), fractions of the area under the toolbar, the first time only (or
// on "Reset layout").
bool begin_panel(const char* name, float x, float y, float w, float h, ImGuiWindowFlags flags = 0) {
  const ImGuiViewport* vp = ImGui::GetMainViewport();
  const float top = ImGui::GetFrameHeight();
  const ImVec2 area(vp->WorkSize.x, vp->WorkSize.y - top);
  const ImGuiCond cond = g_reset_layout ? ImGuiCond_Always : ImGuiCond_FirstUseEver;
  ImGui::SetNextWindowPos(ImVec2(vp->WorkPos.x + x * area.x, vp->WorkPos.y + top + y * area.y), cond);
  ImGui::SetNextWindowSize(ImVec2(w * area.x, h * area.y), cond);
  return ImGui::Begin(name, nullptr, flags | ImGuiWindowFlags_NoCollapse);
}

// Ctrl + a digit brings a panel to the front (docs/CONSOLE.md, "Keyboard").
constexpr const char* kPanelKeys[] = {"Cluster",     "Run",    "Timeline", "Devices", "Stragglers",
                                      "Checkpoints", "Events", "History",  "Actions"};

// The GLFW backend of this ImGui (1.86) indexes io.KeysDown by GLFW key code, which is the ASCII code for
// digits and letters: the panels do not include GLFW (app/ owns the window), so the codes are written so.
bool ctrl_key(char key) {
  return ImGui::GetIO().KeyCtrl && ImGui::IsKeyPressed(static_cast<int>(key), false);
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
  if (clicks_.button(light_ ? "Dark theme" : "Light theme")) toggle_theme();
  if (clicks_.button("Reset layout")) reset_layout();
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

void ConsoleApp::toggle_theme() {
  light_ = !light_;
  if (light_)
    ImGui::StyleColorsLight();
  else
    ImGui::StyleColorsDark();
}

void ConsoleApp::reset_layout() {
  g_reset_layout = true;
  ++layout_resets_;
}

void ConsoleApp::shortcuts(const ConsoleSnapshot& s) {
  if (ImGui::GetIO().WantTextInput) return;  // typing in a filter: the keys are the text's
  for (size_t i = 0; i < std::size(kPanelKeys); ++i)
    if (ctrl_key(static_cast<char>('1' + i))) ImGui::SetWindowFocus(kPanelKeys[i]);
  if (ctrl_key('0')) reset_layout();
  if (ctrl_key('L')) toggle_theme();
  // Checkpoint now: the one action safe to take on a key (it stops nothing), and only when the coordinator
  // would accept it.
  size_t committed = 0;
  for (const CheckpointView& c : s.checkpoints) committed += c.state == "committed";
  if (ctrl_key('K') && s.run.id >= 0 &&
      action_availability(RunAction::kCheckpoint, s.run.state, committed, s.connected).enabled)
    source_.request_action(s.run.id, RunAction::kCheckpoint);
}

void ConsoleApp::draw(const ConsoleSnapshot& s) {
  frame_ = FrameRecord();
  PanelContext ctx{.source = source_, .clicks = clicks_, .frame = frame_, .now_unix_s = unix_now_s()};
  shortcuts(s);
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
  if (begin_panel("Run", 0.26f, 0.0f, 0.50f, 0.52f, ImGuiWindowFlags_NoScrollWithMouse)) run_.draw(s, ctx);
  ImGui::End();
  // Under the run: the per-rank timeline (the wheel zooms it), then the devices over time.
  if (begin_panel("Timeline", 0.26f, 0.52f, 0.50f, 0.28f, ImGuiWindowFlags_NoScrollWithMouse))
    timeline_.draw(s, ctx);
  ImGui::End();
  if (begin_panel("Devices", 0.26f, 0.80f, 0.50f, 0.20f, ImGuiWindowFlags_NoScrollWithMouse))
    devices_.draw(s, ctx);
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
  g_reset_layout = false;
}

int64_t ConsoleApp::compared_runs() const {
  int64_t n = 0;
  for (const history::OverlaySeries& o : history_.model().overlay()) n += !o.step.empty();
  return n;
}

nlohmann::json ConsoleApp::state_json(const ConsoleSnapshot& s) const {
  using json = nlohmann::json;
  json series = json::array();
  for (const SeriesRecord& r : frame_.series)
    series.push_back({{"name", r.name}, {"length", r.length}, {"rect", {r.x0, r.y0, r.x1, r.y1}}});
  json nodes = json::array();
  for (const NodeView& n : s.nodes) nodes.push_back({{"id", n.id}, {"state", n.state}, {"slots", n.slots}});
  json overlay = json::array(), overlay2 = json::array();
  for (const history::OverlaySeries& o : history_.model().overlay())
    overlay.push_back({{"run", o.run_id}, {"name", o.name}, {"length", o.step.size()}});
  for (const history::OverlaySeries& o : history_.model().overlay(1))
    overlay2.push_back({{"run", o.run_id}, {"name", o.name}, {"length", o.step.size()}});
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
          {"theme", light_ ? "light" : "dark"},
          {"layout_resets", layout_resets_},
          {"phase", s.phase},
          {"auth_refusals", s.auth_refusals},
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
          {"devices", devices_.state_json()},
          {"history",
           {{"open", history_.model().is_open()},
            {"runs", history_.model().runs().size()},
            {"overlay", overlay},
            {"overlay2", overlay2},
            {"metrics",
             {std::string(step_metric_name(history_.model().metric(0))),
              std::string(step_metric_name(history_.model().metric(1)))}},
            {"axis", history_.view().axis == history::CompareAxis::kTime ? "time" : "step"},
            {"smoothing", history_.view().smoothing},
            {"log_scale", history_.view().log_scale}}},
          {"last_action",
           {{"what", s.last_action.what}, {"ok", s.last_action.ok}, {"message", s.last_action.message}}},
          {"alerts_firing", alerts},
          {"quarantine", quarantine}};
}

}  // namespace gantry::console
