// The console's data path: a network thread that polls the coordinator (cluster, runs, the followed run's
// steps after the last one held, its ranks and checkpoints) and carries out the operator's requests, and a
// second thread that follows the run's event stream (Server-Sent Events). Both write into one model and
// publish an immutable ConsoleSnapshot; the UI thread takes snapshot() once per frame and never waits on
// the network. Everything seen also goes to the local cache (local_cache.h) when one is given.
//
// Catch-up: steps are asked for as "after N" where N is the last step held, so after a broken connection,
// a reconnect or a coordinator that was unreachable for a while the next answer continues exactly there:
// no gap, no repeat (step_log.h drops overlaps). Events resume after the last event id seen
// (Last-Event-ID).
//
// The ranks' times are never pulled as rows: the Run panel says what it shows (want_heatmap: a step range
// at its pixel resolution) and the network thread fetches the pages of the coordinator's heatmap tile
// query it lacks into one bounded cache (tile_cache.h), and the band from the bucketed steps query; a
// live run's newest page and the band are asked again as the run advances. The breakdown and straggler
// tables read each rank's latest record from GET /v1/runs/{id}/ranks.
//
//   DataSource source(options, [] { return Endpoint{url, token}; });
//   source.start();
//   per frame: std::shared_ptr<const ConsoleSnapshot> s = source.snapshot();
//   on a click: source.request_action(s->run.id, RunAction::kCheckpoint);
//   source.stop();   // joins both threads (also in the destructor)
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>

#include "engine/cluster/api_client.h"  // ApiRequest: the queued requests
#include "telemetry/status.h"
#include "ui/console/actions.h"
#include "ui/console/console_state.h"

namespace gantry::console {

class LocalCache;

struct Endpoint {
  std::string url;
  std::string token;
};

// The layout of a resume-from request: each field that is set is sent (zero = 0 included), the others
// stay the run's. dp 0 = the run's.
struct ResumeLayout {
  int dp = 0;
  std::optional<int> zero, tp, pp, vp;
};

// The steps the Timeline panel shows: the newest `steps` of the run (first_step 0) or `steps` from
// first_step; bounded to kTimelineMaxRecords rank records (the steps shrink at a large world).
struct TimelineWant {
  int64_t run = -1;
  int64_t first_step = 0;
  int64_t steps = 64;
  bool operator==(const TimelineWant&) const = default;
};
inline constexpr int64_t kTimelineMaxRecords = int64_t{1} << 20;  // 1,024 ranks × 1,024 steps

struct DataSourceOptions {
  std::string cache_path;   // the local history file; "" = none
  std::string tiny_config;  // TOML of the tiny run request_submit_tiny() submits; "" = none offered
  int tiny_dp = 4;
  int64_t tiny_max_steps = 0;  // 0 = the config's own
  bool embedded = false;       // the cluster is this console's (shown; stopped by the caller on exit)
  std::chrono::milliseconds poll_interval{250};
  std::chrono::milliseconds retry_interval{1000};  // after a failed request
  size_t tile_cache_bytes = size_t{64} << 20;      // the heatmap pages' bound (LRU past it)
  int heat_page_cols = 256;                        // columns per heatmap page (tile_cache.h)
  int heat_coarse_rows = 16;                       // rank rows of the quick first pages (then the full ones)
  int band_buckets = 2000;                         // the band's buckets over the whole run
};

class DataSource {
 public:
  // `endpoint` runs first on the network thread (starting an embedded cluster may take seconds); its
  // error is shown and nothing is polled.
  DataSource(DataSourceOptions options, std::function<Result<Endpoint>()> endpoint);
  ~DataSource();
  DataSource(const DataSource&) = delete;
  DataSource& operator=(const DataSource&) = delete;

  void start();
  void stop();  // prompt: wakes both threads and stops the event stream; joins them

  std::shared_ptr<const ConsoleSnapshot> snapshot() const;

