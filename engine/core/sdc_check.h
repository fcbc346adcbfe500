// The silent-data-corruption (SDC) check across data-parallel replicas. Every train.sdc_check_every steps,
// after the update, each rank hashes the state that every dp replica must hold bit-identically
// (Backend::replicated_state(): the parameters at ZeRO 0, the gathered full parameter copy at ZeRO 1-2;
// ZeRO 3 keeps nothing replicated and is not checked), the hashes are all-reduced over the dp group (each
// rank fills its own slots, so the sum is an all-gather that works on any communicator, NCCL included), and
// every rank judges the same hashes: a rank that disagrees with a strict majority is named; without a
// majority (dp 2, or a tie) every rank is named and the verdict says so. On a mismatch every rank reports it
// (TrainObserver::on_sdc_mismatch), waits for the others (so every rank's event is out before any exits) and
// the run stops with the reason: rolling back to the last state before the mismatch is the fault-tolerance
// machinery's, which does not exist yet.
//
//   SdcCheck sdc(c.train.sdc_check_every, dims, dist->dp, timeout, *backend, opt.test_flip_bit_step);
//   summary += "\n" + sdc.describe();
//   ... each step, after the update and ++step (inside the step's time):
//   if (Status s = sdc.after_step(step); !s.ok()) return s;   // a failed collective
//   ... observer->on_step(report);
//   if (sdc.found()) return sdc.stop(observer);                // the mismatch's reason
#pragma once

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "engine/core/parallel/parallel_dims.h"
#include "telemetry/status.h"

namespace gantry {

class Backend;
class Communicator;
class TrainObserver;

// The majority logic over one hash per dp rank.
struct SdcVerdict {
  bool mismatch = false;       // not every replica holds the same bits
  bool majority = false;       // more than half of the replicas hold the same hash (true when all agree)
  uint64_t majority_hash = 0;  // that hash, when majority
  int agreeing = 0;            // replicas that hold it; 0 without a majority
  std::vector<int>
      suspects;  // dp ranks named: those that differ from the majority, or every rank without one
};
SdcVerdict sdc_judge(const std::vector<uint64_t>& hashes);

// The hashes travel as 16-bit pieces in floats (exact; every other rank adds zeros): 4 floats per rank.
inline constexpr int kSdcFloatsPerHash = 4;
void sdc_hash_encode(uint64_t hash, float* slots);  // slots: kSdcFloatsPerHash floats
uint64_t sdc_hash_decode(const float* slots);

// What every rank reports on a mismatch (the same on every rank but for `rank`).
struct SdcMismatch {
  int64_t step = 0;
  int rank = 0;  // the reporting rank (global)
  SdcVerdict verdict;
  std::vector<int> suspect_ranks;          // global ranks, in dp order
  std::vector<std::string> suspect_hosts;  // their hosts, "" where unknown
  std::vector<uint64_t> suspect_hashes;
  std::string state;              // what was hashed: "fp32 parameters", "bf16 parameter copy"
  uint64_t bytes = 0;             // per replica
  int replicas = 0;               // dp
  int64_t last_passed_step = -1;  // the last check every replica passed in this run; -1: none
  std::string message;            // one human line: what disagrees, and what was done
  std::string payload;            // JSON for the sdc_mismatch event
  bool named(int global_rank) const;
};

class SdcCheck {
 public:
  // every: train.sdc_check_every (0 = off); dp: the dp communicator (null at dp 1); test_flip_bit_step:
  // the test fault (GANTRY_TEST_WORKER_FAULT flip_bit), 0 = never.
  SdcCheck(int every, const ParallelDims& dims, Communicator* dp, std::chrono::milliseconds timeout,
           Backend& backend, int64_t test_flip_bit_step);

  bool enabled() const { return enabled_; }
  // One line for the run's start-up summary: what is checked and how often, or why nothing is.
  std::string describe() const;
  // After step `step`'s update: the test fault, then the check when step is a multiple of the interval. An
  // error is a failed collective; a mismatch is kept for stop().
  Status after_step(int64_t step);
  // Whether the last check found a mismatch (the same answer on every rank).
  bool found() const { return found_.has_value(); }
  const SdcMismatch* mismatch() const { return found_ ? &*found_ : nullptr; }
  // Reports the mismatch to `observer`, waits until every rank has (so every rank's event is out before any
  // rank exits) and returns the error that stops the run.
  Status stop(TrainObserver* observer);
  // Checks made so far and the wall time they took on this rank (hash and all-reduce), for the run's end.
  int64_t checks() const { return checks_; }
  double check_seconds() const { return check_s_; }
  double hash_seconds() const {
    return hash_s_;
  }  // of those, hashing (the rest is the all-reduce, waits
     // for the slowest rank included)

 private:
  Status check(int64_t step);
  Result<std::vector<std::string>> exchange_hosts(const std::vector<int>& dp_ranks);

  int every_;
  ParallelDims dims_;
  Communicator* dp_;
  std::chrono::milliseconds timeout_;
  Backend& backend_;
  int64_t test_flip_bit_step_;
  std::string state_;  // Backend::replicated_state()
  bool enabled_ = false;
  int64_t last_passed_ = -1;
  int64_t checks_ = 0;
  double check_s_ = 0;
  double hash_s_ = 0;
  std::optional<SdcMismatch> found_;
};

}  // namespace gantry
