#include "engine/core/step_records.h"

#include <fstream>
#include <iterator>

#include "engine/core/xxhash64.h"  // the manifest's checksum, for the catalog

namespace gantry {

RankStepRecord rank_step_record(const StepReport& r, const std::string& host, int device, int world) {
  RankStepRecord rank;
  rank.step = r.step;
  rank.rank = r.rank;
  rank.host = host;
  rank.device = device;
  rank.phases.data_wait = r.data_wait_s;
  if (r.phases.measured) {
    rank.phases.forward = r.phases.forward_s;
    rank.phases.backward = r.phases.backward_s;
    rank.phases.optimizer = r.phases.optimizer_s;
    rank.phases.comm_exposed = r.phases.comm_exposed_s;
  }
  rank.total_s = r.step_s;
  rank.tokens = r.rank_tokens > 0 ? r.rank_tokens : r.tokens / (world > 0 ? world : 1);
  rank.mem_allocated_bytes = r.device.mem_allocated_bytes;
  rank.mem_peak_bytes = r.device.mem_peak_bytes;
  rank.temperature_celsius = r.device.temperature_celsius;
  rank.sm_clock_hertz = r.device.sm_clock_hertz;
  rank.power_watts = r.device.power_watts;
  rank.mfu = r.rank_mfu;
  rank.hfu = r.rank_hfu;
  return rank;
}

StepRecord step_record(const StepReport& r, double time_unix_s) {
  StepRecord step;
  step.step = r.step;
  step.time_unix_s = time_unix_s;
  step.loss = r.loss;
  step.grad_norm = r.grad_norm;
  step.lr = r.lr;
  step.tokens_per_s = r.tokens_per_s;
  step.step_s = r.step_s;
  step.val_loss = r.val_loss;
  step.mfu = r.mfu;
  step.hfu = r.hfu;
  return step;
}

CheckpointRecord checkpoint_committed_record(const CheckpointReport& c, const std::string& host, int world,
                                             double time_unix_s) {
  CheckpointRecord r;
  r.step = c.step;
  r.time_unix_s = time_unix_s;
  r.rank = kCheckpointAllRanks;
  r.host = host;
  r.dir = c.dir;
  r.state = CheckpointState::kCommitted;
  r.bytes = c.bytes;
  r.shards = world;
  r.write_s = c.write_s;
  r.stall_s = c.stall_s;
  r.waited_s = c.waited_s;
  r.async = c.async;
  // The manifest is renamed into place last (the commit) and is small (KBs): its checksum tells the catalog
  // which bytes committed, should the directory be replaced later.
  std::ifstream in(c.dir + "/manifest.json", std::ios::binary);
  if (in) {
    const std::string text{std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
    if (!in.bad()) r.manifest_xxh64 = xxhash64_hex(xxhash64(text.data(), text.size()));
  }
  return r;
}

CheckpointRecord checkpoint_failed_record(const CheckpointReport& c, const std::string& error, int rank,
                                          const std::string& host, double time_unix_s) {
  CheckpointRecord r;
  r.step = c.step;
  r.time_unix_s = time_unix_s;
  r.rank = rank;
  r.host = host;
  r.dir = c.dir;
  r.state = CheckpointState::kFailed;
  r.write_s = c.seconds;  // until the failure; what it held training is not known here (stall_s unset)
  r.message = error;
  return r;
}

}  // namespace gantry
