#include "engine/core/corpus.h"

#include <fcntl.h>   // open
#include <unistd.h>  // read, close

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>  // std::snprintf
#include <filesystem>
#include <limits>
#include <span>
#include <system_error>

#include "engine/core/sampler.h"
#include "engine/core/token_shard.h"

namespace gantry {
namespace {

namespace fs = std::filesystem;

constexpr uint64_t kMaxShardTokens = static_cast<uint64_t>(std::numeric_limits<int32_t>::max());

uint64_t mix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

// splitmix64: tiny, and its output is fixed by its definition, unlike the standard library's
// distributions, whose results differ between implementations.
class Rng {
 public:
  explicit Rng(uint64_t seed) : state_(seed) {}
  uint64_t next() {
    const uint64_t x = state_;
    state_ += 0x9E3779B97F4A7C15ull;
    return mix64(x);
  }
  // Uniform in [0, n), n >= 1. Plain `next() % n` would favour small values whenever n is not a power
  // of two, and the corpus's entropy would no longer be exactly ln(branching).
  uint64_t below(uint64_t n) {
    const uint64_t reject_under = (0 - n) % n;  // 2^64 mod n
    for (;;) {
      uint64_t r = next();
      if (r >= reject_under) return r % n;
    }
  }

 private:
  uint64_t state_;
};

// Distinct salts keep the successor table and the two streams independent of one another.
constexpr uint64_t kSaltSuccessors = 0x5355434345535353ull;
constexpr uint64_t kSaltTrain = 0x545241494E535452ull;
constexpr uint64_t kSaltVal = 0x56414C5354524D00ull;

uint64_t successor_key(const SyntheticSpec& spec) {
  return mix64(spec.seed ^ kSaltSuccessors);
}

uint32_t successor(const SyntheticSpec& spec, uint64_t key, uint32_t token, uint64_t j) {
  // Row `token` of the table is the first `branching` entries of a permutation of the vocabulary keyed
  // by the token: distinct by construction, and no vocab × branching table is ever held in memory.
  return static_cast<uint32_t>(sampler_permute(j, static_cast<uint64_t>(spec.vocab), key, token));
}

std::vector<uint32_t> synthetic_stream(const SyntheticSpec& spec, uint64_t salt, uint64_t count) {
  const uint64_t key = successor_key(spec);
  Rng rng(mix64(spec.seed ^ salt));
  std::vector<uint32_t> out(count);
  uint32_t cur = static_cast<uint32_t>(rng.below(static_cast<uint64_t>(spec.vocab)));
  for (uint64_t i = 0; i < count; ++i) {
    out[i] = cur;
    cur = successor(spec, key, cur, rng.below(static_cast<uint64_t>(spec.branching)));
  }
  return out;
}

std::string shard_name(const std::string& split, uint64_t index) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "_%06llu.bin", static_cast<unsigned long long>(index));
  return split + buf;
}

Status make_dir(const std::string& out_dir) {
  std::error_code ec;
  fs::create_directories(out_dir, ec);
  if (ec)
    return Status::error("corpus: cannot create output directory " + out_dir + " (" + ec.message() + ")");
  return Status();
}

// Removes <split>_NNNNNN.bin with an index >= keep: left from an earlier, larger corpus in the same
// directory, a glob would otherwise mix them into this one.
Status remove_stale_shards(const std::string& out_dir, const std::string& split, uint64_t keep) {
  std::error_code ec;
  std::vector<fs::path> stale;
  for (fs::directory_iterator it(out_dir, ec); !ec && it != fs::directory_iterator(); it.increment(ec)) {
    const std::string name = it->path().filename().string();
    const std::string head = split + "_";
    if (!name.starts_with(head) || !name.ends_with(".bin")) continue;
    const std::string digits = name.substr(head.size(), name.size() - head.size() - 4);
    if (digits.size() < 6 || digits.size() > 18 ||
        !std::all_of(digits.begin(), digits.end(), [](char c) { return c >= '0' && c <= '9'; })) {
      continue;
    }
    if (std::stoull(digits) >= keep) stale.push_back(it->path());
  }
  if (ec) return Status::error("corpus: cannot list output directory " + out_dir + " (" + ec.message() + ")");
  for (const fs::path& p : stale) {
    if (!fs::remove(p, ec) && ec) {
      return Status::error("corpus: cannot remove stale shard " + p.string() + " from an earlier corpus (" +
                           ec.message() + ")");
    }
  }
  return Status();
}

