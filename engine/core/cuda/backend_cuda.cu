// The CUDA backend: GPT-2's forward and backward in bf16 with fp32 master weights, gradients and AdamW
// state. Matmuls through cuBLASLt (matmul.cu), attention by our flash kernels (attention.cu), everything
// else by kernels.cu. One stream; the host waits only in step_stats(), forward_loss() and state copies.
//
// Phase times (forward, backward, optimizer) come from CUDA events on the stream, read in step_stats() after
// its one wait; device_health() adds this backend's memory and NVML's sensors (engine/core/cuda/device.h).
// The training state (parameters, gradients, AdamW moments) and its data parallel traffic live in
// ZeroDeviceState (zero_device_state.cuh): the kernels ask it where a unit's parameters and gradients are.
//
// Tensor parallel (CudaTensorParallel): each tp rank holds its heads' rows of QKV, its share of the MLP's
// hidden units and its V/tp rows of wte (tensor_parallel_table). The row-parallel products (attention and
// MLP projections) leave partial sums, all-reduced in bf16 on the tp stream before the residual add (the
// projection's bias added by tp rank 0 only, so the sum holds it once); the column-parallel products' input
// gradients (QKV, MLP-up, and the tied classifier's) are all-reduced the same way, each started as soon as
// it is computed and hidden under the weight-gradient products that follow it. The embedding sums each
// token's row from its owner (the others contribute exact zeros), and the cross-entropy combines every
// rank's row maxima and sums of exponentials (cuda/vocab_parallel.cuh): the logits are never gathered.
// Everything between those all-reduces (residual stream, LayerNorms, their gradients, the position
// embedding's) is the same bits on every tp rank, so the whole tensors' updates agree with no traffic.
#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <map>
#include <set>
#include <vector>

#include "engine/core/comm/communicator.h"
#include "engine/core/cuda/attention.cuh"
#include "engine/core/cuda/backend_cuda.h"
#include "engine/core/cuda/cuda_check.h"
#include "engine/core/cuda/device.h"  // DeviceSensorMonitor, cuda_device_name
#include "engine/core/cuda/kernels.cuh"
#include "engine/core/cuda/matmul.cuh"
#include "engine/core/cuda/state_snapshot.cuh"
#include "engine/core/cuda/vocab_parallel.cuh"
#include "engine/core/cuda/zero_device_state.cuh"
#include "engine/core/fatal.h"
#include "engine/core/gpt.h"
#include "engine/core/parallel/shard_plan.h"
#include "engine/core/parallel/tensor_parallel.h"  // tensor_parallel_table, tensor_parallel_sharded

namespace gantry {
namespace {

// Cl = C/tp, NHl = NH/tp and Hl = 4C/tp are this tp rank's share (C, NH and 4C at tp 1).
struct LayerActs {
  bf16* ln1;        // (N, C)
  float* ln1_mean;  // (N)
  float* ln1_rstd;  // (N)
  bf16* qkv;        // (N, 3Cl)
  bf16* atty;       // (N, Cl)
  float* lse;       // (B, NHl, T)
  bf16* res2;       // (N, C)
  bf16* ln2;        // (N, C)
  float* ln2_mean;  // (N)
  float* ln2_rstd;  // (N)
  bf16* fch_pre;    // (N, Hl) before GELU, for the GELU derivative
  bf16* fch_gelu;   // (N, Hl) after GELU, for the weight gradient (stored: recomputing cost 3.5 ms a step)
  bf16* res3;       // (N, C)
};

// A block's tensors in the tensor table's order (gpt.h), as parameters or as gradients.
constexpr int kBlockTensors = 12;
template <class T>
struct BlockTensors {
  T *ln1_w, *ln1_b, *qkv_w, *qkv_b, *proj_w, *proj_b, *ln2_w, *ln2_b, *fc_w, *fc_b, *fcproj_w, *fcproj_b;
};
using BlockParams = BlockTensors<const bf16>;
using BlockGrads = BlockTensors<float>;
// Elements from a block's unit start to each of its tensors: the same for every block.
using BlockLayout = std::array<size_t, kBlockTensors>;
template <class T>
BlockTensors<T> block_at(T* unit, const BlockLayout& at) {
  return {unit + at[0], unit + at[1], unit + at[2], unit + at[3], unit + at[4],  unit + at[5],
          unit + at[6], unit + at[7], unit + at[8], unit + at[9], unit + at[10], unit + at[11]};
}

// One allocation shared by the classifier's logits chunk and the backward's gradient buffers (allocate()):
// element offsets of each buffer (each padded to 128 elements, 256 bytes) and the total, which is at least
// ~256 MB of logits rows (or all N rows). engine/plan/engine_profile.cpp mirrors this sizing.
struct ClassifierRegion {
  size_t elements, dres, dfch, dqkv, datty, tmp_nc;
};
ClassifierRegion classifier_region(size_t N, size_t C, size_t V) {
  auto pad = [](size_t n) { return (n + 127) / 128 * 128; };
  ClassifierRegion r{};
  r.dres = 0;
  r.dfch = r.dres + pad(N * C);
  r.dqkv = r.dfch + pad(N * 4 * C);
  r.datty = r.dqkv + pad(N * 3 * C);
  r.tmp_nc = r.datty + pad(N * C);
  const size_t buffers = r.tmp_nc + pad(N * C);
  const size_t min_rows = std::clamp<size_t>((256u << 20) / (V * sizeof(bf16)), 1, N);
  r.elements = std::max(buffers, min_rows * V);
  return r;
}

// Events bounding one micro-batch's forward and backward on the stream.
struct MicroEvents {
  cudaEvent_t begin = nullptr, mid = nullptr, end = nullptr;
};

// A micro-batch captured as a graph, and its three event-record nodes (begin, mid, end): each replay points
// them at that micro-batch's own events, so a step of several micro-batches times each one.
struct CapturedMicroBatch {
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
  std::array<cudaGraphNode_t, 3> marks{};
};

// The tp degree and this rank's place in it (1 and 0 without tensor parallelism).
int tp_size_of(const CudaTensorParallel& tp) {
  return tp.comm != nullptr ? tp.comm->size() : 1;
}
int tp_rank_of(const CudaTensorParallel& tp) {
  return tp.comm != nullptr && tp.comm->size() > 1 ? tp.comm->rank() : 0;
}

class CudaBackend final : public Backend {
 public:
  CudaBackend(const ModelConfig& m, int max_batch, bool graphs, bool deterministic,
              const CudaDataParallel& dp, const CudaTensorParallel& tp)
      : m_(m),
        max_batch_(max_batch),
        tp_(tp_size_of(tp)),
        tp_rank_(tp_rank_of(tp)),
        table_(tensor_parallel_table(m, tp_, tp_rank_)),
        // The bucket reductions (and the tp all-reduces) are issued by the host as the passes are enqueued;
        // a graph replay would skip them, so data and tensor parallel runs launch kernels directly.
        graphs_(graphs && (dp.comm == nullptr || dp.comm->size() == 1) && tp_ == 1),
        deterministic_(deterministic),
        dp_(dp.comm != nullptr && dp.comm->size() > 1 ? dp.comm : nullptr),
        dp_timeout_(dp.timeout),
        tp_comm_(tp_ > 1 ? tp.comm : nullptr) {
    GANTRY_CHECK(dp.zero >= 0 && dp.zero <= 3, "zero stage " + std::to_string(dp.zero) + " (allowed 0-3)");
    GANTRY_CHECK(m.n_head % tp_ == 0 && (4 * m.n_embd) % tp_ == 0 && m.vocab_size % tp_ == 0,
                 "tp " + std::to_string(tp_) + " must divide model.n_head " + std::to_string(m.n_head) +
                     ", the MLP width " + std::to_string(4 * m.n_embd) + " and model.vocab_size " +
                     std::to_string(m.vocab_size));
    CUDA_CHECK(cudaGetDevice(&device_));
    CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
    if (tp_comm_ != nullptr) {
      CUDA_CHECK(cudaStreamCreateWithFlags(&tp_stream_, cudaStreamNonBlocking));
      CUDA_CHECK(cudaEventCreateWithFlags(&tp_before_, cudaEventDisableTiming));
      CUDA_CHECK(cudaEventCreateWithFlags(&tp_after_, cudaEventDisableTiming));
    }
    for (cudaEvent_t& e : upload_done_) CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
    CUDA_CHECK(cudaEventCreate(&opt_begin_));
    CUDA_CHECK(cudaEventCreate(&opt_end_));
    matmul_ = std::make_unique<Matmul>(stream_);
    allocate();
    // One GPU shards nothing: ZeRO 0 whatever was asked.
    ShardPlan plan = dp_ != nullptr
                         ? shard_plan_make(table_, dp_->size(), dp_->rank(), dp.zero, dp.bucket_bytes)
                         : shard_plan_make(table_, 1, 0, 0, dp.bucket_bytes);
    std::vector<bool> sharded;
    for (const TensorInfo& t : table_.tensors()) sharded.push_back(tensor_parallel_sharded(t.name));
    state_ = std::make_unique<ZeroDeviceState>(
        table_, std::move(plan), dp_, dp_timeout_, stream_, scratch_,
        [this](size_t bytes) { return device<char>(bytes); }, tp_comm_, std::move(sharded));
    for (auto& snap : snapshots_) snap = std::make_unique<CudaStateSnapshot>(stream_);
    layout_params();
  }

