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
//
// Pipeline parallel (CudaPipeline, parallel/pipeline_schedule.h): the backend is then one stage, holding
// pipeline_rank_table's tensors: its blocks, the embeddings on stage 0, the final norm on the last. Under
// interleaved 1F1B (vp > 1) the stage holds vp model chunks, chunk c being virtual stage c * pp + stage.
// The same forward() and backward() run over one chunk's blocks (use_chunk; the input received from the
// previous virtual stage instead of the encoder's, d(output) from the next instead of the final norm's);
// each (micro-batch, chunk) in flight has its own activations (a StageSlot). The train loop's micro-batches
// are kept until the step's last one, then the rank's pipeline_program is enqueued: computes, and bf16
// activations and input gradients sent with NCCL on the compute stream, so stream order is the program's
// order and the host never waits mid-step. The tied wte: stage 0 owns it (updated, counted in the norm,
// checkpointed there); it sends its bf16 copy to the last stage at each step's start (and before validation),
// and the last stage sends back the classifier's fp32 weight gradient once per step, added to stage 0's
// before the dp reductions. The stage's dp reductions run after the schedule at ZeRO 0-1; at ZeRO 2-3
// each backward (interleaved: each chunk's, whose buckets are its own; ZB-H1: each weight pass)
// reduce-scatters its buckets as it completes them (ZeRO 3 also gathers each block before every forward and
// backward or input pass), and the tied gradient joins stage 0's last embeddings reduction; the gradient norm
// sums every stage's squares over pp (ZeroDeviceState's tp path, every tensor counted as split), the loss is
// the last stage's, summed over pp (the others add 0), so both are the same on every rank.
//
// Sequence parallel (train.sequence_parallel, at pp 1; Megatron-LM SP, Korthikanti et al. 2022): each tp
// rank keeps rows [r·N/tp, (r+1)·N/tp) of the flattened (B·T) residual stream (whole sequences where tp
// divides B; the CPU backend's split is by position, and either is the same sum): the encoder's output and
// every res2 and res3. The row-parallel products' partial sums are reduce-scattered (bf16) instead of
// all-reduced, the LayerNorms run on the rank's rows, and each norm's output is all-gathered in place into
// the whole (N, C) buffer the next column-parallel product reads (kept for its weight gradient: the
// backward gathers no activation). Backward, d(res) is all-gathered before each row-parallel product's
// backward and the column-parallel input gradients are reduce-scattered; the LayerNorms' weight and bias
// gradients and those of the row-parallel biases their backward sums are then each rank's rows' part,
// summed over tp once a step by ZeroDeviceState (tp_partial); wpe's comes from the gathered d(encoded),
// whole. Same bytes on the wire as the all-reduces, and the residual stream at 1/tp of its memory.
//
// Tensor x pipeline parallel (tp x pp, x dp at ZeRO 0-3): each stage's blocks split over its tp group
// exactly as at pp 1 (tensor_parallel_stage_table); stage 0's embedding and the last stage's cross-entropy
// are vocab-parallel, the last stage's wte copy being the V/tp rows of the same tp rank on stage 0. The pp
// communicator joins the same tp rank of every stage, so activations (whole N x C on every tp rank), the
// wte copy and its gradient go between matching tp ranks. The norm sums the split tensors' squares over
// tp, then every stage's total over pp (ZeroDeviceState); the loss is the last stage's, summed over pp.
// The order of every communicator's operations is written down at pipeline_step().
#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <map>
#include <optional>
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
#include "engine/core/parallel/pipeline_schedule.h"
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
  bf16* res2;       // (N, C); sequence parallel: (N/tp, C), this rank's rows
  bf16* ln2;        // (N, C)
  float* ln2_mean;  // (N)
  float* ln2_rstd;  // (N)
  bf16* fch_pre;    // (N, Hl) before GELU, for the GELU derivative
  bf16* fch_gelu;   // (N, Hl) after GELU, for the weight gradient (stored: recomputing cost 3.5 ms a step)
  bf16* res3;       // (N, C); sequence parallel: (N/tp, C)
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

// Pipeline parallel: a micro-batch as the train loop gave it, the activations of one micro-batch in flight
// through a stage, and the events around its forward and backward computes.
struct PipeMicro {
  std::vector<int32_t> inputs, targets;
  int batch = 0;
  float grad_scale = 0;
};
// ZB-H1: what a block's weight-gradient pass (kWeight) reads, kept from its input-gradient pass (kInput):
// the output gradients of its four products (this tp rank's shares of d(fch) and d(qkv)).
struct KeptGrads {
  bf16 *dres3 = nullptr, *dfch = nullptr, *dres2 = nullptr, *dqkv = nullptr;
};
// ZB-H1: the parameter gradients the input pass writes (the LayerNorms' and the projection biases they sum),
// by index in BlockTensors order. At ZeRO 2-3 the input pass adds them into a per-slot buffer
// (StageSlot::early, C floats each, in this order, block after block, then the final norm's weight and bias
// on the model's last chunk) and the weight pass adds that into the gradients, so each micro-batch's
// gradients reach the dp state in its weight pass alone, whatever other micro-batch's input pass ran in
// between. (At ZeRO 0-1 both passes add into the full gradient buffer, reduced after the schedule.)
constexpr std::array<int, 6> kInputPassTensors = {0, 1, 5, 6, 7, 11};  // ln1_w, ln1_b, proj_b, ln2_w, ln2_b,
                                                                       // fcproj_b
struct StageSlot {
  bf16* in = nullptr;    // (N, C): the stage's input (the encoder's output on stage 0)
  bf16* dout = nullptr;  // (N, C): d(output) received, then d(input) to send
  std::vector<LayerActs> layers;
  std::vector<KeptGrads> kept;  // ZB-H1: per block
  float* early = nullptr;       // ZB-H1 at ZeRO 2-3: the input pass's parameter gradients (kInputPassTensors)
  bf16* lnf = nullptr;          // last stage: the final norm's output and statistics
  float *lnf_mean = nullptr, *lnf_rstd = nullptr;
  bf16* dlogits = nullptr;  // ZB-H1, last stage: (N, V/tp) d(logits) from the input pass for the weight pass
  bool busy = false;
};
struct PipeEvents {
  // A micro-batch's computes: forward, backward (ZB-H1: its input-gradient pass), ZB-H1's weight pass.
  cudaEvent_t f0 = nullptr, f1 = nullptr, b0 = nullptr, b1 = nullptr, w0 = nullptr, w1 = nullptr;
};
// backward()'s passes: both gradients, or ZB-H1's input gradient (kInput) and weight gradient (kWeight).
enum class BackwardPart { kWhole, kInput, kWeight };

// The tp degree and this rank's place in it (1 and 0 without tensor parallelism).
int tp_size_of(const CudaTensorParallel& tp) {
  return tp.comm != nullptr ? tp.comm->size() : 1;
}
int tp_rank_of(const CudaTensorParallel& tp) {
  return tp.comm != nullptr && tp.comm->size() > 1 ? tp.comm->rank() : 0;
}

// This rank's tensors: the whole model's tp share (tensor_parallel_table), or under pp its stage's tensors
// (pipeline_rank_table), at tp > 1 each cut to its tp share (tensor_parallel_stage_table, as the CPU
// pipeline's stages at tp x pp).
TensorTable stage_table(const ModelConfig& m, const PipelinePartition& part, int stages, int stage, int tp,
                        int tp_rank, bool pipeline) {
  if (!pipeline) return tensor_parallel_table(m, tp, tp_rank);
  const TensorTable t = pipeline_rank_table(m, part, stages, stage);
  return tp > 1 ? tensor_parallel_stage_table(m, tp, tp_rank, t) : t;
}

class CudaBackend final : public Backend {
 public:
  CudaBackend(const ModelConfig& m, int max_batch, bool graphs, bool deterministic,
              const CudaDataParallel& dp, const CudaTensorParallel& tp, const CudaPipeline& pp)
      : m_(m),
        max_batch_(max_batch),
        tp_(tp_size_of(tp)),
        tp_rank_(tp_rank_of(tp)),
        pp_comm_(pp.comm != nullptr && pp.comm->size() > 1 ? pp.comm : nullptr),
        stage_(pp_comm_ != nullptr ? pp_comm_->rank() : 0),
        stages_(pp_comm_ != nullptr ? pp_comm_->size() : 1),
        vp_(pp_comm_ != nullptr ? std::max(1, pp.vp) : 1),
        // Virtual stages (stages_ x vp_ of them; one per rank at vp 1). The classifier's weight gradient
        // runs on the last.
        part_(pipeline_partition(m, stages_ * vp_, ClassifierGradStage::kLast)),
        table_(stage_table(m, part_, stages_, stage_, tp_, tp_rank_, pp_comm_ != nullptr)),
        // The bucket reductions (and the tp all-reduces) are issued by the host as the passes are enqueued;
        // a graph replay would skip them, so data and tensor parallel runs launch kernels directly.
        graphs_(graphs && (dp.comm == nullptr || dp.comm->size() == 1) && tp_ == 1 && pp_comm_ == nullptr),
        deterministic_(deterministic),
        dp_(dp.comm != nullptr && dp.comm->size() > 1 ? dp.comm : nullptr),
        dp_timeout_(dp.timeout),
        tp_comm_(tp_ > 1 ? tp.comm : nullptr),
        sp_(tp_ > 1 && tp.sequence_parallel) {
    GANTRY_CHECK(dp.zero >= 0 && dp.zero <= 3, "zero stage " + std::to_string(dp.zero) + " (allowed 0-3)");
    GANTRY_CHECK(m.n_head % tp_ == 0 && (4 * m.n_embd) % tp_ == 0 && m.vocab_size % tp_ == 0,
                 "tp " + std::to_string(tp_) + " must divide model.n_head " + std::to_string(m.n_head) +
                     ", the MLP width " + std::to_string(4 * m.n_embd) + " and model.vocab_size " +
                     std::to_string(m.vocab_size));
    GANTRY_CHECK(!sp_ || (pp_comm_ == nullptr && m.seq_len % tp_ == 0),
                 "sequence parallelism runs at pp 1 with seq_len a multiple of tp " + std::to_string(tp_));
    if (pp_comm_ != nullptr) {
      GANTRY_CHECK(pipeline_schedule_from_name(pp.schedule, &schedule_) &&
                       (schedule_ == PipelineSchedule::kInterleaved) == (vp_ > 1),
                   "train.pp_schedule \"" + pp.schedule + "\" with vp " + std::to_string(vp_) +
                       ": the GPU pipeline runs \"gpipe\", \"1f1b\" and \"zbh1\" at vp 1, \"interleaved\" at "
                       "vp > 1");
      split_backward_ = schedule_ == PipelineSchedule::kZeroBubbleH1;
      // Chunk c is virtual stage c * stages_ + stage_: its blocks follow chunk c - 1's in the rank's table.
      for (int c = 0; c < vp_; ++c) {
        chunk_first_.push_back(n_local_);
        chunk_layers_.push_back(part_.layers[c * stages_ + stage_]);
        n_local_ += chunk_layers_.back();
      }
      first_layer_ = part_.first_layer[stage_];
      embed_ = stage_ == 0;
      head_ = stage_ == stages_ - 1;
    } else {
      n_local_ = m.n_layer;
      chunk_first_ = {0};
      chunk_layers_ = {n_local_};
    }
    use_chunk(0);
    slots_.resize(vp_);
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
    // One GPU shards nothing: ZeRO 0 whatever was asked. Under interleaving each chunk's first block begins
    // a bucket: at ZeRO 2-3 each backward completes its own chunk's buckets (pipeline_step).
    const std::vector<int> chunk_starts = pipeline_chunk_bucket_starts(part_, stages_, stage_);
    ShardPlan plan = dp_ != nullptr ? shard_plan_make(table_, dp_->size(), dp_->rank(), dp.zero,
                                                      dp.bucket_bytes, chunk_starts)
                                    : shard_plan_make(table_, 1, 0, 0, dp.bucket_bytes);
    // The norm's two further axes: tp (the split tensors' squares summed over it, the whole ones' counted
    // once), then pp (every stage's tensors are its own, so each stage's total is summed over the stages).
    // Sequence parallel: every whole tensor's gradient but wpe's (from the gathered d(encoded)) is the
    // rank's rows' part, summed over tp once a step.
    std::vector<bool> sharded, partial;
    for (const TensorInfo& t : table_.tensors()) {
      sharded.push_back(tensor_parallel_sharded(t.name));
      if (sp_) partial.push_back(!sharded.back() && t.name != "wpe");
    }
    state_ = std::make_unique<ZeroDeviceState>(
        table_, std::move(plan), dp_, dp_timeout_, stream_, scratch_,
        [this](size_t bytes) { return device<char>(bytes); }, tp_comm_, std::move(sharded), pp_comm_,
        partial);
    for (auto& snap : snapshots_) snap = std::make_unique<CudaStateSnapshot>(stream_);
    layout_params();
  }

