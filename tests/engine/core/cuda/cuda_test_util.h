// Helpers for the GPU tests: skipping without a device, device buffers, bf16 conversion, normalised error.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <vector>

#include "engine/core/cuda/cuda_check.h"
#include "engine/core/cuda/device.h"
#include "engine/core/rng.h"

#define GANTRY_REQUIRE_GPU()                                                    \
  do {                                                                          \
    if (::gantry::cuda_device_count() == 0)                                     \
      GTEST_SKIP() << "no CUDA device here: GPU tests run on the GPU machines"; \
  } while (0)

namespace gantry::testing_support {

template <class T>
class DeviceBuffer {
 public:
  explicit DeviceBuffer(size_t n) : n_(n) {
    CUDA_CHECK(cudaMalloc(&p_, std::max<size_t>(n, 1) * sizeof(T)));
    poison();
  }
  explicit DeviceBuffer(const std::vector<T>& host) : DeviceBuffer(host.size()) { upload(host); }
  ~DeviceBuffer() { cudaFree(p_); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  T* get() const { return p_; }
  size_t size() const { return n_; }
  // All bits set: NaN for fp32 and bf16, so an element never written shows up.
  void poison() { CUDA_CHECK(cudaMemset(p_, 0xFF, std::max<size_t>(n_, 1) * sizeof(T))); }
  void upload(const std::vector<T>& host) {
    CUDA_CHECK(cudaMemcpy(p_, host.data(), n_ * sizeof(T), cudaMemcpyHostToDevice));
  }
  std::vector<T> download() const {
    CUDA_CHECK(cudaDeviceSynchronize());
    std::vector<T> host(n_);
    CUDA_CHECK(cudaMemcpy(host.data(), p_, n_ * sizeof(T), cudaMemcpyDeviceToHost));
    return host;
  }

 private:
  T* p_ = nullptr;
  size_t n_;
};

inline std::vector<float> random_floats(Rng& rng, size_t n, double scale = 1.0) {
  std::vector<float> v(n);
  for (float& x : v) x = static_cast<float>(scale * rng.normal());
  return v;
}

inline std::vector<__nv_bfloat16> to_bf16(const std::vector<float>& v) {
  std::vector<__nv_bfloat16> out(v.size());
  for (size_t i = 0; i < v.size(); ++i) out[i] = __float2bfloat16(v[i]);
  return out;
}

inline std::vector<float> to_float(const std::vector<__nv_bfloat16>& v) {
  std::vector<float> out(v.size());
  for (size_t i = 0; i < v.size(); ++i) out[i] = __bfloat162float(v[i]);
  return out;
}

// The values a bf16 tensor really holds, as fp32: what the CPU reference must be fed.
inline std::vector<float> round_bf16(const std::vector<float>& v) {
  return to_float(to_bf16(v));
}

// ‖out − ref‖ / ‖ref‖; NaN anywhere in out gives +inf.
inline double rel_error(const std::vector<float>& out, const std::vector<float>& ref) {
  double num = 0, den = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    if (!std::isfinite(out[i])) return INFINITY;
    num += (static_cast<double>(out[i]) - ref[i]) * (static_cast<double>(out[i]) - ref[i]);
    den += static_cast<double>(ref[i]) * ref[i];
  }
  return den > 0 ? std::sqrt(num / den) : std::sqrt(num);
}

}  // namespace gantry::testing_support
