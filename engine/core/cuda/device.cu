#include <cuda_runtime.h>

#include "engine/core/cuda/device.h"

namespace gantry {

int cuda_device_count() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();  // clear the sticky "no driver" error so later calls start clean
    return 0;
  }
  return n;
}

std::string cuda_device_name(int index) {
  cudaDeviceProp prop{};
  if (index < 0 || index >= cuda_device_count() || cudaGetDeviceProperties(&prop, index) != cudaSuccess) return "";
  return prop.name;
}

}  // namespace gantry
