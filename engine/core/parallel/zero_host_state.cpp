#include "engine/core/parallel/zero_host_state.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "engine/core/comm/communicator.h"
#include "engine/core/fatal.h"

namespace gantry {

namespace {

using Clock = std::chrono::steady_clock;

// Fixed-size chunks summed in index order: the result does not depend on the thread count.
double sum_squares(const float* x, size_t n, ThreadPool* pool) {
  constexpr size_t kChunk = 1 << 14;
  const size_t chunks = (n + kChunk - 1) / kChunk;
  std::vector<double> partial(chunks, 0.0);
  pool->parallel_for(chunks, [&](size_t begin, size_t end) {
    for (size_t c = begin; c < end; ++c) {
      const size_t lo = c * kChunk, hi = std::min(n, lo + kChunk);
      double s = 0;
      for (size_t i = lo; i < hi; ++i) s += static_cast<double>(x[i]) * x[i];
      partial[c] = s;
    }
  });
  double total = 0;
  for (double p : partial) total += p;
  return total;
}

// Sums k doubles over the communicator's ranks: they travel as (hi, lo) float pairs and are added in rank
// order as doubles on every rank, so every rank gets the same bits and no precision is lost to float sums.
Status sum_doubles(Communicator* comm, double* vals, int k, std::chrono::milliseconds timeout) {
  const int n = comm->size();
  std::vector<float> mine(static_cast<size_t>(2 * k)), all(static_cast<size_t>(2 * k) * n);
  for (int i = 0; i < k; ++i) {
    mine[2 * i] = static_cast<float>(vals[i]);
    mine[2 * i + 1] = static_cast<float>(vals[i] - static_cast<double>(mine[2 * i]));
  }
  // all_gather's `in` is this rank's comm_block of the whole: 2k floats per rank.
  Status st = comm->all_gather(mine.data(), all.data(), all.size(), timeout);
  if (!st.ok()) return st;
  for (int i = 0; i < k; ++i) vals[i] = 0;
  for (int r = 0; r < n; ++r) {
    for (int i = 0; i < k; ++i) {
      const float* v = all.data() + static_cast<size_t>(2 * k) * r + 2 * i;
      vals[i] += static_cast<double>(v[0]) + static_cast<double>(v[1]);
    }
  }
  return {};
}

}  // namespace

// The table is not kept: the plan already holds every offset and size the state needs.
ZeroHostState::ZeroHostState(const TensorTable& /*table*/, ShardPlan plan, Communicator* dp,
                             std::chrono::milliseconds timeout, ThreadPool* pool)
    : plan_(std::move(plan)), comm_(dp), timeout_(timeout), pool_(pool) {
  GANTRY_CHECK(plan_.dp == 1 || comm_ != nullptr,
               "data parallel over more than one rank needs a communicator");
  GANTRY_CHECK(comm_ == nullptr || comm_->size() == plan_.dp,
               "the communicator's size differs from the plan's dp");
  const size_t P = plan_.numel, S = plan_.shard_numel;
  params_.assign(plan_.zero < 3 ? P : S, 0.0f);
  grads_.assign(plan_.zero < 2 ? P : S, 0.0f);
  adam_m_.assign(S, 0.0f);
  adam_v_.assign(S, 0.0f);
  if (plan_.zero == 3) {
    embedding_params_.assign(plan_.units[plan_.embedding_unit()].count, 0.0f);
    final_params_.assign(plan_.units[plan_.final_unit()].count, 0.0f);
    for (BlockSlot& s : block_slots_) s.data.assign(plan_.largest_block_unit(), 0.0f);
  }
  if (plan_.zero >= 2) {
    embedding_staging_.assign(plan_.buckets[plan_.unit_bucket[plan_.embedding_unit()]].count, 0.0f);
    for (StagingSlot& s : staging_slots_) s.data.assign(plan_.largest_nonembedding_bucket(), 0.0f);
  }
  bucket_units_.assign(plan_.buckets.size(), 0);
  for (int b : plan_.unit_bucket) ++bucket_units_[b];
  bucket_done_.assign(plan_.buckets.size(), 0);
  bucket_touched_.assign(plan_.buckets.size(), false);
  bucket_staging_.assign(plan_.buckets.size(), nullptr);
  bucket_task_.assign(plan_.buckets.size(), 0);
  thread_ = std::thread([this] { comm_main(); });
}

ZeroHostState::~ZeroHostState() {
  bool busy;
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
    busy = done_id_ + 1 < next_id_;
  }
  // A collective still in flight here means the step failed elsewhere: abort it rather than wait out its
  // timeout (the peers then fail promptly too, as a gang should).
  if (busy && comm_ != nullptr) comm_->abort();
  cv_.notify_all();
  thread_.join();
}

