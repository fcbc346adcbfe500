// This machine's host name, as records, events, fatal messages and node registration name it. One helper,
// so a node is never named two ways.
#pragma once

#include <string>

namespace gantry {

// gethostname(2), or "unknown-host" when the call fails (never empty: an empty name reads as "none" in
// records and events).
std::string host_name();

}  // namespace gantry
