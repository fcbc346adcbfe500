// The backend interface: what the train loop asks of a device. The CPU reference (fp32) and the CUDA
// backend (bf16 compute, fp32 master weights) fill it; no CUDA types appear here.
// The backend owns the flat parameter, gradient and AdamW buffers described by the model's tensor table;
// the train loop owns the schedule, the data and the decisions (clipping, when to step, checkpoints).
//
// A step asks nothing of the device until it is over, so a GPU never waits on the host mid-step:
//
//   Result<std::unique_ptr<Backend>> be = backend_create("cuda", cfg.model, cfg.train.micro_batch, {});
//   be->zero_grads();
//   for (each micro-batch) be->forward_backward(inputs, targets, B, 1.0f / accum);
//   be->optimizer_step({.lr = lr, .grad_clip = 1.0, .step = t, ...});
//   StepStats s = be->step_stats();   // the one wait per step: mean loss, grad norm
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "engine/core/config.h"
#include "engine/core/tensor_table.h"
#include "telemetry/status.h"

namespace gantry {

enum class StateBuffer { kParams, kGrads, kAdamM, kAdamV };
const char* state_buffer_name(StateBuffer b);  // "params", "grads", "adam_m", "adam_v"

struct AdamWStep {
  double lr = 0;
  double beta1 = 0.9;
  double beta2 = 0.95;
  double eps = 1e-8;
  double weight_decay = 0;  // applied to tensors whose table entry has decay = true
  double grad_clip = 0;     // scale gradients to this global L2 norm when above it; 0 = no clipping
  int64_t step = 1;         // 1-based, for bias correction
  // The step guard's limit (engine/core/step_guard.h): a backend that honours_max_loss() leaves every
  // parameter and moment untouched when the step's globally reduced loss is above it or not finite.
  double max_loss = std::numeric_limits<double>::infinity();
};

struct StepStats {
  double loss = 0;       // mean of the micro-batch losses since zero_grads()
  double grad_norm = 0;  // global L2 norm of the gradients before clipping
  bool updated = false;  // false when the norm was not finite: the parameters were left untouched
};

// Where the last step's time went on this rank, for the per-rank step records. measured == false: the
// backend does not time its phases (the CUDA backend, until its phases are timed with events).
struct PhaseTimes {
  double forward_s = 0;
  double backward_s = 0;
  double optimizer_s = 0;
  double comm_exposed_s =
      0;  // waiting for gradient reductions and parameter gathers the compute did not hide
  bool measured = false;
  // Pipeline parallel (pp > 1): the part of this stage's schedule it spent waiting for its neighbours'
  // activations and gradients (the measured bubble, 0..1; that wait is inside comm_exposed_s too), and the
  // ideal pipeline's (p − 1)/(v·m + p − 1) beside it. Absent without a pipeline.
  std::optional<double> bubble;
  std::optional<double> bubble_formula;
  // ZB-H1: the deferred weight passes' seconds, part of backward_s (the rest is the input passes): how the
  // split backward divides, which decides how much of the fill and drain the weight passes can fill.
  std::optional<double> weight_pass_s;
  // Pipeline parallel: what the step's point-to-point messages were placed by, "units" or "measured costs"
  // (pipeline_program: the CUDA stage places by its passes' measured costs from its third step, where that
  // holds no more activation slots). Empty without a pipeline.
  std::string message_placement;
};

// The device as the step left it, for the per-rank records. Optional fields are absent where the backend
// cannot read them (no NVML, or the CPU).
struct DeviceHealth {
  int device = -1;                   // local device index; -1 = CPU
  uint64_t mem_allocated_bytes = 0;  // held now
  uint64_t mem_peak_bytes = 0;       // high-water mark since the backend was created
  std::optional<double> temperature_celsius;
  std::optional<double> sm_clock_hertz;
  std::optional<double> power_watts;
};

class Communicator;

// One range of one state buffer (global coordinates, inside held_ranges) and where its copy goes in a
// host snapshot, in floats.
struct SnapshotPiece {
  StateBuffer buffer = StateBuffer::kParams;
  size_t offset = 0, count = 0;
  size_t host_offset = 0;
};

// Which of a backend's two host snapshots: the checkpoints' (checkpoint_async.h) or the in-memory copies'
// (memory_copy.h). Each has its own host memory (and copy stream on CUDA), so an in-memory copy can be in
// flight while a checkpoint is written from the other.
enum class SnapshotSlot { kCheckpoint = 0, kMemoryCopy = 1 };
inline constexpr int kSnapshotSlots = 2;

// Bytes of training state this rank holds, per category (ZeRO shards some of them).
struct StateBytes {
  uint64_t params = 0;
  uint64_t grads = 0;
  uint64_t optimizer = 0;
};

class Backend {
 public:
  virtual ~Backend() = default;
  virtual std::string name() const = 0;
  // The device as its driver names it ("NVIDIA H100 80GB HBM3"): the key to its peak for MFU
  // (engine/core/utilisation.h). "" on CPU.
  virtual std::string device_name() const { return ""; }
  virtual const TensorTable& params() const = 0;

