// Checkpoint snapshots on the GPU (Backend::snapshot_start, engine/core/checkpoint_async.h): the fp32 master
// weights and AdamW moments copied into pinned host memory on a copy stream of their own, so the copy is
// a DMA beside the next step's forward and backward, which only read the bf16 copy. The one thing that
// must wait is what overwrites the sources: the next optimizer update (or a state write), on the compute
// stream, waits for the copy's event on the device; the host never waits for it but the writer thread.
//
//   CudaStateSnapshot snap(compute_stream);
//   float* host = snap.memory(floats);                 // pinned, kept and reused
//   snap.start({{device_src, host + at, n}, ...});     // after the work enqueued so far on compute_stream
//   ...next forward/backward...
//   snap.before_overwrite();  state update            // the compute stream waits for the copy
//   snap.wait();                                       // any thread: the copy is in host memory
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <vector>

namespace gantry {

class CudaStateSnapshot {
 public:
  struct Copy {
    const float* device = nullptr;
    float* host = nullptr;
    size_t count = 0;
  };

  explicit CudaStateSnapshot(cudaStream_t compute);
  ~CudaStateSnapshot();  // waits for a copy in flight before the pinned memory goes
  CudaStateSnapshot(const CudaStateSnapshot&) = delete;
  CudaStateSnapshot& operator=(const CudaStateSnapshot&) = delete;

  // Pinned host memory for `floats` floats; grown (reallocated, after any copy in flight) on demand.
  float* memory(size_t floats);
  // Enqueues the copies on the copy stream after everything the compute stream has enqueued so far.
  void start(const std::vector<Copy>& copies);
  // The compute stream waits (on the device) for the copy started last, once; call before work that writes
  // a copied buffer. Main thread only, as start().
  void before_overwrite();
  // Blocks until the copy started last is in host memory (at once when none was started). Any thread.
  void wait();
  // The device time of the copy started last, from its first byte to its last (after wait()); the pinned
  // copy's bandwidth is its bytes over this.
  double copy_seconds() const;

 private:
  cudaStream_t compute_;
  int device_ = 0;
  cudaStream_t copy_ = nullptr;
  cudaEvent_t ready_ = nullptr;  // on compute_: the state the copy reads is final
  cudaEvent_t begin_ = nullptr;  // on copy_: the copy's first byte (after the wait for ready_)
  cudaEvent_t done_ = nullptr;   // on copy_: the copy is in host memory
  bool pending_ = false;         // a copy the compute stream has not yet waited for
  float* host_ = nullptr;
  size_t floats_ = 0;
};

}  // namespace gantry
