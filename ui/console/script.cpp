#include "ui/console/script.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>

#include "engine/cluster/run_lifecycle.h"  // run_state_terminal
#include "ui/console/actions.h"            // action_label: the Actions panel's buttons

namespace gantry::console {
namespace {

// Splits a line into words; "a quoted label" is one word (without its quotes).
Result<std::vector<std::string>> split_words(std::string_view line) {
  std::vector<std::string> out;
  size_t i = 0;
  while (i < line.size()) {
    if (line[i] == ' ' || line[i] == '\t') {
      ++i;
      continue;
    }
    if (line[i] == '"') {
      const size_t close = line.find('"', i + 1);
      if (close == std::string_view::npos) return Status::error("a quoted label has no closing \"");
      out.emplace_back(line.substr(i + 1, close - i - 1));
      i = close + 1;
      continue;
    }
    size_t end = i;
    while (end < line.size() && line[end] != ' ' && line[end] != '\t') ++end;
    out.emplace_back(line.substr(i, end - i));
    i = end;
  }
  return out;
}

// The buttons a script can click: the console's fixed labels, the Actions panel's (action_label), and
// "Release NODE" for any node (its id is not known when the script is read). A label outside these would
// be waited for forever, so it is refused when the script is read.
const std::vector<std::string>& known_labels() {
  static const std::vector<std::string> kLabels = [] {
    std::vector<std::string> v = {"Submit tiny run",
                                  "Stop the cluster and quit",
                                  "Quit, leave it running",
                                  "Cancel##quit",
                                  "Quarantine node...",
                                  "Cancel##quarantine",
                                  "Export trace",
                                  "Refresh",
                                  "Clear selection",
                                  "Apply",
                                  "Light theme",
                                  "Dark theme",
                                  "Reset layout"};
    for (RunAction a : kRunActions) v.emplace_back(action_label(a));
    return v;
  }();
  return kLabels;
}
constexpr std::string_view kReleasePrefix = "Release ";

bool label_known(const std::string& label) {
  if (label.size() > kReleasePrefix.size() && label.starts_with(kReleasePrefix)) return true;
  for (const std::string& l : known_labels())
    if (l == label) return true;
  return false;
}

// The event kinds the coordinator, the agents and the workers record (docs/CLUSTER.md, TELEMETRY.md), and
// "run_STATE" for every run state. wait_event on another kind would wait forever: refused when read.
const std::vector<std::string>& known_event_kinds() {
  static const std::vector<std::string> kKinds = [] {
    std::vector<std::string> v = {"action_checkpoint",
                                  "action_pause",
                                  "action_resume",
                                  "action_stop",
                                  "action_requested",
                                  "adopt_missing",
                                  "adopt_waiting",
                                  "alert",
                                  "alert_cleared",
                                  "alert_hook",
                                  "checkpoint",
                                  "checkpoint_damaged",
                                  "checkpoint_deleted",
                                  "checkpoint_delete_failed",
                                  "checkpoint_failed",
                                  "checkpoint_interval",
                                  "checkpoint_written",
                                  "fault_injected",
                                  "generation_first_step",
                                  "generation_placed",
                                  "guard_rollback",
                                  "guard_rollback_placed",
                                  "guard_rollback_resumed",
                                  "guard_streak",
                                  "hang",
                                  "node_failed",
                                  "node_healthy",
                                  "node_lost",
                                  "node_unhealthy",
                                  "placed",
                                  "quarantine_checkpointed",
                                  "quarantine_placed",
                                  "quarantine_requested",
                                  "quarantine_resumed",
                                  "quarantine_stopped",
                                  "rank_failed",
                                  "recovery_placed",
                                  "recovery_resumed",
                                  "restore",
                                  "restore_fallback",
                                  "resume_placed",
                                  "resume_requested",
                                  "resume_resumed",
                                  "run_adopted",
                                  "sdc_mismatch",
                                  "sdc_quarantine",
                                  "step_skipped",
                                  "straggler",
                                  "straggler_cleared",
                                  "straggler_policy",
                                  "straggler_quarantine",
                                  "submitted"};
    for (RunState st : kRunStates) v.push_back("run_" + std::string(run_state_name(st)));
    return v;
  }();
  return kKinds;
}

std::string joined(const std::vector<std::string>& v) {
  std::string out;
  for (const std::string& x : v) out += (out.empty() ? "" : ", ") + x;
  return out;
}

// The plot widgets' ids without their "##" (plot_export.h's plot_name): a plot outside these would be
// waited for forever, so it is refused when the script is read.
const std::vector<std::string>& known_plots() {
  static const std::vector<std::string> kPlots = {"loss",         "grad",           "tokens",  "mfu",
                                                  "band",         "heat",           "devband", "devheat",
                                                  "loss overlay", "second overlay", "timeline"};
  return kPlots;
}

bool path_ends_with(const std::string& path, std::string_view ext) {
  if (path.size() < ext.size()) return false;
  for (size_t i = 0; i < ext.size(); ++i) {
    char c = path[path.size() - ext.size() + i];
    if (c >= 'A' && c <= 'Z') c = static_cast<char>(c - 'A' + 'a');
    if (c != ext[i]) return false;
  }
  return true;
}

bool parse_count(const std::string& s, int64_t* out) {
  if (s.empty() || s.find_first_not_of("0123456789") != std::string::npos || s.size() > 12) return false;
  *out = std::strtoll(s.c_str(), nullptr, 10);
  return true;
}

}  // namespace

Result<std::vector<ScriptCommand>> script_parse(std::string_view text, std::string_view file_name) {
  using K = ScriptCommand::Kind;
  struct Spec {
    const char* word;
    K kind;
    char arg;  // 0: none, 'n': a count, 's': a word or quoted label
  };
  static const Spec kSpecs[] = {{"wait_connected", K::wait_connected, 0},
                                {"wait_frames", K::wait_frames, 'n'},
                                {"wait_steps", K::wait_steps, 'n'},
                                {"wait_state", K::wait_state, 's'},
                                {"wait_event", K::wait_event, 's'},
                                {"wait_action", K::wait_action, 0},
                                {"click", K::click, 's'},
                                {"submit_tiny", K::submit_tiny, 0},
                                {"reconnect", K::reconnect, 0},
                                {"quit", K::quit, 0},
                                {"wait_timeline", K::wait_timeline, 'n'},
                                {"export_timeline", K::export_timeline, 's'},
                                {"wait_devices", K::wait_devices, 'n'},
                                {"wait_compared", K::wait_compared, 'n'},
                                {"export_plot", K::export_plot, 'p'},
                                {"wait_refused", K::wait_refused, 0}};
  std::vector<ScriptCommand> out;
  int line_no = 0;
  size_t pos = 0;
  while (pos <= text.size()) {
    size_t end = text.find('\n', pos);
    if (end == std::string_view::npos) end = text.size();
    std::string_view line = text.substr(pos, end - pos);
    pos = end + 1;
    ++line_no;
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    const std::string where = std::string(file_name) + ":" + std::to_string(line_no) + ": ";
    Result<std::vector<std::string>> words = split_words(line);
    if (!words.ok()) return Status::error(where + words.error());
    if (words->empty() || words->front()[0] == '#') continue;
    const std::string& cmd = words->front();
    const Spec* spec = nullptr;
    for (const Spec& s : kSpecs)
      if (cmd == s.word) spec = &s;
    if (spec == nullptr) {
      std::string known;
      for (const Spec& s : kSpecs) known += (known.empty() ? "" : ", ") + std::string(s.word);
      return Status::error(where + "unknown command \"" + cmd + "\" (known: " + known + ")");
    }
    const size_t want = spec->arg == 0 ? 1 : spec->arg == 'p' ? 3 : 2;
    if (words->size() != want) {
      return Status::error(
          where + cmd + " takes " +
          (spec->arg == 0     ? std::string("no argument")
           : spec->arg == 'p' ? std::string("a plot and a path, e.g. ") + cmd + " loss out.csv"
           : spec->arg == 'n' ? std::string("one count, e.g. ") + cmd + " 3"
                              : std::string("one argument, e.g. ") + cmd + " \"Checkpoint now\"") +
          ", got " + std::to_string(words->size() - 1));
    }
    ScriptCommand c{.kind = spec->kind, .line = line_no};
    if (spec->arg == 'n' && !parse_count(words.value()[1], &c.number)) {
      return Status::error(where + cmd + ": \"" + words.value()[1] +
                           "\" is not a count (a whole number >= 0)");
    }
    if (spec->arg == 's' || spec->arg == 'p') c.text = words.value()[1];
    if (spec->arg == 'p') c.path = words.value()[2];
    if (c.kind == K::export_plot) {
      const std::vector<std::string>& plots = known_plots();
      if (std::find(plots.begin(), plots.end(), c.text) == plots.end()) {
        return Status::error(where + "export_plot: unknown plot \"" + c.text +
                             "\" (the console's plots: " + joined(plots) + ")");
      }
      if (!path_ends_with(c.path, ".csv") && !path_ends_with(c.path, ".png")) {
        return Status::error(where + "export_plot: \"" + c.path +
                             "\" must end in .csv (the plot's data) or .png (its picture)");
      }
    }
    // A state no run can be in would wait for ever: refused now, with the states there are.
    if (c.kind == K::wait_state && !run_state_from_name(c.text)) {
      std::string states;
      for (RunState st : kRunStates) states += (states.empty() ? "" : ", ") + std::string(run_state_name(st));
      return Status::error(where + "wait_state: unknown state \"" + c.text +
                           "\" (a run is one of: " + states + ")");
    }
    if (c.kind == K::click && !label_known(c.text)) {
      return Status::error(where + "click: unknown label \"" + c.text + "\" (the console's buttons: " +
                           joined(known_labels()) + ", and \"Release NODE\" for a node)");
    }
    if (c.kind == K::wait_event) {
      const std::vector<std::string>& kinds = known_event_kinds();
      if (std::find(kinds.begin(), kinds.end(), c.text) == kinds.end()) {
        return Status::error(where + "wait_event: unknown event kind \"" + c.text +
                             "\" (known: " + joined(kinds) + ")");
      }
    }
    out.push_back(std::move(c));
    if (end == text.size()) break;
  }
  return out;
}

std::string ScriptRunner::current() const {
  if (next_ >= commands_.size()) return "";
  const ScriptCommand& c = commands_[next_];
  static const char* const kNames[] = {"wait_connected", "wait_frames",   "wait_steps",    "wait_state",
                                       "wait_event",     "wait_action",   "click",         "submit_tiny",
                                       "reconnect",      "quit",          "wait_timeline", "export_timeline",
                                       "wait_devices",   "wait_compared", "export_plot",   "wait_refused"};
  std::string s = "line " + std::to_string(c.line) + ": " + kNames[static_cast<int>(c.kind)];
  if (c.kind == ScriptCommand::Kind::wait_frames || c.kind == ScriptCommand::Kind::wait_steps ||
      c.kind == ScriptCommand::Kind::wait_timeline || c.kind == ScriptCommand::Kind::wait_devices ||
      c.kind == ScriptCommand::Kind::wait_compared)
    s += " " + std::to_string(c.number);
  if (!c.text.empty()) s += " \"" + c.text + "\"";
  if (!c.path.empty()) s += " " + c.path;
  return s;
}

size_t ScriptRunner::count_events(const ConsoleSnapshot& s, const std::string& kind) const {
  size_t n = 0;
  for (const EventView& e : s.events)
    if (e.id > mark_event_id_ && e.record.kind == kind) ++n;
  return n;
}

void ScriptRunner::mark(const ConsoleSnapshot& s) {
  mark_event_id_ = s.events.empty() ? 0 : s.events.back().id;
  mark_action_serial_ = s.last_action.serial;
}

ScriptOrders ScriptRunner::step(const ConsoleSnapshot& s, const ClickTargets& clicks,
                                const ScriptUiFacts& ui) {
  using K = ScriptCommand::Kind;
  ScriptOrders o;
  if (next_ == 0 && frames_waited_ == 0 && click_phase_ == 0) mark(s);
  // Several commands that need no frame of their own (a wait already met) run in one frame.
  for (int guard = 0; guard < 64 && !done(); ++guard) {
    const ScriptCommand& c = commands_[next_];
    auto fail = [&](const std::string& why) { failure_ = current() + ": " + why; };
    // A wait the connection can never meet fails at once; a refused token is what wait_refused waits for,
    // and frames are drawn after it (a refusal that must stay one).
    const bool refusal_awaited =
        s.phase == "unauthorized" && (c.kind == K::wait_refused || c.kind == K::wait_frames);
    if ((s.phase == "failed" || s.phase == "unauthorized") && c.kind != K::quit && c.kind != K::reconnect &&
        !refusal_awaited) {
      fail("the console could not connect: " + s.error);
      return o;
    }
    bool finished = false;
    switch (c.kind) {
      case K::wait_connected:
        finished = s.connected;
        break;
      case K::wait_frames:
        finished = frames_waited_++ >= c.number;
        break;
      case K::wait_steps:
        finished = s.steps->last_step() >= c.number;
        if (!finished && s.run.id >= 0 && run_state_terminal(s.run.state) && s.run.last_step >= 0 &&
            s.run.last_step < c.number) {
          fail("run " + std::to_string(s.run.id) + " is " + s.run.state + " at step " +
               std::to_string(s.run.last_step));
          return o;
        }
        break;
      case K::wait_state:
        finished = s.run.state == c.text;
        break;
      case K::wait_event:
        finished = count_events(s, c.text) > 0;
        break;
      case K::wait_action:
        if (s.last_action.serial > mark_action_serial_) {
          if (!s.last_action.ok) {
            fail(s.last_action.what + " was refused: " + s.last_action.message);
            return o;
          }
          finished = true;
        }
        break;
      case K::click: {
        const ClickTarget* t = clicks.find(c.text);
        if (t == nullptr || !t->enabled) {
          click_phase_ = 0;  // not there (yet): wait for it to be drawn and enabled
          return o;
        }
        o.move_mouse = true;
        o.mouse = {(t->min.x + t->max.x) / 2, (t->min.y + t->max.y) / 2};
        o.mouse_down = click_phase_ == 1;  // frame 0: hover, frame 1: press, frame 2: release
        if (click_phase_ == 0) mark(s);
        if (++click_phase_ < 3) return o;
        click_phase_ = 0;
        finished = true;
        break;
      }
      case K::submit_tiny:
        mark(s);
        o.submit_tiny = true;
        finished = true;
        break;
      case K::reconnect:
        mark(s);
        o.reconnect = true;
        finished = true;
        break;
      case K::quit:
        next_ = commands_.size();
        return o;
      case K::wait_timeline:
        finished = s.timeline->run == s.run.id && s.timeline->complete_steps() >= c.number;
        break;
      case K::export_timeline:
        if (s.timeline->empty()) {
          fail("the Timeline panel holds no steps yet (wait_timeline first)");
          return o;
        }
        if (Status st = timeline_trace_write(*s.timeline, c.text); !st.ok()) {
          fail(st.message());
          return o;
        }
        finished = true;
        break;
      case K::wait_devices: {
        // Rows of the Devices panel's metric with a sample in the newest column that has any.
        const DeviceSeries& d = *s.devices;
        int64_t rows = 0;
        for (size_t r = 0; r < d.rows.size(); ++r) {
          bool any = false;
          for (int32_t col = 0; col < d.cols && !any; ++col) any = !std::isnan(d.at_max(r, col));
          rows += any;
        }
        finished = rows >= c.number;
        break;
      }
      case K::wait_compared:
        finished = ui.compared_runs >= c.number;
        break;
      case K::wait_refused:
        if (s.connected) {
          fail("the coordinator accepted the token");
          return o;
        }
        finished = s.phase == "unauthorized";
        break;
      case K::export_plot:
        if (!export_asked_) {
          // Asked once; the widget writes it when next drawn (a PNG after that frame is rendered).
          export_asked_ = true;
          export_mark_ = ui.exports.size();
          o.export_plot = c.text;
          o.export_path = c.path;
          return o;
        }
        for (size_t i = export_mark_; i < ui.exports.size() && !finished; ++i) {
          if (ui.exports[i].path != c.path) continue;
          if (!ui.exports[i].error.empty()) {
            fail(ui.exports[i].error);
            return o;
          }
          finished = true;
        }
        if (finished) export_asked_ = false;
        break;
    }
    if (!finished) return o;
    ++next_;
    frames_waited_ = 0;
    if (o.move_mouse || o.submit_tiny || o.reconnect) return o;  // one input per frame
  }
  return o;
}

}  // namespace gantry::console
