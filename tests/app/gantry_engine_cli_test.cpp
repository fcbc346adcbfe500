// gantry-engine as a user runs it: exit codes, messages, one line per step, JSON lines, data commands.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>  // parses the --json lines
#include <regex>
#include <sstream>
#include <string>

#include "engine/core/token_shard.h"
#include "tests/app/engine_process.h"
#include "tests/scratch_dir.h"

namespace gantry {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;

using testing_support::Outcome;

Outcome run(const std::string& args) {
  return testing_support::run_engine(args);
}

std::string fresh_dir(const std::string& name) {
  return testing_support::scratch_dir(name).string();
}

// A small config on the synthetic corpus: a few steps take well under a second.
std::string write_small_config(const std::string& dir, const std::string& extra = "") {
  const std::string path = dir + "/small.toml";
  std::ofstream(path)
      << "[model]\nn_layer = 1\nn_head = 2\nn_embd = 16\nvocab_size = 32\nseq_len = 8\n"
         "[train]\nglobal_batch = 4\nmicro_batch = 2\nmax_steps = 6\nval_every = 3\nval_batches = 1\n"
         "checkpoint_every = 3\n"
         "[data]\nsynthetic_train_tokens = 8192\nsynthetic_val_tokens = 1024\n"
      << extra;
  return path;
}

TEST(GantryEngineCli, HelpOnEverySubcommand) {
  for (const char* sub : {"", "train", "data", "data text", "data synthetic"}) {
    Outcome r = run(std::string(sub) + " --help");
    EXPECT_EQ(r.code, 0) << sub;
    EXPECT_THAT(r.out, HasSubstr("Usage")) << sub;
  }
  EXPECT_THAT(run("train --help").out, HasSubstr("--resume"));
}

TEST(GantryEngineCli, NoSubcommandIsAUsageError) {
  Outcome r = run("");
  EXPECT_EQ(r.code, 2);
}

TEST(GantryEngineCli, TrainPrintsOneLinePerStepAndJsonLines) {
  const std::string dir = fresh_dir("train");
  const std::string cfg = write_small_config(dir);
  Outcome r = run("train --config " + cfg + " --out " + dir + "/run --max-steps 4 --json");
  ASSERT_EQ(r.code, 0) << r.err;
  int step_lines = 0;
  std::istringstream err(r.err);
  for (std::string line; std::getline(err, line);) step_lines += line.rfind("step ", 0) == 0;
  EXPECT_EQ(step_lines, 4);
  EXPECT_THAT(r.err, HasSubstr("tok/s"));
  EXPECT_THAT(r.err, HasSubstr("grad norm"));
  std::istringstream out(r.out);
  std::vector<nlohmann::json> steps;
  for (std::string line; std::getline(out, line);) {
    nlohmann::json j = nlohmann::json::parse(line);
    if (j.contains("step") && j.contains("loss") && !j.contains("event")) steps.push_back(j);
  }
  ASSERT_EQ(steps.size(), 4u);
  EXPECT_EQ(steps[0]["step"], 1);
  EXPECT_EQ(steps[3]["step"], 4);
  EXPECT_GT(steps[0]["loss"].get<double>(), 2.0);
  // Base units on every machine-read path: the step's wall time in seconds, the unit in the key.
  EXPECT_GT(steps[0].value("step_s", 0.0), 0.0) << steps[0].dump();
  EXPECT_LT(steps[0].value("step_s", 0.0), 60.0) << steps[0].dump();
  EXPECT_FALSE(steps[0].contains("ms")) << steps[0].dump();
  EXPECT_TRUE(fs::exists(dir + "/run/checkpoints/step_00000004/manifest.json"));
}

// tiny.toml as shipped, with `extra` lines at the top of its [train] section.
std::string tiny_config(const std::string& dir, const std::string& extra) {
  std::string t = testing_support::slurp(GANTRY_TINY_CONFIG);
  const size_t at = t.find("[train]\n");
  EXPECT_NE(at, std::string::npos) << "tiny.toml has no [train] section";
  if (at != std::string::npos) t.insert(at + 8, extra);
  const std::string path = dir + "/tiny.toml";
  std::ofstream(path) << t;
  return path;
}

// MFU on a CPU: without a configured peak it is unknown and says so ("n/a", JSON null), never 0; with
// train.peak_tflops it is a percentage, and the JSON line carries the ratio.
TEST(GantryEngineCli, TrainPrintsMfuNaWithoutAPeakAndAPercentageWithOne) {
  const std::string dir = fresh_dir("mfu");
  const auto json_steps = [](const std::string& out) {
    std::vector<nlohmann::json> steps;
    std::istringstream in(out);
    for (std::string line; std::getline(in, line);) {
      nlohmann::json j = nlohmann::json::parse(line);
      if (j.contains("step") && j.contains("loss") && !j.contains("event")) steps.push_back(j);
    }
    return steps;
  };

  Outcome none =
      run("train --config " + tiny_config(dir, "") + " --out " + dir + "/none --max-steps 2 --json");
  ASSERT_EQ(none.code, 0) << none.err;
  EXPECT_THAT(none.err, HasSubstr("| mfu n/a"));
  EXPECT_THAT(none.err, ::testing::Not(HasSubstr("mfu 0.0%")));
  EXPECT_THAT(none.err, HasSubstr("MFU n/a: no dense bf16 peak for a CPU"));
  std::vector<nlohmann::json> steps = json_steps(none.out);
  ASSERT_EQ(steps.size(), 2u);
  ASSERT_TRUE(steps[0].contains("mfu")) << steps[0].dump();
  EXPECT_TRUE(steps[0]["mfu"].is_null()) << steps[0].dump();

  Outcome peak = run("train --config " + tiny_config(dir, "peak_tflops = 0.05\n") + " --out " + dir +
                     "/peak --max-steps 2 --json");
  ASSERT_EQ(peak.code, 0) << peak.err;
  EXPECT_THAT(peak.err, ::testing::ContainsRegex("\\| mfu [0-9]+\\.[0-9]%"));
  EXPECT_THAT(peak.err, ::testing::Not(HasSubstr("mfu n/a")));
  EXPECT_THAT(peak.err, HasSubstr("peak = cpu (configured) 0.05 TFLOP/s"));
  steps = json_steps(peak.out);
  ASSERT_EQ(steps.size(), 2u);
  ASSERT_TRUE(steps[1]["mfu"].is_number()) << steps[1].dump();
  // The arithmetic of DESIGN.md: tokens/s × (6N + 6LdT) ÷ peak, one process; N from the summary line.
  std::smatch m;
  ASSERT_TRUE(std::regex_search(peak.err, m, std::regex("([0-9]+) parameters"))) << peak.err;
  const double params = std::stod(m[1].str());
  const double want = steps[1]["tokens_per_s"].get<double>() * (6 * params + 6.0 * 2 * 64 * 64) / 0.05e12;
  EXPECT_NEAR(steps[1]["mfu"].get<double>(), want, 1e-9 * want) << steps[1].dump();

  // A peak out of range is refused naming the key and the range.
  Outcome bad = run("train --config " + tiny_config(dir, "peak_tflops = -1\n") + " --out " + dir + "/bad");
  EXPECT_EQ(bad.code, 2);
  EXPECT_THAT(bad.err, HasSubstr("train.peak_tflops"));
  EXPECT_THAT(bad.err, HasSubstr("[0, 100000]"));
}

TEST(GantryEngineCli, ResumeContinuesWhereItStopped) {
  const std::string dir = fresh_dir("resume");
  const std::string cfg = write_small_config(dir);
  ASSERT_EQ(run("train --config " + cfg + " --out " + dir + "/run --max-steps 2").code, 0);
  Outcome r = run("train --config " + cfg + " --out " + dir + "/run --resume latest --json");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("\"step\":3"));
  EXPECT_THAT(r.out, ::testing::Not(HasSubstr("\"step\":2,")));
  EXPECT_THAT(r.err, HasSubstr("steps 2..6"));
}

