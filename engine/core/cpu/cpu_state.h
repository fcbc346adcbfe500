// What the two CPU backends set up alike (cpu/backend_cpu.cpp: one process, or a dp and/or tp rank;
// cpu/backend_cpu_pipeline.cpp: one pipeline stage): the tp axis they run their tensor-parallel pieces on
// (TpOpsCpu, with sequence parallelism's scratch sized up front so that memory_bytes counts it from the
// start), the training state over the dp axis (ZeroHostState on the shard plan of the backend's table, the
// tp shares registered so the norm counts the whole tensors once), and the Backend calls that only pass
// through to that state.
//
//   tp_ = cpu_tp_ops(o, &pool_, m, max_batch);                  // no communicator at tp 1
//   state_ = cpu_state_create(table_, o, tp_, &pool_);          // in a class derived from CpuStateBackend
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "engine/core/backend.h"
#include "engine/core/cpu/tp_ops_cpu.h"
#include "engine/core/parallel/zero_host_state.h"

namespace gantry {

class ThreadPool;

// TpOpsCpu over options.tp when its size is above 1 (none otherwise), sequence parallel as options say,
// its scratch sized for max_batch sequences of m.seq_len.
TpOpsCpu cpu_tp_ops(const BackendOptions& o, ThreadPool* pool, const ModelConfig& m, int max_batch);

// The training state of `table` over options.dp (ZeRO options.zero, gradient buckets of
// options.bucket_bytes), with the tp shares of its tensors registered when tp has a communicator.
std::unique_ptr<ZeroHostState> cpu_state_create(const TensorTable& table, const BackendOptions& o,
                                                const TpOpsCpu& tp, ThreadPool* pool);

// A CPU backend whose parameters, gradients and AdamW state live in state_: the calls that read or write
// that state, or only report on it, pass through to it.
class CpuStateBackend : public Backend {
 public:
  StateBytes state_bytes() const override;
  // The norm of this rank's gradients over its dp group (tests and tools; a pipeline stage's, not summed
  // over the stages).
  double grad_norm() override;
  void read_state(StateBuffer which, size_t offset, size_t count, float* out) override;
  void write_state(StateBuffer which, size_t offset, size_t count, const float* in) override;
  std::vector<FlatRange> held_ranges(StateBuffer which) const override;
  std::vector<FlatRange> written_ranges(StateBuffer which) const override;
  void gather_params(float* out) override;
  // The hash of every fp32 parameter where the rank holds them all (ZeRO 0-2), else 0.
  uint64_t replicated_hash() override;

 protected:
  std::unique_ptr<ZeroHostState> state_;
};

}  // namespace gantry
