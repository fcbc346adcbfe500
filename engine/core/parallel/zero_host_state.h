// One rank's training state in host memory (parameters, gradients, AdamW m and v) split over the dp axis
// by a ShardPlan, and the communication that keeps it whole: the CPU backend's half of data parallelism.
//
// Collectives run on one communication thread, in the order they are queued, so the backward pass goes
// on computing while a finished bucket is reduced and the next block's parameters are gathered. Every
// rank queues the same collectives in the same order (the plan and the call sequence are the same
// everywhere), which is all the communicator's contract asks.
//
//   per step:        begin_step(micro_batches)
//   per micro-batch: begin_micro_batch()
//     forward:       p = params(u); prefetch(u + 1); ...; release(u)
//     backward:      g = grads(u); ... accumulate ...; grads_done(u)     (buckets reduce as they fill)
//   then:            Reduced r = reduce_stats(local_loss); adamw(step, clip_scale(r.grad_norm, clip))
//
// ZeRO 0: all-reduce each bucket on the last micro-batch; every rank updates everything, identically.
// ZeRO 1: reduce-scatter each bucket on the last micro-batch; update the owned block; all-gather.
// ZeRO 2: gradients live only as the owned shard: each micro-batch's bucket is staged, reduce-scattered
//         and added into the shard.
// ZeRO 3: parameters too: each unit is all-gathered before use (the next prefetched) and dropped after;
//         the embeddings and final norm stay gathered for the step (used at both ends of the model).
// Without a communicator (dp 1) the same code runs with local copies in place of collectives.
//
// A failed collective is fatal (FatalError carrying the communicator's message): the gang fails together.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

#include "engine/core/backend.h"
#include "engine/core/cpu/thread_pool.h"
#include "engine/core/parallel/shard_plan.h"
#include "telemetry/status.h"

namespace gantry {

class Communicator;

class ZeroHostState {
 public:
  // dp may be null only when plan.dp == 1. pool runs the optimizer's loops.
  ZeroHostState(const TensorTable& table, ShardPlan plan, Communicator* dp, std::chrono::milliseconds timeout,
                ThreadPool* pool);
  ~ZeroHostState();
  ZeroHostState(const ZeroHostState&) = delete;
  ZeroHostState& operator=(const ZeroHostState&) = delete;

  const ShardPlan& plan() const { return plan_; }

  void begin_step(int micro_batches);  // zeroes the gradients; the last of `micro_batches` reduces (ZeRO 0/1)
  void begin_micro_batch();

  // The unit's parameters in full, valid until release(unit) (ZeRO 3: waits for its gather).
  const float* params(int unit);
  void prefetch(int unit);  // ZeRO 3: starts gathering a unit needed soon; otherwise nothing
  void release(int unit);
  // Where the backward pass accumulates the unit's gradients this micro-batch (zeroed on first touch
  // under ZeRO 2/3), and the signal that it is done with them.
  float* grads(int unit);
  void grads_done(int unit);
  struct Reduced {
    double loss = 0;       // mean over dp ranks of each rank's mean loss
    double grad_norm = 0;  // global L2 norm of the reduced gradients
  };
  // Waits for every reduction, then agrees on the global loss and gradient norm (one small all-gather of
  // doubles, summed in rank order on every rank: the same bits everywhere).
  Reduced reduce_stats(double local_loss);
  // Tensor parallel (parallel/tensor_parallel.h): reduce_stats' norm then also sums, over `tp`, the squares
  // of the tensors flagged sharded (one flag per tensor of `table`), and counts the others once.
  void set_tensor_parallel(Communicator* tp, const TensorTable& table, std::vector<bool> sharded);
  // AdamW on the owned segments with gradients scaled by grad_scale; ZeRO 1/2 then all-gather the
  // parameters bucket by bucket.
  void adamw(const AdamWStep& s, double grad_scale);

