// One rank's training state on the GPU (the bf16 parameter copy the kernels read, fp32 master weights,
// fp32 gradients, AdamW m and v) split over the dp axis by a ShardPlan, and the NCCL traffic that keeps it
// whole: the CUDA backend's half of data parallelism, the counterpart of parallel/zero_host_state.h.
//
// Nothing here waits on the host. Collectives go on a communication stream of their own, ordered against
// the compute stream by events, so a bucket's reduction overlaps the rest of the backward pass and ZeRO-3's
// gathers overlap the layers before. Every rank enqueues the same collectives in the same order (the plan
// and the call sequence are the same everywhere), which is all NCCL asks.
//
//   per step:        begin_step(micro_batches)
//   per micro-batch: begin_micro_batch()
//     forward:       p = params(u); prefetch(u + 1); ...kernels read p...; release(u)
//     backward:      g = grads(u); ...kernels add into g...; grads_done(u)     (buckets reduce as they fill)
//   then:            finish_reductions(); [phase mark]; update(adamw)         (step_stats reads norm())
//
// ZeRO 0: every rank holds everything; each bucket is all-reduced on the last micro-batch and every rank
//         updates every parameter, identically.
// ZeRO 1: master weights and moments are the rank's shard; each bucket is reduce-scattered in place on the
//         last micro-batch, the shard updated, and the bf16 copy all-gathered bucket by bucket when the next
//         forward first asks for parameters (it then waits for each bucket only where it first reads it).
// ZeRO 2: gradients too: each micro-batch's bucket is accumulated in one of two staging slots (the
//         embeddings in one of their own, filled at both ends of the backward), reduce-scattered in place
//         and added into the gradient shard (zeroed at begin_step).
// ZeRO 3: the bf16 copy too: each block is all-gathered into one of two slots just before use (the next
//         one prefetched) and its slot reused after release; the embeddings and final norm are gathered
//         once per step and stay (the model uses them at both ends).
// On one GPU (no communicator) the plan is ZeRO 0 and every call is pointer arithmetic with no events, so a
// micro-batch can be captured as a CUDA graph.
//
// Tensor parallel (parallel/tensor_parallel.h): `table` is this tp rank's share of the model and the plan
// splits it over dp as ever; the gradient norm then sums, over the tp group, the squares of the tensors
// split over tp and counts the ones every tp rank holds whole once (their gradients are the same bits on
// every tp rank), as ZeroHostState::set_tensor_parallel does on the CPU. The loss is not reduced over tp:
// every tp rank computes the same one.
//
// Sequence parallel (`tp_partial`, one flag per tensor): each tp rank's gradient of a flagged tensor (one it
// holds whole: the LayerNorms' and the row-parallel biases') is the part of the sum over its own rows only.
// finish_reductions() sums those over tp once a step, after the dp reductions (on the rank's shard of them
// under ZeRO 1-3: every tp rank's plan cuts the same table shapes the same way), so the norm and the update
// see whole gradients, the same on every tp rank.
//
// Pipeline parallel (cuda/backend_cuda.cu): `table` is one stage's tensors (at tp > 1 their tp shares), and
// `pp` the stage's pp axis: the norm then sums each stage's total (after the tp sum above) over pp. The
// loss is the backend's to share over pp (the last stage's). A stage's table may lack the embeddings
// (every stage but the first) or the final norm (every stage but the last): its units are then all blocks
// at that end (the plan's unit 0 or last unit is a block), so ZeRO 3 gathers them per use like any block
// and ZeRO 2-3 give the embeddings' slot only to a stage that has them. Under ZeRO 2-3 the backend calls
// begin_micro_batch() before the pass that completes each micro-batch's gradients (its backward, under
// interleaving each chunk's; ZB-H1's weight pass, the input pass's gradients kept aside until then) and
// grads_done() as it completes each unit, as at pp 1, in the stage's program order (the same on every
// replica of the stage). Interleaved, the plan begins a bucket at each chunk's first block, so each
// chunk's backward completes its own buckets.
//
// A failed collective is fatal (FatalError carrying the communicator's message): the gang fails together.
#pragma once

#include <cuda_runtime.h>

#include <chrono>
#include <cstdint>
#include <functional>
#include <vector>

#include "engine/core/backend.h"
#include "engine/core/cuda/kernels.cuh"  // bf16, AdamWChunk
#include "engine/core/parallel/shard_plan.h"

