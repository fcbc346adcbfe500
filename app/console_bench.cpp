// gantry --bench-frames: the console on a big run, end to end (issue 14's benchmark). A run of ranks × steps
// is written once into a real coordinator's history (cluster.sqlite in --bench-history, through HistoryDb's
// ingest, so its tile pyramid is the one a live run builds; reused while the folder holds it), in a child
// process, so that none of it counts in this process's memory. `gantry-engine coordinator` then serves that
// folder in a process of its own; this process is the console: the real DataSource (its network, event and
// tile threads) follows the run and the real Run panel draws it in the real window and GL context.
//
// Figures: the first frame is the wall time from follow(run) to the end of the first frame whose heatmap
// had cells (the band and the heatmap's pages fetched from the coordinator's tile queries); frame times are
// the UI thread's CPU time (CLOCK_THREAD_CPUTIME_ID) and the wall time of the same span, over `frames`
// frames after that: ImGui's backends' NewFrame, ImGui::NewFrame, the Run panel's draw, ImGui::Render,
// glClear and ImGui_ImplOpenGL3_RenderDrawData (the buffer swap is outside). The step log's catch-up (the
// run's step records, in pages) goes on behind those frames, as it does live. Memory is this process's
// VmRSS and VmHWM at the end (the coordinator's is reported apart).
#include <GLFW/glfw3.h>
#include <backends/imgui_impl_glfw.h>
#include <backends/imgui_impl_opengl3.h>
#include <imgui.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cfloat>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "app/console_parts.h"
#include "engine/cluster/token.h"
#include "storage/history_db.h"
#include "telemetry/clock.h"  // thread_cpu_s, monotonic_s: the frame times
#include "ui/console/panels.h"
#include "ui/console/timeline_panel.h"

namespace gantry {
namespace {

using namespace gantry::console;
namespace fs = std::filesystem;

// kB of /proc/<pid>/status's `key` (VmRSS, VmHWM), in MiB; -1 when absent.
double proc_status_mb(const std::string& key, const std::string& pid = "self") {
  std::ifstream in("/proc/" + pid + "/status");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind(key + ":", 0) == 0) return std::stod(line.substr(key.size() + 1)) / 1024.0;
  }
  return -1;
}

// A cheap, repeatable hash → [0, 1): the synthetic run is the same on every machine and every run.
double unit(uint64_t x) {
  x ^= x >> 33;
  x *= 0xff51afd7ed558ccdULL;
  x ^= x >> 33;
  x *= 0xc4ceb9fe1a85ec53ULL;
  x ^= x >> 33;
  return static_cast<double>(x >> 11) * 0x1.0p-53;
}