  ~CudaBackend() override {
    // Bounded: all-reduces queued behind a dead tp peer must not hang the teardown.
    if (tp_comm_ != nullptr) (void)tp_comm_->sync(tp_stream_, dp_timeout_);
    if (pp_comm_ != nullptr) (void)pp_comm_->sync(stream_, dp_timeout_);  // a dead stage: bounded too
    cudaStreamSynchronize(stream_);
    for (PipeEvents& e : pipe_events_) {
      for (cudaEvent_t x : {e.f0, e.f1, e.b0, e.b1, e.w0, e.w1}) cudaEventDestroy(x);
    }
    for (cudaEvent_t x : {span_begin_, span_end_, tokens_copied_}) {
      if (x != nullptr) cudaEventDestroy(x);
    }
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
    if (pp_comm_ != nullptr) {
      // A stage keeps the step's micro-batches and runs its program when the last one arrives.
      GANTRY_CHECK(
          B > 0 && B <= max_batch_,
          "batch " + std::to_string(B) + " exceeds the backend's max batch " + std::to_string(max_batch_));
      GANTRY_CHECK(static_cast<int>(micros_.size()) < expected_micros_,
                   "a pipeline step got more micro-batches than begin_step(" +
                       std::to_string(expected_micros_) + ") announced");
      const size_t n = static_cast<size_t>(B) * m_.seq_len;
      micros_.push_back({std::vector<int32_t>(inputs, inputs + n), std::vector<int32_t>(targets, targets + n),
                         B, grad_scale});
      tokens_ += static_cast<int64_t>(n);
      if (static_cast<int>(micros_.size()) == expected_micros_) pipeline_step();
      return;
    }
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
    if (pp_comm_ != nullptr) return pipeline_forward_loss(inputs, targets, B);
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
    // A pipeline stage at ZeRO 0-1 adds every micro-batch into the full gradient buffer and hands the dp
    // state one (its reductions run after the schedule); at ZeRO 2-3 each backward is a micro-batch of its
    // own, reduced as it completes its buckets (pipeline_step).
    // Under interleaving each chunk's backward of each micro-batch is one (vp of them per micro-batch).
    state_->begin_step(pp_comm_ != nullptr && !stage_reduces_per_micro_batch() ? 1 : micro_batches * vp_);
    expected_micros_ = std::max(1, micro_batches);
    micros_.clear();
    pipe_micros_ = 0;
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
    // The loss is the last stage's (the others' sums are 0): summed over pp, every rank reports it.
    if (pp_comm_ != nullptr) check(pp_comm_->all_reduce_enqueue(state_->loss_sum(), 1, stream_));
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
    if (pp_comm_ != nullptr) check(pp_comm_->sync(stream_, dp_timeout_));
    CUDA_CHECK(cudaStreamSynchronize(stream_));
    StepStats s;
    const double tokens = static_cast<double>(tokens_) * (dp_ != nullptr ? dp_->size() : 1);  // equal shares
    s.loss = tokens_ ? host_stats_[0] / tokens : 0.0;
    s.grad_norm = host_stats_[1];
    s.updated = std::isfinite(s.grad_norm);
    if (pp_comm_ != nullptr) {
      read_pipeline_phase_times();
    } else {
      read_phase_times();  // every event is complete now: no further wait
    }
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
    const size_t tp = static_cast<size_t>(tp_), Vl = V / tp;
    const size_t N = B * T;
    // A pipeline stage's activations are per micro-batch in flight (StageSlot); lnf_'s buffers then serve a
    // chunk before the model's last as the unused norm output of its hand-off (handoff_ln_, forward()).
    if (pp_comm_ == nullptr) {
      encoded_ = device<bf16>(N * C);
      layers_.resize(m_.n_layer);
      for (LayerActs& l : layers_) l = layer_acts();
    } else {
      // The tied wte's copy and gradients: this tp rank's V/tp rows (the same rank of stage 0 owns them).
      if (head_) wte_copy_ = device<bf16>(Vl * C), dwte_ = device<float>(Vl * C);
      if (embed_) dwte_in_ = device<float>(Vl * C);
      CUDA_CHECK(cudaEventCreate(&span_begin_));
      CUDA_CHECK(cudaEventCreate(&span_end_));
      CUDA_CHECK(cudaEventCreateWithFlags(&tokens_copied_, cudaEventDisableTiming));
    }
    lnf_ = device<bf16>(N * C);
    lnf_mean_ = device<float>(N);
    lnf_rstd_ = device<float>(N);
    handoff_ln_ = lnf_, handoff_mean_ = lnf_mean_, handoff_rstd_ = lnf_rstd_;
    losses_ = device<float>(N);
    dln_ = device<bf16>(N * C);
    // The classifier works through the rows in chunks of logits, never all N × V. Its chunk lives in the
    // same memory as the backward pass's gradient buffers and tmp_nc, which are idle while it runs (it comes
    // after the forward's last use of tmp_nc and before the backward's first write of dres): the chunk is
    // as large as those buffers together, at least ~256 MB. Larger chunks mean fewer passes of the dwte
    // product over its fp32 V × C accumulator (at 124M, 7 instead of 13 passes of 309 MB a micro-batch).
    // Tensor parallel: the logits chunk holds this rank's Vl columns of its rows.
    // A pipeline stage before the last runs no classifier: its region is the gradient buffers alone.
    const ClassifierRegion region = classifier_region(N, C, head_ ? Vl : 1);
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
    own_tokens_ = device<int32_t>(5 * N + 1);
    set_tokens(own_tokens_, static_cast<int>(N));
    for (int32_t*& slot : staging_) slot = pinned<int32_t>(5 * N + 1);
    host_stats_ = pinned<float>(2);
    token_count_.assign(V, 0);
  }

  // One block's activations for micro-batches of up to max_batch_ sequences (this tp rank's share).
  LayerActs layer_acts() {
    const size_t B = max_batch_, T = m_.seq_len, C = m_.n_embd, N = B * T;
    const size_t Cl = C / tp_, NHl = m_.n_head / tp_, Hl = 4 * C / tp_;
    const size_t Nl = sp_ ? N / tp_ : N;  // the residual stream's rows on this rank
    LayerActs l;
    l.ln1 = device<bf16>(N * C);
    l.ln1_mean = device<float>(N);
    l.ln1_rstd = device<float>(N);
    l.qkv = device<bf16>(N * 3 * Cl);
    l.atty = device<bf16>(N * Cl);
    l.lse = device<float>(B * NHl * T);
    l.res2 = device<bf16>(Nl * C);
    l.ln2 = device<bf16>(N * C);
    l.ln2_mean = device<float>(N);
    l.ln2_rstd = device<float>(N);
    l.fch_pre = device<bf16>(N * Hl);
    l.fch_gelu = device<bf16>(N * Hl);
    l.res3 = device<bf16>(Nl * C);
    return l;
  }

  // Where each tensor sits inside its unit: units are contiguous in the table (shard_plan.h), so these
  // offsets hold wherever a unit's parameters or gradients are kept. A pipeline stage's table has the
  // embeddings only on stage 0 and the final norm only on the last.
  void layout_params() {
    const ShardPlan& plan = state_->plan();
    const int L = n_local_;
    const size_t first = embed_ ? 2 : 0;  // table index of the stage's first block tensor
    GANTRY_CHECK(table_.size() == first + static_cast<size_t>(kBlockTensors * L) + (head_ ? 2 : 0),
                 "GPT-2's tensor table (or a pipeline stage's) expected");
    GANTRY_CHECK(plan.units.size() == static_cast<size_t>((embed_ ? 1 : 0) + L + (head_ ? 1 : 0)),
                 "one unit per block, the embeddings and the final norm");
    final_unit_ = head_ ? plan.final_unit() : -1;
    auto in_unit = [&](size_t tensor, int unit) { return table_[tensor].offset - plan.units[unit].offset; };
    if (embed_) {
      wpe_at_ = in_unit(1, plan.embedding_unit());
      GANTRY_CHECK(in_unit(0, plan.embedding_unit()) == 0, "wte begins the embeddings");
    }
    if (head_) {
      lnf_w_at_ = in_unit(first + kBlockTensors * L, final_unit_);
      lnf_b_at_ = in_unit(first + kBlockTensors * L + 1, final_unit_);
    }
    for (int l = 0; l < L; ++l) {
      for (int k = 0; k < kBlockTensors; ++k) {
        const size_t at = in_unit(first + kBlockTensors * l + k, block_unit(l));
        GANTRY_CHECK(l == 0 || at == block_at_[k], "every block has the same layout");
        block_at_[k] = at;
      }
    }
  }

