// The CUDA backend's factory. No CUDA types here: callers include this from plain C++.
#pragma once

#include <chrono>
#include <memory>

#include "engine/core/backend.h"

namespace gantry {

// bf16 compute with fp32 master weights, gradients and AdamW state, on the current CUDA device.
// All memory, activations included, is allocated here for micro-batches of up to max_batch sequences.
// With `graphs`, each micro-batch shape is captured once as a CUDA graph and replayed. Without
// `deterministic`, the attention backward may add dQ with floating-point atomics (faster, not bit-stable).
// Data parallel over NCCL: the dp communicator (null or size 1: one GPU), the ZeRO stage (0-3; one GPU
// shards nothing), the gradient bucket size and the collectives' timeout. Buckets are reduced on a stream of
// their own as the backward pass completes them (parallel/shard_plan.h, cuda/zero_device_state.cuh). CUDA
// graphs are off in data parallel runs.
struct CudaDataParallel {
  Communicator* comm = nullptr;
  int zero = 0;
  size_t bucket_bytes = size_t{25} << 20;
  std::chrono::milliseconds timeout{std::chrono::seconds(120)};
};
std::unique_ptr<Backend> backend_cuda_create(const ModelConfig& m, int max_batch, bool graphs,
                                             bool deterministic, const CudaDataParallel& dp = {});

}  // namespace gantry
