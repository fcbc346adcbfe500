// HistoryDb's device samples: the agents' per-GPU and per-node readings written in ingest's transaction, and
// read back as a device × time matrix at display resolution for the console's Devices panel and the API.
#include <sqlite3.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>

#include "storage/history_db.h"
#include "storage/history_db_impl.h"

namespace gantry {
namespace {

constexpr double kMinBucketSeconds = 1.0 / 16;

// The smallest power of two of seconds (at least kMinBucketSeconds) that puts `span` in `buckets` columns.
// The narrowest width (the minimum doubled) whose columns, aligned to a multiple of it, cover [t0, t1) in at
// most `buckets`: the alignment can add a column to span / width, and a caller asking for 10 gets 10.
double bucket_width(double t0, double t1, int32_t buckets) {
  double w = kMinBucketSeconds;
  while (std::ceil((t1 - std::floor(t0 / w) * w) / w) > buckets) w *= 2;
  return w;
}

}  // namespace

bool HistoryDb::put_device_samples(const std::vector<DeviceSampleRecord>& samples) {
  for (const DeviceSampleRecord& x : samples) {
    if (static_cast<int>(x.metric) >= kDeviceMetricCount)
      return fail("device sample metric " + std::to_string(static_cast<int>(x.metric)) + " is unknown");
    if (!std::isfinite(x.time_unix_s)) return fail("device sample of " + x.host + " has no finite time");
    const int64_t node = node_id(x.host);
    if (node < 0) return false;
    StmtUse st(st_->device_put);
    sqlite3_bind_int(*st, 1, static_cast<int>(x.metric));
    sqlite3_bind_int64(*st, 2, node);
    sqlite3_bind_int(*st, 3, x.device);
    sqlite3_bind_double(*st, 4, x.time_unix_s);
    if (!std::isnan(x.value)) sqlite3_bind_double(*st, 5, x.value);  // NaN: NULL, read back as NaN
    if (sqlite3_step(*st) != SQLITE_DONE) return fail_sqlite("writing device samples");
  }
  return true;
}

bool HistoryDb::query_devices(const DeviceSeriesQuery& q, DeviceSeriesResult* out) {
  *out = DeviceSeriesResult{};
  if (q.max_buckets < 1 || q.max_buckets > 100000)
    return fail("max_buckets " + std::to_string(q.max_buckets) + " is not in 1..100000");
  if (!(q.time_end == 0 || q.time_end > q.time_begin))
    return fail("the time range is empty: end must be after begin (or 0 for the newest sample)");
  // One read transaction: the range, the rows and the cells agree even while a writer commits.
  if (sqlite3_exec(db_, "BEGIN", nullptr, nullptr, nullptr) != SQLITE_OK)
    return fail_sqlite("beginning a read");
  struct End {
    sqlite3* db;
    ~End() { sqlite3_exec(db, "COMMIT", nullptr, nullptr, nullptr); }
  } end{db_};
  const int metric = static_cast<int>(q.metric);
  double t0 = q.time_begin, t1 = q.time_end;
  if (t0 == 0 || t1 == 0) {
    sqlite3_stmt* st = nullptr;
    if (sqlite3_prepare_v2(db_,
                           "SELECT MIN(time_unix_s), MAX(time_unix_s) FROM device_samples WHERE metric = ?",
                           -1, &st, nullptr) != SQLITE_OK)
      return fail_sqlite("reading the device samples' range");
    sqlite3_bind_int(st, 1, metric);
    const bool any = sqlite3_step(st) == SQLITE_ROW && sqlite3_column_type(st, 0) != SQLITE_NULL;
    const double lo = any ? sqlite3_column_double(st, 0) : 0, hi = any ? sqlite3_column_double(st, 1) : 0;
    sqlite3_finalize(st);
    if (!any) return true;  // no device reported the metric: no rows
    if (t0 == 0) t0 = lo;
    if (t1 == 0) t1 = std::max(hi + kMinBucketSeconds, t0 + kMinBucketSeconds);
  }
  out->bucket_s = bucket_width(t0, t1, q.max_buckets);
  out->first_time = std::floor(t0 / out->bucket_s) * out->bucket_s;
  out->cols = static_cast<int32_t>(std::ceil((t1 - out->first_time) / out->bucket_s));
  out->cols = std::max<int32_t>(1, out->cols);

  sqlite3_stmt* st = nullptr;
  if (sqlite3_prepare_v2(
          db_,
          "SELECT nodes.host, d.device, CAST((d.time_unix_s - ?1) / ?2 AS INTEGER) AS b, "
          "MIN(d.value), MAX(d.value), AVG(d.value), COUNT(*) FROM device_samples d JOIN nodes "
          "ON nodes.id = d.node_id WHERE d.metric = ?3 AND d.time_unix_s >= ?4 AND "
          "d.time_unix_s < ?5 GROUP BY d.node_id, d.device, b ORDER BY nodes.host, d.device, b",
          -1, &st, nullptr) != SQLITE_OK)
    return fail_sqlite("preparing the device query");
  sqlite3_bind_double(st, 1, out->first_time);
  sqlite3_bind_double(st, 2, out->bucket_s);
  sqlite3_bind_int(st, 3, metric);
  sqlite3_bind_double(st, 4, t0);
  sqlite3_bind_double(st, 5, t1);
  struct Cell {
    int32_t col;
    float min, max, mean;
  };
  std::vector<std::vector<Cell>> cells;
  int rc;
  while ((rc = sqlite3_step(st)) == SQLITE_ROW) {
    DeviceRow row{column_text(st, 0), sqlite3_column_int(st, 1)};
    if (out->rows.empty() || out->rows.back().host != row.host || out->rows.back().device != row.device) {
      out->rows.push_back(std::move(row));
      cells.emplace_back();
    }
    const auto col = static_cast<int32_t>(sqlite3_column_int64(st, 2));
    out->rows_read += sqlite3_column_int64(st, 6);
    if (col < 0 || col >= out->cols) continue;
    cells.back().push_back({col, static_cast<float>(column_double(st, 3)),
                            static_cast<float>(column_double(st, 4)),
                            static_cast<float>(column_double(st, 5))});
  }
  sqlite3_finalize(st);
  if (rc != SQLITE_DONE) return fail_sqlite("reading device samples");
  const size_t n = out->rows.size() * static_cast<size_t>(out->cols);
  if (n > kMaxHeatmapCells) {
    const size_t rows = out->rows.size();
    const int32_t cols = out->cols;
    *out = DeviceSeriesResult{};
    return fail("the device query is " + std::to_string(rows) + " devices x " + std::to_string(cols) +
                " columns, past " + std::to_string(kMaxHeatmapCells) + " cells: ask for fewer buckets");
  }
  const float nan = std::numeric_limits<float>::quiet_NaN();
  out->min.assign(n, nan);
  out->max.assign(n, nan);
  out->mean.assign(n, nan);
  for (size_t r = 0; r < cells.size(); ++r) {
    for (const Cell& c : cells[r]) {
      const size_t i = r * static_cast<size_t>(out->cols) + static_cast<size_t>(c.col);
      out->min[i] = c.min;
      out->max[i] = c.max;
      out->mean[i] = c.mean;
    }
  }
  return true;
}

}  // namespace gantry