  ~CudaBackend() override {
    // Bounded: all-reduces queued behind a dead tp peer must not hang the teardown.
    if (tp_comm_ != nullptr) (void)tp_comm_->sync(tp_stream_, dp_timeout_);
    cudaStreamSynchronize(stream_);
    for (auto& [key, g] : graphs_by_shape_) {
      cudaGraphExecDestroy(g.exec);
      cudaGraphDestroy(g.graph);
    }
    for (MicroEvents& e : micro_events_) {
      cudaEventDestroy(e.begin);
      cudaEventDestroy(e.mid);
      cudaEventDestroy(e.end);
    }
    cudaEventDestroy(opt_begin_);
    cudaEventDestroy(opt_end_);
    for (auto& snap : snapshots_) snap.reset();  // waits for a copy in flight before its pinned memory goes
    state_.reset();                              // waits for its communication stream before the memory goes
    matmul_.reset();
    for (void* p : device_allocations_) cudaFree(p);
    for (void* p : host_allocations_) cudaFreeHost(p);
    for (cudaEvent_t e : upload_done_) cudaEventDestroy(e);
    for (TpWait& w : tp_wait_events_) {
      cudaEventDestroy(w.before);
      cudaEventDestroy(w.after);
    }
    if (tp_stream_ != nullptr) {
      cudaEventDestroy(tp_before_);
      cudaEventDestroy(tp_after_);
      cudaStreamDestroy(tp_stream_);
    }
    cudaStreamDestroy(stream_);
  }

  std::string name() const override { return "cuda"; }
  std::string device_name() const override { return cuda_device_name(device_); }
  const TensorTable& params() const override { return table_; }

  void forward_backward(const int32_t* inputs, const int32_t* targets, int B, float grad_scale) override {
    upload(inputs, targets, B, true);
    tokens_ += static_cast<int64_t>(B) * m_.seq_len;
    state_->begin_micro_batch();
    const MicroEvents& ev = micro_events(micro_in_step_++);
    if (!graphs_) {
      micro_batch(B, grad_scale, ev);
      return;
    }
    // Everything after the upload depends only on (B, grad_scale): captured once as a CUDA graph and
    // replayed, so the host's launch cost leaves the step. The first call of a shape runs plainly, so the
    // matmul plans are made outside any capture.
    const auto key = std::make_pair(B, grad_scale);
    auto it = graphs_by_shape_.find(key);
    if (it == graphs_by_shape_.end()) {
      if (seen_shapes_.insert(key).second) {
        micro_batch(B, grad_scale, ev);
        return;
      }
      it = graphs_by_shape_.emplace(key, capture(B, grad_scale, ev)).first;
    }
    const CapturedMicroBatch& g = it->second;
    // The phase events are recorded inside the graph (external event-record nodes), not around its launch:
    // the forward/backward boundary lies inside the captured micro-batch, and the begin/end marks then time
    // the graph's own work, not the launch. Node parameters changed here apply to this and later launches
    // only; a replay already queued keeps the events it had.
    CUDA_CHECK(cudaGraphExecEventRecordNodeSetEvent(g.exec, g.marks[0], ev.begin));
    CUDA_CHECK(cudaGraphExecEventRecordNodeSetEvent(g.exec, g.marks[1], ev.mid));
    CUDA_CHECK(cudaGraphExecEventRecordNodeSetEvent(g.exec, g.marks[2], ev.end));
    CUDA_CHECK(cudaGraphLaunch(g.exec, stream_));
  }

