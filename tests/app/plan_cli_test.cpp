// gantry-engine plan as a user runs it: the table, --json with its buckets, --search's top N, exit code 2
// with the flag named for bad input.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>  // parses --json
#include <sstream>
#include <string>
#include <thread>  // hardware_concurrency: the copies --measure-cpu runs
#include <utility>
#include <vector>

#include "tests/app/engine_process.h"
#include "tests/scratch_dir.h"

namespace gantry {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

using testing_support::Outcome;

Outcome run(const std::string& args) {
  return testing_support::run_engine("plan " + args);
}

// Sets `key = value` in a TOML text whose line for `key` exists (the tiny config's).
void set_config_key(std::string& toml, const std::string& key, const std::string& value) {
  const size_t at = toml.find(key + " = ");
  ASSERT_NE(at, std::string::npos) << key;
  toml.replace(at, toml.find('\n', at) - at, key + " = " + value);
}

// (global rank, memory_bytes()) of every step record a `run --json-ranks` printed.
std::vector<std::pair<int, uint64_t>> rank_memory(const std::string& out) {
  std::vector<std::pair<int, uint64_t>> ranks;
  std::istringstream lines(out);
  for (std::string line; std::getline(lines, line);) {
    const nlohmann::json j = nlohmann::json::parse(line, nullptr, false);
    if (j.is_object() && j.contains("rank_step")) {
      ranks.emplace_back(j["rank_step"]["rank"].get<int>(),
                         j["rank_step"]["mem_allocated_bytes"].get<uint64_t>());
    }
  }
  return ranks;
}

// Issue 17, planner beside measurement: the gantry-cpu profile's memory per rank at tp, dp, pp and tp x pp is
// what the real ranks of `gantry-engine run` allocate (the largest of their step records'
// mem_allocated_bytes), byte for byte.
TEST(PlanCli, CpuProfileMemoryIsWhatTheRanksAllocateAtTpAndDp) {
  const std::filesystem::path dir = testing_support::scratch_dir("plan_cpu_layouts");
  std::string t = testing_support::slurp(GANTRY_TINY_CONFIG);
  for (const char* key : {"checkpoint_every", "val_every"}) set_config_key(t, key, "0");
  const std::string cfg = (dir / "tiny.toml").string();
  std::ofstream(cfg) << t;
  struct Layout {
    std::string run, plan;
    int tp, pp;
  };
  int k = 0;
  for (const Layout& l :
       {Layout{"--nproc 2 --tp 2", "--gpus 2 --tp 2", 2, 1}, Layout{"--nproc 2", "--gpus 2 --dp 2", 1, 1},
        Layout{"--nproc 4 --tp 4", "--gpus 4 --tp 4", 4, 1},
        Layout{"--nproc 2 --pp 2", "--gpus 2 --pp 2", 1, 2},
        Layout{"--nproc 4 --tp 2 --pp 2", "--gpus 4 --tp 2 --pp 2", 2, 2}}) {
    Outcome r = testing_support::run_engine("run " + l.run + " --config " + cfg +
                                            " --max-steps 1 --json-ranks --out " +
                                            (dir / ("run" + std::to_string(k++))).string());
    ASSERT_EQ(r.code, 0) << l.run << ": " << r.err;
    const std::vector<std::pair<int, uint64_t>> ranks = rank_memory(r.out);
    uint64_t measured = 0;
    for (const auto& [rank, bytes] : ranks) measured = std::max(measured, bytes);
    ASSERT_GT(measured, 0u) << r.out;
    Outcome p = run("--engine gantry-cpu --config " + cfg + " " + l.plan + " --json");
    ASSERT_EQ(p.code, 0) << l.plan << ": " << p.err;
    const nlohmann::json mem = nlohmann::json::parse(p.out)["memory"];
    EXPECT_EQ(mem["total"].get<double>(), static_cast<double>(measured)) << l.run;
    // Every rank against its own stage's figure (global rank r is stage (r / tp) % pp).
    ASSERT_EQ(mem["stages"].size(), static_cast<size_t>(l.pp)) << p.out;
    for (const auto& [rank, bytes] : ranks) {
      EXPECT_EQ(mem["stages"][static_cast<size_t>((rank / l.tp) % l.pp)]["total"].get<double>(),
                static_cast<double>(bytes))
          << l.run << ": rank " << rank;
    }
  }
  // What the profile does not model at all is refused by name.
  std::string zb = t;
  zb += "\n";
  const size_t at = zb.find("[train]");
  ASSERT_NE(at, std::string::npos);
  zb.insert(at + 8, "pp_schedule = \"zbh1\"\n");
  const std::string zb_cfg = (dir / "zbh1.toml").string();
  std::ofstream(zb_cfg) << zb;
  // A config's train.pp_schedule = "zbh1" is the plan's schedule (ZB-H1, priced and with its memory).
  Outcome zbh1 = run("--engine gantry-cpu --config " + zb_cfg + " --gpus 2 --pp 2 --json");
  ASSERT_EQ(zbh1.code, 0) << zbh1.err;
  const nlohmann::json zj = nlohmann::json::parse(zbh1.out);
  EXPECT_EQ(zj["layout"]["schedule"], "zbh1");
  EXPECT_DOUBLE_EQ(zj["pipeline"]["bubble_step_fraction"].get<double>(), 1.0 / (3 * 2 + 1));
  EXPECT_FALSE(zj["memory"]["total"].is_null());
  Outcome hsdp = run("--engine gantry-cpu --config " + cfg + " --gpus 2 --zero 1 --hsdp 1 --json");
  EXPECT_EQ(hsdp.code, 2);
  EXPECT_THAT(hsdp.err, HasSubstr("cp and hsdp are not in its table"));
  Outcome overlap = run("--engine gantry-cpu --config " + cfg + " --gpus 2 --tp 2 --tp-overlap 0.5");
  EXPECT_EQ(overlap.code, 2);
  EXPECT_THAT(overlap.err, HasSubstr("tp_overlap"));
}

// Under ZeRO 1-3 (pp 1, tp x dp, pp x dp) and ZB-H1 every rank's memory_bytes() in a real run is the plan's
// figure for its stage and dp rank (memory.stages[s].dp_ranks[d]), exactly: dp 3 with small buckets, whose
// ranks own different shares, included.
TEST(PlanCli, CpuProfileMemoryIsWhatEveryDpRankAllocatesUnderZeroAndZbh1) {
  const std::filesystem::path dir = testing_support::scratch_dir("plan_cpu_zero");
  const std::string tiny = testing_support::slurp(GANTRY_TINY_CONFIG);
  struct Case {
    std::string name;
    int nproc, tp, pp, zero, global_batch, micro_batch;
    std::string schedule, bucket_mb;
  };
  for (const Case& c :
       {Case{"dp3_zero1", 3, 1, 1, 1, 24, 8, "", "0.05"}, Case{"dp2_zero3", 2, 1, 1, 3, 16, 8, "", ""},
        Case{"pp2_zbh1", 2, 1, 2, 0, 16, 8, "zbh1", ""},
        Case{"pp2_dp2_zero2_zbh1", 4, 1, 2, 2, 16, 4, "zbh1", ""},
        Case{"tp2_dp2_zero3", 4, 2, 1, 3, 16, 8, "", ""}}) {
    std::string t = tiny;
    auto set = [&](const std::string& key, const std::string& value) { set_config_key(t, key, value); };
    set("checkpoint_every", "0");
    set("val_every", "0");
    set("global_batch", std::to_string(c.global_batch));
    set("micro_batch", std::to_string(c.micro_batch));
    std::string extra;
    if (!c.schedule.empty()) extra += "pp_schedule = \"" + c.schedule + "\"\n";
    if (!c.bucket_mb.empty()) extra += "dp_bucket_mb = " + c.bucket_mb + "\n";
    t.insert(t.find("[train]") + 8, extra);
    const std::string cfg = (dir / (c.name + ".toml")).string();
    std::ofstream(cfg) << t;
    const std::string layout = " --tp " + std::to_string(c.tp) + " --pp " + std::to_string(c.pp) +
                               " --zero " + std::to_string(c.zero);
    Outcome r =
        testing_support::run_engine("run --nproc " + std::to_string(c.nproc) + layout + " --config " + cfg +
                                    " --max-steps 1 --json-ranks --out " + (dir / c.name).string());
    ASSERT_EQ(r.code, 0) << c.name << ": " << r.err;
    const std::vector<std::pair<int, uint64_t>> ranks = rank_memory(r.out);
    ASSERT_GE(ranks.size(), static_cast<size_t>(c.nproc)) << r.out;
    Outcome p = run("--engine gantry-cpu --config " + cfg + " --gpus " + std::to_string(c.nproc) + layout +
                    " --json");
    ASSERT_EQ(p.code, 0) << c.name << ": " << p.err;
    const nlohmann::json j = nlohmann::json::parse(p.out);
    EXPECT_EQ(j["layout"]["schedule"], c.schedule.empty() ? "1f1b" : c.schedule) << c.name;
    const nlohmann::json& stages = j["memory"]["stages"];
    ASSERT_EQ(stages.size(), static_cast<size_t>(c.pp)) << p.out;
    const int dp = c.nproc / (c.tp * c.pp);
    for (const auto& [rank, bytes] : ranks) {
      // Global rank r: tp innermost, then pp, then dp.
      const nlohmann::json& st = stages[static_cast<size_t>((rank / c.tp) % c.pp)];
      const nlohmann::json& want =
          c.zero >= 1 ? st["dp_ranks"][static_cast<size_t>(rank / (c.tp * c.pp))]["total"] : st["total"];
      EXPECT_EQ(want.get<double>(), static_cast<double>(bytes)) << c.name << ": rank " << rank;
    }
    if (c.name == "dp3_zero1") {
      // The buckets of 0.05 MB do not divide by 3: the ranks' shares, and so their bytes, differ.
      ASSERT_EQ(stages[0]["dp_ranks"].size(), static_cast<size_t>(dp));
      EXPECT_NE(stages[0]["dp_ranks"][0]["total"], stages[0]["dp_ranks"][2]["total"]) << p.out;
    }
  }
}

// Interleaved pipelines (issue 17's pp 4 with vp 2, and pp 2 with vp 2): every rank's memory_bytes() in a
// real run is the plan's figure for its stage (its vp chunks, each with the slots the replayed program
// holds), byte for byte. 8 layers at pp 4 x vp 2 (one block a chunk), 6 at pp 2 x vp 2 (the engine's
// partition gives a rank's two chunks different block counts); 8 and 4 micro-batches a step.
TEST(PlanCli, CpuProfileMemoryIsWhatEveryInterleavedRankAllocates) {
  const std::filesystem::path dir = testing_support::scratch_dir("plan_cpu_interleaved");
  const std::string tiny = testing_support::slurp(GANTRY_TINY_CONFIG);
  struct Case {
    std::string name;
    int pp, layers, micro_batch;
  };
  for (const Case& c : {Case{"pp4_vp2", 4, 8, 2}, Case{"pp2_vp2", 2, 6, 4}}) {
    std::string t = tiny;
    auto set = [&](const std::string& key, const std::string& value) { set_config_key(t, key, value); };
    set("n_layer", std::to_string(c.layers));
    set("checkpoint_every", "0");
    set("val_every", "0");
    set("micro_batch", std::to_string(c.micro_batch));
    t.insert(t.find("[train]") + 8, "pp_schedule = \"interleaved\"\nvp = 2\n");
    const std::string cfg = (dir / (c.name + ".toml")).string();
    std::ofstream(cfg) << t;
    const std::string pp = std::to_string(c.pp);
    Outcome r = testing_support::run_engine("run --nproc " + pp + " --pp " + pp + " --config " + cfg +
                                            " --max-steps 1 --json-ranks --out " + (dir / c.name).string());
    ASSERT_EQ(r.code, 0) << c.name << ": " << r.err;
    const std::vector<std::pair<int, uint64_t>> ranks = rank_memory(r.out);
    ASSERT_EQ(ranks.size(), static_cast<size_t>(c.pp)) << r.out;
    Outcome p = run("--engine gantry-cpu --config " + cfg + " --gpus " + pp + " --pp " + pp + " --json");
    ASSERT_EQ(p.code, 0) << c.name << ": " << p.err;
    const nlohmann::json j = nlohmann::json::parse(p.out);
    EXPECT_EQ(j["layout"]["schedule"], "interleaved") << c.name;
    EXPECT_EQ(j["layout"]["vp"], 2) << c.name;
    const nlohmann::json& stages = j["memory"]["stages"];
    ASSERT_TRUE(stages.is_array()) << p.out;
    ASSERT_EQ(stages.size(), static_cast<size_t>(c.pp)) << p.out;
    double heaviest = 0;
    for (const auto& [rank, bytes] : ranks) {
      EXPECT_EQ(stages[static_cast<size_t>(rank)]["total"].get<double>(), static_cast<double>(bytes))
          << c.name << ": rank " << rank;
      heaviest = std::max(heaviest, static_cast<double>(bytes));
    }
    EXPECT_EQ(j["memory"]["total"].get<double>(), heaviest) << c.name;
    // The table prints it too: the heaviest rank and every rank's row.
    Outcome table = run("--engine gantry-cpu --config " + cfg + " --gpus " + pp + " --pp " + pp);
    ASSERT_EQ(table.code, 0) << table.err;
    EXPECT_THAT(table.out, HasSubstr("memory per pipeline stage"));
    EXPECT_THAT(table.out, HasSubstr("slot of chunk 1"));
    EXPECT_THAT(table.out, Not(HasSubstr("unknown")));
  }
}

// --measure-cpu times this machine's loops and Gloo's collectives (two ranks over loopback) and, with one
// thread, how much of a core a thread gets; the host's other work is an input too. Figures, not bounds.
TEST(PlanCli, MeasureCpuGivesEveryRateAndTheHostsLoadCountsInTheStep) {
  const std::string cfg = GANTRY_TINY_CONFIG;
  Outcome m =
      run("--engine gantry-cpu --config " + cfg + " --measure-cpu --threads 1 --gpus 2 --tp 2 --json");
  ASSERT_EQ(m.code, 0) << m.err;
  const nlohmann::json j = nlohmann::json::parse(m.out);
  for (const char* k : {"dot_flops", "axpy_flops", "attention_flops", "gelu_elements", "layernorm_elements",
                        "softmax_elements", "optimizer_params", "comm_bw"})
    EXPECT_GT(j["cpu_rates"][k].get<double>(), 0) << k;
  EXPECT_GE(j["cpu_rates"]["comm_latency_s"].get<double>(), 0);
  // The collectives' host CPU, by the process's CPU time over real all-reduces (never free), and what the
  // plan makes of it: tp 2's blocking collectives a step and their CPU, the cores' oversubscription.
  EXPECT_GT(j["cpu_rates"]["comm_cpu_step_s"].get<double>(), 0);
  EXPECT_GE(j["cpu_rates"]["comm_cpu_byte_s"].get<double>(), 0);
  EXPECT_GT(j["time"]["cpu"]["collectives"].get<double>(), 0);
  EXPECT_GT(j["time"]["cpu"]["collectives_cpu_s"].get<double>(), 0);
  EXPECT_GE(j["time"]["cpu"]["oversubscription"].get<double>(), 1);
  EXPECT_EQ(j["cpu_rates"]["threads"].get<int>(), 1);
  // At the plan's own shapes (tiny.toml's micro-batch of 8 sequences of 64 tokens), with a copy of the
  // loops per rank running beside the other (up to one a core).
  const int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  EXPECT_EQ(j["cpu_rates"]["measured"]["rows"].get<int>(), 8 * 64);
  EXPECT_EQ(j["cpu_rates"]["measured"]["copies"].get<int>(), std::min(2, cores));
  EXPECT_GE(j["time"]["cpu"]["background_threads"].get<double>(), 0);
  // The default rates, the same layout on 2 cores: three busy threads beside the job's two slow it down.
  Outcome quiet =
      run("--engine gantry-cpu --config " + cfg + " --threads 1 --gpus 2 --tp 2 --cpu-cores 2 --json");
  Outcome busy = run("--engine gantry-cpu --config " + cfg +
                     " --threads 1 --gpus 2 --tp 2 --cpu-cores 2 --cpu-background 3 --json");
  ASSERT_EQ(quiet.code, 0) << quiet.err;
  ASSERT_EQ(busy.code, 0) << busy.err;
  const nlohmann::json q = nlohmann::json::parse(quiet.out), b = nlohmann::json::parse(busy.out);
  EXPECT_FALSE(q["cpu_rates"].contains("measured")) << "the defaults were not measured here";
  EXPECT_EQ(b["time"]["cpu"]["background_threads"].get<double>(), 3);
  EXPECT_DOUBLE_EQ(b["time"]["cpu"]["cores_share"].get<double>(), 2.5);
  EXPECT_DOUBLE_EQ(q["time"]["cpu"]["oversubscription"].get<double>(), 1) << "2 ranks, 2 cores, nothing else";
  EXPECT_DOUBLE_EQ(b["time"]["cpu"]["oversubscription"].get<double>(), 2.5);
  EXPECT_GT(b["time"]["step_s"].get<double>(), q["time"]["step_s"].get<double>());
  Outcome bad = run("--engine gantry-cpu --config " + cfg + " --cpu-cores 0");
  EXPECT_EQ(bad.code, 2);
  EXPECT_THAT(bad.err, HasSubstr("--cpu-cores"));
}

TEST(PlanCli, TablePrintsEverySection) {
  Outcome r =
      run("--model gpt3-175b --gpu a100-80gb --gpus 1024 --tp 8 --pp 16 --vp 2 --recompute full --no-flash "
          "--no-sp --global-batch 1536 --grad-dtype fp32 --mfu-convention megatron");
  ASSERT_EQ(r.code, 0) << r.err;
  for (const char* s :
       {"gpt3-175b on 1024 x a100-80gb (128 nodes of 8)", "174,615,846,912 (exact)", "weights", "gradients",
        "optimizer", "activations", "buffers", "fits", "all-reduce x6 per layer", "send/recv",
        "interleaved, bubble 3.9%", "tokens/s", "MFU", "a100-80gb bf16 dense", "checkpoint", "goodput"}) {
    EXPECT_THAT(r.out, HasSubstr(s)) << r.out;
  }
}

// gantry-cuda at tp x pp (issue 17): every stage's rank in memory.stages (stage 0 holds the embeddings and
// the received wte gradient, the last the wte copy, its gradient and the classifier), the heaviest as the
// plan's memory; 1F1B holds 2 micro-batches a stage at pp 2, GPipe all 8; the table prints the stages.
// What the table does not hold (ZeRO's shards) is refused by name.
TEST(PlanCli, GantryCudaShowsEveryPipelineStagesMemory) {
  const std::string base =
      "--engine gantry-cuda --model gpt2-124m --gpu h100 --gpus 4 --tp 2 --pp 2 "
      "--micro-batch 4 --global-batch 32";
  for (const char* schedule : {"1f1b", "gpipe"}) {
    Outcome r = run(base + " --schedule " + schedule + " --json");
    ASSERT_EQ(r.code, 0) << r.err;
    const nlohmann::json m = nlohmann::json::parse(r.out).at("memory");
    const nlohmann::json& st = m.at("stages");
    ASSERT_EQ(st.size(), 2u) << m;
    double heaviest = 0;
    int heaviest_stage = -1;
    for (size_t s = 0; s < 2; ++s) {
      EXPECT_EQ(st[s].at("stage").get<int>(), static_cast<int>(s));
      // What memory_bytes() counts: all but the 32 MiB cuBLASLt workspace.
      EXPECT_DOUBLE_EQ(st[s].at("total").get<double>() - st[s].at("backend_bytes").get<double>(),
                       32.0 * 1024 * 1024);
      EXPECT_EQ(st[s].at("microbatches_in_flight").get<double>(), std::string(schedule) == "gpipe" ? 8 : 2);
      if (st[s].at("total").get<double>() > heaviest) {
        heaviest = st[s].at("total").get<double>();
        heaviest_stage = static_cast<int>(s);
      }
    }
    // The backend's partition: the last stage also runs the classifier (its forward, input and weight
    // gradients), so it holds fewer of the 12 blocks.
    EXPECT_EQ(st[0].at("layers").get<int>() + st[1].at("layers").get<int>(), 12);
    EXPECT_GT(st[0].at("layers").get<int>(), st[1].at("layers").get<int>());
    EXPECT_NE(st[0].at("total").get<double>(), st[1].at("total").get<double>());
    // Stage 0's state holds its blocks and the embeddings (the last's wte copy is no optimizer state).
    EXPECT_GT(st[0].at("optimizer").get<double>(), st[1].at("optimizer").get<double>());
    EXPECT_DOUBLE_EQ(m.at("total").get<double>(), heaviest);
    EXPECT_EQ(m.at("stage").get<int>(), heaviest_stage);
  }
  Outcome table = run(base);
  ASSERT_EQ(table.code, 0) << table.err;
  EXPECT_THAT(table.out, HasSubstr("memory per pipeline stage"));
  // dp 2 beside tp 2 x pp 2 (a GPU pipeline stage shards at ZeRO 0-3 under every schedule): every stage's
  // gradients change from ZeRO 1 to 2 (their shard and staging: at dp 2 with 25 MiB buckets the staging
  // outweighs the half saved, so they grow), its bf16 weights from 2 to 3; the optimizer's shard is ZeRO 1's
  // throughout (ZeRO 3's buckets are one unit each, so its gradient staging differs from 2's too).
  std::vector<nlohmann::json> by_zero;
  for (int z : {1, 2, 3}) {
    Outcome zr =
        run("--engine gantry-cuda --model gpt2-124m --gpu h100 --gpus 8 --tp 2 --pp 2 --micro-batch 4 "
            "--global-batch 32 --json --zero " +
            std::to_string(z));
    ASSERT_EQ(zr.code, 0) << "zero " << z << ": " << zr.err;
    by_zero.push_back(nlohmann::json::parse(zr.out).at("memory").at("stages"));
    ASSERT_EQ(by_zero.back().size(), 2u);
  }
  for (size_t s = 0; s < 2; ++s) {
    EXPECT_NE(by_zero[1][s].at("gradients").get<double>(), by_zero[0][s].at("gradients").get<double>()) << s;
    EXPECT_NE(by_zero[2][s].at("weights").get<double>(), by_zero[1][s].at("weights").get<double>()) << s;
    for (size_t z : {1, 2})
      EXPECT_EQ(by_zero[z][s].at("optimizer").get<double>(), by_zero[0][s].at("optimizer").get<double>())
          << s;
  }
}

TEST(PlanCli, JsonHasParamsAndNamedMemoryBuckets) {
  Outcome r = run("--model gpt2-124m --gpus 8 --zero 1 --json");
  ASSERT_EQ(r.code, 0) << r.err;
  const nlohmann::json j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j.at("params").get<uint64_t>(), 124475904u);
  const nlohmann::json& m = j.at("memory");
  double sum = 0;
  for (const char* bucket : {"weights", "gradients", "optimizer", "activations", "buffers"}) {
    ASSERT_TRUE(m.contains(bucket)) << bucket;
    EXPECT_GT(m.at(bucket).get<double>(), 0) << bucket;
    sum += m.at(bucket).get<double>();
  }
  EXPECT_NEAR(m.at("total").get<double>(), sum, 1.0);
  EXPECT_TRUE(m.at("fits").get<bool>());
  EXPECT_DOUBLE_EQ(m.at("weights").get<double>(), 2.0 * 124475904);
  EXPECT_DOUBLE_EQ(m.at("optimizer").get<double>(), 12.0 * 124475904 / 8);  // ZeRO-1 over 8
  EXPECT_EQ(j.at("layout").at("dp").get<int>(), 8);
  EXPECT_GT(j.at("tokens_per_s").get<double>(), 0);
  EXPECT_GT(j.at("reliability").at("goodput").get<double>(), 0.9);
  EXPECT_THAT(j.at("mfu_formula").get<std::string>(), HasSubstr("6N + 6LdT"));
}

