#include "engine/core/backend.h"

#ifdef GANTRY_HAVE_CUDA
#include "engine/core/cuda/backend_cuda.h"
#include "engine/core/cuda/device.h"
#endif

namespace gantry {

Result<std::unique_ptr<Backend>> backend_create(const std::string& kind, const ModelConfig& m, int max_batch,
                                                int threads) {
  if (kind == "cpu") return backend_cpu_create(m, max_batch, threads);
  if (kind == "cuda") {
#ifdef GANTRY_HAVE_CUDA
    if (cuda_device_count() == 0) {
      return Status::error("train.backend = \"cuda\" but this machine has no usable GPU (no device or no driver); "
                           "use train.backend = \"cpu\"");
    }
    return backend_cuda_create(m, max_batch);
#else
    return Status::error("train.backend = \"cuda\" but this build has no CUDA backend (nvcc was not found when it "
                         "was configured); use train.backend = \"cpu\" or rebuild with CUDA");
#endif
  }
  return Status::error("unknown backend \"" + kind + "\": use \"cpu\" or \"cuda\"");
}

}  // namespace gantry
