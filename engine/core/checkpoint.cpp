#include "engine/core/checkpoint.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cinttypes>
#include <cstdio>  // renameat2 (glibc >= 2.28): the commit's atomic rename and exchange
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>  // manifest.json
#include <sstream>
#include <thread>

#include "engine/core/comm/store_client.h"
#include "engine/core/gpt.h"
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

bool is_committed(const fs::path& dir) {
  return fs::is_regular_file(dir / "manifest.json");
}

StateBuffer buffer_from_name(const std::string& name, bool* ok) {
  *ok = true;
  for (StateBuffer b : kSavedBuffers) {
    if (name == state_buffer_name(b)) return b;
  }
  *ok = false;
  return StateBuffer::kParams;
}

// The step of a checkpoint directory or of a staging or aside directory of one; -1 for any other name.
int64_t step_of_name(const std::string& name) {
  std::string digits;
  if (name.rfind("step_", 0) == 0) {
    digits = name.substr(5);
  } else if (name.rfind(".step_", 0) == 0) {
    const size_t dot = name.find('.', 1);
    if (dot == std::string::npos) return -1;
    digits = name.substr(6, dot - 6);
  }
  if (digits.empty() || digits.size() > 18 || digits.find_first_not_of("0123456789") != std::string::npos)
    return -1;
  return std::stoll(digits);
}

}  // namespace

std::vector<std::string> checkpoint_list(const std::string& root) {
  std::vector<std::string> out;
  std::error_code ec;
  if (!fs::is_directory(root, ec)) return out;
  for (const fs::directory_entry& e : fs::directory_iterator(root, ec)) {
    const std::string name = e.path().filename().string();
    if (e.is_directory() && name.rfind("step_", 0) == 0 && is_committed(e.path()))
      out.push_back(e.path().string());
  }
  std::sort(out.begin(), out.end());  // zero-padded step numbers sort in step order
  return out;
}

int64_t checkpoint_dir_step(const std::string& dir) {
  const std::string name = fs::path(dir).filename().string();
  if (name.size() <= 5 || name.rfind("step_", 0) != 0) return -1;
  int64_t step = 0;
  for (size_t i = 5; i < name.size(); ++i) {
    if (name[i] < '0' || name[i] > '9' || step > (int64_t{1} << 50)) return -1;
    step = step * 10 + (name[i] - '0');
  }
  return step;
}

Result<std::string> checkpoint_latest(const std::string& root) {
  Result<CheckpointLatest> latest = checkpoint_latest_explained(root);
  if (!latest.ok()) return latest.status();
  return latest->dir;
}

Result<CheckpointLatest> checkpoint_latest_explained(const std::string& root) {
  CheckpointLatest latest;
  std::vector<std::string> all = checkpoint_list(root);
  const int64_t newest = all.empty() ? -1 : step_of_name(fs::path(all.back()).filename().string());
  std::error_code ec;
  std::vector<std::pair<int64_t, CheckpointSkipped>> passed;
  if (fs::is_directory(root, ec)) {
    for (const fs::directory_entry& e : fs::directory_iterator(root, ec)) {
      const std::string name = e.path().filename().string();
      const int64_t step = step_of_name(name);
      if (step <= newest || !e.is_directory(ec)) continue;
      if (name.rfind("step_", 0) == 0) {
        passed.push_back(
            {step,
             {e.path().string(),
              "it has no manifest.json: it was never committed (its writer stopped before the commit)"}});
      } else if (name.ends_with(".replaced")) {
        passed.push_back({step,
                          {e.path().string(),
                           "a checkpoint moved aside while a new one of its step was committed (a file "
                           "system without renameat2's flags): rename it back to step_... to use it"}});
      } else if (name.ends_with(".writing")) {
        passed.push_back(
            {step, {e.path().string(), "a write of step " + std::to_string(step) + " that never finished"}});
      }
    }
  }
  std::sort(passed.begin(), passed.end(), [](const auto& a, const auto& b) { return a.first > b.first; });
  for (auto& p : passed) latest.skipped.push_back(std::move(p.second));
  if (all.empty()) {
    std::string msg = "no committed checkpoint under '" + root +
                      "' (a checkpoint is a step_* directory holding manifest.json)";
    for (const CheckpointSkipped& s : latest.skipped) msg += "\n  passed over " + s.dir + ": " + s.why;
    return Status::error(msg);
  }
  latest.dir = all.back();
  return latest;
}

std::string checkpoint_latest_note(const CheckpointLatest& latest) {
  if (latest.skipped.empty()) return "";
  std::string note;
  for (const CheckpointSkipped& s : latest.skipped)
    note += "--resume latest: passing over " + s.dir + ": " + s.why + "\n";
  return note + "--resume latest: resuming from " + latest.dir + " instead, the newest committed checkpoint";
}

std::string checkpoint_earlier_hint(const std::string& dir) {
  fs::path failed = fs::path(dir).lexically_normal();
  if (!failed.has_filename()) failed = failed.parent_path();  // "step_00000100/"
  const int64_t failed_step = step_of_name(failed.filename().string());
  std::string earlier;
  for (const std::string& d : checkpoint_list(failed.parent_path().string())) {
    const int64_t step = step_of_name(fs::path(d).filename().string());
    if (failed_step < 0 || step >= failed_step) break;
    earlier = d;
  }
  return earlier.empty() ? "" : "\nan earlier checkpoint is still there: --resume " + earlier;
}

