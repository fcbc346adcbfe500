// Which window each training sequence reads, as a pure function of (seed, global sample index): nothing
// is stored, so a resumed run needs only the cursor (seed, optimizer steps done) to read exactly the
// windows an uninterrupted run would have read, whatever the data-parallel layout before and after.
//
// With W windows, global sample g belongs to epoch g / W and reads window permutation_{seed,epoch}(g % W):
// every epoch visits every window once, in an order of its own. At optimizer step s with a global batch of
// G sequences, sample i in [0, G) is global index s*G + i; data-parallel rank r owns i in
// [r*G/dp, (r+1)*G/dp), and its micro-batch m is the next micro_batch of those.
//
//   for (int m = 0; m < grad_accum; ++m) {
//     SampleRange r = sampler_micro_batch(cursor.step, G, dp, rank, B, m);
//     for (uint64_t k = 0; k < r.count; ++k) {
//       uint64_t w = sampler_window(cursor.seed, r.first + k, ds.num_windows());
//       ds.window(w, inputs + k * T, targets + k * T);
//     }
//   }
//   ++cursor.step;  // after the optimizer step; checkpoint {seed, step} to resume exactly
#pragma once

#include <cstdint>
#include <vector>

namespace gantry {

// A bijection on [0, n) chosen by (seed, epoch): a 4-round Feistel network over the next power of two
// with cycle-walking, so O(1) memory for any n. Requires position < n; returns 0 when n <= 1.
uint64_t sampler_permute(uint64_t position, uint64_t n, uint64_t seed, uint64_t epoch);

// All that is needed to resume exactly. `step` = optimizer steps done.
struct SamplerCursor {
  uint64_t seed;
  uint64_t step;
};

// The window global sample `global_index` reads (0 when num_windows is 0).
uint64_t sampler_window(uint64_t seed, uint64_t global_index, uint64_t num_windows);
// The epoch global sample `global_index` falls in (0 when num_windows is 0).
uint64_t sampler_epoch(uint64_t global_index, uint64_t num_windows);

// The global sample indices of one micro-batch: first index and count.
struct SampleRange {
  uint64_t first;
  uint64_t count;
};

// The samples of micro-batch `micro_index` of data-parallel rank `dp_rank` at optimizer step `step`. The
// caller checks global_batch % dp_size == 0. When micro_batch does not divide the rank's share, the last
// micro-batch is short; a micro_index past the share (or a bad argument) gives count 0.
SampleRange sampler_micro_batch(uint64_t step, int global_batch, int dp_size, int dp_rank, int micro_batch,
                                int micro_index);

// Global batches the data cursor passes over (the step guard's rollback, engine/core/step_guard.h): batch
// indices [first, first + count) in the order the sampler hands batches out. They are never read, and a
// checkpoint records them, so "every sample read exactly once" stays true with those named as skipped.
struct SkippedBatches {
  uint64_t first;
  uint64_t count;
  bool operator==(const SkippedBatches&) const = default;
};

// The global batch index optimizer step `step` (0-based, steps done before it) reads: `step` itself, moved
// past every skipped range at or before it. `skipped` is sorted by first and its ranges do not overlap.
uint64_t sampler_batch(uint64_t step, const std::vector<SkippedBatches>& skipped);

// Adds batch `index` to the skipped ranges, keeping them sorted and merging neighbours.
void sampler_skip_batch(std::vector<SkippedBatches>& skipped, uint64_t index);

}  // namespace gantry
