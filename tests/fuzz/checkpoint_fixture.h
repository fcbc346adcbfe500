// The committed checkpoint the manifest target loads against: a one-layer model written once per
// process. fuzz_make_seeds writes the same checkpoint to take its manifest as the seed, so the seed loads
// cleanly and mutations start from a manifest that reaches the slice checks.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "engine/core/backend.h"
#include "engine/core/checkpoint.h"
#include "engine/core/config.h"
#include "tests/fuzz/fuzz_support.h"

namespace gantry::fuzz {

inline constexpr uint64_t kFixtureDataVersion = 0x5eed5eed5eed5eedULL;

struct CheckpointFixture {
  Config config;
  std::unique_ptr<Backend> backend;
  std::string dir;  // the committed step directory
};

inline CheckpointFixture checkpoint_fixture_make(const std::string& root) {
  CheckpointFixture f;
  f.config.model = {.n_layer = 1, .n_head = 1, .n_embd = 8, .vocab_size = 16, .seq_len = 4};
  f.config.train.global_batch = 1;
  f.config.train.micro_batch = 1;
  f.config.train.threads = 1;
  FUZZ_CHECK(config_validate(f.config).ok(), "the fixture's config is invalid");
  f.backend = backend_cpu_create(f.config.model, f.config.train.micro_batch, 1);
  const CheckpointMeta meta{.step = 1,
                            .sampler_seed = f.config.train.seed,
                            .rng_state = 7,
                            .config = f.config,
                            .data_version = kFixtureDataVersion,
                            .code_version = "fuzz",
                            .loss = 1.5};
  Result<CheckpointWritten> w = checkpoint_write(root, *f.backend, meta, /*keep=*/1);
  FUZZ_CHECK(w.ok(), "cannot write the fixture checkpoint");
  f.dir = w->dir;
  return f;
}

}  // namespace gantry::fuzz
