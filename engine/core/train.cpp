#include "engine/core/train.h"

#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <vector>

#include "engine/core/backend.h"
#include "engine/core/checkpoint.h"
#include "engine/core/corpus.h"
#include "engine/core/fatal.h"
#include "engine/core/gpt.h"
#include "engine/core/optim.h"
#include "engine/core/rng.h"
#include "engine/core/sampler.h"
#include "engine/core/token_dataset.h"
#include "engine/core/version.h"
#include "engine/core/xxhash64.h"

namespace gantry {
namespace fs = std::filesystem;

namespace {

struct Splits {
  TokenDataset train;
  TokenDataset val;
};

// The data directory of the run; the synthetic corpus is written there on first use, deterministically.
Result<std::string> prepare_data_dir(const Config& c, const std::string& out_dir) {
  if (c.data.kind == "shards") return c.data.dir;
  const std::string dir = (fs::path(out_dir) / "data").string();
  if (token_shard_glob(dir, c.data.train_prefix).ok() && token_shard_glob(dir, c.data.val_prefix).ok()) return dir;
  SyntheticSpec spec{.vocab = c.model.vocab_size,
                     .branching = c.data.synthetic_branching,
                     .seed = c.data.synthetic_seed,
                     .train_tokens = c.data.synthetic_train_tokens,
                     .val_tokens = c.data.synthetic_val_tokens};
  Result<CorpusStats> w = corpus_write_synthetic(spec, dir);
  if (!w.ok()) return w.status();
  return dir;
}

Result<TokenDataset> open_split(const Config& c, const std::string& dir, const std::string& prefix) {
  Result<std::vector<std::string>> paths = token_shard_glob(dir, prefix);
  if (!paths.ok()) return paths.status();
  Result<TokenDataset> ds = TokenDataset::open(paths.value(), c.model.seq_len);
  if (!ds.ok()) return ds.status();
  if (ds->max_token() >= static_cast<uint32_t>(c.model.vocab_size)) {
    return Status::error("data in '" + dir + "' (" + prefix + "*.bin) holds token " + std::to_string(ds->max_token()) +
                         " but model.vocab_size = " + std::to_string(c.model.vocab_size) +
                         ": raise model.vocab_size above the largest token");
  }
  return ds;
}

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

namespace {

Result<TrainSummary> train_run_unguarded(const Config& c, const TrainOptions& opt, TrainObserver* observer) {
  Status valid = config_validate(c);
  if (!valid.ok()) return valid;
  TrainObserver quiet;
  if (observer == nullptr) observer = &quiet;

  std::error_code ec;
  fs::create_directories(opt.out_dir, ec);
  if (ec) return Status::error("cannot create output directory '" + opt.out_dir + "': " + ec.message());
  Result<std::string> data_dir = prepare_data_dir(c, opt.out_dir);
  if (!data_dir.ok()) return data_dir.status();
  Result<TokenDataset> train = open_split(c, data_dir.value(), c.data.train_prefix);
  if (!train.ok()) return train.status();
  Result<TokenDataset> val = open_split(c, data_dir.value(), c.data.val_prefix);
  if (!val.ok()) return val.status();

  const int T = c.model.seq_len, B = c.train.micro_batch;
  const int accum = c.train.global_batch / B;
  Result<std::unique_ptr<Backend>> created = backend_create(
      c.train.backend, c.model, B,
      {.threads = c.train.threads, .cuda_graphs = c.train.cuda_graphs, .deterministic = c.train.deterministic});
  if (!created.ok()) return created.status();
  std::unique_ptr<Backend> backend = std::move(created.value());
  const TensorTable& table = backend->params();

  Rng rng{c.train.seed};
  int64_t step = 0;
  const std::string ckpt_root = (fs::path(opt.out_dir) / "checkpoints").string();
  if (opt.resume.empty()) {
    std::vector<float> init(table.numel());
    gpt_init_params(c.model, table, rng.next_u64(), init.data());
    backend->write_state(StateBuffer::kParams, 0, init.size(), init.data());
  } else {
    Result<std::string> dir = opt.resume == "latest" ? checkpoint_latest(ckpt_root) : Result<std::string>(opt.resume);
    if (!dir.ok()) return dir.status();
    Result<CheckpointMeta> meta = checkpoint_load(dir.value(), *backend, c, train->data_version());
    if (!meta.ok()) return meta.status();
    step = meta->step;
    rng.state = meta->rng_state;
  }

  const int64_t last_step = opt.max_steps >= 0 ? opt.max_steps : c.train.max_steps;
  TrainSummary summary;
  summary.first_step = step;
  summary.params = table.numel();
  {
    char buf[640];
    std::snprintf(buf, sizeof buf,
                  "gantry %s | backend %s, %.2f GB allocated up front | %zu parameters | %d layers, d %d, %d heads, "
                  "T %d, vocab %d | global batch %d = %d micro x %d | %llu train windows | steps %lld..%lld",
                  code_version(), backend->name().c_str(), static_cast<double>(backend->memory_bytes()) / 1e9,
                  table.numel(), c.model.n_layer, c.model.n_embd, c.model.n_head, T, c.model.vocab_size,
                  c.train.global_batch, B, accum, static_cast<unsigned long long>(train->num_windows()),
                  static_cast<long long>(step), static_cast<long long>(last_step));
    observer->on_start(buf);
    char version[24];
    std::snprintf(version, sizeof version, "%016llx", static_cast<unsigned long long>(train->data_version()));
    observer->on_run({.config_toml = config_dump(c),
                      .code_version = code_version(),
                      .data_version = version,
                      .backend = backend->name(),
                      .params = table.numel()});
  }

  std::vector<int32_t> inputs(static_cast<size_t>(B) * T), targets(static_cast<size_t>(B) * T);
  auto write_checkpoint = [&](double loss) -> Status {
    CheckpointMeta meta{.step = step,
                        .sampler_seed = c.train.seed,
                        .rng_state = rng.state,
                        .config = c,
                        .data_version = train->data_version(),
                        .code_version = code_version(),
                        .loss = loss};
    Result<CheckpointWritten> w = checkpoint_write(ckpt_root, *backend, meta, c.train.keep_checkpoints);
    if (!w.ok()) return w.status();
    summary.checkpoint_dir = w->dir;
    observer->on_checkpoint({step, w->dir, w->bytes, w->seconds});
    return {};
  };

  double last_loss = 0;
  while (step < last_step) {
    if (opt.stop != nullptr && opt.stop->load()) {
      summary.stopped_early = true;
      break;
    }
    const auto t0 = std::chrono::steady_clock::now();
    double data_wait = 0;
    backend->zero_grads();
    for (int micro = 0; micro < accum; ++micro) {
      const auto d0 = std::chrono::steady_clock::now();
      SampleRange r = sampler_micro_batch(static_cast<uint64_t>(step), c.train.global_batch, 1, 0, B, micro);
      for (uint64_t k = 0; k < r.count; ++k) {
        const uint64_t w = sampler_window(c.train.seed, r.first + k, train->num_windows());
        train->window(w, inputs.data() + k * T, targets.data() + k * T);
      }
      data_wait += seconds_since(d0);
      backend->forward_backward(inputs.data(), targets.data(), static_cast<int>(r.count),
                                1.0f / static_cast<float>(accum));
    }
    const double lr = lr_at(c, step);
    backend->optimizer_step({.lr = lr,
                             .beta1 = c.optim.beta1,
                             .beta2 = c.optim.beta2,
                             .eps = c.optim.eps,
                             .weight_decay = c.optim.weight_decay,
                             .grad_clip = c.optim.grad_clip,
                             .step = step + 1});
    const StepStats stats = backend->step_stats();
    const double loss = stats.loss, norm = stats.grad_norm;
    if (!stats.updated || !std::isfinite(loss)) {
      return Status::error("step " + std::to_string(step + 1) + ": loss " + std::to_string(loss) + ", grad norm " +
                           std::to_string(norm) +
                           " is not finite: training diverged (the parameters were not updated); lower optim.lr or "
                           "set optim.grad_clip, and resume from the last checkpoint");
    }
    ++step;
    last_loss = loss;

    StepReport rep{.step = step,
                   .last_step = last_step,
                   .loss = loss,
                   .grad_norm = norm,
                   .lr = lr,
                   .tokens = static_cast<int64_t>(c.train.global_batch) * T,
                   .data_wait_s = data_wait,
                   .phases = backend->phase_times()};
    if (c.train.val_every > 0 && step % c.train.val_every == 0) {
      double vsum = 0;
      for (int vb = 0; vb < c.train.val_batches; ++vb) {
        for (int k = 0; k < B; ++k) {
          const uint64_t w = (static_cast<uint64_t>(vb) * B + k) % val->num_windows();
          val->window(w, inputs.data() + static_cast<size_t>(k) * T, targets.data() + static_cast<size_t>(k) * T);
        }
        vsum += backend->forward_loss(inputs.data(), targets.data(), B);
      }
      rep.val_loss = vsum / c.train.val_batches;
      summary.last_val_loss = rep.val_loss;
    }
    const double secs = seconds_since(t0);
    rep.ms = secs * 1e3;
    rep.tokens_per_s = static_cast<double>(rep.tokens) / secs;
    observer->on_step(rep);

    if (c.train.checkpoint_every > 0 && step % c.train.checkpoint_every == 0 && step < last_step) {
      Status s = write_checkpoint(loss);
      if (!s.ok()) return s;
    }
  }
  if (step > summary.first_step || opt.resume.empty()) {
    Status s = write_checkpoint(last_loss);
    if (!s.ok()) return s;
  }

  std::vector<float> final_params(table.numel());
  backend->read_state(StateBuffer::kParams, 0, final_params.size(), final_params.data());
  summary.params_xxh64 = xxhash64(final_params.data(), final_params.size() * sizeof(float));
  summary.last_step = step;
  summary.last_loss = last_loss;
  return summary;
}

}  // namespace

Result<TrainSummary> train_run(const Config& c, const TrainOptions& opt, TrainObserver* observer) {
  try {
    return train_run_unguarded(c, opt, observer);
  } catch (const FatalError& e) {
    return Status::error(e.what());
  }
}

}  // namespace gantry
