// The History window: ui/history's panel over the console's own cache file.
#include <imgui.h>

#include <filesystem>
#include <string>

#include "engine/cluster/run_lifecycle.h"  // run_state_terminal
#include "ui/console/panels.h"

namespace gantry::console {
namespace {

bool ended(const std::string& state) {
  return run_state_terminal(state);
}

}  // namespace

void HistoryPanel::draw(const ConsoleSnapshot& s, PanelContext& ctx) {
  ctx.frame.panels.push_back("History");
  const std::string& path = ctx.source.cache_path();
  if (!model_.is_open() && !path.empty() && ctx.now_unix_s >= next_open_unix_s_) {
    // Opening read-only fails until the network thread has created the file: try again a second later
    // rather than every frame.
    std::error_code ec;
    Status st =
        std::filesystem::exists(path, ec) ? model_.open(path) : Status::error("no cache yet at " + path);
    open_error_ = st.ok() ? "" : st.message();
    next_open_unix_s_ = ctx.now_unix_s + 1.0;
  }
  // A run that ends has its final steps and state in the cache: read the list and curves again, now and
  // once more two seconds later, as the network thread writes the cache after it publishes the state.
  const bool run_ended_now = s.run.id >= 0 && ended(s.run.state);
  if (model_.is_open() && s.run.id == seen_run_ && run_ended_now && !seen_ended_) {
    model_.refresh();
    refresh_at_unix_s_ = ctx.now_unix_s + 2.0;
  }
  if (model_.is_open() && refresh_at_unix_s_ > 0 && ctx.now_unix_s >= refresh_at_unix_s_) {
    model_.refresh();
    refresh_at_unix_s_ = 0;
  }
  // Keeping up with the live run: its steps reach the cache as they arrive, so the list and the compared
  // curves are read again every two seconds while the followed run lives.
  if (model_.is_open() && s.run.id >= 0 && !run_ended_now && ctx.now_unix_s >= live_refresh_at_unix_s_) {
    model_.refresh();
    live_refresh_at_unix_s_ = ctx.now_unix_s + 2.0;
  }
  // Something before a click: with nothing chosen, the newest run (the one the console follows, as a rule)
  // is compared; once the operator has chosen, their choice stays.
  if (model_.is_open() && model_.selected().empty() && !model_.runs().empty() && !operator_chose_)
    model_.select(model_.runs().front().id);
  seen_run_ = s.run.id;
  seen_ended_ = run_ended_now;

  if (path.empty())
    ImGui::TextDisabled("this console keeps no local cache");
  else if (!model_.is_open())
    ImGui::TextDisabled("%s", open_error_.c_str());
  if (history::history_panel(
          model_, view_, [&](const char* label, bool enabled) { return ctx.clicks.button(label, enabled); }))
    operator_chose_ = true;
  for (size_t k = 0; k < 2; ++k) {
    for (const history::OverlaySeries& o : model_.overlay(k)) {
      ctx.frame.series.push_back({"compare " + std::string(step_metric_name(model_.metric(k))) + " " + o.name,
                                  o.step.size(), 0, 0, 0, 0});
    }
  }
}

}  // namespace gantry::console
