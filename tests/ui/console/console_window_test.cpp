// The console in a real window: `gantry` under Xvfb (xvfb-run), with Mesa's OpenGL, against a real
// cluster. The screenshot's plot areas must show drawn data (not the plot background), the state dump
// must list the panels and non-empty series, and a scripted click on "Checkpoint now" must produce a
// checkpoint that the coordinator's API reports. No process may outlive the test.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <stb_image.h>  // stbi_load (Debian's libstb): reading the screenshot back

#include <map>
#include <nlohmann/json.hpp>
#include <regex>
#include <set>
#include <sstream>

#include "engine/cluster/http_client.h"
#include "engine/cluster/token.h"
#include "tests/ui/console/xvfb_console.h"

namespace gantry::console {
namespace {

using json = nlohmann::json;
using namespace std::chrono_literals;
using namespace testing_support;
using ::testing::HasSubstr;

struct Image {
  int w = 0, h = 0;
  std::vector<unsigned char> rgba;
  const unsigned char* at(int x, int y) const { return &rgba[(static_cast<size_t>(y) * w + x) * 4]; }
};

Image load_png(const fs::path& p) {
  Image img;
  int n = 0;
  unsigned char* data = stbi_load(p.c_str(), &img.w, &img.h, &n, 4);
  if (data != nullptr) {
    img.rgba.assign(data, data + static_cast<size_t>(img.w) * img.h * 4);
    stbi_image_free(data);
  }
  return img;
}

// Within a rectangle: how many pixels differ from the rectangle's most common colour (its background),
// and how many are close to `colour` (a series' line colour).
struct Census {
  size_t pixels = 0, off_background = 0, of_colour = 0;
};
Census census(const Image& img, const json& rect, const unsigned char colour[3]) {
  const int x0 = std::max(0, static_cast<int>(rect[0].get<double>()) + 1);
  const int y0 = std::max(0, static_cast<int>(rect[1].get<double>()) + 1);
  const int x1 = std::min(img.w, static_cast<int>(rect[2].get<double>()) - 1);
  const int y1 = std::min(img.h, static_cast<int>(rect[3].get<double>()) - 1);
  std::map<uint32_t, size_t> counts;
  for (int y = y0; y < y1; ++y)
    for (int x = x0; x < x1; ++x) {
      const unsigned char* p = img.at(x, y);
      ++counts[static_cast<uint32_t>(p[0]) << 16 | static_cast<uint32_t>(p[1]) << 8 | p[2]];
    }
  Census c;
  size_t most = 0;
  for (const auto& [rgb, n] : counts) {
    c.pixels += n;
    most = std::max(most, n);
  }
  c.off_background = c.pixels - most;
  for (int y = y0; y < y1; ++y)
    for (int x = x0; x < x1; ++x) {
      const unsigned char* p = img.at(x, y);
      if (std::abs(p[0] - colour[0]) < 40 && std::abs(p[1] - colour[1]) < 40 &&
          std::abs(p[2] - colour[2]) < 40)
        ++c.of_colour;
    }
  return c;
}

const json* series_named(const json& state, const std::string& name) {
  for (const json& s : state["series"])
    if (s["name"] == name) return &s;
  return nullptr;
}

TEST(ConsoleWindow, NoDisplayPointsToTheHeadlessCommands) {
  const fs::path dir = scratch_dir("console_nodisplay");
  const int code = run_shell("env -u DISPLAY -u WAYLAND_DISPLAY " + std::string(GANTRY_BIN " --state-dir ") +
                             dir.string() + " </dev/null >/dev/null 2>" + (dir / "err").string());
  EXPECT_EQ(code, 2);
  const std::string err = slurp(dir / "err");
  EXPECT_THAT(err, HasSubstr("cannot open a window"));
  EXPECT_THAT(err, HasSubstr("gantry-engine up"));
  EXPECT_THAT(err, HasSubstr("gantry-engine ctl"));
  EXPECT_FALSE(fs::exists(dir / "cluster" / "url")) << "a cluster was started without a window to show it";
}

TEST(ConsoleWindow, BadInputIsRefusedBeforeAnythingStarts) {
  const fs::path dir = scratch_dir("console_badinput");
  std::ofstream(dir / "bad.script") << "wait_steps 3\nclick Checkpoint now\n";
  const std::string base = std::string(GANTRY_BIN " --state-dir ") + dir.string();
  EXPECT_EQ(run_shell(base + " --script " + (dir / "bad.script").string() + " 2>" + (dir / "err").string()),
            2);
  EXPECT_THAT(slurp(dir / "err"), HasSubstr("bad.script:2: click takes one argument"));
  EXPECT_EQ(run_shell(base + " --connect http://127.0.0.1:1 2>" + (dir / "err").string()), 2);
  EXPECT_THAT(slurp(dir / "err"), HasSubstr("--connect and --token-file go together"));
  EXPECT_EQ(run_shell(base + " --connect http://127.0.0.1:1 --token-file " + (dir / "none").string() + " 2>" +
                      (dir / "err").string()),
            2);
  EXPECT_THAT(slurp(dir / "err"), HasSubstr("token file"));
  EXPECT_FALSE(fs::exists(dir / "cluster"));
}

// The frame-time benchmark's smoke run (its figures are not judged here): a tiny synthetic run written into
// a history of its own, served by a coordinator of its own, three frames, one JSON line with the figures the
// benchmark promises, and no cluster started in the state folder.
TEST(ConsoleWindow, BenchFramesPrintsOneJsonLine) {
  if (!have_xvfb_run()) GTEST_SKIP() << "xvfb-run is not installed (Debian: xvfb)";
  const fs::path dir = scratch_dir("console_bench");
  const int code = run_shell(
      xvfb_run(dir / "Xauthority") + std::string(GANTRY_BIN " --state-dir ") + dir.string() +
      " --bench-frames 3 --bench-ranks 8 --bench-steps 100 --bench-history " + (dir / "history").string() +
      " </dev/null >" + (dir / "out").string() + " 2>" + (dir / "err").string());
  ASSERT_EQ(code, 0) << slurp(dir / "err");
  const json j = json::parse(slurp(dir / "out"), nullptr, false);
  ASSERT_TRUE(j.is_object()) << slurp(dir / "out");
  EXPECT_EQ(j["frames"], 3);
  EXPECT_EQ(j["ranks"], 8);
  EXPECT_EQ(j["steps"], 100);
  for (const char* k : {"median_ms", "p99_ms", "max_ms", "rss_mb", "first_frame_s"}) {
    ASSERT_TRUE(j.contains(k)) << k;
    EXPECT_GT(j[k].get<double>(), 0.0) << k;
  }
  EXPECT_LE(j["median_ms"].get<double>(), j["p99_ms"].get<double>());
  EXPECT_LE(j["p99_ms"].get<double>(), j["max_ms"].get<double>());
  EXPECT_FALSE(fs::exists(dir / "cluster")) << "the benchmark started a cluster";
}

// Against a cluster the test starts (`--connect`): the run is submitted through the API, the console's
// script clicks "Checkpoint now", and the API then lists the checkpoint and its event.
TEST(ConsoleWindow, ScreenshotStateAndAScriptedCheckpointAgainstARemoteCluster) {
  if (!have_xvfb_run()) GTEST_SKIP() << "xvfb-run is not installed (Debian: xvfb)";
  become_subreaper();
  const fs::path dir = scratch_dir("console_window");
  const UpCluster up = up_cluster(dir, "--nodes 2 --slots 2");
  ASSERT_EQ(up.error, "");
  const fs::path& cluster = up.dir;
  const std::vector<pid_t>& daemons = up.daemons;
  ASSERT_EQ(daemons.size(), 4u);  // the coordinator, its supervisor, two agents
  const std::string& url = up.url;
  std::vector<pid_t> workers;
  int64_t run = -1;
  {
    HttpClient api({.url = url, .token = up.token});
    Result<json> sub = api.post_json(
        "/v1/runs",
        {{"config", slurp(GANTRY_CONSOLE_TINY_CONFIG)}, {"layout", {{"dp", 4}}}, {"name", "window-test"}});
    ASSERT_TRUE(sub.ok()) << sub.error();
    run = sub->at("id").get<int64_t>();
  }

  std::ofstream(dir / "script") << "# as an operator would: watch a few steps, then ask for a checkpoint\n"
                                   "wait_connected\n"
                                   "wait_steps 4\n"
                                   "click \"Checkpoint now\"\n"
                                   "wait_action\n"
                                   "wait_event checkpoint\n"
                                   "wait_steps 8\n"
                                   "export_plot loss " +
                                       (dir / "loss.csv").string() +
                                       "\n"
                                       "export_plot loss " +
                                       (dir / "loss.png").string() +
                                       "\n"
                                       "export_plot heat " +
                                       (dir / "heat.png").string() + "\n";
  const int code =
      run_gantry_in_xvfb("--connect " + url + " --token-file " + (cluster / "token").string() +
                             " --state-dir " + (dir / "state").string() + " --screenshot " +
                             (dir / "out.png").string() + " --frames 20 --dump-state " +
                             (dir / "state.json").string() + " --script " + (dir / "script").string(),
                         dir / "gantry.err");
  EXPECT_EQ(code, 0) << slurp(dir / "gantry.err");
  workers = children_of(daemons);

  // The state: every panel, non-empty series, the steps seen, the run live (a remote run is never stopped).
  json state = json::parse(slurp(dir / "state.json"), nullptr, false);
  ASSERT_FALSE(state.is_discarded()) << slurp(dir / "state.json");
  for (const char* panel :
       {"Cluster", "Run", "Goodput", "Stragglers", "Actions", "Checkpoints", "Events", "What-if", "History"})
    EXPECT_THAT(state["panels"].get<std::vector<std::string>>(), ::testing::Contains(panel));
  // The run's goodput ledger, from the coordinator: a live run's ETTR and its bar.
  EXPECT_EQ(state["goodput"]["have"], true) << state["goodput"].dump();
  EXPECT_EQ(state["goodput"]["known"], true) << state["goodput"].dump();
  EXPECT_TRUE(state["goodput"]["ettr"].is_number()) << state["goodput"].dump();
  EXPECT_GT(state["goodput"]["bar_parts"].get<size_t>(), 0u) << state["goodput"].dump();
  EXPECT_EQ(state["whatif"]["run"], run) << "the what-if form holds the followed run's config";
  EXPECT_GT(state["whatif"]["candidates"].get<size_t>(), 0u);
  EXPECT_EQ(state["history"]["open"], true) << "the history reads the console's cache";
  EXPECT_GE(state["last_step"].get<int64_t>(), 8);
  EXPECT_EQ(state["run"]["id"], run);
  EXPECT_EQ(state["run"]["state"], "running");
  EXPECT_EQ(state["embedded"], false);
  for (const char* name :
       {"loss", "grad norm", "tokens/s", "MFU", "max", "mean", "min", "rank time heatmap"}) {
    const json* s = series_named(state, name);
    ASSERT_NE(s, nullptr) << name << " was not plotted";
    EXPECT_GE((*s)["length"].get<size_t>(), 4u) << name;
  }
  EXPECT_GE(state["events"].value("checkpoint", 0), 1);
  // No in-memory copies in this run (train.memory_copy_every = 0): a dash, never a made-up step.
  EXPECT_EQ(state["memory_copy"]["text"], "\u2014") << state["memory_copy"].dump();
  EXPECT_TRUE(state["memory_copy"]["step"].is_null()) << state["memory_copy"].dump();

  // The screenshot: the loss line (its colour) and the heatmap's cells are drawn over their backgrounds.
  Image img = load_png(dir / "out.png");
  ASSERT_EQ(img.w, 1400);
  ASSERT_EQ(img.h, 900);
  const unsigned char loss_blue[3] = {90, 170, 255};
  // The right half of the loss plot: the legend (a chip of the same blue) sits at the top left.
  json loss_rect = (*series_named(state, "loss"))["rect"];
  loss_rect[0] = (loss_rect[0].get<double>() + loss_rect[2].get<double>()) / 2;
  const Census loss = census(img, loss_rect, loss_blue);
  EXPECT_GT(loss.pixels, 5000u);
  EXPECT_GT(loss.of_colour, 30u) << "no loss line in the loss plot";
  EXPECT_GT(loss.off_background, 60u);
  const Census heat = census(img, (*series_named(state, "rank time heatmap"))["rect"], loss_blue);
  EXPECT_GT(heat.off_background, heat.pixels / 10) << "the heatmap shows no cells";

  // The exported PNGs (issue 21): a real window's pixels read back, the widget's size (its data area and
  // axes: a little larger than the data area the state names), the loss line's blue in the loss plot and
  // cells, not background, in the heatmap.
  const Image loss_png = load_png(dir / "loss.png");
  const json loss_area = (*series_named(state, "loss"))["rect"];
  const double area_w = loss_area[2].get<double>() - loss_area[0].get<double>();
  const double area_h = loss_area[3].get<double>() - loss_area[1].get<double>();
  EXPECT_GE(loss_png.w, area_w) << "loss.png did not decode";
  EXPECT_LE(loss_png.w, area_w + 150);
  EXPECT_GE(loss_png.h, area_h);
  EXPECT_LE(loss_png.h, area_h + 80);
  const json whole = json::array({0, 0, loss_png.w, loss_png.h});
  const Census loss_pixels = census(loss_png, whole, loss_blue);
  EXPECT_GT(loss_pixels.of_colour, 30u) << "no loss line in loss.png";
  EXPECT_GT(loss_pixels.off_background, loss_pixels.pixels / 50) << "loss.png is blank";
  const Image heat_png = load_png(dir / "heat.png");
  ASSERT_GT(heat_png.w, 50) << "heat.png did not decode";
  const Census heat_pixels = census(heat_png, json::array({0, 0, heat_png.w, heat_png.h}), loss_blue);
  EXPECT_GT(heat_pixels.off_background, heat_pixels.pixels / 10) << "heat.png shows no cells";
  // The exported CSV: the loss of each step as the coordinator serves it, steps 1.. in order.
  {
    HttpClient api({.url = url, .token = up.token});
    Result<json> steps = api.get_json("/v1/runs/" + std::to_string(run) + "/steps?after=0&limit=100000");
    ASSERT_TRUE(steps.ok()) << steps.error();
    std::map<int64_t, double> loss_at;
    for (const json& st : steps->at("steps")) loss_at[st["step"].get<int64_t>()] = st["loss"].get<double>();
    std::stringstream csv(slurp(dir / "loss.csv"));
    std::string line;
    ASSERT_TRUE(std::getline(csv, line));
    EXPECT_EQ(line, "step,loss");
    int64_t rows = 0, prev = 0;
    while (std::getline(csv, line)) {
      const size_t comma = line.find(',');
      ASSERT_NE(comma, std::string::npos) << line;
      const int64_t step = std::stoll(line.substr(0, comma));
      EXPECT_GT(step, prev) << "steps out of order: " << line;
      prev = step;
      ASSERT_TRUE(loss_at.count(step)) << "a step the coordinator does not have: " << line;
      EXPECT_EQ(std::stod(line.substr(comma + 1)), loss_at[step]) << line;
      ++rows;
    }
    EXPECT_GE(rows, 8) << "the export was asked for after step 8";
  }

  // Through the API: the console's click is a checkpoint action with its event and a catalog entry.
  {
    HttpClient api({.url = url, .token = up.token});
    Result<json> ckpts = api.get_json("/v1/runs/" + std::to_string(run) + "/checkpoints");
    ASSERT_TRUE(ckpts.ok()) << ckpts.error();
    EXPECT_GE(ckpts->at("checkpoints").size(), 1u);
    std::multiset<std::string> kinds;
    HttpEventStream events({.url = url, .token = up.token});
    std::thread stopper([&] {
      std::this_thread::sleep_for(500ms);  // read what is there; the run is live and the stream would go on
      events.stop();
    });
    Status st = events.run("/v1/runs/" + std::to_string(run) + "/events", [&](const SseEvent& e) {
      json j = json::parse(e.data);
      kinds.insert(j.value("kind", ""));
      if (j.value("kind", "") == "action_requested") {
        EXPECT_THAT(j.value("message", ""), HasSubstr("checkpoint requested"));
      }
      return true;
    });
    stopper.join();
    EXPECT_TRUE(st.ok()) << st.message();
    EXPECT_EQ(kinds.count("action_requested"), 1u);
    EXPECT_EQ(kinds.count("action_checkpoint"), 4u);  // every rank, at one step
    EXPECT_GE(kinds.count("checkpoint"), 1u);
  }

  down_and_expect_gone(cluster, daemons, workers);
}

// The Checkpoints panel shows the followed run's in-memory copies (issue 16): a dp-4 run on two nodes with
// train.memory_copy_every = 2, paused once the coordinator knows a complete set that every rank's ring peer
// holds too; the console's state names that set's step, each rank's own node and its peer, as the API does.
TEST(ConsoleWindow, TheCheckpointsPanelShowsTheInMemoryCopiesAndWhereTheyAre) {
  if (!have_xvfb_run()) GTEST_SKIP() << "xvfb-run is not installed (Debian: xvfb)";
  const fs::path dir = scratch_dir("console_memory");
  const UpCluster up = up_cluster(dir, "--nodes 2 --slots 2");
  ASSERT_EQ(up.error, "");
  const fs::path& cluster = up.dir;
  const std::vector<pid_t>& daemons = up.daemons;
  const std::string& url = up.url;
  HttpClient api({.url = url, .token = up.token});
  std::string config = slurp(GANTRY_CONSOLE_TINY_CONFIG);
  config = std::regex_replace(config, std::regex("\\[train\\]"), "[train]\nmemory_copy_every = 2");
  Result<json> sub =
      api.post_json("/v1/runs", {{"config", config}, {"layout", {{"dp", 4}}}, {"name", "memory"}});
  ASSERT_TRUE(sub.ok()) << sub.error();
  const std::string run = "/v1/runs/" + std::to_string(sub->at("id").get<int64_t>());
  // The newest complete set, with every rank's copy on two nodes (its own and the ring's next).
  auto newest_with_peers = [&]() -> json {
    Result<json> r = api.get_json(run);
    if (!r.ok()) return nullptr;
    json best = nullptr;
    for (const json& c : r->value("memory_copies", json::array())) {
      if (!c.value("complete", false)) continue;
      if (!best.is_null() && best["step"].get<int64_t>() > c["step"].get<int64_t>()) continue;
      best = c;
    }
    if (best.is_null()) return nullptr;
    for (const json& rank : best["ranks"])
      if (rank["nodes"].size() != 2) return nullptr;
    return best;
  };
  ASSERT_TRUE(eventually([&] { return !newest_with_peers().is_null(); }, 120s)) << api.get_json(run)->dump();
  ASSERT_TRUE(api.post_json(run + "/pause", json::object()).ok());
  ASSERT_TRUE(eventually([&] { return api.get_json(run)->value("state", "") == "paused"; }, 60s));
  // Paused after step L: the last copy is of step L rounded down to memory_copy_every; wait until the agents
  // reported it and the ring's peers took it.
  const int64_t paused_at = api.get_json(run)->value("last_step", int64_t{-1});
  const int64_t last_copy = paused_at - paused_at % 2;
  ASSERT_TRUE(eventually(
      [&] {
        const json n = newest_with_peers();
        return !n.is_null() && n["step"] == last_copy;
      },
      60s))
      << "paused at step " << paused_at << ": " << api.get_json(run)->dump();
  const json want = newest_with_peers();

  std::ofstream(dir / "script") << "wait_connected\nwait_state paused\nwait_frames 10\n";
  const int code =
      run_gantry_in_xvfb("--connect " + url + " --token-file " + (cluster / "token").string() +
                             " --state-dir " + (dir / "state").string() + " --frames 5 --dump-state " +
                             (dir / "state.json").string() + " --script " + (dir / "script").string(),
                         dir / "gantry.err");
  EXPECT_EQ(code, 0) << slurp(dir / "gantry.err");
  const json state = json::parse(slurp(dir / "state.json"), nullptr, false);
  ASSERT_FALSE(state.is_discarded());
  EXPECT_THAT(state["panels"].get<std::vector<std::string>>(), ::testing::Contains("Checkpoints"));
  const json& mem = state["memory_copy"];
  EXPECT_EQ(mem["step"], want["step"]) << mem.dump() << " want " << want.dump();
  ASSERT_EQ(mem["shards"].size(), 4u) << mem.dump();
  // dp 4 on two nodes of two slots: each rank's own node from the run's placement, its peer the other node.
  std::map<int, std::string> own;
  const Result<json> placed = api.get_json(run);
  ASSERT_TRUE(placed.ok()) << placed.error();
  for (const json& share : placed->at("placement"))
    for (int k = 0; k < share["ranks"].get<int>(); ++k)
      own[share["first_rank"].get<int>() + k] = share["node"].get<std::string>();
  ASSERT_EQ(own.size(), 4u);
  for (const json& shard : mem["shards"]) {
    const std::string node = own[shard["rank"].get<int>()];
    EXPECT_EQ(shard["node"], node) << mem.dump();
    EXPECT_EQ(shard["peers"], json::array({node == "node-0" ? "node-1" : "node-0"})) << mem.dump();
  }
  EXPECT_THAT(
      mem["text"].get<std::string>(),
      HasSubstr("step " + std::to_string(want["step"].get<int64_t>()) + ": rank 0 " + own[0] + " + peer "));

  std::vector<pid_t> workers = children_of(daemons);
  EXPECT_TRUE(api.post_json(run + "/stop", json::object()).ok());
  down_and_expect_gone(cluster, daemons, workers);
}

// `gantry` with no --connect: it starts its own cluster, submits the tiny run from the script, and on exit
// stops that cluster: nothing it started is left running.
TEST(ConsoleWindow, EmbeddedClusterStartsRunsTheTinyRunAndIsStoppedOnExit) {
  if (!have_xvfb_run()) GTEST_SKIP() << "xvfb-run is not installed (Debian: xvfb)";
  become_subreaper();
  const fs::path dir = scratch_dir("console_embedded");
  std::ofstream(dir / "script") << "wait_connected\nclick \"Submit tiny run\"\nwait_action\nwait_steps 3\n";
  const int code =
      run_gantry_in_xvfb("--state-dir " + dir.string() + " --frames 5 --dump-state " +
                             (dir / "state.json").string() + " --script " + (dir / "script").string(),
                         dir / "gantry.err");
  EXPECT_EQ(code, 0) << slurp(dir / "gantry.err");
  json state = json::parse(slurp(dir / "state.json"), nullptr, false);
  ASSERT_FALSE(state.is_discarded());
  EXPECT_EQ(state["embedded"], true);
  EXPECT_THAT(state["url"].get<std::string>(), HasSubstr("http://127.0.0.1:"));
  EXPECT_EQ(state["nodes"].size(), 2u);
  EXPECT_EQ(state["run"]["name"], "tiny");
  EXPECT_EQ(state["run"]["dp"], 4);
  EXPECT_GE(state["last_step"].get<int64_t>(), 3);
  // `down` ran: the pid files are gone, and so is every process `up` started. This test is their
  // subreaper, so a coordinator, agent or worker that outlived the console would be a child of ours now.
  const fs::path cluster = dir / "cluster";
  EXPECT_TRUE(fs::exists(cluster / "token"));
  EXPECT_TRUE(pid_files(cluster).empty()) << "the embedded cluster was not stopped";
  EXPECT_TRUE(eventually(
      [] {
        while (::waitpid(-1, nullptr, WNOHANG) > 0) {
        }
        return children_of({::getpid()}).empty();
      },
      10s))
      << children_of({::getpid()}).size() << " processes left behind";
}

// An alert rule on a remote cluster fires with no console open; the console shows it as a banner, in
// --dump-state, beside its event.
TEST(ConsoleWindow, AFiringAlertIsShownAsABanner) {
  if (!have_xvfb_run()) GTEST_SKIP() << "xvfb-run is not installed (Debian: xvfb)";
  become_subreaper();
  const fs::path dir = scratch_dir("console_alert");
  const UpCluster up = up_cluster(dir, "--nodes 2 --slots 2");
  ASSERT_EQ(up.error, "");
  const fs::path& cluster = up.dir;
  const std::vector<pid_t>& daemons = up.daemons;
  const std::string& url = up.url;
  {
    HttpClient api({.url = url, .token = up.token});
    // Loss above 0: holds from the first step on.
    Result<json> rule = api.post_json(
        "/v1/alerts", {{"name", "loss_seen"}, {"kind", "threshold"}, {"series", "loss"}, {"above", 0.0}});
    ASSERT_TRUE(rule.ok()) << rule.error();
  }
  // The console submits the run itself: wait_event counts events after the script's last action, and a run
  // submitted before the console started could fire its alert before the script's first frame (a loaded
  // machine), leaving nothing newer to wait for.
  std::ofstream(dir / "script")
      << "wait_connected\nsubmit_tiny\nwait_action\nwait_steps 2\nwait_event alert\n"
         "wait_frames 3\n";
  const int code =
      run_gantry_in_xvfb("--connect " + url + " --token-file " + (cluster / "token").string() +
                             " --state-dir " + (dir / "state").string() + " --frames 5 --dump-state " +
                             (dir / "state.json").string() + " --script " + (dir / "script").string() +
                             " --run-config " + GANTRY_CONSOLE_TINY_CONFIG + " --tiny-dp 2",
                         dir / "gantry.err");
  EXPECT_EQ(code, 0) << slurp(dir / "gantry.err");
  const std::vector<pid_t> workers = children_of(daemons);
  json state = json::parse(slurp(dir / "state.json"), nullptr, false);
  ASSERT_FALSE(state.is_discarded()) << slurp(dir / "state.json");
  ASSERT_EQ(state["alerts_firing"].size(), 1u) << state.dump();
  EXPECT_EQ(state["alerts_firing"][0]["rule"], "loss_seen");
  EXPECT_THAT(state["alerts_firing"][0]["message"].get<std::string>(), HasSubstr("alert loss_seen: loss "));
  EXPECT_EQ(state["events"].value("alert", 0), 1);
  down_and_expect_gone(cluster, daemons, workers);
}

}  // namespace
}  // namespace gantry::console
