// One token shard in llm.c's `.bin` format, so shards made by llm.c's data scripts read as they are:
// a header of 256 little-endian int32 (magic 20240520, version, token count, the rest zero), then the
// tokens, little-endian: version 1 = uint16 each, version 2 = uint32 each (vocabularies over 65,535).
//
//   Status st = token_shard_write(dir + "/train_000000.bin", tokens, /*version=*/1);
//   if (!st.ok()) return st;
//   Result<TokenShard> shard = TokenShard::open(dir + "/train_000000.bin");
//   if (!shard.ok()) return shard.status();
//   std::vector<int32_t> buf(1024);
//   shard->read(0, buf.size(), buf.data());       // tokens [0, 1024)
#pragma once

#include <cstdint>
#include <span>
#include <string>

#include "telemetry/status.h"

namespace gantry {

inline constexpr int32_t kTokenShardMagic = 20240520;
inline constexpr int kTokenShardHeaderInts = 256;
inline constexpr uint64_t kTokenShardHeaderBytes = kTokenShardHeaderInts * 4;

// Writes `tokens` as a shard of `version` (1 or 2). A token above 65,535 with version 1 is refused (the
// message names it and its index). The file is written to path + ".tmp", flushed to disk and renamed,
// so a crash never leaves a half-written shard under the real name.
Status token_shard_write(const std::string& path, std::span<const uint32_t> tokens, int version);

// A shard mapped read-only. Movable, not copyable; the mapping lives as long as the object.
class TokenShard {
 public:
  // Maps `path` and checks the header and that the file size is exactly header + count × token bytes.
  static Result<TokenShard> open(const std::string& path);

  TokenShard(TokenShard&& other) noexcept;
  TokenShard& operator=(TokenShard&& other) noexcept;
  TokenShard(const TokenShard&) = delete;
  TokenShard& operator=(const TokenShard&) = delete;
  ~TokenShard();

  uint64_t size() const { return size_; }  // tokens
  int version() const { return version_; }
  const std::string& path() const { return path_; }
  uint64_t file_bytes() const { return file_bytes_; }
  // The modification time of the file that was mapped (not of whatever the path names later), in ns
  // since the epoch: with file_bytes(), what tells a cached digest of the contents from a stale one.
  int64_t mtime_ns() const { return mtime_ns_; }
  // The whole mapped file, header included: the bytes its content digest is taken over.
  std::span<const unsigned char> file() const { return {map_, static_cast<size_t>(file_bytes_)}; }

  // Token i; requires i < size().
  uint32_t at(uint64_t i) const;
  // Tokens [first, first + count) into out; requires first + count <= size(). int32 because that is
  // what the model's embedding lookup takes; TokenDataset refuses shards holding ids above INT32_MAX.
  void read(uint64_t first, uint64_t count, int32_t* out) const;

 private:
  TokenShard() = default;
  void release();

  std::string path_;
  const unsigned char* map_ = nullptr;  // the whole file, header included
  uint64_t file_bytes_ = 0;
  int64_t mtime_ns_ = 0;
  uint64_t size_ = 0;
  int version_ = 0;
};

}  // namespace gantry
