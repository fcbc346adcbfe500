#include "engine/core/token_shard_digest.h"

#include <unistd.h>  // getpid: the cache's temporary name is this process's

#include <algorithm>
#include <chrono>
#include <cinttypes>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>  // the cache file
#include <sstream>
#include <vector>

#include "engine/core/xxhash64.h"

namespace gantry {
namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

constexpr int64_t kSettledNs = 2'000'000'000;

std::string absolute_path(const std::string& path) {
  std::error_code ec;
  fs::path p = fs::absolute(path, ec);
  return (ec ? fs::path(path) : p).lexically_normal().string();
}

}  // namespace

TokenShardDigest token_shard_digest(const TokenShard& shard) {
  // One pass: each block of tokens is hashed and scanned while it is in cache, so a shard that is not in
  // the page cache is read from disk once.
  const std::span<const unsigned char> file = shard.file();
  XxHash64Stream hash;
  hash.update(file.data(), kTokenShardHeaderBytes);
  const uint64_t width = shard.version() == 1 ? 2 : 4;
  std::vector<int32_t> block(size_t{1} << 16);
  uint32_t max_token = 0;
  for (uint64_t first = 0; first < shard.size(); first += block.size()) {
    const uint64_t count = std::min<uint64_t>(block.size(), shard.size() - first);
    hash.update(file.data() + kTokenShardHeaderBytes + first * width, count * width);
    if (shard.version() == 1) {
      shard.read(first, count, block.data());
      for (uint64_t i = 0; i < count; ++i) max_token = std::max(max_token, static_cast<uint32_t>(block[i]));
    } else {
      // Version 2 ids may exceed INT32_MAX, which read() would turn negative.
      for (uint64_t i = 0; i < count; ++i) max_token = std::max(max_token, shard.at(first + i));
    }
  }
  return {.xxh64 = hash.digest(), .max_token = max_token};
}

TokenShardDigestCache TokenShardDigestCache::load(const std::string& dir) {
  TokenShardDigestCache cache;
  cache.path_ = (fs::path(dir) / kTokenShardDigestFile).string();
  std::ifstream in(cache.path_, std::ios::binary);
  if (!in) return cache;
  std::stringstream text;
  text << in.rdbuf();
  const json j = json::parse(text.str(), nullptr, /*allow_exceptions=*/false);
  // Anything unexpected makes the whole file worthless: the digests are recomputed and it is rewritten.
  if (!j.is_object() || j.value("format", "") != "gantry-shard-digests" ||
      j.value("format_version", 0) != kTokenShardDigestFormatVersion || !j.contains("shards") ||
      !j["shards"].is_array()) {
    return cache;
  }
  try {
    for (const json& e : j["shards"]) {
      Entry entry{.bytes = e.at("bytes").get<uint64_t>(),
                  .mtime_ns = e.at("mtime_ns").get<int64_t>(),
                  .digest = {.max_token = e.at("max_token").get<uint32_t>()}};
      if (!xxhash64_parse_hex(e.at("xxh64").get<std::string>(), &entry.digest.xxh64)) {
        cache.entries_.clear();
        return cache;
      }
      cache.entries_[e.at("path").get<std::string>()] = entry;
    }
  } catch (const json::exception&) {
    cache.entries_.clear();
  }
  return cache;
}

TokenShardDigest TokenShardDigestCache::get(const TokenShard& shard) {
  const std::string key = absolute_path(shard.path());
  auto it = entries_.find(key);
  if (it != entries_.end() && it->second.bytes == shard.file_bytes() &&
      it->second.mtime_ns == shard.mtime_ns()) {
    return it->second.digest;
  }
  const TokenShardDigest d = token_shard_digest(shard);
  ++computed_;
  // A file modified just now may be modified again within the same timestamp tick (file systems stamp
  // with a coarse clock), keeping its mtime and size: only a digest of a file already settled when it
  // was read may stand for it later (git's "racily clean" entries, the same way round).
  const int64_t now_ns = std::chrono::duration_cast<std::chrono::nanoseconds>(
                             std::chrono::system_clock::now().time_since_epoch())
                             .count();
  if (shard.mtime_ns() < now_ns - kSettledNs) {
    entries_[key] = {.bytes = shard.file_bytes(), .mtime_ns = shard.mtime_ns(), .digest = d};
    changed_ = true;
  }
  return d;
}

void TokenShardDigestCache::save() const {
  if (!changed_) return;
  json shards = json::array();
  for (const auto& [path, e] : entries_) {
    std::error_code ec;
    if (!fs::exists(path, ec)) continue;
    shards.push_back({{"path", path},
                      {"bytes", e.bytes},
                      {"mtime_ns", e.mtime_ns},
                      {"xxh64", xxhash64_hex(e.digest.xxh64)},
                      {"max_token", e.digest.max_token}});
  }
  const json j = {{"format", "gantry-shard-digests"},
                  {"format_version", kTokenShardDigestFormatVersion},
                  {"shards", shards}};
  const std::string tmp = path_ + "." + std::to_string(::getpid()) + ".tmp";
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    out << j.dump(1) << "\n";
    if (!out.flush()) {
      out.close();
      std::error_code ec;
      fs::remove(tmp, ec);
      return;
    }
  }
  std::error_code ec;
  fs::rename(tmp, path_, ec);
  if (ec) fs::remove(tmp, ec);
}

}  // namespace gantry
