// gantry-engine data: turn a text file into byte-level token shards, or write the built-in synthetic corpus.
#include <CLI/CLI.hpp>
#include <cmath>
#include <cstdio>

#include "app/commands.h"
#include "engine/core/corpus.h"

namespace gantry {
namespace {

struct TextArgs {
  std::string input, out;
  double val_fraction = 0.1;
  uint64_t shard_tokens = 100'000'000;
  int version = 1;
};

// Longer than Linux's PATH_MAX, a path cannot be opened; refused here, it never reaches the corpus code's
// messages, which quote it (the usage error itself is cut to an excerpt in main).
std::string path_length_check(std::string& path) {
  constexpr size_t kPathMax = 4096;
  if (path.size() <= kPathMax) return "";
  return "a path of at most " + std::to_string(kPathMax) + " bytes, got " + std::to_string(path.size());
}

void print_stats(const CorpusStats& s) {
  std::printf("train: %llu tokens in %zu shard(s)\n", static_cast<unsigned long long>(s.train_tokens),
              s.train_paths.size());
  for (const std::string& p : s.train_paths) std::printf("  %s\n", p.c_str());
  std::printf("val: %llu tokens in %zu shard(s)\n", static_cast<unsigned long long>(s.val_tokens),
              s.val_paths.size());
  for (const std::string& p : s.val_paths) std::printf("  %s\n", p.c_str());
}

}  // namespace

void data_command_add(CLI::App& app, int* exit_code) {
  CLI::App* data = app.add_subcommand("data", "Make token shards (llm.c .bin format)");
  data->require_subcommand(1);

  auto text = std::make_shared<TextArgs>();
  CLI::App* t =
      data->add_subcommand("text", "Tokenize a text file byte by byte (vocab 256) into train/val shards");
  t->add_option("--input", text->input, "Text file")->required()->check(CLI::ExistingFile);
  t->add_option("--out", text->out, "Output folder for train_*.bin and val_*.bin")
      ->required()
      ->check(CLI::Validator(path_length_check, "PATH"));
  t->add_option("--val-fraction", text->val_fraction, "Share of the text (its end) that goes to val, 0..0.5");
  t->add_option("--shard-tokens", text->shard_tokens, "Tokens per shard at most");
  t->add_option("--version", text->version, "Shard version: 1 (uint16 tokens) or 2 (uint32)")
      ->check(CLI::IsMember({1, 2}));
  t->callback([text, exit_code] {
    Result<CorpusStats> s =
        corpus_from_text(text->input, text->out, text->val_fraction, text->shard_tokens, text->version);
    if (!s.ok()) {
      std::fprintf(stderr, "gantry-engine data text: %s\n", s.error().c_str());
      *exit_code = kExitBadInput;
      return;
    }
    print_stats(s.value());
    *exit_code = 0;
  });

  auto spec = std::make_shared<SyntheticSpec>();
  auto out = std::make_shared<std::string>();
  CLI::App* syn = data->add_subcommand(
      "synthetic",
      "Write the built-in synthetic corpus: a Markov chain with a known entropy of ln(branching) nats");
  syn->add_option("--out", *out, "Output folder")
      ->required()
      ->check(CLI::Validator(path_length_check, "PATH"));
  syn->add_option("--vocab", spec->vocab, "Vocabulary size");
  syn->add_option("--branching", spec->branching, "Successors per token");
  syn->add_option("--seed", spec->seed, "Seed");
  syn->add_option("--train-tokens", spec->train_tokens, "Tokens in the train shard");
  syn->add_option("--val-tokens", spec->val_tokens, "Tokens in the val shard");
  syn->callback([spec, out, exit_code] {
    Result<CorpusStats> s = corpus_write_synthetic(*spec, *out);
    if (!s.ok()) {
      std::fprintf(stderr, "gantry-engine data synthetic: %s\n", s.error().c_str());
      *exit_code = kExitBadInput;
      return;
    }
    print_stats(s.value());
    std::printf("entropy: %.6f nats/token (ln %d)\n", synthetic_entropy_nats(*spec), spec->branching);
    *exit_code = 0;
  });
}

}  // namespace gantry
