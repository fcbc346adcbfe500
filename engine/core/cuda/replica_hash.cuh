// The replica checksum on the GPU (engine/core/replica_hash.h gives the definition and the CPU loop): one
// grid-stride reduction over the buffer's 64-bit words, each thread summing its terms, a warp shuffle and one
// integer atomic per block. Integer addition is associative, so the result is the same bits whatever the
// schedule, and equals replica_hash() on the same bytes.
//
//   uint64_t h = replica_hash_cuda(params_, P * sizeof(bf16), sum_scratch_, stream);   // waits for the
//   stream
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

namespace gantry {

// Hashes `bytes` bytes at device pointer `data` (8-byte aligned, as every cudaMalloc is) after the work
// already on `stream`, and waits for the result. `sum` is one device word of scratch.
uint64_t replica_hash_cuda(const void* data, size_t bytes, unsigned long long* sum, cudaStream_t stream);

}  // namespace gantry
