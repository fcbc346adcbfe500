#include "telemetry/host.h"

#include <unistd.h>  // gethostname

namespace gantry {

std::string host_name() {
  char host[256] = {};
  if (::gethostname(host, sizeof host - 1) != 0 || host[0] == '\0') return "unknown-host";
  return host;
}

}  // namespace gantry