// ---- the communication thread ----

ZeroHostState::TaskId ZeroHostState::enqueue(std::function<Status()> task) {
  std::lock_guard<std::mutex> lock(mu_);
  const TaskId id = next_id_++;
  queue_.emplace_back(id, std::move(task));
  cv_.notify_all();
  return id;
}

void ZeroHostState::comm_main() {
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    cv_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
    if (queue_.empty()) return;  // stopping with nothing left
    auto [id, task] = std::move(queue_.front());
    queue_.pop_front();
    const bool skip = !failed_.ok() || stopping_;
    lock.unlock();
    Status st;
    if (!skip) {
      try {
        st = task();
      } catch (const std::exception& e) {
        st = Status::error(e.what());
      }
    }
    lock.lock();
    if (!st.ok() && failed_.ok()) failed_ = st;
    done_id_ = id;
    cv_.notify_all();
  }
}

void ZeroHostState::wait(TaskId id) {
  const auto t0 = Clock::now();
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait(lock, [&] { return done_id_ >= id; });
  exposed_s_ += std::chrono::duration<double>(Clock::now() - t0).count();
  if (!failed_.ok()) fatal_error(__FILE__, __LINE__, failed_.message());
}

void ZeroHostState::wait_all() {
  TaskId last;
  {
    std::lock_guard<std::mutex> lock(mu_);
    last = next_id_ - 1;
  }
  wait(last);
}

// ---- collectives (or their local equivalents at dp 1) ----

Status ZeroHostState::reduce_bucket_full(int b) {
  if (comm_ == nullptr) return {};
  const FlatRange& bk = plan_.buckets[b];
  float* g = grads_.data() + bk.offset;
  if (plan_.zero == 0) return comm_->all_reduce(g, bk.count, timeout_);
  return comm_->reduce_scatter(g, grads_.data() + plan_.owned[b].offset, bk.count, timeout_);
}

Status ZeroHostState::reduce_bucket_staged(int b, float* staging) {
  const FlatRange& bk = plan_.buckets[b];
  const FlatRange& own = plan_.owned[b];
  float* mine = staging + (own.offset - bk.offset);
  if (comm_ != nullptr) {
    Status st = comm_->reduce_scatter(staging, mine, bk.count, timeout_);
    if (!st.ok()) return st;
  }
  float* shard = grads_.data() + plan_.owned_shard_offset[b];
  for (size_t i = 0; i < own.count; ++i) shard[i] += mine[i];
  return {};
}

Status ZeroHostState::gather_bucket(int b, const float* mine, float* out) {
  const FlatRange& bk = plan_.buckets[b];
  if (comm_ != nullptr) return comm_->all_gather(mine, out, bk.count, timeout_);
  if (mine != out) std::memcpy(out, mine, bk.count * sizeof(float));
  return {};
}

// ---- the step ----

void ZeroHostState::begin_step(int micro_batches) {
  wait_all();
  micro_batches_ = std::max(1, micro_batches);
  micro_index_ = -1;
  exposed_s_ = 0;
  std::memset(grads_.data(), 0, grads_.size() * sizeof(float));
}

