#include "engine/plan/reliability.h"

#include <cmath>

namespace gantry {

double young_interval(double checkpoint_s, double mtbf_s) {
  if (checkpoint_s <= 0 || mtbf_s <= 0) return 0;
  return std::sqrt(2.0 * checkpoint_s * mtbf_s);
}

double daly_interval(double checkpoint_s, double mtbf_s) {
  if (checkpoint_s <= 0 || mtbf_s <= 0) return 0;
  if (checkpoint_s >= 2.0 * mtbf_s) return mtbf_s;  // checkpoints slower than failures: Daly's cut-off
  const double x = checkpoint_s / (2.0 * mtbf_s);
  return std::sqrt(2.0 * checkpoint_s * mtbf_s) * (1.0 + std::sqrt(x) / 3.0 + x / 9.0) - checkpoint_s;
}

double daly_wall_time(double solve_s, double interval_s, double checkpoint_s, double restart_s,
                      double mtbf_s) {
  if (solve_s <= 0) return 0;
  if (interval_s <= 0) interval_s = solve_s;  // no checkpoints: one segment
  if (mtbf_s <= 0) return solve_s * (interval_s + checkpoint_s) / interval_s;
  // expm1 keeps precision when (τ + δ) ≪ M, the usual case.
  return mtbf_s * std::exp(restart_s / mtbf_s) * std::expm1((interval_s + checkpoint_s) / mtbf_s) * solve_s /
         interval_s;
}

double checkpoint_goodput(double interval_s, double checkpoint_s, double restart_s, double mtbf_s) {
  constexpr double kSolve = 1e6;  // the ratio does not depend on it
  const double wall = daly_wall_time(kSolve, interval_s, checkpoint_s, restart_s, mtbf_s);
  return wall > 0 ? kSolve / wall : 0;
}

}  // namespace gantry
