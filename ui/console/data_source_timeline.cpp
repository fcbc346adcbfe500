// The DataSource's timeline thread: the Timeline panel's steps × ranks of phases, read from the rank
// records the coordinator already serves (GET /v1/runs/{id}/steps?after=S&ranks=all&limit=N: the one
// record path's JSON edge), apart from the step catch-up and the heatmap's tiles so neither waits for it.
#include <algorithm>
#include <utility>

#include "telemetry/record_json.h"
#include "ui/console/data_source.h"

namespace gantry::console {
namespace {

constexpr int64_t kPageRecords = 100000;  // the route's largest `limit`

}  // namespace

void DataSource::want_timeline(const TimelineWant& want) {
  std::lock_guard<std::mutex> lock(mu_);
  if (want == timeline_want_) return;
  timeline_want_ = want;
  timeline_wanted_ = true;
  cv_.notify_all();
}

// Woken by a new want or a rewind, and every poll interval: a live run's newest steps are read again. Steps
// every rank of the held window reported are kept and not asked for again; the rest of the range is read in
// pages of 100,000 records, and a page cut inside a step reads that step again with the next one.
void DataSource::timeline_main() {
  std::unique_ptr<ApiClient> api;
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    cv_.wait_for(lock, opt_.poll_interval, [&] { return stop_ || (have_endpoint_ && timeline_wanted_); });
    if (stop_) return;
    if (!have_endpoint_ || master_.run.id < 0) continue;
    timeline_wanted_ = false;
    if (timeline_want_.run != master_.run.id) continue;  // nothing asked for this run (yet)
    const TimelineWant want = timeline_want_;
    const RunView run = master_.run;
    const bool rewound = std::exchange(timeline_rewound_, false);
    std::shared_ptr<const TimelineWindow> held = timeline_;
    const Endpoint endpoint = endpoint_;
    lock.unlock();

    const int ranks = std::max(run.world, 1);
    const int64_t steps =
        std::clamp<int64_t>(want.steps, 1, std::max<int64_t>(1, kTimelineMaxRecords / ranks));
    const int64_t first =
        want.first_step > 0 ? want.first_step : std::max<int64_t>(1, run.last_step - steps + 1);
    const int64_t end = std::min(first + steps, run.last_step + 1);  // steps the run has reached
    auto w = std::make_shared<TimelineWindow>();
    w->run = run.id;
    w->first_step = first;
    w->steps = steps;
    w->ranks = ranks;
    w->cells.assign(static_cast<size_t>(steps) * static_cast<size_t>(ranks), TimelineCell{});
    // Keep what the held window has whole from `first` on.
    int64_t fetch_from = first;
    if (!rewound && held->run == run.id && held->ranks == ranks) {
      const int64_t whole_end = held->first_step + held->complete_steps();
      if (held->first_step <= first && whole_end > first) {
        const int64_t keep_end = std::min(whole_end, first + steps);
        for (int r = 0; r < ranks; ++r)
          for (int64_t s = first; s < keep_end; ++s)
            w->cells[static_cast<size_t>(r) * static_cast<size_t>(steps) + static_cast<size_t>(s - first)] =
                held->at(r, s);
        fetch_from = keep_end;
      }
    }
    const bool same_range = held->run == run.id && held->first_step == first && held->steps == steps &&
                            held->ranks == ranks && !rewound;
    if (fetch_from >= end && same_range) {  // nothing new to read
      lock.lock();
      continue;
    }
    if (!api)
      api = std::make_unique<ApiClient>(HttpClientOptions{.url = endpoint.url, .token = endpoint.token});
    bool failed = false;
    for (int64_t after = fetch_from - 1; after < end - 1 && !failed;) {
      Result<nlohmann::json> a = api->steps(run.id, {.after = after, .ranks = "all", .limit = kPageRecords});
      if (!a.ok()) {
        failed = true;
        break;
      }
      const nlohmann::json& rows = a.value().value("rank_steps", nlohmann::json::array());
      int64_t newest = after;
      for (const nlohmann::json& row : rows) {
        RankStepRecord r;
        std::string error;
        if (!record_read_json(row, &r, &error)) continue;  // not a record: skip it
        timeline_put(*w, r);
        newest = std::max(newest, r.step);
      }
      if (static_cast<int64_t>(rows.size()) < kPageRecords) break;  // all there is
      // A full page may end inside a step: read that step again with the next page.
      after = newest - 1 > after ? newest - 1 : newest;
    }
    if (failed) {
      api.reset();  // a fresh connection next time
      lock.lock();
      timeline_wanted_ = true;
      cv_.wait_for(lock, opt_.retry_interval, [&] { return stop_; });
      continue;
    }
    timeline_layout(*w);
    lock.lock();
    if (master_.run.id != run.id || timeline_rewound_) continue;  // stale already: read again
    timeline_ = std::move(w);
    publish_locked();
  }
}

}  // namespace gantry::console
