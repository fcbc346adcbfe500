// The run history in one SQLite file: runs, their steps, every rank's every step, events, checkpoints and
// nodes. Built for the coordinator's ingest path (a batch per node per step, 12.5k batches per step at
// 100k GPUs) and for a console that draws a 100,000-step × 1,024-rank history in a frame. The layout and
// its measured figures are in docs/TELEMETRY.md; in short:
//   - rank-step records are packed eight ranks to a row (rank_steps), so ingest writes few, small rows;
//   - as steps become final, a pyramid of aggregate tiles (rank_tiles) is built in the same transaction:
//     per-rank and per-rank-span min / max / argmax / sum / last over blocks of 64, 512, ... steps;
//   - range queries read the coarsest tiles that fit the requested resolution, so their cost follows
//     the number of buckets, not the number of rows, and never return rows to the caller.
//
//   std::string error;
//   std::unique_ptr<HistoryDb> db = HistoryDb::open(out_dir + "/history.sqlite", {}, &error);
//   if (!db) return fail(error);
//   int64_t run = db->begin_run({.name = "gpt2-124m", .world_size = 8, .config = toml});
//   if (run < 0) return fail(db->error());
//   ...each step: batch.rank_steps / steps / events filled with .run_id = run...
//   if (!db->ingest(batch)) log(db->error());       // one transaction per batch
//   ...
//   db->finish_run(run, RunStatus::finished, "", now);
//
//   BandResult band;   // step time of every rank, 2,000 buckets: min, max (and which rank), mean, last
//   db->query_band({.run_id = run, .metric = RankMetric::total, .max_buckets = 2000}, &band);
//
// A HistoryDb is one connection: use it from one thread at a time. Readers elsewhere (the console, the
// HTTP API) open their own, read-only if they like; WAL lets them read while the writer writes. Errors are
// values: a false (or -1) return, with error() saying what went wrong.
#pragma once

#include <cstdint>
#include <limits>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "telemetry/records.h"

struct sqlite3;

