// The CUDA backend's factory. No CUDA types here: callers include this from plain C++.
#pragma once

#include <memory>

#include "engine/core/backend.h"

namespace gantry {

// bf16 compute with fp32 master weights, gradients and AdamW state, on the current CUDA device.
// All memory, activations included, is allocated here for micro-batches of up to max_batch sequences.
// With `graphs`, each micro-batch shape is captured once as a CUDA graph and replayed. Without
// `deterministic`, the attention backward may add dQ with floating-point atomics (faster, not bit-stable).
std::unique_ptr<Backend> backend_cuda_create(const ModelConfig& m, int max_batch, bool graphs, bool deterministic);

}  // namespace gantry
