// Checkpoint interval and expected goodput under random failures: Young's first-order optimum, Daly's
// higher-order optimum and Daly's expected wall-clock time for a job that checkpoints every τ seconds,
// restarts in R seconds after each failure and loses the work since its last checkpoint.
// Failures are Poisson with mean time between failures M (the whole job's: node MTBF / nodes).
//
//   double tau = daly_interval(/*checkpoint_s=*/300, /*mtbf_s=*/86400);        // ≈ 7,000 s
//   double g = checkpoint_goodput(tau, 300, /*restart_s=*/600, 86400);        // useful / elapsed
#pragma once

namespace gantry {

// Young 1974, "A first order approximation to the optimum checkpoint interval" (CACM 17(9)):
// τ = sqrt(2·δ·M), δ the time to write a checkpoint.
double young_interval(double checkpoint_s, double mtbf_s);

// Daly 2006, "A higher order estimate of the optimum checkpoint interval for restart dumps" (FGCS 22(3)),
// the higher-order perturbation solution: τ = sqrt(2δM)·[1 + (1/3)·sqrt(δ/2M) + (1/9)·(δ/2M)] − δ for δ < 2M,
// and τ = M otherwise.
double daly_interval(double checkpoint_s, double mtbf_s);

// Daly 2006's complete model of the expected wall-clock time to finish `solve_s` seconds of work:
// T_w = M·e^{R/M}·(e^{(τ+δ)/M} − 1)·T_s/τ. Returns solve_s when mtbf_s <= 0 (no failures) plus the
// checkpoint writes alone.
double daly_wall_time(double solve_s, double interval_s, double checkpoint_s, double restart_s,
                      double mtbf_s);

// T_s / T_w: the share of elapsed time that is useful training (1 with no failures and no checkpoints).
double checkpoint_goodput(double interval_s, double checkpoint_s, double restart_s, double mtbf_s);

}  // namespace gantry
