// The token shards of one split (train or val) seen as a numbered list of fixed windows, which is what the
// sampler picks from. Each shard is cut into windows of seq_len + 1 tokens that share one token at the
// edge: window w of a shard covers tokens [w*seq_len, w*seq_len + seq_len], so a shard of n tokens gives
// (n - 1) / seq_len windows and the leftover tail is never read. Windows never cross shards; the global
// window index runs over the shards in file-name order.
//
//   Result<std::vector<std::string>> paths = token_shard_glob("data/tinyshakespeare", "train_");
//   if (!paths.ok()) return paths.status();
//   Result<TokenDataset> ds = TokenDataset::open(paths.value(), /*seq_len=*/1024);
//   if (!ds.ok()) return ds.status();
//   if (ds->max_token() >= vocab) { ... refuse: the data does not fit the model ... }
//   std::vector<int32_t> x(1024), y(1024);
//   ds->window(sampler_window(seed, g, ds->num_windows()), x.data(), y.data());
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "engine/core/token_shard.h"
#include "telemetry/status.h"

namespace gantry {

class TokenDataset {
 public:
  // Sorts the paths by file name (then by full path), so the window numbering does not depend on the
  // order the caller listed them in. Refuses an empty list, a path listed twice, seq_len < 1, a shard
  // shorter than seq_len + 1 tokens and a token id above INT32_MAX (windows are handed out as int32).
  // Reads every byte of a shard once for its digest (token_shard_digest.h), unless the folder's digest
  // cache holds it for the shard's current size and mtime.
  static Result<TokenDataset> open(std::vector<std::string> shard_paths, int seq_len);

  uint64_t num_windows() const { return first_window_.back(); }
  int seq_len() const { return seq_len_; }

  // Window `index` (< num_windows()): inputs = its first seq_len tokens, targets = the seq_len tokens
  // after each input (the same window shifted by one). Both arrays hold seq_len entries.
  void window(uint64_t index, int32_t* inputs, int32_t* targets) const;

  // The largest token id in all shards, to check against the model's vocabulary.
  uint32_t max_token() const { return max_token_; }

  // xxhash64 of "basename:file_bytes:xxh64\n" for every shard in order, xxh64 being the 16 hex digits of
  // the XXH64 of the shard's whole file: it changes when a shard is added, removed, renamed, resized or
  // rewritten with other bytes.
  uint64_t data_version() const { return data_version_; }

  const std::vector<std::string>& paths() const { return paths_; }

 private:
  TokenDataset() = default;

  std::vector<TokenShard> shards_;
  std::vector<std::string> paths_;
  std::vector<uint64_t> first_window_;  // (shards + 1) first global window of each shard, then the total
  int seq_len_ = 0;
  uint32_t max_token_ = 0;
  uint64_t data_version_ = 0;
};

// The files `<dir>/<prefix>*.bin`, sorted by name. An unreadable dir or no match is an error naming both.
Result<std::vector<std::string>> token_shard_glob(const std::string& dir, const std::string& prefix);

}  // namespace gantry
