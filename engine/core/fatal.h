// Fatal errors inside the engine: a failed CUDA call, a lost device, an impossible state. They throw a
// FatalError carrying file, line, host and rank; train_run and the worker catch it at their boundary and
// return it as a Status. engine/ never exits the process.
#pragma once

#include <stdexcept>
#include <string>

namespace gantry {

class FatalError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// "file.cu:42 on host h (rank 0): what" and throws.
[[noreturn]] void fatal_error(const char* file, int line, const std::string& what);

// Set once per process (the launcher knows its rank); used in fatal messages.
void fatal_set_rank(int rank);

}  // namespace gantry

#define GANTRY_CHECK(cond, what)                                                                        \
  do {                                                                                                  \
    if (!(cond))                                                                                        \
      ::gantry::fatal_error(__FILE__, __LINE__, std::string("check failed: ") + #cond + ": " + (what)); \
  } while (0)
