// gantry --bench-frames: the Run panel's frame time with a big run in memory (issue 8's benchmark). No
// network and no cluster: the console's own model (the step log and the rank × step grid a DataSource
// fills) is filled with a synthetic run, and the Run panel draws from it exactly as it does live, in the
// real window and GL context that the console uses. The fill includes what the network thread computes
// with the grid (the band across ranks).
//
// Per frame it measures the UI thread's CPU time (CLOCK_THREAD_CPUTIME_ID) and the wall time of the same
// span: ImGui's backends' NewFrame, ImGui::NewFrame, the Run panel's draw (decimation, heatmap grid,
// ImGui layout), ImGui::Render, glClear and ImGui_ImplOpenGL3_RenderDrawData (the vertex upload and the
// draw calls as submitted, not their completion on the GPU). The buffer swap is outside it. The first
// frame, which builds the band and the heatmap's pyramid from the grid once, is reported on its own.
#include <GLFW/glfw3.h>
#include <backends/imgui_impl_glfw.h>
#include <backends/imgui_impl_opengl3.h>
#include <imgui.h>

#include <algorithm>
#include <cfloat>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <ctime>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "app/console_parts.h"
#include "ui/console/panels.h"

namespace gantry {
namespace {

using namespace gantry::console;

double thread_cpu_s() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}

double wall_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// kB of /proc/self/status's `key` (VmRSS, VmHWM), in MiB; -1 when absent.
double proc_status_mb(const std::string& key) {
  std::ifstream in("/proc/self/status");
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

// A run of `ranks` × `steps`: a decaying loss with noise, grad norm with rare spikes, steady tokens/s and
// MFU, and per rank a step time of about 0.5 s with jitter, two persistent stragglers and rare one-step
// spikes on single ranks.
void bench_fill(int ranks, int64_t steps, StepLog* log, RankStepGrid* grid) {
  std::vector<StepRecord> records(static_cast<size_t>(steps));
  for (int64_t s = 1; s <= steps; ++s) {
    StepRecord& r = records[static_cast<size_t>(s - 1)];
    r.run_id = 1;
    r.step = s;
    r.time_unix_s = 1.7e9 + 0.5 * static_cast<double>(s);
    r.loss = 2.0 + 8.0 * std::exp(-static_cast<double>(s) / 20000.0) + 0.05 * unit(static_cast<uint64_t>(s));
    r.grad_norm = 0.8 + 0.2 * unit(static_cast<uint64_t>(s) * 3) +
                  (unit(static_cast<uint64_t>(s) * 7) < 1e-3 ? 20.0 : 0.0);
    r.lr = 3e-4;
    r.tokens_per_s = 1.2e6 * (0.97 + 0.03 * unit(static_cast<uint64_t>(s) * 11));
    r.mfu = 0.42 * (0.97 + 0.03 * unit(static_cast<uint64_t>(s) * 13));
    r.step_s = 0.5;
  }
  log->append(std::move(records));

  // The grid is fed as the network thread feeds it, a batch of rank records at a time.
  const int64_t batch_steps = std::max<int64_t>(1, 65536 / ranks);
  std::vector<RankStepRecord> batch;
  for (int64_t s0 = 1; s0 <= steps; s0 += batch_steps) {
    const int64_t s1 = std::min(steps + 1, s0 + batch_steps);
    batch.resize(static_cast<size_t>((s1 - s0) * ranks));
    size_t i = 0;
    for (int64_t s = s0; s < s1; ++s) {
      for (int k = 0; k < ranks; ++k, ++i) {
        RankStepRecord& r = batch[i];
        const uint64_t key = static_cast<uint64_t>(s) * 1000003ULL + static_cast<uint64_t>(k);
        double t = 0.5 * (1.0 + 0.04 * unit(key));
        if (k == ranks / 7 || (k == (ranks * 5) / 7 && s > steps / 2)) t *= 1.3;  // stragglers
        if (unit(key * 31) < 2e-6) t *= 5.0;                                      // rare spikes
        r.run_id = 1;
        r.step = s;
        r.rank = k;
        r.device = k % 8;
        r.total_s = t;
        r.phases.forward = 0.3 * t;
        r.phases.backward = 0.55 * t;
        r.phases.optimizer = 0.05 * t;
        r.phases.comm_exposed = 0.1 * t;
        r.tokens = 1024;
      }
    }
    grid->add(batch);
  }
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
  // A DataSource that is never started: the panel's requests would queue there; none are made.
  DataSource source({}, [] { return Result<console::Endpoint>(Status::error("benchmark: no network")); });

  const double load0 = wall_s();
  auto log = std::make_shared<StepLog>();
  auto grid = std::make_shared<RankStepGrid>();
  bench_fill(o.ranks, o.steps, log.get(), grid.get());
  // The band is the network thread's work (DataSource publishes it with the grid), so it counts in the fill.
  auto band = std::make_shared<RankBand>();
  band->update(*grid, o.ranks);
  ConsoleSnapshot snap;
  snap.version = 1;
  snap.connected = true;
  snap.run = RunView{.id = 1,
                     .name = "bench",
                     .state = "running",
                     .dp = o.ranks,
                     .world = o.ranks,
                     .last_step = o.steps,
                     .max_steps = o.steps};
  snap.steps = log;
  snap.grid = grid;
  snap.band = band;
  const double load_s = wall_s() - load0;

  ImGuiIO& io = ImGui::GetIO();
  RunPanel panel;
  Clickables clicks;
  std::vector<double> cpu_ms, wall_ms;
  double first_frame_ms = 0;
  int vertices = 0;
  for (int f = 0; f <= o.frames && !glfwWindowShouldClose(window); ++f) {
    glfwPollEvents();
    const double c0 = thread_cpu_s(), w0 = wall_s();
    ImGui_ImplOpenGL3_NewFrame();
    ImGui_ImplGlfw_NewFrame();
    io.MousePos = ImVec2(-FLT_MAX, -FLT_MAX);  // no hover readouts: the same work every frame
    clicks.begin_frame();
    ImGui::NewFrame();
    FrameRecord record;
    PanelContext ctx{.source = source, .clicks = clicks, .frame = record, .now_unix_s = 0};
    const ImGuiViewport* vp = ImGui::GetMainViewport();
    ImGui::SetNextWindowPos(vp->WorkPos);
    ImGui::SetNextWindowSize(vp->WorkSize);
    if (ImGui::Begin("Run", nullptr, ImGuiWindowFlags_NoScrollWithMouse | ImGuiWindowFlags_NoCollapse))
      panel.draw(snap, ctx);
    ImGui::End();
    console_render(window);
    const double c1 = thread_cpu_s(), w1 = wall_s();
    vertices = ImGui::GetDrawData()->TotalVtxCount;
    glfwSwapBuffers(window);
    if (f == 0) {
      first_frame_ms = 1e3 * (c1 - c0);
    } else {
      cpu_ms.push_back(1e3 * (c1 - c0));
      wall_ms.push_back(1e3 * (w1 - w0));
    }
  }
  const nlohmann::json out = {
      {"bench", "console_frames"},
      {"frames", cpu_ms.size()},
      {"median_ms", percentile(cpu_ms, 0.5)},
      {"p99_ms", percentile(cpu_ms, 0.99)},
      {"max_ms", percentile(cpu_ms, 1.0)},
      {"wall_median_ms", percentile(wall_ms, 0.5)},
      {"wall_p99_ms", percentile(wall_ms, 0.99)},
      {"first_frame_ms", first_frame_ms},
      {"vertices", vertices},
      {"rss_mb", proc_status_mb("VmRSS")},
      {"hwm_mb", proc_status_mb("VmHWM")},
      {"load_s", load_s},
      {"ranks", o.ranks},
      {"steps", o.steps},
      {"renderer", reinterpret_cast<const char*>(glGetString(GL_RENDERER))},
      {"measured",
       "UI-thread CPU time from the backends' NewFrame to ImGui_ImplOpenGL3_RenderDrawData; swap excluded"}};
  std::printf("%s\n", out.dump().c_str());
  return 0;
}

}  // namespace gantry
