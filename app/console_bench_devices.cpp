// gantry --bench-frames --bench-devices N: the Devices panel (ui/console/devices_panel.h) drawing N GPUs ×
// --bench-steps samples of one metric, the issue-21 figure. The series is made in memory (a power curve per
// GPU, one slow GPU), handed to the panel as the DataSource would hand it the coordinator's answer, and the
// panel builds its band and heatmap from it once; frame times are then the UI thread's CPU time and the
// wall time from the backends' NewFrame to ImGui_ImplOpenGL3_RenderDrawData (the swap excluded), as for the
// Run panel's bench (console_bench.cpp). No network: what is measured is the widgets on that many samples.
#include <GLFW/glfw3.h>
#include <backends/imgui_impl_glfw.h>
#include <backends/imgui_impl_opengl3.h>
#include <imgui.h>

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstdio>
#include <memory>
#include <nlohmann/json.hpp>
#include <vector>

#include "app/console_parts.h"
#include "telemetry/clock.h"  // thread_cpu_s, monotonic_s: the frame times
#include "ui/console/devices_panel.h"

namespace gantry {
namespace {

using namespace gantry::console;

double pct(std::vector<double> v, double q) {
  if (v.empty()) return NAN;
  std::sort(v.begin(), v.end());
  return v[std::min(v.size() - 1, static_cast<size_t>(q * static_cast<double>(v.size() - 1) + 0.5))];
}

}  // namespace

int console_bench_devices(GLFWwindow* window, int gpus, int64_t samples, int frames) {
  auto d = std::make_shared<DeviceSeries>();
  d->metric = DeviceMetric::kGpuPower;
  d->unit = "watts";
  d->first_time = 1.8e9;
  d->bucket_s = 1;
  d->cols = static_cast<int32_t>(samples);
  const size_t n = static_cast<size_t>(gpus) * static_cast<size_t>(samples);
  d->min.resize(n);
  d->max.resize(n);
  d->mean.resize(n);
  for (int g = 0; g < gpus; ++g) {
    d->rows.push_back("node-" + std::to_string(g / 8) + " gpu " + std::to_string(g % 8));
    d->row_is_gpu.push_back(true);
    for (int64_t c = 0; c < samples; ++c) {
      const float v =
          static_cast<float>(500 + 150 * std::sin(0.001 * static_cast<double>(c) + g) - (g == 37 ? 200 : 0));
      const size_t i = static_cast<size_t>(g) * static_cast<size_t>(samples) + static_cast<size_t>(c);
      d->min[i] = d->max[i] = d->mean[i] = v;
    }
  }
  ImGuiIO& io = ImGui::GetIO();
  Clickables clicks;
  DataSource source({}, [] { return Result<Endpoint>(Status::error("the bench has no coordinator")); });
  DevicesPanel panel;
  std::vector<double> cpu_ms, wall_ms;
  double build_ms = 0;
  for (int f = 0; f <= frames && !glfwWindowShouldClose(window); ++f) {
    glfwPollEvents();
    const double c0 = thread_cpu_s(), w0 = monotonic_s();
    ImGui_ImplOpenGL3_NewFrame();
    ImGui_ImplGlfw_NewFrame();
    io.MousePos = ImVec2(-FLT_MAX, -FLT_MAX);  // no hover readouts: the same work every frame
    clicks.begin_frame();
    ImGui::NewFrame();
    FrameRecord record;
    PanelContext ctx{.source = source, .clicks = clicks, .frame = record, .now_unix_s = 1.8e9 + samples};
    const ImGuiViewport* vp = ImGui::GetMainViewport();
    ImGui::SetNextWindowPos(vp->WorkPos);
    ImGui::SetNextWindowSize(vp->WorkSize);
    if (ImGui::Begin("Devices", nullptr, ImGuiWindowFlags_NoScrollWithMouse | ImGuiWindowFlags_NoCollapse))
      panel.draw_series(d, ctx);
    ImGui::End();
    console_render(window);
    const double c1 = thread_cpu_s(), w1 = monotonic_s();
    glfwSwapBuffers(window);
    if (f == 0) {
      build_ms = 1e3 * (c1 - c0);  // the first frame builds the band and the heatmap's model
      continue;
    }
    cpu_ms.push_back(1e3 * (c1 - c0));
    wall_ms.push_back(1e3 * (w1 - w0));
  }
  const nlohmann::json out = {{"bench", "console_frames"},
                              {"panel", "devices"},
                              {"gpus", gpus},
                              {"samples", samples},
                              {"frames", cpu_ms.size()},
                              {"median_ms", pct(cpu_ms, 0.5)},
                              {"p99_ms", pct(cpu_ms, 0.99)},
                              {"max_ms", pct(cpu_ms, 1.0)},
                              {"wall_median_ms", pct(wall_ms, 0.5)},
                              {"wall_p99_ms", pct(wall_ms, 0.99)},
                              {"first_frame_cpu_ms", build_ms},
                              {"state", panel.state_json()["band_points"]},
                              {"renderer", reinterpret_cast<const char*>(glGetString(GL_RENDERER))}};
  std::printf("%s\n", out.dump().c_str());
  return 0;
}

}  // namespace gantry
