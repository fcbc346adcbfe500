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
  seen_run_ = s.run.id;
  seen_ended_ = run_ended_now;

  if (path.empty())
    ImGui::TextDisabled("this console keeps no local cache");
  else if (!model_.is_open())
    ImGui::TextDisabled("%s", open_error_.c_str());
  history::history_panel(model_, view_,
                         [&](const char* label, bool enabled) { return ctx.clicks.button(label, enabled); });
}

}  // namespace gantry::console