TEST(GantryEngineCli, BadConfigExitsTwoNamingTheKey) {
  const std::string dir = fresh_dir("badcfg");
  Outcome unknown = run("train --config " + write_small_config(dir, "bogus = 1\n"));
  EXPECT_EQ(unknown.code, 2);
  EXPECT_THAT(unknown.err, HasSubstr("unknown key 'data.bogus'"));
  std::ofstream(dir + "/range.toml") << "[optim]\nbeta2 = 1.5\n";
  Outcome range = run("train --config " + dir + "/range.toml");
  EXPECT_EQ(range.code, 2);
  EXPECT_THAT(range.err, HasSubstr("optim.beta2"));
  EXPECT_THAT(range.err, HasSubstr("range.toml:2"));
  Outcome missing = run("train --config " + dir + "/nope.toml");
  EXPECT_EQ(missing.code, 2);
  EXPECT_THAT(missing.err, HasSubstr("nope.toml"));
}

// An empty config, or one without [model], used to train the defaults and exit 0.
TEST(GantryEngineCli, ConfigWithoutARequiredSectionExitsTwoNamingFileAndSection) {
  const std::string dir = fresh_dir("sections");
  std::ofstream(dir + "/empty.toml") << "";
  Outcome empty = run("train --config " + dir + "/empty.toml --out " + dir + "/run");
  EXPECT_EQ(empty.code, 2) << empty.err;
  EXPECT_THAT(empty.err, HasSubstr(dir + "/empty.toml: no [model] section"));
  EXPECT_THAT(empty.err, HasSubstr("n_layer, n_head, n_embd, vocab_size, seq_len"));
  std::ofstream(dir + "/no_model.toml") << "[train]\nmax_steps = 2\n[data]\n";
  Outcome no_model = run("train --config " + dir + "/no_model.toml --out " + dir + "/run");
  EXPECT_EQ(no_model.code, 2) << no_model.err;
  EXPECT_THAT(no_model.err, HasSubstr("no_model.toml: no [model] section"));
  Outcome in_run = run("run --nproc 2 --config " + dir + "/no_model.toml --out " + dir + "/run");
  EXPECT_EQ(in_run.code, 2) << in_run.err;
  EXPECT_THAT(in_run.err, HasSubstr("no [model] section"));
  EXPECT_FALSE(fs::exists(dir + "/run/checkpoints")) << "nothing may have trained";
}

