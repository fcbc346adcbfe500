// The CUDA backend's factory. No CUDA types here: callers include this from plain C++.
#pragma once

#include <chrono>
#include <memory>
#include <string>

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
// Tensor parallel over NCCL (Megatron-style, parallel/tensor_parallel.h): the tp communicator (null or size
// 1: none). params() is then this tp rank's share, tensor_parallel_table(m, tp, tp rank), the table the CPU
// backend holds at the same tp, so checkpoints of either load on the other. Column-parallel QKV and MLP-up,
// row-parallel attention and MLP projections, heads split over the ranks, the vocab-parallel embedding and
// cross-entropy (cuda/vocab_parallel.cuh); the activations' all-reduces are bf16, on a stream of their own.
// Composes with CudaDataParallel (ZeRO over the dp axis); CUDA graphs are off.
// sequence_parallel (train.sequence_parallel, at pp 1): between the row-parallel products and the next
// column-parallel one, each tp rank keeps N/tp rows of the residual stream; reduce-scatters and all-gathers
// (bf16) take the all-reduces' place (backend_cuda.cu says where).
struct CudaTensorParallel {
  Communicator* comm = nullptr;
  bool sequence_parallel = false;
};
// Pipeline parallel over NCCL point-to-point (parallel/pipeline_schedule.h): the pp communicator (null or
// size 1: none), train.pp_schedule ("gpipe", "1f1b" or "zbh1" at vp 1, "interleaved" at vp > 1) and
// train.vp. params() is then this stage's pipeline_rank_table (its vp chunks) (at
// tp > 1 its tp shares, tensor_parallel_stage_table), as on the CPU, so checkpoints reshard between the two
// and to any pp. Composes with CudaDataParallel (ZeRO 0-3 under every schedule)
// and with CudaTensorParallel (tp x pp: the pp communicator joins the same tp rank of every stage); CUDA
// graphs off.
struct CudaPipeline {
  Communicator* comm = nullptr;
  std::string schedule = "1f1b";
  int vp = 1;  // model chunks per rank: 1, or > 1 under "interleaved"
};
std::unique_ptr<Backend> backend_cuda_create(const ModelConfig& m, int max_batch, bool graphs,
                                             bool deterministic, const CudaDataParallel& dp = {},
                                             const CudaTensorParallel& tp = {}, const CudaPipeline& pp = {});

}  // namespace gantry