  float forward_loss(const int32_t* inputs, const int32_t* targets, int B) override {
    // Validation is no part of the step's phases: its tp waits are not counted (their events are reused;
    // this waits for them below).
    const size_t step_waits = tp_waits_;
    upload(inputs, targets, B, false);
    forward(B);
    const int N = B * m_.seq_len;
    classifier(B, 0.0f, false);
    CUDA_CHECK(cudaMemsetAsync(eval_sum_, 0, sizeof(float), stream_));
    sum_accumulate_cuda(eval_sum_, losses_, N, stream_);
    float sum = 0;
    CUDA_CHECK(cudaMemcpyAsync(&sum, eval_sum_, sizeof(float), cudaMemcpyDeviceToHost, stream_));
    if (tp_comm_ != nullptr) check(tp_comm_->sync(stream_, dp_timeout_));  // a dead tp peer: the timeout
    CUDA_CHECK(cudaStreamSynchronize(stream_));
    tp_waits_ = step_waits;
    return sum / static_cast<float>(N);
  }

  void zero_grads() override { begin_step(1); }

  void begin_step(int micro_batches) override {
    state_->begin_step(micro_batches);
    tokens_ = 0;
    micro_in_step_ = 0;
    optimizer_timed_ = false;
    tp_waits_ = 0;
  }

  void optimizer_step(const AdamWStep& s) override {
    // What the backward pass did not hide of the reductions shows as the gap between its end and opt_begin_.
    state_->finish_reductions();
    CUDA_CHECK(cudaEventRecord(opt_begin_, stream_));
    before_overwrite();  // a checkpoint's or in-memory copy of the state must end before the update
    state_->update(s);
    CUDA_CHECK(cudaEventRecord(opt_end_, stream_));
    optimizer_timed_ = true;
  }

  StepStats step_stats() override {
    CUDA_CHECK(
        cudaMemcpyAsync(&host_stats_[0], state_->loss_sum(), sizeof(float), cudaMemcpyDeviceToHost, stream_));
    CUDA_CHECK(
        cudaMemcpyAsync(&host_stats_[1], state_->norm(), sizeof(float), cudaMemcpyDeviceToHost, stream_));
    // A collective that never finishes (a dead peer) must fail at the timeout, not hang in a stream wait.
    if (dp_ != nullptr) check(dp_->sync(stream_, dp_timeout_));
    if (tp_comm_ != nullptr) check(tp_comm_->sync(stream_, dp_timeout_));
    CUDA_CHECK(cudaStreamSynchronize(stream_));
    StepStats s;
    const double tokens = static_cast<double>(tokens_) * (dp_ != nullptr ? dp_->size() : 1);  // equal shares
    s.loss = tokens_ ? host_stats_[0] / tokens : 0.0;
    s.grad_norm = host_stats_[1];
    s.updated = std::isfinite(s.grad_norm);
    read_phase_times();  // every event is complete now: no further wait
    return s;
  }

  PhaseTimes phase_times() const override { return phases_; }

  std::vector<FlatRange> held_ranges(StateBuffer which) const override { return state_->held(which); }
  std::vector<FlatRange> written_ranges(StateBuffer which) const override { return state_->written(which); }
  void gather_params(float* out) override { state_->gather_params(out); }
  StateBytes state_bytes() const override { return state_->bytes(); }
  std::string replicated_state() const override { return state_->replicated_state(); }
  uint64_t replicated_bytes() const override { return state_->replicated_bytes(); }
  uint64_t replicated_hash() override { return state_->replicated_hash(); }
  bool test_flip_replicated_bit(uint64_t bit) override { return state_->flip_replicated_bit(bit); }

  DeviceHealth device_health() override {
    // Memory is this backend's own accounting (every cudaMalloc it made, the cuBLASLt workspace included),
    // not cudaMemGetInfo, which counts the CUDA context and other processes on the card. All of it is
    // allocated up front, so the peak equals what is held.
    DeviceHealth h;
    h.device = device_;
    h.mem_allocated_bytes = device_bytes_ + matmul_->workspace_bytes();
    h.mem_peak_bytes = h.mem_allocated_bytes;
    if (!sensors_)
      sensors_ = std::make_unique<DeviceSensorMonitor>(device_);  // opens NVML once, on first use
    const DeviceSensors d = sensors_->latest();
    h.temperature_celsius = d.temperature_celsius;
    h.sm_clock_hertz = d.sm_clock_hertz;
    h.power_watts = d.power_watts;
    return h;
  }

  double grad_norm() override { return state_->grad_norm(); }

  void read_state(StateBuffer which, size_t offset, size_t count, float* out) override {
    state_->read(which, offset, count, out);
  }

  void write_state(StateBuffer which, size_t offset, size_t count, const float* in) override {
    before_overwrite();  // a checkpoint's or in-memory copy must end before its sources change
    state_->write(which, offset, count, in);
  }

  // Checkpoint snapshots: pinned memory, and the copy on its own stream (cuda/state_snapshot.cuh).
  float* snapshot_memory(SnapshotSlot slot, size_t floats) override { return snapshot(slot).memory(floats); }
  void snapshot_start(SnapshotSlot slot, const std::vector<SnapshotPiece>& pieces, float* host) override {
    std::vector<CudaStateSnapshot::Copy> copies;
    for (const SnapshotPiece& p : pieces) {
      state_->device_ranges(p.buffer, p.offset, p.count, [&](size_t at, const float* src, size_t n) {
        copies.push_back({src, host + p.host_offset + (at - p.offset), n});
      });
    }
    snapshot(slot).start(copies);
  }
  void snapshot_wait(SnapshotSlot slot) override { snapshot(slot).wait(); }
  double snapshot_copy_seconds(SnapshotSlot slot) const override {
    return snapshots_[static_cast<int>(slot)]->copy_seconds();
  }
  CudaStateSnapshot& snapshot(SnapshotSlot slot) { return *snapshots_[static_cast<int>(slot)]; }
  void before_overwrite() {
    for (auto& snap : snapshots_) snap->before_overwrite();
  }

  uint64_t memory_bytes() const override { return device_bytes_; }

 private:
  const MicroEvents& micro_events(int k) {
    while (static_cast<int>(micro_events_.size()) <= k) {
      MicroEvents e;
      CUDA_CHECK(cudaEventCreate(&e.begin));
      CUDA_CHECK(cudaEventCreate(&e.mid));
      CUDA_CHECK(cudaEventCreate(&e.end));
      micro_events_.push_back(e);
    }
    return micro_events_[k];
  }

  // Plain record outside a capture; inside one, an external event-record node (a plain record would only
  // become an internal dependency of the graph, with no time taken).
  void mark(cudaEvent_t e) {
    if (capturing_) {
      CUDA_CHECK(cudaEventRecordWithFlags(e, stream_, cudaEventRecordExternal));
    } else {
      CUDA_CHECK(cudaEventRecord(e, stream_));
    }
  }