// A 10 MB value used to come back whole in the error (twice for some keys): stderr stays small and still
// names the key.
TEST(GantryEngineCli, HugeConfigValueGivesABoundedMessage) {
  const std::string dir = fresh_dir("huge_value");
  const std::string huge(10u << 20, 'c');
  std::ofstream(dir + "/huge.toml") << "[model]\n[data]\n[train]\nbackend = \"" << huge << "\"\n";
  Outcome r = run("train --config " + dir + "/huge.toml --out " + dir + "/run");
  EXPECT_EQ(r.code, 2);
  EXPECT_LT(r.err.size(), 2048u) << r.err.substr(0, 2048);
  EXPECT_THAT(r.err, HasSubstr("train.backend"));
  EXPECT_THAT(r.err, HasSubstr("(" + std::to_string(huge.size()) + " bytes)"));
  std::ofstream(dir + "/huge_number.toml") << "[model]\n[data]\n[train]\nmax_steps = 1" << huge << "\n";
  Outcome n = run("run --nproc 2 --config " + dir + "/huge_number.toml --out " + dir + "/run");
  EXPECT_EQ(n.code, 2);
  EXPECT_LT(n.err.size(), 2048u) << n.err.substr(0, 2048);
  EXPECT_THAT(n.err, HasSubstr("huge_number.toml:4"));
  // A path no file system accepts used to reach the data code, which quoted it twice (20 MB of stderr).
  std::ofstream(dir + "/huge_dir.toml")
      << "[model]\n[train]\n[data]\nkind = \"shards\"\ndir = \"/tmp/" << huge << "\"\n";
  Outcome d = run("train --config " + dir + "/huge_dir.toml --out " + dir + "/run");
  EXPECT_EQ(d.code, 2);
  EXPECT_LT(d.err.size(), 2048u) << d.err.substr(0, 2048);
  EXPECT_THAT(d.err, HasSubstr("data.dir"));
  EXPECT_THAT(d.err, HasSubstr("allowed at most 4096 bytes"));
}

// CLI11 quotes a flag's bad value whole; the message keeps the flag's name and a bounded excerpt.
TEST(GantryEngineCli, HugeFlagValueGivesABoundedMessage) {
  const std::string dir = fresh_dir("huge_flag");
  const std::string huge(60000, '7');
  Outcome r = run("train --config " + write_small_config(dir) + " --max-steps x" + huge);
  EXPECT_EQ(r.code, 2);
  EXPECT_LT(r.err.size(), 2048u) << r.err.substr(0, 2048);
  EXPECT_THAT(r.err, HasSubstr("--max-steps"));
  Outcome d = run("data synthetic --out " + dir + "/" + huge);
  EXPECT_EQ(d.code, 2);
  EXPECT_LT(d.err.size(), 2048u) << d.err.substr(0, 2048);
  EXPECT_THAT(d.err, HasSubstr("--out"));
}

