// All-reduce bandwidth through Gantry's own NCCL communicator (benchmark, not a test; issue 18): N worker
// processes on one host, one GPU each, meet through a StoreServer served by this parent (the launcher's
// role, as `gantry-engine run` does) and all-reduce fp32 buffers with all_reduce_enqueue on a stream of
// their own, as the CUDA backend reduces its gradient buckets. Sizes, warm-up and iteration count match
// ../shared/bench/torch_allreduce.py (1 MiB .. 1 GiB in powers of 4, 5 warm-up, 20 timed, wall clock from
// the first enqueue to the stream drained) plus the engine's default bucket (25 MiB), so the two print
// comparable JSON lines: bytes, time_us, algbw_GBps, busbw_GBps (nccl-tests' busbw = algbw * 2(n-1)/n),
// gpus, gpu. Extra fields: gpu_time_us (CUDA events around the same iterations), comm_sync_time_us (the
// same iterations waited for with Communicator::sync, the engine's own completion path, whose polling
// back-off shows at small sizes) and wrong (elements off after one checked all-reduce, nccl-tests' #wrong;
// -1: not checked).
// With --step, one more line: GPT-2 124M's ZeRO-0 gradient buckets (shard_plan_make, --bucket-mb) reduced
// back to back in the backward pass's order, as one step enqueues them.
//
//   NCCL_NVLS_ENABLE=0 allreduce_bench --nproc 4 [--sizes 1048576,26214400] [--iters 20] [--warmup 5]
//                                      [--bucket-mb 25] [--step] [--timeout-s 300]
#include <cuda_runtime.h>  // device buffers, streams and events in the workers only: the parent never touches CUDA
#include <nccl.h>          // ncclGetVersion, for the record
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "engine/core/comm/communicator.h"
#include "engine/core/comm/nccl_communicator.h"
#include "engine/core/comm/store_server.h"
#include "engine/core/config.h"
#include "engine/core/gpt.h"
#include "engine/core/parallel/shard_plan.h"

namespace gantry {
namespace {

using Clock = std::chrono::steady_clock;

struct Options {
  int nproc = 0;
  std::vector<size_t> sizes;  // bytes
  int iters = 20;
  int warmup = 5;
  double bucket_mb = 25;
  bool step = false;
  int timeout_s = 300;
};

// torch_allreduce.py's sizes (1 << 20 .. 1 << 30, powers of 4) and the engine's bucket, ascending.
std::vector<size_t> default_sizes(double bucket_mb) {
  std::vector<size_t> s;
  for (int p = 20; p <= 30; p += 2) s.push_back(size_t{1} << p);
  s.push_back(static_cast<size_t>(bucket_mb * (1 << 20)) / 4 * 4);
  std::sort(s.begin(), s.end());
  s.erase(std::unique(s.begin(), s.end()), s.end());
  return s;
}

const char* kUsage =
    "usage: allreduce_bench --nproc N [--sizes BYTES,BYTES,...] [--iters 20] [--warmup 5] [--bucket-mb 25] "
    "[--step] [--timeout-s 300]\n";

// "" when the arguments are good, else what is wrong and what would be right.
std::string parse(int argc, char** argv, Options& o) {
  bool sizes_given = false;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--step") {
      o.step = true;
      continue;
    }
    if (a == "--help" || a == "-h") return "";
    if (i + 1 >= argc) return a + " needs a value";
    const std::string v = argv[++i];
    char* end = nullptr;
    if (a == "--nproc" || a == "--iters" || a == "--warmup" || a == "--timeout-s") {
      const long n = std::strtol(v.c_str(), &end, 10);
      if (*end != '\0' || n < (a == "--warmup" ? 0 : 1) || n > 1000000)
        return a + " = \"" + v + "\": expected a whole number >= " + (a == "--warmup" ? "0" : "1");
      (a == "--nproc"    ? o.nproc
       : a == "--iters"  ? o.iters
       : a == "--warmup" ? o.warmup
                         : o.timeout_s) = static_cast<int>(n);
    } else if (a == "--bucket-mb") {
      o.bucket_mb = std::strtod(v.c_str(), &end);
      if (*end != '\0' || !(o.bucket_mb > 0 && o.bucket_mb <= 4096))
        return "--bucket-mb = \"" + v + "\": expected MiB in (0, 4096]";
    } else if (a == "--sizes") {
      sizes_given = true;
      size_t pos = 0;
      while (pos <= v.size()) {
        const size_t comma = std::min(v.find(',', pos), v.size());
        const std::string item = v.substr(pos, comma - pos);
        const unsigned long long b = std::strtoull(item.c_str(), &end, 10);
        if (item.empty() || *end != '\0' || b < 4 || b % 4 != 0 || b > (size_t{16} << 30))
          return "--sizes item \"" + item + "\": expected bytes, a multiple of 4 (fp32), 4 .. 16 GiB";
        o.sizes.push_back(static_cast<size_t>(b));
        pos = comma + 1;
      }
    } else {
      return "unknown argument " + a;
    }
  }
  if (o.nproc < 1) return "--nproc N is required (one worker process per GPU)";
  if (!sizes_given) o.sizes = default_sizes(o.bucket_mb);
  return "";
}

