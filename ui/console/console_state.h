// What the console knows at one moment, as the UI thread sees it: one immutable ConsoleSnapshot per frame,
// published by the network thread (data_source.h) whenever something changed. The big parts (the step log,
// the band and the heatmap's pages) are shared between snapshots until they change, the pages with the
// tile cache too, so taking a snapshot costs a pointer copy and the UI never waits on the network or on a
// lock held across a request.
#pragma once

#include <cstdint>
#include <memory>
#include <nlohmann/json.hpp>  // RunView::detail: the run's own API object
#include <optional>
#include <string>
#include <vector>

#include "telemetry/records.h"
#include "ui/console/device_series.h"
#include "ui/console/goodput_view.h"
#include "ui/console/rank_band.h"
#include "ui/console/step_log.h"
#include "ui/console/tile_cache.h"
#include "ui/console/timeline.h"

namespace gantry::console {

// A node of /v1/cluster.
struct NodeView {
  std::string id;
  std::string state;  // healthy, quarantined, lost, spare, unhealthy
  std::string host;
  std::string health;         // its agent's health checks: "ok", "unhealthy", "unknown" (none, or not said)
  std::string health_reason;  // why unhealthy ("" otherwise)
  int slots = 0;
  int busy_slots = 0;
  double last_seen_unix_s = 0;
  std::vector<int64_t> runs;
};

// One node's share of a run (the run's placement).
struct ShareView {
  std::string node;
  int first_rank = 0;
  int ranks = 0;
  std::vector<int> slots;
  bool done = false;
};

// A run of /v1/runs (and /v1/runs/{id} for the followed one).
struct RunView {
  int64_t id = -1;
  std::string name;
  std::string state;  // running, paused, stopping, finished, stopped, failed
  std::string message;
  int dp = 0;
  int zero = 0;
  int tp = 1, pp = 1;  // the layout's model-parallel degrees (1 from a coordinator that sends none)
  int world = 0;
  int generation = 0;
  int64_t last_step = -1;
  int64_t max_steps = -1;
  double created_unix_s = 0;
  std::vector<ShareView> placement;
  std::string layout;  // the API's "layout" object as JSON text, e.g. {"dp":4,"pp":1,"tp":1,"zero":1}
  // The run's own object (GET /v1/runs/{id}: its config, the model's dimensions and batch as the coordinator
  // parsed them); null until fetched. The what-if panel plans from it.
  nlohmann::json detail;
  // How its MFU is computed (RunInfo): the MFU plot's tooltip. peak_flops 0 = per device, or unknown.
  std::string peak_name;
  double peak_flops = 0;
  std::string mfu_formula;
  // Its straggler policy (the run's "straggler" options): scoring on, and the quarantine of a flagged rank's
  // node on; unknown until the coordinator said (an older one sends no "quarantine").
  std::optional<bool> straggler_scoring, straggler_quarantine;
  // The in-memory copies the agents hold (the API's "memory_copies", newest first; memory_copy_view.h).
  nlohmann::json memory_copies = nlohmann::json::array();
};

// A rank of /v1/runs/{id}/ranks. The straggler fields come from the coordinator where it scores ranks;
// absent fields stay empty and the console scores the ranks itself from the step records it holds.
struct RankView {
  int32_t rank = 0;
  std::string node;
  std::string host;
  int slot = 0;
  int local_rank = 0;
  // "coord": the rank's place in the layout (ParallelDims' order); none from a coordinator without it.
  struct Coord {
    int dp = 0, pp = 0, tp = 0;
  };
  std::optional<Coord> coord;
  int64_t last_step = 0;
  double step_seconds = 0;
  double busy_seconds = 0;  // "busy_seconds": data wait + forward + backward + optimizer; 0 = not given
  bool done = false;
  std::optional<double> score;       // "straggler.relative": 1 = as fast as the fastest rank
  std::optional<double> individual;  // "straggler.individual": against the rank's own best
  std::optional<bool> flagged;       // "straggler.flagged"
  std::string slow_phase;            // "straggler.slow_phase"; "" = not named
  std::optional<double> excess_s;    // "straggler.excess_s": busy time over the median rank's
  std::string excess;                // "straggler.excess": "forward +0.24 s", as `ctl ranks` prints it
  RankStepRecord latest;  // "latest": the rank's newest step record (phases, sensors); step 0 = none
};

struct CheckpointView {
  int64_t step = 0;
  std::string path;
  std::string state;
  uint64_t bytes = 0;
  double write_s = 0;
  double time_unix_s = 0;
  // The time the step loop was blocked for it (the async copy, or the whole synchronous write); none = not
  // known (catalogued by an older build), shown as "—", never 0.
  std::optional<double> stall_s;
};

struct EventView {
  int64_t id = 0;  // the server's event id: increasing
  EventRecord record;
};

// What the last request the operator made came to: shown under the action buttons.
struct ActionOutcome {
  uint64_t serial = 0;  // increases with every outcome, so a script can wait for the next one
  std::string what;     // "checkpoint run 3"
  bool ok = false;
  std::string message;  // the server's answer or the error
};

struct ConsoleSnapshot {
  uint64_t version = 0;  // increases with every published change

  // The connection.
  std::string url;
  bool embedded = false;  // a cluster this console started (stopped on exit)
  std::string phase;      // "starting the local cluster", "connecting", "connected", "unauthorized", ...
  int auth_refusals = 0;  // answers that refused the token (401/403): the console stops asking after one
  bool connected = false;
  std::string error;  // the last connection error, "" while healthy
  double cluster_seen_unix_s = 0;

  std::vector<NodeView> nodes;
  std::vector<RunView> runs;
  RunView run;  // the run followed; id -1 = none
  std::vector<RankView> ranks;
  std::vector<CheckpointView> checkpoints;
  GoodputView goodput;            // the followed run's goodput ledger (every few seconds)
  std::vector<EventView> events;  // the followed run's, oldest first
  ActionOutcome last_action;

  std::shared_ptr<const StepLog> steps = std::make_shared<StepLog>();
  // The chosen rank time across ranks (min / mean / max per bucket) and the heatmap's pages for the Run
  // panel's last want, both from the coordinator's tile queries.
  std::shared_ptr<const RankBand> band = std::make_shared<RankBand>();
  std::shared_ptr<const HeatPages> heat = std::make_shared<HeatPages>();
  size_t tile_cache_bytes = 0;  // the tile cache's size when published (its bound: DataSourceOptions)
  // The Timeline panel's steps × ranks of phases (DataSource::want_timeline); empty until it asked.
  std::shared_ptr<const TimelineWindow> timeline = std::make_shared<TimelineWindow>();

  // The Devices panel's metric over time for every device (DataSource::set_device_metric), and why it is
  // missing when the coordinator could not answer ("" otherwise).
  std::shared_ptr<const DeviceSeries> devices = std::make_shared<DeviceSeries>();
  std::string devices_error;

  // The tiny run on the built-in corpus that this console can submit (embedded clusters only).
  bool can_submit_tiny = false;
};

}  // namespace gantry::console