  CapturedMicroBatch capture(int B, float grad_scale, const MicroEvents& ev) {
    CapturedMicroBatch g;
    CUDA_CHECK(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeThreadLocal));
    capturing_ = true;
    micro_batch(B, grad_scale, ev);
    capturing_ = false;
    CUDA_CHECK(cudaStreamEndCapture(stream_, &g.graph));
    size_t n = 0;
    CUDA_CHECK(cudaGraphGetNodes(g.graph, nullptr, &n));
    std::vector<cudaGraphNode_t> nodes(n);
    CUDA_CHECK(cudaGraphGetNodes(g.graph, nodes.data(), &n));
    const std::array<cudaEvent_t, 3> events = {ev.begin, ev.mid, ev.end};
    for (cudaGraphNode_t node : nodes) {
      cudaGraphNodeType type;
      CUDA_CHECK(cudaGraphNodeGetType(node, &type));
      if (type != cudaGraphNodeTypeEventRecord) continue;
      cudaEvent_t e = nullptr;
      CUDA_CHECK(cudaGraphEventRecordNodeGetEvent(node, &e));
      for (int r = 0; r < 3; ++r) {
        if (e == events[r]) g.marks[r] = node;
      }
    }
    GANTRY_CHECK(g.marks[0] && g.marks[1] && g.marks[2],
                 "the captured micro-batch lacks its phase-event nodes");
    // The graph stays alive beside its instance: the event nodes are addressed through it at every launch.
    CUDA_CHECK(cudaGraphInstantiate(&g.exec, g.graph, 0));
    return g;
  }

  // Sums the step's event intervals. Events of the step must come in stream order (begin ≤ mid ≤ end ≤ next
  // begin ≤ … ≤ optimizer); an out-of-order pair means an event from an earlier step was read, and the step
  // is reported unmeasured rather than wrong.
  void read_phase_times() {
    phases_ = PhaseTimes{};
    phases_.measured = micro_in_step_ > 0 || optimizer_timed_;
    auto ms = [](cudaEvent_t a, cudaEvent_t b) {
      float t = 0;
      CUDA_CHECK(cudaEventElapsedTime(&t, a, b));
      return static_cast<double>(t);
    };
    cudaEvent_t last = nullptr;
    auto follows = [&](cudaEvent_t e) {
      if (last != nullptr && ms(last, e) < 0) phases_.measured = false;
      last = e;
    };
    for (int k = 0; k < micro_in_step_; ++k) {
      const MicroEvents& e = micro_events_[k];
      follows(e.begin);
      follows(e.mid);
      follows(e.end);
      phases_.forward_s += ms(e.begin, e.mid) * 1e-3;
      phases_.backward_s += ms(e.mid, e.end) * 1e-3;
    }
    if (dp_ != nullptr && micro_in_step_ > 0 && optimizer_timed_) {
      phases_.comm_exposed_s = ms(micro_events_[micro_in_step_ - 1].end, opt_begin_) * 1e-3;
    }
    // Tensor parallel: the compute stream's stalls for the tp stream are communication, not compute (as the
    // CPU backend counts its tp all-reduces); each is taken out of the phase it fell in.
    for (size_t k = 0; k < tp_waits_; ++k) {
      const TpWait& w = tp_wait_events_[k];
      const double s = std::max(0.0, ms(w.before, w.after) * 1e-3);
      phases_.comm_exposed_s += s;
      (w.forward ? phases_.forward_s : phases_.backward_s) -= s;
    }
    if (optimizer_timed_) {
      follows(opt_begin_);
      follows(opt_end_);
      phases_.optimizer_s = ms(opt_begin_, opt_end_) * 1e-3;
    }
  }

  template <class T>
  T* device(size_t count) {
    void* p = nullptr;
    const size_t bytes = std::max<size_t>(count, 1) * sizeof(T);
    CUDA_CHECK(cudaMalloc(&p, bytes));
    device_allocations_.push_back(p);
    device_bytes_ += bytes;
    return static_cast<T*>(p);
  }
  template <class T>
  T* pinned(size_t count) {
    void* p = nullptr;
    CUDA_CHECK(cudaMallocHost(&p, std::max<size_t>(count, 1) * sizeof(T)));
    host_allocations_.push_back(p);
    return static_cast<T*>(p);
  }

  void allocate() {
    const size_t P = table_.numel();
    const size_t B = max_batch_, T = m_.seq_len, C = m_.n_embd, NH = m_.n_head, V = m_.vocab_size;
    const size_t tp = static_cast<size_t>(tp_), Cl = C / tp, NHl = NH / tp, Hl = 4 * C / tp, Vl = V / tp;
    const size_t N = B * T;
    encoded_ = device<bf16>(N * C);
    layers_.resize(m_.n_layer);
    for (LayerActs& l : layers_) {
      l.ln1 = device<bf16>(N * C);
      l.ln1_mean = device<float>(N);
      l.ln1_rstd = device<float>(N);
      l.qkv = device<bf16>(N * 3 * Cl);
      l.atty = device<bf16>(N * Cl);
      l.lse = device<float>(B * NHl * T);
      l.res2 = device<bf16>(N * C);
      l.ln2 = device<bf16>(N * C);
      l.ln2_mean = device<float>(N);
      l.ln2_rstd = device<float>(N);
      l.fch_pre = device<bf16>(N * Hl);
      l.fch_gelu = device<bf16>(N * Hl);
      l.res3 = device<bf16>(N * C);
    }
    lnf_ = device<bf16>(N * C);
    lnf_mean_ = device<float>(N);
    lnf_rstd_ = device<float>(N);
    losses_ = device<float>(N);
    dln_ = device<bf16>(N * C);
    // The classifier works through the rows in chunks of logits, never all N × V. Its chunk lives in the
    // same memory as the backward pass's gradient buffers and tmp_nc, which are idle while it runs (it comes
    // after the forward's last use of tmp_nc and before the backward's first write of dres): the chunk is
    // as large as those buffers together, at least ~256 MB. Larger chunks mean fewer passes of the dwte
    // product over its fp32 V × C accumulator (at 124M, 7 instead of 13 passes of 309 MB a micro-batch).
    // Tensor parallel: the logits chunk holds this rank's Vl columns of its rows.
    const ClassifierRegion region = classifier_region(N, C, Vl);
    bf16* shared = device<bf16>(region.elements);
    dres_ = shared + region.dres;
    dfch_ = shared + region.dfch;
    dqkv_ = shared + region.dqkv;
    datty_ = shared + region.datty;
    tmp_nc_ = shared + region.tmp_nc;
    logits_ = shared;
    chunk_rows_ = static_cast<int>(std::min<size_t>(region.elements / Vl, N));
    if (tp_comm_ != nullptr) {
      // The vocab-parallel cross-entropy's per-row values: this rank's, and every rank's gathered.
      ce_max_ = device<float>(chunk_rows_);
      ce_all_max_ = device<float>(tp * chunk_rows_);
      ce_part_ = device<float>(2 * static_cast<size_t>(chunk_rows_));
      ce_all_part_ = device<float>(2 * tp * chunk_rows_);
    }
    const size_t scratch =
        std::max({layernorm_backward_scratch_floats(static_cast<int>(N), static_cast<int>(C)),
                  bias_backward_scratch_floats(static_cast<int>(N), static_cast<int>(C)),
                  bias_backward_scratch_floats(static_cast<int>(N), static_cast<int>(3 * C)),
                  bias_backward_scratch_floats(static_cast<int>(N), static_cast<int>(4 * C)),
                  attention_backward_scratch_floats(static_cast<int>(B), static_cast<int>(T),
                                                    static_cast<int>(NH), static_cast<int>(C / NH)),
                  global_norm_scratch_floats(P)});
    scratch_ = device<float>(scratch);
    eval_sum_ = device<float>(1);
    inputs_ = device<int32_t>(N);
    targets_ = device<int32_t>(N);
    bucket_token_ = device<int32_t>(N);
    bucket_start_ = device<int32_t>(N + 1);
    positions_ = device<int32_t>(N);
    for (int32_t*& slot : staging_) slot = pinned<int32_t>(5 * N + 1);
    host_stats_ = pinned<float>(2);
    token_count_.assign(V, 0);
  }