namespace gantry {

class Communicator;

class ZeroDeviceState {
 public:
  // Device memory for the state, counted by the caller (which frees it after this object is gone).
  using Allocate = std::function<void*(size_t bytes)>;
  // dp may be null only when plan.dp == 1; a plan over one rank must be ZeRO 0. norm_scratch: at least
  // global_norm_scratch_floats(numel) floats that the compute stream may use between other kernels.
  // tp: the tp axis (null at tp 1), with one flag per tensor of `table`: split over the tp ranks. pp: the
  // pp axis (null at pp 1), over which the norm's squares are summed last.
  ZeroDeviceState(const TensorTable& table, ShardPlan plan, Communicator* dp,
                  std::chrono::milliseconds timeout, cudaStream_t compute, float* norm_scratch,
                  const Allocate& allocate, Communicator* tp = nullptr, std::vector<bool> tp_sharded = {},
                  Communicator* pp = nullptr, const std::vector<bool>& tp_partial = {});
  ~ZeroDeviceState();
  ZeroDeviceState(const ZeroDeviceState&) = delete;
  ZeroDeviceState& operator=(const ZeroDeviceState&) = delete;

  const ShardPlan& plan() const { return plan_; }

  // Zeroes the step's loss and (ZeRO 0/1) the gradients; the last of `micro_batches` reduces (ZeRO 0/1).
  void begin_step(int micro_batches);
  void begin_micro_batch();

  // Where unit `unit`'s bf16 parameters start (ZeRO 3: in the slot it was gathered into, which the compute
  // stream waits for). Valid until release(unit).
  const bf16* params(int unit);
  void prefetch(int unit);  // ZeRO 3: starts gathering a block needed next; otherwise nothing
  void release(int unit);   // ZeRO 3: the slot may be reused once the kernels enqueued so far are done
  // Where the backward pass adds unit `unit`'s gradients this micro-batch (ZeRO 2/3: a staging slot,
  // zeroed on first touch), and the signal that it is done with them.
  float* grads(int unit);
  void grads_done(int unit);

  float* loss_sum() { return stats_; }         // the step's summed token losses (the backend adds into it)
  const float* norm() const { return norm_; }  // the global gradient norm, after update()
  // The compute stream waits for every reduction (and, data parallel, the loss sum's all-reduce): the part
  // of the communication the backward pass did not hide. Sequence parallel: then sums the partial
  // gradients over tp.
  void finish_reductions();
  // The global norm, clipping and AdamW on what this rank updates; ZeRO 1/2 then gather the bf16 copy.
  void update(const AdamWStep& s);
  // The norm of the reduced gradients now (waits; a collective under ZeRO 1-3).
  float grad_norm();

  // Global flat ranges this rank keeps of a buffer, and those it writes into a checkpoint (each element
  // written by exactly one rank).
  std::vector<FlatRange> held(StateBuffer which) const;
  std::vector<FlatRange> written(StateBuffer which) const;
  // Host copies in global coordinates; the range must lie inside held(which). Both wait.
  void read(StateBuffer which, size_t offset, size_t count, float* out);
  void write(StateBuffer which, size_t offset, size_t count, const float* in);
  // Where a range of a buffer (global coordinates, inside held(which)) lies on the device, part by part:
  // fn(global offset, device pointer, count). No wait: for copies that order themselves (checkpoint
  // snapshots, cuda/state_snapshot.cuh).
  void device_ranges(StateBuffer which, size_t offset, size_t count,
                     const std::function<void(size_t, const float*, size_t)>& fn);
  // Every fp32 parameter (a collective under ZeRO 1-3: every rank must call it).
  void gather_params(float* out);
  StateBytes bytes() const;  // device bytes held per category (bf16 copy and master weights as params)

  // The silent-data-corruption check (engine/core/sdc_check.h): what every dp replica holds bit-identically
  // after an update. ZeRO 0: the fp32 master weights (every rank updates all of them, identically). ZeRO
  // 1-2: the bf16 copy, all-gathered from the owners' shards (gathered here first when the update left it
  // stale; every rank asks at the same step, so the gathers stay in step). ZeRO 3: nothing ("").
  const char* replicated_state() const;
  size_t replicated_bytes() const;
  uint64_t replicated_hash();  // waits
  // Test-only: flips bit `bit` of that state on this rank; false where there is none or past its end. ZeRO
  // 1-2: into the bf16 copy as the next replicated_hash() gathers it (gathering here, on one rank, would
  // break the collectives' order).
  bool flip_replicated_bit(uint64_t bit);

 private:
  // A staging slot for one bucket's gradients (ZeRO 2/3), or a slot for one block's bf16 parameters
  // (ZeRO 3). `free` is recorded when the last reader or the reduction is done with the contents.
  struct GradSlot {
    float* data = nullptr;
    int bucket = -1;
    bool open = false;  // being filled this micro-batch
    cudaEvent_t free = nullptr;
    bool free_recorded = false;
  };
  struct ParamSlot {
    bf16* data = nullptr;
    int unit = -1;  // whose parameters it holds (valid until the next update), -1: none
    bool pinned = false;
    bool must_wait = false;  // the compute stream has not yet waited for its gather
    cudaEvent_t gathered = nullptr, free = nullptr;
    bool free_recorded = false;
  };

