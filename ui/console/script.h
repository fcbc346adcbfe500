// `gantry --script FILE`: a test (or a demo) drives the console through its real window, one command at a
// time, frame by frame. The format, one command per line; blank lines and lines starting with # are
// skipped; arguments are separated by spaces, a label with spaces is quoted ("Checkpoint now"):
//
//   wait_connected            until the coordinator has answered
//   wait_frames N             until N more frames have been drawn
//   wait_steps N              until the followed run's step log reaches step N (fails if the run ends first)
//   wait_state STATE          until the followed run is in STATE (running, paused, stopped, ...)
//   wait_event KIND           until an event of KIND arrives that was not there when the previous
//                             click / submit_tiny / reconnect was carried out (or the script began)
//   wait_action               until the outcome of the last request is known; fails if it was refused
//   click "LABEL"             moves the mouse onto the button LABEL, presses and releases it (it waits
//                             until the button is drawn and enabled)
//   submit_tiny               submits the tiny run (as the toolbar's button does) and follows it
//   reconnect                 drops the connections; the console catches up from where it was
//   quit                      ends the script here
//   wait_timeline N           until the Timeline panel's window holds N steps every rank reported
//   export_timeline PATH      writes the Timeline panel's window as Chrome/Perfetto trace JSON to PATH
//   wait_devices N            until the Devices panel's metric has samples from N devices (nodes or GPUs)
//   wait_compared N           until the History panel compares N runs with points in their curves
//   export_plot NAME PATH     writes the plot NAME (loss, grad, tokens, mfu, band, heat, devband, devheat,
//                             "loss overlay", "second overlay") as CSV or PNG (by PATH's extension) the next
//                             time it is drawn; fails, naming why, when the file cannot be written
//
// A parse error names the file, the line and what is expected; nothing is run. A failing wait ends the
// console with exit code 1 and the reason.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "telemetry/status.h"
#include "ui/console/click_targets.h"
#include "ui/console/console_state.h"

namespace gantry::console {

struct ScriptCommand {
  enum class Kind {
    wait_connected,
    wait_frames,
    wait_steps,
    wait_state,
    wait_event,
    wait_action,
    click,
    submit_tiny,
    reconnect,
    quit,
    wait_timeline,
    export_timeline,
    wait_devices,
    wait_compared,
    export_plot,
    wait_refused
  };
  Kind kind = Kind::quit;
  int64_t number = 0;  // wait_frames, wait_steps, wait_timeline, wait_devices
  std::string text;    // wait_state, wait_event, click, export_timeline; export_plot's plot name
  std::string path;    // export_plot
  int line = 0;
};

Result<std::vector<ScriptCommand>> script_parse(std::string_view text, std::string_view file_name);

// What the script wants of this frame.
struct ScriptOrders {
  bool move_mouse = false;  // override the mouse for this frame
  ScreenPoint mouse;
  bool mouse_down = false;
  bool submit_tiny = false;
  bool reconnect = false;
  std::string export_plot, export_path;  // ask the plot widgets for this export (plot_export.h)
};

// A plot export's end as the window saw it: `error` empty when written.
struct ScriptExportOutcome {
  std::string path, error;
};

// What the window drew that the snapshot does not hold (the panels' own state), for the waits on it.
struct ScriptUiFacts {
  int64_t compared_runs = 0;                 // the History panel's compared runs with points
  std::vector<ScriptExportOutcome> exports;  // every plot export finished so far, oldest first
};

class ScriptRunner {
 public:
  explicit ScriptRunner(std::vector<ScriptCommand> commands) : commands_(std::move(commands)) {}

  // Once per frame, before the UI's new frame, with the frame's snapshot and the buttons of the last frame.
  ScriptOrders step(const ConsoleSnapshot& s, const ClickTargets& clicks, const ScriptUiFacts& ui = {});

  bool done() const { return next_ >= commands_.size() || failed(); }
  bool failed() const { return !failure_.empty(); }
  const std::string& failure() const { return failure_; }
  // "line 3: wait_steps 5" of the command under way, for the state dump and messages.
  std::string current() const;

 private:
  size_t count_events(const ConsoleSnapshot& s, const std::string& kind) const;
  void mark(const ConsoleSnapshot& s);

  std::vector<ScriptCommand> commands_;
  size_t next_ = 0;
  int64_t frames_waited_ = 0;
  int click_phase_ = 0;        // 0: not started, 1: mouse over, 2: pressed, 3: released
  int64_t mark_event_id_ = 0;  // events with a larger id count for wait_event
  uint64_t mark_action_serial_ = 0;
  bool export_asked_ = false;  // export_plot: the request is out; its outcome is awaited
  size_t export_mark_ = 0;     // outcomes before the request
  std::string failure_;
};

}  // namespace gantry::console