  // Units: 0 the embeddings, 1 + l block l, L + 1 the final norm; on a pipeline stage its own blocks
  // (l local), after the embeddings on stage 0, and the final norm after them on the last.
  int block_unit(int l) const { return (embed_ ? 1 : 0) + l; }
  BlockParams block_params(int l) { return block_at(state_->params(block_unit(l)), block_at_); }
  BlockGrads block_grads(int l) { return block_at(state_->grads(block_unit(l)), block_at_); }
  LayerActs& act(int l) { return (*acts_)[l]; }
  // One GPU reduces each unit's bucket as the backward completes it; so does a pipeline stage at ZeRO 2-3
  // (every micro-batch's bucket into the gradient shard); one at ZeRO 0-1 after its schedule.
  void grads_done(int unit) {
    if (pp_comm_ == nullptr || stage_reduces_per_micro_batch()) state_->grads_done(unit);
  }
  // ZeRO 2-3 on a pipeline stage's dp axis (the plan is ZeRO 0 at dp 1).
  bool stage_reduces_per_micro_batch() const { return pp_comm_ != nullptr && state_->plan().zero >= 2; }
  // The token arrays of one micro-batch of N tokens, laid out as fill_staging writes them.
  void set_tokens(int32_t* base, int N) {
    inputs_ = base;
    targets_ = base + N;
    bucket_token_ = base + 2 * N;
    bucket_start_ = base + 3 * N;
    positions_ = base + 4 * N + 1;
  }

  // Copies the batch to the device; with `buckets`, also the token-sorted positions the deterministic
  // embedding backward needs (a counting sort over the vocabulary, on the host, while the GPU works).
  void upload(const int32_t* inputs, const int32_t* targets, int B, bool buckets) {
    GANTRY_CHECK(
        B > 0 && B <= max_batch_,
        "batch " + std::to_string(B) + " exceeds the backend's max batch " + std::to_string(max_batch_));
    const int N = B * m_.seq_len;
    set_tokens(own_tokens_, max_batch_ * m_.seq_len);
    // Two staging slots in turn: the host fills one while the copy out of the other may still be queued,
    // and waits only for the copy issued two batches ago (long done), never for compute.
    slot_ ^= 1;
    CUDA_CHECK(cudaEventSynchronize(upload_done_[slot_]));
    int32_t* staging = staging_[slot_];
    const int k = fill_staging(inputs, targets, N, buckets, staging);
    CUDA_CHECK(cudaMemcpyAsync(inputs_, staging, N * sizeof(int32_t), cudaMemcpyHostToDevice, stream_));
    CUDA_CHECK(cudaMemcpyAsync(targets_, staging + N, N * sizeof(int32_t), cudaMemcpyHostToDevice, stream_));
    if (buckets) {
      CUDA_CHECK(cudaMemcpyAsync(bucket_token_, staging + 2 * N, k * sizeof(int32_t), cudaMemcpyHostToDevice,
                                 stream_));
      CUDA_CHECK(cudaMemcpyAsync(bucket_start_, staging + 3 * N, (N + 1) * sizeof(int32_t),
                                 cudaMemcpyHostToDevice, stream_));
      CUDA_CHECK(cudaMemcpyAsync(positions_, staging + 4 * N + 1, N * sizeof(int32_t), cudaMemcpyHostToDevice,
                                 stream_));
    }
    CUDA_CHECK(cudaEventRecord(upload_done_[slot_], stream_));
  }

