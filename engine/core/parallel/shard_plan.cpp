#include "engine/core/parallel/shard_plan.h"

#include <algorithm>
#include <cstdio>

#include "engine/core/comm/communicator.h"
#include "engine/core/fatal.h"

namespace gantry {

size_t ShardPlan::largest_block_unit() const {
  size_t m = 0;
  for (int u = 1; u < final_unit(); ++u) m = std::max(m, units[u].count);
  return m;
}

size_t ShardPlan::largest_nonembedding_bucket() const {
  size_t m = 0;
  const int embedding_bucket = unit_bucket[embedding_unit()];
  for (size_t b = 0; b < buckets.size(); ++b) {
    if (static_cast<int>(b) != embedding_bucket) m = std::max(m, buckets[b].count);
  }
  return m;
}

std::vector<FlatRange> ShardPlan::replica_written_ranges() const {
  const auto cut = [&](int r) -> size_t {
    if (r >= dp) return numel;
    return numel * static_cast<size_t>(r) / static_cast<size_t>(dp) / 64 * 64;
  };
  const size_t lo = cut(rank), hi = cut(rank + 1);
  if (hi <= lo) return {};
  return {{lo, hi - lo}};
}

std::vector<FlatRange> ShardPlan::owned_ranges() const {
  std::vector<FlatRange> out;
  for (const FlatRange& r : owned) {
    if (r.count == 0) continue;
    if (!out.empty() && out.back().end() == r.offset) {
      out.back().count += r.count;
    } else {
      out.push_back(r);
    }
  }
  return out;
}

std::vector<FlatRange> ShardPlan::gradient_runs(const std::vector<bool>& tensors) const {
  std::vector<FlatRange> out;
  for (const ShardSegment& s : segments) {
    if (s.count == 0 || s.tensor >= tensors.size() || !tensors[s.tensor]) continue;
    const size_t at = zero >= 2 ? s.shard_offset : s.offset;
    if (!out.empty() && out.back().end() == at) {
      out.back().count += s.count;
    } else {
      out.push_back({.offset = at, .count = s.count});
    }
  }
  return out;
}

size_t ShardPlan::for_each_owned(size_t offset, size_t count,
                                 const std::function<void(size_t, size_t, size_t)>& fn) const {
  size_t covered = 0;
  for (size_t b = 0; b < owned.size(); ++b) {
    const FlatRange& own = owned[b];
    const size_t lo = std::max(offset, own.offset), hi = std::min(offset + count, own.end());
    if (lo >= hi) continue;
    fn(lo, owned_shard_offset[b] + (lo - own.offset), hi - lo);
    covered += hi - lo;
  }
  return covered;
}

namespace {

// Units from the table's layer indices: tensors before the first block, each block, tensors after.
std::vector<FlatRange> units_of(const TensorTable& table) {
  std::vector<FlatRange> units;
  int current = -2;  // the unit key of the last tensor: -1 before the blocks, layer, or -3 after them
  bool seen_block = false;
  for (const TensorInfo& t : table.tensors()) {
    int key = t.layer;
    if (t.layer < 0) key = seen_block ? -3 : -1;
    if (t.layer >= 0) seen_block = true;
    if (units.empty() || key != current) {
      units.push_back({t.offset, 0});
      current = key;
    }
    units.back().count += t.numel;
  }
  // A pipeline's middle stage may hold a single block: one unit, which is then its own bucket.
  GANTRY_CHECK(!units.empty(), "the tensor table is empty");
  return units;
}

}  // namespace

ShardPlan shard_plan_make(const TensorTable& table, int dp, int rank, int zero, size_t bucket_bytes,
                          const std::vector<int>& bucket_starts) {
  GANTRY_CHECK(dp >= 1 && rank >= 0 && rank < dp && zero >= 0 && zero <= 3, "bad shard plan arguments");
  ShardPlan p;
  p.dp = dp;
  p.rank = rank;
  p.zero = zero;
  p.numel = table.numel();
  p.units = units_of(table);
  const int n_units = static_cast<int>(p.units.size());
  p.unit_bucket.assign(n_units, -1);
  std::vector<char> starts(n_units + 1, 0);
  for (int u : bucket_starts) {
    GANTRY_CHECK(u >= 1 && u < n_units, "bucket start unit " + std::to_string(u) + " (allowed 1 to " +
                                            std::to_string(n_units - 1) + ")");
    starts[u] = 1;
  }

  // Buckets are formed from the top unit down (the order the backward pass completes them), then stored
  // in flat order.
  const size_t cap = std::max<size_t>(1, bucket_bytes / sizeof(float));
  std::vector<std::vector<int>> groups;  // units of each bucket, top down
  for (int u = n_units - 1; u >= 1; --u) {
    // Unit u + 1 (the group's lowest so far) beginning a bucket closes the group.
    const bool fits = !groups.empty() && zero < 3 && !starts[u + 1] && [&] {
      size_t n = 0;
      for (int v : groups.back()) n += p.units[v].count;
      return n + p.units[u].count <= cap;
    }();
    if (!fits) groups.emplace_back();
    groups.back().push_back(u);
  }
  groups.push_back({0});
  std::reverse(groups.begin(), groups.end());
  for (const std::vector<int>& g : groups) {
    const int lo = *std::min_element(g.begin(), g.end()), hi = *std::max_element(g.begin(), g.end());
    const int b = static_cast<int>(p.buckets.size());
    p.buckets.push_back({p.units[lo].offset, p.units[hi].end() - p.units[lo].offset});
    for (int u : g) p.unit_bucket[u] = b;
  }

  for (const FlatRange& b : p.buckets) {
    FlatRange mine = b;
    if (zero >= 1) {
      const CommBlock blk = comm_block(b.count, dp, rank);
      mine = {b.offset + blk.offset, blk.count};
    }
    p.owned.push_back(mine);
    p.owned_shard_offset.push_back(p.shard_numel);
    p.shard_numel += mine.count;
  }

  for (size_t b = 0; b < p.owned.size(); ++b) {
    size_t at = p.owned[b].offset;
    const size_t end = p.owned[b].end();
    while (at < end) {
      const size_t ti = table.index_of_offset(at);
      const TensorInfo& t = table[ti];
      const size_t stop = std::min(end, t.offset + t.numel);
      p.segments.push_back({.offset = at,
                            .shard_offset = p.owned_shard_offset[b] + (at - p.owned[b].offset),
                            .count = stop - at,
                            .tensor = ti,
                            .decay = t.decay});
      at = stop;
    }
  }
  return p;
}

ShardMemory shard_memory(const ShardPlan& p) {
  const size_t P = p.numel, S = p.shard_numel;
  const size_t E = p.units[p.embedding_unit()].count, F = p.units[p.final_unit()].count;
  ShardMemory m;
  m.params = p.zero < 3 ? P : S + E + F + 2 * p.largest_block_unit();
  m.grads = p.zero < 2 ? P : S + E + 2 * p.largest_nonembedding_bucket();
  m.optimizer = 2 * S;
  return m;
}

std::string shard_memory_text(const ShardPlan& p) {
  const ShardMemory m = shard_memory(p);
  const char* params = p.zero < 3 ? "P" : "S+E+F+2U";
  const char* grads = p.zero < 2 ? "P" : "S+E+2B";
  const char* opt = p.zero < 1 ? "2P" : "2S";
  char buf[400];
  std::snprintf(buf, sizeof buf,
                "zero %d over dp %d, bytes per rank: params %s = %zu, grads %s = %zu, AdamW %s = %zu "
                "(4-byte floats; P %zu, S %zu, E %zu, F %zu, U %zu, B %zu)",
                p.zero, p.dp, params, m.params * 4, grads, m.grads * 4, opt, m.optimizer * 4, p.numel,
                p.shard_numel, p.units[p.embedding_unit()].count, p.units[p.final_unit()].count,
                p.largest_block_unit(), p.largest_nonembedding_bucket());
  return buf;
}

}  // namespace gantry
