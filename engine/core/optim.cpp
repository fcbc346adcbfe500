#include "engine/core/optim.h"

#include <cmath>

namespace gantry {

double lr_at(const Config& c, int64_t step) {
  const OptimConfig& o = c.optim;
  const int64_t warmup = o.warmup_steps, total = c.train.max_steps;
  if (step < warmup) return o.lr * static_cast<double>(step + 1) / static_cast<double>(warmup);
  if (step >= total) return o.min_lr;
  const double progress = static_cast<double>(step - warmup) / static_cast<double>(total - warmup);
  const double cosine = 0.5 * (1.0 + std::cos(M_PI * progress));
  return o.min_lr + cosine * (o.lr - o.min_lr);
}

double clip_scale(double grad_norm, double clip) {
  if (clip <= 0 || !(grad_norm > clip)) return 1.0;
  return clip / grad_norm;
}

}  // namespace gantry