void ZeroHostState::begin_micro_batch() {
  ++micro_index_;
  std::fill(bucket_done_.begin(), bucket_done_.end(), 0);
  std::fill(bucket_touched_.begin(), bucket_touched_.end(), false);
}

const float* ZeroHostState::params(int unit) {
  if (plan_.zero < 3) return params_.data() + plan_.units[unit].offset;
  if (!plan_.is_block(unit)) {
    prefetch(unit);
    wait(resident_task_);
    return unit == plan_.embedding_unit() ? embedding_params_.data() : final_params_.data();
  }
  BlockSlot* slot = nullptr;
  for (BlockSlot& s : block_slots_) {
    if (s.unit == unit) slot = &s;
  }
  if (slot == nullptr) {
    prefetch(unit);
    for (BlockSlot& s : block_slots_) {
      if (s.unit == unit) slot = &s;
    }
  }
  GANTRY_CHECK(slot != nullptr, "no free slot to gather block unit " + std::to_string(unit) + " into");
  wait(slot->task);
  slot->pinned = true;
  return slot->data.data();
}

void ZeroHostState::prefetch(int unit) {
  if (plan_.zero < 3 || unit < 0 || unit >= static_cast<int>(plan_.units.size())) return;
  auto gather_unit = [this](int u, float* out) {
    const int b = plan_.unit_bucket[u];
    const float* mine = params_.data() + plan_.owned_shard_offset[b];
    return enqueue([this, b, mine, out] { return gather_bucket(b, mine, out); });
  };
  if (!plan_.is_block(unit)) {
    if (resident_valid_) return;
    gather_unit(plan_.embedding_unit(), embedding_params_.data());
    resident_task_ = gather_unit(plan_.final_unit(), final_params_.data());
    resident_valid_ = true;
    return;
  }
  for (const BlockSlot& s : block_slots_) {
    if (s.unit == unit) return;
  }
  BlockSlot* victim = nullptr;
  for (BlockSlot& s : block_slots_) {
    if (!s.pinned && (victim == nullptr || s.unit == -1)) victim = &s;
  }
  if (victim == nullptr) return;  // both in use: the gather happens when the unit is asked for
  victim->unit = unit;
  victim->task = gather_unit(unit, victim->data.data());
}

void ZeroHostState::release(int unit) {
  for (BlockSlot& s : block_slots_) {
    if (s.unit == unit) s.pinned = false;
  }
}

float* ZeroHostState::grads(int unit) {
  const FlatRange& u = plan_.units[unit];
  if (plan_.zero < 2) return grads_.data() + u.offset;
  const int b = plan_.unit_bucket[unit];
  if (!bucket_touched_[b]) {
    float* staging;
    if (unit == plan_.embedding_unit()) {
      wait(bucket_task_[b]);  // last micro-batch's reduction of this bucket
      staging = embedding_staging_.data();
    } else {
      StagingSlot& slot = staging_slots_[next_staging_slot_];
      next_staging_slot_ = 1 - next_staging_slot_;
      wait(slot.task);
      slot.bucket = b;
      staging = slot.data.data();
    }
    std::memset(staging, 0, plan_.buckets[b].count * sizeof(float));
    bucket_staging_[b] = staging;
    bucket_touched_[b] = true;
  }
  return bucket_staging_[b] + (u.offset - plan_.buckets[b].offset);
}

void ZeroHostState::grads_done(int unit) {
  const int b = plan_.unit_bucket[unit];
  if (++bucket_done_[b] < bucket_units_[b]) return;
  TaskId id;
  if (plan_.zero < 2) {
    if (micro_index_ + 1 < micro_batches_) return;  // accumulate locally; reduce on the last micro-batch
    id = enqueue([this, b] { return reduce_bucket_full(b); });
  } else {
    float* staging = bucket_staging_[b];
    id = enqueue([this, b, staging] { return reduce_bucket_staged(b, staging); });
    for (StagingSlot& s : staging_slots_) {
      if (s.bucket == b && s.data.data() == staging) s.task = id;
    }
  }
  bucket_task_[b] = id;
}