  // Adds d(mean cross-entropy over the batch's B*T tokens × grad_scale)/dθ to the gradients and the
  // loss to the step's loss. inputs and targets are (B, T) host arrays of token ids in [0, vocab);
  // B <= the backend's max batch. Does not wait for the device.
  virtual void forward_backward(const int32_t* inputs, const int32_t* targets, int batch,
                                float grad_scale) = 0;
  // Mean cross-entropy only (validation); waits for the result.
  virtual float forward_loss(const int32_t* inputs, const int32_t* targets, int batch) = 0;

  // Zeroes the gradients and the step's loss.
  virtual void zero_grads() = 0;
  // zero_grads() for a step of `micro_batches` forward_backward calls: under data parallelism the last
  // one reduces each gradient bucket as soon as its backward pass has filled it.
  virtual void begin_step(int micro_batches) {
    (void)micro_batches;
    zero_grads();
  }
  // Global gradient norm, clipping and AdamW in one go, without a host round trip. A non-finite norm
  // leaves every parameter and moment untouched (step_stats().updated == false).
  virtual void optimizer_step(const AdamWStep& s) = 0;
  // Whether optimizer_step skips the update on AdamWStep::max_loss (the loss-spike guard needs it). The CUDA
  // backend's fused update reads only the device's gradient norm so far: it skips on a non-finite norm only.
  virtual bool honours_max_loss() const { return false; }
  // Waits for the step to finish and reports it.
  virtual StepStats step_stats() = 0;
  // Global L2 norm of the gradient buffer now (waits); for tests and tools.
  virtual double grad_norm() = 0;
  // Phase times of the step since zero_grads(); read after step_stats().
  virtual PhaseTimes phase_times() const { return {}; }
  // Memory and sensors now (cheap enough to call once per step); the default reports memory_bytes().
  virtual DeviceHealth device_health() {
    return {.mem_allocated_bytes = memory_bytes(), .mem_peak_bytes = memory_bytes()};
  }

  // Bytes this backend allocated for parameters, state, activations and workspaces (all up front).
  virtual uint64_t memory_bytes() const = 0;

  // Host copies of a range of one flat buffer (global coordinates), for initialisation and checkpoints.
  // The range must lie inside held_ranges(which).
  virtual void read_state(StateBuffer which, size_t offset, size_t count, float* out) = 0;
  virtual void write_state(StateBuffer which, size_t offset, size_t count, const float* in) = 0;
  // The ranges of each buffer this rank keeps (all of it, or its ZeRO shard), and those it writes into
  // a checkpoint (every element written by exactly one rank of the gang).
  virtual std::vector<FlatRange> held_ranges(StateBuffer which) const {
    (void)which;
    return {{0, params().numel()}};
  }
  virtual std::vector<FlatRange> written_ranges(StateBuffer which) const {
    return which == StateBuffer::kGrads ? std::vector<FlatRange>{} : held_ranges(which);
  }
  // Every parameter; under ZeRO 3 a collective that every rank of the gang must call.
  virtual void gather_params(float* out) { read_state(StateBuffer::kParams, 0, params().numel(), out); }