std::string cuda_text(const char* what, cudaError_t e) {
  return std::string(what) + ": " + cudaGetErrorString(e);
}

#define BENCH_CUDA(expr)                                                         \
  do {                                                                           \
    if (cudaError_t e_ = (expr); e_ != cudaSuccess) return cuda_text(#expr, e_); \
  } while (0)
#define BENCH_OK(expr)                                                                  \
  do {                                                                                  \
    if (Status st_ = (expr); !st_.ok()) return std::string(#expr ": ") + st_.message(); \
  } while (0)

// x_r[i] = (r + 1) * (1 + i % 7): small integers, so the sum over ranks is exact in fp32 and checkable.
float pattern(int rank, size_t i) {
  return static_cast<float>((rank + 1) * (1 + static_cast<int>(i % 7)));
}

struct Timing {
  double wall_us = 0, gpu_us = 0, sync_us = 0;  // per iteration
};

// Enqueues `iters` rounds of `enqueue_round` and times them three ways (see the file's note).
template <class Round>
std::string time_rounds(Communicator& comm, cudaStream_t stream, int warmup, int iters, Round&& round,
                        Timing& t) {
  for (int i = 0; i < warmup; ++i) BENCH_OK(round());
  BENCH_CUDA(cudaStreamSynchronize(stream));
  cudaEvent_t e0, e1;
  BENCH_CUDA(cudaEventCreate(&e0));
  BENCH_CUDA(cudaEventCreate(&e1));
  // torch_allreduce.py's method: wall clock from the first launch to the device drained.
  auto t0 = Clock::now();
  BENCH_CUDA(cudaEventRecord(e0, stream));
  for (int i = 0; i < iters; ++i) BENCH_OK(round());
  BENCH_CUDA(cudaEventRecord(e1, stream));
  BENCH_CUDA(cudaStreamSynchronize(stream));
  t.wall_us = std::chrono::duration<double, std::micro>(Clock::now() - t0).count() / iters;
  float ms = 0;
  BENCH_CUDA(cudaEventElapsedTime(&ms, e0, e1));
  t.gpu_us = 1e3 * ms / iters;
  // The engine's path: Communicator::sync polls the stream with a growing back-off.
  t0 = Clock::now();
  for (int i = 0; i < iters; ++i) BENCH_OK(round());
  BENCH_OK(comm.sync(stream, std::chrono::seconds(120)));
  t.sync_us = std::chrono::duration<double, std::micro>(Clock::now() - t0).count() / iters;
  cudaEventDestroy(e0);
  cudaEventDestroy(e1);
  return "";
}

void print_line(const char* what, size_t bytes, const Timing& t, int n, const std::string& gpu,
                long long wrong, const std::string& extra) {
  const double algbw = static_cast<double>(bytes) / (t.wall_us * 1e-6) / 1e9;
  const double busbw = algbw * 2.0 * (n - 1) / n;
  std::printf(
      "{\"bench\": \"allreduce_bench\", \"what\": \"%s\", \"bytes\": %zu, \"time_us\": %.1f, \"algbw_GBps\": "
      "%.1f, \"busbw_GBps\": %.1f, \"gpus\": %d, \"gpu\": \"%s\", \"gpu_time_us\": %.1f, "
      "\"comm_sync_time_us\": %.1f, \"wrong\": %lld, \"dtype\": \"fp32\", \"comm\": \"gantry nccl "
      "all_reduce_enqueue\"%s}\n",
      what, bytes, t.wall_us, algbw, busbw, n, gpu.c_str(), t.gpu_us, t.sync_us, wrong, extra.c_str());
  std::fflush(stdout);
}

// One worker: "" when every size ran, else what failed.
std::string worker(int rank, int n, int fd, const Options& o) {
  auto made =
      nccl_communicator_create(rank, n, fd, "allreduce_bench/", std::chrono::seconds(120), {.device = rank});
  if (!made.ok()) return made.error();
  Communicator& comm = *made.value();
  cudaDeviceProp prop;
  BENCH_CUDA(cudaGetDeviceProperties(&prop, rank));
  const std::string gpu = prop.name;
  cudaStream_t stream;
  BENCH_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  int nccl_version = 0;  // for the record: the library the communicator was linked against
  ncclGetVersion(&nccl_version);
  const std::string version = ", \"nccl\": " + std::to_string(nccl_version);

  size_t largest = *std::max_element(o.sizes.begin(), o.sizes.end());
  ShardPlan plan;
  if (o.step) {
    ModelConfig m{.n_layer = 12, .n_head = 12, .n_embd = 768, .vocab_size = 50304, .seq_len = 1024};
    plan = shard_plan_make(gpt_param_table(m), n, rank, /*zero=*/0,
                           static_cast<size_t>(o.bucket_mb * (1 << 20)));
    largest = std::max(largest, plan.numel * sizeof(float));
  }
  float* buf = nullptr;
  BENCH_CUDA(cudaMalloc(&buf, largest));

  for (size_t bytes : o.sizes) {
    const size_t count = bytes / sizeof(float);
    BENCH_CUDA(cudaMemsetAsync(buf, 0, bytes, stream));  // zeros: sums stay finite over the timed rounds
    Timing t;
    std::string err = time_rounds(
        comm, stream, o.warmup, o.iters, [&] { return comm.all_reduce_enqueue(buf, count, stream); }, t);
    if (!err.empty()) return err;
    // Checked once: a known pattern in, the exact sum expected out on every element.
    std::vector<float> host(count);
    for (size_t i = 0; i < count; ++i) host[i] = pattern(rank, i);
    BENCH_CUDA(cudaMemcpyAsync(buf, host.data(), bytes, cudaMemcpyHostToDevice, stream));
    BENCH_OK(comm.all_reduce_enqueue(buf, count, stream));
    BENCH_CUDA(cudaMemcpyAsync(host.data(), buf, bytes, cudaMemcpyDeviceToHost, stream));
    BENCH_OK(comm.sync(stream, std::chrono::seconds(120)));
    long long wrong = 0;
    const int ranks_sum = n * (n + 1) / 2;
    for (size_t i = 0; i < count; ++i) {
      if (host[i] != static_cast<float>(ranks_sum * (1 + static_cast<int>(i % 7)))) ++wrong;
    }
    if (rank == 0) print_line("size", bytes, t, n, gpu, wrong, version);
  }

  if (o.step) {
    // The backward pass completes buckets from the top of the model down: the last flat bucket first, the
    // embeddings' (flat bucket 0) last.
    BENCH_CUDA(cudaMemsetAsync(buf, 0, plan.numel * sizeof(float), stream));
    auto round = [&]() -> Status {
      for (auto b = plan.buckets.rbegin(); b != plan.buckets.rend(); ++b) {
        if (Status s = comm.all_reduce_enqueue(buf + b->offset, b->count, stream); !s.ok()) return s;
      }
      return {};
    };
    Timing t;
    std::string err = time_rounds(comm, stream, o.warmup, o.iters, round, t);
    if (!err.empty()) return err;
    if (rank == 0) {
      char extra[240];
      std::snprintf(extra, sizeof extra,
                    "%s, \"model\": \"124m\", \"zero\": 0, \"bucket_mb\": %g, \"buckets\": %zu, "
                    "\"largest_bucket_bytes\": %zu",
                    version.c_str(), o.bucket_mb, plan.buckets.size(),
                    std::max_element(
                        plan.buckets.begin(), plan.buckets.end(),
                        [](const FlatRange& a, const FlatRange& b) {
                          return a.count < b.count;
                        })->count *
                        sizeof(float));
      print_line("step_buckets", plan.numel * sizeof(float), t, n, gpu, -1, extra);
    }
  }
  BENCH_OK(comm.barrier(std::chrono::seconds(60)));
  cudaFree(buf);
  cudaStreamDestroy(stream);
  return "";
}

}  // namespace
}  // namespace gantry

