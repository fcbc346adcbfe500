// One communicator interface for the parallel axes (DESIGN.md: NCCL on GPU, Gloo on CPU, behind one
// interface with abort). No Gloo, NCCL or CUDA types here, so model and parallel code include it on any
// machine. Pointers are in the backend's memory: host memory for Gloo, device memory for NCCL.
//
//   Result<std::unique_ptr<Communicator>> comm = gloo_communicator_create(rank, size, fd, "dp/", 30s);
//   if (!comm.ok()) return comm.status();
//   Status st = (*comm)->all_reduce(grads.data(), grads.size(), 30s);
//   if (!st.ok()) return st;   // "gloo all_reduce (rank 1 of 4, 1000 floats): peer closed: ..."
//
//   // ZeRO: each rank reduces and owns one contiguous block of the flat gradient buffer.
//   CommBlock mine = comm_block(n, comm->size(), comm->rank());
//   (*comm)->reduce_scatter(grads.data(), shard.data(), n, 30s);     // shard holds mine.count floats
//   (*comm)->all_gather(params.data() + mine.offset, params.data(), n, 30s);  // in place
//
// Contract, every backend:
// - Every rank calls the same collectives in the same order with the same `count` (and root). Ranks
//   that disagree hang until the timeout, which then names the operation.
// - Sums are deterministic: the order in which ranks' contributions are added depends on the rank
//   count and buffer size only, never on timing, so the same inputs give the same bits every run, and
//   every rank ends with the same bits. For Gloo, all_reduce is exactly reduce_scatter followed by
//   all_gather (a ring, gloo_communicator.h), so ZeRO and plain DP produce identical sums.
// - Operations run one at a time, from one thread. abort() is the exception: any thread, any time.
// - The first failure (timeout, peer closed, abort) breaks the communicator for good: the peers are in
//   an unknown state, so every later operation fails at once with that first cause, and the backend
//   closes its connections so that the peers' operations fail promptly too (a gang fails together).
#pragma once

#include <chrono>
#include <cstddef>
#include <string>
#include <vector>

#include "engine/core/comm/flight_recorder.h"  // CollectiveRecord
#include "telemetry/status.h"

namespace gantry {

// A rank's contiguous share of a `count`-element buffer split over `size` ranks: the first
// count % size ranks get one element more, so shares differ by at most one and need no padding.
struct CommBlock {
  size_t offset = 0;
  size_t count = 0;
};
inline CommBlock comm_block(size_t count, int size, int rank) {
  const size_t n = static_cast<size_t>(size), r = static_cast<size_t>(rank);
  const size_t base = count / n, extra = count % n;
  return {r * base + (r < extra ? r : extra), base + (r < extra ? 1 : 0)};
}

// Where a rank is in its sequence of collectives, for a watchdog on another thread (the worker's heartbeat):
// ranks stuck in collective #N wait for the rank that has not entered it. Every rank numbers its
// collectives alike, since every rank calls the same ones in the same order (the contract below).
struct CommProgress {
  uint64_t entered =
      0;  // collectives begun so far, the current one included; 0 where a backend keeps no count
  bool inside = false;     // inside collective #entered now
  bool timed_out = false;  // the communicator broke because a wait on a peer outlasted its timeout
};

class Communicator {
 public:
  using Timeout = std::chrono::milliseconds;
  virtual ~Communicator() = default;

  virtual int rank() const = 0;
  virtual int size() const = 0;
  virtual const char* backend() const = 0;  // "gloo", "nccl"

