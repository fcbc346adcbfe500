#include "engine/core/data_cursor_log.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>  // the log's lines

#include "engine/core/xxhash64.h"

namespace gantry {
namespace {

using json = nlohmann::json;

}  // namespace

DataCursorLog::DataCursorLog(const std::string& out_dir, int rank, int dp, int dp_rank, int64_t from_step)
    : path_(out_dir.empty() ? "" : (std::filesystem::path(out_dir) / kDataCursorLogFile).string()),
      rank_(rank),
      dp_(dp),
      dp_rank_(dp_rank) {
  if (path_.empty()) return;  // off
  fd_ = ::open(path_.c_str(), O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0644);
  if (fd_ < 0) {
    warned_ = true;
    std::fprintf(stderr, "rank %d: cannot open the data-cursor log %s: %s (training goes on without it)\n",
                 rank_, path_.c_str(), std::strerror(errno));
    return;
  }
  write_line(json{{"kind", "start"},
                  {"rank", rank_},
                  {"dp", dp_},
                  {"dp_rank", dp_rank_},
                  {"step", from_step},
                  {"pid", static_cast<int64_t>(::getpid())}}
                 .dump());
}

DataCursorLog::~DataCursorLog() {
  if (fd_ >= 0) ::close(fd_);
}

void DataCursorLog::add(uint64_t global_index, uint64_t window) {
  if (windows_.empty()) {
    first_ = global_index;
  } else if (global_index != first_ + count_) {
    contiguous_ = false;
  }
  ++count_;
  windows_.push_back(window);
}

void DataCursorLog::step_done(int64_t step, uint64_t batch) {
  if (fd_ < 0) {  // off, or unwritable (said once): nothing to hash
    first_ = count_ = 0;
    contiguous_ = true;
    windows_.clear();
    return;
  }
  json line = {{"kind", "step"},
               {"step", step},
               {"rank", rank_},
               {"dp_rank", dp_rank_},
               {"dp", dp_},
               {"batch", batch},
               {"first", first_},
               {"count", count_},
               {"windows", xxhash64_hex(xxhash64(windows_.data(), windows_.size() * sizeof(uint64_t)))}};
  if (!contiguous_) line["contiguous"] = false;
  write_line(line.dump());
  first_ = count_ = 0;
  contiguous_ = true;
  windows_.clear();
}

void DataCursorLog::rolled_back(int64_t to_step) {
  write_line(json{{"kind", "rollback"}, {"rank", rank_}, {"step", to_step}}.dump());
}

void DataCursorLog::write_line(const std::string& line) {
  if (fd_ < 0) return;
  const std::string whole = line + "\n";
  // One write: a line is never split between ranks appending at once, and a kill leaves whole lines.
  const ssize_t n = ::write(fd_, whole.data(), whole.size());
  if (n != static_cast<ssize_t>(whole.size()) && !warned_) {
    warned_ = true;
    std::fprintf(stderr, "rank %d: cannot append to the data-cursor log %s: %s (training goes on)\n", rank_,
                 path_.c_str(), n < 0 ? std::strerror(errno) : "short write");
  }
}

Result<DataCursorHistory> data_cursor_read(const std::string& out_dir) {
  const std::string path = (std::filesystem::path(out_dir) / kDataCursorLogFile).string();
  std::ifstream in(path);
  if (!in) return Status::error("cannot open the data-cursor log " + path);
  DataCursorHistory h;
  std::string text;
  int64_t line_no = 0;
  // A start or a rollback at step S: every rank's lines past S are gone from the history.
  auto forget_after = [&](int64_t s) { h.steps.erase(h.steps.upper_bound(s), h.steps.end()); };
  while (std::getline(in, text)) {
    ++line_no;
    if (text.empty()) continue;
    const json j = json::parse(text, nullptr, false);
    const std::string where = path + " line " + std::to_string(line_no);
    if (!j.is_object() || !j.contains("kind") || !j["kind"].is_string())
      return Status::error(where + ": not a data-cursor line: " + text.substr(0, 120));
    try {
      const std::string kind = j["kind"].get<std::string>();
      if (kind == "start") {
        ++h.starts;
        forget_after(j.at("step").get<int64_t>());
      } else if (kind == "rollback") {
        ++h.rollbacks;
        forget_after(j.at("step").get<int64_t>());
      } else if (kind == "step") {
        ++h.lines;
        DataCursorEntry e{.step = j.at("step").get<int64_t>(),
                          .rank = j.at("rank").get<int>(),
                          .dp = j.at("dp").get<int>(),
                          .dp_rank = j.at("dp_rank").get<int>(),
                          .batch = j.at("batch").get<uint64_t>(),
                          .first = j.at("first").get<uint64_t>(),
                          .count = j.at("count").get<uint64_t>(),
                          .contiguous = j.value("contiguous", true),
                          .windows = j.at("windows").get<std::string>()};
        std::vector<DataCursorEntry>& at = h.steps[e.step];
        // The same rank again at a step not forgotten: a process that never said it started (keep the
        // newest, which is what the run went on with).
        std::erase_if(at, [&](const DataCursorEntry& o) { return o.rank == e.rank; });
        at.insert(std::lower_bound(
                      at.begin(), at.end(), e,
                      [](const DataCursorEntry& a, const DataCursorEntry& b) { return a.rank < b.rank; }),
                  e);
      } else {
        return Status::error(where + ": unknown kind \"" + kind + "\" (start, step or rollback)");
      }
    } catch (const json::exception& ex) {
      return Status::error(where + ": " + ex.what());
    }
  }
  return h;
}

Status data_cursor_check(const DataCursorHistory& h, int64_t last_step, int global_batch,
                         const std::vector<SkippedBatches>& skipped) {
  if (global_batch < 1)
    return Status::error("global batch " + std::to_string(global_batch) + " must be >= 1");
  const uint64_t G = static_cast<uint64_t>(global_batch);
  for (int64_t s = 1; s <= last_step; ++s) {
    const std::string at = "step " + std::to_string(s);
    auto it = h.steps.find(s);
    if (it == h.steps.end() || it->second.empty()) return Status::error(at + ": no rank logged it");
    const uint64_t want = sampler_batch(static_cast<uint64_t>(s - 1), skipped);
    // Per dp rank: its samples (ranks of one dp rank must agree); then the dp ranks tile the batch.
    std::map<int, const DataCursorEntry*> by_dp;
    for (const DataCursorEntry& e : it->second) {
      const std::string who = at + ", rank " + std::to_string(e.rank);
      if (e.batch != want) {
        return Status::error(who + " read batch " + std::to_string(e.batch) + " where batch " +
                             std::to_string(want) + " was due" +
                             (e.batch < want ? " (a batch seen again)" : " (batches skipped)"));
      }
      if (!e.contiguous) return Status::error(who + ": its samples are not one contiguous range");
      auto [d, fresh] = by_dp.emplace(e.dp_rank, &e);
      if (!fresh &&
          (d->second->first != e.first || d->second->count != e.count || d->second->windows != e.windows)) {
        return Status::error(who + " read other samples than rank " + std::to_string(d->second->rank) +
                             " of the same dp rank " + std::to_string(e.dp_rank));
      }
    }
    uint64_t next = want * G;
    for (const auto& [dp_rank, e] : by_dp) {
      if (e->first != next) {
        return Status::error(at + ", dp rank " + std::to_string(dp_rank) + " read samples from " +
                             std::to_string(e->first) + " where " + std::to_string(next) + " was next" +
                             (e->first < next ? " (samples seen twice)" : " (samples skipped)"));
      }
      next += e->count;
    }
    if (next != (want + 1) * G) {
      return Status::error(at + ": the ranks read samples [" + std::to_string(want * G) + ", " +
                           std::to_string(next) + ") of batch " + std::to_string(want) + ", which holds [" +
                           std::to_string(want * G) + ", " + std::to_string((want + 1) * G) + ")");
    }
  }
  if (!h.steps.empty() && h.steps.rbegin()->first > last_step) {
    return Status::error("step " + std::to_string(h.steps.rbegin()->first) + " is in the history past step " +
                         std::to_string(last_step));
  }
  return {};
}

}  // namespace gantry