  bool sharded(StateBuffer which) const;
  // A block of this stage (gathered per use under ZeRO 3), as opposed to the embeddings or the final norm
  // (gathered once per step), which a pipeline stage may lack.
  bool is_block(int unit) const { return unit >= first_block_ && unit <= last_block_; }
  float* buffer(StateBuffer which);
  void build_chunks(const TensorTable& table, const Allocate& allocate);
  void check(const Status& st) const;
  // The communication stream waits for what the compute stream has enqueued so far.
  void comm_follows_compute();
  // ZeRO 1/2: all-gather the bf16 copy of every bucket (after the update or a load).
  void gather_all_buckets();
  // ZeRO 3: gather unit's bf16 parameters from the shards into a slot.
  void gather_into(ParamSlot& slot, int unit);
  ParamSlot& resident_slot(int unit);
  GradSlot& open_grad_slot(int bucket);
  void apply_flip(uint64_t bit);  // flip_replicated_bit's byte, now, on the compute stream
  // Tensor or pipeline parallel: stats_[1] = the squared global norm (the split tensors' squares summed
  // over tp, the whole ones' once, then the stages' totals over pp), on the compute stream; with_loss,
  // ZeRO 1-3's dp all-reduce also sums the loss.
  void tp_sum_squares(bool with_loss);
  // Sequence parallel: the flagged tensors' gradients summed over tp, on the compute stream, once a step.
  void sum_partial_over_tp();

  ShardPlan plan_;
  Communicator* comm_;
  std::chrono::milliseconds timeout_;
  cudaStream_t compute_;
  cudaStream_t comm_stream_ = nullptr;
  int zero_ = 0;
  float* norm_scratch_;  // ZeRO 0: global_norm_cuda's partials (the backend's scratch)

  float* master_ = nullptr;  // P (ZeRO 0) or the shard S
  float *m_ = nullptr, *v_ = nullptr;
  float* grads_ = nullptr;  // P (ZeRO 0/1) or the shard S (ZeRO 2/3)
  bf16* params_ = nullptr;  // P (ZeRO 0-2) or the shard S (ZeRO 3)
  float* stats_ = nullptr;  // [loss sum, sum of squared gradients, (tp) that of the whole tensors]
  unsigned long long* hash_sum_ = nullptr;  // replicated_hash()'s device scratch word
  int64_t pending_flip_bit_ = -1;           // flip_replicated_bit's, until the gather it waits for
  float* norm_ = nullptr;
  float* chunk_scratch_ = nullptr;  // ZeRO 1-3: one partial sum of squares per chunk
  AdamWChunk* chunks_ = nullptr;
  int n_chunks_ = 0;
  // Tensor parallel: the tp axis (null at tp 1), each tensor's flag (split over tp), and how many of the
  // chunks (which then come first) belong to split tensors.
  Communicator* tp_ = nullptr;
  std::vector<bool> tp_sharded_;
  int n_tp_sharded_chunks_ = 0;
  // Sequence parallel: the runs of this rank's gradient buffer that hold flagged tensors
  // (ShardPlan::gradient_runs), and whether this step's sum over tp is done.
  std::vector<FlatRange> tp_partial_runs_;
  bool tp_partial_summed_ = false;
  // The runs packed into one buffer for a single all-reduce: the device's run lists (grads to packed, and
  // back), the packed buffer, its length and the longest run.
  CopyRun* tp_pack_ = nullptr;
  CopyRun* tp_unpack_ = nullptr;
  float* tp_packed_ = nullptr;
  size_t tp_packed_count_ = 0, tp_longest_run_ = 0;
  // Pipeline parallel: the pp axis (null at pp 1), the norm's last sum.
  Communicator* pp_ = nullptr;

  // Which units are the stage's blocks: [first_block_, last_block_] (1 and L at pp 1; a pipeline stage
  // without the embeddings starts at 0, one without the final norm ends at its last unit), the largest
  // of them, the embeddings' bucket (-1: none on this stage) and the largest other bucket.
  bool has_embeddings_ = true, has_final_ = true;
  int first_block_ = 1, last_block_ = 0;
  int embedding_bucket_ = -1;
  size_t largest_block_ = 0, largest_other_bucket_ = 0;

  // ZeRO 2/3 gradient staging: the embeddings' bucket, and two slots for the others.
  GradSlot embedding_grads_;
  GradSlot grad_slots_[2];
  // ZeRO 3 parameter slots: the embeddings and final norm (for the whole step), and two for blocks.
  ParamSlot embedding_params_, final_params_;
  ParamSlot block_slots_[2];
  // ZeRO 1/2: a bucket's bf16 gather the compute stream has yet to wait for.
  std::vector<cudaEvent_t> bucket_gathered_;
  std::vector<char> bucket_gather_pending_;
  bool params_stale_ = false;  // ZeRO 1/2: updated or written shards not yet gathered

  std::vector<int> bucket_units_, bucket_done_;
  int micro_batches_ = 1;
  int micro_index_ = 0;
  cudaEvent_t compute_mark_ = nullptr, comm_mark_ = nullptr;
};

}  // namespace gantry