// Writes tokens [0, n), produced by `fill(first, buf)`, as ceil(n / shard_tokens) shards of nearly equal
// size.
template <class Fill>
Status write_split(const std::string& out_dir, const std::string& split, uint64_t n, uint64_t shard_tokens,
                   int version, Fill fill, std::vector<std::string>* paths) {
  const uint64_t shards = (n + shard_tokens - 1) / shard_tokens;
  // The first n % shards shards take one token more: sizes differ by at most one, none exceeds
  // shard_tokens, and no multiplication can overflow.
  const uint64_t base = shards == 0 ? 0 : n / shards;
  const uint64_t extra = shards == 0 ? 0 : n % shards;
  auto start = [&](uint64_t s) { return s * base + std::min(s, extra); };
  std::vector<uint32_t> buf;
  for (uint64_t s = 0; s < shards; ++s) {
    const uint64_t first = start(s);
    const uint64_t last = start(s + 1);
    buf.resize(last - first);
    fill(first, buf);
    const std::string path = (fs::path(out_dir) / shard_name(split, s)).string();
    Status st = token_shard_write(path, buf, version);
    if (!st.ok()) return st;
    paths->push_back(path);
  }
  return remove_stale_shards(out_dir, split, shards);
}

Status read_whole_file(const std::string& path, std::string* out) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    return Status::error("corpus: cannot read text file " + path + " (" +
                         std::error_code(errno, std::generic_category()).message() + ")");
  }
  out->clear();
  char buf[1 << 16];
  for (;;) {
    ssize_t n = ::read(fd, buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      int err = errno;
      ::close(fd);
      return Status::error("corpus: cannot read text file " + path + " (" +
                           std::error_code(err, std::generic_category()).message() + ")");
    }
    if (n == 0) break;
    out->append(buf, static_cast<size_t>(n));
  }
  ::close(fd);
  return Status();
}

}  // namespace

Result<CorpusStats> corpus_from_text(const std::string& text_path, const std::string& out_dir,
                                     double val_fraction, uint64_t shard_tokens, int version) {
  if (!(val_fraction >= 0.0 && val_fraction <= 0.5)) {
    return Status::error("corpus: val_fraction " + std::to_string(val_fraction) +
                         " is outside the allowed range [0, 0.5]");
  }
  if (shard_tokens < 2 || shard_tokens > kMaxShardTokens) {
    return Status::error("corpus: shard_tokens " + std::to_string(shard_tokens) +
                         " is outside the allowed range [2, 2147483647]");
  }
  if (version != 1 && version != 2) {
    return Status::error("corpus: version " + std::to_string(version) +
                         " is not allowed (1 = uint16 tokens, 2 = uint32 tokens)");
  }
  std::string text;
  Status st = read_whole_file(text_path, &text);
  if (!st.ok()) return st;
  const uint64_t n = text.size();
  if (n == 0) return Status::error("corpus: text file " + text_path + " is empty; expected at least 2 bytes");

  const uint64_t val = static_cast<uint64_t>(std::llround(static_cast<double>(n) * val_fraction));
  const uint64_t train = n - val;
  if (train < 2) {
    return Status::error("corpus: text file " + text_path + " leaves " + std::to_string(train) +
                         " tokens for the train split; it needs at least 2 (use a longer text)");
  }
  if (val_fraction > 0.0 && val < 2) {
    return Status::error("corpus: text file " + text_path + " of " + std::to_string(n) +
                         " bytes with val_fraction " + std::to_string(val_fraction) + " leaves " +
                         std::to_string(val) +
                         " tokens for the val split; it needs at least 2 (use a longer text, a larger "
                         "val_fraction, or 0 for no val split)");
  }
  st = make_dir(out_dir);
  if (!st.ok()) return st;

  CorpusStats stats;
  stats.train_tokens = train;
  stats.val_tokens = val;
  auto bytes_from = [&text](uint64_t offset) {
    return [&text, offset](uint64_t first, std::vector<uint32_t>& buf) {
      for (size_t i = 0; i < buf.size(); ++i) buf[i] = static_cast<unsigned char>(text[offset + first + i]);
    };
  };
  st = write_split(out_dir, "train", train, shard_tokens, version, bytes_from(0), &stats.train_paths);
  if (!st.ok()) return st;
  st = write_split(out_dir, "val", val, shard_tokens, version, bytes_from(train), &stats.val_paths);
  if (!st.ok()) return st;
  return stats;
}

