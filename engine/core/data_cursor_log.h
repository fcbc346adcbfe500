// The data-cursor log: which samples each rank consumed, step by step, so that "every committed step's
// samples were consumed exactly once" can be checked after failures, recoveries and rollbacks rather than
// inferred from the losses. Every process of a run appends JSON lines to one file,
// <out_dir>/data_cursor.jsonl (O_APPEND, one write per line: whole lines from concurrent ranks on a local
// file system):
//
//   {"kind":"start","rank":1,"dp":2,"dp_rank":1,"step":10,"pid":4242}       this process goes on from step 10
//   {"kind":"step","step":11,"rank":1,"dp_rank":1,"dp":2,"batch":10,"first":168,"count":8,
//    "windows":"9c0e1f2a3b4c5d6e"}                                            samples [168, 176) of batch 10
//   {"kind":"rollback","rank":1,"step":8}                                   the step guard went back to step
//   8
//
// `windows` is the xxh64 of the window indices the rank read, in order: the line says what was read, not
// only what the sampler's arithmetic says. A start or a rollback at step S forgets every rank's lines past S
// (those steps are replayed, or were lost with the failure): data_cursor_read replays the file into the
// committed history. About 150 bytes per rank per step.
//
//   DataCursorLog log(out_dir, dims.rank, dp, dp_rank, step);  // after the resume, before the first step
//   log.add(global_index, window);                             // each sample the step reads
//   log.step_done(step, batch);                                // after the step
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "engine/core/sampler.h"  // SkippedBatches
#include "telemetry/status.h"

namespace gantry {

inline constexpr const char* kDataCursorLogFile = "data_cursor.jsonl";

class DataCursorLog {
 public:
  // Opens (creates) <out_dir>/data_cursor.jsonl and writes this process' start line at `from_step` (the
  // optimizer steps done when it begins). A log that cannot be written is said once on stderr and training
  // goes on: it is an audit, not the state. out_dir "": off (train.data_cursor_log = false), nothing
  // written.
  DataCursorLog(const std::string& out_dir, int rank, int dp, int dp_rank, int64_t from_step);
  ~DataCursorLog();
  DataCursorLog(const DataCursorLog&) = delete;
  DataCursorLog& operator=(const DataCursorLog&) = delete;

  // One sample the current step read: its global index and the window it read.
  void add(uint64_t global_index, uint64_t window);
  // The step (1-based: steps done, counting it) is over; it read global batch `batch`.
  void step_done(int64_t step, uint64_t batch);
  // The step guard restored the state of `to_step`: the lines past it are no longer history.
  void rolled_back(int64_t to_step);

 private:
  void write_line(const std::string& line);

  int fd_ = -1;
  std::string path_;
  int rank_, dp_, dp_rank_;
  bool warned_ = false;
  // The current step's samples: contiguous by construction (sampler.h), kept as the first and the count;
  // a gap is recorded as such (`contiguous` false) and fails the check.
  uint64_t first_ = 0, count_ = 0;
  bool contiguous_ = true;
  std::vector<uint64_t> windows_;  // hashed at step_done
};

// One rank's consumption at one step, as the log records it.
struct DataCursorEntry {
  int64_t step = 0;
  int rank = 0, dp = 1, dp_rank = 0;
  uint64_t batch = 0, first = 0, count = 0;
  bool contiguous = true;
  std::string windows;  // xxh64 of the window indices, 16 hex digits
  bool operator==(const DataCursorEntry&) const = default;
};

// The committed history: per step, one entry per rank of the process that last ran it, in rank order.
struct DataCursorHistory {
  std::map<int64_t, std::vector<DataCursorEntry>> steps;
  int starts = 0;     // start lines: processes that ran a rank (every rank of every generation)
  int rollbacks = 0;  // rollback lines
  int64_t lines = 0;  // step lines read, replaced ones included
};

// Reads and replays <out_dir>/data_cursor.jsonl. An error names the file and line that cannot be read.
Result<DataCursorHistory> data_cursor_read(const std::string& out_dir);

// Every committed step 1..last_step read its own batch exactly once: step s read batch
// sampler_batch(s - 1, skipped), its data-parallel ranks' samples cover [batch x G, (batch + 1) x G) with no
// overlap and no gap (ranks of one dp rank, under tensor parallelism, read the same), and no step is missing.
// So no sample was skipped and none was seen twice, beyond the `skipped` batches. The error names the first
// step and rank that break it.
Status data_cursor_check(const DataCursorHistory& h, int64_t last_step, int global_batch,
                         const std::vector<SkippedBatches>& skipped);

}  // namespace gantry
