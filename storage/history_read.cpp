// HistoryDb's plain reads: runs, nodes, checkpoints, and bounded pages of raw rank steps, steps and events.
#include <sqlite3.h>

#include <algorithm>
#include <cmath>

#include "storage/history_db.h"
#include "storage/history_db_impl.h"
#include "storage/pack.h"

namespace gantry {
namespace {

// An unknown word in the file reads as failed: the run did not end well, as far as anyone knows.
RunStatus run_status_from(std::string_view s) {
  for (RunStatus st : {RunStatus::running, RunStatus::finished, RunStatus::failed, RunStatus::stopped,
                       RunStatus::interrupted}) {
    if (run_status_name(st) == s) return st;
  }
  return RunStatus::failed;
}

void read_run_row(sqlite3_stmt* st, RunRow* r) {
  r->id = sqlite3_column_int64(st, 0);
  r->info.name = column_text(st, 1);
  r->status = run_status_from(column_text(st, 2));
  r->info.world_size = sqlite3_column_int(st, 3);
  r->info.config = column_text(st, 4);
  r->info.code_version = column_text(st, 5);
  r->info.data_version = column_text(st, 6);
  r->info.layout = column_text(st, 7);
  r->info.out_dir = column_text(st, 8);
  r->info.peak_name = column_text(st, 9);
  r->info.peak_flops = sqlite3_column_double(st, 10);
  r->info.flops_per_token = sqlite3_column_double(st, 11);
  r->info.mfu_formula = column_text(st, 12);
  r->info.created_unix_s = sqlite3_column_double(st, 13);
  r->finished_unix_s = sqlite3_column_double(st, 14);
  r->message = column_text(st, 15);
  r->last_step = sqlite3_column_int64(st, 16);
  r->raw_from_step = sqlite3_column_int64(st, 17);
  r->info.options = column_text(st, 18);
}

constexpr const char* kRunColumns =
    "SELECT id, name, status, world_size, config, code_version, data_version, layout, out_dir, peak_name, "
    "peak_flops, flops_per_token, mfu_formula, created_unix_s, finished_unix_s, message, last_step, "
    "raw_from_step, options "
    "FROM runs";

}  // namespace

bool HistoryDb::get_run(int64_t run_id, RunRow* out) {
  sqlite3_stmt* st = nullptr;
  const std::string sql = std::string(kRunColumns) + " WHERE id = ?";
  if (sqlite3_prepare_v2(db_, sql.c_str(), -1, &st, nullptr) != SQLITE_OK)
    return fail_sqlite("reading a run");
  sqlite3_bind_int64(st, 1, run_id);
  const int rc = sqlite3_step(st);
  if (rc == SQLITE_ROW) read_run_row(st, out);
  sqlite3_finalize(st);
  if (rc == SQLITE_DONE) return fail("run " + std::to_string(run_id) + " does not exist");
  return rc == SQLITE_ROW || fail_sqlite("reading a run");
}

bool HistoryDb::list_runs(std::vector<RunRow>* out) {
  out->clear();
  sqlite3_stmt* st = nullptr;
  const std::string sql = std::string(kRunColumns) + " ORDER BY id";
  if (sqlite3_prepare_v2(db_, sql.c_str(), -1, &st, nullptr) != SQLITE_OK) return fail_sqlite("listing runs");
  int rc = SQLITE_DONE;
  while ((rc = sqlite3_step(st)) == SQLITE_ROW) read_run_row(st, &out->emplace_back());
  sqlite3_finalize(st);
  return rc == SQLITE_DONE || fail_sqlite("listing runs");
}

bool HistoryDb::list_nodes(std::vector<NodeInfo>* out) {
  out->clear();
  sqlite3_stmt* st = nullptr;
  if (sqlite3_prepare_v2(
          db_, "SELECT host, devices, device_name, state, last_seen_unix_s FROM nodes ORDER BY host", -1, &st,
          nullptr) != SQLITE_OK) {
    return fail_sqlite("listing nodes");
  }
  int rc = SQLITE_DONE;
  while ((rc = sqlite3_step(st)) == SQLITE_ROW) {
    NodeInfo& n = out->emplace_back();
    n.host = column_text(st, 0);
    n.devices = sqlite3_column_int(st, 1);
    n.device_name = column_text(st, 2);
    n.state = column_text(st, 3);
    n.last_seen_unix_s = sqlite3_column_double(st, 4);
  }
  sqlite3_finalize(st);
  return rc == SQLITE_DONE || fail_sqlite("listing nodes");
}

bool HistoryDb::list_checkpoints(int64_t run_id, std::vector<CheckpointInfo>* out) {
  out->clear();
  sqlite3_stmt* st = nullptr;
  if (sqlite3_prepare_v2(
          db_,
          "SELECT step, path, bytes, write_s, state, time_unix_s, stall_s, shards, manifest_xxh64, message "
          "FROM checkpoints WHERE run_id = ? ORDER BY step",
          -1, &st, nullptr) != SQLITE_OK) {
    return fail_sqlite("listing checkpoints");
  }
  sqlite3_bind_int64(st, 1, run_id);
  int rc = SQLITE_DONE;
  while ((rc = sqlite3_step(st)) == SQLITE_ROW) {
    CheckpointInfo& c = out->emplace_back();
    c.run_id = run_id;
    c.step = sqlite3_column_int64(st, 0);
    c.path = column_text(st, 1);
    c.bytes = static_cast<uint64_t>(sqlite3_column_int64(st, 2));
    c.write_s = sqlite3_column_double(st, 3);
    c.state = column_text(st, 4);
    c.time_unix_s = sqlite3_column_double(st, 5);
    if (sqlite3_column_type(st, 6) != SQLITE_NULL) c.stall_s = sqlite3_column_double(st, 6);
    if (sqlite3_column_type(st, 7) != SQLITE_NULL) c.shards = sqlite3_column_int(st, 7);
    c.manifest_xxh64 = column_text(st, 8);
    c.message = column_text(st, 9);
  }
  sqlite3_finalize(st);
  return rc == SQLITE_DONE || fail_sqlite("listing checkpoints");
}

bool HistoryDb::read_rank_steps(int64_t run_id, int64_t step_begin, int64_t step_end,
                                const std::vector<int32_t>& ranks, size_t limit,
                                std::vector<RankStepRecord>* out) {
  out->clear();
  std::vector<int32_t> want(ranks);
  std::sort(want.begin(), want.end());
  StmtUse st(st_->frames_range);
  sqlite3_bind_int64(*st, 1, run_id);
  sqlite3_bind_int64(*st, 2, step_begin);
  sqlite3_bind_int64(*st, 3, step_end);
  pack::Frame f;
  int rc = SQLITE_DONE;
  while (out->size() < limit && (rc = sqlite3_step(*st)) == SQLITE_ROW) {
    const int64_t step = sqlite3_column_int64(*st, 0);
    const int64_t grp = sqlite3_column_int64(*st, 1);
    if (!pack::frame_decode(sqlite3_column_blob(*st, 2), static_cast<size_t>(sqlite3_column_bytes(*st, 2)),
                            &f)) {
      return fail("corrupt rank_steps row (run " + std::to_string(run_id) + ", step " + std::to_string(step) +
                  ")");
    }
    for (int s = 0; s < pack::kGroupRanks && out->size() < limit; ++s) {
      const int32_t rank = static_cast<int32_t>(grp * pack::kGroupRanks + s);
      if (!(f.mask & (1u << s))) continue;
      if (!want.empty() && !std::binary_search(want.begin(), want.end(), rank)) continue;
      const pack::RawRank& x = f.ranks[s];
      RankStepRecord& r = out->emplace_back();
      r.run_id = run_id;
      r.step = step;
      r.rank = rank;
      r.host = host_of(x.node);
      r.device = x.device;
      for (int p = 0; p < kPhaseCount; ++p) r.phases.at(static_cast<Phase>(p)) = x.phase[p];
      r.total_s = x.total;
      r.tokens = x.tokens;
      r.mem_allocated_bytes = x.mem_allocated;
      r.mem_peak_bytes = x.mem_peak;
      if (!std::isnan(x.temperature)) r.temperature_celsius = x.temperature;
      if (!std::isnan(x.sm_clock)) r.sm_clock_hertz = x.sm_clock;
      if (!std::isnan(x.power)) r.power_watts = x.power;
    }
  }
  return out->size() >= limit || rc == SQLITE_DONE || fail_sqlite("reading rank steps");
}

bool HistoryDb::read_steps(int64_t run_id, int64_t step_begin, int64_t step_end, size_t limit,
                           std::vector<StepRecord>* out) {
  out->clear();
  sqlite3_stmt* st = nullptr;
  if (sqlite3_prepare_v2(
          db_,
          "SELECT step, time_unix_s, loss, grad_norm, lr, tokens_per_s, step_s, mfu, hfu, val_loss "
          "FROM steps WHERE run_id = ? AND step >= ? AND step < ? ORDER BY step LIMIT ?",
          -1, &st, nullptr) != SQLITE_OK) {
    return fail_sqlite("reading steps");
  }
  sqlite3_bind_int64(st, 1, run_id);
  sqlite3_bind_int64(st, 2, step_begin);
  sqlite3_bind_int64(st, 3, step_end);
  sqlite3_bind_int64(st, 4, static_cast<int64_t>(std::min<size_t>(limit, INT64_MAX)));
  int rc = SQLITE_DONE;
  while ((rc = sqlite3_step(st)) == SQLITE_ROW) {
    StepRecord& s = out->emplace_back();
    s.run_id = run_id;
    s.step = sqlite3_column_int64(st, 0);
    s.time_unix_s = column_double(st, 1);
    s.loss = column_double(st, 2);
    s.grad_norm = column_double(st, 3);
    s.lr = column_double(st, 4);
    s.tokens_per_s = column_double(st, 5);
    s.step_s = column_double(st, 6);
    if (sqlite3_column_type(st, 7) != SQLITE_NULL) s.mfu = sqlite3_column_double(st, 7);
    if (sqlite3_column_type(st, 8) != SQLITE_NULL) s.hfu = sqlite3_column_double(st, 8);
    if (sqlite3_column_type(st, 9) != SQLITE_NULL) s.val_loss = sqlite3_column_double(st, 9);
  }
  sqlite3_finalize(st);
  return rc == SQLITE_DONE || fail_sqlite("reading steps");
}

bool HistoryDb::read_events(int64_t run_id, int64_t after_id, size_t limit, std::vector<EventRow>* out) {
  out->clear();
  sqlite3_stmt* st = nullptr;
  if (sqlite3_prepare_v2(db_,
                         "SELECT id, time_unix_s, step, kind, rank, node, message, payload FROM events "
                         "WHERE run_id = ? AND id > ? ORDER BY id LIMIT ?",
                         -1, &st, nullptr) != SQLITE_OK) {
    return fail_sqlite("reading events");
  }
  sqlite3_bind_int64(st, 1, run_id);
  sqlite3_bind_int64(st, 2, after_id);
  sqlite3_bind_int64(st, 3, static_cast<int64_t>(std::min<size_t>(limit, INT64_MAX)));
  int rc = SQLITE_DONE;
  while ((rc = sqlite3_step(st)) == SQLITE_ROW) {
    EventRow& row = out->emplace_back();
    row.id = sqlite3_column_int64(st, 0);
    EventRecord& e = row.event;
    e.run_id = run_id;
    e.time_unix_s = sqlite3_column_double(st, 1);
    e.step = sqlite3_column_int64(st, 2);
    e.kind = column_text(st, 3);
    e.rank = sqlite3_column_int(st, 4);
    e.node = column_text(st, 5);
    e.message = column_text(st, 6);
    e.payload = column_text(st, 7);
  }
  sqlite3_finalize(st);
  return rc == SQLITE_DONE || fail_sqlite("reading events");
}

}  // namespace gantry