  // Requests, carried out in order on the network thread; each one's outcome becomes
  // snapshot()->last_action.
  void follow(int64_t run_id);                       // -1: the newest live run (the default)
  void request_action(int64_t run_id, RunAction a);  // checkpoint, pause, resume, stop
  void request_resume_from(int64_t run_id, const std::string& checkpoint, int dp) {
    request_resume_from(run_id, checkpoint, ResumeLayout{.dp = dp});
  }
  void request_resume_from(int64_t run_id, const std::string& checkpoint, const ResumeLayout& layout);
  void request_quarantine(const std::string& node);
  void request_release(const std::string& node);  // a quarantined node takes work again
  // The run's straggler policy: quarantine a flagged rank's node (on), or only flag (off), from now on.
  void request_straggler_quarantine(int64_t run_id, bool on);
  void request_submit_tiny();
  // The time metric the band and the heatmap show (busy by default): another one asks for both again.
  void set_rank_metric(RankTimeMetric m);
  // What the heatmap shows now (the Run panel, each frame it changes): the network thread fetches the pages
  // of it that the cache lacks, at once (it is woken), and publishes them as snapshot()->heat.
  void want_heatmap(const HeatWant& want);
  // What the Timeline panel shows: its thread reads those steps' rank records (GET /v1/runs/{id}/steps
  // ?ranks=all, pages of 100,000) into snapshot()->timeline, keeping the steps already whole, and reads
  // the newest steps again while the run lives (data_source_timeline.cpp).
  void want_timeline(const TimelineWant& want);
  // The device metric the Devices panel shows (node CPU by default): its thread reads it for every device
  // (GET /v1/devices) at once and then every second into snapshot()->devices (data_source_devices.cpp).
  void set_device_metric(DeviceMetric m);
  // The local history file (options' cache_path; "" = none), for panels that read it back.
  const std::string& cache_path() const { return opt_.cache_path; }
  // Drops both connections; the next poll opens new ones and catches up from where the model ends.
  void reconnect();

 private:
  struct Request {
    std::string what;  // for the outcome: "checkpoint run 3"
    ApiRequest request;
    bool submit = false;
  };
  void net_main();
  void events_main();
  bool poll_once(ApiClient& api);
  void carry_out(ApiClient& api, const Request& r);
  void publish_locked();
  void fail_locked(const std::string& error);
  bool wait_locked(std::unique_lock<std::mutex>& lock, std::chrono::milliseconds d);
  void reset_run_locked(int64_t id);
  void tiles_main();
  void timeline_main();
  void devices_main();

  DataSourceOptions opt_;
  std::function<Result<Endpoint>()> endpoint_fn_;
  std::thread net_, events_, tiles_thread_, timeline_thread_, devices_thread_;

  mutable std::mutex mu_;  // everything below
  std::condition_variable cv_;
  bool stop_ = false;
  bool reconnect_ = false;
  bool events_restart_ = false;
  bool events_ended_ =
      false;  // the server ended the run's stream (the run had ended): reopen if it lives again
  Endpoint endpoint_;
  bool have_endpoint_ = false;
  bool unauthorized_ = false;  // the coordinator refused the token: no retries until a reconnect
  std::deque<Request> requests_;
  int64_t follow_ = -1;      // asked for; -1 = automatic
  int64_t config_run_ = -1;  // the run whose own object detail_ holds (GET /v1/runs/{id}, once a run)
  nlohmann::json detail_;
  ConsoleSnapshot master_;  // the model, less the two shared parts below
  StepLog steps_;
  RankTimeMetric rank_metric_ = RankTimeMetric::kBusy;
  HeatWant heat_want_;
  bool heat_wanted_ = false;  // a new want not yet served: the network thread's wait ends for it
  std::shared_ptr<const RankBand> band_ = std::make_shared<RankBand>();
  std::shared_ptr<const HeatPages> heat_ = std::make_shared<HeatPages>();
  bool tiles_rewound_ = false;  // the run was rewound: the pages and the band held are stale
  TileCache tiles_{0};          // the tile thread's only (sized from the options in the constructor)
  TimelineWant timeline_want_;
  bool timeline_wanted_ = false;   // a new want not yet served
  bool timeline_rewound_ = false;  // the run was rewound: the window held is stale
  std::shared_ptr<const TimelineWindow> timeline_ = std::make_shared<TimelineWindow>();
  DeviceMetric device_metric_ = DeviceMetric::kNodeCpu;
  bool device_wanted_ = false;  // a new metric not yet read
  std::shared_ptr<const DeviceSeries> devices_ = std::make_shared<DeviceSeries>();
  std::string devices_error_;
  bool steps_dirty_ = false;
  static constexpr double kGoodputPollS = 2.0;
  double goodput_polled_s_ = 0;  // monotonic_s() of the last goodput request (network thread)
  std::shared_ptr<const ConsoleSnapshot> published_;
  int64_t last_event_id_ = 0;
  int64_t pending_rewind_ = -1;  // a step the local cache must rewind to (from an event)
  std::vector<EventRecord> pending_cache_events_;
  HttpEventStream* stream_ = nullptr;  // the open event stream, so stop() and follow() can end it

  std::unique_ptr<LocalCache> cache_;  // network thread only
  int64_t cache_run_ = -1;
  int64_t cache_run_remote_ = -1;
  bool cache_finished_ = false;
};

}  // namespace gantry::console
