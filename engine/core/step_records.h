// A train loop's step report as the telemetry records the rest of Gantry reads (telemetry/records.h): the
// rank's own step record and the job's step record. One translation, used by the single-process history
// and by the worker runtime alike.
//
//   batch.rank_steps.push_back(rank_step_record(report, host, device, world));
//   if (rank == 0) batch.steps.push_back(step_record(report, unix_now_s()));
#pragma once

#include <string>

#include "engine/core/train.h"
#include "telemetry/clock.h"  // unix_now_s: records carry wall-clock times
#include "telemetry/records.h"

namespace gantry {

// run_id is left 0 for the history to set. `device` is the node-local index (-1 on CPU); `world` splits
// the global tokens when the loop did not report the rank's own share.
RankStepRecord rank_step_record(const StepReport& r, const std::string& host, int device, int world);
StepRecord step_record(const StepReport& r, double time_unix_s);

}  // namespace gantry
