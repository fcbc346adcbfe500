#include <algorithm>
#include <cmath>

#include "engine/core/comm/communicator.h"
#include "engine/core/cuda/cuda_check.h"
#include "engine/core/cuda/replica_hash.cuh"
#include "engine/core/cuda/zero_device_state.cuh"
#include "engine/core/fatal.h"

namespace gantry {

ZeroDeviceState::ZeroDeviceState(const TensorTable& table, ShardPlan plan, Communicator* dp,
                                 std::chrono::milliseconds timeout, cudaStream_t compute, float* norm_scratch,
                                 const Allocate& allocate, Communicator* tp, std::vector<bool> tp_sharded,
                                 Communicator* pp, const std::vector<bool>& tp_partial)
    : plan_(std::move(plan)),
      comm_(dp),
      timeout_(timeout),
      compute_(compute),
      zero_(plan_.zero),
      norm_scratch_(norm_scratch),
      tp_(tp != nullptr && tp->size() > 1 ? tp : nullptr),
      tp_sharded_(std::move(tp_sharded)),
      pp_(pp != nullptr && pp->size() > 1 ? pp : nullptr) {
  GANTRY_CHECK(tp_ == nullptr || tp_sharded_.size() == table.size(),
               "tensor parallel needs one split flag per tensor of the table");
  GANTRY_CHECK(plan_.dp == 1 || (comm_ != nullptr && comm_->size() == plan_.dp),
               "data parallel over more than one rank needs a communicator of the plan's size");
  GANTRY_CHECK(plan_.dp > 1 || zero_ == 0, "a plan over one rank shards nothing: ZeRO 0");
  if (plan_.dp == 1) comm_ = nullptr;
  // The embeddings (wte, wpe) lead the table and the final norm ends it, both outside any block (layer
  // -1); a pipeline stage's table may lack either (pipeline_rank_table), and a table without blocks is
  // one unit (the embeddings).
  const int n_units = static_cast<int>(plan_.units.size());
  has_embeddings_ = table.size() > 0 && table[0].layer < 0;
  has_final_ = table.size() > 0 && table[table.size() - 1].layer < 0 && n_units > (has_embeddings_ ? 1 : 0);
  first_block_ = has_embeddings_ ? 1 : 0;
  last_block_ = n_units - 1 - (has_final_ ? 1 : 0);
  for (int u = first_block_; u <= last_block_; ++u)
    largest_block_ = std::max(largest_block_, plan_.units[u].count);
  embedding_bucket_ = has_embeddings_ ? plan_.unit_bucket[plan_.embedding_unit()] : -1;
  for (size_t b = 0; b < plan_.buckets.size(); ++b) {
    if (static_cast<int>(b) != embedding_bucket_)
      largest_other_bucket_ = std::max(largest_other_bucket_, plan_.buckets[b].count);
  }
  auto floats = [&](size_t n) {
    return static_cast<float*>(allocate(std::max<size_t>(n, 1) * sizeof(float)));
  };
  auto halves = [&](size_t n) { return static_cast<bf16*>(allocate(std::max<size_t>(n, 1) * sizeof(bf16))); };
  const size_t P = plan_.numel, S = plan_.shard_numel;
  const size_t held = zero_ == 0 ? P : S;
  master_ = floats(held);
  m_ = floats(held);
  v_ = floats(held);
  grads_ = floats(zero_ < 2 ? P : S);
  params_ = halves(zero_ < 3 ? P : S);
  CUDA_CHECK(cudaMemset(m_, 0, held * sizeof(float)));
  CUDA_CHECK(cudaMemset(v_, 0, held * sizeof(float)));
  CUDA_CHECK(cudaMemset(grads_, 0, (zero_ < 2 ? P : S) * sizeof(float)));
  stats_ = floats(3);
  norm_ = floats(1);
  hash_sum_ = static_cast<unsigned long long*>(allocate(sizeof(unsigned long long)));
  CUDA_CHECK(cudaMemset(stats_, 0, 3 * sizeof(float)));
  CUDA_CHECK(cudaMemset(norm_, 0, sizeof(float)));
  build_chunks(table, allocate);
  if (tp_ != nullptr && !tp_partial.empty()) {
    GANTRY_CHECK(tp_partial.size() == table.size(),
                 "sequence parallel needs one flag per tensor of the table");
    tp_partial_runs_ = plan_.gradient_runs(tp_partial);
    std::vector<CopyRun> pack, unpack;
    for (const FlatRange& r : tp_partial_runs_) {
      pack.push_back({.src = r.offset, .dst = tp_packed_count_, .count = r.count});
      unpack.push_back({.src = tp_packed_count_, .dst = r.offset, .count = r.count});
      tp_packed_count_ += r.count;
      tp_longest_run_ = std::max(tp_longest_run_, r.count);
    }
    GANTRY_CHECK(pack.size() <= 65535, "sequence parallel: too many runs of partial gradients");
    if (!pack.empty()) {
      tp_packed_ = floats(tp_packed_count_);
      for (auto [runs, host] : {std::pair{&tp_pack_, &pack}, std::pair{&tp_unpack_, &unpack}}) {
        *runs = static_cast<CopyRun*>(allocate(host->size() * sizeof(CopyRun)));
        CUDA_CHECK(cudaMemcpy(*runs, host->data(), host->size() * sizeof(CopyRun), cudaMemcpyHostToDevice));
      }
    }
  }

  const size_t n_buckets = plan_.buckets.size();
  bucket_units_.assign(n_buckets, 0);
  for (int b : plan_.unit_bucket) ++bucket_units_[b];
  bucket_done_.assign(n_buckets, 0);
  if (comm_ == nullptr) return;

  CUDA_CHECK(cudaStreamCreateWithFlags(&comm_stream_, cudaStreamNonBlocking));
  CUDA_CHECK(cudaEventCreateWithFlags(&compute_mark_, cudaEventDisableTiming));
  CUDA_CHECK(cudaEventCreateWithFlags(&comm_mark_, cudaEventDisableTiming));
  bucket_gathered_.resize(n_buckets);
  for (cudaEvent_t& e : bucket_gathered_) CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
  bucket_gather_pending_.assign(n_buckets, 0);
  auto make_grad_slot = [&](GradSlot& s, size_t n) {
    s.data = floats(n);
    CUDA_CHECK(cudaEventCreateWithFlags(&s.free, cudaEventDisableTiming));
  };
  auto make_param_slot = [&](ParamSlot& s, size_t n) {
    s.data = halves(n);
    CUDA_CHECK(cudaEventCreateWithFlags(&s.gathered, cudaEventDisableTiming));
    CUDA_CHECK(cudaEventCreateWithFlags(&s.free, cudaEventDisableTiming));
  };
  if (zero_ >= 2) {
    if (has_embeddings_) make_grad_slot(embedding_grads_, plan_.buckets[embedding_bucket_].count);
    for (GradSlot& s : grad_slots_) make_grad_slot(s, largest_other_bucket_);
  }
  if (zero_ == 3) {
    if (has_embeddings_) make_param_slot(embedding_params_, plan_.units[plan_.embedding_unit()].count);
    if (has_final_) make_param_slot(final_params_, plan_.units[plan_.final_unit()].count);
    for (ParamSlot& s : block_slots_) make_param_slot(s, largest_block_);
  }
}

ZeroDeviceState::~ZeroDeviceState() {
  if (comm_ == nullptr) return;
  // Bounded: collectives still queued behind a dead peer must not hang the teardown.
  (void)comm_->sync(comm_stream_, timeout_);
  for (cudaEvent_t e : bucket_gathered_) cudaEventDestroy(e);
  for (GradSlot* s : {&embedding_grads_, &grad_slots_[0], &grad_slots_[1]}) {
    if (s->free != nullptr) cudaEventDestroy(s->free);
  }
  for (ParamSlot* s : {&embedding_params_, &final_params_, &block_slots_[0], &block_slots_[1]}) {
    if (s->gathered != nullptr) cudaEventDestroy(s->gathered);
    if (s->free != nullptr) cudaEventDestroy(s->free);
  }
  cudaEventDestroy(compute_mark_);
  cudaEventDestroy(comm_mark_);
  cudaStreamDestroy(comm_stream_);
}

void ZeroDeviceState::build_chunks(const TensorTable& table, const Allocate& allocate) {
  // ZeRO 0 updates every tensor; ZeRO 1-3 the owned segments (already cut at tensor boundaries). Each
  // range is cut into chunks of at most adamw_chunk_elements(), each naming its place in every buffer.
  std::vector<ShardSegment> ranges;
  if (zero_ == 0) {
    for (size_t i = 0; i < table.size(); ++i) {
      const TensorInfo& t = table[i];
      ranges.push_back(
          {.offset = t.offset, .shard_offset = t.offset, .count = t.numel, .tensor = i, .decay = t.decay});
    }
  } else {
    ranges = plan_.segments;
  }
  // Tensor parallel: the split tensors' ranges first, so their chunks are one run for the norm's two sums
  // (the update does not care about the order).
  if (tp_ != nullptr) {
    std::stable_partition(ranges.begin(), ranges.end(),
                          [&](const ShardSegment& r) { return static_cast<bool>(tp_sharded_[r.tensor]); });
  }
  std::vector<AdamWChunk> chunks;
  for (const ShardSegment& r : ranges) {
    if (tp_ != nullptr && tp_sharded_[r.tensor]) {
      n_tp_sharded_chunks_ +=
          static_cast<int>((r.count + adamw_chunk_elements() - 1) / adamw_chunk_elements());
    }
    for (size_t off = 0; off < r.count; off += adamw_chunk_elements()) {
      const uint64_t global = r.offset + off, shard = r.shard_offset + off;
      chunks.push_back(
          {.grad_offset = zero_ >= 2 ? shard : global,
           .param_offset = zero_ == 3 ? shard : global,
           .state_offset = shard,
           .count = static_cast<uint32_t>(std::min<size_t>(adamw_chunk_elements(), r.count - off)),
           .decay = r.decay ? 1u : 0u});
    }
  }
  n_chunks_ = static_cast<int>(chunks.size());
  chunks_ = static_cast<AdamWChunk*>(allocate(std::max<size_t>(chunks.size(), 1) * sizeof(AdamWChunk)));
  CUDA_CHECK(cudaMemcpy(chunks_, chunks.data(), chunks.size() * sizeof(AdamWChunk), cudaMemcpyHostToDevice));
  if (zero_ > 0 || tp_ != nullptr || pp_ != nullptr) {
    chunk_scratch_ = static_cast<float*>(allocate(std::max<size_t>(chunks.size(), 1) * sizeof(float)));
  }
}

void ZeroDeviceState::check(const Status& st) const {
  if (!st.ok()) fatal_error(__FILE__, __LINE__, st.message());
}

void ZeroDeviceState::comm_follows_compute() {
  CUDA_CHECK(cudaEventRecord(compute_mark_, compute_));
  CUDA_CHECK(cudaStreamWaitEvent(comm_stream_, compute_mark_));
}

// ---------------------------------------------------------------------------------------------------------
// Steps and micro-batches.

void ZeroDeviceState::begin_step(int micro_batches) {
  micro_batches_ = std::max(1, micro_batches);
  micro_index_ = -1;
  tp_partial_summed_ = false;
  CUDA_CHECK(cudaMemsetAsync(stats_, 0, sizeof(float), compute_));
  // The full buffer (ZeRO 0/1) or the shard (ZeRO 2/3, whose reductions add into it); the previous step's
  // reductions are done (the compute stream waited for them before its update).
  CUDA_CHECK(
      cudaMemsetAsync(grads_, 0, (zero_ < 2 ? plan_.numel : plan_.shard_numel) * sizeof(float), compute_));
}

void ZeroDeviceState::begin_micro_batch() {
  ++micro_index_;
  // Data parallel, the step's last micro-batch reduces: a count that differs from the announced one would
  // reduce too early (and add unreduced gradients after) or never.
  GANTRY_CHECK(comm_ == nullptr || micro_index_ < micro_batches_,
               "a data parallel step ran more micro-batches than begin_step(" +
                   std::to_string(micro_batches_) + ") announced");
  std::fill(bucket_done_.begin(), bucket_done_.end(), 0);
}

// ---------------------------------------------------------------------------------------------------------
// Parameters.

void ZeroDeviceState::gather_all_buckets() {
  comm_follows_compute();
  for (size_t b = 0; b < plan_.buckets.size(); ++b) {
    const FlatRange& bucket = plan_.buckets[b];
    check(comm_->all_gather_enqueue(params_ + plan_.owned[b].offset, params_ + bucket.offset, bucket.count,
                                    sizeof(bf16), comm_stream_));
    CUDA_CHECK(cudaEventRecord(bucket_gathered_[b], comm_stream_));
    bucket_gather_pending_[b] = 1;
  }
  params_stale_ = false;
}

void ZeroDeviceState::gather_into(ParamSlot& slot, int unit) {
  const int b = plan_.unit_bucket[unit];  // under ZeRO 3 every unit is a bucket
  // The slot's last readers, and the update that wrote the shards, come first.
  if (slot.free_recorded) CUDA_CHECK(cudaStreamWaitEvent(comm_stream_, slot.free));
  comm_follows_compute();
  check(comm_->all_gather_enqueue(params_ + plan_.owned_shard_offset[b], slot.data, plan_.buckets[b].count,
                                  sizeof(bf16), comm_stream_));
  CUDA_CHECK(cudaEventRecord(slot.gathered, comm_stream_));
  slot.unit = unit;
  slot.must_wait = true;
}

ZeroDeviceState::ParamSlot& ZeroDeviceState::resident_slot(int unit) {
  return has_embeddings_ && unit == plan_.embedding_unit() ? embedding_params_ : final_params_;
}

const bf16* ZeroDeviceState::params(int unit) {
  if (zero_ < 3) {
    if (comm_ != nullptr) {
      if (params_stale_) gather_all_buckets();
      const int b = plan_.unit_bucket[unit];
      if (bucket_gather_pending_[b]) {
        CUDA_CHECK(cudaStreamWaitEvent(compute_, bucket_gathered_[b]));
        bucket_gather_pending_[b] = 0;
      }
    }
    return params_ + plan_.units[unit].offset;
  }
  ParamSlot* slot = nullptr;
  if (!is_block(unit)) {
    slot = &resident_slot(unit);
    if (slot->unit != unit) gather_into(*slot, unit);
  } else {
    prefetch(unit);
    for (ParamSlot& s : block_slots_) {
      if (s.unit == unit) slot = &s;
    }
  }
  if (slot->must_wait) {
    CUDA_CHECK(cudaStreamWaitEvent(compute_, slot->gathered));
    slot->must_wait = false;
  }
  slot->pinned = true;
  return slot->data;
}

void ZeroDeviceState::prefetch(int unit) {
  if (zero_ < 3 || unit < 0 || unit > plan_.final_unit()) return;
  if (!is_block(unit)) {
    ParamSlot& slot = resident_slot(unit);
    if (slot.unit != unit) gather_into(slot, unit);
    return;
  }
  for (const ParamSlot& s : block_slots_) {
    if (s.unit == unit) return;
  }
  // The slot not in use; of two free ones, the one holding the unit farther from this one (a block the
  // backward pass may find still there is worth keeping).
  ParamSlot* victim = nullptr;
  for (ParamSlot& s : block_slots_) {
    if (s.pinned) continue;
    if (victim == nullptr || std::abs(s.unit - unit) > std::abs(victim->unit - unit)) victim = &s;
  }
  GANTRY_CHECK(victim != nullptr, "ZeRO-3: both parameter slots are in use (prefetch before release)");
  gather_into(*victim, unit);
}

void ZeroDeviceState::release(int unit) {
  if (zero_ < 3 || !is_block(unit)) return;
  for (ParamSlot& s : block_slots_) {
    if (s.unit != unit || !s.pinned) continue;
    CUDA_CHECK(cudaEventRecord(s.free, compute_));
    s.free_recorded = true;
    s.pinned = false;
  }
}

// ---------------------------------------------------------------------------------------------------------
// Gradients.

ZeroDeviceState::GradSlot& ZeroDeviceState::open_grad_slot(int bucket) {
  GradSlot* slot = nullptr;
  if (bucket == embedding_bucket_) {
    slot = &embedding_grads_;
  } else {
    for (GradSlot& s : grad_slots_) {
      if (s.open && s.bucket == bucket) return s;
    }
    for (GradSlot& s : grad_slots_) {
      if (!s.open) slot = &s;
    }
    GANTRY_CHECK(slot != nullptr, "ZeRO 2/3: more than two gradient buckets open at once");
  }
  if (slot->open) return *slot;
  // The slot's previous reduction must have read it before it is zeroed and filled again.
  if (slot->free_recorded) CUDA_CHECK(cudaStreamWaitEvent(compute_, slot->free));
  CUDA_CHECK(cudaMemsetAsync(slot->data, 0, plan_.buckets[bucket].count * sizeof(float), compute_));
  slot->bucket = bucket;
  slot->open = true;
  return *slot;
}

float* ZeroDeviceState::grads(int unit) {
  if (zero_ < 2) return grads_ + plan_.units[unit].offset;
  const int b = plan_.unit_bucket[unit];
  return open_grad_slot(b).data + (plan_.units[unit].offset - plan_.buckets[b].offset);
}

void ZeroDeviceState::grads_done(int unit) {
  if (comm_ == nullptr) return;
  const int b = plan_.unit_bucket[unit];
  if (++bucket_done_[b] < bucket_units_[b]) return;
  const FlatRange& bucket = plan_.buckets[b];
  const FlatRange& own = plan_.owned[b];
  if (zero_ < 2) {
    // Reduced once per step, on the last micro-batch, in the full buffer.
    if (micro_index_ != micro_batches_ - 1) return;
    comm_follows_compute();
    if (zero_ == 0) {
      check(comm_->all_reduce_enqueue(grads_ + bucket.offset, bucket.count, comm_stream_));
    } else {
      check(comm_->reduce_scatter_enqueue(grads_ + bucket.offset, grads_ + own.offset, bucket.count,
                                          comm_stream_));
    }
    return;
  }
  // ZeRO 2/3: every micro-batch's bucket is reduce-scattered in its slot and added into the shard.
  GradSlot& slot = open_grad_slot(b);
  comm_follows_compute();
  float* mine = slot.data + (own.offset - bucket.offset);
  check(comm_->reduce_scatter_enqueue(slot.data, mine, bucket.count, comm_stream_));
  add_in_place_cuda(grads_ + plan_.owned_shard_offset[b], mine, own.count, comm_stream_);
  CUDA_CHECK(cudaEventRecord(slot.free, comm_stream_));
  slot.free_recorded = true;
  slot.open = false;
}

// ---------------------------------------------------------------------------------------------------------
// The update.

void ZeroDeviceState::finish_reductions() {
  if (comm_ == nullptr) {
    sum_partial_over_tp();
    return;
  }
  GANTRY_CHECK(micro_index_ == micro_batches_ - 1,
               "a data parallel step ran " + std::to_string(micro_index_ + 1) + " micro-batches of the " +
                   std::to_string(micro_batches_) +
                   " begin_step announced: its gradients were not all reduced");
  if (zero_ == 0) {
    // The loss sum joins the queue behind the buckets (ZeRO 1-3 reduce it with the norm, in update()).
    comm_follows_compute();
    check(comm_->all_reduce_enqueue(stats_, 1, comm_stream_));
  }
  CUDA_CHECK(cudaEventRecord(comm_mark_, comm_stream_));
  CUDA_CHECK(cudaStreamWaitEvent(compute_, comm_mark_));
  sum_partial_over_tp();
}

void ZeroDeviceState::sum_partial_over_tp() {
  if (tp_partial_summed_) return;
  tp_partial_summed_ = true;
  if (tp_packed_count_ == 0) return;
  // Two runs a block (the attention projection's bias with LayerNorm 2; the MLP projection's bias with the
  // next block's LayerNorm 1), 3C floats each: packed, one all-reduce on the compute stream (which needs
  // them next) and unpacked, where one all-reduce a run cost each its latency.
  copy_runs_cuda(tp_packed_, grads_, tp_pack_, static_cast<int>(tp_partial_runs_.size()), tp_longest_run_,
                 compute_);
  check(tp_->all_reduce_enqueue(tp_packed_, tp_packed_count_, compute_));
  copy_runs_cuda(grads_, tp_packed_, tp_unpack_, static_cast<int>(tp_partial_runs_.size()), tp_longest_run_,
                 compute_);
}

void ZeroDeviceState::tp_sum_squares(bool with_loss) {
  // A rank's ZeRO 1-3 segments may hold no split tensor, or no whole one: an empty sum is 0.
  auto sum = [&](float* out, int first, int count) {
    if (count > 0) {
      chunk_sum_squares_cuda(out, chunk_scratch_ + first, grads_, chunks_ + first, count, compute_);
    } else {
      CUDA_CHECK(cudaMemsetAsync(out, 0, sizeof(float), compute_));
    }
  };
  sum(stats_ + 1, 0, n_tp_sharded_chunks_);
  sum(stats_ + 2, n_tp_sharded_chunks_, n_chunks_ - n_tp_sharded_chunks_);
  if (comm_ != nullptr && zero_ > 0) {
    // ZeRO 1-3: each dp rank's squares are its shard's (ZeRO 0's are the whole reduced buffer's already).
    comm_follows_compute();
    float* first = with_loss ? stats_ : stats_ + 1;
    check(comm_->all_reduce_enqueue(first, with_loss ? 3 : 2, comm_stream_));
    CUDA_CHECK(cudaEventRecord(comm_mark_, comm_stream_));
    CUDA_CHECK(cudaStreamWaitEvent(compute_, comm_mark_));
  }
  // The split tensors' squares over the tp group (a float on the compute stream, which waits for it anyway),
  // then the whole tensors' once; then every pipeline stage's total over pp (each stage's tensors are its
  // own). At tp 1 no chunk counts as split: the first sum is 0 and the second is the stage's all.
  if (tp_ != nullptr) check(tp_->all_reduce_enqueue(stats_ + 1, 1, compute_));
  add_in_place_cuda(stats_ + 1, stats_ + 2, 1, compute_);
  if (pp_ != nullptr) check(pp_->all_reduce_enqueue(stats_ + 1, 1, compute_));
}

void ZeroDeviceState::update(const AdamWStep& s) {
  if (tp_ != nullptr || pp_ != nullptr) {
    tp_sum_squares(/*with_loss=*/true);
    CUDA_CHECK(cudaMemcpyAsync(norm_, stats_ + 1, sizeof(float), cudaMemcpyDeviceToDevice, compute_));
    sqrt_in_place_cuda(norm_, compute_);
  } else if (zero_ == 0) {
    global_norm_cuda(norm_, norm_scratch_, grads_, plan_.numel, compute_);
  } else {
    // Each rank's share of Σg², summed with the loss in one all-reduce of two floats.
    chunk_sum_squares_cuda(stats_ + 1, chunk_scratch_, grads_, chunks_, n_chunks_, compute_);
    comm_follows_compute();
    check(comm_->all_reduce_enqueue(stats_, 2, comm_stream_));
    CUDA_CHECK(cudaEventRecord(comm_mark_, comm_stream_));
    CUDA_CHECK(cudaStreamWaitEvent(compute_, comm_mark_));
    CUDA_CHECK(cudaMemcpyAsync(norm_, stats_ + 1, sizeof(float), cudaMemcpyDeviceToDevice, compute_));
    sqrt_in_place_cuda(norm_, compute_);
  }
  const float c1 = static_cast<float>(1.0 - std::pow(s.beta1, static_cast<double>(s.step)));
  const float c2 = static_cast<float>(1.0 - std::pow(s.beta2, static_cast<double>(s.step)));
  adamw_cuda(master_, params_, m_, v_, grads_, norm_, chunks_, n_chunks_, static_cast<float>(s.lr),
             static_cast<float>(s.beta1), static_cast<float>(s.beta2), static_cast<float>(s.eps),
             static_cast<float>(s.weight_decay), static_cast<float>(s.grad_clip), c1, c2, compute_);
  // ZeRO 1/2: the bf16 copy is gathered when the next forward first asks for parameters, not now: the train
  // loop's between-step agreement (all_reduce_host) would queue behind the gathers and hold the host until
  // they finish, where the next forward can overlap them bucket by bucket.
  if (zero_ == 1 || zero_ == 2) params_stale_ = true;
  if (zero_ == 3) {
    // Every gathered copy is stale now; the next forward gathers again.
    for (ParamSlot* slot : {&embedding_params_, &final_params_, &block_slots_[0], &block_slots_[1]})
      slot->unit = -1;
  }
}

float ZeroDeviceState::grad_norm() {
  // After every queued reduction. The result goes through stats_[1] (rewritten by each update), so norm_
  // keeps the step's norm for step_stats.
  if (comm_ != nullptr) {
    CUDA_CHECK(cudaEventRecord(comm_mark_, comm_stream_));
    CUDA_CHECK(cudaStreamWaitEvent(compute_, comm_mark_));
  }
  sum_partial_over_tp();
  float n = 0;
  if (tp_ != nullptr || pp_ != nullptr) {
    tp_sum_squares(/*with_loss=*/false);
    CUDA_CHECK(cudaMemcpyAsync(&n, stats_ + 1, sizeof(float), cudaMemcpyDeviceToHost, compute_));
    // A dead tp or pp peer fails at the timeout, not in a stream wait.
    if (tp_ != nullptr) check(tp_->sync(compute_, timeout_));
    if (pp_ != nullptr) check(pp_->sync(compute_, timeout_));
    return std::sqrt(n);
  }
  if (zero_ == 0) {
    global_norm_cuda(stats_ + 1, norm_scratch_, grads_, plan_.numel, compute_);
    CUDA_CHECK(cudaMemcpyAsync(&n, stats_ + 1, sizeof(float), cudaMemcpyDeviceToHost, compute_));
    CUDA_CHECK(cudaStreamSynchronize(compute_));
    return n;
  }
  chunk_sum_squares_cuda(stats_ + 1, chunk_scratch_, grads_, chunks_, n_chunks_, compute_);
  comm_follows_compute();
  check(comm_->all_reduce_enqueue(stats_ + 1, 1, comm_stream_));
  check(comm_->sync(comm_stream_, timeout_));
  CUDA_CHECK(cudaMemcpy(&n, stats_ + 1, sizeof(float), cudaMemcpyDeviceToHost));
  return std::sqrt(n);
}

// ---------------------------------------------------------------------------------------------------------
// State in global coordinates.

bool ZeroDeviceState::sharded(StateBuffer which) const {
  switch (which) {
    case StateBuffer::kParams:
    case StateBuffer::kAdamM:
    case StateBuffer::kAdamV:
      return zero_ >= 1;
    case StateBuffer::kGrads:
      return zero_ >= 2;
  }
  return false;
}

float* ZeroDeviceState::buffer(StateBuffer which) {
  switch (which) {
    case StateBuffer::kParams:
      return master_;
    case StateBuffer::kGrads:
      return grads_;
    case StateBuffer::kAdamM:
      return m_;
    case StateBuffer::kAdamV:
      return v_;
  }
  return master_;
}

std::vector<FlatRange> ZeroDeviceState::held(StateBuffer which) const {
  if (!sharded(which)) return {{0, plan_.numel}};
  return plan_.owned_ranges();
}

std::vector<FlatRange> ZeroDeviceState::written(StateBuffer which) const {
  if (which == StateBuffer::kGrads) return {};
  if (zero_ == 0) return plan_.replica_written_ranges();
  return plan_.owned_ranges();
}

void ZeroDeviceState::read(StateBuffer which, size_t offset, size_t count, float* out) {
  if (comm_ != nullptr) check(comm_->sync(comm_stream_, timeout_));
  float* base = buffer(which);
  if (!sharded(which)) {
    GANTRY_CHECK(offset + count <= plan_.numel, "read past the end of the buffer");
    CUDA_CHECK(cudaMemcpyAsync(out, base + offset, count * sizeof(float), cudaMemcpyDeviceToHost, compute_));
  } else {
    const size_t copied = plan_.for_each_owned(offset, count, [&](size_t at, size_t shard_at, size_t n) {
      CUDA_CHECK(cudaMemcpyAsync(out + (at - offset), base + shard_at, n * sizeof(float),
                                 cudaMemcpyDeviceToHost, compute_));
    });
    GANTRY_CHECK(copied == count,
                 std::string("read of ") + state_buffer_name(which) + " outside this rank's shard");
  }
  CUDA_CHECK(cudaStreamSynchronize(compute_));
}

void ZeroDeviceState::device_ranges(StateBuffer which, size_t offset, size_t count,
                                    const std::function<void(size_t, const float*, size_t)>& fn) {
  const float* base = buffer(which);
  if (!sharded(which)) {
    GANTRY_CHECK(offset + count <= plan_.numel, "snapshot past the end of the buffer");
    fn(offset, base + offset, count);
    return;
  }
  const size_t covered = plan_.for_each_owned(
      offset, count, [&](size_t at, size_t shard_at, size_t n) { fn(at, base + shard_at, n); });
  GANTRY_CHECK(covered == count,
               std::string("snapshot of ") + state_buffer_name(which) + " outside this rank's shard");
}

void ZeroDeviceState::write(StateBuffer which, size_t offset, size_t count, const float* in) {
  if (comm_ != nullptr) check(comm_->sync(comm_stream_, timeout_));
  float* base = buffer(which);
  auto copy = [&](size_t at, size_t held_at, size_t n) {
    CUDA_CHECK(cudaMemcpyAsync(base + held_at, in + (at - offset), n * sizeof(float), cudaMemcpyHostToDevice,
                               compute_));
    if (which != StateBuffer::kParams) return;
    // The bf16 copy of what was written: at its global place (ZeRO 0-2) or in the shard (ZeRO 3).
    float_to_bf16_cuda(params_ + (zero_ == 3 ? held_at : at), base + held_at, n, compute_);
  };
  if (!sharded(which)) {
    GANTRY_CHECK(offset + count <= plan_.numel, "write past the end of the buffer");
    copy(offset, offset, count);
  } else {
    const size_t copied = plan_.for_each_owned(offset, count, copy);
    GANTRY_CHECK(copied == count,
                 std::string("write of ") + state_buffer_name(which) + " outside this rank's shard");
  }
  CUDA_CHECK(cudaStreamSynchronize(compute_));  // `in` may be freed when this returns
  if (which == StateBuffer::kParams && comm_ != nullptr) {
    // The other ranks' parts of the bf16 copy are stale: gathered before the next use. Every rank writes its
    // parameters at the same points (initialisation, a checkpoint load), so the gathers stay in step.
    if (zero_ == 1 || zero_ == 2) params_stale_ = true;
    if (zero_ == 3) {
      for (ParamSlot* slot : {&embedding_params_, &final_params_, &block_slots_[0], &block_slots_[1]})
        slot->unit = -1;
    }
  }
}

void ZeroDeviceState::gather_params(float* out) {
  if (zero_ == 0) {
    read(StateBuffer::kParams, 0, plan_.numel, out);
    return;
  }
  // Bucket by bucket through a transient buffer of the largest bucket (called once, at the end of
  // training), so the gather never needs room for the whole model.
  size_t largest = 0;
  for (const FlatRange& b : plan_.buckets) largest = std::max(largest, b.count);
  float* bucket = nullptr;
  CUDA_CHECK(cudaMalloc(&bucket, largest * sizeof(float)));
  comm_follows_compute();
  Status st;
  for (size_t b = 0; b < plan_.buckets.size() && st.ok(); ++b) {
    st = comm_->all_gather_enqueue(master_ + plan_.owned_shard_offset[b], bucket, plan_.buckets[b].count,
                                   sizeof(float), comm_stream_);
    if (st.ok()) st = comm_->sync(comm_stream_, timeout_);
    if (st.ok()) {
      CUDA_CHECK(cudaMemcpy(out + plan_.buckets[b].offset, bucket, plan_.buckets[b].count * sizeof(float),
                            cudaMemcpyDeviceToHost));
    }
  }
  cudaFree(bucket);
  check(st);
}

const char* ZeroDeviceState::replicated_state() const {
  return zero_ == 0 ? "fp32 parameters" : zero_ < 3 ? "bf16 parameter copy" : "";
}

size_t ZeroDeviceState::replicated_bytes() const {
  return zero_ == 0 ? plan_.numel * sizeof(float) : zero_ < 3 ? plan_.numel * sizeof(bf16) : 0;
}

uint64_t ZeroDeviceState::replicated_hash() {
  if (zero_ == 3) return 0;
  if (zero_ == 0) return replica_hash_cuda(master_, replicated_bytes(), hash_sum_, compute_);
  if (comm_ != nullptr) {
    if (params_stale_) gather_all_buckets();
    // A gather that never finishes (a dead peer) must fail at the timeout, not hang in the hash's wait.
    check(comm_->sync(comm_stream_, timeout_));
    for (size_t b = 0; b < plan_.buckets.size(); ++b) {
      if (!bucket_gather_pending_[b]) continue;
      CUDA_CHECK(cudaStreamWaitEvent(compute_, bucket_gathered_[b]));
      bucket_gather_pending_[b] = 0;
    }
  }
  if (pending_flip_bit_ >= 0) {
    apply_flip(static_cast<uint64_t>(pending_flip_bit_));
    pending_flip_bit_ = -1;
  }
  return replica_hash_cuda(params_, replicated_bytes(), hash_sum_, compute_);
}

bool ZeroDeviceState::flip_replicated_bit(uint64_t bit) {
  if (zero_ == 3 || bit >= replicated_bytes() * 8) return false;
  if (zero_ != 0 && params_stale_) {
    // The bf16 copy is gathered (a collective) only when every rank asks: the flip waits for that gather,
    // which the next replicated_hash() makes, so it lands in the bytes the check reads.
    pending_flip_bit_ = static_cast<int64_t>(bit);
    return true;
  }
  apply_flip(bit);
  return true;
}

void ZeroDeviceState::apply_flip(uint64_t bit) {
  unsigned char* base =
      zero_ == 0 ? reinterpret_cast<unsigned char*>(master_) : reinterpret_cast<unsigned char*>(params_);
  unsigned char byte = 0;
  CUDA_CHECK(cudaMemcpyAsync(&byte, base + bit / 8, 1, cudaMemcpyDeviceToHost, compute_));
  CUDA_CHECK(cudaStreamSynchronize(compute_));
  byte ^= static_cast<unsigned char>(1u << (bit % 8));
  CUDA_CHECK(cudaMemcpyAsync(base + bit / 8, &byte, 1, cudaMemcpyHostToDevice, compute_));
  CUDA_CHECK(cudaStreamSynchronize(compute_));  // `byte` lives on this stack
}

StateBytes ZeroDeviceState::bytes() const {
  const uint64_t P = plan_.numel, S = plan_.shard_numel;
  // A pipeline stage without the embeddings or the final norm keeps no slot for them (E or F is 0 there).
  const uint64_t E = has_embeddings_ ? plan_.units[plan_.embedding_unit()].count : 0;
  const uint64_t F = has_final_ ? plan_.units[plan_.final_unit()].count : 0;
  const uint64_t U = largest_block_, B = largest_other_bucket_;
  const uint64_t held = zero_ == 0 ? P : S;
  StateBytes b;
  b.params = held * sizeof(float) + (zero_ < 3 ? P : S + E + F + 2 * U) * sizeof(bf16);
  b.grads = (zero_ < 2 ? P : S + E + 2 * B) * sizeof(float);
  b.optimizer = 2 * held * sizeof(float);
  return b;
}

}  // namespace gantry