  // Fills `staging` (5N + 1 ints) with a batch's inputs and targets and, with `buckets`, the token-sorted
  // positions the deterministic embedding backward needs (a counting sort over the vocabulary); returns
  // the number of buckets. Layout: inputs, targets, bucket tokens, bucket starts (N + 1), positions.
  int fill_staging(const int32_t* inputs, const int32_t* targets, int N, bool buckets, int32_t* staging) {
    for (int i = 0; i < N; ++i) {
      GANTRY_CHECK(
          inputs[i] >= 0 && inputs[i] < m_.vocab_size && targets[i] >= 0 && targets[i] < m_.vocab_size,
          "token id out of [0, vocab_size)");
    }
    std::memcpy(staging, inputs, N * sizeof(int32_t));
    std::memcpy(staging + N, targets, N * sizeof(int32_t));
    int k = 0;
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
      int at = 0;
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
    }
    return k;
  }

  // The stage's blocks over encoded_ (the encoder's output, or on a later pipeline stage the previous
  // stage's, received), then the final norm (last stage) or the hand-off's res3 (the others).
  void forward(int B) {
    const int T = m_.seq_len, C = m_.n_embd, NH = m_.n_head, HS = C / NH, N = B * T, L = chunk_n_;
    const int Cl = C / tp_, NHl = NH / tp_, Hl = 4 * C / tp_;  // this tp rank's share
    const size_t NC = static_cast<size_t>(N) * C;
    // The residual stream's rows here (all N but under sequence parallelism) and where they start in an
    // (N, C) buffer: the LayerNorms run on these, writing into the whole buffers the gathers complete.
    const int Nl = rows_here(N);
    const size_t o = row_offset(N) * C;
    // Under ZeRO 3 each unit's parameters are gathered just before use (the next one while this one
    // computes) and released after its last reader is enqueued.
    if (run_embed_) {
      const bf16* embeddings = state_->params(0);
      state_->prefetch(1);
      if (tp_comm_ == nullptr) {
        encoder_forward_cuda(encoded_, inputs_, embeddings, embeddings + wpe_at_, N, T, C, stream_);
      } else {
        vocab_parallel_encoder_forward_cuda(encoded_, inputs_, embeddings, embeddings + wpe_at_,
                                            vocab_first(), m_.vocab_size / tp_, N, T, C, stream_);
        tp_sum_start(encoded_, NC);
        tp_join();
      }
    }
    const bf16* encoded_rows = encoded_ + o;
    for (int l = 0; l < L; ++l) {
      const BlockParams p = block_params(chunk_lo_ + l);
      // ZeRO 3 only; not past the chunk's end (an interleaved stage's next block there is another chunk's).
      if (l + 1 < L || run_head_) state_->prefetch(block_unit(chunk_lo_ + l) + 1);
      LayerActs& a = act(l);
      // This block's first norm also finishes the previous block: res3 = res2 + its MLP output.
      if (l == 0) {
        residual_layernorm_forward_cuda(nullptr, a.ln1 + o, a.ln1_mean, a.ln1_rstd, encoded_rows, nullptr,
                                        p.ln1_w, p.ln1_b, Nl, C, stream_);
      } else {
        residual_layernorm_forward_cuda(act(l - 1).res3, a.ln1 + o, a.ln1_mean, a.ln1_rstd, act(l - 1).res2,
                                        tmp_nc_ + o, p.ln1_w, p.ln1_b, Nl, C, stream_);
      }
      if (sp_) tp_gather_rows(a.ln1, NC);
      const bf16* residual = l == 0 ? encoded_rows : act(l - 1).res3;
      matmul_->forward(a.qkv, a.ln1, p.qkv_w, p.qkv_b, N, C, 3 * Cl, nullptr);  // column-parallel
      attention_forward(a.atty, a.lse, a.qkv, B, T, NHl, HS, stream_);
      row_parallel_forward(tmp_nc_, a.atty, p.proj_w, p.proj_b, N, Cl, C);
      residual_layernorm_forward_cuda(a.res2, a.ln2 + o, a.ln2_mean, a.ln2_rstd, residual, tmp_nc_ + o,
                                      p.ln2_w, p.ln2_b, Nl, C, stream_);
      if (sp_) tp_gather_rows(a.ln2, NC);
      matmul_->forward(a.fch_gelu, a.ln2, p.fc_w, p.fc_b, N, C, Hl, a.fch_pre);  // column-parallel
      row_parallel_forward(tmp_nc_, a.fch_gelu, p.fcproj_w, p.fcproj_b, N, Hl, C);
      // A stage before the last keeps its last block for the hand-off below (ZeRO 3: still pinned).
      if (run_head_ || l + 1 < L) state_->release(block_unit(chunk_lo_ + l));
    }
    if (!run_head_) {
      // A stage before the last hands on its last block's res3 = res2 + MLP output, which on one GPU the
      // next block's first norm forms; the same fused kernel forms it here, the same bits (its norm output
      // goes to handoff_ln_, unused). Its parameters: the last block's, still in its slot under ZeRO 3.
      const BlockParams p = block_params(chunk_lo_ + L - 1);
      residual_layernorm_forward_cuda(act(L - 1).res3, handoff_ln_, handoff_mean_, handoff_rstd_,
                                      act(L - 1).res2, tmp_nc_, p.ln2_w, p.ln2_b, N, C, stream_);
      state_->release(block_unit(chunk_lo_ + L - 1));
      return;
    }
    const bf16* lnf = state_->params(final_unit_);
    if (L == 0) {
      residual_layernorm_forward_cuda(nullptr, lnf_ + o, lnf_mean_, lnf_rstd_, encoded_rows, nullptr,
                                      lnf + lnf_w_at_, lnf + lnf_b_at_, Nl, C, stream_);
    } else {
      residual_layernorm_forward_cuda(act(L - 1).res3, lnf_ + o, lnf_mean_, lnf_rstd_, act(L - 1).res2,
                                      tmp_nc_ + o, lnf + lnf_w_at_, lnf + lnf_b_at_, Nl, C, stream_);
    }
    if (sp_) tp_gather_rows(lnf_, NC);  // the vocab-parallel classifier reads every row
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

  // Logits, loss and (with backward) dlogits → dlnf and dwte, a chunk of rows at a time. `keep` (ZB-H1's
  // input pass on the last stage): the logits and their gradients go to this (N, V/tp) buffer instead of
  // the shared chunk and stay there, and the dwte product is left to the weight pass (classifier_weights),
  // which takes it off the input pass the previous stage waits for.
  void classifier(int B, float dloss, bool backward, bf16* keep = nullptr) {
    const int C = m_.n_embd, V = m_.vocab_size / tp_, N = B * m_.seq_len;  // V: this tp rank's vocabulary
    // wte begins the embeddings; a last pipeline stage uses stage 0's copy and keeps the weight gradient
    // for stage 0 (pipeline_step).
    const bf16* wte = pp_comm_ != nullptr ? wte_copy_ : state_->params(0);
    float* dwte = !backward ? nullptr : pp_comm_ != nullptr ? dwte_ : state_->grads(0);
    const int step = classifier_rows(N);
    for (int r0 = 0; r0 < N; r0 += step) {
      const int rows = std::min(step, N - r0);
      const bf16* x = lnf_ + static_cast<size_t>(r0) * C;
      bf16* logits = keep != nullptr ? keep + static_cast<size_t>(r0) * V : logits_;
      matmul_->forward(logits, x, wte, nullptr, rows, C, V, nullptr);
      if (tp_comm_ == nullptr) {
        classifier_cuda(logits, losses_ + r0, targets_ + r0, dloss, backward, rows, V, stream_);
      } else {
        vocab_parallel_classifier(logits, r0, rows, dloss, backward);
      }
      if (!backward) continue;
      bf16* dx = dln_ + static_cast<size_t>(r0) * C;
      matmul_->backward_input(dx, logits, wte, rows, C, V, nullptr);
      // Tensor parallel: each rank's d(lnf) is the part of the sum over its vocabulary; its all-reduce runs
      // under the dwte product (sequence parallel: one reduce-scatter of every row's, under the last
      // chunk's).
      if (tp_comm_ != nullptr && !sp_) tp_all_reduce_start(dx, static_cast<size_t>(rows) * C);
      if (sp_ && r0 + rows == N) tp_sum_start(dln_, static_cast<size_t>(N) * C);
      if (keep == nullptr) matmul_->backward_weight(dwte, logits, x, rows, C, V);
    }
    if (backward && tp_comm_ != nullptr) tp_join();
  }
  // ZB-H1's weight pass on the last stage: the dwte product over the d(logits) its input pass kept, chunk
  // by chunk in the same rows and order as classifier() (so the sums are the same).
  void classifier_weights(int B, const bf16* kept) {
    const int C = m_.n_embd, V = m_.vocab_size / tp_, N = B * m_.seq_len;
    const int step = classifier_rows(N);
    for (int r0 = 0; r0 < N; r0 += step) {
      const int rows = std::min(step, N - r0);
      matmul_->backward_weight(dwte_, kept + static_cast<size_t>(r0) * V, lnf_ + static_cast<size_t>(r0) * C,
                               rows, C, V);
    }
  }
  // Rows of one classifier chunk for N rows: chunks of nearly equal size (a multiple of 128 rows where that
  // fits), so no last chunk is a sliver.
  int classifier_rows(int N) const {
    const int chunks = (N + chunk_rows_ - 1) / chunk_rows_;
    const int even = (N + chunks - 1) / chunks;
    return std::min(chunk_rows_, (even + 127) / 128 * 128);
  }

  // The cross-entropy of one chunk of rows over the tp group's vocabulary (cuda/vocab_parallel.cuh): this
  // rank's logits (rows, Vl) become its columns of d(logits) when `backward`.
  void vocab_parallel_classifier(bf16* logits, int r0, int rows, float dloss, bool backward) {
    const int Vl = m_.vocab_size / tp_;
    const size_t n = static_cast<size_t>(rows) * tp_;
    vocab_parallel_row_max_cuda(ce_max_, logits, rows, Vl, stream_);
    tp_all_gather(ce_max_, ce_all_max_, n);
    vocab_parallel_sum_exp_cuda(ce_part_, logits, ce_all_max_, targets_ + r0, vocab_first(), tp_, rows, Vl,
                                stream_);
    tp_all_gather(ce_part_, ce_all_part_, 2 * n);
    vocab_parallel_loss_cuda(logits, losses_ + r0, ce_all_max_, ce_all_part_, targets_ + r0, vocab_first(),
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
  // x (count bf16, an (N, C) activation) summed over the tp ranks into the rows this rank keeps: all of
  // them (all-reduce), or under sequence parallelism its N/tp (reduce-scatter in place, at row_offset).
  void tp_sum_start(bf16* x, size_t count) {
    if (!sp_) {
      tp_all_reduce_start(x, count);
      return;
    }
    tp_follow();
    check(tp_comm_->reduce_scatter_bf16_enqueue(x, count, tp_stream_));
  }
  // Sequence parallel: x (count bf16) whole on every rank from each rank's block at its row_offset (an
  // all-gather in place); the compute stream may go on with work that neither reads nor writes x until
  // tp_join() (tp_gather_rows: at once).
  void tp_gather_start(bf16* x, size_t count) {
    tp_follow();
    const size_t block = count / static_cast<size_t>(tp_);
    check(tp_comm_->all_gather_enqueue(x + static_cast<size_t>(tp_rank_) * block, x, count, sizeof(bf16),
                                       tp_stream_));
  }
  void tp_gather_rows(bf16* x, size_t count) {
    tp_gather_start(x, count);
    tp_join();
  }
  // The residual stream's rows on this rank of an activation of N rows, and the first of them.
  int rows_here(int N) const { return sp_ ? N / tp_ : N; }
  size_t row_offset(int N) const { return sp_ ? static_cast<size_t>(tp_rank_) * (N / tp_) : 0; }
  // out (count floats) = every tp rank's count / tp values of `in`, in rank order.
  void tp_all_gather(const float* in, float* out, size_t count) {
    tp_follow();
    check(tp_comm_->all_gather_enqueue(in, out, count, sizeof(float), tp_stream_));
    tp_join();
  }
  // out (N, C) = inp (N, K) · w (C, K)ᵀ + bias. Tensor parallel: w holds this rank's K input columns, so
  // out is a partial sum, all-reduced; tp rank 0 alone adds the (whole) bias, so the sum holds it once.
  // One product, then its all-reduce: in two halves of the rows, the first half's all-reduce under the
  // second half's product, a tp 2 step was 1.3-5.8 % slower at every size measured (docs/PERF.md, calls T8
  // and T9): the halves' products run less efficiently and the all-reduce takes SMs from the one beside it.
  // Sequence parallel: the sum is reduce-scattered, this rank's rows at out + row_offset(N) * C.
  void row_parallel_forward(bf16* out, const bf16* inp, const bf16* w, const bf16* bias, int N, int K,
                            int C) {
    matmul_->forward(out, inp, w, tp_rank_ == 0 ? bias : nullptr, N, K, C, nullptr);
    if (tp_comm_ == nullptr) return;
    tp_sum_start(out, static_cast<size_t>(N) * C);
    tp_join();
  }

  // From d(lnf) in dln_ (last stage; on a pipeline stage before it, d(output) already in dres_) down the
  // stage's blocks to d(input) in dres_, then the encoder's gradients on the first stage.
  // ZB-H1 (`part`): kInput leaves out the four products' weight gradients and the fc and qkv bias
  // reductions, keeping their output gradients in the slot (KeptGrads); kWeight (weight_pass) computes them.
  // The embeddings' backward is the weight pass's too (from d(input), kept in the slot). Everything else
  // (the LayerNorms' gradients and the biases they sum, the classifier) is the input pass's. kWhole issues
  // the same kernels in the same order as before the split.
  void backward(int B, BackwardPart part = BackwardPart::kWhole) {
    if (part == BackwardPart::kWeight) {
      weight_pass(B);
      return;
    }
    const bool split = part == BackwardPart::kInput;
    const int T = m_.seq_len, C = m_.n_embd, NH = m_.n_head, HS = C / NH, N = B * T, L = chunk_n_;
    const int Cl = C / tp_, NHl = NH / tp_, Hl = 4 * C / tp_;  // this tp rank's share
    const size_t NC = static_cast<size_t>(N) * C;
    // Sequence parallel: the LayerNorms' backwards run on this rank's rows of dres and dln (at o), and
    // dres is gathered whole before each row-parallel product's backward reads it.
    const int Nl = rows_here(N);
    const size_t o = row_offset(N) * C;
    // Each LayerNorm backward also sums the dres it leaves into the gradient of the bias whose output that
    // residual stream is (no separate bias pass). The final norm writes dres (no memset first); dres is then
    // d(res3) of the last block, whose MLP projection bias it is.
    // ZB-H1 at ZeRO 2-3: the input pass adds its parameter gradients into the slot's early buffer (zeroed
    // here), which the weight pass adds into the dp state's gradients, so a unit's staging is opened and
    // completed in that one pass.
    const bool early = split && early_ != nullptr;
    if (early) CUDA_CHECK(cudaMemsetAsync(early_, 0, early_floats(chunk_) * sizeof(float), stream_));
    auto grads_of = [&](int l) { return early ? input_pass_grads(l) : block_grads(chunk_lo_ + l); };
    const bf16* top = L > 0 ? act(L - 1).res3 : encoded_ + o;
    float* top_bias = L > 0 ? grads_of(L - 1).fcproj_b : nullptr;
    if (run_head_) {
      const bf16* lnf = state_->params(final_unit_);
      float* dlnf_w = nullptr;
      float* dlnf_b = nullptr;
      if (early) {
        dlnf_w = early_ + kInputPassTensors.size() * C * L;  // after the blocks' (early_floats)
        dlnf_b = dlnf_w + C;
      } else {
        float* dlnf = state_->grads(final_unit_);
        dlnf_w = dlnf + lnf_w_at_;
        dlnf_b = dlnf + lnf_b_at_;
      }
      layernorm_backward_cuda(dres_ + o, dlnf_w, dlnf_b, top_bias, scratch_, dln_ + o, top, lnf + lnf_w_at_,
                              lnf_mean_, lnf_rstd_, Nl, C, false, stream_);
      if (!split) grads_done(final_unit_);
    } else {
      // The next stage's d(res3) is this stage's last MLP projection's bias gradient, which the final
      // norm's backward adds on one GPU.
      bias_backward_cuda(top_bias, scratch_, dres_, N, C, stream_);
    }
    for (int l = L - 1; l >= 0; --l) {
      const int lg = chunk_lo_ + l;  // among the rank's blocks
      const BlockParams p = block_params(lg);
      // The block below (or the embeddings, which stay gathered for the step): ZeRO 3 only; not below the
      // chunk's first block (an interleaved stage's block there is another chunk's).
      if (l > 0 || run_embed_) state_->prefetch(block_unit(lg) - 1);
      const BlockGrads g = grads_of(l);
      LayerActs& a = act(l);
      const bf16* residual = l == 0 ? encoded_ + o : act(l - 1).res3;
      // Sequence parallel: d(res3) whole (the top block's gathered here; the others' under the block
      // above's QKV weight products, below). Each of the block's four collectives then runs under weight
      // products moved after it: the MLP-up input gradient's reduce-scatter under the MLP projection's, the
      // d(res2) gather under MLP-up's, the QKV input gradient's under the attention projection's.
      if (sp_ && l == L - 1) tp_gather_rows(dres_, NC);
      // MLP branch, reading d(res3) before the second norm's contribution turns dres into d(res2).
      // Tensor parallel: d(res3) is whole on every rank, so the row-parallel projection's input gradient is
      // this rank's share with no traffic; the column-parallel MLP-up's (dln) is a partial sum, all-reduced
      // under its weight and bias gradients.
      const KeptGrads* kept = split ? &(*kept_)[l] : nullptr;
      if (split) {
        copy_async(kept->dres3, dres_, NC);
      } else if (!sp_) {
        matmul_->backward_weight(g.fcproj_w, dres_, a.fch_gelu, N, Hl, C);
      }
      bf16* dfch = split ? kept->dfch : dfch_;
      matmul_->backward_input(dfch, dres_, p.fcproj_w, N, Hl, C, a.fch_pre);
      matmul_->backward_input(dln_, dfch, p.fc_w, N, C, Hl, nullptr);
      if (tp_comm_ != nullptr) tp_sum_start(dln_, NC);
      if (sp_) {
        matmul_->backward_weight(g.fcproj_w, dres_, a.fch_gelu, N, Hl, C);
      } else if (!split) {
        bias_backward_cuda(g.fc_b, scratch_, dfch_, N, Hl, stream_);
        matmul_->backward_weight(g.fc_w, dfch_, a.ln2, N, C, Hl);
      }
      if (tp_comm_ != nullptr) tp_join();
      // dres becomes d(res2): the attention projection's bias gradient.
      layernorm_backward_cuda(dres_ + o, g.ln2_w, g.ln2_b, g.proj_b, scratch_, dln_ + o, a.res2, p.ln2_w,
                              a.ln2_mean, a.ln2_rstd, Nl, C, true, stream_);
      if (sp_) {
        tp_gather_start(dres_, NC);  // d(res2)
        bias_backward_cuda(g.fc_b, scratch_, dfch_, N, Hl, stream_);
        matmul_->backward_weight(g.fc_w, dfch_, a.ln2, N, C, Hl);
        tp_join();
      }
      // Attention branch, then the first norm turns dres into d(residual in).
      if (split) {
        copy_async(kept->dres2, dres_, NC);
      } else if (!sp_) {
        matmul_->backward_weight(g.proj_w, dres_, a.atty, N, Cl, C);
      }
      matmul_->backward_input(datty_, dres_, p.proj_w, N, Cl, C, nullptr);
      bf16* dqkv = split ? kept->dqkv : dqkv_;
      attention_backward(dqkv, datty_, a.atty, a.lse, a.qkv, scratch_, B, T, NHl, HS, stream_,
                         deterministic_);
      matmul_->backward_input(dln_, dqkv, p.qkv_w, N, C, 3 * Cl, nullptr);
      if (tp_comm_ != nullptr) tp_sum_start(dln_, NC);  // column-parallel QKV: as MLP-up's above
      if (sp_) {
        matmul_->backward_weight(g.proj_w, dres_, a.atty, N, Cl, C);
      } else if (!split) {
        matmul_->backward_weight(g.qkv_w, dqkv_, a.ln1, N, C, 3 * Cl);
        bias_backward_cuda(g.qkv_b, scratch_, dqkv_, N, 3 * Cl, stream_);
      }
      if (tp_comm_ != nullptr) tp_join();
      // dres becomes d(res3) of the block below: its MLP projection's bias gradient (the chunk's first
      // block: the previous virtual stage's, which sums the d(input) it receives into it).
      float* below_bias = l > 0 ? grads_of(l - 1).fcproj_b : nullptr;
      layernorm_backward_cuda(dres_ + o, g.ln1_w, g.ln1_b, below_bias, scratch_, dln_ + o, residual, p.ln1_w,
                              a.ln1_mean, a.ln1_rstd, Nl, C, true, stream_);
      if (sp_) {
        // d(res3) of the block below, or d(encoded) (every rank's vocabulary rows take their gradients
        // from every row), gathered under this block's QKV weight products.
        tp_gather_start(dres_, NC);
        matmul_->backward_weight(g.qkv_w, dqkv_, a.ln1, N, C, 3 * Cl);
        bias_backward_cuda(g.qkv_b, scratch_, dqkv_, N, 3 * Cl, stream_);
        tp_join();
      }
      state_->release(block_unit(lg));
      // Block l's gradients are complete (block l + 1 wrote its MLP projection's); ZB-H1: after the weight
      // pass.
      if (!split) grads_done(block_unit(lg));
    }
    // d(input) stays in dres_, for the previous stage; ZB-H1's weight pass runs the embeddings' backward
    // (from that d(input), which pipeline_step keeps in the slot).
    if (!run_embed_ || split) return;
    // A fixed grid of N buckets (the most a batch can have; spare ones are empty) keeps this launch the
    // same for every batch of a shape, as graph replay needs.
    float* dembeddings = state_->grads(0);
    encoder_backward_cuda(dembeddings, dembeddings + wpe_at_, dres_, bucket_token_, bucket_start_, positions_,
                          N, B, T, C, stream_);
    grads_done(0);  // the embeddings: the classifier wrote wte's gradient first, the encoder last
  }

  // ZB-H1's weight pass over the chunk's blocks: the products' weight gradients and the fc and qkv biases,
  // from the output gradients the input pass kept (KeptGrads) and the slot's activations. No tp collectives.
  // It completes every unit of the chunk for its micro-batch, top unit first: first (ZeRO 2-3) the input
  // pass's parameter gradients (the slot's early buffer) are added in, then the products', then grads_done
  // (ZeRO 2-3 on a pipeline stage: the bucket's reduce-scatter); on stage 0 the embeddings' backward from
  // the d(input) the slot kept. It reads no parameters (ZeRO 3 gathers nothing for it).
  void weight_pass(int B) {
    const int T = m_.seq_len, C = m_.n_embd, N = B * T, L = chunk_n_;
    const int Cl = C / tp_, Hl = 4 * C / tp_;  // this tp rank's share
    const size_t E = kInputPassTensors.size();
    if (run_head_) {
      float* dlnf = state_->grads(final_unit_);
      if (early_ != nullptr) {
        const float* e = early_ + E * C * L;
        add_in_place_cuda(dlnf + lnf_w_at_, e, C, stream_);
        add_in_place_cuda(dlnf + lnf_b_at_, e + C, C, stream_);
      }
      grads_done(final_unit_);
    }
    for (int l = L - 1; l >= 0; --l) {
      const int lg = chunk_lo_ + l;
      float* unit = state_->grads(block_unit(lg));
      const BlockGrads g = block_at(unit, block_at_);
      // The early buffer's tensors, in runs that are contiguous in the unit (one add per run).
      const float* e = early_ != nullptr ? early_ + E * C * l : nullptr;
      for (size_t j = 0; e != nullptr && j < E;) {
        size_t r = j + 1;
        while (r < E && block_at_[kInputPassTensors[r]] == block_at_[kInputPassTensors[j]] + (r - j) * C) ++r;
        add_in_place_cuda(unit + block_at_[kInputPassTensors[j]], e + j * C, (r - j) * C, stream_);
        j = r;
      }
      const LayerActs& a = act(l);
      const KeptGrads& k = (*kept_)[l];
      matmul_->backward_weight(g.fcproj_w, k.dres3, a.fch_gelu, N, Hl, C);
      bias_backward_cuda(g.fc_b, scratch_, k.dfch, N, Hl, stream_);
      matmul_->backward_weight(g.fc_w, k.dfch, a.ln2, N, C, Hl);
      matmul_->backward_weight(g.proj_w, k.dres2, a.atty, N, Cl, C);
      matmul_->backward_weight(g.qkv_w, k.dqkv, a.ln1, N, C, 3 * Cl);
      bias_backward_cuda(g.qkv_b, scratch_, k.dqkv, N, 3 * Cl, stream_);
      grads_done(block_unit(lg));
    }
    if (!run_embed_) return;
    float* dembeddings = state_->grads(0);
    encoder_backward_cuda(dembeddings, dembeddings + wpe_at_, slot_dout_, bucket_token_, bucket_start_,
                          positions_, N, B, T, C, stream_);
    grads_done(0);  // the embeddings (stage 0's last one also carries the tied wte gradient: pipeline_step)
  }
  void copy_async(bf16* to, const bf16* from, size_t count) {
    CUDA_CHECK(cudaMemcpyAsync(to, from, count * sizeof(bf16), cudaMemcpyDeviceToDevice, stream_));
  }

  static void check(const Status& st) {
    if (!st.ok()) fatal_error(__FILE__, __LINE__, st.message());
  }

  // ---- pipeline parallel: one stage's program (parallel/pipeline_schedule.h) ----
  // Point to point over pp on the compute stream: the stream waits for the peer, the host does not.
  // Activations and their gradients go as bf16 (element size 2), the tied classifier's gradient as fp32.
  void p2p_send(const void* data, size_t count, size_t element_bytes, int peer) {
    check(pp_comm_->send_enqueue(data, count, element_bytes, peer, stream_));
  }
  void p2p_recv(void* data, size_t count, size_t element_bytes, int peer) {
    check(pp_comm_->recv_enqueue(data, count, element_bytes, peer, stream_));
  }
  // Stage 0 sends its bf16 wte (the update's result) to the last stage, which runs the classifier with it.
  // Tensor parallel: tp rank r's V/tp rows, to tp rank r of the last stage (the pp group joins the same tp
  // rank of every stage).
  void sync_wte() {
    const size_t VC = static_cast<size_t>(m_.vocab_size / tp_) * m_.n_embd;
    // ZeRO 1-2: after its bucket's gather; ZeRO 3: the whole embeddings unit (this tp rank's share),
    // gathered into its slot for the step, wte first.
    if (embed_) p2p_send(state_->params(0), VC, sizeof(bf16), stages_ - 1);
    if (head_) p2p_recv(wte_copy_, VC, sizeof(bf16), 0);
  }
  // A free slot of chunk `chunk` (activations of its blocks for one micro-batch in flight), allocated on
  // first use; `micro` < 0: none of this step's (validation). The model's last chunk's slots also hold the
  // final norm's output.
  StageSlot& acquire(int chunk, int micro) {
    std::vector<StageSlot>& pool = slots_[chunk];
    size_t i = 0;
    while (i < pool.size() && pool[i].busy) ++i;
    if (i == pool.size()) {
      const size_t N = static_cast<size_t>(max_batch_) * m_.seq_len, C = m_.n_embd;
      StageSlot s;
      s.in = device<bf16>(N * C);
      s.dout = device<bf16>(N * C);
      for (int l = 0; l < chunk_layers_[chunk]; ++l) s.layers.push_back(layer_acts());
      if (split_backward_) {
        const size_t Hl = 4 * C / tp_, Cl = C / tp_;
        for (int l = 0; l < chunk_layers_[chunk]; ++l) {
          s.kept.push_back(
              {device<bf16>(N * C), device<bf16>(N * Hl), device<bf16>(N * C), device<bf16>(N * 3 * Cl)});
        }
        if (stage_reduces_per_micro_batch()) s.early = device<float>(early_floats(chunk));
      }
      if (head_ && chunk == vp_ - 1) {
        s.lnf = device<bf16>(N * C);
        s.lnf_mean = device<float>(N);
        s.lnf_rstd = device<float>(N);
        if (split_backward_) s.dlogits = device<bf16>(N * (m_.vocab_size / tp_));
      }
      pool.push_back(std::move(s));
    }
    pool[i].busy = true;
    if (micro >= 0) slot_of_[chunk][micro] = static_cast<int>(i);
    return pool[i];
  }
  // The slot chunk `chunk` holds for this step's micro-batch `micro` (acquired by its receive or forward).
  StageSlot& slot(int chunk, int micro) {
    const int i = slot_of_[chunk][micro];
    GANTRY_CHECK(i >= 0, "micro-batch " + std::to_string(micro) + " of chunk " + std::to_string(chunk) +
                             " has no activations on this stage (the program's order is broken)");
    return slots_[chunk][i];
  }
  // forward() and backward() run chunk `chunk`'s blocks.
  void use_chunk(int chunk) {
    chunk_ = chunk;
    chunk_lo_ = chunk_first_[chunk];
    chunk_n_ = chunk_layers_[chunk];
    run_embed_ = embed_ && chunk == 0;
    run_head_ = head_ && chunk == static_cast<int>(chunk_layers_.size()) - 1;
  }
  // ZB-H1: the floats of a slot's input-pass gradients (StageSlot::early) for chunk `chunk`.
  size_t early_floats(int chunk) const {
    const bool final_norm = head_ && chunk == vp_ - 1;
    return (kInputPassTensors.size() * chunk_layers_[chunk] + (final_norm ? 2 : 0)) *
           static_cast<size_t>(m_.n_embd);
  }
  // ZB-H1's input pass: where block l of the chunk (local index) adds the gradients it writes (the slot's
  // early buffer; the weight pass's tensors are null).
  BlockGrads input_pass_grads(int l) {
    const size_t C = m_.n_embd;
    float* e = early_ + kInputPassTensors.size() * C * l;
    return {e,         e + C,     nullptr, nullptr, nullptr, e + 2 * C,
            e + 3 * C, e + 4 * C, nullptr, nullptr, nullptr, e + 5 * C};
  }
  // forward() and backward() work on this slot's activations.
  void use_slot(StageSlot& s) {
    encoded_ = s.in;
    acts_ = &s.layers;
    kept_ = &s.kept;
    early_ = s.early;
    slot_dout_ = s.dout;
    if (s.lnf != nullptr) {
      lnf_ = s.lnf;
      lnf_mean_ = s.lnf_mean;
      lnf_rstd_ = s.lnf_rstd;
    }
  }

  // The step's micro-batches through this stage in its program's order, all enqueued on the compute
  // stream. The last stage's classifier (loss, d(logits), its wte gradient) runs at the start of each
  // micro-batch's backward, where the shared logits/gradient region is free.
  //
  // NCCL order. Every rank of a communicator must issue that communicator's operations in one order, or the
  // gang deadlocks (a send returns only once its peer receives). Per step, on each communicator:
  //  pp (tp rank r and dp rank d of every stage; at tp > 1 it carries tp rank r's shares and the whole
  //      N x C activations, which are the same on every tp rank):
  //      0. once, at the step after kPlaceAfterSteps: the passes' measured costs, all-reduced over pp,
  //         then tp, then dp (place_by_measured_costs; every rank of the world at the same step);
  //      1. the wte copy, stage 0 -> last (sync_wte; V/tp x C bf16, this tp rank's rows);
  //      2. the program's sends and receives (bf16 N x C), in pipeline_program's one global message order:
  //         a simulation every rank runs alike (with units, or the same exchanged costs), where each
  //         message is a send on one stage and the matching receive on its neighbour, and a rank waits
  //         only on the earliest message it is part of (PipelineProgram.SendsAndReceivesPairUpInOneOrder
  //         replays every schedule at pp 2-4, placed by units and by uneven costs). Under
  //         interleaving the last stage's chunk c sends to stage 0's chunk c + 1 and the gradient comes
  //         back the same way: each step names this rank's chunk and its peer;
  //      3. the tied classifier's gradient, last -> stage 0 (fp32 V/tp x C), sent after the last stage's
  //         program and received after stage 0's last message (ZeRO 0-1: after its program; ZeRO 2-3:
  //         just before its last backward, ZB-H1 its last weight pass, its program's last step, which
  //         sends nothing: the same message order;
  //         PipelineProgram.TheTiedGradientReachesStageZeroBeforeItsLastBackward);
  //      4. update(): the norm's all-reduce over pp (ZeroDeviceState, after its tp one);
  //      5. optimizer_step(): the loss's all-reduce (the last stage's, the others add 0).
  //      Validation: the wte copy, the activations down the virtual stages in order, then one all-reduce
  //      of the loss.
  //  tp (the stage's tp ranks, same dp rank): they run the same program (same stage, schedule and
  //      micro-batches), so their collectives (the embedding's all-reduce, two per block each way, the
  //      classifier's gathers and d(lnf) all-reduces) come in one order; then update()'s norm all-reduce.
  //      Each compute joins the tp stream before it returns (tp_join), so no tp collective is pending
  //      while the compute stream sits in a pp send or receive: a rank's tp and pp operations form one
  //      chain, and pipeline_program's order with each compute widened to its stage's tp collectives is
  //      one order that every rank follows.
  //  dp (the same stage and tp rank of each replica; ZeroDeviceState's comm stream): the replicas run the
  //      same program (same stage, schedule, micro-batch count and shard plan), so the host issues the
  //      same dp calls in the same order on each.
  //      ZeRO 0-1: after the program, each bucket's reduction (grads_done, top unit first); then ZeRO 1's
  //      norm and loss sum in update(); ZeRO 1's bf16 gathers as the next step's stage first asks for
  //      each bucket (stage 0: sync_wte; the others: the first forward).
  //      ZeRO 2: ZeRO 1's bf16 gathers of every bucket at the step's first params() (as ZeRO 1); then for
  //      each completing pass in program order (the backward; ZB-H1's weight pass; micro-batches 0..m-1
  //      under every schedule) its buckets' reduce-scatters as it completes them, top unit first (the
  //      final norm's, the blocks', stage 0's embeddings last, whose last one carries the tied gradient);
  //      then update()'s all-reduce of the loss and the squares.
  //      ZeRO 3: in program order, each forward's block gathers (block l + 1 issued as block l is
  //      enqueued, a block still in one of the two slots not gathered again; the embeddings at stage 0's
  //      sync_wte and the final norm at the last stage's first forward, once per step), each backward's
  //      (ZB-H1: input pass's) gathers (block l - 1 as block l is enqueued) interleaved with its
  //      reduce-scatters as above (ZB-H1: the weight pass's reduce-scatters, and no gathers: it reads no
  //      parameters); then update()'s all-reduce. The host's calls decide the order, and they are the
  //      same on every replica.
  //  No cycle across communicators: place every rank's operations in pipeline_program's one global
  //      message order (each stage's computes, and the dp and tp collectives they issue, between its
  //      messages). Every wait then points to an operation no later in that order: a pp receive to its
  //      send; a compute-stream wait for a dp collective to that collective, issued earlier in the same
  //      program; the collective to the points where its ranks issued it (comm_follows_compute), which
  //      are the same program point on every replica. So the earliest blocked operation would wait on
  //      nothing. E.g. replica A's compute stream waiting for a ZeRO-3 gather while replica B sits in a pp
  //      receive waits for B's sender upstream, which is earlier in the order and waits only on earlier
  //      things. The dp kernels (comm stream), tp kernels (tp stream) and pp transfers (compute stream)
  //      are separate kernels that run side by side.
  void pipeline_step() {
    const int m = static_cast<int>(micros_.size());
    const int T = m_.seq_len, C = m_.n_embd;
    const size_t stride = 5 * static_cast<size_t>(max_batch_) * T + 1;
    // Every micro-batch's tokens in one copy (the host fills pinned memory, the copy runs ahead of them).
    if (tokens_micros_ < m) {
      CUDA_CHECK(cudaStreamSynchronize(stream_));  // first step only: nothing reads the old buffers now
      tokens_dev_ = device<int32_t>(static_cast<size_t>(m) * stride);
      tokens_host_ = pinned<int32_t>(static_cast<size_t>(m) * stride);
      tokens_micros_ = m;
    }
    CUDA_CHECK(cudaEventSynchronize(tokens_copied_));  // the previous step's copy, long done
    for (int k = 0; k < m; ++k) {
      const PipeMicro& mb = micros_[k];
      (void)fill_staging(mb.inputs.data(), mb.targets.data(), mb.batch * T, embed_,
                         tokens_host_ + static_cast<size_t>(k) * stride);
    }
    CUDA_CHECK(cudaMemcpyAsync(tokens_dev_, tokens_host_, static_cast<size_t>(m) * stride * sizeof(int32_t),
                               cudaMemcpyHostToDevice, stream_));
    CUDA_CHECK(cudaEventRecord(tokens_copied_, stream_));
    while (static_cast<int>(pipe_events_.size()) < m * vp_) {  // one set per (chunk, micro-batch)
      PipeEvents e;
      for (cudaEvent_t* x : {&e.f0, &e.f1, &e.b0, &e.b1, &e.w0, &e.w1}) CUDA_CHECK(cudaEventCreate(x));
      pipe_events_.push_back(e);
    }
    // ZeRO 0-1: the whole schedule is one micro-batch of the dp state; ZeRO 2-3: each backward is one.
    const bool per_micro = stage_reduces_per_micro_batch();
    if (!per_micro) state_->begin_micro_batch();
    sync_wte();
    const size_t VC = static_cast<size_t>(m_.vocab_size / tp_) * C;  // this tp rank's wte rows
    if (head_) CUDA_CHECK(cudaMemsetAsync(dwte_, 0, VC * sizeof(float), stream_));
    slot_of_.assign(vp_, std::vector<int>(m, -1));
    if (measured_steps_ == kPlaceAfterSteps && !placement_tried_) place_by_measured_costs(m);
    if (placed_m_ != m) place_ = std::nullopt;  // measured for another micro-batch count: units again
    const std::vector<PipelineStep> program =
        pipeline_program(schedule_, stages_, vp_, stage_, m, place_ ? &*place_ : nullptr);
    // Stage 0's last compute is its last backward under GPipe and 1F1B, its last weight pass under ZB-H1
    // (stage 0 defers none), after every message of its program (it sends nothing up): under ZeRO 2-3 the
    // tied classifier's gradient is received and added just before it.
    // ZB-H1: the dp state's micro-batch is the weight pass, which completes every unit (weight_pass).
    const PipelineOp completes = split_backward_ ? PipelineOp::kWeight : PipelineOp::kBackward;
    size_t last_compute = 0;
    for (size_t i = 0; i < program.size(); ++i) {
      if (program[i].kind == PipelineStep::Kind::kCompute) last_compute = i;
    }
    GANTRY_CHECK(!per_micro || !embed_ ||
                     (last_compute + 1 == program.size() && program[last_compute].action.op == completes &&
                      program[last_compute].action.chunk == 0),
                 "stage 0's program ends with the last pass that completes its embeddings' gradients");
    // ZeRO 2-3: the pass that completes micro-batch k's gradients is a micro-batch of the dp state: its
    // buckets go to staging slots and are reduce-scattered into the gradient shard as it completes them.
    // Stage 0's last one also carries the classifier's wte gradient (the last stage sent it after its
    // program): added into the embeddings' staging slot before the encoder's backward adds into it, it is
    // reduced with that bucket's last reduce-scatter, at no extra dp traffic (a reduction of its own after
    // the schedule would move V/tp x C floats more, and with nothing left to hide it). The wait for it is the
    // last stage's remaining work, which the gradient chain down to stage 0 has already covered.
    auto begin_dp_micro_batch = [&](size_t i) {
      if (!per_micro) return;
      state_->begin_micro_batch();
      if (embed_ && i == last_compute) {
        p2p_recv(dwte_in_, VC, sizeof(float), stages_ - 1);
        add_in_place_cuda(state_->grads(0), dwte_in_, VC, stream_);
      }
    };
    CUDA_CHECK(cudaEventRecord(span_begin_, stream_));
    // Each step names this rank's chunk: a receive's is the chunk it feeds, a send's the one that made it.
    for (size_t i = 0; i < program.size(); ++i) {
      const PipelineStep& step = program[i];
      const int k = step.action.micro, c = step.action.chunk;
      const PipeMicro& mb = micros_[k];
      const int N = mb.batch * T;
      const size_t NC = static_cast<size_t>(N) * C;
      if (step.kind == PipelineStep::Kind::kRecv) {
        if (!step.grad) {
          p2p_recv(acquire(c, k).in, NC, sizeof(bf16), step.peer);
        } else {
          p2p_recv(slot(c, k).dout, NC, sizeof(bf16), step.peer);
        }
        continue;
      }
      if (step.kind == PipelineStep::Kind::kSend) {
        StageSlot& s = slot(c, k);
        p2p_send(step.grad ? s.dout : s.layers.back().res3, NC, sizeof(bf16), step.peer);
        // Stream order: the slot's next user is enqueued after the send, which it waits behind. ZB-H1
        // frees it after its weight pass instead.
        if (step.grad && !split_backward_) s.busy = false;
        continue;
      }
      set_tokens(tokens_dev_ + static_cast<size_t>(k) * stride, N);
      use_chunk(c);
      const PipeEvents& ev = pipe_events_[static_cast<size_t>(c) * m + k];
      if (step.action.op == PipelineOp::kForward) {
        use_slot(slot_of_[c][k] >= 0 ? slot(c, k) : acquire(c, k));
        CUDA_CHECK(cudaEventRecord(ev.f0, stream_));
        tp_in_forward_ = true;
        forward(mb.batch);
        tp_in_forward_ = false;
        CUDA_CHECK(cudaEventRecord(ev.f1, stream_));
        continue;
      }
      if (step.action.op == PipelineOp::kWeight) {
        StageSlot& s = slot(c, k);
        use_slot(s);
        begin_dp_micro_batch(i);
        CUDA_CHECK(cudaEventRecord(ev.w0, stream_));
        if (run_head_) classifier_weights(mb.batch, s.dlogits);
        backward(mb.batch, BackwardPart::kWeight);
        CUDA_CHECK(cudaEventRecord(ev.w1, stream_));
        s.busy = false;  // after the input gradient's send, which the next user waits behind
        continue;
      }
      GANTRY_CHECK(step.action.op == (split_backward_ ? PipelineOp::kInput : PipelineOp::kBackward),
                   "the GPU pipeline's backward passes: whole, or ZB-H1's input and weight passes");
      StageSlot& s = slot(c, k);
      use_slot(s);
      if (!split_backward_) begin_dp_micro_batch(i);
      CUDA_CHECK(cudaEventRecord(ev.b0, stream_));
      if (run_head_) {
        classifier(mb.batch, mb.grad_scale / static_cast<float>(N), true, s.dlogits);
        sum_accumulate_cuda(state_->loss_sum(), losses_, N, stream_);
      } else {
        CUDA_CHECK(cudaMemcpyAsync(dres_, s.dout, NC * sizeof(bf16), cudaMemcpyDeviceToDevice, stream_));
      }
      backward(mb.batch, split_backward_ ? BackwardPart::kInput : BackwardPart::kWhole);
      // d(input): sent up, or (ZB-H1, the model's first chunk) kept for the weight pass's embeddings.
      if (!run_embed_ || split_backward_) {
        CUDA_CHECK(cudaMemcpyAsync(s.dout, dres_, NC * sizeof(bf16), cudaMemcpyDeviceToDevice, stream_));
      } else {
        s.busy = false;  // the model's first chunk sends nothing up
      }
      CUDA_CHECK(cudaEventRecord(ev.b1, stream_));
    }
    CUDA_CHECK(cudaEventRecord(span_end_, stream_));
    pipe_micros_ = m;
    // The tied classifier's weight gradient, once per step, into stage 0's wte gradient (ZeRO 2-3: stage 0
    // received it before its last backward, above).
    if (head_) p2p_send(dwte_, VC, sizeof(float), 0);
    if (per_micro) return;
    if (embed_) {
      p2p_recv(dwte_in_, VC, sizeof(float), stages_ - 1);
      add_in_place_cuda(state_->grads(0), dwte_in_, VC, stream_);
    }
    // ZeRO 0-1: every unit's gradients are complete: the dp reductions, top unit first.
    for (int u = static_cast<int>(state_->plan().units.size()) - 1; u >= 0; --u) state_->grads_done(u);
  }

  // The messages' placement by what the passes take here (pipeline_program's simulation). The unit costs
  // it starts with put a receive where a unit-cost neighbour would have sent: at tp 2 x pp 2 (350M) ZB-H1's
  // input pass takes 1.2-1.9 forwards and its weight pass 0.4, so stage 0 waited for a gradient before a
  // forward that did not need it, 4.5 ms of every 33 (docs/PERF.md call U2). After kPlaceAfterSteps steps
  // every rank's per-chunk pass means (the last step's) are averaged over the whole world, so every rank
  // places by the same numbers (a pp group's programs must agree, and the dp and tp collectives inside the
  // computes need one message order on every replica); the result is kept when every rank's chunks hold no
  // more activation slots under it than under units (the planner's memory, pipeline_program_slots). Only
  // where the messages go changes: each rank's computes keep their order, so the numbers do too.
  void place_by_measured_costs(int m) {
    placement_tried_ = true;
    const size_t n = 3 * static_cast<size_t>(stages_) * vp_;  // (forward, backward or input, weight)
    std::vector<float> h(n, 0.0f);
    for (int c = 0; c < vp_; ++c) {
      for (int j = 0; j < 3; ++j)
        h[3 * (static_cast<size_t>(c) * stages_ + stage_) + j] = chunk_ms_[3 * c + j];
    }
    // scratch_ is free between steps (every kernel that uses it runs on this stream).
    CUDA_CHECK(cudaMemcpyAsync(scratch_, h.data(), n * sizeof(float), cudaMemcpyHostToDevice, stream_));
    check(pp_comm_->all_reduce_enqueue(scratch_, n, stream_));  // one stage's numbers in each entry
    for (Communicator* x : {tp_comm_, dp_}) {
      if (x != nullptr) check(x->all_reduce_enqueue(scratch_, n, stream_));
    }
    CUDA_CHECK(cudaMemcpyAsync(h.data(), scratch_, n * sizeof(float), cudaMemcpyDeviceToHost, stream_));
    for (Communicator* x : {pp_comm_, tp_comm_, dp_}) {
      if (x != nullptr) check(x->sync(stream_, dp_timeout_));  // a dead peer fails at the timeout
    }
    CUDA_CHECK(cudaStreamSynchronize(stream_));
    const double ranks = static_cast<double>(tp_) * (dp_ != nullptr ? dp_->size() : 1);
    PipelineCosts c;
    bool measured = true;
    for (size_t v = 0; v < n / 3; ++v) {
      const double f = h[3 * v] / ranks, b = h[3 * v + 1] / ranks, w = h[3 * v + 2] / ranks;
      measured = measured && f > 0 && b > 0 && (!split_backward_ || w > 0);
      c.forward.push_back(f);
      (split_backward_ ? c.input : c.backward).push_back(b);
      c.weight.push_back(w);
    }
    if (!measured || !pipeline_placement_keeps_slots(schedule_, stages_, vp_, m, c)) return;
    place_ = std::move(c);
    placed_m_ = m;
  }

  // Validation down the stages: each receives the previous one's output and hands its own on; the last
  // stage's loss is summed over pp (the others add 0), so every rank returns it.
  float pipeline_forward_loss(const int32_t* inputs, const int32_t* targets, int B) {
    const size_t step_waits = tp_waits_;  // validation's tp waits are no part of the step's phases
    upload(inputs, targets, B, false);
    sync_wte();
    const int N = B * m_.seq_len;
    const size_t NC = static_cast<size_t>(N) * m_.n_embd;
    CUDA_CHECK(cudaMemsetAsync(eval_sum_, 0, sizeof(float), stream_));
    // The chunks in order: virtual stage v = c * pp + stage takes v - 1's output and hands on to v + 1's
    // (the last stage's chunk c to stage 0's chunk c + 1 when interleaved).
    const int last = stages_ * vp_ - 1;
    for (int c = 0; c < vp_; ++c) {
      const int v = c * stages_ + stage_;
      use_chunk(c);
      StageSlot& s = acquire(c, -1);
      use_slot(s);
      if (v > 0) p2p_recv(s.in, NC, sizeof(bf16), (v - 1) % stages_);
      forward(B);
      if (v < last) p2p_send(s.layers.back().res3, NC, sizeof(bf16), (v + 1) % stages_);
      if (v == last) {
        classifier(B, 0.0f, false);
        sum_accumulate_cuda(eval_sum_, losses_, N, stream_);
      }
      s.busy = false;  // stream order: the next user waits behind the send
    }
    check(pp_comm_->all_reduce_enqueue(eval_sum_, 1, stream_));
    float sum = 0;
    CUDA_CHECK(cudaMemcpyAsync(&sum, eval_sum_, sizeof(float), cudaMemcpyDeviceToHost, stream_));
    check(pp_comm_->sync(stream_, dp_timeout_));  // a dead stage fails at the timeout
    if (tp_comm_ != nullptr) check(tp_comm_->sync(stream_, dp_timeout_));  // a dead tp peer too
    CUDA_CHECK(cudaStreamSynchronize(stream_));
    tp_waits_ = step_waits;
    return sum / static_cast<float>(N);
  }

  // A stage's phases from its events: forward and backward are the sums of its computes; the bubble is the
  // part of the schedule's span (first compute's start to last's end, on the stream) not covered by them:
  // waiting for the neighbours and the transfers themselves, which on one stream are the same thing. That
  // idle time is exposed communication, with the wait from the schedule's end to the update (the tied
  // gradient's transfer and the dp reductions).
  void read_pipeline_phase_times() {
    phases_ = PhaseTimes{};
    phases_.measured = pipe_micros_ > 0;
    if (!phases_.measured) return;
    auto ms = [](cudaEvent_t a, cudaEvent_t b) {
      float t = 0;
      CUDA_CHECK(cudaEventElapsedTime(&t, a, b));
      return static_cast<double>(t);
    };
    chunk_ms_.assign(3 * static_cast<size_t>(vp_), 0.0f);  // the passes' means, for the placement
    for (int k = 0; k < pipe_micros_ * vp_; ++k) {
      const PipeEvents& e = pipe_events_[k];
      const double f = ms(e.f0, e.f1), b = ms(e.b0, e.b1);
      phases_.forward_s += f * 1e-3;
      phases_.backward_s += b * 1e-3;
      float* mean = &chunk_ms_[3 * static_cast<size_t>(k / pipe_micros_)];
      mean[0] += static_cast<float>(f / pipe_micros_);
      mean[1] += static_cast<float>(b / pipe_micros_);
      if (split_backward_) {  // ZB-H1's weight pass
        const double w = ms(e.w0, e.w1);
        phases_.backward_s += w * 1e-3;
        phases_.weight_pass_s = phases_.weight_pass_s.value_or(0) + w * 1e-3;
        mean[2] += static_cast<float>(w / pipe_micros_);
      }
    }
    ++measured_steps_;
    const double span = ms(span_begin_, span_end_) * 1e-3;
    const double idle = std::max(0.0, span - phases_.forward_s - phases_.backward_s);
    phases_.bubble = span > 0 ? idle / span : 0.0;
    phases_.bubble_formula = pipeline_schedule_bubble(schedule_, stages_, vp_, pipe_micros_);
    phases_.message_placement = place_ ? "measured costs" : "units";
    phases_.comm_exposed_s = idle;
    // Tensor parallel inside the stage: the compute stream's stalls for the tp stream, taken out of the
    // phase they fell in and counted as exposed communication (as at pp 1). They lie inside the computes,
    // so the bubble above (idle time between computes) does not hold them.
    for (size_t k = 0; k < tp_waits_; ++k) {
      const TpWait& w = tp_wait_events_[k];
      const double s = std::max(0.0, ms(w.before, w.after) * 1e-3);
      phases_.comm_exposed_s += s;
      (w.forward ? phases_.forward_s : phases_.backward_s) -= s;
    }
    if (optimizer_timed_) {
      phases_.comm_exposed_s += std::max(0.0, ms(span_end_, opt_begin_) * 1e-3);
      phases_.optimizer_s = ms(opt_begin_, opt_end_) * 1e-3;
    }
  }

  ModelConfig m_;
  int max_batch_;
  int tp_ = 1, tp_rank_ = 0;  // the tp degree and this rank's place (1, 0 without tensor parallelism)
  // Pipeline parallel: the pp axis (null at pp 1), this stage and the stage count, the layers' split.
  Communicator* pp_comm_ = nullptr;
  int stage_ = 0, stages_ = 1;
  int vp_ = 1;                   // model chunks on this rank (interleaved 1F1B: vp > 1)
  bool split_backward_ = false;  // ZB-H1: backward() in two passes, kInput then kWeight
  PipelinePartition part_;       // the stages_ x vp_ virtual stages
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
  std::vector<LayerActs>* acts_ = &layers_;  // the activations forward() and backward() use
  std::vector<KeptGrads>* kept_ = nullptr;   // ZB-H1: the slot's kept output gradients (use_slot)
  float* early_ = nullptr;                   // ZB-H1: the slot's input-pass parameter gradients (use_slot)
  bf16* slot_dout_ = nullptr;                // ZB-H1: the slot's d(input), which stage 0's weight pass reads
  // The stage's blocks (all L at pp 1): the first one's global index and how many; whether it holds the
  // embeddings (stage 0) and the final norm and classifier (the last), and the final norm's unit.
  int first_layer_ = 0, n_local_ = 0;
  bool embed_ = true, head_ = true;
  // Each chunk's first block among the rank's (local index) and its block count (one chunk but under
  // interleaving); the chunk forward() and backward() run (use_chunk): its blocks, and whether it runs the
  // embeddings (chunk 0 of stage 0) and the final norm and classifier (the last chunk of the last stage).
  std::vector<int> chunk_first_, chunk_layers_;
  int chunk_ = 0, chunk_lo_ = 0, chunk_n_ = 0;
  bool run_embed_ = true, run_head_ = true;
  // A stage's hand-off (forward() of a chunk before the model's last): its discarded norm output.
  bf16* handoff_ln_ = nullptr;
  float *handoff_mean_ = nullptr, *handoff_rstd_ = nullptr;
  int final_unit_ = -1;
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
  int32_t* own_tokens_ = nullptr;  // the one-micro-batch token arrays (upload(), set_tokens())

  // Pipeline parallel (pipeline_step): the schedule, the step's micro-batches as the train loop gave them,
  // the activations of each micro-batch in flight, every micro-batch's tokens on the device, the wte copy
  // and its gradient (last stage) and that gradient received (stage 0), and the phase events.
  PipelineSchedule schedule_ = PipelineSchedule::kOneFOneB;
  std::vector<PipeMicro> micros_;
  int expected_micros_ = 1;
  std::vector<std::vector<StageSlot>> slots_;  // [chunk]: that chunk's slots
  std::vector<std::vector<int>> slot_of_;      // [chunk][micro]: this step's slot (-1: none yet)
  int32_t* tokens_dev_ = nullptr;
  int32_t* tokens_host_ = nullptr;
  int tokens_micros_ = 0;  // micro-batches tokens_dev_ and tokens_host_ hold
  cudaEvent_t tokens_copied_ = nullptr;
  bf16* wte_copy_ = nullptr;
  float *dwte_ = nullptr, *dwte_in_ = nullptr;
  std::vector<PipeEvents> pipe_events_;
  // The messages' placement (place_by_measured_costs): units until the costs measured after
  // kPlaceAfterSteps steps are exchanged (once), then those for m = placed_m_ micro-batches.
  static constexpr int kPlaceAfterSteps = 2;  // the first step allocates the slots and tunes the products
  int measured_steps_ = 0;
  bool placement_tried_ = false;
  std::vector<float> chunk_ms_;  // [3 * chunk + (forward, backward or input, weight)], the last step's
  std::optional<PipelineCosts> place_;
  int placed_m_ = 0;
  cudaEvent_t span_begin_ = nullptr, span_end_ = nullptr;
  int pipe_micros_ = 0;  // micro-batches the last step ran (0: none since begin_step)
  int64_t tokens_ = 0;

  // Data parallel: the dp communicator (null on one GPU) and its collectives' timeout (the tp axis' too).
  Communicator* dp_ = nullptr;
  std::chrono::milliseconds dp_timeout_{0};
  // Tensor parallel: the tp axis (null at tp 1), its stream and the events ordering it against the compute
  // stream, and the vocab-parallel cross-entropy's per-row values (chunk_rows_ each; all_*: every rank's).
  Communicator* tp_comm_ = nullptr;
  bool sp_ = false;  // sequence parallel (tp > 1, pp 1)
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
                                             const CudaTensorParallel& tp, const CudaPipeline& pp) {
  return std::make_unique<CudaBackend>(m, max_batch, graphs, deterministic, dp, tp, pp);
}

}  // namespace gantry
