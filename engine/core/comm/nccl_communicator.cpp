// The NCCL communicator. Index:
//   helpers            error text, waiting out ncclInProgress
//   class NcclCommunicator
//     run()            broken check, enqueue, wait for completion or error or deadline or abort
//     watch()          the watchdog thread: async errors and enqueued collectives past their bound
//     collectives      all_reduce, reduce_scatter, all_gather, broadcast, send/recv, barrier
//   nccl_communicator_create
#include "engine/core/comm/nccl_communicator.h"

#include <cuda_runtime.h>  // streams, device selection, the barrier's scratch float
#include <nccl.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstdlib>  // getenv, strtol
#include <cstring>
#include <mutex>
#include <optional>
#include <span>
#include <thread>
#include <vector>

#include "engine/core/comm/store_client.h"

namespace gantry {
namespace {

using Clock = std::chrono::steady_clock;

std::string nccl_text(ncclResult_t r, ncclComm_t comm) {
  std::string s = std::string("nccl: ") + ncclGetErrorString(r);
  const char* last = comm ? ncclGetLastError(comm) : nullptr;
  if (last && *last) s += " (" + std::string(last) + ")";
  return s;
}

// The longest sleep between two polls, in µs. The step's end is waited for here (the backend's sync on its
// compute stream, about a step long): every µs the host oversleeps the GPU's last kernel is a µs the GPU sits
// idle before the next step's launch. 1 ms cost GPT-2 124M on 4 H200 about 0.5 ms a step (docs/PERF.md,
// issue 18); 50 µs costs a worker's core a few per cent in wake-ups. GANTRY_NCCL_POLL_MAX_US overrides it
// (measurements).
std::chrono::microseconds poll_max() {
  static const std::chrono::microseconds max = [] {
    const char* v = std::getenv("GANTRY_NCCL_POLL_MAX_US");
    const long us = v != nullptr ? std::strtol(v, nullptr, 10) : 0;
    return std::chrono::microseconds(us > 0 ? us : 50);
  }();
  return max;
}

// Sleeps that start short (an NVLink all-reduce of a small bucket takes microseconds) and grow to
// poll_max() (a long wait should not burn a core spinning).
class Backoff {
 public:
  void pause() {
    if (n_++ < 64) {
      std::this_thread::yield();
      return;
    }
    std::this_thread::sleep_for(delay_);
    delay_ = std::min(delay_ * 2, poll_max());
  }

 private:
  int n_ = 0;
  std::chrono::microseconds delay_{20};
};

// Non-blocking communicators may answer ncclInProgress; the next NCCL call on the communicator must wait
// until its state leaves that. "" when it reached ncclSuccess, else the cause.
std::string settle(ncclComm_t comm, ncclResult_t r, Clock::time_point deadline,
                   std::chrono::milliseconds timeout, const std::atomic<bool>* aborted) {
  Backoff backoff;
  while (r == ncclInProgress) {
    if (aborted && *aborted) return "aborted";
    if (Clock::now() > deadline) return "timeout after " + std::to_string(timeout.count()) + " ms";
    backoff.pause();
    if (ncclCommGetAsyncError(comm, &r) != ncclSuccess) return "nccl: ncclCommGetAsyncError failed";
  }
  return r == ncclSuccess ? "" : nccl_text(r, comm);
}

// ---- the communicator ------------------------------------------------------------------------------

class NcclCommunicator final : public Communicator {
 public:
  NcclCommunicator(int rank, int size, int device, ncclComm_t parent, ncclComm_t comm, cudaStream_t stream,
                   bool own_stream, float* scratch, std::chrono::milliseconds watchdog_timeout)
      : rank_(rank),
        size_(size),
        device_(device),
        parent_(parent),
        comm_(comm),
        stream_(stream),
        own_stream_(own_stream),
        scratch_(scratch),
        watchdog_timeout_(watchdog_timeout) {
    watchdog_ = std::thread([this] { watch(); });
  }

