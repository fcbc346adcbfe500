// gantry: the operations console. Wires the parts and runs the frame loop: a GLFW window with an OpenGL 3
// context, Dear ImGui on it, a DataSource (ui/console/data_source.h) filling the model from the coordinator
// on its own threads, and the panels drawn from one snapshot per frame.
//
//   gantry                                      a local cluster (gantry-engine up) and a tiny run to launch
//   gantry --connect URL --token-file F         a remote coordinator (never stopped by the console)
//   gantry --screenshot out.png --frames N --dump-state s.json [--script S]   draw, capture, exit
//
// Exit codes: 0 done, 1 a script failed or the screenshot could not be written, 2 bad input or no display,
// 130 interrupted (SIGINT, SIGTERM).
#include <GLFW/glfw3.h>
#include <backends/imgui_impl_glfw.h>
#include <backends/imgui_impl_opengl3.h>
#include <imgui.h>

#include <CLI/CLI.hpp>
#include <atomic>
#include <cfloat>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <thread>

#include "app/console_parts.h"
#include "app/file_text.h"
#include "engine/cluster/token.h"
#include "ui/console/console_app.h"
#include "ui/console/script.h"
#include "ui/plot/plot_export.h"

namespace {

namespace fs = std::filesystem;
using namespace gantry;
using namespace gantry::console;

constexpr int kExitScriptFailed = 1;
constexpr int kExitBadInput = 2;

const char* const kNoDisplay =
    "gantry: cannot open a window (%s).\n"
    "The console needs a display. Without one, the headless commands do the same work:\n"
    "  gantry-engine up --nodes 2 --slots 2 --dir DIR      start a local cluster (prints its URL; token in "
    "DIR/token)\n"
    "  gantry-engine ctl --url URL --token-file DIR/token "
    "status|runs|submit|checkpoint|pause|resume|stop|events\n"
    "  gantry-engine run --nproc N --config FILE.toml      train with N worker processes, no cluster\n"
    "(or run the console under a virtual display: xvfb-run -a gantry)\n";

// SIGINT / SIGTERM end the frame loop as a closed window does, so the embedded cluster is still stopped
// and --dump-state still written.
std::atomic<bool> g_interrupted{false};
void on_signal(int) {
  g_interrupted = true;
}

void glfw_error(int code, const char* text) {
  std::fprintf(stderr, "gantry: GLFW error %d: %s\n", code, text);
}

struct Options {
  std::string connect, token_file, state_dir, screenshot, dump_state, script, run_config;
  int frames = 0;
  int width = 1600, height = 1000;
  int tiny_dp = 4;
  int64_t tiny_max_steps = 0;
  bool keep_cluster = false;
  int bench_frames = 0;  // > 0: the frame-time benchmark instead of a console
  int bench_ranks = 1024;
  int64_t bench_steps = 100000;
  std::string bench_history;
  bool bench_timeline = false;
  bool no_textures = false;
  int bench_devices = 0;  // > 0: the Devices panel on that many GPUs × bench_steps samples
};

}  // namespace

