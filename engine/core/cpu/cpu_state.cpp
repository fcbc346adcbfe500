#include "engine/core/cpu/cpu_state.h"

#include <utility>

#include "engine/core/comm/communicator.h"
#include "engine/core/parallel/tensor_parallel.h"
#include "engine/core/replica_hash.h"

namespace gantry {

TpOpsCpu cpu_tp_ops(const BackendOptions& o, ThreadPool* pool, const ModelConfig& m, int max_batch) {
  TpOpsCpu tp{.comm = o.tp != nullptr && o.tp->size() > 1 ? o.tp : nullptr,
              .timeout = o.comm_timeout,
              .pool = pool,
              .sequence_parallel = o.sequence_parallel};
  tp.reserve(max_batch, m.seq_len, m.n_embd);
  return tp;
}

std::unique_ptr<ZeroHostState> cpu_state_create(const TensorTable& table, const BackendOptions& o,
                                                const TpOpsCpu& tp, ThreadPool* pool) {
  const int dp = o.dp != nullptr ? o.dp->size() : 1, rank = o.dp != nullptr ? o.dp->rank() : 0;
  auto state = std::make_unique<ZeroHostState>(
      table, shard_plan_make(table, dp, rank, o.zero, o.bucket_bytes), o.dp, o.comm_timeout, pool);
  if (tp.comm != nullptr) {
    std::vector<bool> sharded;
    for (const TensorInfo& t : table.tensors()) sharded.push_back(tensor_parallel_sharded(t.name));
    state->set_tensor_parallel(tp.comm, table, std::move(sharded));
  }
  return state;
}

StateBytes CpuStateBackend::state_bytes() const {
  const ShardMemory m = state_->allocated();
  return {.params = m.params * sizeof(float),
          .grads = m.grads * sizeof(float),
          .optimizer = m.optimizer * sizeof(float)};
}

double CpuStateBackend::grad_norm() {
  return state_->reduce_stats(0.0).grad_norm;
}

void CpuStateBackend::read_state(StateBuffer which, size_t offset, size_t count, float* out) {
  state_->read(which, offset, count, out);
}

void CpuStateBackend::write_state(StateBuffer which, size_t offset, size_t count, const float* in) {
  state_->write(which, offset, count, in);
}

std::vector<FlatRange> CpuStateBackend::held_ranges(StateBuffer which) const {
  return state_->held(which);
}

std::vector<FlatRange> CpuStateBackend::written_ranges(StateBuffer which) const {
  return state_->written(which);
}

void CpuStateBackend::gather_params(float* out) {
  state_->gather_params(out);
}

uint64_t CpuStateBackend::replicated_hash() {
  const float* p = state_->full_params();
  return p != nullptr ? replica_hash(p, params().numel() * sizeof(float)) : 0;
}

}  // namespace gantry