Status synthetic_validate(const SyntheticSpec& spec) {
  if (spec.vocab < 2 || spec.vocab > (1 << 20)) {
    return Status::error("synthetic corpus: vocab " + std::to_string(spec.vocab) +
                         " is outside the allowed range [2, 1048576]");
  }
  if (spec.branching < 1 || spec.branching > spec.vocab) {
    return Status::error("synthetic corpus: branching " + std::to_string(spec.branching) +
                         " is outside the allowed range [1, vocab = " + std::to_string(spec.vocab) + "]");
  }
  if (spec.train_tokens < 2 || spec.train_tokens > kMaxShardTokens) {
    return Status::error("synthetic corpus: train_tokens " + std::to_string(spec.train_tokens) +
                         " is outside the allowed range [2, 2147483647]");
  }
  if (spec.val_tokens < 2 || spec.val_tokens > kMaxShardTokens) {
    return Status::error("synthetic corpus: val_tokens " + std::to_string(spec.val_tokens) +
                         " is outside the allowed range [2, 2147483647]");
  }
  return Status();
}

double synthetic_entropy_nats(const SyntheticSpec& spec) {
  return std::log(static_cast<double>(spec.branching));
}

std::vector<uint32_t> synthetic_successors(const SyntheticSpec& spec, uint32_t token) {
  const uint64_t key = successor_key(spec);
  std::vector<uint32_t> out(static_cast<size_t>(std::max(spec.branching, 0)));
  for (size_t j = 0; j < out.size(); ++j) out[j] = successor(spec, key, token, j);
  return out;
}

Result<CorpusStats> corpus_write_synthetic(const SyntheticSpec& spec, const std::string& out_dir) {
  Status st = synthetic_validate(spec);
  if (!st.ok()) return st;
  st = make_dir(out_dir);
  if (!st.ok()) return st;
  const int version = spec.vocab <= 65536 ? 1 : 2;

  CorpusStats stats;
  stats.train_tokens = spec.train_tokens;
  stats.val_tokens = spec.val_tokens;
  const struct {
    const char* split;
    uint64_t salt;
    uint64_t count;
    std::vector<std::string>* paths;
  } splits[] = {{"train", kSaltTrain, spec.train_tokens, &stats.train_paths},
                {"val", kSaltVal, spec.val_tokens, &stats.val_paths}};
  for (const auto& s : splits) {
    const std::vector<uint32_t> tokens = synthetic_stream(spec, s.salt, s.count);
    const std::string path = (fs::path(out_dir) / shard_name(s.split, 0)).string();
    st = token_shard_write(path, tokens, version);
    if (!st.ok()) return st;
    s.paths->push_back(path);
    st = remove_stale_shards(out_dir, s.split, 1);
    if (!st.ok()) return st;
  }
  return stats;
}

}  // namespace gantry