namespace gantry {

// interrupted: the run was live when its coordinator went away (a crash, a kill, `down`); it can be resumed.
enum class RunStatus { running, finished, failed, stopped, interrupted };
std::string_view run_status_name(RunStatus s);

// What a run is; fixed when it begins.
struct RunInfo {
  std::string name;
  int32_t world_size = 1;  // ranks; a rank-step record's rank must be below it
  std::string config;      // the full config (canonical TOML)
  std::string code_version;
  std::string data_version;
  std::string layout;  // e.g. "dp=4 tp=2 pp=1 zero=1"
  std::string out_dir;
  double created_unix_s = 0;  // 0 = now
  // How the run's MFU figures are computed (telemetry/flops.h): they travel with the run.
  std::string peak_name;
  double peak_flops = 0;
  double flops_per_token = 0;
  std::string mfu_formula;
  // What the run's launcher needs to place it again, beyond the config (the coordinator's layout, step
  // limit and policies), as JSON; "" where the launcher keeps nothing. Updated with update_run.
  std::string options;
};

struct RunRow {
  int64_t id = 0;
  RunInfo info;
  RunStatus status = RunStatus::running;
  double finished_unix_s = 0;  // 0 while running
  std::string message;         // why it ended
  int64_t last_step = -1;      // highest step with a rank-step record; -1 = none
  int64_t raw_from_step = 0;   // rank-step rows before it were downsampled away (tiles remain)
};

struct NodeInfo {
  std::string host;
  int32_t devices = 0;
  std::string device_name;
  std::string state = "ok";  // "ok", "quarantined", "lost", ...
  double last_seen_unix_s = 0;
};

// One entry of the checkpoint catalog: a run's checkpoint at one step, from its CheckpointRecord
// (telemetry/records.h) as ingest() catalogues it, then as reconcile_checkpoints finds the disk.
struct CheckpointInfo {
  int64_t run_id = 0;
  int64_t step = 0;
  std::string path;
  uint64_t bytes = 0;
  double write_s = 0;
  std::string state = "committed";  // "committed", "failed", "deleted" (gone from disk), "corrupt"
  double time_unix_s = 0;
  std::optional<double> stall_s;  // the time training stopped for it; unknown for entries of older builds
  std::optional<int32_t> shards;  // shard files; unknown for entries of older builds
  std::string manifest_xxh64;     // xxHash64 of manifest.json, hex; "" when failed or not known
  std::string message;            // a failed write's reason
};

struct EventRow {
  int64_t id = 0;  // increasing: a reader catches up with "after id"
  EventRecord event;
};

// What a rank-step range query aggregates. The first nine are kept in the tile pyramid, so they answer
// fast at any resolution and where the raw rows were downsampled away; the rest (tokens, allocated
// memory, the NVML readings) are read from the rank_steps rows only. A tiled metric's value is its index
// in the tile cell (storage/pack.h), so new tiled metrics go after the last tiled one, never between.
//
// busy = data_wait + forward + backward + optimizer: the time a rank needed itself. In synchronous data
// parallelism every rank's total is the same (the fast ranks wait in their collectives, as exposed
// communication), so a slow rank shows on busy and not on total.
enum class RankMetric : uint8_t {
  total,
  data_wait,
  forward,
  backward,
  optimizer,
  comm_exposed,
  checkpoint_stall,
  mem_peak,
  busy,  // tiled since schema version 4
  tokens,
  mem_allocated,
  temperature,
  sm_clock,
  power,
};
inline constexpr int kRankMetricCount = 14;
inline constexpr bool rank_metric_tiled(RankMetric m) {
  return static_cast<int>(m) < 9;
}
std::string_view rank_metric_name(RankMetric m);  // "total_s", "forward_s", ..., "busy_s", ..., "power_watts"
bool rank_metric_from_name(std::string_view name, RankMetric* out);

enum class StepMetric : uint8_t { loss, grad_norm, lr, tokens_per_s, step_s, mfu, hfu, val_loss };
std::string_view step_metric_name(StepMetric m);
bool step_metric_from_name(std::string_view name, StepMetric* out);

inline constexpr int64_t kStepEnd = std::numeric_limits<int64_t>::max();

// One bucket of a decimated series: the aggregate over all records with step in [step_begin, step_end).
struct Bucket {
  int64_t step_begin = 0;
  int64_t step_end = 0;
  int64_t count = 0;  // records aggregated (rank-steps, or steps)
  double min = 0;
  double max = 0;
  int32_t max_rank = -1;  // the rank that set max (-1 for step metrics)
  double mean = 0;
  double last = 0;  // at last_step; over several ranks, their mean there
  int64_t last_step = 0;
};

struct BandQuery {
  int64_t run_id = 0;
  RankMetric metric = RankMetric::total;
  int64_t step_begin = 0;
  int64_t step_end = kStepEnd;  // exclusive
  std::vector<int32_t> ranks;   // empty = all ranks
  int32_t max_buckets = 1000;   // ≥ 1
};

// Buckets are aligned windows of bucket_steps steps (a power of two ≥ range ÷ max_buckets), so the same
// step always falls in the same bucket however the view pans: the first bucket may start before
// step_begin and the last end after step_end. Buckets without records are left out.
struct BandResult {
  int64_t bucket_steps = 0;
  std::vector<Bucket> buckets;
  int64_t rows_read = 0;  // SQLite rows the query touched: what its cost follows
};

// Per rank: the same buckets for each rank of the query (at most kMaxSeriesRanks ranks).
struct RankSeries {
  int32_t rank = 0;
  std::vector<Bucket> buckets;
};
struct SeriesResult {
  int64_t bucket_steps = 0;
  std::vector<RankSeries> ranks;
  int64_t rows_read = 0;
};
inline constexpr size_t kMaxSeriesRanks = 4096;

// The rank × step heatmap at display resolution: columns are aligned windows of bucket_steps steps (the
// smallest power of two with (step_end − step_begin) ÷ bucket_steps ≤ max_buckets, from the range asked
// for, so a view cut into pages of equal width gets the same columns in every page), rows are aligned
// spans of ranks_per_row ranks (the smallest power of two with ⌈world ÷ ranks_per_row⌉ ≤ max_rank_rows).
// The rows are read from the tile pyramid's cells of 8^m ranks with 8^m ≤ ranks_per_row, so a cell never
// straddles two rows and the cost follows the cells asked for, not the rank-step rows under them.
struct HeatmapQuery {
  int64_t run_id = 0;
  RankMetric metric = RankMetric::busy;
  int64_t step_begin = 0;
  int64_t step_end = kStepEnd;  // exclusive; kStepEnd = the run's end (then the columns follow its length)
  int32_t max_buckets = 1000;   // columns, 1..100,000
  int32_t max_rank_rows = 256;  // rows, 1..kMaxSeriesRanks
};
struct HeatmapResult {
  int64_t first_step = 0;  // column c covers [first_step + c·bucket_steps, + bucket_steps)
  int64_t bucket_steps = 1;
  int32_t cols = 0;
  int32_t ranks_per_row = 1;  // row r covers ranks [r·ranks_per_row, (r+1)·ranks_per_row) ∩ [0, world)
  int32_t rows = 0;
  int32_t world = 0;
  int64_t last_step = -1;  // the run's newest step when read: columns past it may still fill in
  // [row · cols + col]: the cell's minimum, maximum and the rank that set it, and its mean; NaN / −1 = no
  // record.
  std::vector<float> min, max, mean;
  std::vector<int32_t> max_rank;
  int64_t rows_read = 0;
};
inline constexpr size_t kMaxHeatmapCells = size_t{1} << 22;

// A device metric over time, every node's devices as rows (telemetry/records.h DeviceSampleRecord): columns
// are aligned windows of bucket_s seconds (a power of two of seconds, at least 1/16 s, with the range ÷
// bucket_s ≤ max_buckets), so the same sample always falls in the same column however the view pans.
struct DeviceSeriesQuery {
  DeviceMetric metric = DeviceMetric::kNodeCpu;
  double time_begin = 0;       // unix seconds; 0 = the first sample of the metric
  double time_end = 0;         // exclusive; 0 = just past the newest sample
  int32_t max_buckets = 1000;  // columns, 1..100,000
};
struct DeviceRow {
  std::string host;
  int32_t device = kDeviceNode;
};
struct DeviceSeriesResult {
  double first_time = 0;  // column c covers [first_time + c·bucket_s, + bucket_s)
  double bucket_s = 1;
  int32_t cols = 0;
  std::vector<DeviceRow> rows;  // by host, then device (the node's row, −1, first)
  // [row · cols + col]: the samples' min, max and mean in the cell; NaN = no sample (unknown).
  std::vector<float> min, max, mean;
  int64_t rows_read = 0;
};

struct HistoryDbOptions {
  bool read_only = false;
  // A step's aggregate tiles are built once the run has reached `rollup_lag_steps` steps past it, so
  // that per-node batches of the same step arriving a little apart do not rebuild tiles. Records that
  // arrive later still land correctly: their tiles are rebuilt in the same transaction.
  int32_t rollup_lag_steps = 2;
  int32_t busy_timeout_ms = 5000;
  // Copy the write-ahead log into the database on a thread of its own (with its own connection), so
  // the ingest thread only appends; see docs/TELEMETRY.md. Off: SQLite checkpoints inline at commit.
  bool background_checkpoint = true;
};

class HistoryDb {
 public:
  // Opens (creating if needed) and migrates to the current schema. Refuses a file that is not a Gantry
  // history, or whose schema is newer than this build.
  static std::unique_ptr<HistoryDb> open(const std::string& path, const HistoryDbOptions& options,
                                         std::string* error);
  ~HistoryDb();
  HistoryDb(const HistoryDb&) = delete;
  HistoryDb& operator=(const HistoryDb&) = delete;

