// Who this worker is, read from the environment its launcher gave it. Three launchers are understood:
//
//   gantry-engine run   RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE (torchrun's names) and
//                       GANTRY_STORE_FD: the inherited socket to the launcher's store
//   gantry-engine agent the same, plus GANTRY_RENDEZVOUS=HOST:PORT: the store is the coordinator's (shared
//                       by the run's ranks on every node) and the inherited socket carries frames only
//   torchrun            RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT
//   Slurm (srun)        SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID (SLURM_NTASKS_PER_NODE when plain)
//
// torchrun's names win where both are set (torchrun under srun sets its own). Without GANTRY_STORE_FD the
// worker needs a rendezvous address: --rendezvous HOST:PORT, else MASTER_ADDR:MASTER_PORT; under Slurm
// MASTER_ADDR defaults to the first host of SLURM_JOB_NODELIST (where srun starts rank 0).
//
//   Result<WorkerEnv> env = worker_env_read();
//   if (!env.ok()) return fail(env.error());   // "WORLD_SIZE = 'four': expected an integer ..."
#pragma once

#include <cstdint>
#include <functional>
#include <string>

#include "engine/core/checkpoint.h"  // CheckpointStage
#include "telemetry/status.h"

namespace gantry {

struct WorkerEnv {
  int rank = 0;
  int world = 1;
  int local_rank = 0;
  int local_world = 0;      // ranks on this node; 0 = not given (Slurm without a plain SLURM_NTASKS_PER_NODE)
  const char* source = "";  // "torchrun" (RANK...; also gantry-engine run) or "slurm"
  int store_fd = -1;        // GANTRY_STORE_FD; -1 = not launched by gantry-engine run or agent
  std::string rendezvous;   // GANTRY_RENDEZVOUS (HOST:PORT, checked); "" = the store is on store_fd
  std::string master_addr;  // MASTER_ADDR (Slurm: else the node list's first host); "" = not set
  int master_port = 0;      // MASTER_PORT; 0 = not set
};

inline constexpr const char* kRendezvousVariable = "GANTRY_RENDEZVOUS";
// Set by the launcher when it watches for hangs (gang.h's hang_timeout, in ms): the worker's heartbeat
// interval is a quarter of it or less.
inline constexpr const char* kHangTimeoutVariable = "GANTRY_HANG_TIMEOUT_MS";

// Looks variables up through `getenv` (tests pass a map). Errors name the variable, its value and what
// would be right.
using EnvLookup = std::function<const char*(const char*)>;
Result<WorkerEnv> worker_env_read(const EnvLookup& getenv);
Result<WorkerEnv> worker_env_read();  // the process environment

struct HostPort {
  std::string host;
  int port = 0;
};
// "HOST:PORT", "[v6 address]:PORT"; the port 1..65535. `what` names the source in errors ("--rendezvous").
Result<HostPort> host_port_parse(const std::string& text, const std::string& what);

// Test-only fault injection (never set it in production): GANTRY_TEST_WORKER_FAULT="<rank>:<fault>",
// several separated by commas, where <fault> is
//   exit_at_start        the worker exits with code 1 before it reaches the launcher (a crash in start-up)
//   hang_at_start        the worker sleeps before it reaches the launcher (it never joins)
//   exit_after_step:<k>  the worker exits abruptly (code 3, no goodbye) right after reporting step k
//   slow_forward:<ms>    the worker sleeps <ms> milliseconds in the forward pass of every step (a slow
//                        device: the other ranks wait for it in their collectives), 1..60000
//   nan_grad:<k>         the worker's gradients of step k are NaN (the gang's norm is NaN): the step guard
//                        must skip step k on every rank together
//   kill_in_checkpoint:<stage>:<k>  the worker kills itself (SIGKILL, as kill -9) at that stage of the
//                        asynchronous checkpoint of step k: copy (before the copy ends), write (after its
//                        shard's first slice), before_commit, after_commit (the manifest's rename; rank 0)
//   hold_checkpoint:<k>  the writer of the checkpoint of step k holds after its first slice until the train
//                        loop asks for the next checkpoint, which must then wait for it (at most 60 s)
//   flip_bit:<k>         after step k's update the worker flips one bit of its replicated parameters (silent
//                        data corruption): the next check (train.sdc_check_every) must name this rank
// The tests of the launcher's gang semantics use it to make one rank fail in a known way, the
// coordinator's straggler tests to make one rank slow.
struct WorkerFault {
  enum Kind {
    none,
    exit_at_start,
    hang_at_start,
    exit_after_step,
    slow_forward,
    nan_grad,
    kill_in_checkpoint,
    hold_checkpoint,
    flip_bit
  } kind = none;
  int64_t step = 0;  // exit_after_step, nan_grad, kill_in_checkpoint, hold_checkpoint, flip_bit
  CheckpointStage stage = CheckpointStage::kCopy;  // kill_in_checkpoint
  int64_t delay_ms = 0;                            // slow_forward
};
inline constexpr const char* kWorkerFaultVariable = "GANTRY_TEST_WORKER_FAULT";
// The fault for `rank` (none when the text names other ranks only); an error for malformed text.
Result<WorkerFault> worker_fault_parse(const std::string& text, int rank);

}  // namespace gantry
