// Token shard headers (llm.c .bin): TokenShard::open maps a file, so each input is written to a file of
// this process's scratch directory. A shard that opens must be readable to its last token: the header
// check is all that stands between a count and reads past the mapping.
#include <cstdint>
#include <string>
#include <vector>

#include "engine/core/token_shard.h"
#include "tests/fuzz/fuzz_support.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace gantry;
  static const std::string path = fuzz::fuzz_scratch_dir("token_shard") + "/shard.bin";
  fuzz::fuzz_write_file(path, data, size);
  Result<TokenShard> shard = TokenShard::open(path);
  if (!shard.ok()) {
    FUZZ_CHECK(shard.error().find(path) != std::string::npos, "a shard error does not name the file");
    return 0;
  }
  const uint64_t token_bytes = shard->version() == 1 ? 2 : 4;
  FUZZ_CHECK(shard->file_bytes() == size, "the shard's size is not the file's");
  FUZZ_CHECK(kTokenShardHeaderBytes + shard->size() * token_bytes == size,
             "the count does not cover the file");
  std::vector<int32_t> tokens(shard->size());
  shard->read(0, tokens.size(), tokens.data());
  for (uint64_t i = 0; i < tokens.size(); ++i) {
    FUZZ_CHECK(static_cast<uint32_t>(tokens[i]) == shard->at(i), "read() and at() disagree");
  }
  return 0;
}
