// The rules of ../shared/DESIGN.md and CONVENTIONS.md that a reader of the source can check, checked on
// every file of the tree:
//   - the arrows: each folder includes only the folders it may use (app → ui → {engine/cluster's client,
//     engine/plan, storage, telemetry}; engine/cluster → {engine/core, storage, telemetry};
//     engine/core → telemetry; engine/plan → telemetry; storage → telemetry; telemetry → nothing), and
//     the console never includes the cluster's server side;
//   - tests make scratch directories only through tests/scratch_dir.h, so that no two test processes
//     share one (ctest runs them in parallel and in random order).
// Every include path is checked as the preprocessor would see it (`#include "folder/file.h"`), so a
// wrong arrow fails here, in CI, before it becomes a link error on another machine.
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <string_view>
#include <vector>

namespace gantry {
namespace {

namespace fs = std::filesystem;

// The layers of the tree, most specific prefix first (engine/core before engine).
struct Layer {
  std::string_view folder;
  std::vector<std::string_view> may_use;  // besides itself
};

const std::vector<Layer>& layers() {
  static const std::vector<Layer> table = {
      {"telemetry/", {}},
      {"engine/core/", {"telemetry/"}},
      {"engine/plan/", {"telemetry/"}},
      {"storage/", {"telemetry/"}},
      {"engine/cluster/", {"engine/core/", "storage/", "telemetry/"}},
      {"ui/", {"engine/cluster/", "engine/plan/", "storage/", "telemetry/"}},
      {"app/", {"ui/", "engine/cluster/", "engine/core/", "engine/plan/", "storage/", "telemetry/"}},
  };
  return table;
}

// engine/cluster's server side: what the console must never see (it links the client library only).
bool cluster_server_header(std::string_view path) {
  static constexpr std::array<std::string_view, 7> kServer = {
      "engine/cluster/coordinator",      "engine/cluster/agent",         "engine/cluster/http_server",
      "engine/cluster/connection_gate",  "engine/cluster/ingest_writer", "engine/cluster/straggler_watch",
      "engine/cluster/checkpoint_policy"};
  return std::any_of(kServer.begin(), kServer.end(), [&](std::string_view s) { return path.starts_with(s); });
}

const Layer* layer_of(std::string_view path) {
  for (const Layer& l : layers())
    if (path.starts_with(l.folder)) return &l;
  return nullptr;
}

bool source_file(const fs::path& p) {
  const std::string ext = p.extension().string();
  return ext == ".h" || ext == ".cpp" || ext == ".cu" || ext == ".cuh";
}

std::vector<std::string> files_under(const std::string& folder) {
  std::vector<std::string> out;
  const fs::path root(GANTRY_SOURCE_DIR);
  if (!fs::exists(root / folder)) return out;
  for (const fs::directory_entry& e : fs::recursive_directory_iterator(root / folder)) {
    if (e.is_regular_file() && source_file(e.path())) out.push_back(fs::relative(e.path(), root).string());
  }
  std::sort(out.begin(), out.end());
  return out;
}

// The project includes of a file: the quoted path of each `#include "..."` line, with its line number.
std::vector<std::pair<int, std::string>> quoted_includes(const std::string& rel) {
  std::ifstream in(fs::path(GANTRY_SOURCE_DIR) / rel);
  std::vector<std::pair<int, std::string>> out;
  std::string line;
  for (int n = 1; std::getline(in, line); ++n) {
    std::string_view v(line);
    while (!v.empty() && (v.front() == ' ' || v.front() == '\t')) v.remove_prefix(1);
    if (!v.starts_with("#include \"")) continue;
    v.remove_prefix(10);
    const size_t end = v.find('"');
    if (end != std::string_view::npos) out.emplace_back(n, std::string(v.substr(0, end)));
  }
  return out;
}

TEST(SourceRules, EveryIncludeFollowsTheArrows) {
  std::vector<std::string> wrong;
  size_t checked = 0;
  for (const Layer& from : layers()) {
    for (const std::string& file : files_under(std::string(from.folder))) {
      if (layer_of(file) != &from) continue;  // a more specific layer owns it
      for (const auto& [line, inc] : quoted_includes(file)) {
        const Layer* to = layer_of(inc);
        if (to == nullptr) continue;  // a file of its own folder, named relatively, or not ours
        ++checked;
        const bool allowed = to == &from || std::find(from.may_use.begin(), from.may_use.end(), to->folder) !=
                                                from.may_use.end();
        if (!allowed) {
          wrong.push_back(file + ":" + std::to_string(line) + ": " + std::string(from.folder) +
                          " may not use " + inc);
        } else if (from.folder == "ui/" && cluster_server_header(inc)) {
          wrong.push_back(file + ":" + std::to_string(line) +
                          ": the console uses the cluster's client only, not " + inc);
        }
      }
    }
  }
  EXPECT_GT(checked, 100u) << "too few includes found under " << GANTRY_SOURCE_DIR;
  std::ostringstream msg;
  for (const std::string& w : wrong) msg << "  " << w << "\n";
  EXPECT_TRUE(wrong.empty()) << wrong.size() << " includes break DESIGN.md's arrows:\n" << msg.str();
}

TEST(SourceRules, TestsMakeScratchDirectoriesThroughOneHelper) {
  std::vector<std::string> wrong;
  for (const std::string& file : files_under("tests")) {
    // The fuzz targets and the benchmarks are not ctest cases (no GoogleTest, run one at a time).
    if (file.starts_with("tests/fuzz/") || file.starts_with("tests/bench/") ||
        file == "tests/scratch_dir.h" || file == "tests/source_rules_test.cpp") {
      continue;
    }
    std::ifstream in(fs::path(GANTRY_SOURCE_DIR) / file);
    std::string line;
    for (int n = 1; std::getline(in, line); ++n) {
      for (std::string_view call : {"TempDir()", "temp_directory_path(", "mkdtemp("}) {
        if (line.find(call) != std::string::npos) {
          wrong.push_back(file + ":" + std::to_string(n) + ": " + std::string(call));
        }
      }
    }
  }
  std::ostringstream msg;
  for (const std::string& w : wrong) msg << "  " << w << "\n";
  EXPECT_TRUE(wrong.empty())
      << "scratch paths made outside tests/scratch_dir.h (use testing_support::scratch_dir, "
         "unique to the test and the process):\n"
      << msg.str();
}

}  // namespace
}  // namespace gantry