  // Asynchronous checkpoints (engine/core/checkpoint_async.h): a copy of ranges of the state in host
  // memory, taken at a step boundary, that a writer thread reads while training goes on.
  // Host memory for `floats` floats, kept and reused by the backend (pinned on CUDA, so the copy is a DMA
  // beside the compute); valid until the next call asks for more, or the backend's end.
  virtual float* snapshot_memory(SnapshotSlot slot, size_t floats);
  // Starts copying each piece into host + piece.host_offset. CPU: copies before it returns. CUDA: on a
  // copy stream after the work enqueued so far; the next forward may overlap it, the next optimizer_step
  // (and read_state, write_state) waits for it on the device.
  virtual void snapshot_start(SnapshotSlot slot, const std::vector<SnapshotPiece>& pieces, float* host);
  // Blocks until the copy snapshot_start began is in host memory. Any thread may call it.
  virtual void snapshot_wait(SnapshotSlot slot) { (void)slot; }
  // The time the copy snapshot_start began took by itself (CPU: the memcpy; CUDA: the copy stream's
  // device time), after snapshot_wait(): the copy's bandwidth is its bytes over this.
  virtual double snapshot_copy_seconds(SnapshotSlot slot) const {
    return snapshot_copy_s_[static_cast<int>(slot)];
  }
  virtual StateBytes state_bytes() const {
    const uint64_t n = params().numel() * sizeof(float);
    return {.params = n, .grads = n, .optimizer = 2 * n};
  }

  // The silent-data-corruption check (engine/core/sdc_check.h): what of this rank's state every dp replica
  // holds bit-identically after an update ("fp32 parameters"; "" = nothing: ZeRO 3 shards everything, or
  // the backend has no checksum), its size in bytes, and its replica_hash (engine/core/replica_hash.h).
  // Every rank of the gang calls replicated_hash() at the same step (the CUDA backend's ZeRO 1-2 first
  // gathers its bf16 copy, a collective, when the update left it stale).
  virtual std::string replicated_state() const { return ""; }
  virtual uint64_t replicated_bytes() const { return 0; }
  virtual uint64_t replicated_hash() { return 0; }
  // Test-only (GANTRY_TEST_WORKER_FAULT flip_bit): flips bit `bit` (< 8 x replicated_bytes()) of that state
  // on this rank, as failing memory or arithmetic would. False where there is no such state.
  virtual bool test_flip_replicated_bit(uint64_t bit) {
    (void)bit;
    return false;
  }

 private:
  std::vector<float> snapshot_host_[kSnapshotSlots];  // snapshot_memory's default: ordinary host memory
  double snapshot_copy_s_[kSnapshotSlots] = {};       // snapshot_start's default: how long its copy took
};

struct BackendOptions {
  int threads = 0;            // cpu: threads, 0 = one per core
  bool cuda_graphs = true;    // cuda: replay each micro-batch as a captured CUDA graph
  bool deterministic = true;  // cuda: no floating-point atomics (the cpu backend always is)
  // Data parallel (cpu backend for now): the dp axis' communicator (null at dp 1), the ZeRO stage and
  // the gradient bucket size (parallel/shard_plan.h).
  Communicator* dp = nullptr;
  // Tensor parallel (cpu and cuda backends; parallel/tensor_parallel.h): the tp axis' communicator (null at
  // tp 1). The backend then holds tensor_parallel_table(m, tp, tp rank): params() is this rank's share.
  Communicator* tp = nullptr;
  // Sequence parallelism over the tp axis (train.sequence_parallel; needs seq_len a multiple of tp; cpu
  // only).
  bool sequence_parallel = false;
  // Pipeline parallel (parallel/pipeline_schedule.h; cpu and cuda, every schedule): the pp
  // axis' communicator (null at pp 1), train.pp_schedule and train.vp. The backend then holds its stage's
  // tensors (pipeline_rank_table).
  Communicator* pp = nullptr;
  std::string pp_schedule = "1f1b";
  int vp = 1;  // model chunks per pp rank (train.vp; > 1 under the interleaved schedule)
  int zero = 0;
  size_t bucket_bytes = size_t{25} << 20;
  std::chrono::milliseconds comm_timeout{std::chrono::seconds(120)};
};

// The fp32 reference; threads <= 0: one per core. The second form also takes a place in a dp gang.
std::unique_ptr<Backend> backend_cpu_create(const ModelConfig& m, int max_batch, int threads);
std::unique_ptr<Backend> backend_cpu_create(const ModelConfig& m, int max_batch,
                                            const BackendOptions& options);

// One pipeline stage of the fp32 reference (options.pp non-null, of size > 1).
std::unique_ptr<Backend> backend_cpu_pipeline_create(const ModelConfig& m, int max_batch,
                                                     const BackendOptions& options);

// kind "cpu" or "cuda" (an error when this build has no CUDA backend or the machine no GPU).
Result<std::unique_ptr<Backend>> backend_create(const std::string& kind, const ModelConfig& m, int max_batch,
                                                const BackendOptions& options = {});

}  // namespace gantry
