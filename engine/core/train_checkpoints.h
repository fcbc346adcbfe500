// The train loop's checkpoints: written synchronously, or started asynchronously (train.checkpoint_async,
// checkpoint_async.h) and reported once committed, at a later step boundary. Kept apart from train.cpp so
// the loop only says when.
//
//   TrainCheckpoints ckpt(config, root, *backend, gang, observer, hook);
//   at each step boundary:  if (Status s = ckpt.collect(/*wait=*/false); !s.ok()) return s;
//   when one is due:        ckpt.write(meta, /*from_action=*/false, /*final=*/false);
//   at the end:             ckpt.write(meta, false, /*final=*/true);   // waits for everything
#pragma once

#include <memory>
#include <string>

#include "engine/core/backend.h"
#include "engine/core/checkpoint.h"
#include "engine/core/checkpoint_async.h"
#include "engine/core/config.h"
#include "engine/core/train.h"
#include "telemetry/status.h"

namespace gantry {

// What a checkpoint cost training, for log lines and event messages: "async: stall 0.004 s, write 0.310 s"
// with ", waited 0.200 s for the checkpoint before" when it waited; "sync: stall 0.312 s" for a
// synchronous one (its stall is its write).
std::string checkpoint_cost_text(const CheckpointReport& c);

// A resume's load, agreed by the gang before any other collective: under tp, pp or ZeRO each rank reads
// only its part of the checkpoint, so a missing, truncated or corrupt shard may fail a few ranks alone,
// and their peers, already training, failed next on "peer closed", which the launcher then named as the
// cause. Every rank calls this with its own load's outcome; a rank that failed leaves its reason in the
// store, and every rank returns an error: its own, or a failed rank's ("rank 3 of 4 could not load the
// checkpoint DIR, so no rank resumes: <its reason>"), so each names the file. `comm` spans the gang
// (DistContext's world, or dp when that is the gang). One process (comm null): `own` as it is.
// `own_damaged`: the refusal is the checkpoint's damage (checkpoint_load's `damaged`); *damaged (may be
// null) is set on every rank alike: true when each rank that failed failed on damage (an older checkpoint
// may load), false when any failed for another reason or none failed.
Status checkpoint_load_agree(const Status& own, bool own_damaged, const std::string& dir, Communicator* comm,
                             StoreClient* store, std::chrono::milliseconds timeout, bool* damaged = nullptr);

class TrainCheckpoints {
 public:
  TrainCheckpoints(const Config& c, std::string root, Backend& backend, CheckpointGang* gang,
                   TrainObserver* observer, CheckpointHook hook);

  // The checkpoint of meta.step. A write still in flight is waited for (and reported) first. Async and
  // not final: the state is copied and the loop goes on; otherwise the write is done when this returns.
  // from_action: the operator's checkpoint action, reported (on_action) after the checkpoint.
  Status write(const CheckpointMeta& meta, bool from_action, bool final);
  // Reports an asynchronous write that has finished (waiting for it when `wait`): on_checkpoint, then
  // its action. Its failure is returned, as a synchronous write's would be.
  Status collect(bool wait);
  // The newest committed checkpoint reported ("" before the first).
  const std::string& last_dir() const { return last_dir_; }
  // An asynchronous write is still running (after collect(false): it has not finished).
  bool in_flight() const { return async_ != nullptr && async_->in_flight(); }
  // The next write() is a periodic checkpoint due at `step` and deferred until now (train.
  // checkpoint_defer_when_busy); its report says so. -1 = not deferred.
  void set_deferred_from(int64_t step) { deferred_from_ = step; }

 private:
  void report(const CheckpointDone& d, int64_t deferred_from);
  // A write of `step` failed after `seconds`: on_checkpoint_failed, and `s` back for the loop to end on.
  Status failed(int64_t step, double seconds, const Status& s);

  std::string root_;
  Backend& backend_;
  int keep_;
  CheckpointGang* gang_;
  TrainObserver* observer_;
  CheckpointHook hook_;
  std::unique_ptr<AsyncCheckpointer> async_;  // null: train.checkpoint_async = false
  std::string last_dir_;
  int64_t in_flight_step_ = -1;           // the asynchronous write started last, for its failure's report
  int64_t in_flight_deferred_from_ = -1;  // and the step it was deferred from, for its report
  int64_t deferred_from_ = -1;            // set_deferred_from, for the next write
  std::chrono::steady_clock::time_point in_flight_since_;
};

}  // namespace gantry