// A run of `ranks` × `steps` into a history file: a decaying loss with noise, grad norm with rare spikes,
// steady tokens/s and MFU, and per rank a step of about 0.5 s (busy = forward + backward + optimizer, the
// rest exposed communication) with jitter, two persistent stragglers and rare one-step spikes on single
// ranks. Whole steps per batch (64 of them at 1,024 ranks), as the coordinator's ingest writes them.
int bench_fill(const std::string& path, int ranks, int64_t steps) {
  std::string error;
  std::unique_ptr<HistoryDb> db = HistoryDb::open(path, {}, &error);
  if (!db) {
    std::fprintf(stderr, "bench: %s\n", error.c_str());
    return 1;
  }
  const int64_t run = db->begin_run({.name = "bench",
                                     .world_size = ranks,
                                     .options = nlohmann::json{{"dp", ranks}, {"max_steps", steps}}.dump()});
  if (run < 0) {
    std::fprintf(stderr, "bench: %s\n", db->error().c_str());
    return 1;
  }
  const int64_t batch_steps = std::max<int64_t>(1, 65536 / ranks);
  const double t0 = monotonic_s();
  for (int64_t s0 = 1; s0 <= steps; s0 += batch_steps) {
    const int64_t s1 = std::min(steps + 1, s0 + batch_steps);
    RecordBatch batch;
    batch.rank_steps.resize(static_cast<size_t>((s1 - s0) * ranks));
    size_t i = 0;
    for (int64_t s = s0; s < s1; ++s) {
      StepRecord& r = batch.steps.emplace_back();
      r.run_id = run;
      r.step = s;
      r.time_unix_s = 1.7e9 + 0.5 * static_cast<double>(s);
      r.loss =
          2.0 + 8.0 * std::exp(-static_cast<double>(s) / 20000.0) + 0.05 * unit(static_cast<uint64_t>(s));
      r.grad_norm = 0.8 + 0.2 * unit(static_cast<uint64_t>(s) * 3) +
                    (unit(static_cast<uint64_t>(s) * 7) < 1e-3 ? 20.0 : 0.0);
      r.lr = 3e-4;
      r.tokens_per_s = 1.2e6 * (0.97 + 0.03 * unit(static_cast<uint64_t>(s) * 11));
      r.mfu = 0.42 * (0.97 + 0.03 * unit(static_cast<uint64_t>(s) * 13));
      r.step_s = 0.5;
      for (int k = 0; k < ranks; ++k, ++i) {
        RankStepRecord& x = batch.rank_steps[i];
        const uint64_t key = static_cast<uint64_t>(s) * 1000003ULL + static_cast<uint64_t>(k);
        double t = 0.5 * (1.0 + 0.04 * unit(key));
        if (k == ranks / 7 || (k == (ranks * 5) / 7 && s > steps / 2)) t *= 1.3;  // stragglers
        if (unit(key * 31) < 2e-6) t *= 5.0;                                      // rare spikes
        x.run_id = run;
        x.step = s;
        x.rank = k;
        x.host = "node-" + std::to_string(k / 8);
        x.device = k % 8;
        x.total_s = 0.7;
        x.phases.forward = 0.3 * t;
        x.phases.backward = 0.55 * t;
        x.phases.optimizer = 0.05 * t;
        x.phases.comm_exposed = std::max(0.0, 0.7 - 0.9 * t);
        x.tokens = 1024;
      }
    }
    if (!db->ingest(batch)) {
      std::fprintf(stderr, "bench: %s\n", db->error().c_str());
      return 1;
    }
    if ((s0 / batch_steps) % 160 == 0)
      std::fprintf(stderr, "bench: history to step %lld of %lld (%.0f s)\n", static_cast<long long>(s1 - 1),
                   static_cast<long long>(steps), monotonic_s() - t0);
  }
  if (!db->finish_run(run, RunStatus::finished, "", 1.7e9 + 0.5 * static_cast<double>(steps))) {
    std::fprintf(stderr, "bench: %s\n", db->error().c_str());
    return 1;
  }
  return 0;
}

// The history folder: built in a child process when it holds no complete one (the marker says which size
// it holds; another size is refused rather than overwritten). Returns the fill's seconds (0: reused).
Result<double> bench_history(const std::string& dir, int ranks, int64_t steps) {
  const fs::path marker = fs::path(dir) / "bench-complete.json";
  const nlohmann::json want = {{"ranks", ranks}, {"steps", steps}};
  if (fs::exists(marker)) {
    std::ifstream in(marker);
    const nlohmann::json have = nlohmann::json::parse(in, nullptr, false);
    if (have == want) return 0.0;
    return Status::error("--bench-history " + dir + " holds a run of " + have.dump() + ", not " +
                         want.dump() + ": give another folder");
  }
  std::error_code ec;
  fs::create_directories(dir, ec);
  for (const char* f : {"cluster.sqlite", "cluster.sqlite-wal", "cluster.sqlite-shm"})
    fs::remove(fs::path(dir) / f, ec);
  const double t0 = monotonic_s();
  const pid_t pid = ::fork();
  if (pid < 0) return Status::error(std::string("fork: ") + std::strerror(errno));
  if (pid == 0) ::_exit(bench_fill((fs::path(dir) / "cluster.sqlite").string(), ranks, steps));
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
    return Status::error("building the bench history failed");
  std::ofstream(marker) << want.dump() << "\n";
  return monotonic_s() - t0;
}

// `gantry-engine coordinator` on the folder, in a process of its own; its URL once it listens.
struct CoordinatorProcess {
  pid_t pid = -1;
  std::string url, token;
  ~CoordinatorProcess() {
    if (pid <= 0) return;
    ::kill(pid, SIGTERM);
    int status = 0;
    ::waitpid(pid, &status, 0);
  }
};

