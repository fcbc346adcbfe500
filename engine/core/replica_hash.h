// The replica checksum of the silent-data-corruption check (engine/core/sdc_check.h): a 64-bit hash of a
// byte buffer defined so that a GPU computes it in one parallel reduction and the CPU in one loop, with the
// same bits whatever the order the terms are added in:
//
//   h = mix(bytes) + Σ_i mix(w_i ^ mix(i + kReplicaHashSeed))   (mod 2^64)
//
// where w_i is the buffer's i-th 64-bit little-endian word (the last one zero-padded) and mix is
// SplitMix64's finaliser, a bijection of 64-bit words. A changed word changes its own term and nothing
// else, so one flipped bit always changes h; two changes cancel with probability 2^-64. Addition is
// associative and commutative, so the GPU's per-thread sums, warp shuffles and atomics need no order.
// (xxhash64 is faster on one core, but its chained state cannot be split over a GPU's threads.)
//
//   uint64_t h = replica_hash(params.data(), params.size() * sizeof(float));
//   // CUDA: replica_hash_cuda(device_ptr, bytes, scratch, stream) gives the same value
//   (cuda/replica_hash.cuh)
#pragma once

#include <cstddef>
#include <cstdint>

#if defined(__CUDACC__)
#define GANTRY_REPLICA_HASH_FN __host__ __device__ inline
#else
#define GANTRY_REPLICA_HASH_FN inline
#endif

namespace gantry {

inline constexpr uint64_t kReplicaHashSeed = 0x5344432d67616e74ull;  // "SDC-gant"

// SplitMix64's finaliser (Steele, Lea, Flood 2014): invertible, so distinct inputs give distinct outputs.
GANTRY_REPLICA_HASH_FN uint64_t replica_hash_mix(uint64_t x) {
  x ^= x >> 30;
  x *= 0xbf58476d1ce4e5b9ull;
  x ^= x >> 27;
  x *= 0x94d049bb133111ebull;
  x ^= x >> 31;
  return x;
}

// Word i's term of the sum.
GANTRY_REPLICA_HASH_FN uint64_t replica_hash_term(uint64_t index, uint64_t word) {
  return replica_hash_mix(word ^ replica_hash_mix(index + kReplicaHashSeed));
}

// The hash of `bytes` bytes at `data` (any alignment; null when bytes is 0), on the CPU.
uint64_t replica_hash(const void* data, size_t bytes);

}  // namespace gantry
