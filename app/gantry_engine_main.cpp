// gantry-engine: the headless engine. Subcommands: train (one process), run (N worker processes, data
// parallel), worker (one rank, as run or torchrun/srun starts it), data (make token shards), plan (the
// what-if planner), and the control plane where it is built: coordinator, agent, up, down, ctl.
#include <CLI/CLI.hpp>
#include <iostream>
#include <sstream>

#include "app/commands.h"
#include "engine/core/input_excerpt.h"
#include "engine/core/version.h"

int main(int argc, char** argv) {
  CLI::App app{"gantry-engine: headless GPT training engine"};
  app.require_subcommand(1);
  app.set_version_flag("--version", gantry::code_version());
  int exit_code = 0;
  gantry::train_command_add(app, &exit_code);
  gantry::run_command_add(app, &exit_code);
  gantry::worker_command_add(app, &exit_code);
  gantry::data_command_add(app, &exit_code);
  gantry::plan_command_add(app, &exit_code);
#ifdef GANTRY_HAVE_CONTROL
  gantry::cluster_commands_add(app, &exit_code);
  gantry::ctl_command_add(app, &exit_code);
  gantry::slurm_commands_add(app, &exit_code);
#endif
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    // Help, version or the usage error. CLI11 quotes the offending value whole: an error's words are cut
    // to a bounded excerpt, so a huge argument cannot flood stderr. Help and version pass unchanged.
    std::ostringstream out, err;
    const int rc = app.exit(e, out, err);
    std::cout << out.str() << std::flush;
    std::cerr << (rc == 0 ? err.str() : gantry::input_excerpt_words(err.str())) << std::flush;
    return rc == 0 ? 0 : gantry::kExitBadInput;
  }
  return exit_code;
}
