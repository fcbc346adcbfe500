// The engine's random numbers: splitmix64, whose whole state is one integer that checkpoints store.
// Self-written rather than <random> distributions, whose outputs differ between standard libraries.
#pragma once

#include <cmath>
#include <cstdint>

namespace gantry {

struct Rng {
  uint64_t state = 0;

  uint64_t next_u64() {
    uint64_t z = (state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }
  // Uniform in (0, 1]: never 0, so log() below is finite.
  double uniform() { return (static_cast<double>(next_u64() >> 11) + 1.0) * (1.0 / 9007199254740992.0); }
  // Standard normal by Box-Muller (one draw per call: simple, and init cost is negligible).
  double normal() {
    double u1 = uniform();
    double u2 = uniform();
    return std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2);
  }
};

}  // namespace gantry