TEST(PlanCli, SearchPrintsTheTopN) {
  Outcome r = run("--model llama3-8b --gpu h100 --gpus 16 --search --top 3");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("ranked by tokens/s"));
  int rows = 0;
  std::istringstream in(r.out);
  for (std::string line; std::getline(in, line);) {
    int rank = 0, tp = 0, cp = 0, pp = 0;  // a ranked row starts "   1   8   1   2 ..."
    if (std::sscanf(line.c_str(), "%d %d %d %d", &rank, &tp, &cp, &pp) == 4 && rank >= 1) ++rows;
  }
  EXPECT_EQ(rows, 3) << r.out;
  EXPECT_THAT(r.out, HasSubstr("valid layouts evaluated"));

  Outcome j = run("--model llama3-8b --gpu h100 --gpus 16 --search --top 2 --rank goodput --json");
  ASSERT_EQ(j.code, 0) << j.err;
  const nlohmann::json s = nlohmann::json::parse(j.out);
  ASSERT_EQ(s.at("plans").size(), 2u);
  EXPECT_EQ(s.at("rank"), "goodput");
  EXPECT_TRUE(s.at("plans")[0].at("memory").contains("activations"));
  EXPECT_GT(s.at("evaluated").get<int>(), 0);
}

TEST(PlanCli, BadInputExitsTwoNamingTheFlagAndTheAllowedValues) {
  Outcome gpu = run("--gpu v100");
  EXPECT_EQ(gpu.code, 2);
  EXPECT_THAT(gpu.err, HasSubstr("--gpu"));
  EXPECT_THAT(gpu.err, HasSubstr("h100"));
  Outcome model = run("--model gpt5");
  EXPECT_EQ(model.code, 2);
  EXPECT_THAT(model.err, HasSubstr("llama3-405b"));
  Outcome rc = run("--recompute sometimes");
  EXPECT_EQ(rc.code, 2);
  EXPECT_THAT(rc.err, HasSubstr("selective"));
  Outcome tp = run("--gpus 8 --tp 8 --pp 2");
  EXPECT_EQ(tp.code, 2);
  EXPECT_THAT(tp.err, HasSubstr("--tp 8: must be >= 1 and divide heads (12)"));
  Outcome dp = run("--gpus 8 --dp 3");
  EXPECT_EQ(dp.code, 2);
  EXPECT_THAT(dp.err, HasSubstr("--dp 3"));
  Outcome mb = run("--global-batch 12 --micro-batch 4");
  EXPECT_EQ(mb.code, 2);
  EXPECT_THAT(mb.err, HasSubstr("--global-batch 12: must be a multiple of dp × micro_batch = 8 × 4"));
  Outcome both = run("--global-batch 8 --global-batch-tokens 8192");
  EXPECT_EQ(both.code, 2);
  EXPECT_THAT(both.err, HasSubstr("--global-batch-tokens"));
  EXPECT_EQ(run("--zero 4").code, 2);
  EXPECT_EQ(run("--help").code, 0);
}

TEST(PlanCli, AModelThatDoesNotFitIsReportedNotAnError) {
  Outcome r = run("--model llama3-70b --gpus 8 --json");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_FALSE(nlohmann::json::parse(r.out).at("memory").at("fits").get<bool>());
  Outcome s = run("--model llama3-405b --gpu a100-40gb --gpus 8 --search");
  EXPECT_EQ(s.code, 1);  // nothing fits: ran, found nothing
  EXPECT_THAT(s.err, HasSubstr("no layout fits"));
}

}  // namespace
}  // namespace gantry
