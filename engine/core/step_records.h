// A train loop's reports as the telemetry records the rest of Gantry reads (telemetry/records.h): the
// rank's own step record, the job's step record and checkpoint records. One translation, used by the
// single-process history and by the worker runtime alike.
//
//   batch.rank_steps.push_back(rank_step_record(report, host, device, world));
//   if (rank == 0) batch.steps.push_back(step_record(report, unix_now_s()));
//   if (rank == 0) batch.checkpoints.push_back(checkpoint_committed_record(c, host, world, unix_now_s()));
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

// Rank 0's record of a committed checkpoint, for the whole gang (rank kCheckpointAllRanks): `world` shards,
// stall_s = the report's stall (all of the write while writes are synchronous), and the xxHash64 of the
// manifest.json it reads back from c.dir ("" if it cannot be read).
CheckpointRecord checkpoint_committed_record(const CheckpointReport& c, const std::string& host, int world,
                                             double time_unix_s);
// A rank's record of its failed checkpoint write.
CheckpointRecord checkpoint_failed_record(const CheckpointReport& c, const std::string& error, int rank,
                                          const std::string& host, double time_unix_s);

}  // namespace gantry
