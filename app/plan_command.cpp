// gantry-engine plan: the what-if planner (engine/plan) on the command line. One layout: memory by bucket,
// communication per axis, bubble, step time, MFU/HFU, days to train, checkpoint and goodput, as a table or
// (--json) one JSON object. --search: every valid layout ranked, the top N as a table or a JSON object.
//
//   gantry-engine plan --model gpt3-175b --gpu a100-80gb --gpus 1024 --tp 8 --pp 16 --vp 2 --recompute full
//   gantry-engine plan --model llama3-70b --gpu h100 --gpus 512 --search --top 5
#include <unistd.h>  // sysconf: the host's memory, which gantry-cpu's `fits` compares with

#include <CLI/CLI.hpp>
#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <nlohmann/json.hpp>  // --json
#include <random>
#include <string>
#include <thread>  // hardware_concurrency: gantry-cpu's cores
#include <vector>

#include "app/commands.h"
#include "engine/core/backend.h"
#include "engine/core/config.h"       // --config: the model and batch of a training config
#include "engine/core/cpu/ops_cpu.h"  // --measure-cpu runs the CPU backend's own loops
#include "engine/core/cpu/thread_pool.h"
#include "engine/plan/memory.h"
#include "engine/plan/planner.h"
#include "telemetry/clock.h"  // thread_cpu_s: --measure-cpu with one thread
#ifdef GANTRY_HAVE_GLOO
#include <sys/socket.h>  // socketpair: the two measuring ranks' ends of the store

#include <atomic>
#include <thread>

#include "engine/core/comm/gloo_communicator.h"  // --measure-cpu times the CPU backend's collectives
#include "engine/core/comm/store_server.h"
#endif
#include "engine/plan/search.h"

namespace gantry {
namespace {

constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;

struct PlanArgs {
  std::string config;  // a training config: its model, micro-batch, global batch, backend and threads
  std::string engine;  // generic, gantry-cpu, gantry-cuda; empty = generic, or gantry-<backend> with --config
  bool measure_cpu = false;
  int threads = 0;    // gantry-cpu: the backend's threads; 0 = all cores (or the config's train.threads)
  int cpu_cores = 0;  // gantry-cpu: the host's cores its ranks share; 0 = this machine's
  double cpu_background = -1;  // gantry-cpu: other runnable threads on the host; -1 = 0, or sampled
  double tp_overlap = 0;

  std::string model = "gpt2-124m";
  int layers = 0, hidden = 0, heads = 0, kv_heads = -1, ffn = -1, vocab = 0, seq = 0;
  std::string ffn_kind;
  bool untied = false;
  bool dropout = false;

  std::string gpu = "h100";
  int gpus = 0;   // 0 = 8, or 1 with an engine profile
  int nodes = 0;  // > 0: gpus = nodes × gpus_per_node
  int gpus_per_node = 8;
  bool gpus_per_node_default = true;                    // --gpus-per-node not given
  double intra_gbps = 0, inter_gbps = 0;                // 0 = the GPU's links at kLinkEfficiency
  double intra_latency_us = -1, inter_latency_us = -1;  // -1 = the defaults
  double node_mtbf_hours = -1;                          // -1 = the default; 0 = no failures
  double efficiency = 0;                                // 0 = the GPU's calibrated value

  int tp = 1, pp = 1, vp = 1, dp = 0, cp = 1, zero = 0, hsdp = 0;
  int micro_batch = 0;  // 0 = the config's, or 1
  bool no_sp = false, no_flash = false;
  std::string recompute = "none";
  std::string schedule = "1f1b";
  bool schedule_given = false;  // --schedule on the command line (else a config's train.pp_schedule)
  long long global_batch = 0, global_batch_tokens = 0;
  double tokens = 0;
  std::string grad_dtype = "bf16";
  double ckpt_bytes_per_param = 12, ckpt_write_gbps = 0, restart_minutes = 10;
  std::string mfu_convention = "gantry";