  // Global flat ranges of a buffer this rank keeps, and those it writes into a checkpoint (each element
  // written by exactly one rank: the owned blocks; under ZeRO 0 each rank its 1/dp,
  // ShardPlan::replica_written_ranges).
  std::vector<FlatRange> held(StateBuffer which) const;
  std::vector<FlatRange> written(StateBuffer which) const;
  // Copies in global coordinates; [offset, offset + count) must lie inside held(which).
  void read(StateBuffer which, size_t offset, size_t count, float* out);
  void write(StateBuffer which, size_t offset, size_t count, const float* in);
  // Every parameter (a collective under ZeRO 3: every rank must call it).
  void gather_params(float* out);
  // The full parameter buffer once every queued collective is done (ZeRO 0-2, where every rank keeps all of
  // it); null under ZeRO 3. For the replica checksum (engine/core/sdc_check.h), without a copy.
  const float* full_params();

  ShardMemory allocated() const;  // floats actually held, per category
  // Seconds the caller spent waiting for communication since begin_step.
  double exposed_comm_seconds() const { return exposed_s_; }

 private:
  using TaskId = uint64_t;
  TaskId enqueue(std::function<Status()> task);
  void wait(TaskId id);  // FatalError on a failed collective
  void wait_all();
  void comm_main();

  // Collectives, or their local equivalents when dp == 1.
  Status reduce_bucket_full(int b);                            // ZeRO 0 / 1 on grads_
  Status reduce_bucket_staged(int b, float* staging);          // ZeRO 2 / 3: into the shard
  Status gather_bucket(int b, const float* mine, float* out);  // all blocks of bucket b into out

  float* full_or_shard(StateBuffer which);
  Reduced reduce_stats_tp(double local_loss);

  ShardPlan plan_;
  Communicator* comm_;
  std::chrono::milliseconds timeout_;
  ThreadPool* pool_;
  Communicator* tp_ = nullptr;         // set_tensor_parallel's; null: tp 1
  std::vector<FlatRange> tp_tensors_;  // each tensor's range of the flat buffer
  std::vector<bool> tp_sharded_;       // per tensor: split over the tp ranks

  std::vector<float> params_;           // P (ZeRO 0-2) or the shard S (ZeRO 3)
  std::vector<float> grads_;            // P (ZeRO 0-1) or the shard S (ZeRO 2-3)
  std::vector<float> adam_m_, adam_v_;  // S (P under ZeRO 0)

  // ZeRO 3: the gathered embeddings and final norm (valid for a step) and two block slots.
  std::vector<float> embedding_params_, final_params_;
  bool resident_valid_ = false;
  TaskId resident_task_ = 0;
  struct BlockSlot {
    std::vector<float> data;
    int unit = -1;
    TaskId task = 0;
    bool pinned = false;
  };
  BlockSlot block_slots_[2];

  // ZeRO 2/3: staging for the embeddings' bucket (the whole backward) and two slots for the others.
  std::vector<float> embedding_staging_;
  struct StagingSlot {
    std::vector<float> data;
    int bucket = -1;
    TaskId task = 0;
  };
  StagingSlot staging_slots_[2];
  int next_staging_slot_ = 0;

  // Per step / micro-batch bookkeeping.
  int micro_batches_ = 1;
  int micro_index_ = -1;
  std::vector<int> bucket_units_;       // units in each bucket
  std::vector<int> bucket_done_;        // units done this micro-batch
  std::vector<bool> bucket_touched_;    // staging zeroed this micro-batch
  std::vector<float*> bucket_staging_;  // ZeRO 2/3: where each touched bucket is staged
  std::vector<TaskId> bucket_task_;     // the last reduction queued for each bucket
  double exposed_s_ = 0;

  // The communication thread.
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::pair<TaskId, std::function<Status()>>> queue_;
  TaskId next_id_ = 1;
  TaskId done_id_ = 0;  // every task <= done_id_ has finished
  Status failed_;       // the first failure; later tasks are skipped
  bool stopping_ = false;
  std::thread thread_;
};

}  // namespace gantry
