// The backend interface: what the train loop asks of a device. The CPU reference (fp32) and the CUDA
// backend (bf16 compute, fp32 master weights) fill it; no CUDA types appear here.
// The backend owns the flat parameter, gradient and AdamW buffers described by the model's tensor table;
// the train loop owns the schedule, the data and the decisions (clipping, when to step, checkpoints).
//
//   std::unique_ptr<Backend> be = backend_cpu_create(cfg.model, cfg.train.micro_batch, threads);
//   be->zero_grads();
//   float loss = be->forward_backward(inputs, targets, B, 1.0f / accum);
//   double norm = be->grad_norm();
//   be->adamw_step({.lr = lr, .grad_scale = clip_scale, .step = t, ...});
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "engine/core/config.h"
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
  double grad_scale = 1;    // multiplies every gradient first (global-norm clipping)
  int64_t step = 1;         // 1-based, for bias correction
};

class Backend {
 public:
  virtual ~Backend() = default;
  virtual std::string name() const = 0;
  virtual const TensorTable& params() const = 0;

  // Mean cross-entropy over the batch's B*T tokens; adds d(mean loss × grad_scale)/dθ to the gradients.
  // inputs and targets are (B, T) host arrays of token ids in [0, vocab); B <= the backend's max batch.
  virtual float forward_backward(const int32_t* inputs, const int32_t* targets, int batch, float grad_scale) = 0;
  // Mean cross-entropy only (validation).
  virtual float forward_loss(const int32_t* inputs, const int32_t* targets, int batch) = 0;

  virtual void zero_grads() = 0;
  virtual double grad_norm() = 0;  // global L2 norm of the gradient buffer
  virtual void adamw_step(const AdamWStep& s) = 0;

  // Host copies of a range of one flat buffer, for initialisation and checkpoints.
  virtual void read_state(StateBuffer which, size_t offset, size_t count, float* out) = 0;
  virtual void write_state(StateBuffer which, size_t offset, size_t count, const float* in) = 0;
};

// threads <= 0: one per core.
std::unique_ptr<Backend> backend_cpu_create(const ModelConfig& m, int max_batch, int threads);

}  // namespace gantry
