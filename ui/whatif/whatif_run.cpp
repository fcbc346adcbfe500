#include "ui/whatif/whatif_run.h"

#include <algorithm>
#include <cctype>
#include <charconv>
#include <string>

namespace gantry::whatif {

namespace {

using nlohmann::json;

// One "key=value" or JSON member of the layout into the run; unknown keys are skipped (see the header).
Status set_layout_field(WhatIfRun& r, const std::string& key, long long v) {
  int* field = key == "dp"     ? &r.dp
               : key == "tp"   ? &r.tp
               : key == "pp"   ? &r.pp
               : key == "vp"   ? &r.vp
               : key == "zero" ? &r.zero
                               : nullptr;
  if (field == nullptr) return {};
  const long long lo = key == "zero" ? 0 : 1, hi = key == "zero" ? 3 : (1 << 20);
  if (v < lo || v > hi) {
    return Status::error("layout." + key + " = " + std::to_string(v) + ": allowed " + std::to_string(lo) +
                         ".." + std::to_string(hi));
  }
  *field = static_cast<int>(v);
  return {};
}

Status parse_layout_json(WhatIfRun& r, std::string_view text) {
  const json j = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object())
    return Status::error("layout: not a JSON object: " + std::string(text));
  for (const auto& [key, value] : j.items()) {
    if (key != "dp" && key != "tp" && key != "pp" && key != "vp" && key != "zero") continue;
    if (!value.is_number_integer())
      return Status::error("layout." + key + ": expected an integer, got " + value.dump());
    if (Status s = set_layout_field(r, key, value.get<long long>()); !s.ok()) return s;
  }
  return {};
}

// "dp=4 tp=2 pp=1 zero=1" (storage's RunInfo::layout, the coordinator's event wording).
Status parse_layout_text(WhatIfRun& r, std::string_view text) {
  size_t i = 0;
  while (i < text.size()) {
    while (i < text.size() && (std::isspace(static_cast<unsigned char>(text[i])) || text[i] == ',')) ++i;
    if (i == text.size()) break;
    size_t end = i;
    while (end < text.size() && !std::isspace(static_cast<unsigned char>(text[end])) && text[end] != ',')
      ++end;
    const std::string_view word = text.substr(i, end - i);
    i = end;
    const size_t eq = word.find('=');
    if (eq == std::string_view::npos) {
      return Status::error("layout: '" + std::string(word) +
                           "' is not key=value (expected e.g. \"dp=4 zero=1\")");
    }
    const std::string key(word.substr(0, eq));
    const std::string_view value = word.substr(eq + 1);
    long long v = 0;
    const auto [p, ec] = std::from_chars(value.data(), value.data() + value.size(), v);
    if (key != "dp" && key != "tp" && key != "pp" && key != "vp" && key != "zero") continue;
    if (ec != std::errc() || p != value.data() + value.size()) {
      return Status::error("layout." + key + ": '" + std::string(value) + "' is not an integer");
    }
    if (Status s = set_layout_field(r, key, v); !s.ok()) return s;
  }
  return {};
}

std::string itos(long long v) {
  return std::to_string(v);
}

// An integer member of `obj` in [lo, hi]; the error names "where.key".
Status read_int(const json& obj, const char* where, const char* key, int lo, int hi, int* out) {
  const auto it = obj.find(key);
  if (it == obj.end() || !it->is_number_integer()) {
    return Status::error(std::string(where) + "." + key + ": expected an integer, got " +
                         (it == obj.end() ? std::string("nothing") : it->dump()));
  }
  const long long v = it->get<long long>();
  if (v < lo || v > hi) {
    return Status::error(std::string(where) + "." + key + " = " + std::to_string(v) + ": allowed " +
                         std::to_string(lo) + ".." + std::to_string(hi));
  }
  *out = static_cast<int>(v);
  return {};
}

}  // namespace