  // Where each tensor sits inside its unit: units are contiguous in the table (shard_plan.h), so these
  // offsets hold wherever a unit's parameters or gradients are kept.
  void layout_params() {
    const ShardPlan& plan = state_->plan();
    const int L = m_.n_layer;
    GANTRY_CHECK(table_.size() == static_cast<size_t>(4 + kBlockTensors * L),
                 "GPT-2's tensor table expected");
    auto in_unit = [&](size_t tensor, int unit) { return table_[tensor].offset - plan.units[unit].offset; };
    wpe_at_ = in_unit(1, plan.embedding_unit());
    GANTRY_CHECK(in_unit(0, plan.embedding_unit()) == 0, "wte begins the embeddings");
    lnf_w_at_ = in_unit(2 + kBlockTensors * L, plan.final_unit());
    lnf_b_at_ = in_unit(3 + kBlockTensors * L, plan.final_unit());
    for (int l = 0; l < L; ++l) {
      for (int k = 0; k < kBlockTensors; ++k) {
        const size_t at = in_unit(2 + kBlockTensors * l + k, 1 + l);
        GANTRY_CHECK(l == 0 || at == block_at_[k], "every block has the same layout");
        block_at_[k] = at;
      }
    }
  }

  // Units: 0 the embeddings, 1 + l block l, L + 1 the final norm.
  int final_unit() const { return m_.n_layer + 1; }
  BlockParams block_params(int l) { return block_at(state_->params(1 + l), block_at_); }
  BlockGrads block_grads(int l) { return block_at(state_->grads(1 + l), block_at_); }

  // Copies the batch to the device; with `buckets`, also the token-sorted positions the deterministic
  // embedding backward needs (a counting sort over the vocabulary, on the host, while the GPU works).
  void upload(const int32_t* inputs, const int32_t* targets, int B, bool buckets) {
    GANTRY_CHECK(
        B > 0 && B <= max_batch_,
        "batch " + std::to_string(B) + " exceeds the backend's max batch " + std::to_string(max_batch_));
    const int N = B * m_.seq_len;
    for (int i = 0; i < N; ++i) {
      GANTRY_CHECK(
          inputs[i] >= 0 && inputs[i] < m_.vocab_size && targets[i] >= 0 && targets[i] < m_.vocab_size,
          "token id out of [0, vocab_size)");
    }
    // Two staging slots in turn: the host fills one while the copy out of the other may still be queued,
    // and waits only for the copy issued two batches ago (long done), never for compute.
    slot_ ^= 1;
    CUDA_CHECK(cudaEventSynchronize(upload_done_[slot_]));
    int32_t* staging = staging_[slot_];
    int32_t* s_in = staging;
    int32_t* s_tg = staging + N;
    std::memcpy(s_in, inputs, N * sizeof(int32_t));
    std::memcpy(s_tg, targets, N * sizeof(int32_t));
    CUDA_CHECK(cudaMemcpyAsync(inputs_, s_in, N * sizeof(int32_t), cudaMemcpyHostToDevice, stream_));
    CUDA_CHECK(cudaMemcpyAsync(targets_, s_tg, N * sizeof(int32_t), cudaMemcpyHostToDevice, stream_));
    if (buckets) {
      int32_t* s_tok = staging + 2 * N;
      int32_t* s_start = staging + 3 * N;
      int32_t* s_pos = staging + 4 * N + 1;
      // Tensor parallel: only the tokens of this rank's wte rows, numbered from its first (v0).
      const int v0 = vocab_first(), v1 = v0 + m_.vocab_size / tp_;
      auto mine = [&](int32_t t) { return t >= v0 && t < v1; };
      for (int i = 0; i < N; ++i) {
        if (mine(inputs[i])) ++token_count_[inputs[i]];
      }
      int k = 0, at = 0;
      for (int v = v0; v < v1; ++v) {
        if (token_count_[v] == 0) continue;
        s_tok[k] = v - v0;
        s_start[k] = at;
        at += token_count_[v];
        token_count_[v] = s_start[k];  // becomes the fill cursor
        ++k;
      }
      for (int j = k; j <= N; ++j) s_start[j] = at;  // spare buckets are empty
      for (int i = 0; i < N; ++i) {
        if (mine(inputs[i])) s_pos[token_count_[inputs[i]]++] = i;  // positions ascend within a bucket
      }
      for (int i = 0; i < N; ++i) token_count_[inputs[i]] = 0;
      CUDA_CHECK(cudaMemcpyAsync(bucket_token_, s_tok, k * sizeof(int32_t), cudaMemcpyHostToDevice, stream_));
      CUDA_CHECK(cudaMemcpyAsync(bucket_start_, s_start, (N + 1) * sizeof(int32_t), cudaMemcpyHostToDevice,
                                 stream_));
      CUDA_CHECK(cudaMemcpyAsync(positions_, s_pos, N * sizeof(int32_t), cudaMemcpyHostToDevice, stream_));
    }
    CUDA_CHECK(cudaEventRecord(upload_done_[slot_], stream_));
  }

