// The console main's helpers (app/console_*.cpp): the embedded local cluster and the framebuffer's PNG.
#pragma once

#include <imgui.h>

#include <cstdint>
#include <string>

#include "telemetry/status.h"
#include "ui/console/data_source.h"
#include "ui/plot/texture.h"

struct GLFWwindow;

namespace gantry {

// The gantry-engine beside this gantry binary (same folder), as `up` and `down` must match the console.
std::string console_engine_path();
// Where the console keeps its state: $XDG_STATE_HOME/gantry, else ~/.local/state/gantry.
std::string console_state_dir();

// Starts `gantry-engine up --nodes N --slots S --dir DIR` (or finds one already answering there, which is
// then not ours: *started stays false) and returns its URL and token. Runs on the console's network
// thread: it takes a few seconds.
Result<console::Endpoint> console_cluster_up(const std::string& engine, const std::string& dir, int nodes,
                                             int slots, bool* started);
// `gantry-engine down --dir DIR`: stops the coordinator, the agents and their workers.
Status console_cluster_down(const std::string& engine, const std::string& dir);

// The plot widgets' textures in the window's GL context (app/console_textures.cpp): registered with
// plot::set_texture_backend while the context lives.
class ConsoleTextures final : public plot::TextureBackend {
 public:
  ImTextureID create(int w, int h) override;
  void update(ImTextureID id, const uint32_t* rgba, int w, int h) override;
  void destroy(ImTextureID id) override;
};

// Ends the ImGui frame and draws it into the window's framebuffer: ImGui::Render, the viewport, the clear
// colour, the OpenGL 3 backend's draw calls (no buffer swap).
void console_render(GLFWwindow* window);
// Reads the current GL framebuffer (width × height, from the back buffer) and writes it as a PNG.
Status console_screenshot_write(const std::string& path, int width, int height);
// The framebuffer's rectangle [x, x + width) × [y, y + height) (y from the top) as a PNG; read after the
// frame is rendered and before the buffer swap.
Status console_png_region_write(const std::string& path, int x, int y, int width, int height,
                                int framebuffer_height);
// A plot's rectangle in ImGui's coordinates (plot::PngCapture), clipped to the framebuffer, as a PNG.
Status console_plot_png_write(const std::string& path, ImVec2 min, ImVec2 max, int fb_width, int fb_height);

// --bench-frames: a run of `ranks` × `steps` in a real coordinator's history (built once into `history`,
// reused while present), served by `engine` (gantry-engine coordinator) in a process of its own; the real
// DataSource follows it and the real Run panel draws `frames` frames in `window` (its GL context current,
// ImGui and its backends set up). Prints one JSON line: the first frame with the heatmap drawn after the
// run was asked for, frame times, and this (console) process's memory. Returns the exit code.
struct ConsoleBenchOptions {
  int frames = 600;
  int ranks = 1024;
  int64_t steps = 100000;
  std::string history;    // the folder of the coordinator's cluster.sqlite
  std::string engine;     // gantry-engine
  bool timeline = false;  // draw the Timeline panel (its newest min(steps, 1,024) steps) instead of Run
};
int console_bench_frames(GLFWwindow* window, const ConsoleBenchOptions& o);
// --bench-frames with --bench-devices N: the Devices panel on N GPUs × `samples` samples made in memory
// (console_bench_devices.cpp). Prints one JSON line; returns the exit code.
int console_bench_devices(GLFWwindow* window, int gpus, int64_t samples, int frames);

}  // namespace gantry