  const std::string& error() const { return error_; }
  int schema_version() const;
  sqlite3* handle() { return db_; }  // for tests and tools: PRAGMA integrity_check and the like

  // Runs. begin_run returns the new run's id, or -1 (also past the 32,767 runs one file holds).
  int64_t begin_run(const RunInfo& info);
  // Final state; also builds the tiles of the run's last, partial blocks.
  bool finish_run(int64_t run_id, RunStatus status, std::string_view message, double finished_unix_s = 0);
  // A run's state while it is not final (a resume makes a stopped run running again), with its options.
  bool update_run(int64_t run_id, RunStatus status, std::string_view message, std::string_view options);
  bool get_run(int64_t run_id, RunRow* out);
  bool list_runs(std::vector<RunRow>* out);

  // All records of a batch (any runs, any steps, any order) in one transaction: all or nothing. A
  // rank-step record replaces an earlier one for the same run, step and rank; so does a step record.
  // A checkpoint record enters the catalog when committed or failed (a failure never replaces a committed
  // checkpoint of the same step: that one is still whole on disk), and becomes the run's event
  // (checkpoint_event) in any state.
  // Refused: an unknown run, a rank outside the run's world, a step outside 0..2^27−1, a rank-step
  // record where the raw rows were downsampled away. Give it whole steps (every rank's record of a
  // step in one batch), not one batch per node: a transaction costs ~100 µs whatever it holds.
  bool ingest(const RecordBatch& batch);

