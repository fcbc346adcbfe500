// storage_ingest_bench: how many rank-step records per second HistoryDb::ingest stores, tiles included.
// Goal (issue #5): ≥ 500,000 rows/s on the 2-core developer VM.
//
//   storage_ingest_bench [--ranks 1024] [--steps 2000] [--dir /tmp] [--shape step|node|both]
//                        [--checkpoint background|inline]
//
// Sweeps two batch shapes: one batch per step holding every rank (the coordinator merging a step), and
// one batch per node of 8 ranks (the agents' batches, ingested as they come). Records are generated
// before the clock starts. Each shape warms up on a separate run first, then is timed; afterwards a
// band query counts the records back (#wrong = records missing or extra). Prints a table and one JSON
// line per shape. --checkpoint inline turns off HistoryDb's checkpointer thread (SQLite then
// checkpoints inside the committing call), to measure what the thread buys.
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "storage/history_db.h"

namespace {

using gantry::RankStepRecord;
using gantry::RecordBatch;

double cpu_seconds() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return static_cast<double>(u.ru_utime.tv_sec + u.ru_stime.tv_sec) +
         1e-6 * static_cast<double>(u.ru_utime.tv_usec + u.ru_stime.tv_usec);
}

std::string cpu_model() {
  std::ifstream in("/proc/cpuinfo");
  for (std::string line; std::getline(in, line);) {
    if (line.rfind("model name", 0) == 0) return line.substr(line.find(':') + 2);
  }
  return "unknown";
}

