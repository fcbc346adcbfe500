#include "engine/core/gpt.h"

#include <cmath>
#include <string>

#include "engine/core/rng.h"

namespace gantry {

TensorTable gpt_param_table(const ModelConfig& m, int tp) {
  const int64_t C = m.n_embd, V = m.vocab_size, T = m.seq_len;
  const int64_t Cl = C / tp, Hl = 4 * C / tp;  // this tp rank's attention and MLP widths
  TensorTable t;
  t.add("wte", {V / tp, C}, true, -1);  // tp: this rank's vocabulary rows (vocab-parallel)
  t.add("wpe", {T, C}, true, -1);
  for (int l = 0; l < m.n_layer; ++l) {
    const std::string p = "h." + std::to_string(l) + ".";
    t.add(p + "ln1.weight", {C}, false, l);
    t.add(p + "ln1.bias", {C}, false, l);
    t.add(p + "attn.qkv.weight", {3 * Cl, C}, true, l);
    t.add(p + "attn.qkv.bias", {3 * Cl}, false, l);
    t.add(p + "attn.proj.weight", {C, Cl}, true, l);
    t.add(p + "attn.proj.bias", {C}, false, l);
    t.add(p + "ln2.weight", {C}, false, l);
    t.add(p + "ln2.bias", {C}, false, l);
    t.add(p + "mlp.fc.weight", {Hl, C}, true, l);
    t.add(p + "mlp.fc.bias", {Hl}, false, l);
    t.add(p + "mlp.proj.weight", {C, Hl}, true, l);
    t.add(p + "mlp.proj.bias", {C}, false, l);
  }
  t.add("lnf.weight", {C}, false, -1);
  t.add("lnf.bias", {C}, false, -1);
  return t;
}

void gpt_init_params(const ModelConfig& m, const TensorTable& table, uint64_t seed, float* params) {
  Rng rng{seed};
  const double residual_std = 0.02 / std::sqrt(2.0 * m.n_layer);
  for (const TensorInfo& t : table.tensors()) {
    float* p = params + t.offset;
    const bool is_norm_weight =
        t.name.ends_with("ln1.weight") || t.name.ends_with("ln2.weight") || t.name == "lnf.weight";
    if (is_norm_weight) {
      for (size_t i = 0; i < t.numel; ++i) p[i] = 1.0f;
    } else if (t.shape.size() == 1) {
      for (size_t i = 0; i < t.numel; ++i) p[i] = 0.0f;
    } else {
      const bool residual = t.name.ends_with("attn.proj.weight") || t.name.ends_with("mlp.proj.weight");
      const double std = residual ? residual_std : 0.02;
      for (size_t i = 0; i < t.numel; ++i) p[i] = static_cast<float>(std * rng.normal());
    }
  }
}

GptTensors gpt_tensors(const ModelConfig& m, const TensorTable& table, float* base) {
  return gpt_tensors(m, table, [base](const TensorInfo& t) { return base + t.offset; });
}

GptTensors gpt_tensors(const ModelConfig& m, const TensorTable& table,
                       const std::function<float*(const TensorInfo&)>& where) {
  GptTensors g;
  size_t i = 0;
  auto next = [&]() { return where(table[i++]); };
  g.wte = next();
  g.wpe = next();
  g.blocks.resize(m.n_layer);
  for (GptBlock& b : g.blocks) {
    b.ln1_w = next();
    b.ln1_b = next();
    b.qkv_w = next();
    b.qkv_b = next();
    b.proj_w = next();
    b.proj_b = next();
    b.ln2_w = next();
    b.ln2_b = next();
    b.fc_w = next();
    b.fc_b = next();
    b.fcproj_w = next();
    b.fcproj_b = next();
  }
  g.lnf_w = next();
  g.lnf_b = next();
  return g;
}

}  // namespace gantry