  ~NcclCommunicator() override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      watchdog_stop_ = true;
    }
    watchdog_cv_.notify_all();
    watchdog_.join();
    cudaSetDevice(device_);
    {
      std::lock_guard<std::mutex> lock(mu_);
      // Abort rather than destroy: ncclCommDestroy may wait for peers that will never come.
      abort_comm_locked();
    }
    if (scratch_) cudaFree(scratch_);
    if (host_staging_) cudaFree(host_staging_);
    if (own_stream_) cudaStreamDestroy(stream_);
  }

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  const char* backend() const override { return "nccl"; }

  Status health() const override {
    std::lock_guard<std::mutex> lock(mu_);
    return broken_.empty() ? Status() : Status::error(broken_);
  }

  void abort() override {
    std::lock_guard<std::mutex> lock(mu_);
    aborted_ = true;
    if (broken_.empty()) broken_ = "aborted";
    // An operation in progress polls aborted_ and aborts the communicator on its own thread; NCCL's
    // communicator must not be torn down under a thread still querying it.
    if (!in_op_) abort_comm_locked();
  }

  Status all_reduce(float* data, size_t count, Timeout timeout) override {
    return run("all_reduce", count, timeout, [&]() -> ncclResult_t {
      return ncclAllReduce(data, data, count, ncclFloat, ncclSum, comm_, stream_);
    });
  }

  Status reduce_scatter(const float* in, float* out, size_t count, Timeout timeout) override {
    return run("reduce_scatter", count, timeout,
               [&]() { return enqueue_reduce_scatter(in, out, count, stream_); });
  }

  Status all_gather(const float* in, float* out, size_t count, Timeout timeout) override {
    return run("all_gather", count, timeout,
               [&]() { return enqueue_all_gather(in, out, count, 4, stream_); });
  }

  Status all_reduce_enqueue(float* data, size_t count, void* stream) override {
    return enqueue_only("all_reduce_enqueue", count, [&]() -> ncclResult_t {
      return ncclAllReduce(data, data, count, ncclFloat, ncclSum, comm_, static_cast<cudaStream_t>(stream));
    });
  }
  Status all_reduce_bf16_enqueue(void* data, size_t count, void* stream) override {
    return enqueue_only("all_reduce_bf16_enqueue", count, [&]() -> ncclResult_t {
      return ncclAllReduce(data, data, count, ncclBfloat16, ncclSum, comm_,
                           static_cast<cudaStream_t>(stream));
    });
  }
  Status reduce_scatter_bf16_enqueue(void* data, size_t count, void* stream) override {
    if (count % static_cast<size_t>(size_) != 0) {
      return invalid("reduce_scatter_bf16_enqueue", count,
                     "the count is not a multiple of the " + std::to_string(size_) + " ranks");
    }
    const size_t block = count / static_cast<size_t>(size_);
    // In place: NCCL reads the whole buffer and writes this rank's block where it already lies.
    void* own = static_cast<char*>(data) + static_cast<size_t>(rank_) * block * 2;  // bf16: 2 bytes
    return enqueue_only("reduce_scatter_bf16_enqueue", count, [&]() -> ncclResult_t {
      return ncclReduceScatter(data, own, block, ncclBfloat16, ncclSum, comm_,
                               static_cast<cudaStream_t>(stream));
    });
  }
  Status reduce_scatter_enqueue(const float* in, float* out, size_t count, void* stream) override {
    return enqueue_only("reduce_scatter_enqueue", count, [&]() {
      return enqueue_reduce_scatter(in, out, count, static_cast<cudaStream_t>(stream));
    });
  }
  Status all_gather_enqueue(const void* in, void* out, size_t count, size_t element_bytes,
                            void* stream) override {
    if (element_bytes != 2 && element_bytes != 4) {
      return invalid("all_gather_enqueue", count,
                     "element size " + std::to_string(element_bytes) + " (2 or 4)");
    }
    return enqueue_only("all_gather_enqueue", count, [&]() {
      return enqueue_all_gather(in, out, count, element_bytes, static_cast<cudaStream_t>(stream));
    });
  }
  Status send_enqueue(const void* data, size_t count, size_t element_bytes, int peer, void* stream) override {
    if (Status st = check_p2p("send_enqueue", count, element_bytes, peer); !st.ok()) return st;
    return enqueue_only("send_enqueue", count, [&]() -> ncclResult_t {
      return ncclSend(data, count, element_bytes == 2 ? ncclBfloat16 : ncclFloat, peer, comm_,
                      static_cast<cudaStream_t>(stream));
    });
  }
  Status recv_enqueue(void* data, size_t count, size_t element_bytes, int peer, void* stream) override {
    if (Status st = check_p2p("recv_enqueue", count, element_bytes, peer); !st.ok()) return st;
    return enqueue_only("recv_enqueue", count, [&]() -> ncclResult_t {
      return ncclRecv(data, count, element_bytes == 2 ? ncclBfloat16 : ncclFloat, peer, comm_,
                      static_cast<cudaStream_t>(stream));
    });
  }
  Status check_p2p(const char* op, size_t count, size_t element_bytes, int peer) {
    if (peer < 0 || peer >= size_ || peer == rank_) return invalid(op, count, "peer " + std::to_string(peer));
    if (element_bytes != 2 && element_bytes != 4)
      return invalid(op, count, "element size " + std::to_string(element_bytes) + " (2 or 4)");
    return {};
  }
  Status sync(void* stream, Timeout timeout) override {
    const std::string prefix = comm_error_prefix("nccl", "sync", rank_, size_, 0);
    if (Status s = op_begin(prefix); !s.ok()) return s;
    std::string cause = wait_done(static_cast<cudaStream_t>(stream), Clock::now() + timeout, timeout);
    if (cause.empty()) {
      std::lock_guard<std::mutex> lock(mu_);
      outstanding_since_.reset();  // what was enqueued before this sync is done
    }
    return finish(prefix, cause);
  }

