// The optimizer's schedule and clipping: linear warmup then cosine decay to min_lr over the config's
// max_steps, and the global-norm clip factor. The AdamW update itself runs in the backend (adamw_step).
#pragma once

#include <cstdint>

#include "engine/core/config.h"

namespace gantry {

// Learning rate of optimizer step `step` (0-based): warmup over optim.warmup_steps, cosine from optim.lr
// to optim.min_lr until train.max_steps, then min_lr.
double lr_at(const Config& c, int64_t step);

// Factor that scales gradients so their global norm is at most `clip` (1 when under it or clip == 0).
double clip_scale(double grad_norm, double clip);

}  // namespace gantry
