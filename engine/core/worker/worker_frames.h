// The worker runtime's frames on its inherited socket (frame.h types 0x20-0x2f worker -> launcher, 0x30-0x3f
// launcher -> worker),
// encoded and decoded in one place so the worker and the launcher cannot drift apart. Integers are
// little-endian, strings are u32 length + UTF-8 bytes (store_protocol.h's writer and reader); the tables
// are in docs/COMM.md.
//
//   worker_hello    rank u32 | world u32 | local_rank u32 | pid u32 | device i32 | host str
//   worker_records  a RecordBatch in record_codec.h's binary form (the whole payload)
//   worker_exit     code u32 (app/commands.h exit codes) | message (UTF-8, the rest)
//   worker_run      summary str | config_toml str | code_version str | data_version str | backend str |
//                   params u64
//   worker_command  action u32 (TrainAction: 1 checkpoint, 2 pause, 3 resume, 4 stop) | id u64 | from str
//   worker_inject   kind u32 (1 slow, 2 nan) | delay_ms u32
//   worker_heartbeat step u64 | phase u32 (TrainPhase) | collectives u64 | flags u32 (1 inside a collective,
//                   2 its communicator timed out) | interval_ms u32 | timeout_ms u32 |
//                   [recent u32 | recent x (seq u64 | op str | bytes u64 | entered_unix_ms u64 |
//                   left_unix_ms u64 | ok u32)]  (the flight recorder; absent in older workers' beats)
//
//   std::vector<uint8_t> p = worker_hello_encode({.rank = 1, .world = 4, .pid = getpid(), .host = "n1"});
//   store.send(FrameType::worker_hello, p, 5s);
//   ...launcher, in on_frame:
//   Result<WorkerHello> h = worker_hello_decode(frame.payload);   // error names what is short or wrong
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "engine/core/comm/flight_recorder.h"  // CollectiveRecord
#include "engine/core/train.h"                 // TrainAction
#include "telemetry/status.h"

namespace gantry {

// The first frame a worker sends: proof that it started and reached its launcher.
struct WorkerHello {
  int rank = 0;
  int world = 1;
  int local_rank = 0;
  int64_t pid = 0;
  int device = -1;  // local device index (after CUDA_VISIBLE_DEVICES); -1 = CPU
  std::string host;
};

// The last frame: what the worker is about to exit with, and why. For success on rank 0 the message is
// the run's final line ("done: step 6, loss ..."); for a failure, the error the launcher names the rank by.
struct WorkerExit {
  int code = 0;
  std::string message;
};

// What the run is, sent once by rank 0 before its first step: the launcher's history needs it to begin
// the run, and prints the summary line in place of the worker.
struct WorkerRun {
  std::string summary;
  std::string config_toml;
  std::string code_version;
  std::string data_version;
  std::string backend;
  uint64_t params = 0;
  // How the run's MFU is computed (engine/core/utilisation.h), for the launcher's history; 0 = unknown peak.
  std::string peak_name;
  double peak_flops = 0;
  double flops_per_token = 0;
  std::string mfu_formula;
};

// An operator action for rank 0's TrainControl (train.h), sent by the launcher or agent. `id` and `from`
// travel with it so the event that reports it taking effect can name the request it answers.
struct WorkerCommand {
  TrainAction action = TrainAction::none;
  uint64_t id = 0;
  std::string from;  // who asked: "ctl@127.0.0.1:51234", "gantry-engine run", ...
};

// A drill's fault for one rank (`ctl inject RUN slow|nan`, train.h's TrainLiveFaults): slow = its forward
// pass sleeps delay_ms from its next step on; nan = its next step's gradients are NaN.
struct WorkerInject {
  enum class Kind : uint32_t { kSlow = 1, kNan = 2 };
  Kind kind = Kind::kSlow;
  uint32_t delay_ms = 0;
};

// Sent every interval_ms from a thread of the worker's own that never waits on a collective, and once more
// just before a failed worker's exit: the launcher names a hung gang's culprit from these (hang_blame.h).
struct WorkerHeartbeat {
  int64_t step = 0;  // optimizer steps done
  TrainPhase phase = TrainPhase::kSetup;
  uint64_t collectives = 0;    // CommProgress::entered: the number of the collective it is in, or last left
  bool in_collective = false;  // inside collective #collectives now
  bool timed_out = false;      // its communicator broke on a collective timeout: it waited in vain
  uint32_t interval_ms = 0;    // the next heartbeat is due this long after this one; 0: no more will come
  uint32_t timeout_ms = 0;     // its collective timeout
  std::vector<CollectiveRecord> recent;  // its flight recorder: the last collectives, oldest first
};

std::vector<uint8_t> worker_hello_encode(const WorkerHello& h);
Result<WorkerHello> worker_hello_decode(std::span<const uint8_t> payload);
std::vector<uint8_t> worker_exit_encode(const WorkerExit& e);
Result<WorkerExit> worker_exit_decode(std::span<const uint8_t> payload);
std::vector<uint8_t> worker_run_encode(const WorkerRun& r);
Result<WorkerRun> worker_run_decode(std::span<const uint8_t> payload);
std::vector<uint8_t> worker_command_encode(const WorkerCommand& c);
// Refuses an action outside checkpoint..stop, naming the number it got.
Result<WorkerCommand> worker_command_decode(std::span<const uint8_t> payload);
std::vector<uint8_t> worker_inject_encode(const WorkerInject& i);
// Refuses a kind other than slow (1) or nan (2), naming the number it got.
Result<WorkerInject> worker_inject_decode(std::span<const uint8_t> payload);
std::vector<uint8_t> worker_heartbeat_encode(const WorkerHeartbeat& h);
// Refuses a phase this launcher does not know, naming the number it got.
Result<WorkerHeartbeat> worker_heartbeat_decode(std::span<const uint8_t> payload);

}  // namespace gantry