  Status broadcast(float* data, size_t count, int root, Timeout timeout) override {
    if (root < 0 || root >= size_) return invalid("broadcast", count, "root " + std::to_string(root));
    return run("broadcast", count, timeout, [&]() -> ncclResult_t {
      return ncclBroadcast(data, data, count, ncclFloat, root, comm_, stream_);
    });
  }

  Status send(const float* data, size_t count, int peer, Timeout timeout) override {
    if (peer < 0 || peer >= size_ || peer == rank_)
      return invalid("send", count, "peer " + std::to_string(peer));
    return run("send", count, timeout,
               [&]() -> ncclResult_t { return ncclSend(data, count, ncclFloat, peer, comm_, stream_); });
  }

  Status recv(float* data, size_t count, int peer, Timeout timeout) override {
    if (peer < 0 || peer >= size_ || peer == rank_)
      return invalid("recv", count, "peer " + std::to_string(peer));
    return run("recv", count, timeout,
               [&]() -> ncclResult_t { return ncclRecv(data, count, ncclFloat, peer, comm_, stream_); });
  }

  Status all_reduce_host(float* data, size_t count, Timeout timeout) override {
    if (count > kHostStaging)
      return invalid("all_reduce_host", count, "more than " + std::to_string(kHostStaging) + " values");
    if (host_staging_ == nullptr) {
      if (cudaError_t e = cudaMalloc(&host_staging_, kHostStaging * sizeof(float)); e != cudaSuccess) {
        return invalid("all_reduce_host", count, std::string("cudaMalloc: ") + cudaGetErrorString(e));
      }
    }
    if (cudaError_t e =
            cudaMemcpyAsync(host_staging_, data, count * sizeof(float), cudaMemcpyHostToDevice, stream_);
        e != cudaSuccess) {
      return invalid("all_reduce_host", count, std::string("cudaMemcpyAsync: ") + cudaGetErrorString(e));
    }
    Status st = all_reduce(host_staging_, count, timeout);  // waits for the stream: the copy in is done too
    if (!st.ok()) return st;
    if (cudaError_t e = cudaMemcpy(data, host_staging_, count * sizeof(float), cudaMemcpyDeviceToHost);
        e != cudaSuccess) {
      return invalid("all_reduce_host", count, std::string("cudaMemcpy: ") + cudaGetErrorString(e));
    }
    return {};
  }