int main(int argc, char** argv) {
  Options o;
  CLI::App cli{
      "gantry: the operations console. Without --connect it starts a local cluster (gantry-engine up) "
      "with a tiny run ready to launch, and stops it on exit."};
  cli.add_option("--connect", o.connect,
                 "coordinator URL (http://host:port), as `gantry-engine up` prints it");
  cli.add_option("--token-file", o.token_file,
                 "the coordinator's bearer token file (mode 0600), with --connect");
  cli.add_option("--state-dir", o.state_dir,
                 "where the console keeps its cache and the local cluster "
                 "(default $XDG_STATE_HOME/gantry or ~/.local/state/gantry)");
  cli.add_option("--screenshot", o.screenshot,
                 "write the window as a PNG after --frames frames (and the script), then exit");
  cli.add_option("--frames", o.frames, "frames to draw before the screenshot / state dump")
      ->check(CLI::Range(1, 1000000));
  cli.add_option("--dump-state", o.dump_state,
                 "write the console's state as JSON on exit (panels, series, last step, run)");
  cli.add_option("--script", o.script, "drive the console from a script file (docs/CONSOLE.md: the format)");
  cli.add_option("--width", o.width, "window width in pixels")->check(CLI::Range(320, 8192));
  cli.add_option("--height", o.height, "window height in pixels")->check(CLI::Range(240, 8192));
  cli.add_option("--run-config", o.run_config, "the TOML of the tiny run offered on a local cluster");
  cli.add_option("--tiny-dp", o.tiny_dp, "data-parallel ranks of the tiny run")->check(CLI::Range(1, 64));
  cli.add_option("--tiny-max-steps", o.tiny_max_steps, "stop the tiny run after this step (0: the config's)")
      ->check(CLI::Range(int64_t{0}, int64_t{1} << 40));
  cli.add_option(
         "--bench-frames", o.bench_frames,
         "benchmark: follow a --bench-ranks x --bench-steps run served by a real coordinator (its history "
         "built once in --bench-history) and draw N frames (default 600) of the Run panel; prints one "
         "JSON line: first frame, frame times, the console's memory")
      ->expected(0, 1)
      ->default_str("600")
      ->check(CLI::Range(1, 1000000));
  cli.add_option("--bench-history", o.bench_history,
                 "benchmark: the folder of the run's history (cluster.sqlite), built there once when absent "
                 "(default: $TMPDIR/gantry-bench-<ranks>x<steps>)");
  cli.add_option("--bench-ranks", o.bench_ranks, "benchmark: ranks of the synthetic run")
      ->check(CLI::Range(1, 65536));
  cli.add_option("--bench-steps", o.bench_steps, "benchmark: steps of the synthetic run")
      ->check(CLI::Range(int64_t{1}, int64_t{10000000}));
  cli.add_flag(
      "--bench-timeline", o.bench_timeline,
      "benchmark: draw the Timeline panel (the run's newest steps, up to 1,024) instead of the Run panel");
  cli.add_flag(
      "--no-textures", o.no_textures,
      "draw heatmaps and the timeline's lanes as rectangles, not textures (the earlier way; to compare "
      "frame times)");
  cli.add_option("--bench-devices", o.bench_devices,
                 "benchmark: draw the Devices panel on N GPUs x --bench-steps samples (made in memory, no "
                 "coordinator) instead of the Run panel")
      ->check(CLI::Range(1, 65536));
  cli.add_flag("--keep-cluster", o.keep_cluster, "leave the local cluster running on exit");
  try {
    cli.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    const int rc = cli.exit(e);
    return rc == 0 ? 0 : kExitBadInput;
  }
  if (o.connect.empty() != o.token_file.empty()) {
    std::fprintf(
        stderr,
        "gantry: --connect and --token-file go together (the URL and token `gantry-engine up` wrote)\n");
    return kExitBadInput;
  }
  const bool bench = o.bench_frames > 0;
  const bool batch = bench || !o.screenshot.empty() || !o.dump_state.empty() || o.frames > 0;
  if (batch && o.frames == 0) o.frames = 1;

  // Everything that can be refused is read before a window or a cluster exists.
  std::vector<ScriptCommand> commands;
  if (!o.script.empty()) {
    bool ok = false;
    const std::string text = file_text_read(o.script, &ok);
    if (!ok) {
      std::fprintf(stderr, "gantry: cannot read the script %s\n", o.script.c_str());
      return kExitBadInput;
    }
    Result<std::vector<ScriptCommand>> parsed = script_parse(text, o.script);
    if (!parsed.ok()) {
      std::fprintf(stderr, "gantry: %s\n", parsed.error().c_str());
      return kExitBadInput;
    }
    commands = std::move(parsed.value());
  }
  std::string token;
  if (!o.connect.empty()) {
    Result<std::string> t = token_file_read(o.token_file);
    if (!t.ok()) {
      std::fprintf(stderr, "gantry: %s\n", t.error().c_str());
      return kExitBadInput;
    }
    token = t.value();
  }
  const bool embedded = o.connect.empty() && !bench;  // the benchmark starts no cluster
  const std::string state_dir = o.state_dir.empty() ? console_state_dir() : o.state_dir;
  std::error_code ec;
  fs::create_directories(state_dir, ec);
  if (ec) {
    std::fprintf(stderr, "gantry: cannot create the state folder %s: %s\n", state_dir.c_str(),
                 ec.message().c_str());
    return kExitBadInput;
  }
  std::string tiny_config;
  // An embedded cluster offers the tiny run by default; a connected console offers it when given one.
  if (embedded || !o.run_config.empty()) {
    const std::string path = o.run_config.empty() ? std::string(GANTRY_CONSOLE_TINY_CONFIG) : o.run_config;
    bool ok = false;
    tiny_config = file_text_read(path, &ok);
    if (!ok) {
      std::fprintf(stderr, "gantry: cannot read the tiny run's config %s\n", path.c_str());
      return kExitBadInput;
    }
  }

  // The display, before anything is started.
  const char* display = std::getenv("DISPLAY");
  const char* wayland = std::getenv("WAYLAND_DISPLAY");
  if ((display == nullptr || display[0] == '\0') && (wayland == nullptr || wayland[0] == '\0')) {
    std::fprintf(stderr, kNoDisplay, "DISPLAY is not set");
    return kExitBadInput;
  }
  glfwSetErrorCallback(glfw_error);
  if (!glfwInit()) {
    std::fprintf(stderr, kNoDisplay, "glfwInit failed");
    return kExitBadInput;
  }
  glfwWindowHint(GLFW_CONTEXT_VERSION_MAJOR, 3);
  glfwWindowHint(GLFW_CONTEXT_VERSION_MINOR, 0);
  GLFWwindow* window = glfwCreateWindow(o.width, o.height, "Gantry", nullptr, nullptr);
  if (window == nullptr) {
    glfwTerminate();
    std::fprintf(stderr, kNoDisplay, "no OpenGL 3 window could be created");
    return kExitBadInput;
  }
  glfwMakeContextCurrent(window);
  glfwSwapInterval(batch ? 0 : 1);

  IMGUI_CHECKVERSION();
  ImGui::CreateContext();
  ImGuiIO& io = ImGui::GetIO();
  // Batch runs (tests, screenshots) lay out from the code's defaults every time; an operator's own
  // arrangement is kept in the state folder.
  const std::string ini = state_dir + "/imgui.ini";
  io.IniFilename = batch ? nullptr : ini.c_str();
  ImGui::StyleColorsDark();
  ImFont* font = nullptr;
  // Latin-1 and the em dash the panels write for a figure that is not known (never a 0).
  static const ImWchar kGlyphs[] = {0x0020, 0x00FF, 0x2014, 0x2014, 0};
  if (fs::exists(GANTRY_CONSOLE_FONT))
    font = io.Fonts->AddFontFromFileTTF(GANTRY_CONSOLE_FONT, 15.0f, nullptr, kGlyphs);
  if (font == nullptr) io.Fonts->AddFontDefault();  // ImGui's own bitmap font when DejaVu is missing
  ImGui_ImplGlfw_InitForOpenGL(window, true);
  ImGui_ImplOpenGL3_Init("#version 130");
  // The heatmaps' and the timeline's cells as textures (ui/plot/texture.h) while this GL context lives.
  ConsoleTextures textures;
  if (!o.no_textures) plot::set_texture_backend(&textures);
  if (bench && o.bench_devices > 0) {
    const int rc = console_bench_devices(window, o.bench_devices, o.bench_steps, o.bench_frames);
    plot::set_texture_backend(nullptr);
    ImGui_ImplOpenGL3_Shutdown();
    ImGui_ImplGlfw_Shutdown();
    ImGui::DestroyContext();
    glfwDestroyWindow(window);
    glfwTerminate();
    return rc;
  }
  if (bench) {
    const int rc = console_bench_frames(window, {.frames = o.bench_frames,
                                                 .ranks = o.bench_ranks,
                                                 .steps = o.bench_steps,
                                                 .history = o.bench_history,
                                                 .engine = console_engine_path(),
                                                 .timeline = o.bench_timeline});
    plot::set_texture_backend(nullptr);
    ImGui_ImplOpenGL3_Shutdown();
    ImGui_ImplGlfw_Shutdown();
    ImGui::DestroyContext();
    glfwDestroyWindow(window);
    glfwTerminate();
    return rc;
  }

  // The data path: an embedded cluster is started on the network thread, so the window shows progress.
  const std::string engine = console_engine_path();
  const std::string cluster_dir = state_dir + "/cluster";
  std::atomic<bool> cluster_started{false};
  std::function<Result<Endpoint>()> endpoint;
  if (embedded) {
    endpoint = [&]() -> Result<Endpoint> {
      bool started = false;
      Result<Endpoint> e = console_cluster_up(engine, cluster_dir, 2, 2, &started);
      cluster_started = started;
      return e;
    };
  } else {
    endpoint = [&]() -> Result<Endpoint> { return Endpoint{o.connect, token}; };
  }
  DataSource source({.cache_path = state_dir + "/console.sqlite",
                     .tiny_config = tiny_config,
                     .tiny_dp = o.tiny_dp,
                     .tiny_max_steps = o.tiny_max_steps,
                     .embedded = embedded},
                    endpoint);
  source.start();
  ConsoleApp app(source);
  ScriptRunner script(std::move(commands));
  // Plot exports (a plot's right-click menu, a script's export_plot) go to STATE/exports.
  plot::PlotExports exports(state_dir + "/exports");
  plot::plot_exports_set_current(&exports);
  ScriptUiFacts facts;

  std::signal(SIGINT, on_signal);
  std::signal(SIGTERM, on_signal);
  int exit_code = 0;
  int frames = 0;
  std::shared_ptr<const ConsoleSnapshot> snap = source.snapshot();
  for (;;) {
    if (batch) {
      glfwPollEvents();
      std::this_thread::sleep_for(std::chrono::milliseconds(15));  // ~60 frames a second, not a busy loop
    } else {
      glfwWaitEventsTimeout(0.1);  // wake for input, or to show what the network brought
    }
    snap = source.snapshot();
    facts.compared_runs = app.compared_runs();
    for (size_t i = facts.exports.size(); i < exports.outcomes().size(); ++i)
      facts.exports.push_back({exports.outcomes()[i].path, exports.outcomes()[i].error});
    ScriptOrders orders = script.step(*snap, app.clicks().targets(), facts);
    if (!orders.export_plot.empty()) exports.request(orders.export_plot, orders.export_path);
    if (orders.submit_tiny) source.request_submit_tiny();
    if (orders.reconnect) source.reconnect();

    ImGui_ImplOpenGL3_NewFrame();
    ImGui_ImplGlfw_NewFrame();
    if (orders.move_mouse || batch) {
      // After the backend read the real pointer, so the script's input wins. Batch runs ignore the
      // pointer altogether: wherever the virtual display left it, it must not hover a plot into the
      // screenshot.
      io.MousePos = orders.move_mouse ? ImVec2(orders.mouse.x, orders.mouse.y) : ImVec2(-FLT_MAX, -FLT_MAX);
      io.MouseDown[0] = orders.move_mouse && orders.mouse_down;
    }
    app.clicks().begin_frame();
    ImGui::NewFrame();
    app.draw(*snap);
    console_render(window);
    ++frames;
    // A plot's PNG: its pixels exist now, after the render and before the swap.
    for (const plot::PngCapture& c : exports.take_captures()) {
      int w = 0, h = 0;
      glfwGetFramebufferSize(window, &w, &h);
      const Status st = console_plot_png_write(c.path, c.min, c.max, w, h);
      exports.finished(c.plot, c.path, st.ok() ? "" : st.message());
    }

    if (script.failed()) {
      std::fprintf(stderr, "gantry: script %s: %s\n", o.script.c_str(), script.failure().c_str());
      exit_code = kExitScriptFailed;
    }
    const bool batch_done = batch && frames >= o.frames && script.done();
    if (batch_done || script.failed()) {
      if (!o.screenshot.empty()) {
        int w = 0, h = 0;
        glfwGetFramebufferSize(window, &w, &h);
        if (Status st = console_screenshot_write(o.screenshot, w, h); !st.ok()) {
          std::fprintf(stderr, "gantry: %s\n", st.message().c_str());
          exit_code = kExitScriptFailed;
        }
      }
      break;
    }
    glfwSwapBuffers(window);

    if (g_interrupted) {
      std::fprintf(stderr, "gantry: interrupted%s%s\n", script.done() ? "" : " at script ",
                   script.current().c_str());
      exit_code = 130;
      break;
    }
    if (glfwWindowShouldClose(window)) {
      // The embedded cluster is ours: ask before stopping it. A remote one is never stopped.
      if (batch || !embedded || !cluster_started) break;
      glfwSetWindowShouldClose(window, GLFW_FALSE);
      app.confirm_close = true;
    }
    if (app.close_confirmed) {
      o.keep_cluster = o.keep_cluster || app.close_keep_cluster;
      break;
    }
  }

  plot::plot_exports_set_current(nullptr);
  const nlohmann::json state = app.state_json(*snap);
  source.stop();  // closes its connections first: an idle one would hold the coordinator's stop
  if (!o.dump_state.empty()) {
    std::ofstream out(o.dump_state);
    out << state.dump(2) << "\n";
    if (!out) {
      std::fprintf(stderr, "gantry: cannot write %s\n", o.dump_state.c_str());
      exit_code = kExitScriptFailed;
    }
  }
  plot::set_texture_backend(nullptr);
  ImGui_ImplOpenGL3_Shutdown();
  ImGui_ImplGlfw_Shutdown();
  ImGui::DestroyContext();
  glfwDestroyWindow(window);
  glfwTerminate();

  if (embedded && cluster_started && !o.keep_cluster) {
    if (Status st = console_cluster_down(engine, cluster_dir); !st.ok()) {
      std::fprintf(stderr, "gantry: %s\n", st.message().c_str());
      if (exit_code == 0) exit_code = kExitScriptFailed;
    }
  } else if (embedded && cluster_started) {
    std::fprintf(stderr,
                 "gantry: the local cluster keeps running (%s); stop it with gantry-engine down --dir %s\n",
                 snap->url.c_str(), cluster_dir.c_str());
  }
  return exit_code;
}
