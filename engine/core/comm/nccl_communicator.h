// The GPU communicator: NCCL behind the Communicator interface, pointers in device memory. Built only
// with CUDA and NCCL (GANTRY_HAVE_NCCL); like communicator.h, this header carries no CUDA or NCCL types.
//
//   // Rank 0 makes NCCL's unique id and publishes it through the launcher's store; the others fetch it.
//   Result<std::unique_ptr<Communicator>> dp = nccl_communicator_create(rank, world, fd, "dp/", 60s,
//                                                                       {.device = local_rank});
//   (*dp)->all_reduce(grads_device_ptr, n, 30s);
//
// Timeouts and abort: the communicator is created non-blocking (ncclConfig_t.blocking = 0), so no NCCL
// call ever blocks the host; an operation enqueues its kernels on the stream and then polls the stream
// and ncclCommGetAsyncError until done, an asynchronous error, the deadline, or abort(). On failure the
// communicator is aborted (ncclCommAbort), which also makes the peers' NCCL fail (their proxies see the
// connection drop) rather than spin forever.
//
// Every operation waits for its own completion before returning, so results are ready on return; the
// caller must make sure the data was produced before the call (synchronise its producer stream, or pass
// that stream as `stream`). Overlapping reductions with the backward pass (issue 4's bucketing) needs an
// asynchronous variant returning a work handle: not here yet.
//
// Uneven sizes: when size does not divide count, reduce_scatter is a group of ncclReduce calls (one per
// block, rooted at the block's owner) and all_gather a group of ncclBroadcast calls; otherwise the
// native ncclReduceScatter / ncclAllGather. Determinism: NCCL's reductions give the same bits run to run
// for a fixed communicator size, count, algorithm and protocol; pin NCCL_ALGO/NCCL_PROTO when bit-exact
// reruns matter across configurations. Unlike the Gloo backend, all_reduce is not guaranteed to equal
// reduce_scatter + all_gather bit for bit (NCCL may pick tree for one and ring for the other).
#pragma once

#include <chrono>
#include <memory>
#include <string>

#include "engine/core/comm/communicator.h"
#include "telemetry/status.h"

namespace gantry {

struct NcclCommOptions {
  int device = -1;         // CUDA device ordinal this rank uses; -1: the calling thread's current device
  void* stream = nullptr;  // a cudaStream_t to run on; nullptr: a non-blocking stream of its own
};

// Rendezvous through the launcher's store on `store_fd` (the socket stays the caller's): rank 0 publishes
// NCCL's unique id under "<prefix>nccl_unique_id", every rank fetches it, then all initialise together.
// `timeout` bounds the rendezvous and the initialisation.
Result<std::unique_ptr<Communicator>> nccl_communicator_create(int rank, int size, int store_fd,
                                                               std::string prefix,
                                                               std::chrono::milliseconds timeout,
                                                               NcclCommOptions options = {});

}  // namespace gantry