// Every batch of the run, built ahead of the timing.
std::vector<RecordBatch> make_batches(int64_t run, int ranks, int64_t steps, int per_batch, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> u(0.0, 1.0);
  std::vector<std::string> hosts;
  for (int n = 0; n < (ranks + 7) / 8; ++n) hosts.push_back("gpu-" + std::to_string(n));
  std::vector<RecordBatch> out;
  for (int64_t s = 0; s < steps; ++s) {
    for (int r0 = 0; r0 < ranks; r0 += per_batch) {
      RecordBatch& b = out.emplace_back();
      for (int r = r0; r < std::min(ranks, r0 + per_batch); ++r) {
        RankStepRecord x;
        x.run_id = run;
        x.step = s;
        x.rank = r;
        x.host = hosts[static_cast<size_t>(r / 8)];
        x.device = r % 8;
        x.phases.data_wait = 0.001 * u(rng);
        x.phases.forward = 0.30 + 0.01 * u(rng);
        x.phases.backward = 0.60 + 0.02 * u(rng);
        x.phases.optimizer = 0.05;
        x.phases.comm_exposed = 0.05 * u(rng);
        x.total_s = x.phases.sum();
        x.tokens = 8192;
        x.mem_allocated_bytes = uint64_t{40} << 30;
        x.mem_peak_bytes = (uint64_t{70} << 30) + static_cast<uint64_t>(s);
        x.temperature_celsius = 60 + 10 * u(rng);
        x.sm_clock_hertz = 1.98e9;
        x.power_watts = 600 + 100 * u(rng);
        b.rank_steps.push_back(std::move(x));
      }
    }
  }
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  int ranks = 1024;
  int64_t steps = 2000;
  std::string dir = "/tmp";
  std::string shape = "both";
  bool background_checkpoint = true;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!std::strcmp(argv[i], "--ranks"))
      ranks = std::atoi(argv[i + 1]);
    else if (!std::strcmp(argv[i], "--shape"))
      shape = argv[i + 1];
    else if (!std::strcmp(argv[i], "--checkpoint"))
      background_checkpoint = std::strcmp(argv[i + 1], "inline") != 0;
    else if (!std::strcmp(argv[i], "--steps"))
      steps = std::atoll(argv[i + 1]);
    else if (!std::strcmp(argv[i], "--dir"))
      dir = argv[i + 1];
    else {
      std::fprintf(stderr,
                   "usage: storage_ingest_bench [--ranks N] [--steps N] [--dir DIR] [--shape step|node|both] "
                   "[--checkpoint background|inline]\n");
      return 2;
    }
  }
  const std::string path = dir + "/gantry_ingest_bench_" + std::to_string(::getpid()) + ".sqlite";
  const auto remove_db = [&] {
    for (const char* suffix : {"", "-wal", "-shm"}) ::unlink((path + suffix).c_str());
  };
  remove_db();

  std::printf("# storage_ingest_bench: HistoryDb::ingest of rank-step records, aggregate tiles included\n");
  std::printf("# device: CPU %s, %ld cores; SQLite file %s; WAL checkpoints %s\n", cpu_model().c_str(),
              sysconf(_SC_NPROCESSORS_ONLN), path.c_str(), background_checkpoint ? "on a thread" : "inline");
  std::printf("# %6s %8s %9s %10s %12s %14s %10s %10s %7s\n", "ranks", "steps", "per_batch", "rows", "rows/s",
              "rows/cpu-s", "ms/step", "bytes/row", "#wrong");
  int failures = 0;
  for (int per_batch : {ranks, 8}) {
    if ((shape == "step" && per_batch != ranks) || (shape == "node" && per_batch == ranks)) continue;
    std::string error;
    auto db = gantry::HistoryDb::open(path, {.background_checkpoint = background_checkpoint}, &error);
    if (!db) {
      std::fprintf(stderr, "%s\n", error.c_str());
      return 1;
    }
    // Warm-up: a short run of the same shape (page cache, statement cache, WAL file).
    const int64_t warm = db->begin_run({.name = "warmup", .world_size = ranks});
    const int64_t warm_steps = std::clamp<int64_t>(1000000 / ranks, 4, 64);  // at most ~1M records
    for (const RecordBatch& b : make_batches(warm, ranks, warm_steps, per_batch, 1)) db->ingest(b);

    const int64_t run = db->begin_run({.name = "bench", .world_size = ranks});
    const std::vector<RecordBatch> batches = make_batches(run, ranks, steps, per_batch, 2);
    struct stat before {};
    ::stat(path.c_str(), &before);
    const double cpu0 = cpu_seconds();
    const auto t0 = std::chrono::steady_clock::now();
    for (const RecordBatch& b : batches) {
      if (!db->ingest(b)) {
        std::fprintf(stderr, "ingest failed: %s\n", db->error().c_str());
        return 1;
      }
    }
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    const double cpu = cpu_seconds() - cpu0;  // beside wall time: the machine is shared, CPU time is steadier
    const int64_t rows = static_cast<int64_t>(ranks) * steps;

    // Read back: every record counted exactly once.
    db->finish_run(run, gantry::RunStatus::finished, "");
    gantry::BandResult band;
    int64_t counted = 0;
    if (db->query_band({.run_id = run, .max_buckets = 1}, &band)) {
      for (const auto& b : band.buckets) counted += b.count;
    }
    const int64_t wrong = std::llabs(counted - rows);
    failures += wrong != 0;
    db.reset();
    struct stat after {
    }, wal{};
    ::stat(path.c_str(), &after);
    ::stat((path + "-wal").c_str(), &wal);
    const double bytes_per_row =
        static_cast<double>(after.st_size + wal.st_size - before.st_size) / static_cast<double>(rows);
    const double rate = static_cast<double>(rows) / seconds;
    const double cpu_rate = static_cast<double>(rows) / cpu;
    std::printf("  %6d %8lld %9d %10lld %12.0f %14.0f %10.3f %10.1f %7lld\n", ranks,
                static_cast<long long>(steps), per_batch, static_cast<long long>(rows), rate, cpu_rate,
                1e3 * seconds / static_cast<double>(steps), bytes_per_row, static_cast<long long>(wrong));
    std::printf(
        "{\"bench\":\"storage_ingest\",\"ranks\":%d,\"steps\":%lld,\"per_batch\":%d,\"rows\":%lld,"
        "\"seconds\":%.4f,\"cpu_seconds\":%.4f,\"rows_per_s\":%.0f,\"rows_per_cpu_s\":%.0f,\"bytes_per_row\":"
        "%.1f,"
        "\"wrong\":%lld,\"checkpoint\":\"%s\",\"goal_rows_per_s\":500000}\n",
        ranks, static_cast<long long>(steps), per_batch, static_cast<long long>(rows), seconds, cpu, rate,
        cpu_rate, bytes_per_row, static_cast<long long>(wrong),
        background_checkpoint ? "background" : "inline");
    std::fflush(stdout);
    remove_db();
  }
  return failures ? 1 : 0;
}
