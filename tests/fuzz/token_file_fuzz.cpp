// The API's bearer token file: token_file_read over any contents of a file of the right mode and owner.
// An accepted token passes token_check, compares equal to itself, and survives token_file_write.
#include <cstdint>
#include <filesystem>
#include <string>
#include <string_view>

#include "engine/cluster/token.h"
#include "tests/fuzz/fuzz_support.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace gantry;
  namespace fs = std::filesystem;
  static const std::string dir = fuzz::fuzz_scratch_dir("token_file");
  const std::string path = dir + "/token";
  fuzz::fuzz_write_file(path, data, size);
  fs::permissions(path, fs::perms::owner_read | fs::perms::owner_write, fs::perm_options::replace);

  const std::string_view raw(reinterpret_cast<const char*>(data), size);
  FUZZ_CHECK(token_equal(raw, raw), "a token differs from itself");
  (void)token_check(raw);

  Result<std::string> token = token_file_read(path);
  if (!token.ok()) {
    FUZZ_CHECK(token.error().find(path) != std::string::npos, "a token file error does not name the file");
    return 0;
  }
  FUZZ_CHECK(token_check(token.value()).ok(), "token_file_read returned a token token_check refuses");
  FUZZ_CHECK(raw.substr(0, token->size()) == token.value(), "the token is not the file's first bytes");
  FUZZ_CHECK(!token_equal(token.value(), token.value() + "x"), "tokens of different lengths compare equal");
  FUZZ_CHECK(token_file_write(path, token.value()).ok(), "an accepted token cannot be written back");
  Result<std::string> again = token_file_read(path);
  FUZZ_CHECK(again.ok() && again.value() == token.value(), "a token does not survive write and read");
  return 0;
}