namespace {

// What this rank writes of buffer b: the backend's written ranges, less the parts of tensors that other
// ranks hold too (replicas > 1, a tensor whole on every tp rank) and write instead: replica k of n writes
// elements [k·numel/n, (k+1)·numel/n) of such a tensor, so every element is written once.
std::vector<FlatRange> rank_written_ranges(const TensorTable& table, const Backend& backend, StateBuffer b) {
  std::vector<FlatRange> out;
  auto add = [&](size_t lo, size_t hi) {
    if (lo >= hi) return;
    if (!out.empty() && out.back().end() == lo) {
      out.back().count += hi - lo;
    } else {
      out.push_back({lo, hi - lo});
    }
  };
  for (const FlatRange& r : backend.written_ranges(b)) {
    size_t at = r.offset;
    while (at < r.end()) {
      const TensorInfo& t = table[table.index_of_offset(at)];
      const size_t stop = std::min(r.end(), t.offset + t.numel);
      if (t.share.replicas <= 1) {
        add(at, stop);
      } else {
        const size_t n = static_cast<size_t>(t.share.replicas), k = static_cast<size_t>(t.share.replica);
        const size_t mine_lo = t.offset + t.numel * k / n, mine_hi = t.offset + t.numel * (k + 1) / n;
        add(std::max(at, mine_lo), std::min(stop, mine_hi));
      }
      at = stop;
    }
  }
  return out;
}

// The format version a table's checkpoint is written in: 2 when it holds shares of tensors (tensor
// parallelism: slices then name the share), else 1, which readers before version 2 still read.
int format_version_of(const TensorTable& table) {
  for (const TensorInfo& t : table.tensors()) {
    if (t.share.split()) return 2;
  }
  return 1;
}

// The slices of this rank's shard: the ranges its backend writes, buffer by buffer, cut at tensor
// boundaries. A snapshot holds them back to back in this order.
struct Piece {
  StateBuffer buffer;
  size_t tensor, start, count;
};
std::vector<Piece> shard_pieces(const TensorTable& table, const Backend& backend) {
  std::vector<Piece> pieces;
  for (StateBuffer b : kSavedBuffers) {
    for (const FlatRange& r : rank_written_ranges(table, backend, b)) {
      size_t at = r.offset;
      while (at < r.end()) {
        const size_t ti = table.index_of_offset(at);
        const size_t stop = std::min(r.end(), table[ti].offset + table[ti].numel);
        pieces.push_back({b, ti, at - table[ti].offset, stop - at});
        at = stop;
      }
    }
  }
  return pieces;
}

// Where a piece's floats come from: read from the backend into `scratch`, or a snapshot in host memory.
using PieceSource = std::function<const float*(const Piece&, std::vector<float>& scratch)>;

void hook_at(const CheckpointHook& hook, CheckpointStage stage, int64_t step) {
  if (hook) hook(stage, step);
}

// This rank's shard file. Returns the manifest's entry for the shard.
Result<json> write_shard(const fs::path& dir, int rank, const TensorTable& table,
                         const std::vector<Piece>& pieces, const PieceSource& source,
                         const CheckpointHook& hook, int64_t step) {
  char name[32];
  std::snprintf(name, sizeof name, "shard_r%05d.bin", rank);
  const std::string shard_path = (dir / name).string();

  int fd = ::open(shard_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  if (fd < 0) return Status::error("cannot create '" + shard_path + "': " + std::strerror(errno));
  unsigned char header[kShardHeaderBytes] = {};
  std::memcpy(header, kShardMagic, sizeof kShardMagic);
  const uint32_t version = static_cast<uint32_t>(format_version_of(table)),
                 rank32 = static_cast<uint32_t>(rank);
  const uint64_t slice_count = pieces.size();
  std::memcpy(header + 8, &version, 4);
  std::memcpy(header + 12, &rank32, 4);
  std::memcpy(header + 16, &slice_count, 8);
  Status s = write_all(fd, header, sizeof header, shard_path);

  json slices = json::array();
  uint64_t file_offset = kShardHeaderBytes;
  std::vector<float> staging;
  for (const Piece& p : pieces) {
    if (!s.ok()) break;
    const TensorInfo& t = table[p.tensor];
    const float* data = source(p, staging);
    const size_t bytes = p.count * sizeof(float);
    s = write_all(fd, data, bytes, shard_path);
    json slice = {{"buffer", state_buffer_name(p.buffer)},
                  {"tensor", t.name},
                  {"start", p.start},
                  {"count", p.count},
                  {"file_offset", file_offset},
                  {"xxh64", xxhash64_hex(xxhash64(data, bytes))}};
    // A share of the tensor (tensor parallelism): start and count are in the share's order; the share
    // says where its elements are in the whole tensor.
    if (t.share.split()) slice["share"] = {t.share.offset, t.share.width, t.share.stride};
    slices.push_back(std::move(slice));
    file_offset += bytes;
    if (slices.size() == 1) hook_at(hook, CheckpointStage::kWrite, step);
  }
  if (pieces.empty()) hook_at(hook, CheckpointStage::kWrite, step);
  if (s.ok() && ::fsync(fd) != 0)
    s = Status::error("cannot fsync '" + shard_path + "': " + std::strerror(errno));
  ::close(fd);
  if (!s.ok()) return s;
  return json{{"file", name}, {"rank", rank}, {"bytes", file_offset}, {"slices", slices}};
}

std::string store_text(const Result<std::vector<uint8_t>>& v) {
  return {v->begin(), v->end()};
}
std::vector<uint8_t> store_bytes(const std::string& s) {
  return {s.begin(), s.end()};
}

// The gang's store waits: one long wait, or (the async writer's thread) short polls that leave the socket
// to other threads in between, until the timeout or a cancel.
Status gang_wait(const CheckpointGang& g, const std::vector<std::string>& keys) {
  if (!g.poll_store) return g.store->wait(keys, g.timeout);
  const auto deadline = std::chrono::steady_clock::now() + g.timeout;
  for (;;) {
    Result<bool> set = g.store->wait_some(keys, std::chrono::milliseconds(2));
    if (!set.ok()) return set.status();
    if (set.value()) return {};
    if (g.cancel != nullptr && g.cancel->load())
      return Status::error("the run ended while the checkpoint was being written");
    if (std::chrono::steady_clock::now() >= deadline) {
      return g.store->wait(keys, std::chrono::milliseconds(1));  // the server's error names the missing keys
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
}
Result<std::vector<uint8_t>> gang_get(const CheckpointGang& g, const std::string& key) {
  if (Status st = gang_wait(g, {key}); !st.ok()) return st;
  return g.store->get(key, g.timeout);
}

// Where the ranks of a gang meet for one write: the step and how many checkpoints the gang wrote before,
// since one step may be written twice in a run (a periodic checkpoint, then the one at a stop).
std::string gang_prefix(const std::string& space, int64_t step, int64_t write) {
  return space + "/" + std::to_string(step) + "/" + std::to_string(write) + "/";
}

// Rank 0 of a gang: every rank's report in rank order, or the first failure (a rank's own error, or the
// ranks that never reported).
Result<std::vector<json>> collect_reports(const CheckpointGang& g, const std::string& prefix, int64_t step,
                                          const json& mine) {
  std::vector<json> shards{mine};
  std::vector<std::string> keys;
  for (int r = 1; r < g.layout.world; ++r) keys.push_back(prefix + "rank/" + std::to_string(r));
  if (!keys.empty()) {
    Status st = gang_wait(g, keys);
    if (!st.ok())
      return Status::error("checkpoint step " + std::to_string(step) +
                           ": not every rank reported: " + st.message());
  }
  for (const std::string& k : keys) {
    Result<std::vector<uint8_t>> v = g.store->get(k, g.timeout);
    if (!v.ok()) return v.status();
    const std::string text = store_text(v);
    if (text.rfind("ok\n", 0) != 0) return Status::error(text.substr(text.find('\n') + 1));
    json j = json::parse(text.substr(3), nullptr, false);
    if (j.is_discarded())
      return Status::error("checkpoint step " + std::to_string(step) + ": " + k + " is not JSON");
    shards.push_back(std::move(j));
  }
  return shards;
}

// A fresh, empty staging directory. Whatever a killed writer left under its name goes first: it was never
// committed, and this write replaces it.
Status staging_make(const fs::path& root, const fs::path& staging) {
  std::error_code ec;
  fs::create_directories(root, ec);
  if (!ec) fs::remove_all(staging, ec);
  if (!ec) fs::create_directory(staging, ec);
  if (ec)
    return Status::error("cannot create checkpoint directory '" + staging.string() + "': " + ec.message());
  return {};
}

// Puts the complete `staging` directory in place as `dir` in one atomic step: a rename when `dir` does
// not exist, else an exchange of the two names, after which the old directory, now under the staging
// name, is removed. At every instant `dir` is either the old directory or the new one, whole.
Status staging_commit(const fs::path& staging, const fs::path& dir) {
  if (::renameat2(AT_FDCWD, staging.c_str(), AT_FDCWD, dir.c_str(), RENAME_NOREPLACE) == 0) return {};
  if (errno == EEXIST) {
    if (::renameat2(AT_FDCWD, staging.c_str(), AT_FDCWD, dir.c_str(), RENAME_EXCHANGE) == 0) {
      std::error_code ec;
      fs::remove_all(staging, ec);  // the replaced directory; a leftover is swept by a later write
      return {};
    }
  }
  if (errno != EINVAL && errno != ENOSYS && errno != ENOTSUP) {
    return Status::error("cannot commit checkpoint '" + dir.string() + "': " + std::strerror(errno));
  }
  // A file system without renameat2's flags: move the old directory aside first, so the new one can take
  // its name. In between, the old one is whole under the aside name; a later write sweeps it.
  std::error_code ec;
  const fs::path aside = dir.parent_path() / ("." + dir.filename().string() + ".replaced");
  if (fs::exists(dir, ec)) {
    fs::remove_all(aside, ec);
    fs::rename(dir, aside, ec);
    if (ec)
      return Status::error("cannot move the old checkpoint '" + dir.string() + "' aside: " + ec.message());
  }
  fs::rename(staging, dir, ec);
  if (ec) return Status::error("cannot commit checkpoint '" + dir.string() + "': " + ec.message());
  fs::remove_all(aside, ec);
  return {};
}

}  // namespace

namespace {

// The data cursor: (seed, step), and the batches it passes over when the step guard rolled back (absent
// when none, so a manifest without rollbacks reads as before).
json data_cursor_json(const CheckpointMeta& meta) {
  json cursor = {{"seed", meta.sampler_seed}, {"step", meta.step}};
  if (!meta.skipped_batches.empty()) {
    json skipped = json::array();
    for (const SkippedBatches& r : meta.skipped_batches) skipped.push_back({r.first, r.count});
    cursor["skipped"] = skipped;
  }
  return cursor;
}

Result<CheckpointWritten> write_impl(const std::string& root, const TensorTable& table,
                                     const std::vector<Piece>& pieces, const PieceSource& source,
                                     const CheckpointMeta& meta, int keep, CheckpointGang* gang,
                                     const CheckpointHook& hook) {
  const auto t0 = std::chrono::steady_clock::now();
  const fs::path dir = fs::path(root) / step_dir_name(meta.step);
  // Every rank writes into a staging directory beside the final one, and rank 0 renames it into place
  // once it is complete: a directory already under the final name (a committed checkpoint of this step,
  // perhaps damaged, or an uncommitted leftover) is replaced, never trusted, and never half-overwritten.
  const fs::path staging = fs::path(root) / ("." + step_dir_name(meta.step) + ".writing");
  const int rank = gang != nullptr ? gang->layout.rank : 0;
  const std::string prefix = gang != nullptr ? gang_prefix(gang->key_space, meta.step, gang->writes++) : "";
  const bool node_local = gang != nullptr && gang->node_local;
  const std::string step_text = "checkpoint step " + std::to_string(meta.step);

  // Rank 0 makes the staging directory; the others write into it only once it says so. Node-local: each
  // rank its own.
  if (node_local) {
    if (Status made = staging_make(root, staging); !made.ok()) return made;
  } else if (rank == 0) {
    Status made = staging_make(root, staging);
    if (gang != nullptr) {
      const std::string word = made.ok() ? "ok" : "rank 0: " + made.message();
      Status st = gang->store->set(prefix + "dir", store_bytes(word), gang->timeout);
      if (made.ok() && !st.ok()) made = st;
    }
    if (!made.ok()) return made;
  } else {
    Result<std::vector<uint8_t>> word = gang_get(*gang, prefix + "dir");
    if (!word.ok()) return Status::error(step_text + ": no word from rank 0: " + word.error());
    if (store_text(word) != "ok") return Status::error(store_text(word));
  }
  Result<json> shard = write_shard(staging, rank, table, pieces, source, hook, meta.step);

  if (gang != nullptr && rank != 0) {
    const std::string report =
        shard.ok() ? "ok\n" + shard->dump() : "error\nrank " + std::to_string(rank) + ": " + shard.error();
    Status st = gang->store->set(prefix + "rank/" + std::to_string(rank), store_bytes(report), gang->timeout);
    if (!st.ok()) return st;
    Result<std::vector<uint8_t>> outcome = gang_get(*gang, prefix + "commit");
    if (!outcome.ok()) return Status::error(step_text + ": no word from rank 0: " + outcome.error());
    const std::string text = store_text(outcome);
    if (text.rfind("ok ", 0) != 0) return Status::error(text);
    if (node_local) {
      // Rank 0's manifest, written beside this rank's shard: this root's commit.
      Result<std::vector<uint8_t>> manifest = gang_get(*gang, prefix + "manifest");
      if (!manifest.ok()) return Status::error(step_text + ": no manifest from rank 0: " + manifest.error());
      Status s = write_file_durable((staging / "manifest.json").string(), store_text(manifest));
      if (s.ok()) s = staging_commit(staging, dir);
      if (!s.ok()) {
        std::error_code ec;
        fs::remove_all(staging, ec);
        return s;
      }
      std::error_code ec;
      const std::vector<std::string> committed = checkpoint_list(root);
      for (size_t i = 0; i + static_cast<size_t>(keep) < committed.size(); ++i)
        fs::remove_all(committed[i], ec);
    }
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    return CheckpointWritten{dir.string(), std::stoull(text.substr(3)), seconds};
  }

  // Rank 0 (or the only writer) from here on. A failure announces itself to the gang and removes the
  // staging directory; the final name keeps whatever it held before.
  // `who` names rank 0 to the other ranks when the failure is its own.
  auto fail = [&](const Status& s, const std::string& who) -> Status {
    if (gang != nullptr)
      (void)gang->store->set(prefix + "commit", store_bytes(who + s.message()), gang->timeout);
    std::error_code ec;
    fs::remove_all(staging, ec);
    return s;
  };
  if (!shard.ok()) return fail(shard.status(), "rank 0: ");
  std::vector<json> shards;
  if (gang != nullptr) {
    Result<std::vector<json>> all = collect_reports(*gang, prefix, meta.step, shard.value());
    if (!all.ok()) return fail(all.status(), "");
    shards = std::move(all.value());
  } else {
    shards.push_back(std::move(shard.value()));
  }

  uint64_t total_bytes = 0;
  for (const json& sh : shards) total_bytes += sh.at("bytes").get<uint64_t>();
  // The whole model's table, whatever share of it this layout's ranks hold: rank 0's table names every
  // tensor (whole or a share) except under pipeline parallelism, where it holds the first stage's only.
  json tensors = json::array();
  size_t whole_offset = 0;
  const TensorTable model = gpt_param_table(meta.config.model);
  bool stage = table.size() < model.size();
  for (const TensorInfo& t : table.tensors()) {
    const TensorInfo* w = model.find(t.name);
    stage = stage && w != nullptr && w->shape == t.whole_shape();
  }
  for (const TensorInfo& t : (stage ? model : table).tensors()) {
    tensors.push_back(
        {{"name", t.name}, {"shape", t.whole_shape()}, {"offset", whole_offset}, {"decay", t.decay}});
    whole_offset += tensor_numel(t.whole_shape());
  }
  const ParallelDims layout = gang != nullptr ? gang->layout : ParallelDims{};
  json manifest = {
      {"format", "gantry-checkpoint"},
      {"format_version", format_version_of(table)},
      {"step", meta.step},
      {"loss", meta.loss},
      {"code_version", meta.code_version},
      {"data_version", xxhash64_hex(meta.data_version)},
      {"data_cursor", data_cursor_json(meta)},
      {"rng_state", xxhash64_hex(meta.rng_state)},
      {"layout",
       {{"world_size", layout.world},
        {"dp", layout.dp},
        {"tp", layout.tp},
        {"pp", layout.pp},
        {"zero", layout.zero}}},
      {"config", config_dump(meta.config)},
      {"tensors", tensors},
      {"shards", shards},
  };
  Status s = write_file_durable((staging / "manifest.json").string(), manifest.dump(1));
  if (!s.ok()) return fail(s, "rank 0: ");
  fsync_dir(staging.string());
  hook_at(hook, CheckpointStage::kBeforeCommit, meta.step);
  s = staging_commit(staging, dir);  // the commit
  if (!s.ok()) return fail(s, "rank 0: ");
  fsync_dir(root);
  hook_at(hook, CheckpointStage::kAfterCommit, meta.step);
  if (node_local) {
    Status st = gang->store->set(prefix + "manifest", store_bytes(manifest.dump(1)), gang->timeout);
    if (!st.ok()) return st;
  }
  if (gang != nullptr) {
    Status st =
        gang->store->set(prefix + "commit", store_bytes("ok " + std::to_string(total_bytes)), gang->timeout);
    if (!st.ok()) return st;
  }

  // Keep the newest `keep`; drop what writers of older steps left behind (uncommitted step_* directories
  // of an older build, staging and aside directories of a killed write).
  std::error_code ec;
  std::vector<std::string> committed = checkpoint_list(root);
  for (size_t i = 0; i + static_cast<size_t>(keep) < committed.size(); ++i) fs::remove_all(committed[i], ec);
  for (const fs::directory_entry& e : fs::directory_iterator(root, ec)) {
    const std::string name = e.path().filename().string();
    const int64_t step = step_of_name(name);
    if (step < 0 || step >= meta.step || !e.is_directory(ec)) continue;
    if (name[0] == '.' || !is_committed(e.path())) fs::remove_all(e.path(), ec);
  }
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return CheckpointWritten{dir.string(), total_bytes, seconds};
}

}  // namespace

const char* checkpoint_stage_name(CheckpointStage s) {
  switch (s) {
    case CheckpointStage::kCopy:
      return "copy";
    case CheckpointStage::kWrite:
      return "write";
    case CheckpointStage::kBeforeCommit:
      return "before_commit";
    case CheckpointStage::kAfterCommit:
      return "after_commit";
    case CheckpointStage::kWaitPrevious:
      return "wait_previous";
  }
  return "?";
}

CheckpointSnapshot checkpoint_snapshot_pieces(const Backend& backend) {
  CheckpointSnapshot snap;
  for (StateBuffer b : kSavedBuffers) {
    for (const FlatRange& r : rank_written_ranges(backend.params(), backend, b)) {
      snap.pieces.push_back({.buffer = b, .offset = r.offset, .count = r.count, .host_offset = snap.floats});
      snap.floats += r.count;
    }
  }
  return snap;
}

Result<CheckpointWritten> checkpoint_write(const std::string& root, Backend& backend,
                                           const CheckpointMeta& meta, int keep, CheckpointGang* gang) {
  const TensorTable& table = backend.params();
  // One slice at a time through a small staging buffer: a synchronous write needs no copy of the state.
  PieceSource read = [&](const Piece& p, std::vector<float>& scratch) -> const float* {
    scratch.resize(p.count);
    backend.read_state(p.buffer, table[p.tensor].offset + p.start, p.count, scratch.data());
    return scratch.data();
  };
  return write_impl(root, table, shard_pieces(table, backend), read, meta, keep, gang, {});
}

Result<CheckpointWritten> checkpoint_write_snapshot(const std::string& root, const TensorTable& table,
                                                    const CheckpointSnapshot& snapshot,
                                                    const CheckpointMeta& meta, int keep,
                                                    CheckpointGang* gang, const CheckpointHook& hook) {
  // The snapshot holds the written ranges back to back in shard order, and the shard's slices cut those
  // ranges in the same order: each slice starts where the one before ended.
  std::vector<Piece> pieces;
  for (const SnapshotPiece& sp : snapshot.pieces) {
    size_t at = sp.offset;
    while (at < sp.offset + sp.count) {
      const size_t ti = table.index_of_offset(at);
      const size_t stop = std::min(sp.offset + sp.count, table[ti].offset + table[ti].numel);
      pieces.push_back({sp.buffer, ti, at - table[ti].offset, stop - at});
      at = stop;
    }
  }
  size_t next = 0;
  PieceSource from_snapshot = [&](const Piece& p, std::vector<float>&) -> const float* {
    const float* at = snapshot.host + next;
    next += p.count;
    return at;
  };
  return write_impl(root, table, pieces, from_snapshot, meta, keep, gang, hook);
}

namespace {

struct SliceRef {
  StateBuffer buffer;
  size_t tensor;  // index in the table
  uint64_t start, count, file_offset, hash;
  // Where the slice's elements lie in the whole tensor (TensorShare's offset, width, stride); a slice of
  // the whole tensor: 0, its numel, its numel.
  uint64_t share_offset, share_width, share_stride;
  std::string file;
};

// Calls fn(whole element, position in the slice, count) for each run of the slice contiguous in the whole
// tensor.
template <typename Fn>
void slice_runs(const SliceRef& r, Fn&& fn) {
  const uint64_t end = r.start + r.count, w = r.share_width;
  for (uint64_t i = r.start; i < end;) {
    const uint64_t row = i / w, col = i % w, n = std::min(w - col, end - i);
    fn(static_cast<size_t>(r.share_offset + row * r.share_stride + col), static_cast<size_t>(i - r.start),
       static_cast<size_t>(n));
    i += n;
  }
}

}  // namespace

Result<CheckpointMeta> checkpoint_load(const std::string& dir_str, Backend& backend, const Config& config,
                                       uint64_t data_version, std::string* damaged) {
  const fs::path dir(dir_str);
  const std::string manifest_path = (dir / "manifest.json").string();
  if (!fs::is_directory(dir)) return Status::error("checkpoint '" + dir_str + "' is not a directory");
  // A refusal because `file` is broken (checkpoint.h): the caller may fall back to an older checkpoint.
  auto broken = [damaged](const std::string& file, Status s) {
    if (damaged != nullptr) *damaged = file;
    return s;
  };
  std::ifstream in(manifest_path, std::ios::binary);
  if (!in) {
    return broken(
        manifest_path,
        Status::error(
            "checkpoint '" + dir_str +
            "' has no manifest.json: it was never committed (its writer stopped before the commit)"));
  }
  std::stringstream text;
  text << in.rdbuf();
  json m = json::parse(text.str(), nullptr, /*allow_exceptions=*/false);
  auto bad = [&](const std::string& what) { return Status::error(manifest_path + ": " + what); };
  // The manifest itself is broken (a flipped or cut byte), not a whole one for something else.
  auto bad_manifest = [&](const std::string& what) { return broken(manifest_path, bad(what)); };
  if (m.is_discarded() || !m.is_object()) return bad_manifest("not valid JSON");

  CheckpointMeta meta;
  std::vector<SliceRef> refs;
  const TensorTable& table = backend.params();
  const TensorTable model = gpt_param_table(config.model);
  const TensorTable& listed = table.size() < model.size() ? model : table;
  try {
    if (m.value("format", "") != "gantry-checkpoint") return bad("not a gantry checkpoint manifest");
    const int fv = m.at("format_version").get<int>();
    if (fv < 1 || fv > kCheckpointFormatVersion) {
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
    if (m.at("data_cursor").contains("skipped")) {
      for (const json& r : m.at("data_cursor").at("skipped")) {
        meta.skipped_batches.push_back({r.at(0).get<uint64_t>(), r.at(1).get<uint64_t>()});
      }
    }
    if (!xxhash64_parse_hex(m.at("rng_state").get<std::string>(), &meta.rng_state))
      return bad_manifest("rng_state is not hex");
    if (!xxhash64_parse_hex(m.at("data_version").get<std::string>(), &meta.data_version)) {
      return bad_manifest("data_version is not hex");
    }
    if (meta.data_version != data_version) {
      return bad("written for other training data (data version " + xxhash64_hex(meta.data_version) +
                 ", the configured shards have " + xxhash64_hex(data_version) +
                 "; it covers every shard's name, size and contents): resume with the shards it was trained "
                 "on, or start a fresh run without --resume");
    }
    const json& tensors = m.at("tensors");
    // Checked against the whole model: a pipeline stage holds some of its tensors (by name, whole), and
    // takes the slices of those only.
    if (tensors.size() != listed.size()) {
      return bad("has " + std::to_string(tensors.size()) + " tensors, the model has " +
                 std::to_string(listed.size()));
    }
    for (size_t i = 0; i < listed.size(); ++i) {
      const std::string name = tensors[i].at("name").get<std::string>();
      const auto shape = tensors[i].at("shape").get<std::vector<int64_t>>();
      if (name != listed[i].name || shape != listed[i].whole_shape()) {
        return bad("tensor " + std::to_string(i) + " is " + name + " " + tensor_shape_text(shape) +
                   ", the model has " + listed[i].name + " " + tensor_shape_text(listed[i].whole_shape()));
      }
    }
    for (const json& shard : m.at("shards")) {
      const std::string file = shard.at("file").get<std::string>();
      if (file.find('/') != std::string::npos || file.empty())
        return bad_manifest("shard file name '" + file + "' is invalid");
      const std::string path = (dir / file).string();
      std::error_code ec;
      const uint64_t actual = fs::file_size(path, ec);
      if (ec)
        return broken(path, Status::error("checkpoint shard '" + path + "' is missing: " + ec.message()));
      const uint64_t expected = shard.at("bytes").get<uint64_t>();
      if (actual != expected) {
        return broken(path, Status::error("checkpoint shard '" + path + "' has " + std::to_string(actual) +
                                          " bytes, the manifest says " + std::to_string(expected) +
                                          (actual < expected ? " (truncated)" : " (trailing data)")));
      }
      for (const json& sl : shard.at("slices")) {
        bool ok;
        SliceRef r;
        r.buffer = buffer_from_name(sl.at("buffer").get<std::string>(), &ok);
        if (!ok) return bad_manifest("unknown buffer '" + sl.at("buffer").get<std::string>() + "'");
        const TensorInfo* t = listed.find(sl.at("tensor").get<std::string>());
        if (t == nullptr) return bad_manifest("unknown tensor '" + sl.at("tensor").get<std::string>() + "'");
        const TensorInfo* mine = table.find(t->name);  // null: another pipeline stage's tensor
        r.start = sl.at("start").get<uint64_t>();
        r.count = sl.at("count").get<uint64_t>();
        r.file_offset = sl.at("file_offset").get<uint64_t>();
        if (!xxhash64_parse_hex(sl.at("xxh64").get<std::string>(), &r.hash))
          return bad_manifest("a slice hash is not hex");
        const uint64_t whole = tensor_numel(t->whole_shape());
        r.share_offset = 0, r.share_width = whole, r.share_stride = whole;
        if (sl.contains("share")) {
          const auto sh = sl.at("share").get<std::vector<uint64_t>>();
          if (sh.size() != 3 || sh[1] == 0 || sh[2] < sh[1] || sh[2] > whole || sh[0] >= whole)
            return bad_manifest("slice " + t->name + " has a bad share " + sl.at("share").dump() +
                                " (want [offset, width, stride] with 0 < width <= stride <= " +
                                std::to_string(whole) + " and offset < " + std::to_string(whole) + ")");
          r.share_offset = sh[0], r.share_width = sh[1], r.share_stride = sh[2];
        }
        // The slice's last element, where it lies in the whole tensor.
        const uint64_t last = r.start + r.count - 1;
        const bool inside =
            r.count == 0 ||
            (r.start + r.count > r.start &&
             r.share_offset + last / r.share_width * r.share_stride + last % r.share_width < whole);
        if (!inside || r.file_offset + r.count * sizeof(float) > actual ||
            r.file_offset < kShardHeaderBytes) {
          return bad_manifest("slice " + t->name + " lies outside its tensor or file");
        }
        r.file = path;
        if (mine == nullptr) continue;
        r.tensor = static_cast<size_t>(mine - table.tensors().data());
        refs.push_back(r);
      }
    }
  } catch (const json::exception& e) {
    return bad_manifest(std::string("missing or mistyped field: ") + e.what());
  }

  // Stage and verify every byte this rank needs before the backend sees any of it: for each buffer, the
  // ranges the backend holds, taken from whichever slices overlap them (the writer's layout may differ).
  // Both sides meet in the whole tensors' coordinates: the ranges this rank holds (of its own share of
  // each tensor under tensor parallelism) and each slice (of the writer's share) are mapped to runs of the
  // whole tensor, and the overlaps copied.
  struct Run {
    size_t whole = 0, count = 0;  // elements of the whole tensor
    size_t staging = 0;           // where they go in staging
  };
  struct Need {
    std::vector<FlatRange> ranges;
    std::vector<size_t> staging_offset;  // of each range
    std::vector<float> staging;
    std::vector<std::vector<Run>> runs;          // per tensor, sorted by whole element
    std::vector<std::vector<FlatRange>> filled;  // per tensor: whole-tensor intervals copied so far
  };
  std::vector<Need> needs(std::size(kSavedBuffers));
  for (size_t bi = 0; bi < std::size(kSavedBuffers); ++bi) {
    Need& nd = needs[bi];
    nd.ranges = backend.held_ranges(kSavedBuffers[bi]);
    nd.runs.resize(table.size());
    nd.filled.resize(table.size());
    size_t total = 0;
    for (const FlatRange& r : nd.ranges) {
      nd.staging_offset.push_back(total);
      for (size_t at = r.offset; at < r.end();) {
        const size_t ti = table.index_of_offset(at);
        const TensorInfo& t = table[ti];
        const size_t stop = std::min(r.end(), t.offset + t.numel);
        tensor_share_runs(t, at - t.offset, stop - at, [&](size_t whole, size_t local, size_t n) {
          nd.runs[ti].push_back({whole, n, total + (t.offset + local - r.offset)});
        });
        at = stop;
      }
      total += r.count;
    }
    for (std::vector<Run>& rs : nd.runs)
      std::sort(rs.begin(), rs.end(), [](const Run& a, const Run& b) { return a.whole < b.whole; });
    nd.staging.resize(total);
  }
  std::string open_path;
  int fd = -1;
  std::vector<float> slice;
  struct Copy {
    size_t from, to, count;  // slice position, staging position
  };
  std::vector<Copy> copies;
  for (const SliceRef& r : refs) {
    const size_t bi = static_cast<size_t>(
        std::find(std::begin(kSavedBuffers), std::end(kSavedBuffers), r.buffer) - std::begin(kSavedBuffers));
    Need& nd = needs[bi];
    const std::vector<Run>& runs = nd.runs[r.tensor];
    copies.clear();
    if (!runs.empty()) {
      slice_runs(r, [&](size_t whole, size_t pos, size_t n) {
        // The first held run that ends after `whole`, then every one that starts before the slice run ends.
        auto it = std::upper_bound(runs.begin(), runs.end(), whole,
                                   [](size_t w, const Run& h) { return w < h.whole + h.count; });
        for (; it != runs.end() && it->whole < whole + n; ++it) {
          const size_t a = std::max(whole, it->whole), b = std::min(whole + n, it->whole + it->count);
          copies.push_back({pos + (a - whole), it->staging + (a - it->whole), b - a});
          nd.filled[r.tensor].push_back({a, b - a});
        }
      });
    }
    if (copies.empty()) continue;
    if (r.file != open_path) {
      if (fd >= 0) ::close(fd);
      fd = ::open(r.file.c_str(), O_RDONLY);
      open_path = r.file;
      if (fd < 0)
        return broken(
            r.file, Status::error("cannot read checkpoint shard '" + r.file + "': " + std::strerror(errno)));
      char magic[8];
      if (::pread(fd, magic, 8, 0) != 8 || std::memcmp(magic, kShardMagic, 8) != 0) {
        ::close(fd);
        return broken(r.file, Status::error("checkpoint shard '" + r.file +
                                            "' does not start with the GANTRYSH magic"));
      }
    }
    const std::string& name = table[r.tensor].name;
    slice.resize(r.count);
    const size_t bytes = r.count * sizeof(float);
    if (::pread(fd, slice.data(), bytes, static_cast<off_t>(r.file_offset)) != static_cast<ssize_t>(bytes)) {
      ::close(fd);
      return broken(r.file,
                    Status::error("cannot read slice " + name + " of checkpoint shard '" + r.file + "'"));
    }
    const uint64_t h = xxhash64(slice.data(), bytes);
    if (h != r.hash) {
      ::close(fd);
      return broken(r.file, Status::error("checkpoint shard '" + r.file + "' is corrupt: " +
                                          state_buffer_name(r.buffer) + " " + name + " has checksum " +
                                          xxhash64_hex(h) + ", the manifest says " + xxhash64_hex(r.hash)));
    }
    for (const Copy& c : copies)
      std::memcpy(nd.staging.data() + c.to, slice.data() + c.from, c.count * sizeof(float));
  }
  if (fd >= 0) ::close(fd);
  // Every held element exactly once: per tensor, the sorted filled intervals must tile the held runs.
  for (size_t bi = 0; bi < std::size(kSavedBuffers); ++bi) {
    Need& nd = needs[bi];
    for (size_t ti = 0; ti < table.size(); ++ti) {
      std::vector<FlatRange>& filled = nd.filled[ti];
      std::sort(filled.begin(), filled.end(),
                [](const FlatRange& a, const FlatRange& b) { return a.offset < b.offset; });
      size_t f = 0;
      for (const Run& held : nd.runs[ti]) {
        size_t at = held.whole;
        while (at < held.whole + held.count) {
          if (f >= filled.size() || filled[f].offset != at) {
            const bool overlap = f < filled.size() && filled[f].offset < at;
            return bad_manifest(std::string(state_buffer_name(kSavedBuffers[bi])) + " " + table[ti].name +
                                " element " + std::to_string(at) +
                                (overlap ? " is in more than one slice"
                                         : " is in no slice: the shards do not cover the model"));
          }
          at = filled[f++].end();
        }
      }
    }
  }

  for (size_t bi = 0; bi < std::size(kSavedBuffers); ++bi) {
    const Need& nd = needs[bi];
    for (size_t k = 0; k < nd.ranges.size(); ++k) {
      backend.write_state(kSavedBuffers[bi], nd.ranges[k].offset, nd.ranges[k].count,
                          nd.staging.data() + nd.staging_offset[k]);
    }
  }
  backend.zero_grads();
  return meta;
}

}  // namespace gantry