  Status barrier(Timeout timeout) override {
    // NCCL has no barrier: a one-float all-reduce completes on a rank only after every rank contributed.
    return run("barrier", 0, timeout, [&]() -> ncclResult_t {
      return ncclAllReduce(scratch_, scratch_, 1, ncclFloat, ncclSum, comm_, stream_);
    });
  }

 private:
  // A bad argument fails the gang like any other error: the peers are already inside the collective.
  Status invalid(const char* op, size_t count, const std::string& what) {
    const std::string message =
        comm_error_prefix("nccl", op, rank_, size_, count) + "invalid argument: " + what;
    std::lock_guard<std::mutex> lock(mu_);
    if (broken_.empty() || broken_ == "aborted") broken_ = message;
    abort_comm_locked();
    return Status::error(message);
  }

  ncclResult_t enqueue_reduce_scatter(const float* in, float* out, size_t count, cudaStream_t stream) {
    if (count % static_cast<size_t>(size_) == 0) {
      return ncclReduceScatter(in, out, count / static_cast<size_t>(size_), ncclFloat, ncclSum, comm_,
                               stream);
    }
    // Uneven blocks: one reduce per block, rooted at its owner, fused into one launch by the group.
    ncclResult_t r = ncclGroupStart();
    if (r != ncclSuccess) return r;
    for (int b = 0; b < size_; ++b) {
      const CommBlock blk = comm_block(count, size_, b);
      if (blk.count == 0) continue;
      // recvbuff is used on the root only; the others pass their own input, which NCCL leaves alone.
      float* recv = b == rank_ ? out : const_cast<float*>(in + blk.offset);
      r = ncclReduce(in + blk.offset, recv, blk.count, ncclFloat, ncclSum, b, comm_, stream);
      if (r != ncclSuccess && r != ncclInProgress) {
        ncclGroupEnd();
        return r;
      }
    }
    return ncclGroupEnd();
  }

  ncclResult_t enqueue_all_gather(const void* in, void* out, size_t count, size_t element_bytes,
                                  cudaStream_t stream) {
    const ncclDataType_t type = element_bytes == 2 ? ncclBfloat16 : ncclFloat;
    char* out_bytes = static_cast<char*>(out);
    if (count % static_cast<size_t>(size_) == 0) {
      return ncclAllGather(in, out, count / static_cast<size_t>(size_), type, comm_, stream);
    }
    ncclResult_t r = ncclGroupStart();
    if (r != ncclSuccess) return r;
    for (int b = 0; b < size_; ++b) {
      const CommBlock blk = comm_block(count, size_, b);
      if (blk.count == 0) continue;
      // sendbuff is read on the root only.
      const void* send = b == rank_ ? in : out_bytes + blk.offset * element_bytes;
      r = ncclBroadcast(send, out_bytes + blk.offset * element_bytes, blk.count, type, b, comm_, stream);
      if (r != ncclSuccess && r != ncclInProgress) {
        ncclGroupEnd();
        return r;
      }
    }
    return ncclGroupEnd();
  }

