// Gantry's own backends as the planner sees them. The generic planner models any training stack
// (Korthikanti et al.'s activations, a runtime reserve); Gantry's backends instead allocate everything up
// front from a fixed table, so their memory is predicted exactly, allocation by allocation, from that table:
// engine/core/cpu/backend_cpu.cpp (CpuBackend, allocate_activations) and engine/core/cuda/backend_cuda.cu
// (CudaBackend::allocate, build_adamw_chunks, Matmul's workspace). Keep the two in step: when a backend's
// allocation changes, change the table here; tests/engine/plan/engine_profile_test.cpp compares this with
// the real CPU backend in CI and with measured CUDA figures (and with the CUDA backend where a GPU exists).
// The CPU backend's step time is priced per kind of loop it runs (engine/core/cpu/ops_cpu.cpp), with rates
// measured once on the machine (`gantry-engine plan --engine gantry-cpu --measure-cpu`).
//
//   Result<EngineMemory> mem = plan_engine_memory(EngineKind::kGantryCuda, model, /*micro_batch=*/32);
//   // tp 2 x pp 2, 1F1B, 8 micro-batches a step: the last stage's rank (each of its tp ranks alike)
//   Result<EngineMemory> last = plan_cuda_rank_memory(model, 4, /*tp=*/2, /*pp=*/2, /*stage=*/1, 8, false);
//   // pp 4 interleaved over vp 2 chunks a rank, 8 micro-batches: rank 3 (the model's last chunk)
//   Result<EngineMemory> il = plan_cpu_pipeline_memory(model, 4, 1, 4, 3, 8, CudaPipeSchedule::kInterleaved,
//   {}, 2); mem->backend_bytes  // what CudaBackend::memory_bytes() reports mem->allocations    // the table,
//   with shapes and buckets CpuStep s = plan_cpu_step(plan_cpu_work(model, 8), plan_cpu_rates_default(),
//   /*micro_batches=*/2); s.total()  // seconds per optimizer step
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "engine/plan/model.h"
#include "telemetry/pipeline_program.h"
#include "telemetry/status.h"

