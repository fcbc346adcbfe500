// Naming the rank a hung gang waited for. When a gang fails because a rank gave up on a collective (its
// timeout passed) or lost its peers, the rank that failed first is a victim: the culprit is the one that
// stopped answering. gang_run (the local launcher) calls this with what it saw of its workers when the gang
// failed; the node agent's gang_run does the same for its node, and a coordinator holding every node's
// heartbeats could call it over the whole gang (the process states are then only known on their node).
//
//   std::vector<RankWatch> w = ...;   // per rank: pid, running, /proc state, newest heartbeat and its age
//   std::vector<HangCulprit> c = hang_blame(w);
//   if (!c.empty()) error = "rank " + std::to_string(c[0].rank) + " stopped answering: " + c[0].reason;
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include "engine/core/worker/worker_frames.h"  // WorkerHeartbeat

namespace gantry {

// One rank, as its launcher saw it at the moment the gang failed.
struct RankWatch {
  int rank = 0;  // global rank
  int64_t pid = -1;
  bool running = false;    // its process had not exited then
  char process_state = 0;  // /proc/PID/stat's state then ('T' stopped, 't' traced); 0 = unknown
  bool has_heartbeat = false;
  WorkerHeartbeat last;                     // its newest heartbeat, up to the end of the gang
  std::chrono::milliseconds silent_for{0};  // how old that heartbeat was when the gang failed
};

struct HangCulprit {
  int rank = 0;
  std::string reason;  // "its process is stopped (state T in /proc/4711/stat: SIGSTOP or a debugger)"
};

// The ranks the others waited for, by the strongest evidence found, lowest rank first:
//   1. a running process in state T or t: stopped by a signal or held by a debugger;
//   2. a running rank whose heartbeats stopped: silent for longer than three of its intervals and half of
//      its collective timeout (a rank in a collective waits at most that long, its heartbeats going on);
//   3. when some rank's collective timed out: a rank that had not entered the collective that one waited
//      in (stuck before it, e.g. in its forward pass or its data).
// Empty when no rank stands out: the failure is then the failed rank's own.
std::vector<HangCulprit> hang_blame(const std::vector<RankWatch>& ranks);

// Where a heartbeat says its rank was: "step 12 (forward), inside collective #41 (all_reduce, 4096 bytes)".
std::string hang_where(const WorkerHeartbeat& h);

// The state letter of /proc/PID/stat ('R', 'S', 'D', 'T', 't', 'Z', ...), or 0 when it cannot be read.
char hang_process_state(int64_t pid);

}  // namespace gantry
