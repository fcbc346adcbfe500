#include "engine/core/token_dataset.h"

#include <algorithm>
#include <cinttypes>
#include <cstdio>
#include <filesystem>
#include <limits>
#include <map>
#include <utility>

#include "engine/core/token_shard_digest.h"
#include "engine/core/xxhash64.h"

namespace gantry {
namespace {

std::string basename_of(const std::string& path) {
  return std::filesystem::path(path).filename().string();
}

}  // namespace

Result<TokenDataset> TokenDataset::open(std::vector<std::string> shard_paths, int seq_len) {
  if (shard_paths.empty()) {
    return Status::error("token dataset: no shard paths given; expected at least one .bin token shard");
  }
  if (seq_len < 1) {
    return Status::error("token dataset: seq_len " + std::to_string(seq_len) +
                         " is not allowed; expected >= 1");
  }
  std::sort(shard_paths.begin(), shard_paths.end(), [](const std::string& a, const std::string& b) {
    std::string na = basename_of(a), nb = basename_of(b);
    return na != nb ? na < nb : a < b;
  });
  for (size_t i = 1; i < shard_paths.size(); ++i) {
    if (shard_paths[i] == shard_paths[i - 1]) {
      return Status::error("token dataset: shard " + shard_paths[i] +
                           " is listed twice; each shard may appear once");
    }
  }

  TokenDataset ds;
  ds.seq_len_ = seq_len;
  ds.first_window_.push_back(0);
  std::string version_text;
  // One digest cache per folder, loaded once and saved once, however many shards it holds.
  std::map<std::string, TokenShardDigestCache> caches;
  for (const std::string& path : shard_paths) {
    Result<TokenShard> shard = TokenShard::open(path);
    if (!shard.ok()) return shard.status();
    const uint64_t n = shard->size();
    if (n < static_cast<uint64_t>(seq_len) + 1) {
      return Status::error("token shard " + path + ": holds " + std::to_string(n) +
                           " tokens, fewer than seq_len + 1 = " + std::to_string(seq_len + 1) +
                           " needed for one window; use a shorter seq_len or a longer shard");
    }
    const std::string dir = std::filesystem::path(path).parent_path().string();
    auto cache = caches.find(dir);
    if (cache == caches.end())
      cache = caches.emplace(dir, TokenShardDigestCache::load(dir.empty() ? "." : dir)).first;
    const TokenShardDigest digest = cache->second.get(shard.value());
    if (digest.max_token > static_cast<uint32_t>(std::numeric_limits<int32_t>::max())) {
      return Status::error("token shard " + path + ": holds token id " + std::to_string(digest.max_token) +
                           ", above the largest id the engine takes (2147483647)");
    }
    ds.max_token_ = std::max(ds.max_token_, digest.max_token);
    ds.first_window_.push_back(ds.first_window_.back() + (n - 1) / static_cast<uint64_t>(seq_len));
    char hash[24];
    std::snprintf(hash, sizeof hash, "%016" PRIx64, digest.xxh64);
    version_text += basename_of(path) + ":" + std::to_string(shard->file_bytes()) + ":" + hash + "\n";
    ds.shards_.push_back(std::move(shard).value());
  }
  for (const auto& [dir, cache] : caches) cache.save();
  ds.data_version_ = xxhash64(version_text.data(), version_text.size());
  ds.paths_ = std::move(shard_paths);
  return ds;
}

void TokenDataset::window(uint64_t index, int32_t* inputs, int32_t* targets) const {
  // first_window_ is sorted and starts at 0: the shard is the last one whose first window is <= index.
  auto it = std::upper_bound(first_window_.begin(), first_window_.end(), index);
  const size_t s = static_cast<size_t>(it - first_window_.begin()) - 1;
  const uint64_t len = static_cast<uint64_t>(seq_len_);
  const uint64_t start = (index - first_window_[s]) * len;
  shards_[s].read(start, len, inputs);
  shards_[s].read(start + 1, len, targets);
}

Result<std::vector<std::string>> token_shard_glob(const std::string& dir, const std::string& prefix) {
  namespace fs = std::filesystem;
  std::error_code ec;
  fs::directory_iterator it(dir, ec);
  if (ec) {
    return Status::error("token shards " + dir + "/" + prefix + "*.bin: cannot list directory " + dir + " (" +
                         ec.message() + ")");
  }
  std::vector<std::string> paths;
  for (; it != fs::directory_iterator(); it.increment(ec)) {
    if (ec) break;
    const std::string name = it->path().filename().string();
    if (name.size() < prefix.size() + 4 || !name.starts_with(prefix) || !name.ends_with(".bin")) continue;
    std::error_code type_ec;
    if (!it->is_regular_file(type_ec)) continue;
    paths.push_back((fs::path(dir) / name).string());
  }
  if (ec) {
    return Status::error("token shards " + dir + "/" + prefix + "*.bin: listing directory " + dir +
                         " failed (" + ec.message() + ")");
  }
  if (paths.empty()) {
    return Status::error("token shards: no file matches " + dir + "/" + prefix +
                         "*.bin; expected shards such as " +
                         (fs::path(dir) / (prefix + "000000.bin")).string());
  }
  std::sort(paths.begin(), paths.end());
  return paths;
}

}  // namespace gantry
