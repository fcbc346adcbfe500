// The NCCL communicator across real processes, one GPU each (label gpu: runs where there are at least two
// GPUs, skips elsewhere). Same harness as the Gloo test: the parent serves the store, workers check every
// collective against sums computed on the host, and a killed worker must fail the others within the
// timeout with no process left behind.
#include "engine/core/comm/nccl_communicator.h"

#include <cuda_runtime.h>  // device buffers in the workers only: the parent never touches CUDA
#include <gtest/gtest.h>
#include <signal.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "engine/core/comm/communicator.h"
#include "tests/engine/core/comm/worker_harness.h"

namespace gantry {
namespace {

using namespace comm_test;

int gpu_count() {
  static int n = exit_code_in_child([] {
    int count = 0;
    return cudaGetDeviceCount(&count) == cudaSuccess ? std::min(count, 100) : 0;
  });
  return n;
}

// Device buffer for a worker; copies in and out.
struct DeviceFloats {
  float* p = nullptr;
  size_t n = 0;
  explicit DeviceFloats(size_t count) : n(count) {
    cudaMalloc(&p, std::max<size_t>(count, 1) * sizeof(float));
  }
  ~DeviceFloats() { cudaFree(p); }
  void put(const std::vector<float>& v, size_t offset = 0) {
    cudaMemcpy(p + offset, v.data(), v.size() * sizeof(float), cudaMemcpyHostToDevice);
  }
  std::vector<float> get(size_t offset, size_t count) const {
    std::vector<float> v(count);
    cudaMemcpy(v.data(), p + offset, count * sizeof(float), cudaMemcpyDeviceToHost);
    return v;
  }
};

std::string near(const std::vector<float>& got, const std::vector<double>& want, const std::string& what) {
  for (size_t i = 0; i < got.size(); ++i) {
    if (std::fabs(got[i] - want[i]) > 1e-5 * (1.0 + std::fabs(want[i]))) {
      return what + ": element " + std::to_string(i) + " is " + std::to_string(got[i]) + ", expected " +
             std::to_string(want[i]) + "\n";
    }
  }
  return "";
}

std::string nccl_collectives_body(int rank, int n, int fd) {
  auto made = nccl_communicator_create(rank, n, fd, "test/", 60s, {.device = rank});
  if (!made.ok()) return made.error();
  Communicator& comm = *made.value();
  std::string errors;
  for (size_t count : {size_t{1}, size_t{7}, size_t{1000}, size_t{65537}, size_t{1} << 20}) {
    std::vector<std::vector<float>> x;
    for (int r = 0; r < n; ++r) x.push_back(rank_data(r, count, 1));
    std::vector<double> sum(count, 0.0);
    for (int r = 0; r < n; ++r) {
      for (size_t i = 0; i < count; ++i) sum[i] += x[static_cast<size_t>(r)][i];
    }
    const std::string at = " (count " + std::to_string(count) + ")";
    const CommBlock mine = comm_block(count, n, rank);

    DeviceFloats a(count), b(count);
    a.put(x[static_cast<size_t>(rank)]);
    b.put(x[static_cast<size_t>(rank)]);
    WORKER_CHECK_OK(comm.all_reduce(a.p, count, 30s));
    WORKER_CHECK_OK(comm.all_reduce(b.p, count, 30s));
    std::vector<float> ra = a.get(0, count), rb = b.get(0, count);
    errors += near(ra, sum, "all_reduce" + at);
    errors += diff_bits(rb.data(), ra.data(), count, "second all_reduce of the same data" + at);

    DeviceFloats in(count), shard(mine.count);
    in.put(x[static_cast<size_t>(rank)]);
    WORKER_CHECK_OK(comm.reduce_scatter(in.p, shard.p, count, 30s));
    std::vector<double> want_shard(sum.begin() + static_cast<std::ptrdiff_t>(mine.offset),
                                   sum.begin() + static_cast<std::ptrdiff_t>(mine.offset + mine.count));
    errors += near(shard.get(0, mine.count), want_shard, "reduce_scatter" + at);

    DeviceFloats gathered(count);
    gathered.put(std::vector<float>(ra.begin() + static_cast<std::ptrdiff_t>(mine.offset),
                                    ra.begin() + static_cast<std::ptrdiff_t>(mine.offset + mine.count)),
                 mine.offset);
    WORKER_CHECK_OK(comm.all_gather(gathered.p + mine.offset, gathered.p, count, 30s));  // in place
    std::vector<float> g = gathered.get(0, count);
    errors += diff_bits(g.data(), ra.data(), count, "in-place all_gather of all_reduce's blocks" + at);

    for (int root = 0; root < n; ++root) {
      DeviceFloats buf(count);
      buf.put(rank == root ? x[static_cast<size_t>(root)] : std::vector<float>(count, 0.0f));
      WORKER_CHECK_OK(comm.broadcast(buf.p, count, root, 30s));
      std::vector<float> got = buf.get(0, count);
      errors += diff_bits(got.data(), x[static_cast<size_t>(root)].data(), count,
                          "broadcast from " + std::to_string(root) + at);
    }
  }
  // send/recv between rank pairs (0,1), (2,3): NCCL's send and recv are matched per pair.
  if (n >= 2 && (rank ^ 1) < n) {
    const int peer = rank ^ 1;
    DeviceFloats m(1000);
    if (rank % 2 == 0) {
      m.put(rank_data(rank, 1000, 9));
      WORKER_CHECK_OK(comm.send(m.p, 1000, peer, 30s));
    } else {
      WORKER_CHECK_OK(comm.recv(m.p, 1000, peer, 30s));
      std::vector<float> got = m.get(0, 1000);
      errors += diff_bits(got.data(), rank_data(peer, 1000, 9).data(), 1000, "recv");
    }
  }
  WORKER_CHECK_OK(comm.barrier(30s));
  return errors;
}

// The stream-ordered operations: enqueued on a stream of the caller's behind a kernel-free memcpy, they
// return before the data is there; sync() is what waits. Results equal the blocking collectives'.
std::string nccl_enqueue_body(int rank, int n, int fd) {
  auto made = nccl_communicator_create(rank, n, fd, "test/", 60s, {.device = rank});
  if (!made.ok()) return made.error();
  Communicator& comm = *made.value();
  cudaStream_t stream;
  cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking);
  std::string errors;
  for (size_t count : {size_t{7}, size_t{65537}, size_t{1} << 20}) {
    const std::string at = " (count " + std::to_string(count) + ")";
    std::vector<std::vector<float>> x;
    for (int r = 0; r < n; ++r) x.push_back(rank_data(r, count, 3));
    std::vector<double> sum(count, 0.0);
    for (int r = 0; r < n; ++r) {
      for (size_t i = 0; i < count; ++i) sum[i] += x[static_cast<size_t>(r)][i];
    }
    const CommBlock mine = comm_block(count, n, rank);
    DeviceFloats a(count), in(count), shard(mine.count), gathered(count);
    a.put(x[static_cast<size_t>(rank)]);
    in.put(x[static_cast<size_t>(rank)]);
    WORKER_CHECK_OK(comm.all_reduce_enqueue(a.p, count, stream));
    WORKER_CHECK_OK(comm.reduce_scatter_enqueue(in.p, shard.p, count, stream));
    WORKER_CHECK_OK(comm.sync(stream, 30s));
    std::vector<float> ra = a.get(0, count);
    errors += near(ra, sum, "all_reduce_enqueue" + at);
    std::vector<double> want_shard(sum.begin() + static_cast<std::ptrdiff_t>(mine.offset),
                                   sum.begin() + static_cast<std::ptrdiff_t>(mine.offset + mine.count));
    errors += near(shard.get(0, mine.count), want_shard, "reduce_scatter_enqueue" + at);

    // bf16 gather in place: each rank's block of 2-byte elements (their bit patterns are what matters).
    std::vector<uint16_t> all(count);
    for (size_t i = 0; i < count; ++i) all[i] = static_cast<uint16_t>((i * 2654435761u) >> 7);
    uint16_t* bf = nullptr;
    cudaMalloc(&bf, count * 2);
    cudaMemset(bf, 0, count * 2);
    cudaMemcpy(bf + mine.offset, all.data() + mine.offset, mine.count * 2, cudaMemcpyHostToDevice);
    WORKER_CHECK_OK(comm.all_gather_enqueue(bf + mine.offset, bf, count, 2, stream));
    WORKER_CHECK_OK(comm.sync(stream, 30s));
    std::vector<uint16_t> got(count);
    cudaMemcpy(got.data(), bf, count * 2, cudaMemcpyDeviceToHost);
    cudaFree(bf);
    if (got != all) errors += "all_gather_enqueue of 2-byte elements" + at + " differs\n";

    // bf16 all-reduce (tensor parallelism's): small integers, exact in bf16 and so are their sums, whose
    // bf16 bits are the top half of the float's.
    auto bf16_bits = [](float v) {
      uint32_t u = 0;
      std::memcpy(&u, &v, sizeof u);
      return static_cast<uint16_t>(u >> 16);
    };
    auto value = [](size_t i, int r) {
      return static_cast<float>(static_cast<int>((i * 7 + r * 3) % 64) - 32);
    };
    std::vector<uint16_t> mine16(count), want16(count);
    for (size_t i = 0; i < count; ++i) {
      float total = 0.0f;
      for (int r = 0; r < n; ++r) total += value(i, r);
      mine16[i] = bf16_bits(value(i, rank));
      want16[i] = bf16_bits(total);
    }
    uint16_t* sum16 = nullptr;
    cudaMalloc(&sum16, count * 2);
    cudaMemcpy(sum16, mine16.data(), count * 2, cudaMemcpyHostToDevice);
    WORKER_CHECK_OK(comm.all_reduce_bf16_enqueue(sum16, count, stream));
    WORKER_CHECK_OK(comm.sync(stream, 30s));
    cudaMemcpy(got.data(), sum16, count * 2, cudaMemcpyDeviceToHost);
    cudaFree(sum16);
    if (got != want16) errors += "all_reduce_bf16_enqueue" + at + " differs from the exact sums\n";

    // bf16 reduce-scatter in place (sequence parallelism's): this rank's block holds the exact sums there.
    if (count % static_cast<size_t>(n) == 0) {
      const size_t block = count / static_cast<size_t>(n), own = static_cast<size_t>(rank) * block;
      cudaMalloc(&sum16, count * 2);
      cudaMemcpy(sum16, mine16.data(), count * 2, cudaMemcpyHostToDevice);
      WORKER_CHECK_OK(comm.reduce_scatter_bf16_enqueue(sum16, count, stream));
      WORKER_CHECK_OK(comm.sync(stream, 30s));
      std::vector<uint16_t> block_got(block);
      cudaMemcpy(block_got.data(), sum16 + own, block * 2, cudaMemcpyDeviceToHost);
      cudaFree(sum16);
      if (block_got != std::vector<uint16_t>(want16.begin() + static_cast<std::ptrdiff_t>(own),
                                             want16.begin() + static_cast<std::ptrdiff_t>(own + block)))
        errors += "reduce_scatter_bf16_enqueue" + at + " differs from the exact sums in this rank's block\n";
    }
  }
  cudaStreamDestroy(stream);
  return errors;
}

TEST(NcclCommunicator, StreamOrderedOperationsMatchHostSums) {
  const int gpus = gpu_count();
  if (gpus < 2) GTEST_SKIP() << "needs at least two GPUs (found " << gpus << ")";
  expect_all_passed(run_workers(2, nccl_enqueue_body, 180s));
}

// Point to point on a stream (a GPU pipeline's hand-offs, cuda/backend_cuda.cu): rank 0 sends bf16 (as raw
// 16-bit words, which must arrive bit for bit) and fp32 to rank 1, which answers with each word plus one;
// every call is enqueued on one stream per rank in the order both sides agree on, the host never waits
// before sync(). Counts 1 and 2^20 + 3 (a partial last chunk). A bad element size is refused.
std::string nccl_p2p_body(int rank, int n, int fd) {
  auto made = nccl_communicator_create(rank, n, fd, "pp/", 60s, {.device = rank});
  if (!made.ok()) return made.error();
  Communicator& comm = *made.value();
  cudaStream_t stream;
  cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking);
  std::string errors;
  for (size_t count : {size_t{1}, (size_t{1} << 20) + 3}) {
    std::vector<uint16_t> words(count);
    std::vector<float> floats(count);
    for (size_t i = 0; i < count; ++i) {
      words[i] = static_cast<uint16_t>(i * 7 + 3);
      floats[i] = static_cast<float>(i) * 0.5f - 3.0f;
    }
    uint16_t* w = nullptr;
    float* f = nullptr;
    cudaMalloc(&w, count * sizeof(uint16_t));
    cudaMalloc(&f, count * sizeof(float));
    const std::string at = " (count " + std::to_string(count) + ")";
    if (rank == 0) {
      cudaMemcpy(w, words.data(), count * sizeof(uint16_t), cudaMemcpyHostToDevice);
      cudaMemcpy(f, floats.data(), count * sizeof(float), cudaMemcpyHostToDevice);
      WORKER_CHECK_OK(comm.send_enqueue(w, count, 2, 1, stream));
      WORKER_CHECK_OK(comm.send_enqueue(f, count, 4, 1, stream));
      WORKER_CHECK_OK(comm.recv_enqueue(w, count, 2, 1, stream));  // the answer, in place
    } else {
      WORKER_CHECK_OK(comm.recv_enqueue(w, count, 2, 0, stream));
      WORKER_CHECK_OK(comm.recv_enqueue(f, count, 4, 0, stream));
    }
    WORKER_CHECK_OK(comm.sync(stream, 60s));
    std::vector<uint16_t> got_w(count);
    std::vector<float> got_f(count);
    cudaMemcpy(got_w.data(), w, count * sizeof(uint16_t), cudaMemcpyDeviceToHost);
    cudaMemcpy(got_f.data(), f, count * sizeof(float), cudaMemcpyDeviceToHost);
    if (rank == 1) {
      if (got_w != words) errors += "bf16 words differ after recv_enqueue" + at + "\n";
      if (got_f != floats) errors += "floats differ after recv_enqueue" + at + "\n";
      for (uint16_t& x : got_w) ++x;
      cudaMemcpy(w, got_w.data(), count * sizeof(uint16_t), cudaMemcpyHostToDevice);
      WORKER_CHECK_OK(comm.send_enqueue(w, count, 2, 0, stream));
      WORKER_CHECK_OK(comm.sync(stream, 60s));
    } else {
      for (size_t i = 0; i < count; ++i) {
        if (got_w[i] != static_cast<uint16_t>(words[i] + 1)) {
          errors += "the answer's word " + std::to_string(i) + " is " + std::to_string(got_w[i]) + at + "\n";
          break;
        }
      }
    }
    cudaFree(w);
    cudaFree(f);
  }
  // Refusing breaks the communicator (as any failed call does): rank 0 only, after it has received the last
  // answer, so rank 1's traffic is complete.
  if (rank == 0) {
    const Status bad = comm.send_enqueue(nullptr, 1, 8, 1, stream);
    if (bad.ok() || bad.message().find("element size 8 (2 or 4)") == std::string::npos)
      errors += "element size 8 was not refused: " + bad.message() + "\n";
  }
  cudaStreamDestroy(stream);
  return errors;
}