  void forward(int B) {
    const int T = m_.seq_len, C = m_.n_embd, NH = m_.n_head, HS = C / NH, N = B * T, L = m_.n_layer;
    const int Cl = C / tp_, NHl = NH / tp_, Hl = 4 * C / tp_;  // this tp rank's share
    // Under ZeRO 3 each unit's parameters are gathered just before use (the next one while this one
    // computes) and released after its last reader is enqueued.
    const bf16* embeddings = state_->params(0);
    state_->prefetch(1);
    if (tp_comm_ == nullptr) {
      encoder_forward_cuda(encoded_, inputs_, embeddings, embeddings + wpe_at_, N, T, C, stream_);
    } else {
      vocab_parallel_encoder_forward_cuda(encoded_, inputs_, embeddings, embeddings + wpe_at_, vocab_first(),
                                          m_.vocab_size / tp_, N, T, C, stream_);
      tp_all_reduce(encoded_, static_cast<size_t>(N) * C);
    }
    for (int l = 0; l < L; ++l) {
      const BlockParams p = block_params(l);
      state_->prefetch(2 + l);
      LayerActs& a = layers_[l];
      // This block's first norm also finishes the previous block: res3 = res2 + its MLP output.
      if (l == 0) {
        residual_layernorm_forward_cuda(nullptr, a.ln1, a.ln1_mean, a.ln1_rstd, encoded_, nullptr, p.ln1_w,
                                        p.ln1_b, N, C, stream_);
      } else {
        residual_layernorm_forward_cuda(layers_[l - 1].res3, a.ln1, a.ln1_mean, a.ln1_rstd,
                                        layers_[l - 1].res2, tmp_nc_, p.ln1_w, p.ln1_b, N, C, stream_);
      }
      const bf16* residual = l == 0 ? encoded_ : layers_[l - 1].res3;
      matmul_->forward(a.qkv, a.ln1, p.qkv_w, p.qkv_b, N, C, 3 * Cl, nullptr);  // column-parallel
      attention_forward(a.atty, a.lse, a.qkv, B, T, NHl, HS, stream_);
      row_parallel_forward(tmp_nc_, a.atty, p.proj_w, p.proj_b, N, Cl, C);
      residual_layernorm_forward_cuda(a.res2, a.ln2, a.ln2_mean, a.ln2_rstd, residual, tmp_nc_, p.ln2_w,
                                      p.ln2_b, N, C, stream_);
      matmul_->forward(a.fch_gelu, a.ln2, p.fc_w, p.fc_b, N, C, Hl, a.fch_pre);  // column-parallel
      row_parallel_forward(tmp_nc_, a.fch_gelu, p.fcproj_w, p.fcproj_b, N, Hl, C);
      state_->release(1 + l);
    }
    const bf16* lnf = state_->params(final_unit());
    if (L == 0) {
      residual_layernorm_forward_cuda(nullptr, lnf_, lnf_mean_, lnf_rstd_, encoded_, nullptr, lnf + lnf_w_at_,
                                      lnf + lnf_b_at_, N, C, stream_);
    } else {
      residual_layernorm_forward_cuda(layers_[L - 1].res3, lnf_, lnf_mean_, lnf_rstd_, layers_[L - 1].res2,
                                      tmp_nc_, lnf + lnf_w_at_, lnf + lnf_b_at_, N, C, stream_);
    }
  }

  // The forward phase ends where the classifier starts: its chunks each do one forward and two gradient
  // products, fused with the loss, so counting them as backward misplaces the least time.
  void micro_batch(int B, float grad_scale, const MicroEvents& ev) {
    const int N = B * m_.seq_len;
    mark(ev.begin);
    tp_in_forward_ = true;
    forward(B);
    mark(ev.mid);
    tp_in_forward_ = false;
    classifier(B, grad_scale / static_cast<float>(N), true);
    sum_accumulate_cuda(state_->loss_sum(), losses_, N, stream_);
    backward(B);
    mark(ev.end);
  }

  // Logits, loss and (with backward) dlogits → dlnf and dwte, a chunk of rows at a time.
  void classifier(int B, float dloss, bool backward) {
    const int C = m_.n_embd, V = m_.vocab_size / tp_, N = B * m_.seq_len;  // V: this tp rank's vocabulary
    const bf16* wte = state_->params(0);
    float* dwte = backward ? state_->grads(0) : nullptr;  // wte begins the embeddings
    // Chunks of nearly equal size (a multiple of 128 rows where that fits), so no last chunk is a sliver.
    const int chunks = (N + chunk_rows_ - 1) / chunk_rows_;
    const int even = (N + chunks - 1) / chunks;
    const int step = std::min(chunk_rows_, (even + 127) / 128 * 128);
    for (int r0 = 0; r0 < N; r0 += step) {
      const int rows = std::min(step, N - r0);
      const bf16* x = lnf_ + static_cast<size_t>(r0) * C;
      matmul_->forward(logits_, x, wte, nullptr, rows, C, V, nullptr);
      if (tp_comm_ == nullptr) {
        classifier_cuda(logits_, losses_ + r0, targets_ + r0, dloss, backward, rows, V, stream_);
      } else {
        vocab_parallel_classifier(r0, rows, dloss, backward);
      }
      if (!backward) continue;
      bf16* dx = dln_ + static_cast<size_t>(r0) * C;
      matmul_->backward_input(dx, logits_, wte, rows, C, V, nullptr);
      // Tensor parallel: each rank's d(lnf) is the part of the sum over its vocabulary; its all-reduce runs
      // under the dwte product.
      if (tp_comm_ != nullptr) tp_all_reduce_start(dx, static_cast<size_t>(rows) * C);
      matmul_->backward_weight(dwte, logits_, x, rows, C, V);
    }
    if (backward && tp_comm_ != nullptr) tp_join();
  }