  // Enqueues and returns without waiting for the stream: completion is the caller's (sync()).
  template <class Enqueue>
  Status enqueue_only(const char* op, size_t count, Enqueue&& enqueue) {
    const std::string prefix = comm_error_prefix("nccl", op, rank_, size_, count);
    if (Status s = op_begin(prefix); !s.ok()) return s;
    const Timeout settle_limit{std::chrono::seconds(60)};
    std::string cause;
    if (cudaError_t e = cudaSetDevice(device_); e != cudaSuccess) {
      cause = std::string("cuda: ") + cudaGetErrorString(e);
    } else {
      cause = settle(comm_, enqueue(), Clock::now() + settle_limit, settle_limit, &aborted_);
    }
    if (cause.empty()) {
      std::lock_guard<std::mutex> lock(mu_);
      if (!outstanding_since_) outstanding_since_ = Clock::now();  // the watchdog's clock starts
    }
    return finish(prefix, cause);
  }

  // Starts an operation: refused when an earlier error or abort() broke the communicator.
  Status op_begin(const std::string& prefix) {
    std::lock_guard<std::mutex> lock(mu_);
    if (!broken_.empty()) return Status::error(prefix + comm_unusable_text(aborted_, broken_));
    in_op_ = true;
    return Status();
  }

  // Ends an operation: ok, or the communicator broken and aborted with `cause`.
  Status finish(const std::string& prefix, std::string cause) {
    std::lock_guard<std::mutex> lock(mu_);
    in_op_ = false;
    if (aborted_ && cause.empty()) cause = "aborted";
    if (cause.empty()) return Status();
    const std::string message = prefix + cause;
    if (broken_.empty() || broken_ == "aborted") broken_ = message;
    abort_comm_locked();
    return Status::error(message);
  }

  template <class Enqueue>
  Status run(const char* op, size_t count, Timeout timeout, Enqueue&& enqueue) {
    const std::string prefix = comm_error_prefix("nccl", op, rank_, size_, count);
    if (Status s = op_begin(prefix); !s.ok()) return s;
    const auto deadline = Clock::now() + timeout;
    std::string cause;
    if (cudaError_t e = cudaSetDevice(device_); e != cudaSuccess) {
      cause = std::string("cuda: ") + cudaGetErrorString(e);
    } else {
      cause = settle(comm_, enqueue(), deadline, timeout, &aborted_);
    }
    if (cause.empty()) cause = wait_done(stream_, deadline, timeout);
    return finish(prefix, cause);
  }

  // Polls the stream and NCCL's asynchronous error until the work is done or must be given up.
  std::string wait_done(cudaStream_t stream, Clock::time_point deadline, Timeout timeout) {
    Backoff backoff;
    for (;;) {
      cudaError_t q = cudaStreamQuery(stream);
      if (q == cudaSuccess) return "";
      if (q != cudaErrorNotReady) return std::string("cuda: ") + cudaGetErrorString(q);
      ncclResult_t async = ncclSuccess;
      if (ncclCommGetAsyncError(comm_, &async) != ncclSuccess) return "nccl: ncclCommGetAsyncError failed";
      if (async != ncclSuccess && async != ncclInProgress) {
        // NCCL's proxy reports a vanished peer as a remote or system error.
        std::string text = nccl_text(async, comm_);
        return (async == ncclRemoteError || async == ncclSystemError ? "peer closed (" + text + ")" : text);
      }
      if (aborted_) return "aborted";
      if (Clock::now() > deadline) return "timeout after " + std::to_string(timeout.count()) + " ms";
      backoff.pause();
    }
  }

  // The watchdog thread. It acts only while no operation is in progress (in_op_): an operation polls the
  // communicator itself with its own deadline, and NCCL's communicator must not be aborted under a thread
  // still querying it; with mu_ held here, no operation can start meanwhile.
  void watch() {
    std::unique_lock<std::mutex> lock(mu_);
    while (!watchdog_stop_) {
      watchdog_cv_.wait_for(lock, std::chrono::milliseconds(100));
      if (watchdog_stop_ || comm_ == nullptr || in_op_ || !broken_.empty()) continue;
      const std::string prefix =
          "nccl watchdog (rank " + std::to_string(rank_) + " of " + std::to_string(size_) + "): ";
      ncclResult_t async = ncclSuccess;
      if (ncclCommGetAsyncError(comm_, &async) != ncclSuccess) {
        broken_ = prefix + "ncclCommGetAsyncError failed";
      } else if (async != ncclSuccess && async != ncclInProgress) {
        broken_ = prefix + nccl_text(async, comm_);
      } else if (outstanding_since_ && watchdog_timeout_.count() > 0 &&
                 Clock::now() - *outstanding_since_ > watchdog_timeout_) {
        broken_ = prefix + "an enqueued collective was not done within " +
                  std::to_string(watchdog_timeout_.count()) +
                  " ms (the run's hang timeout): aborted so that it returns an error instead of hanging";
      }
      if (!broken_.empty()) abort_comm_locked();  // the stuck kernels end; waiters on the stream return
    }
  }

