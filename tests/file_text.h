// The one way a test reads a whole file: its bytes as a string, "" when it cannot be opened (a test that
// needs the file says so with an assertion of its own).
//
//   const std::string log = testing_support::slurp(dir / "stderr.txt");
#pragma once

#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

namespace gantry::testing_support {

inline std::string slurp(const std::filesystem::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

}  // namespace gantry::testing_support