Result<WhatIfRun> whatif_run_parse(const json& run) {
  if (!run.is_object()) return Status::error("run: expected the JSON object of GET /v1/runs/{id}");
  const auto id = run.find("id");
  if (id == run.end() || !id->is_number_integer()) return Status::error("run: no integer \"id\"");
  const auto model = run.find("model");
  const auto batch = run.find("batch");
  if (model == run.end() || !model->is_object() || batch == run.end() || !batch->is_object()) {
    return Status::error(
        "run " + id->dump() +
        ": no \"model\" and \"batch\" objects (GET /v1/runs/{id} has them; the list does not)");
  }
  WhatIfRun r;
  r.id = id->get<int64_t>();
  r.name = run.value("name", std::string());
  r.state = run.value("state", std::string());
  r.backend = run.value("backend", std::string());
  r.pp_schedule =
      run.value("pp_schedule", std::string("1f1b"));  // absent from older coordinators: the default
  // Gantry's model is GPT-2 shaped: PlanModel's defaults (learned positions, LayerNorm, biases, GELU with
  // ffn = 4d, tied embeddings, no dropout) are that shape; only the dimensions come from the run. The
  // coordinator validated them with the engine's config rules at submit; these bounds only keep a planner
  // from being asked about nonsense.
  r.model.name = r.name.empty() ? "run " + itos(r.id) : r.name;
  constexpr int kBig = 1 << 24;
  for (const Status& s : {read_int(*model, "model", "n_layer", 1, kBig, &r.model.layers),
                          read_int(*model, "model", "n_embd", 1, kBig, &r.model.hidden),
                          read_int(*model, "model", "n_head", 1, kBig, &r.model.heads),
                          read_int(*model, "model", "vocab_size", 1, kBig, &r.model.vocab),
                          read_int(*model, "model", "seq_len", 1, kBig, &r.model.seq),
                          read_int(*batch, "batch", "global_batch", 1, kBig, &r.global_batch),
                          read_int(*batch, "batch", "micro_batch", 1, kBig, &r.micro_batch)}) {
    if (!s.ok()) return Status::error("run " + itos(r.id) + ": " + s.message());
  }
  const auto layout = run.find("layout");
  if (layout != run.end() && layout->is_object()) {
    if (Status s = parse_layout_json(r, layout->dump()); !s.ok()) return s;
  } else if (layout != run.end() && layout->is_string()) {
    if (Status s = parse_layout_text(r, layout->get<std::string>()); !s.ok()) return s;
  }
  return r;
}

void whatif_form_from_run(WhatIfForm& f, const WhatIfRun& run) {
  f.custom_model = true;
  f.model = run.model;
  f.global_batch = run.global_batch;
  f.gpus = run.tp * run.pp * run.dp;
  f.layout = PlanLayout{};
  f.layout.tp = run.tp;
  f.layout.pp = run.pp;
  f.layout.vp = run.vp;
  f.layout.dp = 0;  // derived from the GPUs, so changing their number alone asks "what if on N GPUs"
  f.layout.zero = run.zero;
  f.layout.recompute = Recompute::kNone;
  f.layout.sequence_parallel = run.tp > 1;
  // The engine runs micro-batches of at most train.micro_batch sequences out of each rank's share
  // (engine/core/train.cpp): with a share smaller than that, the share is the micro-batch.
  f.layout.micro_batch = std::max(1, std::min(run.micro_batch, run.global_batch / std::max(1, run.dp)));
}

