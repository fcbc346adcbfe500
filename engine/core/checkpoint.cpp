#include "engine/core/checkpoint.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cinttypes>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>  // manifest.json

#include "engine/core/xxhash64.h"

namespace gantry {
namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

constexpr char kShardMagic[8] = {'G', 'A', 'N', 'T', 'R', 'Y', 'S', 'H'};
constexpr size_t kShardHeaderBytes = 64;
constexpr StateBuffer kSavedBuffers[] = {StateBuffer::kParams, StateBuffer::kAdamM, StateBuffer::kAdamV};

std::string step_dir_name(int64_t step) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "step_%08" PRId64, step);
  return buf;
}

std::string hex64(uint64_t v) {
  char buf[24];
  std::snprintf(buf, sizeof buf, "%016" PRIx64, v);
  return buf;
}

bool parse_hex64(const std::string& s, uint64_t* out) {
  if (s.empty() || s.size() > 16) return false;
  char* end = nullptr;
  *out = std::strtoull(s.c_str(), &end, 16);
  return end == s.c_str() + s.size();
}

Status write_all(int fd, const void* data, size_t bytes, const std::string& path) {
  const char* p = static_cast<const char*>(data);
  while (bytes > 0) {
    ssize_t n = ::write(fd, p, bytes);
    if (n < 0) return Status::error("cannot write '" + path + "': " + std::strerror(errno));
    p += n;
    bytes -= static_cast<size_t>(n);
  }
  return {};
}

// Writes a whole file and fsyncs it, so a commit that follows never points at data still in flight.
Status write_file_durable(const std::string& path, const std::string& contents) {
  int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  if (fd < 0) return Status::error("cannot create '" + path + "': " + std::strerror(errno));
  Status s = write_all(fd, contents.data(), contents.size(), path);
  if (s.ok() && ::fsync(fd) != 0) s = Status::error("cannot fsync '" + path + "': " + std::strerror(errno));
  ::close(fd);
  return s;
}

void fsync_dir(const std::string& dir) {
  int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY);
  if (fd >= 0) {
    ::fsync(fd);
    ::close(fd);
  }
}

bool is_committed(const fs::path& dir) { return fs::is_regular_file(dir / "manifest.json"); }

StateBuffer buffer_from_name(const std::string& name, bool* ok) {
  *ok = true;
  for (StateBuffer b : kSavedBuffers) {
    if (name == state_buffer_name(b)) return b;
  }
  *ok = false;
  return StateBuffer::kParams;
}

}  // namespace

std::vector<std::string> checkpoint_list(const std::string& root) {
  std::vector<std::string> out;
  std::error_code ec;
  if (!fs::is_directory(root, ec)) return out;
  for (const fs::directory_entry& e : fs::directory_iterator(root, ec)) {
    const std::string name = e.path().filename().string();
    if (e.is_directory() && name.rfind("step_", 0) == 0 && is_committed(e.path())) out.push_back(e.path().string());
  }
  std::sort(out.begin(), out.end());  // zero-padded step numbers sort in step order
  return out;
}

Result<std::string> checkpoint_latest(const std::string& root) {
  std::vector<std::string> all = checkpoint_list(root);
  if (all.empty()) {
    return Status::error("no committed checkpoint under '" + root +
                         "' (a checkpoint is a step_* directory holding manifest.json)");
  }
  return all.back();
}