  bool search = false;
  int top = 10;
  std::string rank = "tokens";
  bool json = false;
};

// "1,234,567"
std::string grouped(uint64_t v) {
  std::string s = std::to_string(v);
  for (int i = static_cast<int>(s.size()) - 3; i > 0; i -= 3) s.insert(static_cast<size_t>(i), ",");
  return s;
}

std::string human_bytes(double b) {
  char buf[32];
  if (b >= 1e12)
    std::snprintf(buf, sizeof buf, "%.2f TB", b / 1e12);
  else if (b >= 1e9)
    std::snprintf(buf, sizeof buf, "%.2f GB", b / 1e9);
  else
    std::snprintf(buf, sizeof buf, "%.1f MB", b / 1e6);
  return buf;
}

std::string human_seconds(double s) {
  char buf[32];
  if (s >= 3600)
    std::snprintf(buf, sizeof buf, "%.1f h", s / 3600);
  else if (s >= 120)
    std::snprintf(buf, sizeof buf, "%.1f min", s / 60);
  else if (s >= 1)
    std::snprintf(buf, sizeof buf, "%.2f s", s);
  else
    std::snprintf(buf, sizeof buf, "%.2f ms", s * 1e3);
  return buf;
}

std::string human_days(double days) {
  char buf[32];
  if (days >= 1)
    std::snprintf(buf, sizeof buf, "%.1f days", days);
  else
    std::snprintf(buf, sizeof buf, "%.1f hours", days * 24);
  return buf;
}

// Planner messages start with the field ("tp = 3: ..."); name the flag the user typed instead.
std::string flag_message(std::string msg) {
  static const std::pair<const char*, const char*> kFields[] = {{"micro_batch", "--micro-batch"},
                                                                {"global_batch", "--global-batch"},
                                                                {"gpus_per_node", "--gpus-per-node"},
                                                                {"gpus", "--gpus"},
                                                                {"tp", "--tp"},
                                                                {"pp", "--pp"},
                                                                {"vp", "--vp"},
                                                                {"dp", "--dp"},
                                                                {"cp", "--cp"},
                                                                {"zero", "--zero"},
                                                                {"hsdp", "--hsdp"},
                                                                {"model.layers", "--layers"},
                                                                {"model.hidden", "--hidden"},
                                                                {"model.heads", "--heads"},
                                                                {"model.kv_heads", "--kv-heads"},
                                                                {"model.ffn", "--ffn"},
                                                                {"model.vocab", "--vocab"},
                                                                {"model.seq", "--seq"}};
  for (const auto& [field, flag] : kFields) {
    const std::string f = std::string(field) + " = ";
    if (msg.rfind(f, 0) == 0) return std::string(flag) + " " + msg.substr(f.size());
  }
  return msg;
}

// Wall-clock seconds, or with `cpu` the calling thread's CPU seconds: with one thread that is the time the
// work takes on a machine others share, without the time slices they take (and copies run side by side).
double seconds_now(bool cpu) {
  return cpu ? thread_cpu_s() : monotonic_s();
}

// The median of 7 runs (after one to warm the caches). Not the fastest: the step times this predicts are
// medians too, and on a shared machine the fastest run is one the others happened to leave alone, which
// the typical step is not.
template <class F>
double median_seconds(bool cpu, F&& f) {
  f();
  std::vector<double> t;
  for (int r = 0; r < 7; ++r) {
    const double t0 = seconds_now(cpu);
    f();
    t.push_back(seconds_now(cpu) - t0);
  }
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

// The CPU backend's collectives (gloo_communicator.h: rings over loopback TCP), timed among n ranks of this
// process (n threads, a store served by another; n = the plan's largest group on this host, at least 2, so
// that n ranks on fewer cores wait for each other's threads as the run's do): all-reduces of 1 KiB (mean
// of 21) and of 8 MiB (median of 5), fitted to the planner's ring model t = 2(n-1)·latency +
// S·2(n-1)/n / bw. Wall clock: the time includes each rank waiting for the others' threads to be
// scheduled, as a run's does. Where Gloo is not built in, the rates keep the developer VM's defaults.
void measure_gloo(CpuRates* r, int n) {
#ifdef GANTRY_HAVE_GLOO
  n = std::max(2, n);
  const size_t nn = static_cast<size_t>(n);
  constexpr size_t kSmall = 256, kLarge = 2 * 1024 * 1024;  // floats
  constexpr int kSmallIters = 21, kLargeIters = 5;
  double cpu_small = 0, cpu_large = 0;  // the process's CPU seconds over each series (rank 0 reads them)
  std::vector<std::array<int, 2>> sp(nn);
  for (auto& p : sp) {
    if (::socketpair(AF_UNIX, SOCK_STREAM, 0, p.data()) != 0) return;
  }
  StoreServer server;
  for (int k = 0; k < n; ++k) server.add_client(sp[static_cast<size_t>(k)][0], "rank " + std::to_string(k));
  std::vector<double> small_s(nn, 0), large_s(nn, 0);
  std::vector<char> failed(nn, 0);
  auto rank = [&](int k) {
    Result<std::unique_ptr<Communicator>> c =
        gloo_communicator_create(k, n, sp[static_cast<size_t>(k)][1], "measure/", std::chrono::seconds(10));
    if (!c.ok()) {
      failed[static_cast<size_t>(k)] = 1;
      return;
    }
    std::vector<float> buf(kLarge, 1.0f);
    // Rank 0 also reads the process's CPU time from the end of the first (warm-up) all-reduce, which the
    // ranks leave together, to the end of the last: every rank's work, their kernel's and Gloo's threads'.
    auto time = [&](size_t count, int iters, double* cpu) {
      std::vector<double> t;
      double c0 = 0;
      for (int i = 0; i < iters + 1; ++i) {
        const double t0 = seconds_now(false);
        if (!c.value()->all_reduce(buf.data(), count, std::chrono::seconds(10)).ok()) {
          failed[static_cast<size_t>(k)] = 1;
        }
        if (i > 0) t.push_back(seconds_now(false) - t0);
        if (i == 0) c0 = process_cpu_s();
      }
      if (k == 0) *cpu = process_cpu_s() - c0;
      std::sort(t.begin(), t.end());
      return t;
    };
    // The small one's mean, not its median: on a busy machine a wake-up either finds a core (~0.1 ms) or
    // waits for a scheduler tick (4-6 ms), and a step's many collectives add up to their mean.
    const std::vector<double> small = time(kSmall, kSmallIters, &cpu_small),
                              large = time(kLarge, kLargeIters, &cpu_large);
    double sum = 0;
    for (double v : small) sum += v;
    small_s[static_cast<size_t>(k)] = sum / static_cast<double>(small.size());
    large_s[static_cast<size_t>(k)] = large[large.size() / 2];
  };
  std::vector<std::thread> ranks;
  for (int k = 0; k < n; ++k) ranks.emplace_back(rank, k);
  // Serve the store until every rank is connected and done (they never talk to it after the rendezvous).
  std::atomic<bool> done{false};
  std::thread joiner([&] {
    for (std::thread& t : ranks) t.join();
    done = true;
    server.wake();
  });
  while (!done) (void)server.poll_once(std::chrono::milliseconds(20));
  joiner.join();
  for (auto& p : sp) ::close(p[1]);
  for (char f : failed) {
    if (f) return;
  }
  const double small = *std::max_element(small_s.begin(), small_s.end()),
               large = *std::max_element(large_s.begin(), large_s.end());
  const double bytes_small = kSmall * sizeof(float), bytes_large = kLarge * sizeof(float);
  const double steps = 2.0 * (n - 1), factor = steps / n;  // ring steps; bytes a rank sends per byte
  // On a loaded machine the small all-reduce's wake-ups can outlast the large one's copy: then only the
  // latency is fitted, at the bandwidth the rates already hold.
  if (large > small) r->comm_bw = (bytes_large - bytes_small) * factor / (large - small);
  r->comm_latency_s = std::max(0.0, (small - bytes_small * factor / r->comm_bw) / steps);
  // The host CPU per ring step and per byte sent: the small series is all steps (each rank's 2(n-1) an
  // all-reduce); the large one's remainder is the 2(n-1)/n·S bytes each rank sends.
  r->comm_cpu_step_s = std::max(0.0, cpu_small / (n * steps * kSmallIters));
  const double large_each = cpu_large / (n * kLargeIters);  // one rank's all-reduce
  r->comm_cpu_byte_s = std::max(0.0, (large_each - steps * r->comm_cpu_step_s) / (bytes_large * factor));
  r->comm_ranks = n;
#else
  (void)r;
  (void)n;
#endif
}

// Other work on this host right now, as the count of busy threads that would leave one thread of ours the
// share of a core it gets: a 0.3 s loop of real arithmetic timed by this thread's CPU time and by the wall
// clock; share = CPU / wall, and with K cores shared fairly, K / (background + 1) = share. A thread that
// gets a whole core says nothing of up to K − 1 busy threads beside it: 0 then.
double measure_background_threads(int cores) {
  std::vector<float> x(64 * 1024, 1.0f);
  volatile float sink = 0;
  const double w0 = seconds_now(false), c0 = thread_cpu_s();
  while (seconds_now(false) - w0 < 0.3) {
    float acc = 0;
    for (float v : x) acc += v * 1.0001f;
    sink = sink + acc;
  }
  const double share = (thread_cpu_s() - c0) / (seconds_now(false) - w0);
  if (!(share > 0) || share >= 0.97 || cores < 1) return 0;
  return std::max(0.0, cores / share - 1);
}

// The shapes --measure-cpu times the CPU backend's loops at: the plan's own model, micro-batch and tp split.
// A loop's rate depends on its shape (on the developer VM a matmul whose dot products are 64 long runs at
// half the FLOP rate of one 128 long), so rates taken at other shapes mis-price a model by up to 2x. Rows,
// output columns and attention heads are cut down where the model is large (a row's cost does not depend
// on how many rows there are), so that a GPT-2-sized plan still measures in about a second.
struct LoopShapes {
  int rows = 0;   // micro_batch · seq, capped
  int c = 0;      // the width (whole: the LayerNorms and the row-parallel products' outputs)
  int heads = 0;  // this rank's heads
  int seq = 0, micro = 0, layers = 0;
  int vocab = 0;  // this rank's vocabulary rows
  int tp = 1;
};

LoopShapes loop_shapes(const PlanModel& m, int micro_batch, int tp) {
  LoopShapes s;
  s.c = m.hidden;
  s.tp = std::max(1, tp);
  s.heads = std::max(1, m.heads / s.tp);
  s.seq = m.seq;
  s.micro = std::max(1, micro_batch);
  s.layers = m.layers;
  s.vocab = std::max(1, m.vocab / s.tp);
  // About 64 MFLOP for the widest block product.
  const double widest = static_cast<double>(s.c) * std::max(4 * s.c / s.tp, s.c);
  s.rows = static_cast<int>(std::clamp(32e6 / widest, 16.0, static_cast<double>(s.micro) * s.seq));
  return s;
}

// The matmuls, attention, GELU, LayerNorm and softmax loops of one micro-batch at `at`, each rate the
// model's mix of its shapes (Σ FLOPs / Σ seconds, each block product counted once a layer).
void measure_loop_rates(ThreadPool* pool, bool cpu_clock, const LoopShapes& at, CpuRates* r) {
  std::mt19937 gen(1);
  std::uniform_real_distribution<float> u(-0.1f, 0.1f);
  auto values = [&](size_t n) {
    std::vector<float> v(n);
    for (float& x : v) x = u(gen);
    return v;
  };
  const int n = at.rows, c = at.c, tp = at.tp;
  {
    // (inputs, outputs, times a step): QKV and MLP-up column-parallel, the projections row-parallel, the
    // logits over this rank's vocabulary (at most 8192 rows of it: each output column costs the same).
    const int blocks = at.layers;
    const std::array<std::array<int, 3>, 5> products = {{{c, 3 * c / tp, blocks},
                                                         {c / tp, c, blocks},
                                                         {c, 4 * c / tp, blocks},
                                                         {4 * c / tp, c, blocks},
                                                         {c, std::min(at.vocab, 8192), 1}}};
    double flops = 0, dot_s = 0, axpy_s = 0;
    for (const auto& [in, out, times] : products) {
      auto x = values(static_cast<size_t>(n) * in), w = values(static_cast<size_t>(out) * in),
           b = values(static_cast<size_t>(out));
      auto y = values(static_cast<size_t>(n) * out), dx = values(x.size()), dw = values(w.size()),
           db = values(static_cast<size_t>(out));
      flops += times * 2.0 * n * in * out;
      dot_s += times * median_seconds(cpu_clock, [&] {
                 matmul_forward(pool, y.data(), x.data(), w.data(), b.data(), n, in, out);
               });
      axpy_s +=
          times * median_seconds(cpu_clock, [&] {
            matmul_backward(pool, dx.data(), dw.data(), db.data(), y.data(), x.data(), w.data(), n, in, out);
          });
    }
    r->dot_flops = flops / dot_s;
    r->axpy_flops = 2 * flops / axpy_s;
  }
  {
    // Attention over whole sequences: fewer of them (sequences, then heads) where there are many.
    const int hs = c / std::max(1, at.heads * tp);
    const double per_head = 12.0 * hs * at.seq * (at.seq + 1) / 2;
    int b = at.micro, nh = at.heads;
    while (b > 1 && b * nh * per_head > 200e6) --b;
    while (nh > 1 && b * nh * per_head > 200e6) --nh;
    const int ch = nh * hs;  // the heads' width
    auto qkv = values(static_cast<size_t>(b) * at.seq * 3 * ch),
         att = values(static_cast<size_t>(b) * nh * at.seq * at.seq);
    auto out = values(static_cast<size_t>(b) * at.seq * ch), dqkv = values(qkv.size());
    r->attention_flops =
        b * nh * per_head / median_seconds(cpu_clock, [&] {
          attention_forward(pool, out.data(), att.data(), qkv.data(), b, at.seq, ch, nh);
          attention_backward(pool, dqkv.data(), out.data(), qkv.data(), att.data(), b, at.seq, ch, nh);
        });
  }
  {
    const size_t e = static_cast<size_t>(n) * 4 * c / tp;
    auto x = values(e), y = values(e), dx = values(e);
    r->gelu_elements = static_cast<double>(e) / median_seconds(cpu_clock, [&] {
                         gelu_forward(y.data(), x.data(), e);
                         gelu_backward(dx.data(), x.data(), y.data(), e);
                       });
  }
  {
    auto x = values(static_cast<size_t>(n) * c), y = values(x.size()), dx = values(x.size());
    auto w = values(c), b = values(c), dw = values(c), db = values(c), mean = values(n), rstd = values(n);
    r->layernorm_elements =
        static_cast<double>(n) * c / median_seconds(cpu_clock, [&] {
          layernorm_forward(y.data(), mean.data(), rstd.data(), x.data(), w.data(), b.data(), n, c);
          layernorm_backward(dx.data(), dw.data(), db.data(), y.data(), x.data(), w.data(), mean.data(),
                             rstd.data(), n, c);
        });
  }
  {
    const int v = at.vocab;
    auto logits = values(static_cast<size_t>(n) * v), probs = values(logits.size()),
         dl = values(logits.size());
    auto losses = values(n);
    std::vector<int32_t> targets(n);
    for (int i = 0; i < n; ++i) targets[i] = static_cast<int32_t>(gen() % v);
    r->softmax_elements =
        static_cast<double>(n) * v / median_seconds(cpu_clock, [&] {
          softmax_crossentropy_forward(pool, probs.data(), losses.data(), logits.data(), targets.data(), n,
                                       v);
          softmax_crossentropy_backward(pool, dl.data(), probs.data(), targets.data(), 1.0f, n, v);
        });
  }
}

// --measure-cpu: the CPU backend's loops timed at the plan's shapes (above), with as many copies running
// at once as the plan has ranks on this host's cores (at most one a core), each on its own thread and
// data: ranks sharing a machine share its caches and memory bandwidth, and a rank's loops are slower
// beside the others' than alone. Each rate is the median over the copies. With one thread the loops are
// timed by the thread's CPU time, so the rates do not depend on what else the machine runs; with more,
// by the wall clock (and one copy).
CpuRates measure_cpu_rates(int threads, const LoopShapes& at, int ranks_here, int comm_ranks) {
  ThreadPool pool(threads);
  const bool cpu_clock = pool.threads() == 1;
  CpuRates r;
  r.threads = pool.threads();
  // Gloo's figures start as the defaults: measure_gloo keeps them where it cannot time a collective.
  const CpuRates defaults = plan_cpu_rates_default(r.threads);
  r.comm_latency_s = defaults.comm_latency_s;
  r.comm_bw = defaults.comm_bw;
  r.comm_cpu_step_s = defaults.comm_cpu_step_s;
  r.comm_cpu_byte_s = defaults.comm_cpu_byte_s;
  const unsigned hw = std::max(1u, std::thread::hardware_concurrency());
  const int copies = cpu_clock ? std::clamp(ranks_here, 1, static_cast<int>(hw)) : 1;
  std::vector<CpuRates> each(static_cast<size_t>(copies));
  {
    std::vector<std::thread> others;
    for (int k = 1; k < copies; ++k) {
      others.emplace_back([&, k] {
        ThreadPool own(1);
        measure_loop_rates(&own, true, at, &each[static_cast<size_t>(k)]);
      });
    }
    measure_loop_rates(&pool, cpu_clock, at, &each[0]);
    for (std::thread& t : others) t.join();
  }
  auto median = [&](double CpuRates::*field) {
    std::vector<double> v;
    for (const CpuRates& e : each) v.push_back(e.*field);
    std::sort(v.begin(), v.end());
    return v.size() % 2 ? v[v.size() / 2] : (v[v.size() / 2 - 1] + v[v.size() / 2]) / 2;
  };
  for (double CpuRates::*f :
       {&CpuRates::dot_flops, &CpuRates::axpy_flops, &CpuRates::attention_flops, &CpuRates::gelu_elements,
        &CpuRates::layernorm_elements, &CpuRates::softmax_elements}) {
    r.*f = median(f);
  }
  r.measured_copies = copies;
  r.measured_rows = at.rows;
  {
    // Two chunks per thread of nothing: only the wake-up and the wait are timed, 1,000 times over.
    constexpr int kCalls = 1000;
    const size_t n = 2 * static_cast<size_t>(pool.threads());
    r.parallel_for_s = median_seconds(cpu_clock,
                                      [&] {
                                        for (int i = 0; i < kCalls; ++i)
                                          pool.parallel_for(n, [](size_t, size_t) {});
                                      }) /
                       kCalls;
  }
  measure_gloo(&r, comm_ranks);
  {
    const ModelConfig mc{.n_layer = 1, .n_head = 4, .n_embd = 128, .vocab_size = 512, .seq_len = 64};
    std::unique_ptr<Backend> be = backend_cpu_create(mc, 1, threads);
    const double params = static_cast<double>(be->params().numel());
    r.optimizer_params = params / median_seconds(cpu_clock, [&] {
                           be->zero_grads();
                           be->optimizer_step({.lr = 1e-3, .weight_decay = 0.1, .grad_clip = 1.0, .step = 1});
                         });
  }
  return r;
}

Result<PlanInput> build_input(const PlanArgs& a) {
  Result<PlanModel> preset = plan_model_preset(a.model);
  if (!preset.ok()) return Status::error("--model: " + preset.error());
  PlanInput in;
  PlanModel& m = in.model;
  m = preset.value();
  Config cfg;
  if (!a.config.empty()) {
    Result<Config> c = config_load(a.config);
    if (!c.ok()) return Status::error("--config: " + c.error());
    cfg = c.value();
    m.name = a.config;
    m.layers = cfg.model.n_layer;
    m.hidden = cfg.model.n_embd;
    m.heads = cfg.model.n_head;
    m.vocab = cfg.model.vocab_size;
    m.seq = cfg.model.seq_len;
  }
  if (a.layers > 0) m.layers = a.layers;
  if (a.hidden > 0) m.hidden = a.hidden;
  if (a.heads > 0) m.heads = a.heads;
  if (a.kv_heads >= 0) m.kv_heads = a.kv_heads;
  if (a.ffn >= 0) m.ffn = a.ffn;
  if (!a.ffn_kind.empty()) m.ffn_kind = a.ffn_kind == "swiglu" ? FfnKind::kSwiGlu : FfnKind::kGelu;
  if (a.vocab > 0) m.vocab = a.vocab;
  if (a.seq > 0) m.seq = a.seq;
  if (a.untied) m.tied_embeddings = false;
  if (a.dropout) m.dropout = true;
  const bool custom = a.layers > 0 || a.hidden > 0 || a.heads > 0 || a.kv_heads >= 0 || a.ffn >= 0 ||
                      !a.ffn_kind.empty() || a.vocab > 0 || a.seq > 0 || a.untied || a.dropout;
  if (custom) m.name = m.name + " (modified)";

  std::string engine = a.engine;
  if (engine.empty()) engine = a.config.empty() ? "generic" : "gantry-" + cfg.train.backend;
  Result<EngineKind> ek = engine_kind_parse(engine);
  if (!ek.ok()) return Status::error("--engine: " + ek.error());
  in.engine = ek.value();
  if (a.measure_cpu && in.engine != EngineKind::kGantryCpu) {
    return Status::error("--measure-cpu: only with --engine gantry-cpu");
  }

  Result<GpuSpec> gpu = plan_gpu_preset(a.gpu);
  if (!gpu.ok()) return Status::error("--gpu: " + gpu.error());
  if (in.engine == EngineKind::kGantryCpu) {
    // The CPU backend's step is priced by in.cpu; the device is the host, whose memory `fits` compares with.
    const double pages = static_cast<double>(sysconf(_SC_PHYS_PAGES));
    const double page = static_cast<double>(sysconf(_SC_PAGE_SIZE));
    gpu = GpuSpec{.name = "cpu", .hbm_bytes = pages > 0 && page > 0 ? pages * page : 0};
    const int threads = a.threads > 0 ? a.threads : (a.config.empty() ? 0 : cfg.train.threads);
    // Every rank of `gantry-engine run --nproc N` runs on this host, sharing its cores.
    const unsigned hw = std::thread::hardware_concurrency();
    in.cpu_cores = a.cpu_cores > 0 ? a.cpu_cores : static_cast<int>(hw);
    // Only beside CPU-timed rates (one thread): with more, --measure-cpu times the loops by the wall clock,
    // which already holds the load.
    const double background_now =
        a.measure_cpu && a.cpu_background < 0 && threads == 1 ? measure_background_threads(in.cpu_cores) : 0;
    if (a.measure_cpu) {
      const int micro = a.micro_batch > 0 ? a.micro_batch : (a.config.empty() ? 1 : cfg.train.micro_batch);
      const long long ranks = a.nodes > 0 ? 1LL * a.nodes * a.gpus_per_node : std::max(a.gpus, 1);
      // Gloo's rates among as many ranks as the plan's largest group (tp or dp) on this host: at least 2,
      // at most 16 (threads of this process with 8 MiB each; a larger ring's step is the same step).
      const int dp = a.dp > 0 ? a.dp : static_cast<int>(ranks) / std::max(1, a.tp * a.pp);
      const int group =
          std::clamp(std::max(a.tp, dp), 2, static_cast<int>(std::clamp<long long>(ranks, 2, 16)));
      in.cpu = measure_cpu_rates(threads, loop_shapes(m, micro, a.tp), static_cast<int>(ranks), group);
    } else {
      in.cpu = plan_cpu_rates_default(threads);
    }
    // The host's other work: as given, else sampled with --measure-cpu (before its loops, which would
    // count themselves), else none.
    in.cpu_background = a.cpu_background >= 0 ? a.cpu_background : background_now;
  }
  // An engine's own measured efficiency on this GPU kind, where there is one, unless --efficiency says.
  const double engine_efficiency = plan_engine_compute_efficiency(in.engine, a.gpu);
  if (engine_efficiency > 0) gpu.value().compute_efficiency = engine_efficiency;
  if (a.efficiency > 0) gpu.value().compute_efficiency = a.efficiency;
  const int default_gpus = in.engine == EngineKind::kGeneric ? 8 : 1;
  const long long gpus =
      a.nodes > 0 ? static_cast<long long>(a.nodes) * a.gpus_per_node : (a.gpus > 0 ? a.gpus : default_gpus);
  if (gpus > 10000000)
    return Status::error("--nodes " + std::to_string(a.nodes) + ": at most 10,000,000 GPUs in all");
  // gantry-cpu: one host holds every rank unless --gpus-per-node says otherwise.
  const int per_node = in.engine == EngineKind::kGantryCpu && a.gpus_per_node_default
                           ? static_cast<int>(std::min<long long>(gpus, 1024))
                           : a.gpus_per_node;
  in.cluster = plan_cluster_default(gpu.value(), static_cast<int>(gpus), per_node);
  if (a.intra_gbps > 0) in.cluster.intra_bw = a.intra_gbps * 1e9;
  if (a.inter_gbps > 0) in.cluster.inter_bw = a.inter_gbps * 1e9;
  if (a.intra_latency_us >= 0) in.cluster.intra_latency_s = a.intra_latency_us * 1e-6;
  if (a.inter_latency_us >= 0) in.cluster.inter_latency_s = a.inter_latency_us * 1e-6;
  if (a.node_mtbf_hours >= 0) in.cluster.node_mtbf_s = a.node_mtbf_hours * 3600;

  Result<Recompute> rc = recompute_parse(a.recompute);
  if (!rc.ok()) return Status::error("--recompute: " + rc.error());
  // A config's pipeline schedule, unless --schedule says: gpipe, 1f1b and zbh1 as they are, interleaved
  // through its vp (when --vp is not given).
  std::string schedule = a.schedule;
  int vp = a.vp;
  if (!a.schedule_given && !a.config.empty() && a.pp > 1) {
    const std::string& cs = cfg.train.pp_schedule;
    if (cs == "gpipe" || cs == "1f1b" || cs == "zbh1") schedule = cs;
    if (cs == "interleaved" && vp == 1) vp = cfg.train.vp;
  }
  Result<Schedule> sched = schedule_parse(schedule);
  if (!sched.ok()) return Status::error("--schedule: " + sched.error());
  in.layout = PlanLayout{
      .tp = a.tp,
      .pp = a.pp,
      .vp = vp,
      .dp = a.dp,
      .cp = a.cp,
      .zero = a.zero,
      .hsdp = a.hsdp,
      .sequence_parallel = !a.no_sp,
      .recompute = rc.value(),
      .flash_attention = !a.no_flash,
      .schedule = sched.value(),
      .micro_batch = a.micro_batch > 0 ? a.micro_batch : (a.config.empty() ? 1 : cfg.train.micro_batch)};

  PlanTraining& t = in.training;
  if (!a.config.empty()) t.dp_bucket_bytes = static_cast<uint64_t>(cfg.train.dp_bucket_mb * 1024.0 * 1024.0);
  if (a.global_batch > 0 && a.global_batch_tokens > 0) {
    return Status::error("--global-batch and --global-batch-tokens: give one of them");
  }
  long long gb = a.global_batch;
  if (a.global_batch_tokens > 0) {
    if (a.global_batch_tokens % m.seq != 0) {
      return Status::error("--global-batch-tokens " + std::to_string(a.global_batch_tokens) +
                           ": must be a multiple of the sequence length (" + std::to_string(m.seq) + ")");
    }
    gb = a.global_batch_tokens / m.seq;
  }
  if (gb > 1000000000) return Status::error("--global-batch " + std::to_string(gb) + ": allowed up to 1e9");
  if (gb == 0 && !a.config.empty()) gb = cfg.train.global_batch;
  if (gb == 0 && a.search) gb = ((1LL << 20) + m.seq - 1) / m.seq;  // one problem for every layout searched
  t.global_batch = static_cast<int>(gb);
  t.tokens = a.tokens;
  t.grad_bytes = a.grad_dtype == "fp32" ? 4 : 2;
  t.checkpoint_bytes_per_param = a.ckpt_bytes_per_param;
  t.checkpoint_write_bw = a.ckpt_write_gbps * 1e9;
  t.restart_s = a.restart_minutes * 60;
  t.mfu_convention = a.mfu_convention == "megatron" ? FlopConvention::kMegatron : FlopConvention::kGantry;
  t.tp_overlap = a.tp_overlap;
  return in;
}

std::string mfu_formula(const Plan& p, const std::string& gpu) {
  char buf[256];
  if (p.engine == EngineKind::kGantryCpu) {
    std::snprintf(buf, sizeof buf,
                  "MFU = tokens/s x %.4g FLOP/token (6N + 6LdT) / %.3g GFLOP/s (the CPU backend's measured "
                  "fp32 matmul forward rate)",
                  p.model_flops_per_token, p.peak_flops / 1e9);
    return buf;
  }
  std::snprintf(buf, sizeof buf,
                "MFU = tokens/s x %.4g FLOP/token (%s) / (%d GPUs x %.0f TFLOP/s %s bf16 dense)",
                p.model_flops_per_token,
                p.convention == FlopConvention::kGantry ? "6N + 6LdT" : "Megatron 3 x forward matmuls",
                p.gpus, p.peak_flops / 1e12, gpu.c_str());
  return buf;
}

nlohmann::json plan_json(const Plan& p, const PlanInput& in) {
  using nlohmann::json;
  const PlanLayout& l = p.layout;
  json comm = json::array();
  for (const CommAxis& a : p.comm) {
    comm.push_back({{"axis", a.axis},
                    {"pattern", a.pattern},
                    {"group", a.group},
                    {"crosses_nodes", a.crosses_nodes},
                    {"bus_bw", a.bus_bw},
                    {"bytes", a.bytes},
                    {"seconds", a.seconds},
                    {"exposed_s", a.exposed_s},
                    {"overlappable_s", a.overlappable_s}});
  }
  json memory = {{"weights", p.memory.weights},
                 {"gradients", p.memory.gradients},
                 {"optimizer", p.memory.optimizer},
                 {"activations", p.memory.activations},
                 {"buffers", p.memory.buffers},
                 {"total", p.memory.total()},
                 {"hbm", p.hbm_bytes},
                 {"fits", p.fits},
                 {"stage", p.memory_stage},
                 {"activation_bytes_per_layer", p.activation_layer_bytes},
                 {"microbatches_in_flight", p.microbatches_in_flight},
                 {"unit", "bytes"}};
  json time = {{"step_s", p.step_s},
               {"compute_s", p.compute_s},
               {"bubble_s", p.bubble_s},
               {"exposed_comm_s", p.exposed_comm_s},
               {"optimizer_s", p.optimizer_s}};
  if (p.engine != EngineKind::kGeneric) {
    json allocations = json::array();
    for (const EngineAllocation& a : p.allocations) {
      allocations.push_back({{"name", a.name},
                             {"shape", a.shape},
                             {"bucket", memory_bucket_name(a.bucket)},
                             {"count", a.count},
                             {"bytes_each", a.bytes_each},
                             {"bytes", a.bytes()},
                             {"in_backend_bytes", a.in_backend_bytes}});
    }
    memory["backend_bytes"] = p.backend_bytes;
    memory["allocations"] = allocations;
    // Every stage's rank (each of its tp ranks holds the same, and so does every dp replica at ZeRO 0):
    // stage 0, the middle ones and the last differ (the embeddings, the activation slots in flight, the wte
    // copy). Under ZeRO 1-3 the figures are dp rank 0's, and `dp_ranks` lists every dp rank's.
    json stages = json::array();
    for (const Plan::StageMemory& sm : p.stage_memory) {
      stages.push_back({{"stage", sm.stage},
                        {"layers", sm.layers},
                        {"weights", sm.memory.weights},
                        {"gradients", sm.memory.gradients},
                        {"optimizer", sm.memory.optimizer},
                        {"activations", sm.memory.activations},
                        {"buffers", sm.memory.buffers},
                        {"total", sm.memory.total()},
                        {"backend_bytes", sm.backend_bytes},
                        {"microbatches_in_flight", sm.microbatches_in_flight}});
      if (!sm.dp_rank_totals.empty()) {
        json ranks = json::array();
        for (size_t k = 0; k < sm.dp_rank_totals.size(); ++k) {
          ranks.push_back({{"dp_rank", k},
                           {"total", sm.dp_rank_totals[k]},
                           {"backend_bytes", sm.dp_rank_backend_bytes[k]}});
        }
        stages.back()["dp_ranks"] = ranks;
      }
    }
    memory["stages"] = stages;
  }
  if (p.engine == EngineKind::kGantryCpu) {
    time["cpu"] = {{"matmul_s", p.cpu_step.matmul_s},
                   {"attention_s", p.cpu_step.attention_s},
                   {"elementwise_s", p.cpu_step.elementwise_s},
                   {"optimizer_s", p.cpu_step.optimizer_s},
                   {"dispatch_s", p.cpu_step.dispatch_s},
                   {"cores_share", p.cpu_share},
                   {"cores", in.cpu_cores},
                   {"background_threads", in.cpu_background},
                   {"oversubscription", p.cpu_oversubscription},
                   {"collectives", p.cpu_collectives},
                   {"collectives_cpu_s", p.cpu_comm_cpu_s},
                   {"host_cpu_s", p.cpu_host_cpu_s}};
  }
  json out = {
      {"engine", engine_kind_name(p.engine)},
      {"model",
       {{"name", in.model.name},
        {"layers", in.model.layers},
        {"hidden", in.model.hidden},
        {"heads", in.model.heads},
        {"kv_heads", plan_model_kv_heads(in.model)},
        {"ffn", plan_model_ffn(in.model)},
        {"ffn_kind", ffn_kind_name(in.model.ffn_kind)},
        {"vocab", in.model.vocab},
        {"seq", in.model.seq},
        {"tied_embeddings", in.model.tied_embeddings}}},
      {"params", p.params},
      {"params_on_gpu", p.params_on_gpu},
      {"cluster",
       {{"gpu", in.cluster.gpu.name},
        {"gpus", p.gpus},
        {"nodes", p.nodes},
        {"gpus_per_node", in.cluster.gpus_per_node},
        {"compute_efficiency", in.cluster.gpu.compute_efficiency}}},
      {"layout",
       {{"tp", l.tp},
        {"cp", l.cp},
        {"pp", l.pp},
        {"vp", l.vp},
        {"dp", l.dp},
        {"zero", l.zero},
        {"hsdp", l.hsdp},
        {"sequence_parallel", l.sequence_parallel},
        {"recompute", recompute_name(l.recompute)},
        {"flash_attention", l.flash_attention},
        {"schedule", schedule_name(l.schedule)},
        {"micro_batch", l.micro_batch},
        {"global_batch", p.global_batch},
        {"micro_batches", p.micro_batches}}},
      {"memory", memory},
      {"communication", comm},
      {"pipeline",
       {{"schedule", schedule_name(l.schedule)},
        {"bubble_fraction", p.bubble_fraction},
        {"bubble_step_fraction", p.bubble_step_fraction},
        {"bubble_s", p.bubble_s}}},
      {"time", time},
      {"tokens_per_s", p.tokens_per_s},
      {"mfu", p.mfu},
      {"hfu", p.hfu},
      {"mfu_convention", flop_convention_name(p.convention)},
      {"peak_flops", p.peak_flops},
      {"mfu_formula", mfu_formula(p, in.cluster.gpu.name)},
      {"tokens", p.tokens},
      {"days_to_train", p.days_to_train},
      {"checkpoint", {{"bytes", p.checkpoint_bytes}, {"write_s", p.checkpoint_write_s}}},
      {"reliability",
       {{"cluster_mtbf_s", p.cluster_mtbf_s},
        {"young_interval_s", p.young_interval_s},
        {"daly_interval_s", p.daly_interval_s},
        {"goodput", p.goodput},
        {"days_to_train_expected", p.days_to_train_expected}}},
  };
  if (p.engine == EngineKind::kGantryCpu) {
    const CpuRates& r = in.cpu;
    out["cpu_rates"] = {{"dot_flops", r.dot_flops},
                        {"axpy_flops", r.axpy_flops},
                        {"attention_flops", r.attention_flops},
                        {"gelu_elements", r.gelu_elements},
                        {"layernorm_elements", r.layernorm_elements},
                        {"softmax_elements", r.softmax_elements},
                        {"optimizer_params", r.optimizer_params},
                        {"parallel_for_s", r.parallel_for_s},
                        {"comm_latency_s", r.comm_latency_s},
                        {"comm_bw", r.comm_bw},
                        {"comm_cpu_step_s", r.comm_cpu_step_s},
                        {"comm_cpu_byte_s", r.comm_cpu_byte_s},
                        {"threads", r.threads}};
    if (r.measured_copies > 0) {
      out["cpu_rates"]["measured"] = {
          {"copies", r.measured_copies}, {"rows", r.measured_rows}, {"comm_ranks", r.comm_ranks}};
    }
  }
  return out;
}

void print_plan(const Plan& p, const PlanInput& in) {
  const PlanModel& m = in.model;
  const PlanLayout& l = p.layout;
  std::printf("gantry plan: %s on %d x %s (%d node%s of %d)\n", m.name.c_str(), p.gpus,
              in.cluster.gpu.name.c_str(), p.nodes, p.nodes == 1 ? "" : "s", in.cluster.gpus_per_node);
  std::printf("model       %d layers, d %d, %d heads (%d kv), ffn %d %s, vocab %d, seq %d, %s\n", m.layers,
              m.hidden, m.heads, plan_model_kv_heads(m), plan_model_ffn(m), ffn_kind_name(m.ffn_kind),
              m.vocab, m.seq, m.tied_embeddings ? "tied embeddings" : "untied head");
  std::printf("params      %s (exact); %s on the heaviest GPU before ZeRO\n", grouped(p.params).c_str(),
              grouped(p.params_on_gpu).c_str());
  std::printf(
      "layout      tp %d x cp %d x pp %d (vp %d, %s) x dp %d; zero %d%s; sp %s; recompute %s; flash %s; "
      "micro-batch %d\n",
      l.tp, l.cp, l.pp, l.vp, schedule_name(l.schedule), l.dp, l.zero,
      l.hsdp > 0 ? (" (hsdp " + std::to_string(l.hsdp) + ")").c_str() : "",
      l.sequence_parallel ? "on" : "off", recompute_name(l.recompute), l.flash_attention ? "on" : "off",
      l.micro_batch);
  std::printf("batch       %d sequences x %d = %s tokens per step; %d micro-batches per pipeline\n\n",
              p.global_batch, m.seq, grouped(static_cast<uint64_t>(p.global_batch) * m.seq).c_str(),
              p.micro_batches);

  std::printf("memory per GPU (pipeline stage %d of %d)   GiB\n", p.memory_stage, l.pp);
  std::printf("  weights                              %9.2f\n", p.memory.weights / kGiB);
  std::printf("  gradients                            %9.2f\n", p.memory.gradients / kGiB);
  std::printf("  optimizer                            %9.2f\n", p.memory.optimizer / kGiB);
  std::printf(
      "  activations                          %9.2f   (%.1f MB per layer per micro-batch, %.2f "
      "micro-batches "
      "in flight)\n",
      p.memory.activations / kGiB, p.activation_layer_bytes / 1e6, p.microbatches_in_flight);
  std::printf("  buffers                              %9.2f\n", p.memory.buffers / kGiB);
  std::printf("  total                                %9.2f   of %.2f GiB %s: %s\n\n",
              p.memory.total() / kGiB, p.hbm_bytes / kGiB,
              p.engine == EngineKind::kGantryCpu ? "host memory" : "HBM", p.fits ? "fits" : "DOES NOT FIT");
  if (p.engine != EngineKind::kGeneric) {
    std::printf(
        "engine      %s: its backend allocates everything up front; Backend::memory_bytes() = %s bytes\n",
        engine_kind_name(p.engine), grouped(static_cast<uint64_t>(p.backend_bytes)).c_str());
    std::printf("  %-42s %-36s %-11s %5s %16s\n", "allocation", "shape", "bucket", "count", "bytes");
    for (const EngineAllocation& a : p.allocations) {
      std::printf("  %-42s %-36s %-11s %5llu %16s%s\n", a.name.c_str(), a.shape.c_str(),
                  memory_bucket_name(a.bucket), static_cast<unsigned long long>(a.count),
                  grouped(a.bytes()).c_str(), a.in_backend_bytes ? "" : "  (not in memory_bytes())");
    }
    std::printf("\n");
    if (p.stage_memory.size() > 1) {
      std::printf(
          "memory per pipeline stage (each of its tp ranks and %s)   GiB\n",
          p.layout.zero >= 1 && p.layout.dp > 1 ? "dp rank 0; --json lists every dp rank's" : "dp replicas");
      std::printf(
          "  stage  layers  in flight   weights  gradients  optimizer  activations  buffers     total"
          "   memory_bytes()\n");
      for (const Plan::StageMemory& sm : p.stage_memory) {
        std::printf("  %5d  %6d  %9.3g  %8.3f  %9.3f  %9.3f  %11.3f  %7.3f  %8.3f  %15s\n", sm.stage,
                    sm.layers, sm.microbatches_in_flight, sm.memory.weights / kGiB,
                    sm.memory.gradients / kGiB, sm.memory.optimizer / kGiB, sm.memory.activations / kGiB,
                    sm.memory.buffers / kGiB, sm.memory.total() / kGiB,
                    grouped(static_cast<uint64_t>(sm.backend_bytes)).c_str());
      }
      std::printf("\n");
    }
  }

  if (!p.comm.empty()) {
    std::printf("communication per step, per GPU\n");
    std::printf("  axis  group  link            bytes        time      exposed   overlapped  pattern\n");
    for (const CommAxis& a : p.comm) {
      char link[32];
      if (p.engine == EngineKind::kGantryCpu) {
        std::snprintf(link, sizeof link, "gloo %.2f GB/s", a.bus_bw / 1e9);  // loopback TCP, one host
      } else {
        std::snprintf(link, sizeof link, "%s %.0f GB/s", a.crosses_nodes ? "net" : "nvlink", a.bus_bw / 1e9);
      }
      std::printf("  %-4s  %5d  %-14s %10s  %10s  %10s  %10s  %s\n", a.axis.c_str(), a.group, link,
                  human_bytes(a.bytes).c_str(), human_seconds(a.seconds).c_str(),
                  human_seconds(a.exposed_s).c_str(), human_seconds(a.overlappable_s).c_str(),
                  a.pattern.c_str());
    }
    std::printf("\n");
  }
  const int k = plan_bubble_divisor(l.schedule, l.vp);
  std::printf(
      "pipeline    %s, bubble %.1f%% of the ideal step ((p-1)/(k*m) = %d/(%d*%d)), %.1f%% of the step "
      "((p-1)/(k*m+p-1)); %s%s\n",
      schedule_name(l.schedule), 100 * p.bubble_fraction, l.pp - 1, k, p.micro_batches,
      100 * p.bubble_step_fraction, human_seconds(p.bubble_s).c_str(),
      // gantry-cuda times its ranks' programs with their own stages' passes instead of the formula.
      p.engine == EngineKind::kGantryCuda && l.pp > 1 ? " as the ranks' programs run (stages' own passes)"
                                                      : "");
  std::printf("step        %s = compute %s + bubble %s + exposed communication %s + optimizer %s\n",
              human_seconds(p.step_s).c_str(), human_seconds(p.compute_s).c_str(),
              human_seconds(p.bubble_s).c_str(), human_seconds(p.exposed_comm_s).c_str(),
              human_seconds(p.optimizer_s).c_str());
  std::printf("throughput  %s tokens/s (%.0f per GPU)\n",
              grouped(static_cast<uint64_t>(p.tokens_per_s)).c_str(), p.tokens_per_s / p.gpus);
  if (p.engine == EngineKind::kGantryCpu) {
    const CpuRates& r = in.cpu;
    std::printf("cpu step    matmul %s + attention %s + elementwise %s + optimizer %s + thread wake-ups %s\n",
                human_seconds(p.cpu_step.matmul_s).c_str(), human_seconds(p.cpu_step.attention_s).c_str(),
                human_seconds(p.cpu_step.elementwise_s).c_str(),
                human_seconds(p.cpu_step.optimizer_s).c_str(), human_seconds(p.cpu_step.dispatch_s).c_str());
    std::printf(
        "cpu rates   dot %.2f, axpy %.2f, attention %.2f GFLOP/s; GELU %.1f, LayerNorm %.1f, softmax %.1f M "
        "elements/s; optimizer %.1f M params/s; %.1f us per parallel_for (%s)\n",
        r.dot_flops / 1e9, r.axpy_flops / 1e9, r.attention_flops / 1e9, r.gelu_elements / 1e6,
        r.layernorm_elements / 1e6, r.softmax_elements / 1e6, r.optimizer_params / 1e6,
        r.parallel_for_s * 1e6, "--measure-cpu measures this machine's; the default is the developer VM's");
    std::printf(
        "cpu host    %d cores; %d rank(s) x %d thread(s) and %.1f background thread(s): %.2f runnable per "
        "core; "
        "Gloo %.0f us a ring step, %.2f GB/s\n",
        in.cpu_cores, std::min(in.cluster.gpus, in.cluster.gpus_per_node), r.threads, in.cpu_background,
        p.cpu_share, r.comm_latency_s * 1e6, r.comm_bw / 1e9);
    std::printf(
        "cpu comm    %.0f blocking collectives a step (slowest rank); their host CPU %s a step, all ranks "
        "(%.0f us a ring step, %.2f ns a byte); work %.2fx longer than with a core per thread\n",
        p.cpu_collectives, human_seconds(p.cpu_comm_cpu_s).c_str(), r.comm_cpu_step_s * 1e6,
        r.comm_cpu_byte_s * 1e9, p.cpu_oversubscription);
  }
  std::printf("MFU         %.1f%%, HFU %.1f%% (with recomputation)\n", 100 * p.mfu, 100 * p.hfu);
  if (p.engine == EngineKind::kGantryCpu) {
    std::printf("            %s\n", mfu_formula(p, in.cluster.gpu.name).c_str());
  } else {
    std::printf("            %s; compute efficiency %.2f of peak (calibrated, docs/PLANNER.md)\n",
                mfu_formula(p, in.cluster.gpu.name).c_str(), in.cluster.gpu.compute_efficiency);
  }
  std::printf("training    %.3g tokens%s: %s with no failures\n", p.tokens,
              in.training.tokens > 0 ? "" : " (20 per parameter)", human_days(p.days_to_train).c_str());
  std::printf("checkpoint  %s (%.0f B/param), written in %s\n", human_bytes(p.checkpoint_bytes).c_str(),
              in.training.checkpoint_bytes_per_param, human_seconds(p.checkpoint_write_s).c_str());
  if (p.cluster_mtbf_s > 0) {
    std::printf(
        "failures    job MTBF %s (node %.0f h / %d node%s); checkpoint every %s (Daly; Young %s); goodput "
        "%.1f%%; %s expected\n",
        human_seconds(p.cluster_mtbf_s).c_str(), in.cluster.node_mtbf_s / 3600, p.nodes,
        p.nodes == 1 ? "" : "s", human_seconds(p.daly_interval_s).c_str(),
        human_seconds(p.young_interval_s).c_str(), 100 * p.goodput,
        human_days(p.days_to_train_expected).c_str());
  } else {
    std::printf("failures    none modelled (--node-mtbf-hours 0)\n");
  }
}

void print_search(const SearchResult& r, const PlanInput& in, SearchRank rank) {
  std::printf("gantry plan --search: %s on %d x %s, global batch %d sequences, ranked by %s\n",
              in.model.name.c_str(), in.cluster.gpus, in.cluster.gpu.name.c_str(), in.training.global_batch,
              rank == SearchRank::kGoodput ? "goodput (tokens/s x useful share)" : "tokens/s");
  std::printf("%4s %3s %3s %3s %3s %5s %4s %3s %-9s %8s %9s %12s %6s %7s\n", "#", "tp", "cp", "pp", "vp",
              "dp", "zero", "mb", "recompute", "mem GiB", "step s", "tokens/s", "MFU%", "goodput");
  int i = 0;
  for (const Plan& p : r.plans) {
    const PlanLayout& l = p.layout;
    std::printf("%4d %3d %3d %3d %3d %5d %4d %3d %-9s %8.1f %9.3f %12s %6.1f %6.1f%%\n", ++i, l.tp, l.cp,
                l.pp, l.vp, l.dp, l.zero, l.micro_batch, recompute_name(l.recompute), p.memory.total() / kGiB,
                p.step_s, grouped(static_cast<uint64_t>(p.tokens_per_s)).c_str(), 100 * p.mfu,
                100 * p.goodput);
  }
  std::printf("%d valid layouts evaluated, %d fit in %.1f GiB\n", r.evaluated, r.fitting,
              in.cluster.gpu.hbm_bytes / kGiB);
  if (!r.plans.empty()) std::printf("%s\n", mfu_formula(r.plans.front(), in.cluster.gpu.name).c_str());
}

int plan_main(const PlanArgs& a) {
  Result<PlanInput> in = build_input(a);
  if (!in.ok()) {
    std::fprintf(stderr, "gantry-engine plan: %s\n", in.error().c_str());
    return kExitBadInput;
  }
  if (a.search) {
    const SearchRank rank = a.rank == "goodput" ? SearchRank::kGoodput : SearchRank::kTokensPerSecond;
    Result<SearchResult> r = plan_search(in.value(), SearchOptions{.top = a.top, .rank = rank});
    if (!r.ok()) {
      std::fprintf(stderr, "gantry-engine plan: %s\n", flag_message(r.error()).c_str());
      return kExitBadInput;
    }
    if (a.json) {
      nlohmann::json plans = nlohmann::json::array();
      for (const Plan& p : r->plans) plans.push_back(plan_json(p, in.value()));
      nlohmann::json j = {{"evaluated", r->evaluated},
                          {"fitting", r->fitting},
                          {"rank", search_rank_name(rank)},
                          {"plans", plans}};
      std::printf("%s\n", j.dump(2).c_str());
    } else {
      print_search(r.value(), in.value(), rank);
    }
    if (r->plans.empty()) {
      std::fprintf(stderr,
                   "gantry-engine plan: no layout fits; try more GPUs, --gpu with more memory or a smaller "
                   "--global-batch\n");
      return kExitFailed;
    }
    return 0;
  }
  Result<Plan> p = plan_evaluate(in.value());
  if (!p.ok()) {
    std::fprintf(stderr, "gantry-engine plan: %s\n", flag_message(p.error()).c_str());
    return kExitBadInput;
  }
  if (a.json) {
    std::printf("%s\n", plan_json(p.value(), in.value()).dump(2).c_str());
  } else {
    print_plan(p.value(), in.value());
  }
  return 0;
}

}  // namespace

void plan_command_add(CLI::App& app, int* exit_code) {
  auto a = std::make_shared<PlanArgs>();
  CLI::App* sub = app.add_subcommand(
      "plan",
      "What-if planner: memory, communication, bubble, step time, MFU and goodput of a layout (or --search)");
  sub->add_option("--config", a->config,
                  "A training config (TOML): its model, micro-batch, global batch, backend (the default "
                  "--engine) and threads");
  sub->add_option("--engine", a->engine,
                  "Which stack: generic (default), or Gantry's own backend, whose allocation table gives the "
                  "memory exactly: gantry-cpu, gantry-cuda")
      ->check(CLI::IsMember({"generic", "gantry-cpu", "gantry-cuda"}));
  sub->add_flag(
      "--measure-cpu", a->measure_cpu,
      "gantry-cpu: time the CPU backend's loops on this machine (about a second) instead of using the "
      "developer VM's rates");
  sub->add_option("--threads", a->threads, "gantry-cpu: the backend's threads; 0 = all cores")
      ->check(CLI::Range(0, 4096));
  sub->add_option("--cpu-cores", a->cpu_cores,
                  "gantry-cpu: cores of the host the ranks share (default: this machine's)")
      ->check(CLI::Range(1, 1000000));
  sub->add_option("--cpu-background", a->cpu_background,
                  "gantry-cpu: runnable threads of other work sharing the host's cores (default 0; "
                  "--measure-cpu samples it)")
      ->check(CLI::Range(0.0, 1e6));
  sub->add_option("--tp-overlap", a->tp_overlap,
                  "Fraction of the GEMM next to each tensor-parallel collective that hides it (0 = none; "
                  "gantry-cpu: 0 only)")
      ->check(CLI::Range(0.0, 1.0));
  sub->add_option("--model", a->model, "Preset the model flags start from")
      ->check(CLI::IsMember(plan_model_preset_names()))
      ->capture_default_str();
  sub->add_option("--layers", a->layers, "Transformer blocks")->check(CLI::Range(1, 100000));
  sub->add_option("--hidden", a->hidden, "Width d")->check(CLI::Range(1, 1000000));
  sub->add_option("--heads", a->heads, "Attention heads")->check(CLI::Range(1, 100000));
  sub->add_option("--kv-heads", a->kv_heads, "Key/value heads (grouped-query attention); 0 = heads")
      ->check(CLI::Range(0, 100000));
  sub->add_option("--ffn", a->ffn, "MLP width; 0 = 4 x hidden")->check(CLI::Range(0, 10000000));
  sub->add_option("--ffn-kind", a->ffn_kind, "MLP kind")->check(CLI::IsMember({"gelu", "swiglu"}));
  sub->add_option("--vocab", a->vocab, "Vocabulary size")->check(CLI::Range(1, 100000000));
  sub->add_option("--seq", a->seq, "Sequence length")->check(CLI::Range(1, 100000000));
  sub->add_flag("--untied", a->untied, "Separate output head (not tied to the embedding)");
  sub->add_flag("--dropout", a->dropout, "Dropout masks are stored (Megatron's GPT-3 runs)");

  sub->add_option("--gpu", a->gpu, "GPU kind")
      ->check(CLI::IsMember(plan_gpu_preset_names()))
      ->capture_default_str();
  CLI::Option* gpus =
      sub->add_option("--gpus", a->gpus, "GPUs in the job (default 8; 1 with --engine gantry-*)")
          ->check(CLI::Range(1, 10000000));
  sub->add_option("--nodes", a->nodes, "Nodes in the job (instead of --gpus): gpus = nodes x gpus-per-node")
      ->check(CLI::Range(1, 10000000))
      ->excludes(gpus);
  sub->add_option("--gpus-per-node", a->gpus_per_node,
                  "GPUs per node (gantry-cpu: ranks per host, default all of them)")
      ->check(CLI::Range(1, 1024))
      ->capture_default_str()
      ->each([a](const std::string&) { a->gpus_per_node_default = false; });
  sub->add_option("--intra-bw", a->intra_gbps, "Bus bandwidth inside a node, GB/s (default: 0.8 x NVLink)")
      ->check(CLI::PositiveNumber);
  sub->add_option("--inter-bw", a->inter_gbps,
                  "Bus bandwidth per GPU between nodes, GB/s (default: 0.8 x NIC)")
      ->check(CLI::PositiveNumber);
  sub->add_option("--intra-latency-us", a->intra_latency_us,
                  "Latency of one ring step inside a node, us (default 2)")
      ->check(CLI::NonNegativeNumber);
  sub->add_option("--inter-latency-us", a->inter_latency_us,
                  "Latency of one ring step across nodes, us (default 6)")
      ->check(CLI::NonNegativeNumber);
  sub->add_option(
         "--node-mtbf-hours", a->node_mtbf_hours,
         "Mean time between failures of one node, hours; 0 = no failures (default: Llama 3's 6,335 h)")
      ->check(CLI::NonNegativeNumber);
  sub->add_option("--efficiency", a->efficiency,
                  "Fraction of peak the layers sustain (default: calibrated per GPU)")
      ->check(CLI::Range(0.01, 1.0));

  sub->add_option("--tp", a->tp, "Tensor parallel")->check(CLI::Range(1, 1024));
  sub->add_option("--pp", a->pp, "Pipeline stages")->check(CLI::Range(1, 100000));
  sub->add_option("--vp", a->vp, "Virtual stages per device (> 1: interleaved 1F1B)")
      ->check(CLI::Range(1, 1024));
  sub->add_option("--dp", a->dp, "Data parallel; 0 = gpus / (tp x cp x pp)")->check(CLI::Range(0, 10000000));
  sub->add_option("--cp", a->cp, "Context parallel")->check(CLI::Range(1, 1024));
  sub->add_option("--zero", a->zero, "ZeRO stage")->check(CLI::IsMember({0, 1, 2, 3}));
  sub->add_option("--hsdp", a->hsdp, "ZeRO shard group size inside dp (HSDP); 0 = all of dp")
      ->check(CLI::Range(0, 10000000));
  sub->add_flag("--no-sp", a->no_sp, "No sequence parallelism with tp");
  sub->add_option("--recompute", a->recompute, "Activation recomputation")
      ->check(CLI::IsMember({"none", "selective", "full"}))
      ->capture_default_str();
  sub->add_flag("--no-flash", a->no_flash, "Materialised attention instead of flash attention");
  sub->add_option("--schedule", a->schedule,
                  "Pipeline schedule (zbh1: ZB-H1, vp 1; --vp > 1 makes it interleaved; default: a config's "
                  "train.pp_schedule, or 1f1b)")
      ->check(CLI::IsMember({"gpipe", "1f1b", "zbh1"}))
      ->capture_default_str()
      ->each([a](const std::string&) { a->schedule_given = true; });
  sub->add_option("--micro-batch", a->micro_batch, "Sequences per micro-batch")
      ->check(CLI::Range(1, 1000000));
  sub->add_option("--global-batch", a->global_batch,
                  "Sequences per optimizer step (default: 2^20 tokens' worth)")
      ->check(CLI::Range(1LL, 1000000000LL));
  sub->add_option("--global-batch-tokens", a->global_batch_tokens, "Tokens per optimizer step")
      ->check(CLI::Range(1LL, 1000000000000LL));
  sub->add_option("--tokens", a->tokens, "Tokens to train on (default: 20 per parameter)")
      ->check(CLI::NonNegativeNumber);
  sub->add_option("--grad-dtype", a->grad_dtype, "Gradient dtype")
      ->check(CLI::IsMember({"bf16", "fp32"}))
      ->capture_default_str();
  sub->add_option("--ckpt-bytes-per-param", a->ckpt_bytes_per_param, "Checkpoint bytes per parameter")
      ->check(CLI::Range(0.0, 64.0))
      ->capture_default_str();
  sub->add_option("--ckpt-write-bw", a->ckpt_write_gbps,
                  "Checkpoint write bandwidth, GB/s in all (default 1 per node)")
      ->check(CLI::PositiveNumber);
  sub->add_option("--restart-minutes", a->restart_minutes, "Time from a failure to training again")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  sub->add_option("--mfu-convention", a->mfu_convention, "FLOPs for MFU: gantry (6N + 6LdT) or megatron")
      ->check(CLI::IsMember({"gantry", "megatron"}))
      ->capture_default_str();

  sub->add_flag(
      "--search", a->search,
      "Rank every valid layout that fits (layout flags other than --no-flash and --hsdp are ignored)");
  sub->add_option("--top", a->top, "Layouts --search prints")
      ->check(CLI::Range(1, 100000))
      ->capture_default_str();
  sub->add_option("--rank", a->rank, "What --search ranks by")
      ->check(CLI::IsMember({"tokens", "goodput"}))
      ->capture_default_str();
  sub->add_flag("--json", a->json, "One JSON object on stdout instead of the table");
  sub->callback([a, exit_code] { *exit_code = plan_main(*a); });
}

}  // namespace gantry