TEST(NcclCommunicator, PointToPointOnAStreamDeliversBitForBitInOrder) {
  const int gpus = gpu_count();
  if (gpus < 2) GTEST_SKIP() << "needs at least two GPUs (found " << gpus << ")";
  expect_all_passed(run_workers(2, nccl_p2p_body, 180s));
}

TEST(NcclCommunicator, CollectivesAcrossProcessesMatchHostSums) {
  const int gpus = gpu_count();
  if (gpus < 2) GTEST_SKIP() << "needs at least two GPUs (found " << gpus << ")";
  std::vector<int> sizes = {2};
  if (std::min(gpus, 4) > 2) sizes.push_back(std::min(gpus, 4));
  for (int n : sizes) {
    SCOPED_TRACE(std::to_string(n) + " ranks");
    expect_all_passed(run_workers(n, nccl_collectives_body, 180s));
  }
}

TEST(NcclCommunicator, KilledWorkerFailsTheOthersWithinTheTimeout) {
  const int gpus = gpu_count();
  if (gpus < 2) GTEST_SKIP() << "needs at least two GPUs (found " << gpus << ")";
  const int n = std::min(gpus, 4);
  RunResult res = run_workers(
      n,
      [](int rank, int size, int fd) -> std::string {
        auto made = nccl_communicator_create(rank, size, fd, "dp/", 60s, {.device = rank});
        if (!made.ok()) return made.error();
        Communicator& comm = *made.value();
        DeviceFloats data(1 << 16);
        data.put(std::vector<float>(1 << 16, 1.0f));
        WORKER_CHECK_OK(comm.all_reduce(data.p, 1 << 16, 30s));
        if (rank == size - 1) ::raise(SIGKILL);
        auto t0 = Clock::now();
        Status st;
        for (int i = 0; i < 1000 && st.ok(); ++i) st = comm.all_reduce(data.p, 1 << 16, 5s);
        if (st.ok()) return "1000 all_reduces succeeded without the killed rank";
        if (Clock::now() - t0 > 8s) return "failure took longer than 8 s: " + st.message();
        const std::string& m = st.message();
        if (m.find("timeout") == std::string::npos && m.find("peer closed") == std::string::npos &&
            m.find("nccl") == std::string::npos) {
          return "cause: " + m;
        }
        return "";
      },
      120s);
  for (int r = 0; r + 1 < n; ++r) {
    const Outcome& o = res.workers[static_cast<size_t>(r)];
    EXPECT_TRUE(o.exited && o.code == 0) << "rank " << r << ": " << o.report;
  }
  EXPECT_EQ(res.workers[static_cast<size_t>(n - 1)].signal, SIGKILL);
}

