// What identifies a token shard's contents (the data version is made of it, token_dataset.h), and the
// cache that spares a large corpus from being read through at every start to find it.
//
// The digest needs every byte of the shard, so it is kept beside the shards in `.gantry-shard-digests.json`,
// keyed by the shard's absolute path, size and modification time in ns: a later open of an unchanged shard
// takes the digest from there; a shard rewritten since (other size or mtime) is read again. The cache sits
// beside the shards rather than in a run folder because it describes the files, so every run on one corpus
// shares it. A folder that cannot be written (a read-only corpus) is simply read through at every start.
//
//   TokenShardDigestCache cache = TokenShardDigestCache::load(dir);
//   TokenShardDigest d = cache.get(shard);  // from the cache, or read through once and recorded
//   cache.save();                           // best effort, written aside and renamed
#pragma once

#include <cstdint>
#include <map>
#include <string>

#include "engine/core/token_shard.h"

namespace gantry {

inline constexpr char kTokenShardDigestFile[] = ".gantry-shard-digests.json";
inline constexpr int kTokenShardDigestFormatVersion = 1;

struct TokenShardDigest {
  uint64_t xxh64 = 0;      // XXH64 (seed 0) of the whole file, header included
  uint32_t max_token = 0;  // the largest token id, which the model's vocabulary must exceed
};

// Reads every byte of `shard` once, in order.
TokenShardDigest token_shard_digest(const TokenShard& shard);

class TokenShardDigestCache {
 public:
  // The cache of folder `dir`; a missing, unreadable or foreign cache file is an empty cache.
  static TokenShardDigestCache load(const std::string& dir);

  // The digest of `shard`: its cached entry when the entry's size and mtime match the mapped file, else
  // computed with token_shard_digest() and recorded for save(), unless the file was modified less than
  // 2 s before: a rewrite within the file system's timestamp tick could keep both size and mtime.
  TokenShardDigest get(const TokenShard& shard);

  // Writes the cache back when get() recorded something, dropping entries of files that are gone. The
  // file is written to a name of this process and renamed, so a reader never sees half of it and two
  // processes opening one corpus at once leave one whole file. A failure leaves the corpus uncached.
  void save() const;

  // How many digests get() had to compute by reading the shard: what a test of the cache looks at.
  int computed() const { return computed_; }

 private:
  struct Entry {
    uint64_t bytes = 0;
    int64_t mtime_ns = 0;
    TokenShardDigest digest;
  };

  std::string path_;                      // the cache file
  std::map<std::string, Entry> entries_;  // by absolute shard path
  bool changed_ = false;
  int computed_ = 0;
};

}  // namespace gantry
