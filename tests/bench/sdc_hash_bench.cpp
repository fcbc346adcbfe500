// The silent-data-corruption check's hash on the CPU (benchmark, not a test): replica_hash
// (engine/core/replica_hash.h, what every rank computes per check) against xxhash64 on the same bytes, at
// the sizes the check meets: the tiny config's fp32 parameters (0.48 MB), 16 MB and GPT-2 124M's bf16 copy
// (248 MB). One JSON line per size and hash: the median of --reps timed passes after one warm-up pass, in
// milliseconds and GB/s, on one thread (the worker's check is single-threaded on the CPU backend).
//
//   sdc_hash_bench [--reps 9]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "engine/core/replica_hash.h"
#include "engine/core/xxhash64.h"

namespace {

template <class F>
double median_ms(int reps, F f) {
  f();  // warm-up: pages touched, caches as the check would find them after a step
  std::vector<double> t;
  for (int i = 0; i < reps; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    f();
    t.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
  }
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  int reps = 9;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (std::strcmp(argv[i], "--reps") == 0) reps = std::max(1, std::atoi(argv[i + 1]));
  }
  struct Size {
    const char* what;
    size_t bytes;
  };
  const Size sizes[] = {{"tiny fp32 parameters", 120576 * 4},
                        {"16 MB", size_t{16} << 20},
                        {"GPT-2 124M bf16 copy", size_t{124475904} * 2}};
  for (const Size& s : sizes) {
    std::vector<unsigned char> buf(s.bytes);
    for (size_t i = 0; i < buf.size(); ++i) buf[i] = static_cast<unsigned char>(i * 2654435761u >> 13);
    volatile uint64_t sink = 0;
    const double replica =
        median_ms(reps, [&] { sink = sink + gantry::replica_hash(buf.data(), buf.size()); });
    const double xxh = median_ms(reps, [&] { sink = sink + gantry::xxhash64(buf.data(), buf.size()); });
    for (const auto& [name, ms] :
         {std::pair<const char*, double>{"replica_hash", replica}, {"xxhash64", xxh}}) {
      std::printf(
          "{\"bench\":\"sdc_hash\",\"hash\":\"%s\",\"size\":\"%s\",\"bytes\":%zu,\"reps\":%d,"
          "\"median_ms\":%.4f,\"gb_per_s\":%.3f}\n",
          name, s.what, s.bytes, reps, ms, static_cast<double>(s.bytes) / (ms * 1e-3) / 1e9);
    }
  }
  return 0;
}
