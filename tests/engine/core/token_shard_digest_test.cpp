// A shard's content digest and the cache beside the shards that spares re-reading a corpus at every
// start: used while a shard's size and mtime stay, read again when either changed, not kept for a file
// modified just before it was read; and the data version follows it.
#include "engine/core/token_shard_digest.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>  // reads and edits the cache file
#include <string>
#include <vector>

#include "engine/core/token_dataset.h"
#include "engine/core/xxhash64.h"
#include "tests/file_text.h"  // slurp
#include "tests/scratch_dir.h"

namespace gantry {
namespace {

namespace fs = std::filesystem;
using namespace std::chrono_literals;

std::string fresh_dir() {
  return fs::absolute(testing_support::scratch_dir("digest")).lexically_normal().string();
}

using testing_support::slurp;

// Tokens first, first + 1, ... (modulo `modulo`) as a shard last modified `age` ago: an hour is long
// settled.
std::string write_shard(const std::string& path, uint32_t first, size_t n, int version, uint32_t modulo,
                        std::chrono::seconds age = 1h) {
  std::vector<uint32_t> tokens(n);
  for (size_t i = 0; i < n; ++i) tokens[i] = (first + static_cast<uint32_t>(i)) % modulo;
  EXPECT_TRUE(token_shard_write(path, tokens, version).ok());
  fs::last_write_time(path, fs::file_time_type::clock::now() - age);
  return path;
}

TokenShard open_shard(const std::string& path) {
  Result<TokenShard> s = TokenShard::open(path);
  EXPECT_TRUE(s.ok()) << s.error();
  return std::move(s).value();
}

nlohmann::json cache_file(const std::string& dir) {
  return nlohmann::json::parse(slurp(dir + "/" + kTokenShardDigestFile), nullptr, false);
}

TEST(TokenShardDigest, IsTheXxh64OfTheWholeFileAndItsLargestToken) {
  const std::string dir = fresh_dir();
  // More than one block of 65536 tokens, so the block-wise hash must chain.
  const std::string v1 = write_shard(dir + "/a.bin", 7, 200000, 1, 60000);
  const std::string v2 = write_shard(dir + "/b.bin", 70000, 1000, 2, 1u << 31);
  for (const std::string& path : {v1, v2}) {
    const std::string bytes = slurp(path);
    EXPECT_EQ(token_shard_digest(open_shard(path)).xxh64, xxhash64(bytes.data(), bytes.size())) << path;
  }
  EXPECT_EQ(token_shard_digest(open_shard(v1)).max_token, 59999u);
  EXPECT_EQ(token_shard_digest(open_shard(v2)).max_token, 70999u);
}

TEST(TokenShardDigestCache, ASettledShardIsReadOnceThenTakenFromTheCache) {
  const std::string dir = fresh_dir();
  const std::string path = write_shard(dir + "/train_000000.bin", 0, 5000, 1, 100);
  TokenShardDigestCache first = TokenShardDigestCache::load(dir);
  const TokenShardDigest d = first.get(open_shard(path));
  EXPECT_EQ(first.computed(), 1);
  first.save();

  const nlohmann::json file = cache_file(dir);
  ASSERT_TRUE(file.is_object()) << slurp(dir + "/" + kTokenShardDigestFile);
  EXPECT_EQ(file["format"], "gantry-shard-digests");
  EXPECT_EQ(file["format_version"], kTokenShardDigestFormatVersion);
  ASSERT_EQ(file["shards"].size(), 1u);
  EXPECT_EQ(file["shards"][0]["path"], path);
  EXPECT_EQ(file["shards"][0]["bytes"], fs::file_size(path));
  EXPECT_EQ(file["shards"][0]["mtime_ns"], open_shard(path).mtime_ns());

  TokenShardDigestCache second = TokenShardDigestCache::load(dir);
  const TokenShardDigest again = second.get(open_shard(path));
  EXPECT_EQ(second.computed(), 0);
  EXPECT_EQ(again.xxh64, d.xxh64);
  EXPECT_EQ(again.max_token, 99u);
}

TEST(TokenShardDigestCache, AShardWithAnotherMtimeOrSizeIsReadAgain) {
  const std::string dir = fresh_dir();
  const std::string path = write_shard(dir + "/train_000000.bin", 0, 5000, 1, 100);
  TokenShardDigestCache cache = TokenShardDigestCache::load(dir);
  const TokenShardDigest d = cache.get(open_shard(path));
  cache.save();

  // Other bytes of the same size, stamped with another (settled) time.
  write_shard(path, 1, 5000, 1, 100, 30min);
  TokenShardDigestCache touched = TokenShardDigestCache::load(dir);
  const TokenShardDigest t = touched.get(open_shard(path));
  EXPECT_EQ(touched.computed(), 1);
  EXPECT_NE(t.xxh64, d.xxh64);
  touched.save();

  // Another size with the mtime the cache now holds.
  const fs::file_time_type stamp = fs::last_write_time(path);
  write_shard(path, 0, 5001, 1, 100);
  fs::last_write_time(path, stamp);
  TokenShardDigestCache resized = TokenShardDigestCache::load(dir);
  resized.get(open_shard(path));
  EXPECT_EQ(resized.computed(), 1);
}

TEST(TokenShardDigestCache, AShardModifiedJustBeforeItWasReadIsNotKept) {
  const std::string dir = fresh_dir();
  const std::string path = write_shard(dir + "/train_000000.bin", 0, 5000, 1, 100, 0s);
  TokenShardDigestCache cache = TokenShardDigestCache::load(dir);
  cache.get(open_shard(path));
  cache.save();
  TokenShardDigestCache later = TokenShardDigestCache::load(dir);
  later.get(open_shard(path));
  EXPECT_EQ(later.computed(), 1);
}

TEST(TokenShardDigestCache, AGarbledCacheFileIsReadThroughAndRewritten) {
  const std::string dir = fresh_dir();
  const std::string path = write_shard(dir + "/train_000000.bin", 0, 5000, 1, 100);
  std::ofstream(dir + "/" + kTokenShardDigestFile) << "{\"format\": \"gantry-shard-digests\", \"shards\": [";
  TokenShardDigestCache cache = TokenShardDigestCache::load(dir);
  cache.get(open_shard(path));
  EXPECT_EQ(cache.computed(), 1);
  cache.save();
  EXPECT_EQ(cache_file(dir)["shards"].size(), 1u);
}

// The data version is made of the cached digests: an entry edited by hand shows in it (so the shard was
// not read), until the shard's mtime changes and it is read again.
TEST(TokenShardDigestCache, TheDataVersionTakesTheCachedDigestUntilTheShardChanges) {
  const std::string dir = fresh_dir();
  const std::string path = write_shard(dir + "/train_000000.bin", 0, 5000, 1, 100);
  Result<TokenDataset> truth = TokenDataset::open({path}, 8);
  ASSERT_TRUE(truth.ok()) << truth.error();

  nlohmann::json file = cache_file(dir);
  ASSERT_EQ(file["shards"].size(), 1u);
  file["shards"][0]["xxh64"] = "0123456789abcdef";
  std::ofstream(dir + "/" + kTokenShardDigestFile, std::ios::trunc) << file.dump();
  Result<TokenDataset> cached = TokenDataset::open({path}, 8);
  ASSERT_TRUE(cached.ok()) << cached.error();
  EXPECT_NE(cached->data_version(), truth->data_version());

  fs::last_write_time(path, fs::last_write_time(path) + 1s);
  Result<TokenDataset> reread = TokenDataset::open({path}, 8);
  ASSERT_TRUE(reread.ok()) << reread.error();
  EXPECT_EQ(reread->data_version(), truth->data_version());
  EXPECT_NE(cache_file(dir)["shards"][0]["xxh64"], "0123456789abcdef");
}

}  // namespace
}  // namespace gantry
