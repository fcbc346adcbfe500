// Checkpoints, format v1: one directory per step under a root. The shard file(s) and then manifest.json
// are written into a staging directory beside it (.step_00000100.writing), which is renamed into place
// when complete: that rename is the commit. A step_* directory without a manifest is not a checkpoint.
// Every slice of every tensor carries an xxHash64.
//
//   <root>/step_00000100/shard_r00000.bin   header + raw fp32 slices (params, adam_m, adam_v)
//   <root>/step_00000100/manifest.json      format version, step, config, layout, tensor table, slice index
//                                           (file, offset, hash), data cursor, RNG state, code and data
//                                           versions
//
// Slices are ranges of a tensor in its global row-major coordinates, so a checkpoint written under one
// layout (ZeRO shards, tensor/pipeline splits) loads under another by range overlap.
// Loading checks the format, the config and every checksum into staging memory before it touches the
// model: a bad checkpoint is refused with the file and the problem, never half-loaded.
//
//   CheckpointMeta meta{.step = 100, ...};
//   Result<CheckpointWritten> w = checkpoint_write(root, *backend, meta, /*keep=*/3);
//   Result<CheckpointLatest> latest = checkpoint_latest_explained(root);  // and what it passed over
//   Result<CheckpointMeta> m = checkpoint_load(latest->dir, *backend, config, data_version);
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "engine/core/backend.h"
#include "engine/core/config.h"
#include "engine/core/parallel/parallel_dims.h"
#include "engine/core/sampler.h"  // SkippedBatches
#include "telemetry/status.h"