namespace gantry {

enum class EngineKind {
  kGeneric,     // any stack: the Korthikanti activation model, a runtime reserve (the default)
  kGantryCpu,   // Gantry's CPU reference backend: fp32 everywhere
  kGantryCuda,  // Gantry's CUDA backend: bf16 compute, fp32 master weights, gradients and AdamW state
};
const char* engine_kind_name(EngineKind e);  // "generic", "gantry-cpu", "gantry-cuda"
Result<EngineKind> engine_kind_parse(std::string_view s);

// Which memory bucket an allocation belongs to (the planner's MemoryBuckets).
enum class MemoryBucket { kWeights, kGradients, kOptimizer, kActivations, kBuffers };
const char* memory_bucket_name(MemoryBucket b);  // "weights", "gradients", ...

// One line of a backend's allocation table: `count` allocations of `bytes_each` (count = layers for the
// per-layer activations, 1 otherwise).
struct EngineAllocation {
  std::string name;   // the backend's member name, e.g. "layer.qkv"
  std::string shape;  // e.g. "(N, 3C) bf16"
  MemoryBucket bucket = MemoryBucket::kBuffers;
  uint64_t count = 1;
  uint64_t bytes_each = 0;
  // Whether Backend::memory_bytes() counts it: the CUDA backend's cuBLASLt workspace is allocated by its
  // Matmul object, outside the backend's own table, so memory_bytes() leaves it out.
  bool in_backend_bytes = true;
  uint64_t bytes() const { return count * bytes_each; }
};

struct EngineMemory {
  std::vector<EngineAllocation> allocations;
  uint64_t weights = 0, gradients = 0, optimizer = 0, activations = 0, buffers = 0;  // sums by bucket
  uint64_t total = 0;          // every allocation: the device memory the engine takes (no CUDA context)
  uint64_t backend_bytes = 0;  // what Backend::memory_bytes() reports
  // Micro-batches of activations held at once: a pipeline rank's slots (under interleaving its chunks'
  // slots weighted by their blocks, in whole-rank micro-batches); 1 without a pipeline.
  double in_flight = 1;
};

// The model shapes Gantry's backends run: GPT-2 (learned positions, LayerNorm, biases, GELU with ffn = 4d,
// tied embeddings, no dropout, kv_heads = heads), and for CUDA the kernels' limits (d % 8 == 0, d <= 2048,
// head size 16, 32, 64 or 128). The message names what differs.
Status plan_engine_validate(EngineKind e, const PlanModel& m);

// The allocation table of the engine's backend created with max batch `micro_batch` (generic: an error).
// `tp` > 1: one tensor-parallel rank's table (engine/core/parallel/tensor_parallel.cpp's split: vocabulary
// rows, heads, the MLP's width); a data-parallel rank without ZeRO holds the same table.
Result<EngineMemory> plan_engine_memory(EngineKind e, const PlanModel& m, int micro_batch, int tp = 1);

// The pipeline schedules whose slots the planner counts, on either backend (train.pp_schedule "gpipe",
// "1f1b", "zbh1" at vp 1, "interleaved" at vp > 1).
enum class CudaPipeSchedule { kGpipe, kOneFOneB, kZeroBubbleH1, kInterleaved };
// The same schedule in the engines' own terms (telemetry/pipeline_program.h), whose programs the planner
// replays.
PipelineSchedule plan_pipeline_schedule(CudaPipeSchedule s);

// One rank of the CUDA backend at dp x tp x pp: `stage` of `pp` (the
// backend's partition, plan_cuda_pipeline_layers), this tp rank's share, `micro_batches` per step under
// `schedule` (GPipe, 1F1B or ZB-H1, whose slots also keep each block's output gradients for the weight
// pass; interleaved with `vp` > 1: the rank holds vp chunks, chunk c virtual stage c·pp + stage of the
// partition into pp·vp, each with its own slots sized by its own blocks and counted by
// plan_pipeline_chunk_slots, the rank's other buffers once, and each chunk's first block beginning a
// gradient bucket). pp 1 is plan_engine_memory's table. Every tp rank of a stage holds the same
// bytes. At pp > 1 the stage's activation slots and the step's token buffer are allocated during the first
// step (acquire(), pipeline_step()): the table is what memory_bytes() reports from the end of step 1 on
// (before it, the slots and tokens are missing). Over dp (`dpp`), ZeRO 1-3 shard the state as
// engine/core/parallel/shard_plan.cpp cuts it for dp rank `rank` (the low ranks own one element more of a
// bucket that does not divide evenly; a rank whose owned range crosses one more tensor boundary has one
// AdamW chunk more, so no rank holds the most for sure); ZeroDeviceState keeps a pipeline stage's end
// units as blocks where it has no embeddings or final norm. A pipeline stage shards at ZeRO 0-3 under every
// schedule here (as the backend); under ZB-H1 at ZeRO 2-3 each slot also holds the input pass's parameter
// gradients (StageSlot::early).
struct CudaDataParallelPlan {
  int dp = 1;
  int rank = 0;                         // this rank's place on the dp axis
  int zero = 0;                         // 0-3 (dp 1: 0 whatever is asked, as the backend does)
  uint64_t bucket_bytes = 25ull << 20;  // train.dp_bucket_mb in bytes
};
// `sequence_parallel` (tp > 1 at pp 1; ignored elsewhere, as the backend refuses it there): the residual
// stream's activations at N/tp rows, and the packed LayerNorm and row-parallel bias gradients summed over tp.
Result<EngineMemory> plan_cuda_rank_memory(const PlanModel& m, int micro_batch, int tp, int pp, int stage,
                                           int micro_batches, CudaPipeSchedule schedule,
                                           const CudaDataParallelPlan& dpp = {}, int vp = 1,
                                           bool sequence_parallel = false);
// The same under GPipe (`gpipe`) or 1F1B.
Result<EngineMemory> plan_cuda_rank_memory(const PlanModel& m, int micro_batch, int tp, int pp, int stage,
                                           int micro_batches, bool gpipe,
                                           const CudaDataParallelPlan& dpp = {});

// The slots each of rank `stage`'s vp chunks holds over one step, as both backends allocate them: the
// rank's pipeline_program (telemetry/pipeline_program.h), its messages placed by units, replayed with their
// acquire() and release() (pipeline_program_slots). The CUDA stage's later placement by measured costs is
// kept only where it holds no more (pipeline_placement_keeps_slots), so this stays its count. Interleaved
// counts have no simple closed form (pp 4, vp 2, m 8: ranks 0-2 hold [8, 4], rank 3 [6, 3]); at vp 1 the
// closed forms below are this replay's. The error names a shape the schedule does not run (vp > 1 exactly
// when interleaved, m then a multiple of pp).
Result<std::vector<int>> plan_pipeline_chunk_slots(int pp, int vp, int stage, int micro_batches,
                                                   CudaPipeSchedule schedule);

// Micro-batches whose activations a pipeline stage holds at once, the slots both backends allocate: GPipe
// every one; 1F1B stage s min(m, pp - s), one more on a stage that receives (s > 0: the next activation
// arrives into its own slot before the last backward frees one). plan_pipeline_chunk_slots' replay at vp 1.
int plan_pipeline_slots(int pp, int stage, int micro_batches, bool gpipe);
// The CUDA stage's slots under `schedule` at vp 1: GPipe and 1F1B as plan_pipeline_slots; ZB-H1 min(m, pp)
// on every stage (a slot is freed after its weight pass, which the schedule defers; replayed for pp 2-8 and
// m up to 4 pp in tests/engine/plan/engine_profile_test.cpp).
int plan_cuda_pipeline_slots(int pp, int stage, int micro_batches, CudaPipeSchedule schedule);

// One dp rank of the CPU backend over dp (engine/core/cpu/, ZeroHostState on shard_plan_make's plan): its
// ZeRO stage (the CPU keeps it at dp 1 too), its rank (the low ranks own one element more of a bucket that
// does not divide evenly), the bucket size (train.dp_bucket_mb). The same fields as the CUDA plan's.
using CpuDataParallelPlan = CudaDataParallelPlan;

// One CPU rank at pp 1 (engine/core/cpu/backend_cpu.cpp): plan_engine_memory's table with the state of
// `dpp`'s dp rank (ZeRO 1: AdamW's m and v the rank's shard S; 2: the gradients too, with staging for the
// embeddings' bucket and two more; 3: the parameters too, with the embeddings and final norm gathered for
// the step and two block slots). ZeRO 0 is plan_engine_memory's table.
Result<EngineMemory> plan_cpu_rank_memory(const PlanModel& m, int micro_batch, int tp,
                                          const CpuDataParallelPlan& dpp);

// The CPU pipeline's slots (its acquire() and release() are the GPU's rules): plan_cuda_pipeline_slots.
int plan_cpu_pipeline_slots(int pp, int stage, int micro_batches, CudaPipeSchedule schedule);

// One pipeline rank's table on the CPU (engine/core/cpu/backend_cpu_pipeline.cpp): `stage` of `pp` (the
// engine's partition, plan_cpu_pipeline_layers), a tp rank's share at tp > 1, `micro_batches` per step
// under `schedule` (GPipe, 1F1B or ZB-H1, whose slots also keep each block's four output gradients for the
// weight pass; interleaved with `vp` > 1: the rank's vp chunks, chunk c virtual stage c·pp + stage of the
// partition into pp·vp, each with its own slots sized by its own blocks and counted by
// plan_pipeline_chunk_slots, the state, backward scratch, wte copy and ties once per rank), `dpp`'s dp
// rank of its ZeRO stage (the stage's state as plan_cpu_rank_memory's, plus, as the stage works on whole
// buffers for a step, the gradients at ZeRO 2-3 and the parameters at ZeRO 3 once more).
Result<EngineMemory> plan_cpu_pipeline_memory(const PlanModel& m, int micro_batch, int tp, int pp, int stage,
                                              int micro_batches, CudaPipeSchedule schedule,
                                              const CpuDataParallelPlan& dpp = {}, int vp = 1);
// The same under GPipe (`gpipe`) or 1F1B, ZeRO 0.
Result<EngineMemory> plan_cpu_pipeline_memory(const PlanModel& m, int micro_batch, int tp, int pp, int stage,
                                              int micro_batches, bool gpipe);

// The CUDA backend's one fp32 scratch buffer is the largest of what its kernels need (floats), whichever
// attention backward (train.deterministic) runs: attention_fast is the atomic-dQ backward's accumulator,
// about B·T·NH·HS floats, and for GPT-2 shapes the largest.
struct CudaScratch {
  uint64_t layernorm = 0;                // layernorm_backward_scratch_floats(N, C)
  uint64_t bias = 0;                     // bias_backward_scratch_floats for widths C, 3C, 4C (largest)
  uint64_t attention_deterministic = 0;  // B·T·NH
  uint64_t attention_fast = 0;           // fast_scratch(B, T, NH, d).total, largest d <= head size
  uint64_t global_norm = 0;              // global_norm_scratch_floats
  uint64_t total() const;                // the largest
};
CudaScratch plan_cuda_scratch_floats(const PlanModel& m, int micro_batch);

// Bytes of the cuBLASLt workspace the CUDA backend's Matmul allocates (matmul.cuh's default).
inline constexpr uint64_t kCudaMatmulWorkspaceBytes = 32ull << 20;

// ---- The CUDA backend's step time: the generic model (planner.h) with, where it was measured, the
// compute efficiency Gantry's own kernels reach instead of the GPU generation's.

// The blocks' efficiency, a micro-batch's fixed cost and the classifier's relative cost, on NVIDIA H200.
// The efficiency and the fixed cost were fitted together (the smallest largest error) to thirteen steps of
// the CUDA backend: GPT-2 124M at micro-batches 32, 8 and 4 and 350M at 16 and 8 on one GPU (docs/PERF.md
// call T10, 2026-11-28, and W1), 350M with 8 micro-batches of 16 on one GPU (P2), and both models on 2 GPUs
// at pp 2 under 1F1B and ZB-H1, 350M also interleaved (P1). Every one is within 2.9 %. With the efficiency
// alone (0.57) one GPU's 124M was 8.4 % under at 8 sequences and 13 % under at 4: each micro-batch costs
// 1.5 ms besides its FLOPs and bytes (launches, the loss's and the norms' small kernels). That cost is spread
// over the blocks, so a pipeline stage pays its blocks' share: the tp 2 x pp 2 step measured 4.5 times a tp 2
// micro-batch, (m + p - 1)/p of them (call T7), which a whole fixed cost on every stage overprices by 8 %.
// The classifier (N x C by C x V, V = 50,304) runs nearer the peak than the blocks' products: its FLOPs are
// priced at 0.80 of theirs (fitted with the efficiency in call P1), or the last pipeline stage, which holds
// it, comes out 30 % too slow. H100 has the same compute peak and the model's HBM term covers its slower
// memory, so they are used there too (an assumption until an H100 run checks them).
inline constexpr double kGantryCudaHopperEfficiency = 0.585;
inline constexpr double kGantryCudaMicroBatchCost = 1.5e-3;
inline constexpr double kGantryCudaClassifierFlopScale = 0.80;
// Tensor parallel on Gantry's CUDA backend, from 2 H200s (docs/PERF.md call T10, 2026-11-28: one GPU and tp
// 2 in each run). Measured at tp 2 only; used at any tp until a larger group is measured. A tp rank's
// compute over half of one GPU's, at 124M with 32, 8 and 4 sequences and 350M with 16 and 8:
// - 0.75 s per second of tp collective: the collectives' kernels take the SMs of the products beside them;
// - 0.9 ms a micro-batch, spread over the blocks as the one-GPU fixed cost above.
// Fitted together (least squares, every residual under 0.05 ms, against 2.7-8.9 ms measured). A third term,
// kernels_bench's 0.135 ms a layer for the narrower products (call T1), leaves residuals of 1 ms when kept,
// and the fit without it puts it at 0.005: within a step it is not seen apart from the collectives' drag,
// which also grows with the layers. The tp 2 steps are then within 2.8 %.
inline constexpr double kGantryCudaTpCollectiveDrag = 0.75;
inline constexpr double kGantryCudaTpMicroBatchCost = 0.9e-3;
// Exposed: the compute stream waits for 0.69 of the collectives' time at the link's bandwidth and 0.088 ms a
// layer besides (NCCL's latency, about 20 µs for each of the four all-reduces): fitted to the waits the tp
// 2 ranks measured (calls T1, T2) at 124M B32 and B8 and 350M B16; the other micro-batches within 0.5 ms,
// and the blocking communicator's (T4, T6) within 0.7 ms.
inline constexpr double kGantryCudaTpExposedFraction = 0.69;
inline constexpr double kGantryCudaTpLayerLatency = 0.088e-3;
// The compute time the dp gradient all-reduce hidden under the backward costs, per second of it: NCCL's
// kernels on SMs the products would use (call W5: with fewer NCCL channels a tp rank's products ran
// 1.8-3.4 ms faster a step). Fitted with an earlier tp model, which charged tp the same (call W1); the dp 2
// step at 124M is −4.7 % with it (the blocking communicator left dp 2 within 0.1 %, call T4).
inline constexpr double kGantryCudaCollectiveDrag = 0.9;
// AdamW and the gradient norm reach this share of the HBM bandwidth the planner's byte count assumes: the
// optimizer phase measured 1.155 ms (124M) and 3.23 ms (350M) on one H200 where the bytes at full bandwidth
// take 0.78 and 2.22 (calls T1, T2: 0.675 and 0.685).
inline constexpr double kGantryCudaOptimizerBandwidth = 0.68;

// The compute efficiency engine `e` reaches on GPU kind `gpu`, or 0 where none was measured (then the
// GPU's calibrated generic efficiency stands).
double plan_engine_compute_efficiency(EngineKind e, std::string_view gpu);

// ---- The CPU backend's step time.

// Rates of the CPU backend's loops on one machine, with the backend's thread count. Measured by running
// the engine's own ops at the plan's shapes (`gantry-engine plan --engine gantry-cpu --measure-cpu`); the
// defaults are the developer VM's at fixed reference shapes (2-core AMD EPYC, 2 threads, 2026-11-26;
// docs/PERF.md), so they price a model much narrower or wider than width 128 less well.
struct CpuRates {
  double dot_flops = 0;           // matmul_forward: dot-product rows, FLOP/s
  double axpy_flops = 0;          // matmul_backward: axpy rows and weight columns, FLOP/s
  double attention_flops = 0;     // attention_forward + _backward, causal (12·hs FLOPs per query-key pair)
  double gelu_elements = 0;       // gelu_forward + gelu_backward, one thread (tanh), elements/s
  double layernorm_elements = 0;  // layernorm_forward + _backward, one thread, elements/s
  double softmax_elements = 0;    // softmax_crossentropy_forward + _backward, elements/s
  double optimizer_params = 0;    // zero_grads + grad_norm + AdamW, parameters/s
  // One ThreadPool::parallel_for with nothing to do: waking the workers and waiting for them, seconds.
  // Every parallelised loop pays it once; on small models, with short loops, it is a visible share.
  double parallel_for_s = 0;
  // The CPU backend's collectives: Gloo rings over loopback TCP (gloo_communicator.h), timed between two
  // ranks. One ring step's latency (a message's round through the kernel and the peer's wake-up), and the
  // bytes/s one ring link carries (nccl-tests' bus bandwidth: the model of cluster.h applies).
  double comm_latency_s = 0;
  double comm_bw = 0;
  // The host CPU a collective costs besides the wait: the kernel's loopback TCP work (system calls,
  // copies, wake-ups) and Gloo's own thread, by the process's CPU time over the same all-reduces. Per ring
  // step a rank takes (one message out, one in) and per byte it sends. Ranks with a core each spend it
  // inside their waits; ranks that outnumber the cores take it from each other's compute (issue 17: a
  // tp 4 run on 2 cores spent 44 % of its CPU seconds in the kernel).
  double comm_cpu_step_s = 0;
  double comm_cpu_byte_s = 0;
  // The backend's threads these rates were measured with (ThreadPool's count); the planner needs it to
  // know how many of the host's cores a rank takes.
  int threads = 0;
  // Measured rates only (0 for the defaults): how many copies of the loops ran side by side, and the rows
  // of the plan's shapes they ran at.
  int measured_copies = 0;
  int measured_rows = 0;
  int comm_ranks = 0;  // the ranks Gloo's figures were timed among (0: the defaults, 2 ranks)
};
// threads 1: one thread per rank (as `gantry-engine run` ranks usually train, train.threads = 1), timed by
// CPU time; otherwise the 2-thread figures.
CpuRates plan_cpu_rates_default(int threads = 2);
Status plan_cpu_rates_validate(const CpuRates& r);  // every rate > 0

// What the CPU backend executes per micro-batch of `micro_batch` sequences (forward and backward), by the
// kind of loop, counted from backend_cpu.cpp and ops_cpu.cpp. Residual adds, the embedding and the
// buffers' zeroing are left out (each a few passes over (N, C) floats: under 2% of a step).
struct CpuWork {
  double dot_flops = 0;                 // 2·N·C·(3C + C + 4C + 4C) per layer + the logits 2·N·C·V
  double axpy_flops = 0;                // twice the forward's
  double attention_flops = 0;           // 12·hs per causal query-key pair: B·NH·T(T+1)/2 pairs per layer
  double gelu_elements = 0;             // N·4C per layer
  double layernorm_elements = 0;        // N·C, two per layer and the final one
  double softmax_elements = 0;          // N·V
  double parallel_calls = 0;            // ThreadPool::parallel_for calls: 14 per layer + 5
  double params = 0;                    // once per optimizer step, not per micro-batch
  double optimizer_parallel_calls = 0;  // once per step: the norm, and AdamW one tensor at a time
};
// `tp`: one tensor-parallel rank's share (matmuls, attention heads, the MLP and the logits split tp ways;
// the LayerNorms whole).
CpuWork plan_cpu_work(const PlanModel& m, int micro_batch, int tp = 1);

// One pipeline stage's share (backend_cpu_pipeline.cpp): `layers` blocks; the first stage also owns the
// embeddings (and wte's optimizer state), the last the final norm, the logits, the softmax and the logits'
// input gradient. The classifier's weight gradient, which the first stage computes after the schedule, is
// not in it (plan_cpu_classifier_wgrad_flops). plan_cpu_work = the whole model as one stage plus that.
CpuWork plan_cpu_stage_work(const PlanModel& m, int micro_batch, int tp, int layers, bool first, bool last);
// The classifier's weight gradient of one micro-batch, axpy FLOPs (2·N·C·V/tp).
double plan_cpu_classifier_wgrad_flops(const PlanModel& m, int micro_batch, int tp);

// The engine's pipeline partition mirrored (engine/core/parallel/pipeline_schedule.cpp pipeline_partition:
// contiguous blocks, the costliest stage as cheap as can be, the classifier's weight gradient counted on
// the first stage and its forward and input gradient on the last): blocks per (virtual) stage.
std::vector<int> plan_cpu_pipeline_layers(const PlanModel& m, int stages);
// The CUDA backend's partition (ClassifierGradStage::kLast): the classifier's weight gradient on the last
// stage too.
std::vector<int> plan_cuda_pipeline_layers(const PlanModel& m, int stages);

// The parts of one optimizer step of `micro_batches` micro-batches.
struct CpuStep {
  double matmul_s = 0, attention_s = 0, elementwise_s = 0, optimizer_s = 0;
  double dispatch_s = 0;  // thread-pool wake-ups, the optimizer's included
  double total() const { return matmul_s + attention_s + elementwise_s + optimizer_s + dispatch_s; }
};
CpuStep plan_cpu_step(const CpuWork& w, const CpuRates& r, int micro_batches);

}  // namespace gantry