  // The cross-entropy of one chunk of rows over the tp group's vocabulary (cuda/vocab_parallel.cuh): this
  // rank's logits_ (rows, Vl) become its columns of d(logits) when `backward`.
  void vocab_parallel_classifier(int r0, int rows, float dloss, bool backward) {
    const int Vl = m_.vocab_size / tp_;
    const size_t n = static_cast<size_t>(rows) * tp_;
    vocab_parallel_row_max_cuda(ce_max_, logits_, rows, Vl, stream_);
    tp_all_gather(ce_max_, ce_all_max_, n);
    vocab_parallel_sum_exp_cuda(ce_part_, logits_, ce_all_max_, targets_ + r0, vocab_first(), tp_, rows, Vl,
                                stream_);
    tp_all_gather(ce_part_, ce_all_part_, 2 * n);
    vocab_parallel_loss_cuda(logits_, losses_ + r0, ce_all_max_, ce_all_part_, targets_ + r0, vocab_first(),
                             tp_, dloss, backward, rows, Vl, stream_);
  }

  // ---- tensor parallel collectives: on tp_stream_, ordered against the compute stream by events ----
  // The first tp rank of this rank's vocabulary rows of wte (0 at tp 1).
  int vocab_first() const { return tp_rank_ * (m_.vocab_size / tp_); }
  // The tp stream starts after what the compute stream has enqueued so far.
  void tp_follow() {
    CUDA_CHECK(cudaEventRecord(tp_before_, stream_));
    CUDA_CHECK(cudaStreamWaitEvent(tp_stream_, tp_before_));
  }
  // The compute stream waits for every tp collective enqueued so far. Two timing events on the compute
  // stream bracket the wait: the time between them is how long the compute stood still for tp traffic (the
  // exposed part; what the products hid does not show).
  void tp_join() {
    CUDA_CHECK(cudaEventRecord(tp_after_, tp_stream_));
    if (tp_waits_ == tp_wait_events_.size()) {
      TpWait w;
      CUDA_CHECK(cudaEventCreate(&w.before));
      CUDA_CHECK(cudaEventCreate(&w.after));
      tp_wait_events_.push_back(w);
    }
    TpWait& w = tp_wait_events_[tp_waits_++];
    w.forward = tp_in_forward_;
    CUDA_CHECK(cudaEventRecord(w.before, stream_));
    CUDA_CHECK(cudaStreamWaitEvent(stream_, tp_after_));
    CUDA_CHECK(cudaEventRecord(w.after, stream_));
  }
  // x (count, bf16) becomes the sum over the tp ranks; the compute stream may go on with work that neither
  // reads nor writes x until tp_join().
  void tp_all_reduce_start(bf16* x, size_t count) {
    tp_follow();
    check(tp_comm_->all_reduce_bf16_enqueue(x, count, tp_stream_));
  }
  void tp_all_reduce(bf16* x, size_t count) {
    tp_all_reduce_start(x, count);
    tp_join();
  }
  // out (count floats) = every tp rank's count / tp values of `in`, in rank order.
  void tp_all_gather(const float* in, float* out, size_t count) {
    tp_follow();
    check(tp_comm_->all_gather_enqueue(in, out, count, sizeof(float), tp_stream_));
    tp_join();
  }
  // out (N, C) = inp (N, K) · w (C, K)ᵀ + bias. Tensor parallel: w holds this rank's K input columns, so
  // out is a partial sum, all-reduced; tp rank 0 alone adds the (whole) bias, so the sum holds it once.
  // The rows go in two halves where they split evenly (16-byte aligned): the first half's all-reduce runs
  // under the second half's product, and the compute stream waits only for the second's.
  void row_parallel_forward(bf16* out, const bf16* inp, const bf16* w, const bf16* bias, int N, int K,
                            int C) {
    const bf16* b = tp_rank_ == 0 ? bias : nullptr;
    if (tp_comm_ == nullptr) {
      matmul_->forward(out, inp, w, b, N, K, C, nullptr);
      return;
    }
    const int parts = N % 16 == 0 && K % 8 == 0 && C % 8 == 0 ? 2 : 1;
    const int rows = N / parts;
    for (int part = 0; part < parts; ++part) {
      const size_t r0 = static_cast<size_t>(part) * rows;
      matmul_->forward(out + r0 * C, inp + r0 * K, w, b, rows, K, C, nullptr);
      tp_all_reduce_start(out + r0 * C, static_cast<size_t>(rows) * C);
    }
    tp_join();
  }

  void backward(int B) {
    const int T = m_.seq_len, C = m_.n_embd, NH = m_.n_head, HS = C / NH, N = B * T, L = m_.n_layer;
    const int Cl = C / tp_, NHl = NH / tp_, Hl = 4 * C / tp_;  // this tp rank's share
    const size_t NC = static_cast<size_t>(N) * C;
    // Each LayerNorm backward also sums the dres it leaves into the gradient of the bias whose output that
    // residual stream is (no separate bias pass). The final norm writes dres (no memset first); dres is then
    // d(res3) of the last block, whose MLP projection bias it is.
    const bf16* top = L > 0 ? layers_[L - 1].res3 : encoded_;
    float* top_bias = L > 0 ? block_grads(L - 1).fcproj_b : nullptr;
    const bf16* lnf = state_->params(final_unit());
    float* dlnf = state_->grads(final_unit());
    layernorm_backward_cuda(dres_, dlnf + lnf_w_at_, dlnf + lnf_b_at_, top_bias, scratch_, dln_, top,
                            lnf + lnf_w_at_, lnf_mean_, lnf_rstd_, N, C, false, stream_);
    state_->grads_done(final_unit());
    for (int l = L - 1; l >= 0; --l) {
      const BlockParams p = block_params(l);
      state_->prefetch(l);  // the block below (or the embeddings, which stay gathered for the step)
      const BlockGrads g = block_grads(l);
      LayerActs& a = layers_[l];
      const bf16* residual = l == 0 ? encoded_ : layers_[l - 1].res3;
      // MLP branch, reading d(res3) before the second norm's contribution turns dres into d(res2).
      // Tensor parallel: d(res3) is whole on every rank, so the row-parallel projection's input gradient is
      // this rank's share with no traffic; the column-parallel MLP-up's (dln) is a partial sum, all-reduced
      // under its weight and bias gradients.
      matmul_->backward_weight(g.fcproj_w, dres_, a.fch_gelu, N, Hl, C);
      matmul_->backward_input(dfch_, dres_, p.fcproj_w, N, Hl, C, a.fch_pre);
      matmul_->backward_input(dln_, dfch_, p.fc_w, N, C, Hl, nullptr);
      if (tp_comm_ != nullptr) tp_all_reduce_start(dln_, NC);
      bias_backward_cuda(g.fc_b, scratch_, dfch_, N, Hl, stream_);
      matmul_->backward_weight(g.fc_w, dfch_, a.ln2, N, C, Hl);
      if (tp_comm_ != nullptr) tp_join();
      // dres becomes d(res2): the attention projection's bias gradient.
      layernorm_backward_cuda(dres_, g.ln2_w, g.ln2_b, g.proj_b, scratch_, dln_, a.res2, p.ln2_w, a.ln2_mean,
                              a.ln2_rstd, N, C, true, stream_);
      // Attention branch, then the first norm turns dres into d(residual in).
      matmul_->backward_weight(g.proj_w, dres_, a.atty, N, Cl, C);
      matmul_->backward_input(datty_, dres_, p.proj_w, N, Cl, C, nullptr);
      attention_backward(dqkv_, datty_, a.atty, a.lse, a.qkv, scratch_, B, T, NHl, HS, stream_,
                         deterministic_);
      matmul_->backward_input(dln_, dqkv_, p.qkv_w, N, C, 3 * Cl, nullptr);
      if (tp_comm_ != nullptr) tp_all_reduce_start(dln_, NC);  // column-parallel QKV: as MLP-up's above
      matmul_->backward_weight(g.qkv_w, dqkv_, a.ln1, N, C, 3 * Cl);
      bias_backward_cuda(g.qkv_b, scratch_, dqkv_, N, 3 * Cl, stream_);
      if (tp_comm_ != nullptr) tp_join();
      // dres becomes d(res3) of the block below: its MLP projection's bias gradient.
      float* below_bias = l > 0 ? block_grads(l - 1).fcproj_b : nullptr;
      layernorm_backward_cuda(dres_, g.ln1_w, g.ln1_b, below_bias, scratch_, dln_, residual, p.ln1_w,
                              a.ln1_mean, a.ln1_rstd, N, C, true, stream_);
      state_->release(1 + l);
      state_->grads_done(
          1 + l);  // block l's gradients are complete (block l + 1 wrote its MLP projection bias's)
    }
    // A fixed grid of N buckets (the most a batch can have; spare ones are empty) keeps this launch the
    // same for every batch of a shape, as graph replay needs.
    float* dembeddings = state_->grads(0);
    encoder_backward_cuda(dembeddings, dembeddings + wpe_at_, dres_, bucket_token_, bucket_start_, positions_,
                          N, B, T, C, stream_);
    state_->grads_done(0);  // the embeddings: the classifier wrote wte's gradient first, the encoder last
  }

