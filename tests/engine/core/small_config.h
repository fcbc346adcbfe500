// A model small enough that tests train it for tens of steps in well under a second per step.
#pragma once

#include <unistd.h>  // getpid: a scratch path of this process's own

#include <cstdlib>
#include <filesystem>
#include <string>

#include "engine/core/config.h"
#include "tests/scratch_dir.h"

namespace gantry::testing_support {

inline Config small_config() {
  Config c;
  c.model = {.n_layer = 2, .n_head = 2, .n_embd = 32, .vocab_size = 64, .seq_len = 16};
  c.optim.lr = 1e-2;
  c.optim.min_lr = 1e-3;
  c.optim.warmup_steps = 3;
  c.train.global_batch = 8;
  c.train.micro_batch = 4;
  c.train.max_steps = 20;
  c.train.val_every = 5;
  c.train.val_batches = 2;
  c.train.threads = 2;
  c.data.synthetic_train_tokens = 1 << 16;
  c.data.synthetic_val_tokens = 1 << 12;
  return c;
}

// A fresh empty directory under the test temp dir, this process's own (ctest runs tests in parallel).
inline std::string fresh_dir(const std::string& name) {
  return scratch_dir(name).string();
}

}  // namespace gantry::testing_support
