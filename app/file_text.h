// A whole small file's text, for the mains (configs, scripts, url files, /proc entries).
//
//   bool ok = false;
//   const std::string text = file_text_read(path, &ok);
//   if (!ok) ...  // could not be opened
#pragma once

#include <cstddef>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

namespace gantry {

// `ok`, when given, says whether the file could be opened. One that cannot reads as "": for most callers
// that is an answer (a url file not written yet, a process gone from /proc), not an error.
inline std::string file_text_read(const std::filesystem::path& p, bool* ok = nullptr) {
  std::ifstream in(p);
  if (ok != nullptr) *ok = static_cast<bool>(in);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// The last `chars` characters of a file (all of a shorter one): a child's log, for an error message.
inline std::string file_text_tail(const std::filesystem::path& p, size_t chars) {
  std::string t = file_text_read(p);
  return t.size() > chars ? t.substr(t.size() - chars) : t;
}

}  // namespace gantry