void ZeroHostState::set_tensor_parallel(Communicator* tp, const TensorTable& table,
                                        std::vector<bool> sharded) {
  GANTRY_CHECK(sharded.size() == table.size(), "one sharded flag per tensor");
  tp_ = tp;
  tp_tensors_.clear();
  for (const TensorInfo& t : table.tensors()) tp_tensors_.push_back({t.offset, t.numel});
  tp_sharded_ = std::move(sharded);
}

// Tensor parallel: the tensors split over the tp group hold different gradients on each tp rank (their
// squares are summed over the group); the whole ones hold the same bits on every tp rank (counted once).
ZeroHostState::Reduced ZeroHostState::reduce_stats_tp(double local_loss) {
  double sq[2] = {0, 0};  // [0] split over tp, [1] whole on every tp rank
  if (plan_.zero == 0) {
    for (size_t t = 0; t < tp_tensors_.size(); ++t) {
      sq[tp_sharded_[t] ? 0 : 1] +=
          sum_squares(grads_.data() + tp_tensors_[t].offset, tp_tensors_[t].count, pool_);
    }
  } else {
    // ZeRO 1 keeps the whole gradient buffer (global coordinates); ZeRO 2-3 only the packed shard.
    for (const ShardSegment& s : plan_.segments) {
      const size_t at = plan_.zero == 1 ? s.offset : s.shard_offset;
      sq[tp_sharded_[s.tensor] ? 0 : 1] += sum_squares(grads_.data() + at, s.count, pool_);
    }
  }
  const auto t0 = Clock::now();
  double vals[3] = {local_loss, sq[0], sq[1]};
  if (comm_ != nullptr) {
    // The loss is averaged over dp; ZeRO 0's squares are already the whole buffer's, ZeRO 1-3's a shard's.
    const double own[3] = {vals[0], vals[1], vals[2]};
    if (Status st = sum_doubles(comm_, vals, 3, timeout_); !st.ok())
      fatal_error(__FILE__, __LINE__, st.message());
    vals[0] /= comm_->size();
    if (plan_.zero == 0) vals[1] = own[1], vals[2] = own[2];
  }
  // Every tp rank computed the same loss; only the split tensors' squares differ.
  double split = vals[1];
  if (Status st = sum_doubles(tp_, &split, 1, timeout_); !st.ok())
    fatal_error(__FILE__, __LINE__, st.message());
  exposed_s_ += std::chrono::duration<double>(Clock::now() - t0).count();
  return {.loss = vals[0], .grad_norm = std::sqrt(split + vals[2])};
}

ZeroHostState::Reduced ZeroHostState::reduce_stats(double local_loss) {
  wait_all();
  if (tp_ != nullptr) return reduce_stats_tp(local_loss);
  double sq = 0;
  if (plan_.zero == 0 || plan_.zero >= 2) {
    sq = sum_squares(grads_.data(), grads_.size(),
                     pool_);  // ZeRO 0: full (identical everywhere); 2/3: the shard
  } else {
    for (const ShardSegment& s : plan_.segments) sq += sum_squares(grads_.data() + s.offset, s.count, pool_);
  }
  Reduced r{.loss = local_loss, .grad_norm = std::sqrt(sq)};
  if (comm_ == nullptr) return r;

  // Doubles travel as (hi, lo) float pairs and are summed in rank order as doubles on every rank, so
  // every rank gets the same bits and no precision is lost to float sums.
  const int n = comm_->size();
  float mine[4];
  const double vals[2] = {local_loss, sq};
  for (int i = 0; i < 2; ++i) {
    mine[2 * i] = static_cast<float>(vals[i]);
    mine[2 * i + 1] = static_cast<float>(vals[i] - static_cast<double>(mine[2 * i]));
  }
  std::vector<float> all(static_cast<size_t>(4) * n);
  const auto t0 = Clock::now();
  Status st = comm_->all_gather(mine, all.data(), all.size(), timeout_);
  exposed_s_ += std::chrono::duration<double>(Clock::now() - t0).count();
  if (!st.ok()) fatal_error(__FILE__, __LINE__, st.message());
  double loss = 0, sq_all = 0;
  for (int k = 0; k < n; ++k) {
    const float* v = all.data() + 4 * k;
    loss += static_cast<double>(v[0]) + static_cast<double>(v[1]);
    sq_all += static_cast<double>(v[2]) + static_cast<double>(v[3]);
  }
  r.loss = loss / n;
  if (plan_.zero >= 1) r.grad_norm = std::sqrt(sq_all);
  return r;
}