std::string whatif_apply_blocker(const Plan& plan, const WhatIfRun* run, int form_global_batch) {
  if (run == nullptr) return "no run is loaded: load the current run to resume it on a planned layout";
  const PlanLayout& l = plan.layout;
  // The batch first: it is the form's, not the row's, and every row shares it.
  if (form_global_batch != run->global_batch || plan.global_batch != run->global_batch) {
    return "planned for a global batch of " + itos(plan.global_batch) +
           " sequences; the run's train.global_batch is " + itos(run->global_batch) +
           ", which resume-from keeps";
  }
  if (plan.params != plan_param_counts(run->model).total) {
    return "planned for another model (" + itos(static_cast<long long>(plan.params)) +
           " parameters) than the run's (" +
           itos(static_cast<long long>(plan_param_counts(run->model).total)) + "): load the run again";
  }
  if (!plan.fits) return "this layout does not fit in the GPUs' memory";
  // Checkpoints reshard across every axis (their tensors carry global coordinates, a stage's included), so
  // a move into, out of or between pipelines goes through one like any other.
  // A pipeline on either backend (pipeline_check): every schedule (interleaved's vp is checked below), tp
  // beside it and ZeRO 0-3 on its dp axis; both engine profiles price interleaved stages' memory too.
  if (l.cp != 1) return "the engine has no context parallelism (cp = 1)";
  // Virtual stages run under the interleaved schedule only, and it needs them; the schedule is the run's
  // config (train.pp_schedule), which resume-from keeps.
  const bool interleaved = run->pp_schedule == "interleaved";
  if (l.vp != 1 && !interleaved) {
    return "vp = " + itos(l.vp) +
           ": virtual stages run only under train.pp_schedule = \"interleaved\", and the run's is \"" +
           run->pp_schedule + "\" (resume-from keeps it)";
  }
  if (l.pp != 1 && l.vp == 1 && interleaved) {
    return "pp = " + itos(l.pp) +
           " with vp = 1: the run's train.pp_schedule = \"interleaved\" needs vp > 1 (resume-from keeps it)";
  }
  if (l.recompute != Recompute::kNone) return "the engine keeps every activation: recompute must be none";
  if (l.hsdp != 0) return "the engine shards ZeRO over all of dp: hsdp must be 0";
  if (run->global_batch % l.dp != 0) {
    return "dp = " + itos(l.dp) +
           " does not divide the run's train.global_batch = " + itos(run->global_batch);
  }
  const int share = run->global_batch / l.dp;
  const int engine_micro = std::min(run->micro_batch, share);
  if (share % engine_micro != 0) {
    return "on dp = " + itos(l.dp) + " each rank gets " + itos(share) +
           " sequences, which the run's train.micro_batch = " + itos(run->micro_batch) + " does not divide";
  }
  if (l.micro_batch != engine_micro) {
    return "micro-batch " + itos(l.micro_batch) + ": on dp = " + itos(l.dp) +
           " the engine runs micro-batches of " + itos(engine_micro) +
           " (train.micro_batch = " + itos(run->micro_batch) + ", which resume-from keeps)";
  }
  // A pipeline's micro-batches are the step's gradient-accumulation ones (pipeline_check's rules).
  const int micro_batches = share / engine_micro;
  if (l.pp != 1 && interleaved && micro_batches % l.pp != 0) {
    return "pp = " + itos(l.pp) +
           ": the interleaved schedule needs micro-batches per step a multiple of pp, but dp = " +
           itos(l.dp) + " gives " + itos(micro_batches);
  }
  if (l.pp != 1 && (run->pp_schedule == "1f1b" || run->pp_schedule == "zbh1") && micro_batches < l.pp) {
    return "pp = " + itos(l.pp) + ": train.pp_schedule = \"" + run->pp_schedule + "\" needs at least " +
           itos(l.pp) + " micro-batches per step to fill the pipe, but dp = " + itos(l.dp) + " gives " +
           itos(micro_batches);
  }
  return "";
}

WhatIfApply whatif_apply_of(const Plan& plan, const WhatIfRun& run) {
  return WhatIfApply{.run_id = run.id,
                     .dp = plan.layout.dp,
                     .zero = plan.layout.zero,
                     .tp = plan.layout.tp,
                     .pp = plan.layout.pp,
                     .vp = plan.layout.vp};
}

json WhatIfApply::layout() const {
  return {{"dp", dp}, {"tp", tp}, {"pp", pp}, {"vp", vp}, {"zero", zero}};
}

json WhatIfApply::body() const {
  return {{"checkpoint", checkpoint}, {"layout", layout()}};
}

std::string WhatIfApply::text() const {
  return "dp=" + itos(dp) + " tp=" + itos(tp) + " pp=" + itos(pp) +
         (vp != 1 ? " vp=" + itos(vp) : std::string()) + " zero=" + itos(zero);
}

}  // namespace gantry::whatif
