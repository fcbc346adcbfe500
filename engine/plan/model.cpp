#include "engine/plan/model.h"

#include <array>
#include <string>

namespace gantry {

namespace {

std::string field_error(const std::string& field, long long value, const std::string& allowed) {
  return "model." + field + " = " + std::to_string(value) + ": " + allowed;
}

PlanModel gpt2(std::string name, int layers, int hidden, int heads) {
  PlanModel m;
  m.name = std::move(name);
  m.layers = layers;
  m.hidden = hidden;
  m.heads = heads;
  m.vocab = 50304;  // GPT-2's 50,257 padded to a multiple of 128, as llm.c and Gantry's configs do
  m.seq = 1024;
  return m;
}

PlanModel llama3(std::string name, int layers, int hidden, int heads, int ffn) {
  // Llama 3 (Dubey et al. 2024, "The Llama 3 Herd of Models", Table 3): 8 KV heads, SwiGLU, RMSNorm,
  // RoPE, no biases, untied output head, vocabulary 128,256, pre-training sequences of 8,192 tokens.
  PlanModel m;
  m.name = std::move(name);
  m.layers = layers;
  m.hidden = hidden;
  m.heads = heads;
  m.kv_heads = 8;
  m.ffn = ffn;
  m.ffn_kind = FfnKind::kSwiGlu;
  m.vocab = 128256;
  m.seq = 8192;
  m.tied_embeddings = false;
  m.positions = PositionKind::kRotary;
  m.norm = NormKind::kRmsNorm;
  m.biases = false;
  return m;
}

std::vector<PlanModel> presets() {
  PlanModel gpt3;
  // GPT-3 175B as Megatron trains it (Narayanan et al. 2021 §5.1 and Table 2; Korthikanti et al. 2022
  // Table 3): 96 layers, hidden 12,288, 96 heads, vocabulary 51,200, sequence 2,048, dropout on.
  gpt3.name = "gpt3-175b";
  gpt3.layers = 96;
  gpt3.hidden = 12288;
  gpt3.heads = 96;
  gpt3.vocab = 51200;
  gpt3.seq = 2048;
  gpt3.dropout = true;
  return {
      gpt2("gpt2-124m", 12, 768, 12),
      gpt2("gpt2-350m", 24, 1024, 16),
      gpt3,
      llama3("llama3-8b", 32, 4096, 32, 14336),
      llama3("llama3-70b", 80, 8192, 64, 28672),
      llama3("llama3-405b", 126, 16384, 128, 53248),
  };
}

}  // namespace

int plan_model_kv_heads(const PlanModel& m) {
  return m.kv_heads > 0 ? m.kv_heads : m.heads;
}
int plan_model_ffn(const PlanModel& m) {
  return m.ffn > 0 ? m.ffn : 4 * m.hidden;
}
int64_t plan_model_kv_dim(const PlanModel& m) {
  return static_cast<int64_t>(plan_model_kv_heads(m)) * (m.hidden / m.heads);
}

const char* ffn_kind_name(FfnKind k) {
  return k == FfnKind::kGelu ? "gelu" : "swiglu";
}

Status plan_model_validate(const PlanModel& m) {
  if (m.layers < 1 || m.layers > 100000)
    return Status::error(field_error("layers", m.layers, "allowed 1..100000"));
  if (m.hidden < 1 || m.hidden > 1000000) {
    return Status::error(field_error("hidden", m.hidden, "allowed 1..1000000"));
  }
  if (m.heads < 1 || m.hidden % m.heads != 0) {
    return Status::error(
        field_error("heads", m.heads, "must be >= 1 and divide hidden (" + std::to_string(m.hidden) + ")"));
  }
  if (m.kv_heads < 0 || (m.kv_heads > 0 && m.heads % m.kv_heads != 0)) {
    return Status::error(field_error(
        "kv_heads", m.kv_heads, "must be 0 (= heads) or divide heads (" + std::to_string(m.heads) + ")"));
  }
  if (m.ffn < 0 || m.ffn > 10000000)
    return Status::error(field_error("ffn", m.ffn, "allowed 0 (= 4·hidden)..10000000"));
  if (m.vocab < 1 || m.vocab > 100000000)
    return Status::error(field_error("vocab", m.vocab, "allowed 1..100000000"));
  if (m.seq < 1 || m.seq > 100000000) return Status::error(field_error("seq", m.seq, "allowed 1..100000000"));
  return {};
}

Result<PlanModel> plan_model_preset(std::string_view name) {
  for (const PlanModel& m : presets()) {
    if (m.name == name) return m;
  }
  std::string allowed;
  for (const std::string& n : plan_model_preset_names()) allowed += (allowed.empty() ? "" : ", ") + n;
  return Status::error("unknown model preset '" + std::string(name) + "': allowed " + allowed);
}

const std::vector<std::string>& plan_model_preset_names() {
  static const std::vector<std::string> names = [] {
    std::vector<std::string> v;
    for (const PlanModel& m : presets()) v.push_back(m.name);
    return v;
  }();
  return names;
}

namespace {

// One block, split into what tensor parallelism divides and what every rank keeps whole.
struct LayerParams {
  uint64_t split = 0;       // divided by tp
  uint64_t replicated = 0;  // on every tp rank
};

LayerParams layer_params(const PlanModel& m) {
  const uint64_t d = static_cast<uint64_t>(m.hidden);
  const uint64_t kv = static_cast<uint64_t>(plan_model_kv_dim(m));
  const uint64_t f = static_cast<uint64_t>(plan_model_ffn(m));
  const uint64_t qkv_out = d + 2 * kv;
  const uint64_t norm = m.norm == NormKind::kLayerNorm ? 2 * d : d;
  LayerParams p;
  p.split += qkv_out * d;  // attn.qkv.weight (d + 2·kv, d), column-parallel
  p.split += d * d;        // attn.proj.weight (d, d), row-parallel
  if (m.ffn_kind == FfnKind::kGelu) {
    p.split += 2 * f * d;  // mlp.fc.weight (f, d), mlp.proj.weight (d, f)
  } else {
    p.split += 3 * f * d;  // gate and up (f, d), down (d, f)
  }
  p.replicated += 2 * norm;  // ln1, ln2
  if (m.biases) {
    p.split += qkv_out;                                   // qkv bias follows its columns
    p.split += m.ffn_kind == FfnKind::kGelu ? f : 2 * f;  // MLP-in bias(es)
    p.replicated += 2 * d;  // row-parallel output biases are added once, after the reduce
  }
  return p;
}

}  // namespace

ParamCounts plan_param_counts(const PlanModel& m) {
  ParamCounts c;
  const uint64_t d = static_cast<uint64_t>(m.hidden);
  const LayerParams lp = layer_params(m);
  c.embedding = static_cast<uint64_t>(m.vocab) * d;
  c.positions = m.positions == PositionKind::kLearned ? static_cast<uint64_t>(m.seq) * d : 0;
  c.per_layer = lp.split + lp.replicated;
  c.final_norm = m.norm == NormKind::kLayerNorm ? 2 * d : d;
  c.head = m.tied_embeddings ? 0 : c.embedding;
  c.total = c.embedding + c.positions + static_cast<uint64_t>(m.layers) * c.per_layer + c.final_norm + c.head;
  return c;
}

uint64_t plan_layer_params_per_rank(const PlanModel& m, int tp) {
  const LayerParams lp = layer_params(m);
  return lp.split / static_cast<uint64_t>(tp) + lp.replicated;
}

ForwardFlops plan_forward_flops_per_token(const PlanModel& m) {
  const double d = m.hidden, kv = static_cast<double>(plan_model_kv_dim(m)), f = plan_model_ffn(m);
  ForwardFlops fw;
  const double mlp_matrices = m.ffn_kind == FfnKind::kGelu ? 2 : 3;
  // 2 FLOPs per multiply-add: QKV (d → d + 2·kv), output projection (d → d), MLP.
  fw.layer_gemm = 2.0 * (d * (d + 2 * kv) + d * d + mlp_matrices * d * f);
  // QKᵀ and attention × V: each 2·s·d per token over the whole sequence (Megatron's count, no causal skip).
  fw.layer_attn = 4.0 * m.seq * d;
  fw.logits = 2.0 * d * m.vocab;
  return fw;
}

FlopsPerToken plan_flops_per_token(const PlanModel& m) {
  FlopsPerToken f;
  const ParamCounts n = plan_param_counts(m);
  f.gantry = 6.0 * static_cast<double>(n.total) + 6.0 * m.layers * static_cast<double>(m.hidden) * m.seq;
  const ForwardFlops fw = plan_forward_flops_per_token(m);
  f.megatron = 3.0 * (m.layers * (fw.layer_gemm + fw.layer_attn) + fw.logits);
  return f;
}

}  // namespace gantry
