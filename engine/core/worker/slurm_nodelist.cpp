#include "engine/core/worker/slurm_nodelist.h"

#include <cctype>

namespace gantry {

Result<std::string> slurm_first_host(std::string_view nodelist) {
  auto bad = [&](const std::string& why) {
    return Status::error("Slurm node list '" + std::string(nodelist) + "': " + why +
                         " (expected names like gpu01 or gpu[01-04,07], separated by commas)");
  };
  if (nodelist.empty()) return bad("empty");
  std::string host;
  size_t i = 0;
  // The first item ends at the first comma outside brackets; each bracket group gives its first value.
  while (i < nodelist.size() && nodelist[i] != ',') {
    const char c = nodelist[i];
    if (c == ']') return bad("']' without '['");
    if (c != '[') {
      host += c;
      ++i;
      continue;
    }
    const size_t close = nodelist.find(']', i);
    if (close == std::string_view::npos) return bad("'[' is never closed");
    const std::string_view group = nodelist.substr(i + 1, close - i - 1);
    size_t digits = 0;
    while (digits < group.size() && std::isdigit(static_cast<unsigned char>(group[digits]))) ++digits;
    if (digits == 0) return bad("the range [" + std::string(group) + "] does not start with a number");
    for (char g : group) {
      if (!std::isdigit(static_cast<unsigned char>(g)) && g != '-' && g != ',') {
        return bad("the range [" + std::string(group) + "] holds '" + std::string(1, g) + "'");
      }
    }
    host += group.substr(0, digits);  // zero padding kept: gpu[01-04] starts with gpu01
    i = close + 1;
  }
  if (host.empty()) return bad("its first name is empty");
  return host;
}

}  // namespace gantry
