// The first host of a Slurm node list (SLURM_JOB_NODELIST), in Slurm's compressed form: a comma-separated
// list of names, each of which may carry bracketed ranges, e.g. "gpu[01-04,07],login2" or
// "rack[1-2]-n[08-09]". Under srun every task sees the same list and rank 0 runs on its first host, so that
// host is where a worker started by srun looks for the rendezvous store when MASTER_ADDR is not set.
//
//   Result<std::string> host = slurm_first_host("gpu[01-04,07],login2");   // "gpu01"
#pragma once

#include <string>
#include <string_view>

#include "telemetry/status.h"

namespace gantry {

// An error names the list and what is wrong with it (an empty list or item, an unclosed bracket, a range
// that is not digits).
Result<std::string> slurm_first_host(std::string_view nodelist);

}  // namespace gantry
