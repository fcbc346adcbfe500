// Internal to storage/: the packed rows of rank_steps (frames: up to 8 ranks' records of one step) and
// rank_tiles (tile rows: 8 aggregate cells), and the arithmetic of the tile pyramid. Fixed-size,
// little-endian records, so a query reads one metric straight out of a blob without decoding the rest.
//
// The pyramid: a cell aggregates the records of a rectangle of ranks × steps. Along steps, level ℓ
// has blocks of kStepBlock[ℓ] steps (ℓ = 0 is single steps); along ranks, level m has cells of 8^m ranks
// and rows of 8^(m+1) ranks (8 cells). Stored: every ℓ ≥ 1 with every m the run needs, and ℓ = 0 with
// m ≥ 2 (per-step aggregates over 64 ranks and up); ℓ = 0, m = 0 is the frames themselves.
#pragma once

#include <bit>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>

#include "storage/history_db.h"

namespace gantry::pack {

inline constexpr int kGroupRanks = 8;
inline constexpr int kStepLevels = 6;
inline constexpr int64_t kStepBlock[kStepLevels] = {1, 64, 512, 4096, 32768, 262144};
inline constexpr int kRankLevels = 6;    // rows of up to 8^6 = 262,144 ranks
inline constexpr int kTiledMetrics = 9;  // RankMetric::total .. RankMetric::busy (rank_metric_tiled)

inline int tile_level(int step_level, int rank_level) {
  return step_level * 8 + rank_level;
}

// rank_tiles' rowid: run (15 bits) | level (6) | block (27) | rblock (15), so that rowid order is
// (run, level, block, rblock). Hence the limits: run ids below 32,768 in one file, steps below 2^27
// (134 million), and at most 8 × 32,768 = 262,144 ranks.
inline constexpr int64_t kMaxRunId = (int64_t{1} << 15) - 1;
inline constexpr int64_t kMaxStep = (int64_t{1} << 27) - 1;
inline int64_t tile_key(int64_t run, int level, int64_t block, int64_t rblock) {
  return (run << 48) | (static_cast<int64_t>(level) << 42) | (block << 15) | rblock;
}
inline int64_t rank_span(int rank_level) {
  return int64_t{1} << (3 * rank_level);
}  // ranks per cell
// The smallest rank level whose single row covers the whole world.
int top_rank_level(int32_t world_size);
// Whether tiles of (step level, rank level) are stored (frames stand in for 0,0; 0,1 is skipped).
inline bool tile_stored(int step_level, int rank_level) {
  return step_level > 0 || rank_level >= 2;
}

// One rank's record as a frame holds it: seconds as float32 (a wall-clock measurement has no more
// precision), tokens clamped to uint32, NVML readings NaN when absent.
struct RawRank {
  float phase[6] = {};
  float total = 0;
  uint32_t tokens = 0;
  uint64_t mem_allocated = 0;
  uint64_t mem_peak = 0;
  float temperature = NAN;
  float sm_clock = NAN;
  float power = NAN;
  uint32_t node = 0;
  int16_t device = -1;
};
inline constexpr size_t kRawRankBytes = 66;

struct Frame {
  uint8_t mask = 0;  // bit i: rank grp·8 + i present
  RawRank ranks[kGroupRanks];
};

RawRank raw_from_record(const RankStepRecord& r, uint32_t node_id);
// The metric's value; NaN when absent (an NVML reading not taken).
double raw_metric(const RawRank& r, RankMetric m);
void frame_encode(const Frame& f, std::string* out);
bool frame_decode(const void* data, size_t size, Frame* out);

struct MetricAgg {
  double min = std::numeric_limits<double>::infinity();
  double max = -std::numeric_limits<double>::infinity();
  double sum = 0;
  double last_sum = 0;
  int32_t max_rank = -1;
};

struct Cell {
  uint32_t count = 0;
  uint32_t last_count = 0;  // records at last_step
  int64_t last_step = std::numeric_limits<int64_t>::min();
  MetricAgg m[kTiledMetrics];

