#include "engine/core/version.h"

#ifndef GANTRY_CODE_VERSION
#define GANTRY_CODE_VERSION "unknown"
#endif

namespace gantry {
const char* code_version() {
  return GANTRY_CODE_VERSION;
}
}  // namespace gantry
