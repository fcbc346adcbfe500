// storage_query_bench: decimated range queries over a large run history.
// Goal (issue #5): 1,024 ranks × 100,000 steps into 2,000 buckets in ≤ 50 ms.
//
//   storage_query_bench [--ranks 1024] [--steps 100000] [--raw-steps 10000] [--db FILE] [--reps 20]
//
// Builds the history first (or reuses --db FILE if it already holds a run of that shape): every step of
// every rank ingested as a coordinator would, in batches of 4 steps, keeping the raw rank-step rows of
// the last --raw-steps steps only (the retention a long run uses; the tiles stay for all steps). Then
// times each query shape: the first (cold: statement and page caches empty) and the median, min and max
// of --reps repetitions on a freshly opened read-only connection. #wrong counts buckets whose record
// count does not add up. Prints a table and one JSON line per shape.
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <string>
#include <vector>

#include "storage/history_db.h"

namespace {

using gantry::BandQuery;
using gantry::HistoryDb;
using gantry::RankStepRecord;
using gantry::RecordBatch;

std::string cpu_model() {
  std::ifstream in("/proc/cpuinfo");
  for (std::string line; std::getline(in, line);) {
    if (line.rfind("model name", 0) == 0) return line.substr(line.find(':') + 2);
  }
  return "unknown";
}

double now_ms() {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

// Ingests the history: per-rank step times with a slow rank, a straggling node for a while and a
// checkpoint stall every 1,000 steps, so that the tiles hold something worth finding.
bool build(const std::string& path, int ranks, int64_t steps, int64_t raw_steps) {
  std::string error;
  auto db = HistoryDb::open(path, {}, &error);
  if (!db) {
    std::fprintf(stderr, "%s\n", error.c_str());
    return false;
  }
  const int64_t run = db->begin_run({.name = "query-bench", .world_size = ranks});
  std::vector<std::string> hosts;
  for (int n = 0; n < (ranks + 7) / 8; ++n) hosts.push_back("gpu-" + std::to_string(n));
  uint64_t lcg = 12345;
  const auto noise = [&] {
    lcg = lcg * 6364136223846793005ULL + 1442695040888963407ULL;
    return static_cast<double>(lcg >> 40) / static_cast<double>(1ULL << 24);
  };
  RecordBatch batch;
  const double t0 = now_ms();
  constexpr int64_t kStepsPerBatch = 4;
  for (int64_t s = 0; s < steps; ++s) {
    for (int r = 0; r < ranks; ++r) {
      RankStepRecord& x = batch.rank_steps.emplace_back();
      x.run_id = run;
      x.step = s;
      x.rank = r;
      x.host = hosts[static_cast<size_t>(r / 8)];
      x.device = r % 8;
      x.phases.forward = 0.30 * (r == 517 ? 1.1 : 1.0) + 0.01 * noise();
      x.phases.backward = 0.60 + 0.02 * noise();
      x.phases.optimizer = 0.05;
      x.phases.comm_exposed = (r / 8 == 40 && s > 60000 && s < 61000 ? 0.2 : 0.02) * noise();
      x.phases.checkpoint_stall = s % 1000 == 999 ? 3.0 : 0.0;
      x.total_s = x.phases.sum();
      x.tokens = 8192;
      x.mem_peak_bytes = uint64_t{70} << 30;
    }
    if (s % kStepsPerBatch == kStepsPerBatch - 1 || s == steps - 1) {
      if (!db->ingest(batch)) {
        std::fprintf(stderr, "ingest: %s\n", db->error().c_str());
        return false;
      }
      batch.clear();
    }
    if (s % 5000 == 4999) {
      if (raw_steps >= 0 && s + 1 > raw_steps) db->downsample_rank_steps(run, s + 1 - raw_steps);
      std::fprintf(stderr, "\rbuilding: step %lld of %lld, %.0f rows/s   ", static_cast<long long>(s + 1),
                   static_cast<long long>(steps),
                   static_cast<double>((s + 1) * ranks) / ((now_ms() - t0) / 1e3));
    }
  }
  std::fprintf(stderr, "\n");
  return db->finish_run(run, gantry::RunStatus::finished, "");
}

struct Shape {
  std::string name;
  BandQuery query;
  bool series = false;
};

}  // namespace

int main(int argc, char** argv) {
  int ranks = 1024;
  int64_t steps = 100000, raw_steps = 10000;
  int reps = 20;
  std::string path;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!std::strcmp(argv[i], "--ranks"))
      ranks = std::atoi(argv[i + 1]);
    else if (!std::strcmp(argv[i], "--steps"))
      steps = std::atoll(argv[i + 1]);
    else if (!std::strcmp(argv[i], "--raw-steps"))
      raw_steps = std::atoll(argv[i + 1]);
    else if (!std::strcmp(argv[i], "--reps"))
      reps = std::max(1, std::atoi(argv[i + 1]));
    else if (!std::strcmp(argv[i], "--db"))
      path = argv[i + 1];
    else {
      std::fprintf(
          stderr,
          "usage: storage_query_bench [--ranks N] [--steps N] [--raw-steps N] [--reps N] [--db FILE]\n");
      return 2;
    }
  }
  const bool keep = !path.empty();
  if (!keep) path = "/tmp/gantry_query_bench_" + std::to_string(::getpid()) + ".sqlite";

  // Reuse the file when it holds exactly this shape; otherwise build it.
  bool reuse = false;
  {
    std::string error;
    struct stat st {};
    if (::stat(path.c_str(), &st) == 0) {
      auto db = HistoryDb::open(path, {.read_only = true}, &error);
      gantry::RunRow run;
      reuse = db && db->get_run(1, &run) && run.info.world_size == ranks && run.last_step == steps - 1 &&
              run.status == gantry::RunStatus::finished;
    }
  }
  if (!reuse) {
    for (const char* suffix : {"", "-wal", "-shm"}) ::unlink((path + suffix).c_str());
    const double t0 = now_ms();
    if (!build(path, ranks, steps, raw_steps)) return 1;
    std::printf("# built %s: %d ranks x %lld steps in %.1f s\n", path.c_str(), ranks,
                static_cast<long long>(steps), (now_ms() - t0) / 1e3);
  }
  struct stat st {};
  ::stat(path.c_str(), &st);

  std::vector<int32_t> node40, scattered;
  for (int r = 320; r < 328 && r < ranks; ++r) node40.push_back(r);
  for (int r = 0; r < ranks; r += 10) scattered.push_back(r);
  const int64_t tail = std::max<int64_t>(0, steps - 10000);
  std::vector<Shape> shapes = {
      {"all ranks, all steps, 2000 buckets", {.run_id = 1, .max_buckets = 2000}},
      {"all ranks, forward, 2000 buckets",
       {.run_id = 1, .metric = gantry::RankMetric::forward, .max_buckets = 2000}},
      {"all ranks, last 10k steps, 2000", {.run_id = 1, .step_begin = tail, .max_buckets = 2000}},
      {"all ranks, last 1k steps, 2000", {.run_id = 1, .step_begin = steps - 1000, .max_buckets = 2000}},
      {"one node (8 ranks), all steps", {.run_id = 1, .ranks = node40, .max_buckets = 2000}},
      {"every 10th rank, all steps", {.run_id = 1, .ranks = scattered, .max_buckets = 2000}},
      {"series: 8 ranks, all steps", {.run_id = 1, .ranks = node40, .max_buckets = 2000}, true},
  };

  std::printf("# storage_query_bench: HistoryDb::query_band / query_series, %d ranks x %lld steps\n", ranks,
              static_cast<long long>(steps));
  std::printf("# device: CPU %s, %ld cores; file %s (%.2f GB, raw rank-steps for the last %lld steps)\n",
              cpu_model().c_str(), sysconf(_SC_NPROCESSORS_ONLN), path.c_str(),
              static_cast<double>(st.st_size) / 1e9, static_cast<long long>(raw_steps));
  std::printf("# %-36s %8s %9s %10s %9s %9s %9s %9s %7s\n", "query", "buckets", "width", "rows_read",
              "cold_ms", "ms", "min_ms", "max_ms", "#wrong");
  int failures = 0;
  for (const Shape& shape : shapes) {
    std::string error;
    auto db = HistoryDb::open(path, {.read_only = true}, &error);  // fresh connection: a cold first query
    if (!db) {
      std::fprintf(stderr, "%s\n", error.c_str());
      return 1;
    }
    std::vector<double> ms;
    gantry::BandResult band;
    gantry::SeriesResult series;
    for (int i = 0; i <= reps; ++i) {
      const double t0 = now_ms();
      const bool ok =
          shape.series ? db->query_series(shape.query, &series) : db->query_band(shape.query, &band);
      ms.push_back(now_ms() - t0);
      if (!ok) {
        std::fprintf(stderr, "%s: %s\n", shape.name.c_str(), db->error().c_str());
        return 1;
      }
    }
    const double cold = ms.front();
    ms.erase(ms.begin());
    std::sort(ms.begin(), ms.end());
    const double median = ms[ms.size() / 2];
    // Every bucket holds (ranks in the query) × (its steps within the run) records.
    const int64_t nranks = shape.query.ranks.empty() ? ranks : static_cast<int64_t>(shape.query.ranks.size());
    const auto expected = [&](const gantry::Bucket& b) {
      return (std::min(b.step_end, steps) - std::max<int64_t>(b.step_begin, 0)) * (shape.series ? 1 : nranks);
    };
    int64_t wrong = 0, buckets = 0, width = shape.series ? series.bucket_steps : band.bucket_steps;
    int64_t rows = shape.series ? series.rows_read : band.rows_read;
    if (shape.series) {
      for (const auto& rs : series.ranks) {
        for (const auto& b : rs.buckets) wrong += b.count != expected(b);
        buckets += static_cast<int64_t>(rs.buckets.size());
      }
    } else {
      for (const auto& b : band.buckets) wrong += b.count != expected(b);
      buckets = static_cast<int64_t>(band.buckets.size());
    }
    failures += wrong != 0;
    std::printf("  %-36s %8lld %9lld %10lld %9.2f %9.2f %9.2f %9.2f %7lld\n", shape.name.c_str(),
                static_cast<long long>(buckets), static_cast<long long>(width), static_cast<long long>(rows),
                cold, median, ms.front(), ms.back(), static_cast<long long>(wrong));
    std::printf(
        "{\"bench\":\"storage_query\",\"query\":\"%s\",\"ranks\":%d,\"steps\":%lld,\"buckets\":%lld,"
        "\"bucket_steps\":%lld,\"rows_read\":%lld,\"cold_ms\":%.3f,\"ms\":%.3f,\"min_ms\":%.3f,\"max_ms\":%."
        "3f,"
        "\"wrong\":%lld,\"goal_ms\":50}\n",
        shape.name.c_str(), ranks, static_cast<long long>(steps), static_cast<long long>(buckets),
        static_cast<long long>(width), static_cast<long long>(rows), cold, median, ms.front(), ms.back(),
        static_cast<long long>(wrong));
    std::fflush(stdout);
  }
  if (!keep) {
    for (const char* suffix : {"", "-wal", "-shm"}) ::unlink((path + suffix).c_str());
  }
  return failures ? 1 : 0;
}