  bool upsert_node(const NodeInfo& node);
  bool list_nodes(std::vector<NodeInfo>* out);
  bool record_checkpoint(const CheckpointInfo& c);  // insert, or update the run's checkpoint at that step
  bool list_checkpoints(int64_t run_id, std::vector<CheckpointInfo>* out);
  // The run's catalogued checkpoints that are no longer committed on disk (their step is not among
  // `committed_steps`: pruned by keep-last, deleted by hand) are marked "deleted"; their steps are appended
  // to `marked` when given.
  bool reconcile_checkpoints(int64_t run_id, const std::vector<int64_t>& committed_steps,
                             std::vector<int64_t>* marked = nullptr);

  // Decimated range queries: work proportional to buckets (and to the ranks' tree decomposition), not to
  // rows. The step-metric band has max_rank = -1.
  bool query_band(const BandQuery& q, BandResult* out);
  bool query_series(const BandQuery& q, SeriesResult* out);
  bool query_heatmap(const HeatmapQuery& q, HeatmapResult* out);  // tiled metrics only
  bool query_step_band(int64_t run_id, StepMetric metric, int64_t step_begin, int64_t step_end,
                       int32_t max_buckets, BandResult* out);
  // One device metric, every device that reported it, at display resolution (storage/device_series.cpp).
  // Refused past kMaxHeatmapCells cells.
  bool query_devices(const DeviceSeriesQuery& q, DeviceSeriesResult* out);

  // Raw reads, bounded by `limit`, for details (a tooltip, a table, an API page).
  bool read_rank_steps(int64_t run_id, int64_t step_begin, int64_t step_end,
                       const std::vector<int32_t>& ranks, size_t limit, std::vector<RankStepRecord>* out);
  bool read_steps(int64_t run_id, int64_t step_begin, int64_t step_end, size_t limit,
                  std::vector<StepRecord>* out);
  bool read_events(int64_t run_id, int64_t after_id, size_t limit, std::vector<EventRow>* out);

  // Drops the run's rank_steps rows (and per-step tiles) before `before_step`, rounded down to a block
  // of 64 steps (the first tile level) and never past what is already tiled; the tiles of 64 steps and
  // up stay, so queries still answer for that range at a resolution of 64 steps (the NVML readings,
  // kept in rank_steps only, are gone there). Returns the step it cut at, or -1.
  int64_t downsample_rank_steps(int64_t run_id, int64_t before_step);

  // Forgets the run's step and rank-step records after `step`, and their tiles (a resume from an earlier
  // checkpoint will write them again). Its events stay: they say what happened, when, in which generation.
  bool rewind_run(int64_t run_id, int64_t step);

 private:
  struct RunState;
  struct Statements;
  class Checkpointer;
  HistoryDb() = default;
  bool fail(std::string_view what);
  bool fail_sqlite(std::string_view what);
  // One checkpoint record into the catalog, inside ingest's transaction.
  bool catalog_checkpoint(const CheckpointRecord& c);
  bool put_device_samples(const std::vector<DeviceSampleRecord>& samples);  // inside ingest's transaction
  bool exec(const char* sql);
  bool load_run(int64_t run_id, RunState* out);
  bool save_run(const RunState& run);
  bool delete_tiles(int64_t key_begin, int64_t key_end);  // rank_tiles rows with key_begin <= id < key_end
  int64_t node_id(const std::string& host);
  std::string host_of(int64_t node_id);
  bool begin_write();
  bool commit();
  void rollback();
  // rollup.cpp: rebuilds, from the rank_steps rows, the tiles of runs whose tiles are in an older format.
  bool upgrade_tiles();
  // rollup.cpp: builds the tiles of what became final (and rebuilds those `late` records touched).
  bool finalize(RunState& run, std::vector<int64_t> late_steps, bool seal);
  bool build_steps(const RunState& run, int64_t step_begin, int64_t step_end);
  bool build_blocks(const RunState& run, int step_level, int64_t block_begin, int64_t block_end);
  struct ScanPlan;
  bool scan(const RunState& run, const ScanPlan& plan, int64_t* rows_read);
  bool prepare_query(const BandQuery& q, bool per_rank, RunState* run, std::vector<int32_t>* ranks,
                     int64_t* first_step, int64_t* end_step, int64_t* bucket_steps);

  sqlite3* db_ = nullptr;
  HistoryDbOptions options_;
  std::string error_;
  std::unique_ptr<Statements> st_;
  std::unique_ptr<Checkpointer> checkpointer_;
  std::unordered_map<std::string, int64_t> node_ids_;
  std::unordered_map<int64_t, std::string> node_hosts_;
};

}  // namespace gantry
