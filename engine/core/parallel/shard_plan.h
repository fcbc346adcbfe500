// How one rank's share of the flat training state is cut under data parallelism and ZeRO: pure
// arithmetic over the tensor table, the same on every rank, so every rank issues the same collectives in
// the same order.
//
//   units    contiguous runs of the flat buffer gathered as one under ZeRO-3: the embeddings (wte, wpe),
//            each transformer block, the final norm (gpt.h lays tensors out block by block).
//   buckets  what one collective reduces: whole units in the order the backward pass finishes them. The
//            embeddings are a bucket of their own (the classifier writes wte's gradient first and the
//            encoder last, so it is complete only at the very end); the final norm and the blocks, from
//            the top down, are grouped up to `bucket_bytes`. Under ZeRO-3 every unit is its own bucket,
//            so a gather and a reduce-scatter each move one unit.
//   owned    per bucket, the block this rank reduces, updates and checkpoints: comm_block(bucket size, dp,
//            rank) inside the bucket (ZeRO 1-3); ZeRO 0 owns everything (every rank updates every
//            parameter, identically). The owned blocks, packed bucket by bucket, are the rank's shard.
//
//   ShardPlan plan = shard_plan_make(table, /*dp=*/4, /*rank=*/1, /*zero=*/2, 25 << 20);
//   for (const ShardSegment& s : plan.segments) adamw(params + s.offset, shard_m + s.shard_offset, s.count,
//   s.decay); ShardMemory mem = shard_memory(plan);   // what the rank allocates, per category
#pragma once

#include <cstddef>
#include <functional>
#include <string>
#include <vector>

#include "engine/core/tensor_table.h"

namespace gantry {

// Part of an owned range inside one tensor: where it is in global coordinates and in the rank's shard.
struct ShardSegment {
  size_t offset = 0;        // global flat offset
  size_t shard_offset = 0;  // offset in the rank's packed shard buffers
  size_t count = 0;
  size_t tensor = 0;  // index in the tensor table
  bool decay = false;
};

struct ShardPlan {
  int dp = 1;
  int rank = 0;  // dp rank
  int zero = 0;
  size_t numel = 0;
  std::vector<FlatRange> units;            // flat order: [0] embeddings, [1..L] blocks, [L+1] final norm
  std::vector<FlatRange> buckets;          // flat order
  std::vector<int> unit_bucket;            // bucket of each unit
  std::vector<FlatRange> owned;            // per bucket, global coordinates
  std::vector<size_t> owned_shard_offset;  // per bucket, where owned[b] starts in the shard
  size_t shard_numel = 0;                  // sum of owned counts
  std::vector<ShardSegment> segments;      // owned ranges cut at tensor boundaries, in flat order

  int embedding_unit() const { return 0; }
  int final_unit() const { return static_cast<int>(units.size()) - 1; }
  bool is_block(int unit) const { return unit > 0 && unit < final_unit(); }
  size_t largest_block_unit() const;  // elements; 0 without blocks
  size_t largest_nonembedding_bucket() const;
  // The owned ranges with neighbours merged (what a rank reports as held or written).
  std::vector<FlatRange> owned_ranges() const;
  // What this rank writes into a checkpoint at ZeRO 0, where every replica holds the whole state: its
  // 1/dp of the flat buffers, cut at multiples of 64 floats, so the write is spread evenly over the ranks
  // by bytes (rank 0 alone wrote all of it before). Together the ranks cover [0, numel) exactly once.
  std::vector<FlatRange> replica_written_ranges() const;
  // Where this rank's gradient buffer holds the reduced gradients of the tensors flagged in `tensors` (one
  // flag per table entry): their owned parts (all of them at ZeRO 0), at global offsets in the full buffer
  // at ZeRO 0-1 and at shard offsets at ZeRO 2-3, in flat order, neighbours merged. Sequence parallelism
  // sums these over tp (cuda/zero_device_state.cuh); every tp rank's plan cuts the same shapes alike.
  std::vector<FlatRange> gradient_runs(const std::vector<bool>& tensors) const;
  // Calls fn(global offset, shard offset, count) for each part of [offset, offset + count) inside the owned
  // blocks, in flat order; returns how many elements that covered.
  size_t for_each_owned(size_t offset, size_t count,
                        const std::function<void(size_t, size_t, size_t)>& fn) const;
};

// `table` must be gpt_param_table's (units are found from the tensors' layer index). bucket_bytes is
// in bytes of fp32 elements; a unit larger than it is a bucket alone. `bucket_starts`: units that begin a
// bucket whatever its size (the first block of each model chunk of an interleaved GPU stage, whose
// backwards each complete their own chunk's buckets: cuda/backend_cuda.cu); each must be in [1, units).
ShardPlan shard_plan_make(const TensorTable& table, int dp, int rank, int zero, size_t bucket_bytes,
                          const std::vector<int>& bucket_starts = {});

// Floats a rank holds per category under the plan, by the formula the engine prints (P = numel, S =
// shard_numel, E = embedding unit, F = final norm unit, U = largest block unit, B = largest bucket
// other than the embeddings):
//   params     zero 0-2: P          zero 3: S + E + F + 2U  (shard, then the units gathered for use:
//                                   the embeddings and final norm for the whole step, two block slots)
//   grads      zero 0-1: P          zero 2-3: S + E + 2B    (shard, plus staging: the embeddings'
//                                   bucket for the whole backward, two slots for the rest)
//   optimizer  zero 0:   2P         zero 1-3: 2S            (AdamW m and v)
struct ShardMemory {
  size_t params = 0;
  size_t grads = 0;
  size_t optimizer = 0;
  size_t total() const { return params + grads + optimizer; }
};
ShardMemory shard_memory(const ShardPlan& plan);
// One line naming the formula and its values in bytes, for the run's start-up summary.
std::string shard_memory_text(const ShardPlan& plan);

}  // namespace gantry