// The watchdog (nccl_communicator.h): rank 1 never enters the collective rank 0 enqueued; rank 0 waits on
// its stream with no timeout of its own (as the backend's synchronisation does), and the watchdog's abort
// at the bound is what lets that wait return; health() then names the watchdog.
TEST(NcclCommunicator, TheWatchdogAbortsACollectiveAPeerNeverEntered) {
  const int gpus = gpu_count();
  if (gpus < 2) GTEST_SKIP() << "needs at least two GPUs (found " << gpus << ")";
  RunResult res = run_workers(
      2,
      [](int rank, int size, int fd) -> std::string {
        auto made =
            nccl_communicator_create(rank, size, fd, "dp/", 60s, {.device = rank, .watchdog_timeout = 2s});
        if (!made.ok()) return made.error();
        Communicator& comm = *made.value();
        DeviceFloats data(1 << 16);
        data.put(std::vector<float>(1 << 16, 1.0f));
        // One collective together first: NCCL connects peers lazily, on a communicator's first collective,
        // and an enqueue that must connect to a peer that never comes waits in the enqueue (bounded by the
        // communicator's own timeout), before the watchdog has anything queued to watch. A hang in training
        // comes after many collectives, as here.
        WORKER_CHECK_OK(comm.all_reduce(data.p, 1 << 16, 30s));
        if (rank == 1) {
          std::this_thread::sleep_for(20s);  // never enters again; its abort at exit ends nothing of rank 0's
          return "";
        }
        cudaStream_t stream;
        cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking);
        WORKER_CHECK_OK(comm.all_reduce_enqueue(data.p, 1 << 16, stream));
        cudaStreamSynchronize(stream);  // returns once the watchdog has aborted the communicator
        const Status h = comm.health();
        if (h.ok()) return "the stuck collective ended but health() is ok";
        if (h.message().find("nccl watchdog") == std::string::npos) return "health: " + h.message();
        if (comm.sync(stream, 5s).ok()) return "sync() after the watchdog's abort succeeded";
        return "";
      },
      120s);
  for (const Outcome& o : res.workers) EXPECT_TRUE(o.exited && o.code == 0) << o.report;
}

}  // namespace
}  // namespace gantry
