// The backend interface: what the train loop asks of a device. The CPU reference (fp32) and the CUDA
// backend (bf16 compute, fp32 master weights) fill it; no CUDA types appear here.
// The backend owns the flat parameter, gradient and AdamW buffers described by the model's tensor table;
// the train loop owns the schedule, the data and the decisions (clipping, when to step, checkpoints).
//
// A step asks nothing of the device until it is over, so a GPU never waits on the host mid-step:
//
//   Result<std::unique_ptr<Backend>> be = backend_create("cuda", cfg.model, cfg.train.micro_batch, {});
//   be->zero_grads();
//   for (each micro-batch) be->forward_backward(inputs, targets, B, 1.0f / accum);
//   be->optimizer_step({.lr = lr, .grad_clip = 1.0, .step = t, ...});
//   StepStats s = be->step_stats();   // the one wait per step: mean loss, grad norm
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "engine/core/config.h"
#include "engine/core/status.h"
#include "engine/core/tensor_table.h"

namespace gantry {

enum class StateBuffer { kParams, kGrads, kAdamM, kAdamV };
const char* state_buffer_name(StateBuffer b);  // "params", "grads", "adam_m", "adam_v"

struct AdamWStep {
  double lr = 0;
  double beta1 = 0.9;
  double beta2 = 0.95;
  double eps = 1e-8;
  double weight_decay = 0;  // applied to tensors whose table entry has decay = true
  double grad_clip = 0;     // scale gradients to this global L2 norm when above it; 0 = no clipping
  int64_t step = 1;         // 1-based, for bias correction
};

struct StepStats {
  double loss = 0;       // mean of the micro-batch losses since zero_grads()
  double grad_norm = 0;  // global L2 norm of the gradients before clipping
  bool updated = false;  // false when the norm was not finite: the parameters were left untouched
};

// Where the last step's time went on this rank, for the per-rank step records. measured == false: the
// backend does not time its phases (the CUDA backend, until its phases are timed with events).
struct PhaseTimes {
  double forward_s = 0;
  double backward_s = 0;
  double optimizer_s = 0;
  bool measured = false;
};

class Backend {
 public:
  virtual ~Backend() = default;
  virtual std::string name() const = 0;
  virtual const TensorTable& params() const = 0;

  // Adds d(mean cross-entropy over the batch's B*T tokens × grad_scale)/dθ to the gradients and the
  // loss to the step's loss. inputs and targets are (B, T) host arrays of token ids in [0, vocab);
  // B <= the backend's max batch. Does not wait for the device.
  virtual void forward_backward(const int32_t* inputs, const int32_t* targets, int batch, float grad_scale) = 0;
  // Mean cross-entropy only (validation); waits for the result.
  virtual float forward_loss(const int32_t* inputs, const int32_t* targets, int batch) = 0;

  // Zeroes the gradients and the step's loss.
  virtual void zero_grads() = 0;
  // Global gradient norm, clipping and AdamW in one go, without a host round trip. A non-finite norm
  // leaves every parameter and moment untouched (step_stats().updated == false).
  virtual void optimizer_step(const AdamWStep& s) = 0;
  // Waits for the step to finish and reports it.
  virtual StepStats step_stats() = 0;
  // Global L2 norm of the gradient buffer now (waits); for tests and tools.
  virtual double grad_norm() = 0;
  // Phase times of the step since zero_grads(); read after step_stats().
  virtual PhaseTimes phase_times() const { return {}; }

  // Bytes this backend allocated for parameters, state, activations and workspaces (all up front).
  virtual uint64_t memory_bytes() const = 0;

  // Host copies of a range of one flat buffer, for initialisation and checkpoints.
  virtual void read_state(StateBuffer which, size_t offset, size_t count, float* out) = 0;
  virtual void write_state(StateBuffer which, size_t offset, size_t count, const float* in) = 0;
};

// threads <= 0: one per core.
std::unique_ptr<Backend> backend_cpu_create(const ModelConfig& m, int max_batch, int threads);

// kind "cpu" or "cuda" (an error when this build has no CUDA backend or the machine no GPU).
struct BackendOptions {
  int threads = 0;             // cpu: threads, 0 = one per core
  bool cuda_graphs = true;     // cuda: replay each micro-batch as a captured CUDA graph
  bool deterministic = true;   // cuda: no floating-point atomics (the cpu backend always is)
};
Result<std::unique_ptr<Backend>> backend_create(const std::string& kind, const ModelConfig& m, int max_batch,
                                                const BackendOptions& options = {});

}  // namespace gantry
