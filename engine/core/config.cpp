#include "engine/core/config.h"

#include <cmath>
#include <cstdio>
#include <fstream>
#include <functional>
#include <sstream>

#include "engine/core/input_excerpt.h"
#include "engine/core/toml.h"

namespace gantry {
namespace {

enum class FieldKind { kInt, kU64, kDouble, kString, kBool };

// One row per config key: where it lives, what it may hold, and whether a checkpoint must agree on it.
struct Field {
  const char* key;
  FieldKind kind;
  double min;
  double max;  // strings: their longest length in bytes, 0 = any (a path or a file name has the OS's)
  bool must_match_on_resume;
  std::function<void*(Config&)> at;
  std::vector<std::string> choices = {};  // strings only; empty = any
};

template <class T>
const T& field_ref(const Field& f, const Config& c) {
  return *static_cast<const T*>(f.at(const_cast<Config&>(c)));
}

// Linux's PATH_MAX and NAME_MAX: a longer path or name could never be opened, and every message that
// names the data would quote it.
constexpr double kPathMaxBytes = 4096;
constexpr double kNameMaxBytes = 255;

const std::vector<Field>& fields() {
  constexpr double kBig = 9223372036854775807.0;  // TOML integers are int64
  static const std::vector<Field> table = {
      {"model.n_layer", FieldKind::kInt, 1, 1024, true, [](Config& c) -> void* { return &c.model.n_layer; }},
      {"model.n_head", FieldKind::kInt, 1, 1024, true, [](Config& c) -> void* { return &c.model.n_head; }},
      {"model.n_embd", FieldKind::kInt, 1, 65536, true, [](Config& c) -> void* { return &c.model.n_embd; }},
      {"model.vocab_size", FieldKind::kInt, 2, 1 << 24, true,
       [](Config& c) -> void* { return &c.model.vocab_size; }},
      {"model.seq_len", FieldKind::kInt, 1, 1 << 20, true,
       [](Config& c) -> void* { return &c.model.seq_len; }},
      {"optim.lr", FieldKind::kDouble, 0, 10, true, [](Config& c) -> void* { return &c.optim.lr; }},
      {"optim.min_lr", FieldKind::kDouble, 0, 10, true, [](Config& c) -> void* { return &c.optim.min_lr; }},
      {"optim.warmup_steps", FieldKind::kInt, 0, 1e9, true,
       [](Config& c) -> void* { return &c.optim.warmup_steps; }},
      {"optim.weight_decay", FieldKind::kDouble, 0, 10, true,
       [](Config& c) -> void* { return &c.optim.weight_decay; }},
      {"optim.beta1", FieldKind::kDouble, 0, 0.999999, true,
       [](Config& c) -> void* { return &c.optim.beta1; }},
      {"optim.beta2", FieldKind::kDouble, 0, 0.999999, true,
       [](Config& c) -> void* { return &c.optim.beta2; }},
      {"optim.eps", FieldKind::kDouble, 1e-30, 1, true, [](Config& c) -> void* { return &c.optim.eps; }},
      {"optim.grad_clip", FieldKind::kDouble, 0, 1e9, true,
       [](Config& c) -> void* { return &c.optim.grad_clip; }},
      {"train.seed", FieldKind::kU64, 0, kBig, true, [](Config& c) -> void* { return &c.train.seed; }},
      {"train.global_batch", FieldKind::kInt, 1, 1 << 24, true,
       [](Config& c) -> void* { return &c.train.global_batch; }},
      {"train.micro_batch", FieldKind::kInt, 1, 1 << 20, false,
       [](Config& c) -> void* { return &c.train.micro_batch; }},
      {"train.max_steps", FieldKind::kInt, 1, 1e9, false,
       [](Config& c) -> void* { return &c.train.max_steps; }},
      {"train.checkpoint_every", FieldKind::kInt, 0, 1e9, false,
       [](Config& c) -> void* { return &c.train.checkpoint_every; }},
      {"train.keep_checkpoints", FieldKind::kInt, 1, 1e6, false,
       [](Config& c) -> void* { return &c.train.keep_checkpoints; }},
      {"train.checkpoint_async", FieldKind::kBool, 0, 0, false,
       [](Config& c) -> void* { return &c.train.checkpoint_async; }},
      {"train.checkpoint_defer_when_busy", FieldKind::kBool, 0, 0, false,
       [](Config& c) -> void* { return &c.train.checkpoint_defer_when_busy; }},
      {"train.val_every", FieldKind::kInt, 0, 1e9, false,
       [](Config& c) -> void* { return &c.train.val_every; }},
      {"train.val_batches", FieldKind::kInt, 1, 1e6, false,
       [](Config& c) -> void* { return &c.train.val_batches; }},
      {"train.threads", FieldKind::kInt, 0, 4096, false, [](Config& c) -> void* { return &c.train.threads; }},
      {"train.backend",
       FieldKind::kString,
       0,
       0,
       false,
       [](Config& c) -> void* { return &c.train.backend; },
       {"cpu", "cuda"}},
      {"train.cuda_graphs", FieldKind::kBool, 0, 0, false,
       [](Config& c) -> void* { return &c.train.cuda_graphs; }},
      {"train.deterministic", FieldKind::kBool, 0, 0, false,
       [](Config& c) -> void* { return &c.train.deterministic; }},
      {"train.dp_bucket_mb", FieldKind::kDouble, 1e-6, 1e6, false,
       [](Config& c) -> void* { return &c.train.dp_bucket_mb; }},
      {"train.collective_timeout_s", FieldKind::kDouble, kCollectiveTimeoutMinS, kCollectiveTimeoutMaxS,
       false, [](Config& c) -> void* { return &c.train.collective_timeout_s; }},
      {"train.peak_tflops", FieldKind::kDouble, 0, 100000, false,
       [](Config& c) -> void* { return &c.train.peak_tflops; }},
      {"train.guard_spike_factor", FieldKind::kDouble, 0, 1e6, false,
       [](Config& c) -> void* { return &c.train.guard_spike_factor; }},
      {"train.guard_window", FieldKind::kInt, 1, 100000, false,
       [](Config& c) -> void* { return &c.train.guard_window; }},
      {"train.guard_max_skips_in_row", FieldKind::kInt, 1, 1e6, false,
       [](Config& c) -> void* { return &c.train.guard_max_skips_in_row; }},
      {"train.guard_on_streak",
       FieldKind::kString,
       0,
       0,
       false,
       [](Config& c) -> void* { return &c.train.guard_on_streak; },
       {"rollback", "stop"}},
      {"train.guard_max_rollbacks", FieldKind::kInt, 1, 1e6, false,
       [](Config& c) -> void* { return &c.train.guard_max_rollbacks; }},
      {"train.sdc_check_every", FieldKind::kInt, 0, 1e9, false,
       [](Config& c) -> void* { return &c.train.sdc_check_every; }},
      {"train.memory_copy_every", FieldKind::kInt, 0, 1e9, false,
       [](Config& c) -> void* { return &c.train.memory_copy_every; }},
      {"train.memory_copy_async", FieldKind::kBool, 0, 0, false,
       [](Config& c) -> void* { return &c.train.memory_copy_async; }},
      {"train.data_cursor_log", FieldKind::kBool, 0, 0, false,
       [](Config& c) -> void* { return &c.train.data_cursor_log; }},
      {"train.pp_schedule",
       FieldKind::kString,
       0,
       0,
       false,
       [](Config& c) -> void* { return &c.train.pp_schedule; },
       {"gpipe", "1f1b", "interleaved", "zbh1"}},
      {"train.vp", FieldKind::kInt, 1, 4096, false, [](Config& c) -> void* { return &c.train.vp; }},
      {"train.sequence_parallel", FieldKind::kBool, 0, 0, false,
       [](Config& c) -> void* { return &c.train.sequence_parallel; }},
      {"data.kind",
       FieldKind::kString,
       0,
       0,
       true,
       [](Config& c) -> void* { return &c.data.kind; },
       {"synthetic", "shards"}},
      {"data.dir", FieldKind::kString, 0, kPathMaxBytes, false,
       [](Config& c) -> void* { return &c.data.dir; }},
      {"data.train_prefix", FieldKind::kString, 0, kNameMaxBytes, false,
       [](Config& c) -> void* { return &c.data.train_prefix; }},
      {"data.val_prefix", FieldKind::kString, 0, kNameMaxBytes, false,
       [](Config& c) -> void* { return &c.data.val_prefix; }},
      {"data.synthetic_branching", FieldKind::kInt, 1, 1 << 20, true,
       [](Config& c) -> void* { return &c.data.synthetic_branching; }},
      {"data.synthetic_seed", FieldKind::kU64, 0, kBig, true,
       [](Config& c) -> void* { return &c.data.synthetic_seed; }},
      {"data.synthetic_train_tokens", FieldKind::kU64, 2, kBig, true,
       [](Config& c) -> void* { return &c.data.synthetic_train_tokens; }},
      {"data.synthetic_val_tokens", FieldKind::kU64, 2, kBig, true,
       [](Config& c) -> void* { return &c.data.synthetic_val_tokens; }},
  };
  return table;
}

std::string range_text(const Field& f) {
  char buf[128];
  if (f.kind == FieldKind::kBool) {
    return "true or false";
  } else if (f.kind == FieldKind::kDouble) {
    std::snprintf(buf, sizeof buf, "a number in [%g, %g]", f.min, f.max);
  } else {
    std::snprintf(buf, sizeof buf, "an integer in [%.0f, %.0f]", f.min, f.max);
  }
  return buf;
}

std::string value_text(const Field& f, const Config& c) {
  char buf[64];
  switch (f.kind) {
    case FieldKind::kInt:
      return std::to_string(field_ref<int>(f, c));
    case FieldKind::kU64:
      return std::to_string(field_ref<uint64_t>(f, c));
    case FieldKind::kDouble:
      // %.17g round-trips every double exactly, so a dumped config parses back to the same bits.
      std::snprintf(buf, sizeof buf, "%.17g", field_ref<double>(f, c));
      if (std::string(buf).find_first_of(".eEn") == std::string::npos) return std::string(buf) + ".0";
      return buf;
    case FieldKind::kBool:
      return field_ref<bool>(f, c) ? "true" : "false";
    case FieldKind::kString: {
      std::string out = "\"";
      // The TOML subset's escapes: a raw newline would end the line (and the string) in the dump.
      for (char ch : field_ref<std::string>(f, c)) {
        if (ch == '\n') {
          out += "\\n";
          continue;
        }
        if (ch == '"' || ch == '\\') out += '\\';
        out += ch;
      }
      return out + "\"";
    }
  }
  return "";
}

// The sections a run cannot do without, and what each must say. [optim] is not among them: AdamW's usual
// settings are a sound default, while a default model or data set would train something the user never
// asked for without saying so.
struct RequiredSection {
  const char* name;
  const char* holds;
};
constexpr RequiredSection kRequiredSections[] = {
    {"model", "the network's shape (n_layer, n_head, n_embd, vocab_size, seq_len)"},
    {"train", "the run's length and batch (max_steps, global_batch, micro_batch, ...)"},
    {"data", "what to train on (kind = \"synthetic\", or kind = \"shards\" with dir)"},
};

std::string known_keys_of(const std::string& section) {
  std::string out;
  for (const Field& f : fields()) {
    std::string key = f.key;
    if (key.rfind(section + ".", 0) == 0) out += (out.empty() ? "" : ", ") + key;
  }
  return out;
}

Status set_field(const Field& f, const TomlValue& v, Config& c, const std::string& where) {
  const std::string head = where + ": " + f.key + ": ";
  switch (f.kind) {
    case FieldKind::kInt:
    case FieldKind::kU64: {
      if (v.kind != TomlValue::Kind::kInt) {
        return Status::error(head + "expected " + range_text(f) + ", got a " + toml_kind_name(v.kind));
      }
      if (static_cast<double>(v.i) < f.min || static_cast<double>(v.i) > f.max) {
        return Status::error(head + std::to_string(v.i) + " is out of range: allowed " + range_text(f));
      }
      if (f.kind == FieldKind::kInt) {
        *static_cast<int*>(f.at(c)) = static_cast<int>(v.i);
      } else {
        *static_cast<uint64_t*>(f.at(c)) = static_cast<uint64_t>(v.i);
      }
      return {};
    }
    case FieldKind::kDouble: {
      double d;
      if (v.kind == TomlValue::Kind::kFloat) {
        d = v.f;
      } else if (v.kind == TomlValue::Kind::kInt) {
        d = static_cast<double>(v.i);
      } else {
        return Status::error(head + "expected " + range_text(f) + ", got a " + toml_kind_name(v.kind));
      }
      if (!std::isfinite(d) || d < f.min || d > f.max) {
        char buf[64];
        std::snprintf(buf, sizeof buf, "%g", d);
        return Status::error(head + buf + " is out of range: allowed " + range_text(f));
      }
      *static_cast<double*>(f.at(c)) = d;
      return {};
    }
    case FieldKind::kBool: {
      if (v.kind != TomlValue::Kind::kBool) {
        return Status::error(head + "expected true or false, got a " + toml_kind_name(v.kind));
      }
      *static_cast<bool*>(f.at(c)) = v.b;
      return {};
    }
    case FieldKind::kString: {
      if (v.kind != TomlValue::Kind::kString) {
        return Status::error(head + "expected a string, got a " + toml_kind_name(v.kind));
      }
      if (f.max > 0 && static_cast<double>(v.s.size()) > f.max) {
        char limit[32];
        std::snprintf(limit, sizeof limit, "%.0f", f.max);
        return Status::error(head + "\"" + input_excerpt(v.s) + "\" is too long: allowed at most " + limit +
                             " bytes");
      }
      if (!f.choices.empty()) {
        bool found = false;
        std::string allowed;
        for (const std::string& ch : f.choices) {
          found = found || ch == v.s;
          allowed += (allowed.empty() ? "\"" : ", \"") + ch + "\"";
        }
        if (!found) {
          return Status::error(head + "\"" + input_excerpt(v.s) + "\" is not allowed: use one of " + allowed);
        }
      }
      *static_cast<std::string*>(f.at(c)) = v.s;
      return {};
    }
  }
  return {};
}

}  // namespace

Status config_validate(const Config& c) {
  const ModelConfig& m = c.model;
  const TrainConfig& t = c.train;
  if (m.n_embd % m.n_head != 0) {
    return Status::error("model.n_head = " + std::to_string(m.n_head) +
                         " must divide model.n_embd = " + std::to_string(m.n_embd));
  }
  if (t.global_batch % t.micro_batch != 0) {
    return Status::error("train.micro_batch = " + std::to_string(t.micro_batch) +
                         " must divide train.global_batch = " + std::to_string(t.global_batch));
  }
  if (c.optim.min_lr > c.optim.lr) {
    return Status::error("optim.min_lr must be <= optim.lr (the cosine decays from lr down to min_lr)");
  }
  if (t.guard_spike_factor > 0 && t.guard_spike_factor <= 1) {
    char buf[48];
    std::snprintf(buf, sizeof buf, "%g", t.guard_spike_factor);
    return Status::error(
        std::string("train.guard_spike_factor = ") + buf +
        " must be 0 (no spike check) or above 1, at most 1e6 (a factor of the recent median loss)");
  }
  if (t.guard_on_streak != "rollback" && t.guard_on_streak != "stop") {
    return Status::error("train.guard_on_streak = \"" + t.guard_on_streak +
                         "\" is not allowed: use one of \"rollback\", \"stop\"");
  }
  if (c.data.kind == "shards" && c.data.dir.empty()) {
    return Status::error("data.dir: required when data.kind = \"shards\" (a folder of .bin token shards)");
  }
  if (c.data.kind == "synthetic" && c.data.synthetic_branching > m.vocab_size) {
    return Status::error("data.synthetic_branching = " + std::to_string(c.data.synthetic_branching) +
                         " must be <= model.vocab_size = " + std::to_string(m.vocab_size));
  }
  return {};
}

Result<Config> config_parse(const std::string& toml_text, const std::string& source_name) {
  Result<TomlDocument> doc = toml_parse(toml_text, source_name);
  if (!doc.ok()) return doc.status();
  Config c;
  for (const auto& [key, value] : doc->entries) {
    const std::string where = source_name + ":" + std::to_string(value.line);
    const Field* field = nullptr;
    for (const Field& f : fields()) {
      if (key == f.key) field = &f;
    }
    if (field == nullptr) {
      const std::string section = key.substr(0, key.find('.'));
      std::string known = known_keys_of(section);
      if (known.empty()) {
        return Status::error(where + ": unknown key '" + input_excerpt(key) +
                             "': sections are [model], [optim], [train] and [data]");
      }
      return Status::error(where + ": unknown key '" + input_excerpt(key) + "': known keys in [" + section +
                           "] are " + known);
    }
    Status s = set_field(*field, value, c, where);
    if (!s.ok()) return s;
  }
  Status s = config_validate(c);
  if (!s.ok()) return Status::error(source_name + ": " + s.message());
  for (const RequiredSection& r : kRequiredSections) {
    bool present = false;
    for (const std::string& t : doc->tables)
      present = present || t == r.name || t.rfind(std::string(r.name) + ".", 0) == 0;
    if (!present) {
      return Status::error(source_name + ": no [" + r.name + "] section: a run needs one, holding " +
                           r.holds + " (assets/configs/tiny.toml has an example)");
    }
  }
  return c;
}

Result<Config> config_load(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return Status::error("cannot read config file '" + path + "': no such file or not readable");
  std::stringstream ss;
  ss << in.rdbuf();
  return config_parse(ss.str(), path);
}

std::string config_dump(const Config& c) {
  std::string out;
  std::string section;
  for (const Field& f : fields()) {
    std::string key = f.key;
    std::string sec = key.substr(0, key.find('.'));
    if (sec != section) {
      out += (section.empty() ? "[" : "\n[") + sec + "]\n";
      section = sec;
    }
    out += key.substr(key.find('.') + 1) + " = " + value_text(f, c) + "\n";
  }
  return out;
}

std::vector<std::string> config_incompatibilities(const Config& saved, const Config& current) {
  std::vector<std::string> out;
  for (const Field& f : fields()) {
    if (!f.must_match_on_resume) continue;
    std::string a = value_text(f, saved);
    std::string b = value_text(f, current);
    if (a != b) out.push_back(std::string(f.key) + ": checkpoint has " + a + ", config has " + b);
  }
  return out;
}

}  // namespace gantry
