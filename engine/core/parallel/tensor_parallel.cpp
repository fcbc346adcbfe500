#include "engine/core/parallel/tensor_parallel.h"

#include <cstring>

#include "engine/core/gpt.h"

namespace gantry {

Status tensor_parallel_check(const ModelConfig& m, const ParallelDims& d, const std::string& backend) {
  auto bad = [](const std::string& what) { return Status::error("parallel layout: " + what); };
  const std::string tp = "tp " + std::to_string(d.tp);
  if (d.tp == 1) return {};
  if (backend != "cpu") {
    return bad(
        tp + " with train.backend = \"" + backend +
        "\": tensor parallel is CPU-only for now; use tp 1 on this backend, or train.backend = \"cpu\"");
  }
  if (m.n_head % d.tp != 0) {
    return bad(tp + " does not divide model.n_head " + std::to_string(m.n_head) +
               ": each tp rank keeps a whole number of attention heads; choose a tp that divides " +
               std::to_string(m.n_head));
  }
  const long long mlp = 4LL * m.n_embd;
  if (mlp % d.tp != 0) {
    return bad(tp + " does not divide the MLP width 4 x model.n_embd = " + std::to_string(mlp) +
               ": choose a tp that divides " + std::to_string(mlp));
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
  if (name.ends_with("mlp.fc.weight") || name.ends_with("mlp.fc.bias")) return Split::kRows;
  if (name.ends_with("attn.proj.weight") || name.ends_with("mlp.proj.weight")) return Split::kColumns;
  return Split::kWhole;
}

// Visits each contiguous run of a tensor's share: fn(offset in the whole tensor, offset in the share, count).
template <typename Fn>
void for_each_run(Split s, const TensorInfo& whole, int tp, int r, Fn&& fn) {
  const size_t rows = static_cast<size_t>(whole.shape[0]);
  const size_t cols = whole.shape.size() > 1 ? static_cast<size_t>(whole.shape[1]) : 1;
  switch (s) {
    case Split::kWhole:
      fn(size_t{0}, size_t{0}, whole.numel);
      return;
    case Split::kQkvRows: {
      const size_t c = rows / 3, cl = c / tp;  // rows per section (C), this rank's rows per section
      for (size_t sec = 0; sec < 3; ++sec) fn((sec * c + r * cl) * cols, sec * cl * cols, cl * cols);
      return;
    }
    case Split::kRows: {
      const size_t rl = rows / tp;
      fn(r * rl * cols, size_t{0}, rl * cols);
      return;
    }
    case Split::kColumns: {
      const size_t kl = cols / tp;
      for (size_t i = 0; i < rows; ++i) fn(i * cols + r * kl, i * kl, kl);
      return;
    }
  }
}

void copy_shares(const ModelConfig& m, int tp, int tp_rank, float* full, float* local, bool to_local) {
  const TensorTable whole = gpt_param_table(m), mine = gpt_param_table(m, tp);
  for (size_t i = 0; i < whole.size(); ++i) {
    const TensorInfo& w = whole[i];
    const TensorInfo& l = mine[i];
    for_each_run(split_of(w.name), w, tp, tp_rank, [&](size_t wo, size_t lo, size_t n) {
      float* f = full + w.offset + wo;
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
