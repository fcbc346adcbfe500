// The subcommands of gantry-engine. Each registers its CLI11 options on `app`; when chosen, it runs
// during parsing and stores its exit code in *exit_code.
#pragma once

namespace CLI {
class App;
}

namespace gantry {

// Exit codes: 0 done, 1 failed while running, 2 bad input (config, flags, checkpoint choice), 5 (`run`,
// `worker`) the checkpoint to resume from is damaged (an older one may load), 130 stopped by SIGINT/SIGTERM
// after a clean checkpoint.
inline constexpr int kExitFailed = 1;
inline constexpr int kExitBadInput = 2;
inline constexpr int kExitCheckpointDamaged = 5;
inline constexpr int kExitInterrupted = 130;

void train_command_add(CLI::App& app, int* exit_code);
void data_command_add(CLI::App& app, int* exit_code);
void plan_command_add(CLI::App& app, int* exit_code);
void run_command_add(CLI::App& app, int* exit_code);     // the local launcher (gang of workers)
void worker_command_add(CLI::App& app, int* exit_code);  // one rank, as run (or torchrun/srun) starts it
// The control plane (built where cpp-httplib, libcurl and SQLite are: GANTRY_HAVE_CONTROL).
void cluster_commands_add(CLI::App& app, int* exit_code);  // coordinator, agent, up, down
void ctl_command_add(CLI::App& app, int* exit_code);       // the API from a terminal
void slurm_commands_add(CLI::App& app, int* exit_code);    // slurm, slurm-agent: a Slurm job as the gang

}  // namespace gantry
