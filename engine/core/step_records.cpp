#include "engine/core/step_records.h"

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
  rank.total_s = r.ms / 1e3;
  rank.tokens = r.rank_tokens > 0 ? r.rank_tokens : r.tokens / (world > 0 ? world : 1);
  rank.mem_allocated_bytes = r.device.mem_allocated_bytes;
  rank.mem_peak_bytes = r.device.mem_peak_bytes;
  rank.temperature_celsius = r.device.temperature_celsius;
  rank.sm_clock_hertz = r.device.sm_clock_hertz;
  rank.power_watts = r.device.power_watts;
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
  step.step_s = r.ms / 1e3;
  step.val_loss = r.val_loss;
  return step;
}

}  // namespace gantry
