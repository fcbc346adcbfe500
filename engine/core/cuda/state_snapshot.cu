#include "engine/core/cuda/cuda_check.h"
#include "engine/core/cuda/state_snapshot.cuh"

namespace gantry {

CudaStateSnapshot::CudaStateSnapshot(cudaStream_t compute) : compute_(compute) {
  CUDA_CHECK(cudaGetDevice(&device_));
  CUDA_CHECK(cudaStreamCreateWithFlags(&copy_, cudaStreamNonBlocking));
  CUDA_CHECK(cudaEventCreateWithFlags(&ready_, cudaEventDisableTiming));
  // begin_ and done_ time the copy (copy_seconds); an event's timing costs nothing measurable here.
  CUDA_CHECK(cudaEventCreate(&begin_));
  CUDA_CHECK(cudaEventCreate(&done_));
}

CudaStateSnapshot::~CudaStateSnapshot() {
  cudaEventSynchronize(done_);
  if (host_ != nullptr) cudaFreeHost(host_);
  cudaEventDestroy(ready_);
  cudaEventDestroy(begin_);
  cudaEventDestroy(done_);
  cudaStreamDestroy(copy_);
}

float* CudaStateSnapshot::memory(size_t floats) {
  if (floats <= floats_ && host_ != nullptr) return host_;
  CUDA_CHECK(cudaEventSynchronize(done_));  // the old memory may still be a copy's destination
  if (host_ != nullptr) CUDA_CHECK(cudaFreeHost(host_));
  host_ = nullptr;
  floats_ = 0;
  // Pinned: a copy from pageable memory would be staged by the driver and block the stream's host thread.
  CUDA_CHECK(cudaHostAlloc(reinterpret_cast<void**>(&host_), (floats > 0 ? floats : 1) * sizeof(float),
                           cudaHostAllocDefault));
  floats_ = floats;
  return host_;
}

void CudaStateSnapshot::start(const std::vector<Copy>& copies) {
  CUDA_CHECK(cudaEventRecord(ready_, compute_));
  CUDA_CHECK(cudaStreamWaitEvent(copy_, ready_, 0));
  CUDA_CHECK(cudaEventRecord(begin_, copy_));
  for (const Copy& c : copies) {
    CUDA_CHECK(cudaMemcpyAsync(c.host, c.device, c.count * sizeof(float), cudaMemcpyDeviceToHost, copy_));
  }
  CUDA_CHECK(cudaEventRecord(done_, copy_));
  pending_ = true;
}

void CudaStateSnapshot::before_overwrite() {
  if (!pending_) return;
  CUDA_CHECK(cudaStreamWaitEvent(compute_, done_, 0));
  pending_ = false;
}

void CudaStateSnapshot::wait() {
  CUDA_CHECK(cudaSetDevice(device_));  // the writer thread's first CUDA call: this backend's device
  CUDA_CHECK(cudaEventSynchronize(done_));
}

double CudaStateSnapshot::copy_seconds() const {
  float ms = 0;
  CUDA_CHECK(cudaEventElapsedTime(&ms, begin_, done_));
  return ms / 1e3;
}

}  // namespace gantry