void ZeroHostState::adamw(const AdamWStep& s, double grad_scale) {
  wait_all();
  const float b1 = static_cast<float>(s.beta1), b2 = static_cast<float>(s.beta2);
  const float lr = static_cast<float>(s.lr), eps = static_cast<float>(s.eps);
  const float scale = static_cast<float>(grad_scale);
  const float c1 = static_cast<float>(1.0 - std::pow(s.beta1, static_cast<double>(s.step)));
  const float c2 = static_cast<float>(1.0 - std::pow(s.beta2, static_cast<double>(s.step)));
  size_t seg = 0;
  for (size_t b = 0; b < plan_.buckets.size(); ++b) {
    const FlatRange& own = plan_.owned[b];
    for (; seg < plan_.segments.size() && plan_.segments[seg].offset < own.end(); ++seg) {
      const ShardSegment& sg = plan_.segments[seg];
      const float wd = sg.decay ? static_cast<float>(s.weight_decay) : 0.0f;
      float* p = params_.data() + (plan_.zero < 3 ? sg.offset : sg.shard_offset);
      const float* g = grads_.data() + (plan_.zero < 2 ? sg.offset : sg.shard_offset);
      float* mm = adam_m_.data() + sg.shard_offset;
      float* vv = adam_v_.data() + sg.shard_offset;
      pool_->parallel_for(sg.count, [&](size_t begin, size_t end) {
        for (size_t i = begin; i < end; ++i) {
          const float gi = g[i] * scale;
          mm[i] = b1 * mm[i] + (1.0f - b1) * gi;
          vv[i] = b2 * vv[i] + (1.0f - b2) * gi * gi;
          const float mhat = mm[i] / c1;
          const float vhat = vv[i] / c2;
          p[i] -= lr * (mhat / (std::sqrt(vhat) + eps) + wd * p[i]);
        }
      });
    }
    // ZeRO 1/2: the bucket's updated blocks travel while the next bucket is updated.
    if (plan_.zero == 1 || plan_.zero == 2) {
      const int bi = static_cast<int>(b);
      enqueue([this, bi] {
        return gather_bucket(bi, params_.data() + plan_.owned[bi].offset,
                             params_.data() + plan_.buckets[bi].offset);
      });
    }
  }
  const double exposed_before = exposed_s_;
  wait_all();
  exposed_s_ = exposed_before;  // the update's own gathers count as optimizer time
  resident_valid_ = false;
  for (BlockSlot& sl : block_slots_) sl = {std::move(sl.data), -1, 0, false};
}

// ---- state in global coordinates ----

std::vector<FlatRange> ZeroHostState::held(StateBuffer which) const {
  const std::vector<FlatRange> all{{0, plan_.numel}};
  switch (which) {
    case StateBuffer::kParams:
      return plan_.zero < 3 ? all : plan_.owned_ranges();
    case StateBuffer::kGrads:
      return plan_.zero < 2 ? all : plan_.owned_ranges();
    case StateBuffer::kAdamM:
    case StateBuffer::kAdamV:
      return plan_.owned_ranges();
  }
  return {};
}

