#include "engine/core/backend.h"

#include <chrono>

#include "engine/core/comm/communicator.h"
#include "engine/core/parallel/pipeline_schedule.h"

#ifdef GANTRY_HAVE_CUDA
#include "engine/core/cuda/backend_cuda.h"
#include "engine/core/cuda/device.h"
#endif

namespace gantry {

float* Backend::snapshot_memory(SnapshotSlot slot, size_t floats) {
  std::vector<float>& host = snapshot_host_[static_cast<int>(slot)];
  if (host.size() < floats) host.resize(floats);
  return host.data();
}

void Backend::snapshot_start(SnapshotSlot slot, const std::vector<SnapshotPiece>& pieces, float* host) {
  const auto t0 = std::chrono::steady_clock::now();
  for (const SnapshotPiece& p : pieces) read_state(p.buffer, p.offset, p.count, host + p.host_offset);
  snapshot_copy_s_[static_cast<int>(slot)] =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

namespace {

// Both backends split the heads, the MLP's width and the vocabulary over tp ranks.
Status tp_split_check(const ModelConfig& m, const Communicator* tp) {
  if (tp == nullptr) return Status();
  const int t = tp->size();
  if (m.n_head % t != 0 || (4 * m.n_embd) % t != 0 || m.vocab_size % t != 0) {
    return Status::error("tp " + std::to_string(t) + " must divide model.n_head " + std::to_string(m.n_head) +
                         ", the MLP width " + std::to_string(4 * m.n_embd) + " and model.vocab_size " +
                         std::to_string(m.vocab_size));
  }
  return Status();
}

}  // namespace

Result<std::unique_ptr<Backend>> backend_create(const std::string& kind, const ModelConfig& m, int max_batch,
                                                const BackendOptions& options) {
  // Either backend's sequence parallelism splits each sequence's positions (or the rows of whole
  // sequences) over the tp ranks.
  if (options.tp != nullptr && options.tp->size() > 1 && options.sequence_parallel &&
      m.seq_len % options.tp->size() != 0) {
    return Status::error("tp " + std::to_string(options.tp->size()) +
                         " with sequence parallelism must divide model.seq_len " + std::to_string(m.seq_len));
  }
  if (kind == "cpu") {
    if (Status st = tp_split_check(m, options.tp); !st.ok()) return st;
    if (options.pp != nullptr && options.pp->size() > 1)
      return backend_cpu_pipeline_create(m, max_batch, options);
    return backend_cpu_create(m, max_batch, options);
  }
  if (options.pp != nullptr && options.pp->size() > 1 && kind != "cuda") {
    return Status::error(
        "pp " + std::to_string(options.pp->size()) + " with train.backend = \"" + kind +
        "\": pipeline parallel runs on the \"cpu\" and \"cuda\" backends; use pp 1, or one of them");
  }
  // Before anything else: this holds whether or not this build has CUDA.
  if (options.tp != nullptr && options.tp->size() > 1 && kind != "cuda") {
    return Status::error("tp " + std::to_string(options.tp->size()) + " with train.backend = \"" + kind +
                         "\": tensor parallel runs on the \"cpu\" and \"cuda\" backends; use one of them");
  }
  if (options.tp != nullptr && options.tp->size() > 1 && options.sequence_parallel && options.pp != nullptr &&
      options.pp->size() > 1) {
    return Status::error("tp " + std::to_string(options.tp->size()) + " x pp " +
                         std::to_string(options.pp->size()) +
                         " with sequence parallelism on train.backend = \"cuda\": the GPU runs sequence "
                         "parallelism at pp 1 only for now; set train.sequence_parallel = false, pp 1, or "
                         "train.backend = \"cpu\"");
  }
  if (kind == "cuda") {
#ifdef GANTRY_HAVE_CUDA
    if (options.zero < 0 || options.zero > 3) {
      return Status::error("zero stage " + std::to_string(options.zero) + ": allowed 0, 1, 2 or 3");
    }
    if (cuda_device_count() == 0) {
      return Status::error(
          "train.backend = \"cuda\" but this machine has no usable GPU (no device or no driver); "
          "use train.backend = \"cpu\"");
    }
    const int hs = m.n_embd / m.n_head;
    if (m.n_embd % 8 != 0 || m.n_embd > 2048 || (hs != 16 && hs != 32 && hs != 64 && hs != 128)) {
      return Status::error(
          "the cuda backend needs model.n_embd a multiple of 8 up to 2048 and a head size "
          "(n_embd / n_head) of 16, 32, 64 or 128; this model has n_embd " +
          std::to_string(m.n_embd) + ", head size " + std::to_string(hs));
    }
    if (Status st = tp_split_check(m, options.tp); !st.ok()) return st;
    if (options.pp != nullptr && options.pp->size() > 1) {
      PipelineSchedule s{};
      if (!pipeline_schedule_from_name(options.pp_schedule, &s) ||
          (s == PipelineSchedule::kInterleaved) != (options.vp > 1)) {
        return Status::error("pp " + std::to_string(options.pp->size()) + " with train.pp_schedule = \"" +
                             options.pp_schedule + "\" and vp " + std::to_string(options.vp) +
                             " on train.backend = \"cuda\": the GPU pipeline runs \"gpipe\", \"1f1b\" and "
                             "\"zbh1\" at vp 1 and \"interleaved\" at vp > 1; use one of those");
      }
    }
    return backend_cuda_create(m, max_batch, options.cuda_graphs, options.deterministic,
                               {.comm = options.dp,
                                .zero = options.zero,
                                .bucket_bytes = options.bucket_bytes,
                                .timeout = options.comm_timeout},
                               {.comm = options.tp, .sequence_parallel = options.sequence_parallel},
                               {.comm = options.pp, .schedule = options.pp_schedule, .vp = options.vp});
#else
    return Status::error(
        "train.backend = \"cuda\" but this build has no CUDA backend (nvcc was not found when it "
        "was configured); use train.backend = \"cpu\" or rebuild with CUDA");
#endif
  }
  return Status::error("unknown backend \"" + kind + "\": use \"cpu\" or \"cuda\"");
}

}  // namespace gantry