Result<CheckpointWritten> checkpoint_write(const std::string& root, Backend& backend, const CheckpointMeta& meta,
                                           int keep) {
  const auto t0 = std::chrono::steady_clock::now();
  const fs::path dir = fs::path(root) / step_dir_name(meta.step);
  std::error_code ec;
  if (is_committed(dir)) {
    return CheckpointWritten{dir.string(), 0, 0.0};
  }
  fs::remove_all(dir, ec);  // an uncommitted leftover of a crashed writer
  fs::create_directories(dir, ec);
  if (ec) return Status::error("cannot create checkpoint directory '" + dir.string() + "': " + ec.message());

  const TensorTable& table = backend.params();
  const std::string shard_name = "shard_r00000.bin";
  const std::string shard_path = (dir / shard_name).string();
  int fd = ::open(shard_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  if (fd < 0) return Status::error("cannot create '" + shard_path + "': " + std::strerror(errno));

  unsigned char header[kShardHeaderBytes] = {};
  std::memcpy(header, kShardMagic, sizeof kShardMagic);
  const uint32_t version = kCheckpointFormatVersion, rank = 0;
  const uint64_t slice_count = table.size() * std::size(kSavedBuffers);
  std::memcpy(header + 8, &version, 4);
  std::memcpy(header + 12, &rank, 4);
  std::memcpy(header + 16, &slice_count, 8);
  Status s = write_all(fd, header, sizeof header, shard_path);

  json slices = json::array();
  uint64_t file_offset = kShardHeaderBytes;
  std::vector<float> staging;
  for (StateBuffer b : kSavedBuffers) {
    for (const TensorInfo& t : table.tensors()) {
      if (!s.ok()) break;
      staging.resize(t.numel);
      backend.read_state(b, t.offset, t.numel, staging.data());
      const size_t bytes = t.numel * sizeof(float);
      s = write_all(fd, staging.data(), bytes, shard_path);
      slices.push_back({{"buffer", state_buffer_name(b)},
                        {"tensor", t.name},
                        {"start", 0},
                        {"count", t.numel},
                        {"file_offset", file_offset},
                        {"xxh64", hex64(xxhash64(staging.data(), bytes))}});
      file_offset += bytes;
    }
  }
  if (s.ok() && ::fsync(fd) != 0) s = Status::error("cannot fsync '" + shard_path + "': " + std::strerror(errno));
  ::close(fd);
  if (!s.ok()) return s;

  json tensors = json::array();
  for (const TensorInfo& t : table.tensors()) {
    tensors.push_back({{"name", t.name}, {"shape", t.shape}, {"offset", t.offset}, {"decay", t.decay}});
  }
  json manifest = {
      {"format", "gantry-checkpoint"},
      {"format_version", kCheckpointFormatVersion},
      {"step", meta.step},
      {"loss", meta.loss},
      {"code_version", meta.code_version},
      {"data_version", hex64(meta.data_version)},
      {"data_cursor", {{"seed", meta.sampler_seed}, {"step", meta.step}}},
      {"rng_state", hex64(meta.rng_state)},
      {"layout", {{"world_size", 1}, {"dp", 1}, {"tp", 1}, {"pp", 1}, {"zero", 0}}},
      {"config", config_dump(meta.config)},
      {"tensors", tensors},
      {"shards", json::array({{{"file", shard_name}, {"rank", 0}, {"bytes", file_offset}, {"slices", slices}}})},
  };
  const std::string tmp = (dir / "manifest.json.tmp").string();
  s = write_file_durable(tmp, manifest.dump(1));
  if (!s.ok()) return s;
  fs::rename(tmp, dir / "manifest.json", ec);  // the commit
  if (ec) return Status::error("cannot commit checkpoint '" + dir.string() + "': " + ec.message());
  fsync_dir(dir.string());
  fsync_dir(root);

  // Keep the newest `keep`; drop uncommitted leftovers older than this one.
  std::vector<std::string> committed = checkpoint_list(root);
  for (size_t i = 0; i + static_cast<size_t>(keep) < committed.size(); ++i) fs::remove_all(committed[i], ec);
  for (const fs::directory_entry& e : fs::directory_iterator(root, ec)) {
    const std::string name = e.path().filename().string();
    if (name.rfind("step_", 0) == 0 && name < dir.filename().string() && !is_committed(e.path())) {
      fs::remove_all(e.path(), ec);
    }
  }
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return CheckpointWritten{dir.string(), file_offset, seconds};
}

namespace {

struct SliceRef {
  StateBuffer buffer;
  const TensorInfo* tensor;
  uint64_t start, count, file_offset, hash;
  std::string file;
};

}  // namespace

Result<CheckpointMeta> checkpoint_load(const std::string& dir_str, Backend& backend, const Config& config,
                                       uint64_t data_version) {
  const fs::path dir(dir_str);
  const std::string manifest_path = (dir / "manifest.json").string();
  if (!fs::is_directory(dir)) return Status::error("checkpoint '" + dir_str + "' is not a directory");
  std::ifstream in(manifest_path, std::ios::binary);
  if (!in) {
    return Status::error("checkpoint '" + dir_str +
                         "' has no manifest.json: it was never committed (its writer stopped before the commit)");
  }
  std::stringstream text;
  text << in.rdbuf();
  json m = json::parse(text.str(), nullptr, /*allow_exceptions=*/false);
  auto bad = [&](const std::string& what) { return Status::error(manifest_path + ": " + what); };
  if (m.is_discarded() || !m.is_object()) return bad("not valid JSON");

  CheckpointMeta meta;
  std::vector<SliceRef> refs;
  const TensorTable& table = backend.params();
  try {
    if (m.value("format", "") != "gantry-checkpoint") return bad("not a gantry checkpoint manifest");
    const int fv = m.at("format_version").get<int>();
    if (fv != kCheckpointFormatVersion) {
      return bad("format_version " + std::to_string(fv) + " is not supported (this build reads version " +
                 std::to_string(kCheckpointFormatVersion) + ")");
    }
    Result<Config> saved = config_parse(m.at("config").get<std::string>(), manifest_path + " (config)");
    if (!saved.ok()) return bad("its config does not parse: " + saved.error());
    std::vector<std::string> diffs = config_incompatibilities(saved.value(), config);
    if (!diffs.empty()) {
      std::string msg = "written for another config:";
      for (const std::string& d : diffs) msg += "\n  " + d;
      return bad(msg);
    }
    meta.config = saved.value();
    meta.step = m.at("step").get<int64_t>();
    meta.loss = m.value("loss", 0.0);
    meta.code_version = m.value("code_version", "");
    meta.sampler_seed = m.at("data_cursor").at("seed").get<uint64_t>();
    if (!parse_hex64(m.at("rng_state").get<std::string>(), &meta.rng_state)) return bad("rng_state is not hex");
    if (!parse_hex64(m.at("data_version").get<std::string>(), &meta.data_version)) {
      return bad("data_version is not hex");
    }
    if (meta.data_version != data_version) {
      return bad("written for other training data (data version " + hex64(meta.data_version) +
                 ", the configured shards have " + hex64(data_version) +
                 "): resume with the shards it was trained on");
    }
    const json& tensors = m.at("tensors");
    if (tensors.size() != table.size()) {
      return bad("has " + std::to_string(tensors.size()) + " tensors, the model has " +
                 std::to_string(table.size()));
    }
    for (size_t i = 0; i < table.size(); ++i) {
      const std::string name = tensors[i].at("name").get<std::string>();
      const auto shape = tensors[i].at("shape").get<std::vector<int64_t>>();
      if (name != table[i].name || shape != table[i].shape) {
        return bad("tensor " + std::to_string(i) + " is " + name + " " + tensor_shape_text(shape) +
                   ", the model has " + table[i].name + " " + tensor_shape_text(table[i].shape));
      }
    }
    for (const json& shard : m.at("shards")) {
      const std::string file = shard.at("file").get<std::string>();
      if (file.find('/') != std::string::npos || file.empty()) return bad("shard file name '" + file + "' is invalid");
      const std::string path = (dir / file).string();
      std::error_code ec;
      const uint64_t actual = fs::file_size(path, ec);
      if (ec) return Status::error("checkpoint shard '" + path + "' is missing: " + ec.message());
      const uint64_t expected = shard.at("bytes").get<uint64_t>();
      if (actual != expected) {
        return Status::error("checkpoint shard '" + path + "' has " + std::to_string(actual) + " bytes, the manifest says " +
                             std::to_string(expected) + (actual < expected ? " (truncated)" : " (trailing data)"));
      }
      for (const json& sl : shard.at("slices")) {
        bool ok;
        SliceRef r;
        r.buffer = buffer_from_name(sl.at("buffer").get<std::string>(), &ok);
        if (!ok) return bad("unknown buffer '" + sl.at("buffer").get<std::string>() + "'");
        r.tensor = table.find(sl.at("tensor").get<std::string>());
        if (r.tensor == nullptr) return bad("unknown tensor '" + sl.at("tensor").get<std::string>() + "'");
        r.start = sl.at("start").get<uint64_t>();
        r.count = sl.at("count").get<uint64_t>();
        r.file_offset = sl.at("file_offset").get<uint64_t>();
        if (!parse_hex64(sl.at("xxh64").get<std::string>(), &r.hash)) return bad("a slice hash is not hex");
        if (r.start + r.count > r.tensor->numel || r.file_offset + r.count * sizeof(float) > actual ||
            r.file_offset < kShardHeaderBytes) {
          return bad("slice " + r.tensor->name + " lies outside its tensor or file");
        }
        r.file = path;
        refs.push_back(r);
      }
    }
  } catch (const json::exception& e) {
    return bad(std::string("missing or mistyped field: ") + e.what());
  }

  // Stage and verify every byte before the backend sees any of it.
  const size_t n = table.numel();
  std::vector<std::vector<float>> staging(std::size(kSavedBuffers), std::vector<float>(n));
  std::vector<std::vector<uint64_t>> covered(std::size(kSavedBuffers), std::vector<uint64_t>(table.size(), 0));
  std::string open_path;
  int fd = -1;
  for (const SliceRef& r : refs) {
    if (r.file != open_path) {
      if (fd >= 0) ::close(fd);
      fd = ::open(r.file.c_str(), O_RDONLY);
      open_path = r.file;
      if (fd < 0) return Status::error("cannot read checkpoint shard '" + r.file + "': " + std::strerror(errno));
      char magic[8];
      if (::pread(fd, magic, 8, 0) != 8 || std::memcmp(magic, kShardMagic, 8) != 0) {
        ::close(fd);
        return Status::error("checkpoint shard '" + r.file + "' does not start with the GANTRYSH magic");
      }
    }
    const size_t bi = static_cast<size_t>(std::find(std::begin(kSavedBuffers), std::end(kSavedBuffers), r.buffer) -
                                          std::begin(kSavedBuffers));
    float* dst = staging[bi].data() + r.tensor->offset + r.start;
    const size_t bytes = r.count * sizeof(float);
    if (::pread(fd, dst, bytes, static_cast<off_t>(r.file_offset)) != static_cast<ssize_t>(bytes)) {
      ::close(fd);
      return Status::error("cannot read slice " + r.tensor->name + " of checkpoint shard '" + r.file + "'");
    }
    const uint64_t h = xxhash64(dst, bytes);
    if (h != r.hash) {
      ::close(fd);
      return Status::error("checkpoint shard '" + r.file + "' is corrupt: " + state_buffer_name(r.buffer) + " " +
                           r.tensor->name + " has checksum " + hex64(h) + ", the manifest says " + hex64(r.hash));
    }
    covered[bi][static_cast<size_t>(r.tensor - &table[0])] += r.count;
  }
  if (fd >= 0) ::close(fd);
  for (size_t bi = 0; bi < std::size(kSavedBuffers); ++bi) {
    for (size_t i = 0; i < table.size(); ++i) {
      if (covered[bi][i] != table[i].numel) {
        return bad(std::string(state_buffer_name(kSavedBuffers[bi])) + " " + table[i].name + " is covered by " +
                   std::to_string(covered[bi][i]) + " of its " + std::to_string(table[i].numel) + " elements");
      }
    }
  }

  for (size_t bi = 0; bi < std::size(kSavedBuffers); ++bi) {
    backend.write_state(kSavedBuffers[bi], 0, n, staging[bi].data());
  }
  backend.zero_grads();
  return meta;
}

}  // namespace gantry