int main(int argc, char** argv) {
  using namespace gantry;
  Options o;
  if (std::string err = parse(argc, argv, o); !err.empty() || argc < 2) {
    std::fprintf(stderr, "allreduce_bench: %s\n%s", err.empty() ? "arguments missing" : err.c_str(), kUsage);
    return 2;
  }
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--help") == 0 || std::strcmp(argv[i], "-h") == 0) {
      std::printf("%s", kUsage);
      return 0;
    }
  }
  // NVLink SHARP (NVLS) is left off on the lent machines; an explicit setting of the caller's wins.
  setenv("NCCL_NVLS_ENABLE", "0", /*overwrite=*/0);

  // One socket pair per worker: the worker keeps one end for the store, the parent serves the other.
  std::vector<pid_t> pids;
  std::vector<int> parent_ends;
  for (int r = 0; r < o.nproc; ++r) {
    int sp[2];
    if (::socketpair(AF_UNIX, SOCK_STREAM, 0, sp) != 0) {
      std::perror("allreduce_bench: socketpair");
      return 1;
    }
    std::fflush(stdout);
    const pid_t pid = ::fork();
    if (pid == 0) {
      for (int fd : parent_ends) ::close(fd);
      ::close(sp[0]);
      std::string err = worker(r, o.nproc, sp[1], o);
      if (!err.empty()) std::fprintf(stderr, "allreduce_bench rank %d: %s\n", r, err.c_str());
      std::fflush(stdout);
      std::fflush(stderr);
      ::_exit(err.empty() ? 0 : 1);
    }
    ::close(sp[1]);
    if (pid < 0) {
      std::perror("allreduce_bench: fork");
      ::close(sp[0]);
      break;
    }
    pids.push_back(pid);
    parent_ends.push_back(sp[0]);
  }

  StoreServer server;
  for (size_t r = 0; r < parent_ends.size(); ++r)
    server.add_client(parent_ends[r], "rank " + std::to_string(r));
  const auto deadline = Clock::now() + std::chrono::seconds(o.timeout_s);
  std::vector<bool> reaped(pids.size(), false);
  size_t alive = pids.size();
  int failed = pids.size() == static_cast<size_t>(o.nproc) ? 0 : 1;
  while (alive > 0 && Clock::now() < deadline) {
    if (Status st = server.poll_once(std::chrono::milliseconds(20)); !st.ok()) {
      std::fprintf(stderr, "allreduce_bench: store: %s\n", st.message().c_str());
      break;
    }
    server.take_gone();  // a worker that exits closes its end; its exit status says how it went
    for (size_t r = 0; r < pids.size(); ++r) {
      int status = 0;
      if (reaped[r] || ::waitpid(pids[r], &status, WNOHANG) != pids[r]) continue;
      reaped[r] = true;
      --alive;
      if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
        std::fprintf(stderr, "allreduce_bench: rank %zu %s %d\n", r,
                     WIFEXITED(status) ? "exited with" : "died of signal",
                     WIFEXITED(status) ? WEXITSTATUS(status) : WTERMSIG(status));
        failed = 1;
      }
    }
    // A gang with a failed rank cannot finish its collectives: end the others now rather than at the timeout.
    if (failed) break;
  }
  for (size_t r = 0; r < pids.size(); ++r) {
    if (reaped[r]) continue;
    if (failed)
      std::fprintf(stderr, "allreduce_bench: rank %zu killed: its gang has a failed rank\n", r);
    else
      std::fprintf(stderr, "allreduce_bench: rank %zu still running after --timeout-s %d: killed\n", r,
                   o.timeout_s);
    ::kill(pids[r], SIGKILL);
    int status = 0;
    ::waitpid(pids[r], &status, 0);
    failed = 1;
  }
  return failed;
}
