// The GPU communicator: NCCL behind the Communicator interface, pointers in device memory. Built only
// with CUDA and NCCL (GANTRY_HAVE_NCCL); like communicator.h, this header carries no CUDA or NCCL types.
//
//   // Rank 0 makes NCCL's unique id and publishes it through the launcher's store; the others fetch it.
//   Result<std::unique_ptr<Communicator>> dp = nccl_communicator_create(rank, world, fd, "dp/", 60s,
//                                                                       {.device = local_rank});
//   (*dp)->all_reduce(grads_device_ptr, n, 30s);
//
// Timeouts and abort: the communicator is created non-blocking (ncclConfig_t.blocking = 0), so its
// creation is bounded by the deadline; the operations then run on a blocking child split from it
// (ncclCommSplit, sharing its resources), whose enqueues return once the work is on the stream instead of
// launching it from a new host thread (about 100 µs a call; docs/PERF.md call T4). An operation enqueues
// its kernels on the stream and then polls the stream and ncclCommGetAsyncError until done, an
// asynchronous error, the deadline, or abort(). On failure both communicators are aborted (ncclCommAbort),
// which also makes the peers' NCCL fail (their proxies see the connection drop) rather than spin forever.
// An enqueue that must first connect to a peer (NCCL connects lazily, at a communicator's first use of a
// peer or algorithm) waits in the enqueue for that peer.
//
// The watchdog (issue 15): a thread of the communicator's own polls ncclCommGetAsyncError every 100 ms
// while no operation is polling it already, and aborts the communicator (ncclCommAbort) when NCCL reports
// an error or when a collective enqueued by an *_enqueue call has not been synced within
// `watchdog_timeout` (the run's hang timeout, GANTRY_HANG_TIMEOUT_MS, in a worker). The abort ends the
// kernels spinning in the stuck collective, so whatever waits on that stream (sync(), the backend's own
// stream synchronisation) returns with an error instead of hanging forever; health() names the cause.
// The node launcher's hang detection (gang.h) decides for the gang; this is the in-process side.
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
  // An enqueued collective not synced within this is aborted by the watchdog; 0 = no bound (asynchronous
  // errors are still watched).
  std::chrono::milliseconds watchdog_timeout{0};
};

// Rendezvous through the launcher's store on `store_fd` (the socket stays the caller's): rank 0 publishes
// NCCL's unique id under "<prefix>nccl_unique_id", every rank fetches it, then all initialise together.
// `timeout` bounds the rendezvous and the initialisation.
Result<std::unique_ptr<Communicator>> nccl_communicator_create(int rank, int size, int store_fd,
                                                               std::string prefix,
                                                               std::chrono::milliseconds timeout,
                                                               NcclCommOptions options = {});

}  // namespace gantry
