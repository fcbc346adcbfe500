#include "storage/pack.h"

#include <algorithm>

namespace gantry::pack {
namespace {

constexpr uint8_t kFrameFormat = 1;  // first byte of a frame; a layout change bumps it (with a migration)

float to_f32(const std::optional<double>& v) {
  return v ? static_cast<float>(*v) : NAN;
}

}  // namespace

int top_rank_level(int32_t world_size) {
  int m = 0;
  while (m + 1 < kRankLevels && rank_span(m + 1) < world_size) ++m;
  return m;
}

RawRank raw_from_record(const RankStepRecord& r, uint32_t node_id) {
  RawRank x;
  for (int p = 0; p < 6; ++p) x.phase[p] = static_cast<float>(r.phases.get(static_cast<Phase>(p)));
  x.total = static_cast<float>(r.total_s);
  x.tokens = static_cast<uint32_t>(std::clamp<int64_t>(r.tokens, 0, UINT32_MAX));
  x.mem_allocated = r.mem_allocated_bytes;
  x.mem_peak = r.mem_peak_bytes;
  x.temperature = to_f32(r.temperature_celsius);
  x.sm_clock = to_f32(r.sm_clock_hertz);
  x.power = to_f32(r.power_watts);
  x.node = node_id;
  x.device = static_cast<int16_t>(std::clamp<int32_t>(r.device, INT16_MIN, INT16_MAX));
  return x;
}

double raw_metric(const RawRank& r, RankMetric m) {
  switch (m) {
    case RankMetric::total:
      return r.total;
    case RankMetric::data_wait:
      return r.phase[0];
    case RankMetric::forward:
      return r.phase[1];
    case RankMetric::backward:
      return r.phase[2];
    case RankMetric::optimizer:
      return r.phase[3];
    case RankMetric::comm_exposed:
      return r.phase[4];
    case RankMetric::checkpoint_stall:
      return r.phase[5];
    case RankMetric::mem_peak:
      return static_cast<double>(r.mem_peak);
    case RankMetric::busy:
      // Summed in float32, as the tiles keep it, so a cell's min and max are exact.
      return r.phase[0] + r.phase[1] + r.phase[2] + r.phase[3];
    case RankMetric::tokens:
      return r.tokens;
    case RankMetric::mem_allocated:
      return static_cast<double>(r.mem_allocated);
    case RankMetric::temperature:
      return r.temperature;
    case RankMetric::sm_clock:
      return r.sm_clock;
    case RankMetric::power:
      return r.power;
  }
  return NAN;
}

void frame_encode(const Frame& f, std::string* out) {
  out->assign(2 + static_cast<size_t>(popcount8(f.mask)) * kRawRankBytes, '\0');
  auto* p = reinterpret_cast<unsigned char*>(out->data());
  p[0] = kFrameFormat;
  p[1] = f.mask;
  p += 2;
  for (int i = 0; i < kGroupRanks; ++i) {
    if (!(f.mask & (1u << i))) continue;
    const RawRank& r = f.ranks[i];
    for (int k = 0; k < 6; ++k) store(p + 4 * k, r.phase[k]);
    store(p + 24, r.total);
    store(p + 28, r.tokens);
    store(p + 32, r.mem_allocated);
    store(p + 40, r.mem_peak);
    store(p + 48, r.temperature);
    store(p + 52, r.sm_clock);
    store(p + 56, r.power);
    store(p + 60, r.node);
    store(p + 64, r.device);
    p += kRawRankBytes;
  }
}

bool frame_decode(const void* data, size_t size, Frame* out) {
  const auto* p = static_cast<const unsigned char*>(data);
  if (size < 2 || p[0] != kFrameFormat) return false;
  out->mask = p[1];
  if (size != 2 + static_cast<size_t>(popcount8(out->mask)) * kRawRankBytes) return false;
  p += 2;
  for (int i = 0; i < kGroupRanks; ++i) {
    if (!(out->mask & (1u << i))) continue;
    RawRank& r = out->ranks[i];
    for (int k = 0; k < 6; ++k) r.phase[k] = load<float>(p + 4 * k);
    r.total = load<float>(p + 24);
    r.tokens = load<uint32_t>(p + 28);
    r.mem_allocated = load<uint64_t>(p + 32);
    r.mem_peak = load<uint64_t>(p + 40);
    r.temperature = load<float>(p + 48);
    r.sm_clock = load<float>(p + 52);
    r.power = load<float>(p + 56);
    r.node = load<uint32_t>(p + 60);
    r.device = load<int16_t>(p + 64);
    p += kRawRankBytes;
  }
  return true;
}

void Cell::add(const RawRank& r, int32_t rank, int64_t step) {
  ++count;
  if (step > last_step) {
    last_step = step;
    last_count = 0;
    for (MetricAgg& a : m) a.last_sum = 0;
  }
  const bool at_last = step == last_step;
  last_count += at_last;
  for (int k = 0; k < kTiledMetrics; ++k) {
    const double v = raw_metric(r, static_cast<RankMetric>(k));
    MetricAgg& a = m[k];
    a.min = std::min(a.min, v);
    // Ties keep the lower rank, so the answer does not depend on the order records were merged in.
    if (v > a.max || (v == a.max && rank < a.max_rank)) {
      a.max = v;
      a.max_rank = rank;
    }
    a.sum += v;
    if (at_last) a.last_sum += v;
  }
}

void Cell::merge(const Cell& o) {
  if (o.count == 0) return;
  count += o.count;
  if (o.last_step > last_step) {
    last_step = o.last_step;
    last_count = o.last_count;
    for (int k = 0; k < kTiledMetrics; ++k) m[k].last_sum = o.m[k].last_sum;
  } else if (o.last_step == last_step) {
    last_count += o.last_count;
    for (int k = 0; k < kTiledMetrics; ++k) m[k].last_sum += o.m[k].last_sum;
  }
  for (int k = 0; k < kTiledMetrics; ++k) {
    MetricAgg& a = m[k];
    const MetricAgg& b = o.m[k];
    a.min = std::min(a.min, b.min);
    if (b.max > a.max || (b.max == a.max && b.max_rank < a.max_rank)) {
      a.max = b.max;
      a.max_rank = b.max_rank;
    }
    a.sum += b.sum;
  }
}

void tile_encode(const TileRow& t, std::string* out) {
  out->assign(2 + static_cast<size_t>(popcount8(t.mask)) * kCellBytes, '\0');
  auto* p = reinterpret_cast<unsigned char*>(out->data());
  p[0] = kTileFormat;
  p[1] = t.mask;
  p += 2;
  for (int i = 0; i < kGroupRanks; ++i) {
    if (!(t.mask & (1u << i))) continue;
    const Cell& c = t.cells[i];
    store(p, c.count);
    store(p + 4, c.last_count);
    store(p + 8, c.last_step);
    for (int k = 0; k < kTiledMetrics; ++k) {
      unsigned char* a = p + metric_agg_offset(kTileFormat, k);
      const MetricAgg& m = c.m[k];
      if (metric_wide(k)) {
        store(a, m.min);
        store(a + 8, m.max);
        store(a + 16, m.max_rank);
        store(a + 20, m.sum);
        store(a + 28, m.last_sum);
      } else {
        // Min and max exact: the time metrics are float32 measurements (frames hold them so).
        store(a, static_cast<float>(m.min));
        store(a + 4, static_cast<float>(m.max));
        store(a + 8, m.max_rank);
        store(a + 12, static_cast<float>(m.sum));
        store(a + 16, static_cast<float>(m.last_sum));
      }
    }
    p += kCellBytes;
  }
}

bool tile_decode(const void* data, size_t size, TileRow* out) {
  *out = TileRow();
  const auto* p = static_cast<const unsigned char*>(data);
  if (size < 2 || (p[0] != 1 && p[0] != kTileFormat)) return false;
  out->mask = p[1];
  bool ok = true;
  for (int k = 0; k < kTiledMetrics && ok; ++k) {
    ok = tile_visit(data, size, out->mask, k, [&](int slot, const CellMetric& c) {
      Cell& cell = out->cells[slot];
      cell.count = c.count;
      cell.last_count = c.last_count;
      cell.last_step = c.last_step;
      cell.m[k] = c.agg;
    });
  }
  return ok;
}

}  // namespace gantry::pack
