#include "engine/core/comm/communicator.h"

namespace gantry {

std::string comm_error_prefix(const char* backend, const char* op, int rank, int size, size_t count) {
  return std::string(backend) + " " + op + " (rank " + std::to_string(rank) + " of " + std::to_string(size) +
         ", " + std::to_string(count) + " floats): ";
}

}  // namespace gantry
