#include <algorithm>
#include <cstring>

#include "engine/core/cuda/cuda_check.h"
#include "engine/core/cuda/replica_hash.cuh"
#include "engine/core/fatal.h"
#include "engine/core/replica_hash.h"

namespace gantry {

namespace {

constexpr int kThreads = 256;
constexpr int kMaxBlocks = 1024;  // enough to fill an H100/H200 (132 SMs x 8 blocks) and no more atomics

__global__ void replica_hash_sum_kernel(const unsigned long long* words, size_t n_words,
                                        unsigned long long* sum) {
  unsigned long long acc = 0;
  const size_t stride = static_cast<size_t>(gridDim.x) * blockDim.x;
  for (size_t i = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n_words; i += stride)
    acc += replica_hash_term(i, words[i]);
  for (int offset = 16; offset > 0; offset >>= 1) acc += __shfl_down_sync(0xffffffffu, acc, offset);
  __shared__ unsigned long long warp_sums[kThreads / 32];
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  if (lane == 0) warp_sums[warp] = acc;
  __syncthreads();
  if (warp == 0) {
    acc = lane < kThreads / 32 ? warp_sums[lane] : 0;
    for (int offset = 16; offset > 0; offset >>= 1) acc += __shfl_down_sync(0xffffffffu, acc, offset);
    if (lane == 0) atomicAdd(sum, acc);
  }
}

}  // namespace

uint64_t replica_hash_cuda(const void* data, size_t bytes, unsigned long long* sum, cudaStream_t stream) {
  GANTRY_CHECK(bytes == 0 || data != nullptr, "replica_hash_cuda: no buffer");
  GANTRY_CHECK(reinterpret_cast<uintptr_t>(data) % 8 == 0,
               "replica_hash_cuda: the buffer is not 8-byte aligned");
  GANTRY_CHECK(sum != nullptr, "replica_hash_cuda: no scratch word");
  const size_t words = bytes / 8, tail = bytes % 8;
  CUDA_CHECK(cudaMemsetAsync(sum, 0, sizeof(unsigned long long), stream));
  if (words > 0) {
    const size_t wanted = (words + kThreads - 1) / kThreads;
    const int blocks = static_cast<int>(std::min<size_t>(wanted, kMaxBlocks));
    replica_hash_sum_kernel<<<blocks, kThreads, 0, stream>>>(static_cast<const unsigned long long*>(data),
                                                             words, sum);
    CUDA_CHECK_LAUNCH();
  }
  // The zero-padded last word is summed here, from its few bytes, with the length term.
  unsigned long long device_sum = 0;
  unsigned char last[8] = {};
  CUDA_CHECK(cudaMemcpyAsync(&device_sum, sum, sizeof device_sum, cudaMemcpyDeviceToHost, stream));
  if (tail != 0) {
    CUDA_CHECK(cudaMemcpyAsync(last, static_cast<const unsigned char*>(data) + words * 8, tail,
                               cudaMemcpyDeviceToHost, stream));
  }
  CUDA_CHECK(cudaStreamSynchronize(stream));
  uint64_t h = replica_hash_mix(static_cast<uint64_t>(bytes)) + device_sum;
  if (tail != 0) {
    uint64_t w = 0;
    for (size_t k = 0; k < tail; ++k) w |= static_cast<uint64_t>(last[k]) << (8 * k);
    h += replica_hash_term(words, w);
  }
  return h;
}

}  // namespace gantry
