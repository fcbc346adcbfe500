// What the libFuzzer targets share: a property check that stops the run with a message (libFuzzer then
// keeps the input as a crash), and a scratch directory unique to the process for the parsers that only
// read files, so that targets run in parallel (scripts/fuzz.sh, -jobs) never share a path.
//
//   FUZZ_CHECK(back == batch, "a decoded batch does not survive encode and decode");
//   static const std::string dir = fuzz_scratch_dir("token_shard");   // removed at exit
//   fuzz_write_file(dir + "/shard.bin", data, size);
#pragma once

#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

// abort() rather than an exception: libFuzzer reports the abort as a crash and saves the input.
#define FUZZ_CHECK(cond, what)                                                        \
  do {                                                                                \
    if (!(cond)) {                                                                    \
      std::fprintf(stderr, "%s:%d: property broken: %s\n", __FILE__, __LINE__, what); \
      std::abort();                                                                   \
    }                                                                                 \
  } while (0)

namespace gantry::fuzz {

// <tmp>/gantry-fuzz-<name>-<pid>, created empty; removed when the process exits normally (a crashed run
// leaves it, with the state that crashed it).
inline std::string fuzz_scratch_dir(const std::string& name) {
  namespace fs = std::filesystem;
  const fs::path p = fs::temp_directory_path() / ("gantry-fuzz-" + name + "-" + std::to_string(::getpid()));
  fs::remove_all(p);
  fs::create_directories(p);
  struct Remover {
    fs::path path;
    ~Remover() {
      std::error_code ec;
      fs::remove_all(path, ec);
    }
  };
  static Remover remover{p};  // one scratch directory per target process
  return p.string();
}

inline void fuzz_write_file(const std::string& path, const uint8_t* data, size_t size) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(data), static_cast<std::streamsize>(size));
  FUZZ_CHECK(out.good(), "cannot write the scratch file");
}

}  // namespace gantry::fuzz
