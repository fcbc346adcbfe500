// Turning data into token shards (token_shard.h): a text file with a byte-level tokenizer (each byte is a
// token, vocab 256), and a built-in synthetic corpus whose entropy is known exactly, so a training run can
// be judged against the best loss any model could reach on it.
//
//   SyntheticSpec spec;                             // vocab 256, 4 successors per token
//   Result<CorpusStats> st = corpus_write_synthetic(spec, "data/synth");
//   if (!st.ok()) return st.status();
//   // A perfect model's val loss is synthetic_entropy_nats(spec) = ln 4 = 1.386 nats per token.
//
//   Result<CorpusStats> text = corpus_from_text("input.txt", "data/shakespeare", 0.1, 1 << 24, 1);
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "telemetry/status.h"

namespace gantry {

struct CorpusStats {
  uint64_t train_tokens = 0;
  uint64_t val_tokens = 0;
  std::vector<std::string> train_paths;  // in order: train_000000.bin, train_000001.bin, ...
  std::vector<std::string> val_paths;    // in order: val_000000.bin, ... (empty when val_fraction is 0)
};

// Byte-level: writes <out_dir>/train_NNNNNN.bin from the first bytes of the text and val_NNNNNN.bin from
// the last round(val_fraction × bytes), creating out_dir. Each split is cut into ceil(tokens /
// shard_tokens) shards of nearly equal size (never a tiny last shard, which could not hold a window).
// val_fraction 0 writes no val split. Shards of an earlier run with the same names are overwritten, and
// higher-numbered ones left over from it are removed, so a later glob sees only this corpus.
// Errors: unreadable or empty input, val_fraction outside [0, 0.5], shard_tokens < 2, version not 1 or 2,
// a split with fewer than 2 tokens.
Result<CorpusStats> corpus_from_text(const std::string& text_path, const std::string& out_dir,
                                     double val_fraction, uint64_t shard_tokens, int version);

// An order-1 Markov chain over `vocab` tokens in which every token has `branching` distinct successors
// (picked by a seeded pseudo-random permutation of the vocabulary), each taken with probability
// 1/branching. Its entropy rate is exactly ln(branching) nats per token, whatever the stationary
// distribution. Every value comes from self-written generators, so the bytes are identical on every
// machine, compiler and standard library.
struct SyntheticSpec {
  int vocab = 256;                  // tokens 0 .. vocab-1; 2 .. 1<<20
  int branching = 4;                // successors per token; 1 .. vocab
  uint64_t seed = 1;                // picks the successors and the streams
  uint64_t train_tokens = 1 << 20;  // 2 .. 2^31-1 (one shard)
  uint64_t val_tokens = 1 << 16;    // 2 .. 2^31-1 (one shard)
};

// Checks every field; the message names the field, its value and the allowed range.
Status synthetic_validate(const SyntheticSpec& spec);

// ln(branching): the loss of a model that knows the chain exactly.
double synthetic_entropy_nats(const SyntheticSpec& spec);

// The `branching` allowed successors of `token` (< vocab), in the order the generator indexes them.
// Requires a valid spec.
std::vector<uint32_t> synthetic_successors(const SyntheticSpec& spec, uint32_t token);

// Writes <out_dir>/train_000000.bin and val_000000.bin (version 1 when vocab <= 65536, else 2), creating
// out_dir and removing higher-numbered shards left by an earlier corpus. The val stream is the same chain
// started at a different seed-derived token with its own random stream, so it is not a copy of train.
Result<CorpusStats> corpus_write_synthetic(const SyntheticSpec& spec, const std::string& out_dir);

}  // namespace gantry