std::vector<FlatRange> ZeroHostState::written(StateBuffer which) const {
  if (which == StateBuffer::kGrads) return {};
  if (plan_.zero == 0) return plan_.replica_written_ranges();
  return plan_.owned_ranges();
}

float* ZeroHostState::full_or_shard(StateBuffer which) {
  switch (which) {
    case StateBuffer::kParams:
      return params_.data();
    case StateBuffer::kGrads:
      return grads_.data();
    case StateBuffer::kAdamM:
      return adam_m_.data();
    case StateBuffer::kAdamV:
      return adam_v_.data();
  }
  return nullptr;
}

namespace {
bool is_full(const ShardPlan& p, StateBuffer which) {
  switch (which) {
    case StateBuffer::kParams:
      return p.zero < 3;
    case StateBuffer::kGrads:
      return p.zero < 2;
    default:
      return false;  // the AdamW shard; under ZeRO 0 it is the whole buffer in flat order
  }
}
}  // namespace

void ZeroHostState::read(StateBuffer which, size_t offset, size_t count, float* out) {
  wait_all();
  float* base = full_or_shard(which);
  if (is_full(plan_, which)) {
    GANTRY_CHECK(offset + count <= plan_.numel, "read past the end of the buffer");
    std::memcpy(out, base + offset, count * sizeof(float));
    return;
  }
  const size_t copied = plan_.for_each_owned(offset, count, [&](size_t at, size_t shard_at, size_t n) {
    std::memcpy(out + (at - offset), base + shard_at, n * sizeof(float));
  });
  GANTRY_CHECK(copied == count,
               std::string("read of ") + state_buffer_name(which) + " outside the rank's shard");
}

void ZeroHostState::write(StateBuffer which, size_t offset, size_t count, const float* in) {
  wait_all();
  float* base = full_or_shard(which);
  if (which == StateBuffer::kParams) {
    resident_valid_ = false;
    for (BlockSlot& sl : block_slots_) sl = {std::move(sl.data), -1, 0, false};
  }
  if (is_full(plan_, which)) {
    GANTRY_CHECK(offset + count <= plan_.numel, "write past the end of the buffer");
    std::memcpy(base + offset, in, count * sizeof(float));
    return;
  }
  const size_t copied = plan_.for_each_owned(offset, count, [&](size_t at, size_t shard_at, size_t n) {
    std::memcpy(base + shard_at, in + (at - offset), n * sizeof(float));
  });
  GANTRY_CHECK(copied == count,
               std::string("write of ") + state_buffer_name(which) + " outside the rank's shard");
}

const float* ZeroHostState::full_params() {
  wait_all();
  return plan_.zero < 3 ? params_.data() : nullptr;
}

void ZeroHostState::gather_params(float* out) {
  wait_all();
  if (plan_.zero < 3) {
    std::memcpy(out, params_.data(), plan_.numel * sizeof(float));
    return;
  }
  for (size_t b = 0; b < plan_.buckets.size(); ++b) {
    const int bi = static_cast<int>(b);
    const float* mine = params_.data() + plan_.owned_shard_offset[b];
    float* dst = out + plan_.buckets[b].offset;
    enqueue([this, bi, mine, dst] { return gather_bucket(bi, mine, dst); });
  }
  wait_all();
}

ShardMemory ZeroHostState::allocated() const {
  ShardMemory m;
  m.params = params_.size() + embedding_params_.size() + final_params_.size() + block_slots_[0].data.size() +
             block_slots_[1].data.size();
  m.grads = grads_.size() + embedding_staging_.size() + staging_slots_[0].data.size() +
            staging_slots_[1].data.size();
  m.optimizer = adam_m_.size() + adam_v_.size();
  return m;
}

}  // namespace gantry
