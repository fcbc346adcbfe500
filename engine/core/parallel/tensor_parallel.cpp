#include "engine/core/parallel/tensor_parallel.h"

#include <cstring>

#include "engine/core/gpt.h"

namespace gantry {

Status tensor_parallel_check(const ModelConfig& m, const ParallelDims& d, const std::string& backend,
                             bool sequence_parallel) {
  auto bad = [](const std::string& what) { return Status::error("parallel layout: " + what); };
  const std::string tp = "tp " + std::to_string(d.tp);
  if (d.tp == 1) return {};
  if (backend != "cpu" && backend != "cuda") {
    return bad(tp + " with train.backend = \"" + backend +
               "\": tensor parallel runs on the \"cpu\" and \"cuda\" backends; use one of them, or tp 1");
  }
  if (backend == "cuda" && sequence_parallel && d.pp > 1) {
    return bad(tp + " x pp " + std::to_string(d.pp) +
               " with train.sequence_parallel and train.backend = \"cuda\": the GPU runs sequence "
               "parallelism at pp 1 only for now; set train.sequence_parallel = false, pp 1, or "
               "train.backend = \"cpu\"");
  }
  if (m.n_head % d.tp != 0) {
    return bad(tp + " does not divide model.n_head " + std::to_string(m.n_head) +
               ": each tp rank keeps a whole number of attention heads; choose a tp that divides " +
               std::to_string(m.n_head));
  }
  if (m.vocab_size % d.tp != 0) {
    return bad(tp + " does not divide model.vocab_size " + std::to_string(m.vocab_size) +
               ": the vocab-parallel embedding gives each tp rank a whole number of token rows; pad the "
               "vocabulary to a multiple of " +
               std::to_string(d.tp) + " (e.g. " + std::to_string((m.vocab_size + d.tp - 1) / d.tp * d.tp) +
               ") or choose a tp that divides it");
  }
  const long long mlp = 4LL * m.n_embd;
  if (mlp % d.tp != 0) {
    return bad(tp + " does not divide the MLP width 4 x model.n_embd = " + std::to_string(mlp) +
               ": choose a tp that divides " + std::to_string(mlp));
  }
  if (sequence_parallel && m.seq_len % d.tp != 0) {
    return bad(tp + " with train.sequence_parallel does not divide model.seq_len " +
               std::to_string(m.seq_len) + ": each tp rank keeps seq_len / tp positions of every sequence; " +
               "choose a tp that divides " + std::to_string(m.seq_len) +
               ", a seq_len that is a multiple of " + std::to_string(d.tp) +
               ", or train.sequence_parallel = false");
  }
  return {};
}

namespace {

enum class Split {
  kWhole,    // the same on every tp rank
  kQkvRows,  // (3C, C) or (3C): the rows of this rank's heads in each of Q, K and V
  kRows,     // (R, K) or (R): rows [r·R/tp, (r+1)·R/tp)
  kColumns,  // (R, K): columns [r·K/tp, (r+1)·K/tp) of every row
};

Split split_of(const std::string& name) {
  if (name.ends_with("attn.qkv.weight") || name.ends_with("attn.qkv.bias")) return Split::kQkvRows;
  if (name.ends_with("mlp.fc.weight") || name.ends_with("mlp.fc.bias") || name == "wte") return Split::kRows;
  if (name.ends_with("attn.proj.weight") || name.ends_with("mlp.proj.weight")) return Split::kColumns;
  return Split::kWhole;
}

// Tensor `l` (of gpt_param_table(m, tp)) as tp rank r's share of the whole tensor `w`.
TensorShare share_of(Split s, const TensorInfo& w, int tp, int r) {
  TensorShare sh;
  if (tp == 1) return sh;
  if (s == Split::kWhole) {
    sh.replicas = tp;
    sh.replica = r;
    return sh;
  }
  const size_t rows = static_cast<size_t>(w.shape[0]);
  const size_t cols = w.shape.size() > 1 ? static_cast<size_t>(w.shape[1]) : 1;
  sh.whole_shape = w.shape;
  switch (s) {
    case Split::kQkvRows: {
      const size_t cl = rows / 3 / tp;  // this rank's rows in each of the Q, K and V sections
      sh.offset = r * cl * cols, sh.width = cl * cols, sh.stride = rows / 3 * cols;
      break;
    }
    case Split::kRows: {
      const size_t rl = rows / tp;
      sh.offset = r * rl * cols, sh.width = rl * cols, sh.stride = rl * cols;
      break;
    }
    case Split::kColumns: {
      const size_t kl = cols / tp;
      sh.offset = r * kl, sh.width = kl, sh.stride = cols;
      break;
    }
    case Split::kWhole:
      break;
  }
  return sh;
}

void copy_shares(const ModelConfig& m, int tp, int tp_rank, float* full, float* local, bool to_local) {
  const TensorTable whole = gpt_param_table(m), mine = tensor_parallel_table(m, tp, tp_rank);
  for (size_t i = 0; i < whole.size(); ++i) {
    const TensorInfo& l = mine[i];
    tensor_share_runs(l, 0, l.numel, [&](size_t wo, size_t lo, size_t n) {
      float* f = full + whole[i].offset + wo;
      float* p = local + l.offset + lo;
      if (to_local) {
        std::memcpy(p, f, n * sizeof(float));
      } else {
        std::memcpy(f, p, n * sizeof(float));
      }
    });
  }
}

}  // namespace

TensorTable tensor_parallel_table(const ModelConfig& m, int tp, int tp_rank) {
  TensorTable mine = gpt_param_table(m, tp);
  if (tp == 1) return mine;
  const TensorTable whole = gpt_param_table(m);
  for (size_t i = 0; i < whole.size(); ++i)
    mine.set_share(i, share_of(split_of(whole[i].name), whole[i], tp, tp_rank));
  return mine;
}

TensorTable tensor_parallel_stage_table(const ModelConfig& m, int tp, int tp_rank, const TensorTable& stage) {
  const TensorTable mine = tensor_parallel_table(m, tp, tp_rank);
  TensorTable t;
  for (const TensorInfo& s : stage.tensors()) {
    const TensorInfo& x = mine.at(s.name);
    t.set_share(t.add(x.name, x.shape, x.decay, x.layer), x.share);
  }
  return t;
}

bool tensor_parallel_sharded(const std::string& name) {
  return split_of(name) != Split::kWhole;
}

void tensor_parallel_slice(const ModelConfig& m, int tp, int tp_rank, const float* full, float* local) {
  copy_shares(m, tp, tp_rank, const_cast<float*>(full), local, /*to_local=*/true);
}

void tensor_parallel_unslice(const ModelConfig& m, int tp, int tp_rank, const float* local, float* full) {
  copy_shares(m, tp, tp_rank, full, const_cast<float*>(local), /*to_local=*/false);
}

}  // namespace gantry
