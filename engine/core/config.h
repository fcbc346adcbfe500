// The training configuration: typed structs, one validation rule per field, read from TOML.
// One field table in config.cpp drives parsing, range checks, the canonical dump stored in checkpoints,
// and the comparison that decides whether a checkpoint fits this config.
//
//   Result<Config> cfg = config_load("assets/configs/tiny.toml");
//   if (!cfg.ok()) { print(cfg.error()); return 2; }   // "tiny.toml:4: model.n_head = 0: allowed 1..1024"
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "telemetry/status.h"

namespace gantry {

struct ModelConfig {
  int n_layer = 2;       // transformer blocks
  int n_head = 4;        // attention heads; must divide n_embd
  int n_embd = 64;       // width d
  int vocab_size = 256;  // rows of the tied token embedding; must exceed the data's largest token
  int seq_len = 64;      // context length T (learned positions)
};

struct OptimConfig {
  double lr = 1e-3;           // peak learning rate, after warmup
  double min_lr = 1e-4;       // floor of the cosine decay; <= lr
  int warmup_steps = 10;      // linear warmup from lr/warmup_steps to lr
  double weight_decay = 0.1;  // AdamW decoupled decay, matrices only
  double beta1 = 0.9;
  double beta2 = 0.95;
  double eps = 1e-8;
  double grad_clip = 1.0;  // global-norm clip; 0 turns clipping off
};

struct TrainConfig {
  uint64_t seed = 1234;          // parameter init and data order
  int global_batch = 16;         // sequences per optimizer step, across all ranks and micro-batches
  int micro_batch = 8;           // sequences per forward/backward; must divide global_batch
  int max_steps = 200;           // optimizer steps; the cosine schedule ends here
  int checkpoint_every = 0;      // steps between checkpoints; 0 = only when training stops
  int keep_checkpoints = 3;      // committed checkpoints kept (last K)
  bool checkpoint_async = true;  // the train loop stalls only to copy the state into host memory; a writer
                                 // thread writes and commits (engine/core/checkpoint_async.h). false: it
                                 // waits for the whole write. Costs one host copy of the rank's shard
  // A periodic checkpoint due while the previous async write is still in flight on any rank: false waits
  // for it (the loop stalls for the rest of that write); true takes it at the first step boundary after
  // that write ended, so a disk slower than the interval moves checkpoints later instead of stalling the
  // run. The operator's checkpoint action always waits.
  bool checkpoint_defer_when_busy = false;
  int val_every = 50;           // steps between validation passes; 0 = never
  int val_batches = 4;          // micro-batches of the val split per validation pass
  int threads = 0;              // CPU threads; 0 = all cores
  std::string backend = "cpu";  // "cpu" (fp32 reference) or "cuda" (bf16 compute, fp32 master weights)
  bool cuda_graphs = true;      // cuda: capture each micro-batch once as a CUDA graph and replay it
  bool deterministic = true;    // cuda: no floating-point atomics anywhere (bit-identical reruns); false lets
                                // the attention backward add dQ with atomics, a few percent faster
  double dp_bucket_mb = 25;     // data parallel: gradients are reduced in buckets of about this many MiB,
                                // each as soon as the backward pass has filled it
  double collective_timeout_s = 120;  // a gang: seconds any collective or store wait may take before the gang
                                      // fails naming the rank that stopped answering; 1..86400. The flag
                                      // --collective-timeout (run, worker) overrides it
  double peak_tflops = 0;  // one device's dense bf16 peak in TFLOP/s, for MFU (engine/core/utilisation.h);
                           // 0..100000, 0 = not set: a CUDA device's from its name (telemetry/flops.h's
                           // table), a CPU's unknown (MFU shown as "n/a"); set, it wins over the table
  // The step guard (engine/core/step_guard.h): a step whose loss or gradient norm is not finite, or whose
  // loss is above guard_spike_factor x the median of the last guard_window updated steps, is skipped (no
  // update, the batch consumed); after guard_max_skips_in_row skipped steps in a row, guard_on_streak says
  // what happens: "rollback" restores the newest committed checkpoint from before the streak and moves the
  // data cursor past the streak's batches (recorded as skipped), at most guard_max_rollbacks times in a run;
  // "stop" stops the run with the reason.
  double guard_spike_factor = 0;             // 0 = no spike check, else in (1, 1e6]
  int guard_window = 20;                     // 1..100000 steps
  int guard_max_skips_in_row = 5;            // 1..1000000
  std::string guard_on_streak = "rollback";  // "rollback" | "stop"
  int guard_max_rollbacks = 3;               // 1..1000000 rollbacks in one run, then it stops
  // Silent-data-corruption check (engine/core/sdc_check.h): every this many steps the data-parallel replicas
  // compare a 64-bit hash of the state they must hold identically; a mismatch names the rank and stops the
  // run. 0 = off, else 1..1000000000. 100 by default: a check costs one pass over the parameters and an
  // all-reduce of 4 floats per replica, a fraction of a percent of 100 steps (docs/PERF.md), while a
  // corruption is found within 100 steps, before it is averaged into every replica's next checkpoints.
  int sdc_check_every = 100;
  // In-memory copies (engine/core/memory_copy.h): every this many steps each rank writes its shard into its
  // node agent's memory (GANTRY_MEMORY_DIR, given by the agent), and the agent keeps a copy on the next node
  // of the run's ring, so a recovery restores from RAM when that is newer than the newest disk checkpoint.
  // 0 = off, else 1..1000000000; off where no agent gives a memory folder (`train`, `run`).
  int memory_copy_every = 0;
  // The copies taken like asynchronous checkpoints: the loop stalls only to start the copy into host memory,
  // a writer thread writes it, and a copy due while the one before is still being written is skipped. What
  // makes memory_copy_every = 1 affordable on a GPU (docs/PERF.md). false: each copy is written before the
  // next step starts, so the newest copy is always of the last multiple of memory_copy_every.
  bool memory_copy_async = false;
  // The data-cursor log (engine/core/data_cursor_log.h): <out>/data_cursor.jsonl, about 150 bytes per rank
  // per step, what the exactly-once check reads. false: not written (a long run's log grows without
  // bound; the check then has nothing to read).
  bool data_cursor_log = true;
  // Pipeline parallel (pp > 1, engine/core/parallel/pipeline_schedule.h): the order of each stage's
  // micro-batches, "gpipe" or "1f1b". The micro-batches are the gradient-accumulation ones: global_batch /
  // (dp x micro_batch) per step, so train.micro_batch sets their count. "interleaved" runs vp model chunks
  // per rank (train.vp > 1, micro-batches a multiple of pp); "zbh1" splits the weight gradient off.
  std::string pp_schedule = "1f1b";
  int vp = 1;  // virtual pipeline stages (model chunks) per rank: > 1 only with pp_schedule "interleaved"
  // Sequence parallelism (tp > 1, engine/core/parallel/tensor_parallel.h): the LayerNorm and residual
  // regions hold only this tp rank's share of each sequence (seq_len / tp positions), the row-parallel
  // layers' all-reduce becomes a reduce-scatter and the column-parallel layers' input an all-gather
  // (Megatron-LM SP). seq_len must be a multiple of tp. No effect at tp 1.
  bool sequence_parallel = false;
};

// train.collective_timeout_s's range, shared with the flags that override it.
inline constexpr double kCollectiveTimeoutMinS = 1;
inline constexpr double kCollectiveTimeoutMaxS = 86400;

struct DataConfig {
  std::string kind =
      "synthetic";  // "synthetic" (built-in corpus, written under the run's out dir) or "shards"
  std::string dir;  // kind = "shards": folder of llm.c .bin shards
  std::string train_prefix = "train_";
  std::string val_prefix = "val_";
  int synthetic_branching = 4;  // successors per token; corpus entropy = ln(branching) nats
  uint64_t synthetic_seed = 1;
  uint64_t synthetic_train_tokens = 1 << 20;
  uint64_t synthetic_val_tokens = 1 << 16;
};

struct Config {
  ModelConfig model;
  OptimConfig optim;
  TrainConfig train;
  DataConfig data;
};

// Parse and validate. Errors name the source, line, key and the allowed values; the first error wins.
// [model], [train] and [data] are required (a config without them would train a toy model, or the
// synthetic corpus, without saying so); [optim] may be left out for AdamW's usual settings.
Result<Config> config_parse(const std::string& toml_text, const std::string& source_name);
Result<Config> config_load(const std::string& path);

// Range and cross-field checks (also run by config_parse); for configs built in code.
Status config_validate(const Config& c);

// Canonical TOML of every field, for manifests and logs; config_parse(config_dump(c)) == c.
std::string config_dump(const Config& c);

// Whether a checkpoint written under `saved` can continue under `current`: the model, optimizer, batch,
// seed and data must be equal; schedule length, checkpoint and logging cadence may change.
// Returns one "key: checkpoint has X, config has Y" line per difference that matters (empty = compatible).
std::vector<std::string> config_incompatibilities(const Config& saved, const Config& current);

}  // namespace gantry