  // data[0..count) = the sum of every rank's data[0..count), in place.
  virtual Status all_reduce(float* data, size_t count, Timeout timeout) = 0;
  // out[0..b.count) = the sum over ranks of in[b.offset .. b.offset + b.count), b = comm_block(count, size,
  // rank). `in` holds all `count` elements and is left unchanged; out may be in + b.offset.
  virtual Status reduce_scatter(const float* in, float* out, size_t count, Timeout timeout) = 0;
  // out[0..count) = every rank's block, in rank order; `in` holds this rank's comm_block(count, size, rank)
  // elements and may be out + b.offset (in place).
  virtual Status all_gather(const float* in, float* out, size_t count, Timeout timeout) = 0;
  // data[0..count) = root's data[0..count) on every rank.
  virtual Status broadcast(float* data, size_t count, int root, Timeout timeout) = 0;
  // Point to point; the peer's matching call must name the same count. Messages between two ranks
  // arrive in the order they were sent. send returns once the peer has taken the data, so two ranks
  // must not both send to each other first (pair each send with the peer's recv, e.g. by rank parity).
  // Only the two ranks involved call these; the others' collectives stay in step.
  virtual Status send(const float* data, size_t count, int peer, Timeout timeout) = 0;
  virtual Status recv(float* data, size_t count, int peer, Timeout timeout) = 0;
  // A send and a receive posted together and both waited for (a pipeline stage hands its output on while
  // taking the next input): two ranks may each send to the other in one, which separate blocking calls
  // would deadlock on. A count of 0 leaves that half out. Host communicators only; the default answers
  // "not supported".
  virtual Status send_recv(const float* send_data, size_t send_count, int send_peer, float* recv_data,
                           size_t recv_count, int recv_peer, Timeout timeout);
  // Returns once every rank has entered the barrier.
  virtual Status barrier(Timeout timeout) = 0;
  // all_reduce of a few values in host memory (decisions and statistics: stop flags, a loss), whatever
  // memory the communicator's data lives in. Host communicators reduce in place; device ones stage the
  // values through device memory.
  virtual Status all_reduce_host(float* data, size_t count, Timeout timeout) {
    return all_reduce(data, count, timeout);
  }

  // Stream-ordered operations, for device communicators (NCCL): enqueue the collective on `stream` (a
  // cudaStream_t) behind what is already there and return at once, so a reduction overlaps the compute
  // on other streams; the caller orders producers and consumers with events and observes completion and
  // errors with sync(). all_gather_enqueue moves `element_bytes`-wide elements (4: fp32, 2: bf16 parameter
  // copies). Host communicators answer "not supported". Same contract as above otherwise (same order
  // and counts on every rank; the first failure breaks the communicator).
  virtual Status all_reduce_enqueue(float* data, size_t count, void* stream);
  virtual Status reduce_scatter_enqueue(const float* in, float* out, size_t count, void* stream);
  virtual Status all_gather_enqueue(const void* in, void* out, size_t count, size_t element_bytes,
                                    void* stream);
  // all_reduce_enqueue on `count` bf16 values (tensor parallelism's activations and their gradients, which
  // the kernels hold in bf16: half the bytes of fp32, and at tp 2 the same bits, since the one add is
  // taken in fp32 and rounded once either way).
  virtual Status all_reduce_bf16_enqueue(void* data, size_t count, void* stream);
  // Sequence parallelism's reduce-scatter, in place on `count` bf16 values (a multiple of size()): rank r's
  // block [r·count/size, (r+1)·count/size) of `data` becomes the sum of that block over the ranks; the
  // other blocks are left undefined.
  virtual Status reduce_scatter_bf16_enqueue(void* data, size_t count, void* stream);
  // Point to point on `stream` (a pipeline's activations and gradients, bf16 with element_bytes 2, or fp32
  // with 4): the peer's matching call names the same count and element size. Like send/recv, a send is
  // matched by the peer's receive in the order both were enqueued; the stream waits for the peer, the host
  // does not.
  virtual Status send_enqueue(const void* data, size_t count, size_t element_bytes, int peer, void* stream);
  virtual Status recv_enqueue(void* data, size_t count, size_t element_bytes, int peer, void* stream);
  // Waits until `stream` has drained, failing on the communicator's asynchronous error, the deadline or
  // abort().
  virtual Status sync(void* stream, Timeout timeout);

  // Stops the operation in progress (it returns an "aborted" error), fails every later one, and closes
  // the connections so the peers fail promptly. Idempotent; safe from any thread.
  virtual void abort() = 0;
  // Ok, or the first failure that broke the communicator.
  virtual Status health() const = 0;
  // Safe from any thread, while an operation runs. Backends that keep no count report {}.
  virtual CommProgress progress() const { return {}; }
  // The last collectives entered (flight_recorder.h), oldest first; safe from any thread. Backends that
  // keep no recorder return none.
  virtual std::vector<CollectiveRecord> flight_record() const { return {}; }
};

// How an operation's error message begins: "gloo all_reduce (rank 1 of 4, 1000 floats): ".
std::string comm_error_prefix(const char* backend, const char* op, int rank, int size, size_t count);
// Why an operation is refused, after that prefix, on a communicator that an earlier error or abort() broke:
// "aborted", or "communicator unusable after an earlier error: " and that error.
std::string comm_unusable_text(bool aborted, const std::string& broken);

}  // namespace gantry