namespace gantry {

class StoreClient;

// The newest format this build reads (and writes under tensor parallelism; a checkpoint of whole tensors
// is written as version 1, which older builds read).
inline constexpr int kCheckpointFormatVersion = 2;

struct CheckpointMeta {
  int64_t step = 0;           // optimizer steps done; also the LR schedule position
  uint64_t sampler_seed = 0;  // data cursor: (seed, step) is all the sampler needs
  uint64_t rng_state = 0;     // the train loop's RNG
  Config config;
  uint64_t data_version = 0;  // of the training shards' names, sizes and contents (TokenDataset)
  std::string code_version;
  double loss = 0;  // training loss of the last step, for the catalog
  // Batches the data cursor passes over (the step guard's rollbacks, sampler.h): the manifest's
  // data_cursor.skipped, absent in older checkpoints (none skipped).
  std::vector<SkippedBatches> skipped_batches;
};

struct CheckpointWritten {
  std::string dir;
  uint64_t bytes = 0;
  double seconds = 0;
};

// The ranks of a gang writing one checkpoint together. Every rank writes shard_r<rank>.bin with the
// ranges its backend writes (Backend::written_ranges) and reports its slice index, or its error, through
// the launcher's store; rank 0 writes and renames the manifest only once every rank reported success,
// then announces the outcome, which every rank returns. A rank that fails or never reports leaves the
// checkpoint uncommitted and every rank with an error naming it. Rank 0 also makes the staging directory
// and says so before any rank writes into it.
struct CheckpointGang {
  StoreClient* store = nullptr;
  ParallelDims layout;  // rank and size, recorded in the manifest
  std::chrono::milliseconds timeout{std::chrono::seconds(120)};
  // Checkpoints this gang has written: it names each write's store keys, since one step may be written
  // twice in a run (a periodic checkpoint, then the one at a stop). Every rank writes equally often.
  int64_t writes = 0;
  // The async writer's thread (checkpoint_async.h): wait for the store in short polls, so the train loop's
  // requests on the same socket (the launcher's commands) get through between them; give up when cancel
  // is set (the run ends with the write in flight).
  bool poll_store = false;
  const std::atomic<bool>* cancel = nullptr;
  // The in-memory copies (memory_copy.h): every rank writes under a root of its own (its node's memory, not
  // a shared folder), so each rank makes its own staging directory, and rank 0 hands the manifest to every
  // rank through the store, which each writes beside its shard and renames: each rank's root then holds a
  // committed checkpoint of one shard whose manifest lists all of them. `key_space` keeps these writes'
  // store keys apart from the disk checkpoints' (the two run on different threads).
  bool node_local = false;
  std::string key_space = "checkpoint";
};

// Where a write is, for test fault hooks (GANTRY_TEST_WORKER_FAULT kill_in_checkpoint, worker_env.h):
// kCopy while the state is copied into host memory (before the copy ends), kWrite after the first slice
// of this rank's shard is written, kBeforeCommit once the manifest is durable and kAfterCommit right after
// the rename (both rank 0 only), kWaitPrevious when a new request waits for the write still in flight
// (on the train loop's thread).
enum class CheckpointStage { kCopy, kWrite, kBeforeCommit, kAfterCommit, kWaitPrevious };
const char* checkpoint_stage_name(CheckpointStage s);  // "copy", "write", "before_commit", ...
using CheckpointHook = std::function<void(CheckpointStage, int64_t step)>;

// A rank's part of a checkpoint in host memory, taken at a step boundary (checkpoint_snapshot_pieces
// says what to copy and where): the buffers' written ranges back to back, in the order the shard holds
// them.
struct CheckpointSnapshot {
  std::vector<SnapshotPiece> pieces;
  size_t floats = 0;
  const float* host = nullptr;
};
CheckpointSnapshot checkpoint_snapshot_pieces(const Backend& backend);

// Writes step `meta.step` under root, commits it, then keeps the newest `keep` committed checkpoints.
// A directory of that step already there (committed, perhaps damaged, or not) is replaced atomically:
// a kill at any moment leaves it either as it was or as the complete new checkpoint.
// gang == nullptr: one process writes everything.
Result<CheckpointWritten> checkpoint_write(const std::string& root, Backend& backend,
                                           const CheckpointMeta& meta, int keep,
                                           CheckpointGang* gang = nullptr);

// checkpoint_write from a snapshot taken earlier (snapshot.host filled): the same files, protocol and
// commit, without the backend, so a writer thread can run it while training goes on. `table` is the
// backend's tensor table.
Result<CheckpointWritten> checkpoint_write_snapshot(const std::string& root, const TensorTable& table,
                                                    const CheckpointSnapshot& snapshot,
                                                    const CheckpointMeta& meta, int keep,
                                                    CheckpointGang* gang, const CheckpointHook& hook = {});

// Committed checkpoint directories under root, oldest first.
std::vector<std::string> checkpoint_list(const std::string& root);
// The newest committed checkpoint under root; an error naming root when there is none.
Result<std::string> checkpoint_latest(const std::string& root);
// The step a checkpoint directory's name gives ("…/step_00000042" -> 42); -1 for any other name.
int64_t checkpoint_dir_step(const std::string& dir);

// A directory newer than the latest committed checkpoint that checkpoint_latest passed over, and why.
struct CheckpointSkipped {
  std::string dir;
  std::string why;  // e.g. "it has no manifest.json: it was never committed (...)"
};
struct CheckpointLatest {
  std::string dir;                         // the newest committed checkpoint
  std::vector<CheckpointSkipped> skipped;  // newest first
};
// checkpoint_latest, and what it passed over to get there, for the operator: --resume latest must not
// fall back to an older step in silence. With no committed checkpoint, the error names them too.
Result<CheckpointLatest> checkpoint_latest_explained(const std::string& root);
// The operator's note on `latest`: each directory passed over and why, and the checkpoint taken instead;
// "" when nothing was passed over.
std::string checkpoint_latest_note(const CheckpointLatest& latest);

// A resume from `dir` failed: the hint to the newest committed checkpoint beside it with an older step,
// "\nan earlier checkpoint is still there: --resume <path>", or "" when there is none.
std::string checkpoint_earlier_hint(const std::string& dir);

// Verifies everything this rank needs, then loads parameters and AdamW state into the backend and returns
// the metadata. `config` is the run's current config (must be compatible); `data_version` of the current
// training data. The writer's layout does not matter: each rank reads the parts of whichever slices
// overlap the ranges its backend holds (Backend::held_ranges), verifying each slice it reads.
// `damaged` (may be null) is set, on a refusal, to the file that is damaged when the checkpoint itself is
// broken (a shard missing, truncated, unreadable or failing its checksum; a manifest that is not valid JSON
// or lacks a field): an older checkpoint may still load. It stays "" for a checkpoint that is whole but
// does not fit (another config, other data, another model), which no other checkpoint of the run fixes.
Result<CheckpointMeta> checkpoint_load(const std::string& dir, Backend& backend, const Config& config,
                                       uint64_t data_version, std::string* damaged = nullptr);

}  // namespace gantry
