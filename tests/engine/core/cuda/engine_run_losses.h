// The GPU layout tests' one way of running `gantry-engine` (data, tensor and pipeline parallel against one
// GPU): the binary with arguments, its exit code, its stderr, and the losses (and gradient norms) of its
// --json step lines in step order. GANTRY_ENGINE_BIN is the test target's compile definition.
#pragma once

#include <sys/wait.h>

#include <cstdlib>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "tests/file_text.h"  // slurp

namespace gantry::testing_support {

// stdout and stderr go to files in `dir`; `norms`, when given, gets each step's gradient norm, and
// `val_losses` each validation loss (the steps that report one, as (step, loss)).
inline std::vector<double> losses_of(const std::string& args, const std::string& dir, int* code,
                                     std::string* err, std::vector<double>* norms = nullptr,
                                     std::vector<std::pair<int, double>>* val_losses = nullptr) {
  const std::string out = dir + "/stdout.txt", errf = dir + "/stderr.txt";
  const int status =
      std::system((std::string(GANTRY_ENGINE_BIN " ") + args + " >" + out + " 2>" + errf).c_str());
  *code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  *err = slurp(errf);
  std::vector<double> losses;
  std::istringstream lines(slurp(out));
  for (std::string line; std::getline(lines, line);) {
    nlohmann::json j = nlohmann::json::parse(line, nullptr, false);
    if (j.is_object() && j.contains("loss") && !j.contains("event")) {
      losses.push_back(j["loss"].get<double>());
      if (norms != nullptr) norms->push_back(j.value("grad_norm", -1.0));
      if (val_losses != nullptr && j.contains("val_loss") && j["val_loss"].is_number())
        val_losses->emplace_back(j.value("step", -1), j["val_loss"].get<double>());
    }
  }
  return losses;
}

}  // namespace gantry::testing_support
