#include "engine/core/train_checkpoints.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <utility>
#include <vector>

#include "engine/core/comm/communicator.h"
#include "engine/core/comm/store_client.h"

namespace gantry {

namespace {

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

Status checkpoint_load_agree(const Status& own, bool own_damaged, const std::string& dir, Communicator* comm,
                             StoreClient* store, std::chrono::milliseconds timeout, bool* damaged) {
  if (damaged != nullptr) *damaged = false;
  if (comm == nullptr || comm->size() <= 1) {
    if (damaged != nullptr) *damaged = !own.ok() && own_damaged;
    return own;
  }
  const int rank = comm->rank(), world = comm->size();
  // Every rank that failed sets it before the all-reduce (the last one's stays), so once the all-reduce
  // says some rank failed, the key holds a failed rank's reason. One key, not one per directory: the
  // agents' in-memory restore gives each node a path of its own; and each gang has a store of its own.
  const std::string key = "resume_refused";
  if (!own.ok() && store != nullptr) {
    const std::string v = std::to_string(rank) + "\n" + own.message();
    (void)store->set(key, std::span<const uint8_t>(reinterpret_cast<const uint8_t*>(v.data()), v.size()),
                     timeout);  // best effort: without it the peers still say that a rank failed
  }
  // {ranks that failed, ranks that failed on the checkpoint's damage}.
  float failed[2] = {own.ok() ? 0.0f : 1.0f, !own.ok() && own_damaged ? 1.0f : 0.0f};
  if (Status st = comm->all_reduce(failed, 2, timeout); !st.ok()) {
    if (!own.ok()) return own;
    return Status::error("checkpoint " + dir +
                         ": the ranks could not agree that every one loaded it: " + st.message());
  }
  const int n = static_cast<int>(failed[0]);
  if (damaged != nullptr) *damaged = n > 0 && static_cast<int>(failed[1]) == n;
  if (!own.ok()) return own;
  if (n == 0) return {};
  std::string who = std::to_string(n) + " of " + std::to_string(world) + " ranks", why;
  if (store != nullptr) {
    Result<std::vector<uint8_t>> got = store->get(key, std::min(timeout, std::chrono::milliseconds(5000)));
    const std::string v = got.ok() ? std::string(got->begin(), got->end()) : "";
    if (const size_t nl = v.find('\n'); nl != std::string::npos) {
      who = "rank " + v.substr(0, nl) + " of " + std::to_string(world) +
            (n > 1 ? " (and " + std::to_string(n - 1) + " more)" : "");
      why = ": " + v.substr(nl + 1);
    }
  }
  return Status::error(who + " could not load the checkpoint " + dir + ", so no rank resumes" +
                       (why.empty() ? " (their own messages say why)" : why));
}

std::string checkpoint_cost_text(const CheckpointReport& c) {
  char buf[160];
  if (c.async) {
    std::snprintf(buf, sizeof buf, "async: stall %.3f s, write %.3f s", c.stall_s, c.write_s);
  } else {
    std::snprintf(buf, sizeof buf, "sync: stall %.3f s", c.stall_s);
  }
  std::string text = buf;
  if (c.waited_s > 0) {
    std::snprintf(buf, sizeof buf, ", waited %.3f s for the checkpoint before", c.waited_s);
    text += buf;
  }
  if (c.deferred_from >= 0) {
    std::snprintf(buf, sizeof buf, ", deferred from step %lld while the one before was written",
                  static_cast<long long>(c.deferred_from));
    text += buf;
  }
  return text;
}

TrainCheckpoints::TrainCheckpoints(const Config& c, std::string root, Backend& backend, CheckpointGang* gang,
                                   TrainObserver* observer, CheckpointHook hook)
    : root_(std::move(root)),
      backend_(backend),
      keep_(c.train.keep_checkpoints),
      gang_(gang),
      observer_(observer),
      hook_(std::move(hook)) {
  if (c.train.checkpoint_async) {
    async_ = std::make_unique<AsyncCheckpointer>(root_, backend_, keep_, gang_, hook_);
    // Periodic checkpoints will come: their host memory at start, not in the first one's stall. (An
    // operator's one-off checkpoint of a run without them pays it then.)
    if (c.train.checkpoint_every > 0) async_->reserve();
  }
}

void TrainCheckpoints::report(const CheckpointDone& d, int64_t deferred_from) {
  last_dir_ = d.written.dir;
  observer_->on_checkpoint({.step = d.step,
                            .dir = d.written.dir,
                            .bytes = d.written.bytes,
                            .seconds = d.write_s,
                            .async = d.async,
                            .stall_s = d.stall_s,
                            .write_s = d.write_s,
                            .waited_s = d.waited_s,
                            .copy_s = d.copy_s,
                            .deferred_from = deferred_from});
  if (d.from_action) observer_->on_action(TrainAction::checkpoint, d.step);
}

Status TrainCheckpoints::failed(int64_t step, double seconds, const Status& s) {
  char name[32];  // checkpoint.cpp's name for the step's directory
  std::snprintf(name, sizeof name, "/step_%08lld", static_cast<long long>(step));
  observer_->on_checkpoint_failed({.step = step, .dir = root_ + name, .seconds = seconds}, s.message());
  return s;
}

Status TrainCheckpoints::collect(bool wait) {
  if (async_ == nullptr) return {};
  std::optional<Result<CheckpointDone>> done = async_->finished(wait);
  if (!done) return {};
  if (!done->ok()) return failed(in_flight_step_, seconds_since(in_flight_since_), done->status());
  report(done->value(), in_flight_deferred_from_);
  return {};
}

Status TrainCheckpoints::write(const CheckpointMeta& meta, bool from_action, bool final) {
  const auto t0 = std::chrono::steady_clock::now();
  double waited = 0;
  const int64_t deferred_from = std::exchange(deferred_from_, -1);
  if (Status s = collect(/*wait=*/false); !s.ok()) return s;  // one that has just finished is no wait
  if (async_ != nullptr && async_->in_flight()) {
    // At most one checkpoint in flight: this one waits for the one before, and says so.
    if (hook_) hook_(CheckpointStage::kWaitPrevious, meta.step);
    if (Status s = collect(/*wait=*/true); !s.ok()) return s;
    waited = seconds_since(t0);
  }
  if (async_ != nullptr && !final) {
    in_flight_step_ = meta.step;
    in_flight_deferred_from_ = deferred_from;
    in_flight_since_ = std::chrono::steady_clock::now();
    Result<double> started = async_->start(meta, waited, from_action);
    return started.ok() ? Status() : failed(meta.step, seconds_since(t0), started.status());
  }
  // Synchronous, or the last of the run (nothing left to overlap it with, and the run must not end before
  // its commit).
  const auto w0 = std::chrono::steady_clock::now();
  Result<CheckpointWritten> w = checkpoint_write(root_, backend_, meta, keep_, gang_);
  if (!w.ok()) return failed(meta.step, seconds_since(w0), w.status());
  const double write_s = seconds_since(w0);
  report({.written = w.value(),
          .step = meta.step,
          .async = false,
          .stall_s = seconds_since(t0),
          .write_s = write_s,
          .waited_s = waited,
          .from_action = from_action},
         deferred_from);
  return {};
}

}  // namespace gantry