  void abort_comm_locked() {
    if (!comm_) return;
    ncclCommAbort(comm_);  // also ends kernels still spinning on this communicator
    comm_ = nullptr;
    if (parent_) ncclCommAbort(parent_);
    parent_ = nullptr;
  }

  const int rank_;
  const int size_;
  const int device_;
  ncclComm_t parent_;  // non-blocking: made with a deadline; holds the resources comm_ shares
  ncclComm_t comm_;    // blocking, split from parent_: every operation (nccl_communicator_create says why)
  cudaStream_t stream_;
  const bool own_stream_;
  float* scratch_;  // (1,) device float for barrier
  static constexpr size_t kHostStaging = 256;
  float* host_staging_ = nullptr;  // all_reduce_host's device copy, made on first use

  mutable std::mutex mu_;
  std::atomic<bool> aborted_{false};
  bool in_op_ = false;
  std::string broken_;
  // The watchdog (watch()): the oldest enqueued collective not yet synced, its bound, its thread.
  std::optional<Clock::time_point> outstanding_since_;
  const std::chrono::milliseconds watchdog_timeout_;
  bool watchdog_stop_ = false;
  std::condition_variable watchdog_cv_;
  std::thread watchdog_;
};

}  // namespace

Result<std::unique_ptr<Communicator>> nccl_communicator_create(int rank, int size, int store_fd,
                                                               std::string prefix,
                                                               std::chrono::milliseconds timeout,
                                                               NcclCommOptions options) {
  const std::string where =
      "nccl create (rank " + std::to_string(rank) + " of " + std::to_string(size) + "): ";
  if (size < 1 || rank < 0 || rank >= size)
    return Status::error(where + "rank must be in [0, size), size >= 1");
  if (timeout.count() <= 0) return Status::error(where + "timeout must be positive");
  const auto deadline = Clock::now() + timeout;

  int device = options.device;
  if (device < 0 && cudaGetDevice(&device) != cudaSuccess)
    return Status::error(where + "no current CUDA device");
  if (cudaError_t e = cudaSetDevice(device); e != cudaSuccess) {
    return Status::error(where + "cudaSetDevice(" + std::to_string(device) + "): " + cudaGetErrorString(e));
  }

  // Rendezvous: the id is 128 opaque bytes; the store carries it like any other value.
  StoreClient store(store_fd);
  const std::string key = prefix + "nccl_unique_id";
  ncclUniqueId id;
  if (rank == 0) {
    if (ncclResult_t r = ncclGetUniqueId(&id); r != ncclSuccess)
      return Status::error(where + nccl_text(r, nullptr));
    std::span<const uint8_t> bytes(reinterpret_cast<const uint8_t*>(&id), sizeof id);
    if (Status st = store.set(key, bytes, timeout); !st.ok()) {
      return Status::error(where + "rendezvous failed: " + st.message());
    }
  } else {
    Result<std::vector<uint8_t>> bytes = store.get(key, timeout);
    if (!bytes.ok()) return Status::error(where + "rendezvous failed: " + bytes.error());
    if (bytes->size() != sizeof id) {
      return Status::error(where + "rendezvous failed: \"" + key + "\" holds " +
                           std::to_string(bytes->size()) + " bytes, an NCCL unique id has " +
                           std::to_string(sizeof id));
    }
    std::memcpy(&id, bytes->data(), sizeof id);
  }

  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;  // every call returns at once: timeouts and abort stay in our hands
  ncclComm_t comm = nullptr;
  ncclResult_t r = ncclCommInitRankConfig(&comm, size, id, rank, &config);
  if (r != ncclSuccess && r != ncclInProgress) return Status::error(where + nccl_text(r, comm));
  if (std::string cause = settle(comm, r, deadline, timeout, nullptr); !cause.empty()) {
    if (comm) ncclCommAbort(comm);
    return Status::error(where + "init: " + cause);
  }

  // The operations run on a blocking child of the same ranks. A non-blocking communicator launches every
  // operation from a new host thread and answers ncclInProgress, which the host then polls: about 100 µs a
  // collective, on the thread that launches the compute. A tensor-parallel forward, which enqueues four
  // all-reduces a layer between its products, left the GPU waiting for the host: GPT-2 124M at tp 2 with
  // 8 sequences took 17.21 ms a step non-blocking and 14.24 blocking, its forward 5.30 and 2.62 ms
  // (docs/PERF.md call T4). The split is the parent's operation, non-blocking, under the same deadline;
  // the child shares the parent's resources. A blocking enqueue returns once it is queued; what waits
  // for peers (the stream) is still polled with deadlines and watched (wait_done, the watchdog).
  ncclConfig_t child_config = NCCL_CONFIG_INITIALIZER;
  child_config.blocking = 1;
  child_config.splitShare = 1;
  ncclComm_t child = nullptr;
  r = ncclCommSplit(comm, 0, rank, &child, &child_config);
  // NCCL writes the child's handle only once the split is complete (on its own thread, the parent being
  // non-blocking): wait for it, and for the child to be ready, within the deadline.
  std::string split_cause = r == ncclSuccess || r == ncclInProgress ? "" : nccl_text(r, comm);
  for (Backoff backoff; split_cause.empty() && std::atomic_ref<ncclComm_t>(child).load() == nullptr;) {
    ncclResult_t parent_state = ncclSuccess;
    if (ncclCommGetAsyncError(comm, &parent_state) != ncclSuccess) {
      split_cause = "ncclCommGetAsyncError failed";
    } else if (parent_state != ncclSuccess && parent_state != ncclInProgress) {
      split_cause = nccl_text(parent_state, comm);
    } else if (Clock::now() > deadline) {
      split_cause = "timeout after " + std::to_string(timeout.count()) + " ms";
    } else {
      backoff.pause();
    }
  }
  if (split_cause.empty()) split_cause = settle(child, ncclInProgress, deadline, timeout, nullptr);
  if (!split_cause.empty()) {
    ncclCommAbort(comm);  // also joins the split's thread, which may still write `child`
    if (ncclComm_t late = std::atomic_ref<ncclComm_t>(child).load(); late != nullptr) ncclCommAbort(late);
    return Status::error(where + "split: " + split_cause);
  }

  cudaStream_t stream = static_cast<cudaStream_t>(options.stream);
  const bool own_stream = stream == nullptr;
  if (own_stream) {
    if (cudaError_t e = cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking); e != cudaSuccess) {
      ncclCommAbort(child);
      ncclCommAbort(comm);
      return Status::error(where + "cudaStreamCreate: " + cudaGetErrorString(e));
    }
  }
  float* scratch = nullptr;
  if (cudaError_t e = cudaMalloc(&scratch, sizeof(float)); e != cudaSuccess) {
    ncclCommAbort(child);
    ncclCommAbort(comm);
    if (own_stream) cudaStreamDestroy(stream);
    return Status::error(where + "cudaMalloc: " + cudaGetErrorString(e));
  }
  return std::unique_ptr<Communicator>(new NcclCommunicator(rank, size, device, comm, child, stream,
                                                            own_stream, scratch, options.watchdog_timeout));
}

}  // namespace gantry
