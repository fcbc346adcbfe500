#include "engine/core/fatal.h"

#include <unistd.h>

#include <atomic>

#include "telemetry/host.h"

namespace gantry {
namespace {
std::atomic<int> g_rank{0};
}

void fatal_set_rank(int rank) {
  g_rank.store(rank);
}

void fatal_error(const char* file, int line, const std::string& what) {
  const std::string host = host_name();
  throw FatalError(std::string(file) + ":" + std::to_string(line) + " on host " + host + " (rank " +
                   std::to_string(g_rank.load()) + "): " + what);
}

}  // namespace gantry