  void add(const RawRank& r, int32_t rank, int64_t step);
  void merge(const Cell& o);
};
// A cell in a blob: count, last_count (u32), last_step (i64), then per metric min, max, max_rank (i32),
// sum, last_sum. The eight time metrics come from float32 measurements (busy is their float32 sum), so their
// min and max are float32 too, exactly, and their sums float32 (7 significant digits, as the measurements
// have: a mean or a last value is read to that); peak memory is in bytes and keeps float64 throughout.
// 212 bytes, a row of 8 cells 1,698: two rows fit a 4 KiB page.
//
// Tile blob formats (the blob's first byte): 1 = the first eight metrics with float64 sums (248-byte cells,
// schema versions 1 and 2), 2 = nine, with busy, time sums float32. Both are read: a run whose raw rows were
// downsampled before busy existed keeps its format-1 tiles there (they cannot be rebuilt), and those cells
// have no busy value.
inline constexpr uint8_t kTileFormat = 2;
inline constexpr int kTiledMetricsV1 = 8;
inline constexpr bool metric_wide(int metric) {
  return metric == static_cast<int>(RankMetric::mem_peak);
}
inline constexpr size_t metric_agg_bytes(uint8_t format, int metric) {
  return metric_wide(metric) ? 36 : (format == 1 ? 28 : 20);
}
inline constexpr size_t metric_agg_offset(uint8_t format, int metric) {
  size_t off = 16;
  for (int k = 0; k < metric; ++k) off += metric_agg_bytes(format, k);
  return off;
}
inline constexpr size_t kCellBytes = metric_agg_offset(kTileFormat, kTiledMetrics);
static_assert(kCellBytes == 212);
inline constexpr size_t kCellBytesV1 = metric_agg_offset(1, kTiledMetricsV1);
static_assert(kCellBytesV1 == 248);
inline constexpr size_t tile_cell_bytes(uint8_t format) {
  return format == 1 ? kCellBytesV1 : kCellBytes;
}
inline constexpr int tile_metrics(uint8_t format) {
  return format == 1 ? kTiledMetricsV1 : kTiledMetrics;
}

struct TileRow {
  uint8_t mask = 0;
  Cell cells[kGroupRanks];
};

void tile_encode(const TileRow& t, std::string* out);
bool tile_decode(const void* data, size_t size, TileRow* out);

// The query path's view of one metric of one cell, read in place.
struct CellMetric {
  uint32_t count;
  uint32_t last_count;
  int64_t last_step;
  MetricAgg agg;
};
// Calls visit(slot, const CellMetric&) for each present slot in `want`; false if the blob is malformed.
// A metric the blob's format does not hold (busy in a format-1 tile) visits nothing.
template <class Visit>
bool tile_visit(const void* data, size_t size, uint8_t want, int metric, Visit&& visit);

// ---- little-endian fixed-width fields ----
template <class T>
inline T load(const unsigned char* p) {
  T v;
  std::memcpy(&v, p, sizeof v);
  return v;
}
template <class T>
inline void store(unsigned char* p, T v) {
  std::memcpy(p, &v, sizeof v);
}
// The file format is little-endian IEEE-754; so is every machine Gantry targets, and a port to another
// would fail here rather than write files nobody else can read.
static_assert(std::endian::native == std::endian::little);
static_assert(std::numeric_limits<double>::is_iec559 && std::numeric_limits<float>::is_iec559);

inline int popcount8(uint8_t m) {
  return __builtin_popcount(m);
}

template <class Visit>
bool tile_visit(const void* data, size_t size, uint8_t want, int metric, Visit&& visit) {
  const auto* p = static_cast<const unsigned char*>(data);
  if (size < 2 || (p[0] != 1 && p[0] != kTileFormat)) return false;
  const uint8_t mask = p[1];
  const size_t cell_bytes = tile_cell_bytes(p[0]);
  if (size != 2 + static_cast<size_t>(popcount8(mask)) * cell_bytes) return false;
  if (metric >= tile_metrics(p[0])) return true;
  const unsigned char* cell = p + 2;
  for (int slot = 0; slot < kGroupRanks; ++slot) {
    if (!(mask & (1u << slot))) continue;
    if (want & (1u << slot)) {
      CellMetric c;
      c.count = load<uint32_t>(cell);
      c.last_count = load<uint32_t>(cell + 4);
      c.last_step = load<int64_t>(cell + 8);
      const unsigned char* a = cell + metric_agg_offset(p[0], metric);
      if (metric_wide(metric)) {
        c.agg.min = load<double>(a);
        c.agg.max = load<double>(a + 8);
        c.agg.max_rank = load<int32_t>(a + 16);
        c.agg.sum = load<double>(a + 20);
        c.agg.last_sum = load<double>(a + 28);
      } else {
        c.agg.min = load<float>(a);
        c.agg.max = load<float>(a + 4);
        c.agg.max_rank = load<int32_t>(a + 8);
        if (p[0] == 1) {
          c.agg.sum = load<double>(a + 12);
          c.agg.last_sum = load<double>(a + 20);
        } else {
          c.agg.sum = load<float>(a + 12);
          c.agg.last_sum = load<float>(a + 16);
        }
      }
      visit(slot, c);
    }
    cell += cell_bytes;
  }
  return true;
}

}  // namespace gantry::pack