Status start_coordinator(const std::string& engine, const std::string& dir, CoordinatorProcess* c) {
  Result<std::string> token = token_generate();
  if (!token.ok()) return token.status();
  const std::string token_file = (fs::path(dir) / "bench-token").string();
  const std::string url_file = (fs::path(dir) / "bench-url").string();
  std::error_code ec;
  fs::remove(url_file, ec);
  if (Status s = token_file_write(token_file, token.value()); !s.ok()) return s;
  c->token = token.value();
  std::vector<std::string> args = {engine,     "coordinator", "--dir",  dir,      "--token-file",
                                   token_file, "--url-file",  url_file, "--port", "0"};
  c->pid = ::fork();
  if (c->pid < 0) return Status::error(std::string("fork: ") + std::strerror(errno));
  if (c->pid == 0) {
    std::vector<char*> argv;
    for (std::string& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    const std::string log = (fs::path(dir) / "bench-coordinator.log").string();
    if (FILE* f = std::freopen(log.c_str(), "w", stderr); f == nullptr) ::_exit(126);
    ::execv(argv[0], argv.data());
    ::_exit(127);
  }
  const double t0 = monotonic_s();
  while (monotonic_s() - t0 < 120) {
    std::ifstream in(url_file);
    std::string url;
    if (std::getline(in, url) && !url.empty()) {
      c->url = url;
      return Status();
    }
    int status = 0;
    if (::waitpid(c->pid, &status, WNOHANG) == c->pid) {
      c->pid = -1;
      return Status::error("gantry-engine coordinator exited; see " + dir + "/bench-coordinator.log");
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return Status::error("gantry-engine coordinator did not listen within 120 s");
}

double percentile(std::vector<double> v, double p) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t i =
      std::min(v.size() - 1, static_cast<size_t>(std::ceil(p * static_cast<double>(v.size())) - 1));
  return v[i];
}

}  // namespace

int console_bench_frames(GLFWwindow* window, const ConsoleBenchOptions& o) {
  const std::string dir = !o.history.empty()
                              ? o.history
                              : (fs::temp_directory_path() /
                                 ("gantry-bench-" + std::to_string(o.ranks) + "x" + std::to_string(o.steps)))
                                    .string();
  Result<double> fill_s = bench_history(dir, o.ranks, o.steps);
  if (!fill_s.ok()) {
    std::fprintf(stderr, "gantry: %s\n", fill_s.error().c_str());
    return 1;
  }
  CoordinatorProcess coordinator;
  if (Status st = start_coordinator(o.engine, dir, &coordinator); !st.ok()) {
    std::fprintf(stderr, "gantry: %s\n", st.message().c_str());
    return 1;
  }
  const Endpoint endpoint{coordinator.url, coordinator.token};
  DataSource source({}, [endpoint] { return Result<Endpoint>(endpoint); });
  const double asked = monotonic_s();
  source.follow(1);
  source.start();

  ImGuiIO& io = ImGui::GetIO();
  RunPanel panel;
  // --bench-timeline: the Timeline panel instead, on the run's newest steps (its window's bound: 1,024 at
  // 1,024 ranks). Its frames are measured once the window is whole, so they draw every step asked for.
  const int64_t timeline_steps =
      std::min<int64_t>({o.steps, 4096, std::max<int64_t>(1, kTimelineMaxRecords / std::max(o.ranks, 1))});
  TimelinePanel timeline(static_cast<int>(timeline_steps));
  const double wait_s = o.timeline ? 900 : 120;
  Clickables clicks;
  std::vector<double> cpu_ms, wall_ms;
  double first_frame_ms = 0, first_frame_s = -1, full_frame_s = -1;
  // The heatmap at the rows it asked for (the tile thread first fetches a few coarse rows): every page held
  // at the coordinator's row span for those rows.
  const auto full_resolution = [](const ConsoleSnapshot& s) {
    const HeatPages& h = *s.heat;
    if (h.pages.empty() || h.want.rows <= 0 || s.run.world <= 0) return false;
    int span = 1;
    while ((s.run.world + span - 1) / span > h.want.rows) span *= 2;
    return std::all_of(h.pages.begin(), h.pages.end(),
                       [&](const auto& t) { return t != nullptr && t->ranks_per_row == span; });
  };
  int vertices = 0, measured = 0;
  // Until the first frame with the heatmap's cells (at most 120 s), then `frames` frames measured.
  while (measured < o.frames && !glfwWindowShouldClose(window) &&
         (first_frame_s >= 0 || monotonic_s() - asked < wait_s)) {
    const std::shared_ptr<const ConsoleSnapshot> snap = source.snapshot();
    glfwPollEvents();
    const double c0 = thread_cpu_s(), w0 = monotonic_s();
    ImGui_ImplOpenGL3_NewFrame();
    ImGui_ImplGlfw_NewFrame();
    io.MousePos = ImVec2(-FLT_MAX, -FLT_MAX);  // no hover readouts: the same work every frame
    clicks.begin_frame();
    ImGui::NewFrame();
    FrameRecord record;
    PanelContext ctx{.source = source, .clicks = clicks, .frame = record, .now_unix_s = 0};
    const ConsoleSnapshot& s = *snap;
    const ImGuiViewport* vp = ImGui::GetMainViewport();
    ImGui::SetNextWindowPos(vp->WorkPos);
    ImGui::SetNextWindowSize(vp->WorkSize);
    if (ImGui::Begin(o.timeline ? "Timeline" : "Run", nullptr,
                     ImGuiWindowFlags_NoScrollWithMouse | ImGuiWindowFlags_NoCollapse)) {
      if (o.timeline)
        timeline.draw(s, ctx);
      else
        panel.draw(s, ctx);
    }
    ImGui::End();
    console_render(window);
    const double c1 = thread_cpu_s(), w1 = monotonic_s();
    vertices = ImGui::GetDrawData()->TotalVtxCount;
    glfwSwapBuffers(window);
    const bool heat =
        o.timeline ? s.timeline->complete_steps() >= timeline_steps &&
                         std::any_of(record.series.begin(), record.series.end(),
                                     [](const auto& x) { return x.name == "timeline" && x.length > 0; })
                   : std::any_of(record.series.begin(), record.series.end(),
                                 [](const auto& x) { return x.name == "rank time heatmap"; });
    if (heat && full_frame_s < 0 && (o.timeline || full_resolution(s))) full_frame_s = w1 - asked;
    if (first_frame_s < 0) {
      if (heat) {
        first_frame_s = w1 - asked;
        first_frame_ms = 1e3 * (c1 - c0);
      }
    } else {
      cpu_ms.push_back(1e3 * (c1 - c0));
      wall_ms.push_back(1e3 * (w1 - w0));
      ++measured;
    }
  }
  const std::shared_ptr<const ConsoleSnapshot> last = source.snapshot();
  const double rss = proc_status_mb("VmRSS"), hwm = proc_status_mb("VmHWM");
  const double coordinator_rss = proc_status_mb("VmRSS", std::to_string(coordinator.pid));
  source.stop();
  if (first_frame_s < 0) {
    std::fprintf(stderr, "gantry: no %s within %.0f s (%s)\n", o.timeline ? "whole timeline" : "heatmap",
                 wait_s, last->error.c_str());
    return 1;
  }
  const nlohmann::json out = {
      {"bench", "console_frames"},
      {"frames", cpu_ms.size()},
      {"median_ms", percentile(cpu_ms, 0.5)},
      {"p99_ms", percentile(cpu_ms, 0.99)},
      {"max_ms", percentile(cpu_ms, 1.0)},
      {"wall_median_ms", percentile(wall_ms, 0.5)},
      {"wall_p99_ms", percentile(wall_ms, 0.99)},
      {"first_frame_s", first_frame_s},
      {"full_frame_s", full_frame_s >= 0 ? nlohmann::json(full_frame_s) : nlohmann::json(nullptr)},
      {"first_frame_cpu_ms", first_frame_ms},
      {"vertices", vertices},
      {"rss_mb", rss},
      {"hwm_mb", hwm},
      {"coordinator_rss_mb", coordinator_rss},
      {"tile_cache_mb", static_cast<double>(last->tile_cache_bytes) / (1 << 20)},
      {"heat_pages", last->heat->pages.size()},
      {"band_buckets", last->band->size()},
      {"steps_held", last->steps->size()},
      {"history_fill_s", fill_s.value()},
      {"history", dir},
      {"ranks", o.ranks},
      {"steps", o.steps},
      {"panel", o.timeline ? "timeline" : "run"},
      {"timeline_steps", o.timeline ? nlohmann::json(timeline_steps) : nlohmann::json(nullptr)},
      {"timeline_items",
       o.timeline ? nlohmann::json(timeline.state_json()["items"]) : nlohmann::json(nullptr)},
      {"renderer", reinterpret_cast<const char*>(glGetString(GL_RENDERER))},
      {"measured",
       "first_frame_s: wall, follow(run) to the end of the first frame with heatmap cells (coarse rows "
       "first); full_frame_s: to the first frame with every page at the rows asked for (null: not within the "
       "frames drawn); frame times: "
       "UI-thread CPU time from the backends' NewFrame to ImGui_ImplOpenGL3_RenderDrawData, swap excluded; "
       "rss: the console process alone (the coordinator is another process)"}};
  std::printf("%s\n", out.dump().c_str());
  return 0;
}

}  // namespace gantry