  static void check(const Status& st) {
    if (!st.ok()) fatal_error(__FILE__, __LINE__, st.message());
  }

  ModelConfig m_;
  int max_batch_;
  int tp_ = 1, tp_rank_ = 0;  // the tp degree and this rank's place (1, 0 without tensor parallelism)
  TensorTable table_;
  int device_ = 0;
  cudaStream_t stream_ = nullptr;
  cudaEvent_t upload_done_[2] = {nullptr, nullptr};
  // Checkpoint and in-memory copies into pinned memory, one per SnapshotSlot.
  std::unique_ptr<CudaStateSnapshot> snapshots_[kSnapshotSlots];
  std::unique_ptr<Matmul> matmul_;
  std::vector<void*> device_allocations_, host_allocations_;
  size_t device_bytes_ = 0;

  std::unique_ptr<ZeroDeviceState> state_;
  size_t wpe_at_ = 0, lnf_w_at_ = 0, lnf_b_at_ = 0;  // inside the embeddings' and the final norm's units
  BlockLayout block_at_{};

  bf16* encoded_ = nullptr;
  std::vector<LayerActs> layers_;
  bf16* lnf_ = nullptr;
  float *lnf_mean_ = nullptr, *lnf_rstd_ = nullptr;
  int chunk_rows_ = 0;
  bf16* logits_ = nullptr;
  float* losses_ = nullptr;
  bf16* tmp_nc_ = nullptr;
  bf16 *dres_ = nullptr, *dln_ = nullptr, *datty_ = nullptr, *dqkv_ = nullptr, *dfch_ = nullptr;
  float* scratch_ = nullptr;
  float* eval_sum_ = nullptr;
  int32_t *inputs_ = nullptr, *targets_ = nullptr;
  int32_t *bucket_token_ = nullptr, *bucket_start_ = nullptr, *positions_ = nullptr;
  bool graphs_;
  bool deterministic_;
  std::map<std::pair<int, float>, CapturedMicroBatch> graphs_by_shape_;
  bool capturing_ = false;
  std::vector<MicroEvents> micro_events_;  // one set per micro-batch of a step, reused step after step
  int micro_in_step_ = 0;                  // micro-batches since zero_grads()
  cudaEvent_t opt_begin_ = nullptr, opt_end_ = nullptr;
  bool optimizer_timed_ = false;
  PhaseTimes phases_;
  std::unique_ptr<DeviceSensorMonitor> sensors_;
  std::set<std::pair<int, float>> seen_shapes_;
  int32_t* staging_[2] = {nullptr, nullptr};  // pinned host slots for the batch and its embedding buckets
  int slot_ = 0;
  float* host_stats_ = nullptr;
  std::vector<int32_t> token_count_;
  int64_t tokens_ = 0;

  // Data parallel: the dp communicator (null on one GPU) and its collectives' timeout (the tp axis' too).
  Communicator* dp_ = nullptr;
  std::chrono::milliseconds dp_timeout_{0};
  // Tensor parallel: the tp axis (null at tp 1), its stream and the events ordering it against the compute
  // stream, and the vocab-parallel cross-entropy's per-row values (chunk_rows_ each; all_*: every rank's).
  Communicator* tp_comm_ = nullptr;
  cudaStream_t tp_stream_ = nullptr;
  cudaEvent_t tp_before_ = nullptr, tp_after_ = nullptr;
  // The compute stream's waits for the tp stream since begin_step, each bracketed by two timing events
  // (reused step after step), and whether it fell in a micro-batch's forward phase.
  struct TpWait {
    cudaEvent_t before = nullptr, after = nullptr;
    bool forward = false;
  };
  std::vector<TpWait> tp_wait_events_;
  size_t tp_waits_ = 0;
  bool tp_in_forward_ = false;
  float *ce_max_ = nullptr, *ce_all_max_ = nullptr, *ce_part_ = nullptr, *ce_all_part_ = nullptr;
};

}  // namespace

std::unique_ptr<Backend> backend_cuda_create(const ModelConfig& m, int max_batch, bool graphs,
                                             bool deterministic, const CudaDataParallel& dp,
                                             const CudaTensorParallel& tp) {
  return std::make_unique<CudaBackend>(m, max_batch, graphs, deterministic, dp, tp);
}

}  // namespace gantry