// Data that cannot be read is bad input like a bad config (exit 2), not a failure while running (1).
TEST(GantryEngineCli, UnreadableDataExitsTwo) {
  const std::string dir = fresh_dir("bad_data");
  const std::string missing = dir + "/missing.toml";
  std::ofstream(missing) << "[model]\nn_layer = 1\nn_head = 2\nn_embd = 16\nvocab_size = 32\nseq_len = 8\n"
                            "[train]\nglobal_batch = 2\nmicro_batch = 2\nmax_steps = 2\nval_every = 0\n"
                            "[data]\nkind = \"shards\"\ndir = \"" +
                                dir + "/no_such_folder\"\n";
  Outcome m = run("train --config " + missing + " --out " + dir + "/run");
  EXPECT_EQ(m.code, 2) << m.err;
  EXPECT_THAT(m.err, HasSubstr("no_such_folder"));
  Outcome mr = run("run --nproc 2 --config " + missing + " --out " + dir + "/run");
  EXPECT_EQ(mr.code, 2) << mr.err;
  EXPECT_THAT(mr.err, HasSubstr("no_such_folder"));

  fs::create_directories(dir + "/garbage");
  std::ofstream(dir + "/garbage/train_000000.bin") << "this is not a token shard";
  std::ofstream(dir + "/garbage/val_000000.bin") << "nor is this";
  const std::string garbage = dir + "/garbage.toml";
  std::ofstream(garbage) << "[model]\nn_layer = 1\nn_head = 2\nn_embd = 16\nvocab_size = 32\nseq_len = 8\n"
                            "[train]\nglobal_batch = 2\nmicro_batch = 2\nmax_steps = 2\nval_every = 0\n"
                            "[data]\nkind = \"shards\"\ndir = \"" +
                                dir + "/garbage\"\n";
  Outcome g = run("train --config " + garbage + " --out " + dir + "/run");
  EXPECT_EQ(g.code, 2) << g.err;
  EXPECT_THAT(g.err, HasSubstr("train_000000.bin"));
  Outcome gr = run("run --nproc 2 --config " + garbage + " --out " + dir + "/run");
  EXPECT_EQ(gr.code, 2) << gr.err;
  EXPECT_THAT(gr.err, HasSubstr("train_000000.bin"));

  Outcome t = run("data text --input " + dir + "/missing.txt --out " + dir + "/shards");
  EXPECT_EQ(t.code, 2) << t.err;
  EXPECT_THAT(t.err, HasSubstr("missing.txt"));
}

TEST(GantryEngineCli, CorruptLatestCheckpointIsRefusedAndTheEarlierOneNamed) {
  const std::string dir = fresh_dir("corrupt");
  const std::string cfg = write_small_config(dir);
  ASSERT_EQ(run("train --config " + cfg + " --out " + dir + "/run").code, 0);  // checkpoints at 3 and 6
  const std::string shard = dir + "/run/checkpoints/step_00000006/shard_r00000.bin";
  fs::resize_file(shard, fs::file_size(shard) / 2);
  Outcome r = run("train --config " + cfg + " --out " + dir + "/run --resume latest");
  EXPECT_EQ(r.code, 5) << "5: the checkpoint is damaged (an older one may load), not bad input (2)";
  EXPECT_THAT(r.err, HasSubstr(shard));
  EXPECT_THAT(r.err, HasSubstr("--resume " + dir + "/run/checkpoints/step_00000003"));
}

TEST(GantryEngineCli, DataTextMakesShardsTheTrainerReads) {
  const std::string dir = fresh_dir("text");
  {
    std::ofstream f(dir + "/corpus.txt");
    for (int i = 0; i < 300; ++i) f << "the quick brown fox jumps over the lazy dog " << i << "\n";
  }
  Outcome r = run("data text --input " + dir + "/corpus.txt --out " + dir + "/shards --val-fraction 0.1");
  ASSERT_EQ(r.code, 0) << r.err;
  Result<TokenShard> train = TokenShard::open(dir + "/shards/train_000000.bin");
  ASSERT_TRUE(train.ok()) << train.error();
  EXPECT_EQ(train->at(0), static_cast<uint32_t>('t'));
  const std::string cfg = dir + "/bytes.toml";
  std::ofstream(cfg) << "[model]\nn_layer = 1\nn_head = 2\nn_embd = 16\nvocab_size = 256\nseq_len = 16\n"
                        "[train]\nglobal_batch = 2\nmicro_batch = 2\nmax_steps = 2\nval_every = 0\n"
                        "[data]\nkind = \"shards\"\ndir = \"" +
                            dir + "/shards\"\n";
  Outcome t = run("train --config " + cfg + " --out " + dir + "/run");
  EXPECT_EQ(t.code, 0) << t.err;
}

TEST(GantryEngineCli, DataSyntheticReportsItsEntropy) {
  const std::string dir = fresh_dir("synthetic");
  Outcome r =
      run("data synthetic --out " + dir + " --vocab 64 --branching 8 --train-tokens 4096 --val-tokens 512");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("entropy: 2.079442"));  // ln 8
  EXPECT_TRUE(fs::exists(dir + "/train_000000.bin"));
  Outcome bad = run("data synthetic --out " + dir + " --vocab 4 --branching 9");
  EXPECT_EQ(bad.code, 2);
  EXPECT_THAT(bad.err, HasSubstr("branching"));
}

}  // namespace
}  // namespace gantry
