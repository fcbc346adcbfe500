// Gantry on a real Slurm cluster (issue 20): munged, slurmctld and two or three slurmd on loopback
// (slurm_fixture.h), assets/slurm/gantry.sbatch submitted with sbatch. The tiny run at 2 nodes x 2 ranks
// trains the loss curve of `gantry-engine run --nproc 4` and the console's feed follows it from the URL and
// token in the job's folder; with 3 nodes for a 2-node layout, a node drained mid-run (scontrol) is
// quarantined, its ranks move to the spare and the run finishes. Skipped where Slurm is not installed.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <regex>
#include <set>

#include "engine/cluster/api_client.h"
#include "engine/cluster/token.h"
#include "tests/app/engine_child.h"
#include "tests/app/slurm_fixture.h"
#include "ui/console/data_source.h"

namespace gantry {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;
using namespace std::chrono_literals;
using ::testing::HasSubstr;
using testing_support::EngineChild;
using testing_support::SlurmCluster;
using testing_support::slurp;

class Slurm : public ::testing::Test {
 protected:
  void SetUp() override {
    if (std::string missing = SlurmCluster::missing_package(); !missing.empty()) GTEST_SKIP() << missing;
    dir_ = testing_support::scratch_dir("slurm");
  }

  void TearDown() override {
    if (HasFailure() && !dir_.empty()) {
      for (const char* f : {"job.out", "job/srun.log", "job/coordinator.log", "job/agent-n1.log",
                            "job/agent-n2.log", "job/agent-n3.log", "slurmctld.log"}) {
        std::fprintf(stderr, "---- %s\n%s\n", f, SlurmCluster::tail(dir_ / f).c_str());
      }
    }
    slurm_.stop();
    EXPECT_TRUE(slurm_.processes().empty()) << "processes of the cluster left behind";
  }

  void start_slurm(int nodes) {
    const Status s = slurm_.start(dir_, nodes);
    ASSERT_TRUE(s.ok()) << s.message();
  }

  // tiny.toml with one thread a rank and no periodic validation or checkpoints (four ranks share two cores).
  // With `small`, testing_support::small_model()'s cheaper shape, for a test that needs only steps.
  fs::path tiny_config(int64_t max_steps, bool small = false) {
    std::string t = slurp(GANTRY_TINY_CONFIG);
    t = std::regex_replace(t, std::regex("max_steps = \\d+"), "max_steps = " + std::to_string(max_steps));
    t = std::regex_replace(t, std::regex("checkpoint_every = \\d+"), "checkpoint_every = 0");
    t = std::regex_replace(t, std::regex("val_every = \\d+"), "val_every = 0");
    t = std::regex_replace(t, std::regex("\\[train\\]"), "[train]\nthreads = 1");
    const fs::path p = dir_ / "tiny.toml";
    std::ofstream(p) << (small ? testing_support::small_model(t) : t);
    return p;
  }

  // sbatch of assets/slurm/gantry.sbatch on `nodes` nodes with `args` for `gantry-engine slurm`; the job id.
  std::string sbatch(int nodes, const std::string& args, const std::string& env = "") {
    testing_support::Outcome o = slurm_.sh(
        "sbatch --parsable --nodes=" + std::to_string(nodes) + " --output=" + (dir_ / "job.out").string() +
            " --chdir=" + dir_.string() + " " + GANTRY_SOURCE_DIR "/assets/slurm/gantry.sbatch " + args,
        "GANTRY_ENGINE=" GANTRY_ENGINE_BIN " GANTRY_JOB_DIR=" + (dir_ / "job").string() + " " + env);
    EXPECT_EQ(o.code, 0) << o.err;
    std::string id = o.out.substr(0, o.out.find_first_of(";\n"));
    EXPECT_FALSE(id.empty()) << o.out << o.err;
    return id;
  }

  bool job_running(const std::string& id) const {
    const std::string s = slurm_.job_state(id).first;
    return s.empty() || s == "PENDING" || s == "RUNNING" || s == "CONFIGURING";
  }

  // The job's end: its Slurm state once it left the queue. `completing_ends`: COMPLETING counts as the end
  // (its batch script has exited; a node whose slurmd is dead holds the job there until it is marked down).
  std::pair<std::string, int> wait_job(const std::string& id, std::chrono::seconds limit,
                                       bool completing_ends = false) {
    std::pair<std::string, int> s;
    SlurmCluster::wait_for(
        [&] {
          s = slurm_.job_state(id);
          return s.first != "PENDING" && s.first != "RUNNING" && s.first != "CONFIGURING" &&
                 (completing_ends || s.first != "COMPLETING") && !s.first.empty();
        },
        limit);
    return s;
  }

  // The pid of node `node`'s agent (the srun task that says SLURMD_NODENAME=node); 0 if none.
  pid_t agent_of(const std::string& node) const {
    for (pid_t p : slurm_.processes("slurm-agent")) {
      std::string env = slurp("/proc/" + std::to_string(p) + "/environ");
      std::replace(env.begin(), env.end(), '\0', '\n');
      if (("\n" + env + "\n").find("\nSLURMD_NODENAME=" + node + "\n") != std::string::npos) return p;
    }
    return 0;
  }

  // The job's coordinator endpoint, from the files `gantry-engine slurm` wrote into the job's folder.
  std::pair<std::string, std::string> endpoint() {
    std::string url = slurp((dir_ / "job" / "url").string());
    url = url.substr(0, url.find('\n'));
    Result<std::string> token = token_file_read((dir_ / "job" / "token").string());
    return {url, token.ok() ? token.value() : ""};
  }

  // The run the job submitted, once it has reached `step` or the job has ended (the caller's checks of the
  // job's end then say why); a fatal failure if no run was submitted.
  void wait_for_run_step(const std::string& job, int64_t step, int64_t* run) {
    ASSERT_TRUE(SlurmCluster::wait_for(
        [&] { return fs::exists(dir_ / "job" / "run_id") || !job_running(job); }, 90s));
    ASSERT_TRUE(fs::exists(dir_ / "job" / "run_id")) << "the run was not submitted";
    const auto [url, token] = endpoint();
    ApiClient live({.url = url, .token = token});
    *run = std::stoll(slurp((dir_ / "job" / "run_id").string()));
    ASSERT_TRUE(SlurmCluster::wait_for(
        [&] {
          Result<json> r = live.run(*run);
          return (r.ok() && r->value("last_step", int64_t{-1}) >= step) || !job_running(job);
        },
        90s));
  }

  // After the job: a coordinator started again on the job's state folder, to read what the run recorded.
  EngineChild reopen(std::unique_ptr<ApiClient>* api) {
    const fs::path url_file = dir_ / "reopened_url";
    EngineChild c =
        EngineChild::start({"coordinator", "--dir", (dir_ / "job" / "coordinator").string(), "--token-file",
                            (dir_ / "job" / "token").string(), "--url-file", url_file.string()});
    EXPECT_TRUE(
        SlurmCluster::wait_for([&] { return slurp(url_file.string()).find('\n') != std::string::npos; }, 20s))
        << c.err();
    std::string url = slurp(url_file.string());
    url = url.substr(0, url.find('\n'));
    *api = std::make_unique<ApiClient>(HttpClientOptions{.url = url, .token = endpoint().second});
    return c;
  }

  static json run_json(ApiClient& api, int64_t run) {
    Result<json> r = api.run(run);
    EXPECT_TRUE(r.ok()) << r.error();
    return r.ok() ? r.value() : json::object();
  }

  static std::map<int64_t, double> losses(ApiClient& api, int64_t run) {
    std::map<int64_t, double> out;
    Result<json> page =
        api.http().get_json("/v1/runs/" + std::to_string(run) + "/steps?after=-1&limit=100000");
    EXPECT_TRUE(page.ok()) << page.error();
    if (page.ok())
      for (const json& s : page->at("steps")) out[s["step"].get<int64_t>()] = s["loss"].get<double>();
    return out;
  }

  fs::path dir_;
  SlurmCluster slurm_;
};

// Bad input, refused before anything starts, each naming what is wrong and what would be right (no Slurm
// needed: the variables are set by hand).
TEST(SlurmCommand, RefusesWhatCannotWorkNamingTheFix) {
  const fs::path dir = testing_support::scratch_dir("input");
  const std::string cfg = GANTRY_TINY_CONFIG;
  for (const char* v : {"SLURM_JOB_ID", "SLURM_JOB_NODELIST", "SLURM_JOB_NUM_NODES", "SLURM_NNODES",
                        "SLURM_NODEID", "SLURM_GPUS_ON_NODE", "SLURMD_NODENAME", "CUDA_VISIBLE_DEVICES"})
    ::unsetenv(v);
  testing_support::Outcome o = testing_support::run_engine("slurm --config " + cfg);
  EXPECT_EQ(o.code, 2);
  EXPECT_THAT(o.err, HasSubstr("not inside a Slurm allocation"));

  ::setenv("SLURM_JOB_ID", "7", 1);
  ::setenv("SLURM_JOB_NODELIST", "n[1-2]", 1);
  ::setenv("SLURM_JOB_NUM_NODES", "2", 1);
  o = testing_support::run_engine("slurm --config " + cfg + " --nodes 3 --dir " + (dir / "job").string());
  EXPECT_EQ(o.code, 2);
  EXPECT_THAT(o.err,
              HasSubstr("--nodes 3 is more than the job's 2 nodes (n[1-2]): ask sbatch for --nodes=3"));
  o = testing_support::run_engine("slurm --config " + cfg + " --submit-json '[1]' --dir " +
                                  (dir / "job").string());
  EXPECT_EQ(o.code, 2);
  EXPECT_THAT(o.err, HasSubstr("is not a JSON object"));
  o = testing_support::run_engine("slurm --config " + (dir / "none.toml").string() + " --dir " +
                                  (dir / "job").string());
  EXPECT_EQ(o.code, 2);
  EXPECT_THAT(o.err, HasSubstr("is missing or empty"));
  o = testing_support::run_engine("slurm --config " + cfg + " --coordinator http://127.0.0.1:1 --dir " +
                                  (dir / "job").string());
  EXPECT_EQ(o.code, 2);
  EXPECT_THAT(o.err, HasSubstr("--coordinator needs --token-file"));

  ASSERT_TRUE(token_file_write((dir / "token").string(), "t0ken-for-the-agent-test").ok());
  const std::string agent = "slurm-agent --coordinator http://127.0.0.1:1 --token-file " +
                            (dir / "token").string() + " --dir " + (dir / "agents").string();
  o = testing_support::run_engine(agent);
  EXPECT_EQ(o.code, 2);
  EXPECT_THAT(o.err, HasSubstr("SLURM_NODEID is not set: run it as an srun task"));
  ::setenv("SLURM_NODEID", "0", 1);
  ::setenv("SLURMD_NODENAME", "n1", 1);
  o = testing_support::run_engine(agent);
  EXPECT_EQ(o.code, 2);
  EXPECT_THAT(o.err,
              HasSubstr("n1: no GPUs from Slurm (SLURM_GPUS_ON_NODE and CUDA_VISIBLE_DEVICES are not "
                        "set): ask sbatch for --gpus-per-node=N (or --gres=gpu:N), or give --slots N"));
}

// The fixture itself: one srun step spans both loopback nodes, each task told which node it is.
TEST_F(Slurm, FixtureSpansTwoNodes) {
  ASSERT_NO_FATAL_FAILURE(start_slurm(2));
  testing_support::Outcome o = slurm_.sh("srun --nodes=2 --ntasks=2 printenv SLURMD_NODENAME");
  ASSERT_EQ(o.code, 0) << o.err;
  std::multiset<std::string> names;
  std::istringstream in(o.out);
  for (std::string n; in >> n;) names.insert(n);
  EXPECT_EQ(names, (std::multiset<std::string>{"n1", "n2"}));
}

// sbatch of the tiny config at 2 nodes x 2 ranks: the job completes, its losses are `run --nproc 4`'s, and
// the console's data source, given the URL and token from the job's folder, follows the run's steps.
TEST_F(Slurm, TinyMatchesNproc4AndConsoleFollows) {
  constexpr int64_t kSteps = 8;
  const fs::path cfg = tiny_config(kSteps);
  testing_support::Outcome ref = testing_support::run_engine("run --nproc 4 --json --config " + cfg.string() +
                                                             " --out " + (dir_ / "ref").string());
  ASSERT_EQ(ref.code, 0) << ref.err;
  std::map<int64_t, double> want;
  std::istringstream lines(ref.out);
  for (std::string line; std::getline(lines, line);) {
    const json j = json::parse(line, nullptr, false);
    if (j.is_object() && j.contains("loss") && j.contains("step"))
      want[j["step"].get<int64_t>()] = j["loss"].get<double>();
  }
  ASSERT_EQ(want.size(), static_cast<size_t>(kSteps)) << ref.out;

  ASSERT_NO_FATAL_FAILURE(start_slurm(2));
  // The first rank slowed a little, so that the run outlives the console's first polls.
  const std::string job =
      sbatch(2, cfg.string() + " --slots 2 --host 127.0.0.1", "GANTRY_TEST_WORKER_FAULT=0:slow_forward:300");
  ASSERT_FALSE(job.empty());

  ASSERT_TRUE(
      SlurmCluster::wait_for([&] { return !endpoint().second.empty() && !endpoint().first.empty(); }, 60s))
      << "no URL and token in the job's folder";
  const auto [url, token] = endpoint();
  console::DataSource source(console::DataSourceOptions{}, [&]() -> Result<console::Endpoint> {
    return console::Endpoint{url, token};
  });
  source.start();
  const bool followed = SlurmCluster::wait_for(
      [&] {
        auto s = source.snapshot();
        return (s->connected && s->run.id >= 0 && s->steps->size() >= 2) || !job_running(job);
      },
      90s);
  auto seen = source.snapshot();
  source.stop();
  EXPECT_TRUE(followed) << "connected " << seen->connected << ", run " << seen->run.id << ", "
                        << seen->steps->size() << " steps; " << seen->error;
  EXPECT_EQ(seen->nodes.size(), 2u);

  const auto [state, code] = wait_job(job, 120s);
  ASSERT_EQ(state, "COMPLETED") << slurp((dir_ / "job.out").string());
  EXPECT_EQ(code, 0);
  EXPECT_THAT(slurp((dir_ / "job.out").string()), HasSubstr("finished at step 8"));
  // Nothing of the job is left: the agents, their workers and the coordinator ended with it.
  EXPECT_TRUE(SlurmCluster::wait_for([&] { return slurm_.processes("gantry-engine").empty(); }, 20s));

  std::unique_ptr<ApiClient> api;
  EngineChild coordinator = reopen(&api);
  const int64_t run = std::stoll(slurp((dir_ / "job" / "run_id").string()));
  const json r = run_json(*api, run);
  EXPECT_EQ(r.value("state", ""), "finished") << r.dump();
  EXPECT_EQ(r.value("layout", json::object()).value("dp", 0), 4) << r.dump();
  // Two ranks on each of the allocation's nodes, as the console saw the run's placement.
  std::map<std::string, int> ranks_on;
  for (const console::ShareView& share : seen->run.placement) ranks_on[share.node] += share.ranks;
  EXPECT_EQ(ranks_on, (std::map<std::string, int>{{"n1", 2}, {"n2", 2}}));
  const std::map<int64_t, double> got = losses(*api, run);
  ASSERT_EQ(got.size(), want.size());
  for (const auto& [step, loss] : want) EXPECT_EQ(got.at(step), loss) << "step " << step;
  // The console saw the same steps while the run lived.
  for (const StepRecord& s : seen->steps->records()) EXPECT_EQ(s.loss, want.at(s.step)) << "step " << s.step;
}

// Three nodes for a 2-node layout: n3 is a hot spare. n2 drained mid-run (an administrator's scontrol) is
// quarantined by `gantry-engine slurm`: the run checkpoints, moves its ranks to n3 and finishes.
TEST_F(Slurm, DrainedNodeMovesToSpare) {
  constexpr int64_t kSteps = 30;
  const fs::path cfg = tiny_config(kSteps);
  ASSERT_NO_FATAL_FAILURE(start_slurm(3));
  const std::string job =
      sbatch(3, cfg.string() + " --nodes 2 --slots 2 --host 127.0.0.1 --watch-interval 0.5",
             "GANTRY_TEST_WORKER_FAULT=0:slow_forward:100");
  ASSERT_FALSE(job.empty());
  int64_t run = -1;
  ASSERT_NO_FATAL_FAILURE(wait_for_run_step(job, 3, &run));
  const auto [url, token] = endpoint();
  ApiClient live({.url = url, .token = token});
  Result<json> cluster = live.cluster();
  ASSERT_TRUE(cluster.ok()) << cluster.error();
  std::map<std::string, std::string> node_state;
  for (const json& n : cluster->at("nodes")) node_state[n["id"]] = n["state"];
  EXPECT_EQ(node_state,
            (std::map<std::string, std::string>{{"n1", "healthy"}, {"n2", "healthy"}, {"n3", "spare"}}));

  testing_support::Outcome drain = slurm_.sh("scontrol update nodename=n2 state=drain reason=test");
  ASSERT_EQ(drain.code, 0) << drain.err;

  const auto [state, code] = wait_job(job, 180s);
  ASSERT_EQ(state, "COMPLETED") << slurp((dir_ / "job.out").string());
  EXPECT_EQ(code, 0);
  const std::string out = slurp((dir_ / "job.out").string());
  EXPECT_THAT(out, HasSubstr("node n2 is draining in Slurm: quarantined"));
  EXPECT_THAT(out, HasSubstr("finished at step 30"));

  std::unique_ptr<ApiClient> api;
  EngineChild coordinator = reopen(&api);
  const json r = run_json(*api, run);
  EXPECT_EQ(r.value("state", ""), "finished") << r.dump();
  EXPECT_EQ(r.value("last_step", int64_t{-1}), kSteps);
  EXPECT_EQ(r.value("layout", json::object()).value("dp", 0), 4) << "the spare kept the run at its dp";
  // The run's events: the quarantine Slurm's drain caused, and the new placement on n1 and the spare n3.
  testing_support::Outcome ev =
      testing_support::run_engine("ctl --json --url " + api->http().options().url + " --token-file " +
                                  (dir_ / "job" / "token").string() + " events " + std::to_string(run));
  ASSERT_EQ(ev.code, 0) << ev.err;
  std::vector<json> placed;
  bool requested = false;
  std::istringstream lines(ev.out);
  for (std::string line; std::getline(lines, line);) {
    const json e = json::parse(line, nullptr, false);
    if (!e.is_object()) continue;
    requested = requested || (e.value("kind", "") == "quarantine_requested" &&
                              e.value("message", "").find("n2") != std::string::npos);
    if (e.value("kind", "") == "quarantine_placed") placed.push_back(e);
  }
  EXPECT_TRUE(requested) << ev.out;
  ASSERT_EQ(placed.size(), 1u) << ev.out;
  const std::string where = placed[0].value("message", "");
  EXPECT_THAT(where, HasSubstr("n3"));
  EXPECT_THAT(where, HasSubstr("n1"));
  EXPECT_THAT(where, ::testing::Not(HasSubstr("n2")));
  const std::map<int64_t, double> got = losses(*api, run);
  for (int64_t k = 1; k <= kSteps; ++k) EXPECT_TRUE(got.count(k)) << "step " << k << " missing";
}

// The time limit's or an operator's SIGTERM to the batch step (the script's --signal=B:TERM@300, or
// `scancel --batch --signal=TERM`): the run checkpoints and stops, the job exits with 130, nothing is left.
TEST_F(Slurm, TermToTheBatchStepStopsTheRunWithACheckpoint) {
  const fs::path cfg = tiny_config(100000);
  ASSERT_NO_FATAL_FAILURE(start_slurm(2));
  const std::string job =
      sbatch(2, cfg.string() + " --slots 2 --host 127.0.0.1", "GANTRY_TEST_WORKER_FAULT=0:slow_forward:100");
  ASSERT_FALSE(job.empty());
  int64_t run = -1;
  ASSERT_NO_FATAL_FAILURE(wait_for_run_step(job, 3, &run));
  testing_support::Outcome term = slurm_.sh("scancel --batch --signal=TERM " + job);
  ASSERT_EQ(term.code, 0) << term.err;

  const auto [state, code] = wait_job(job, 120s);
  EXPECT_EQ(state, "FAILED") << slurp((dir_ / "job.out").string());
  EXPECT_EQ(code, 130);
  EXPECT_THAT(slurp((dir_ / "job.out").string()), HasSubstr("checkpoints and stops"));
  EXPECT_TRUE(SlurmCluster::wait_for([&] { return slurm_.processes("gantry-engine").empty(); }, 20s));

  std::unique_ptr<ApiClient> api;
  EngineChild coordinator = reopen(&api);
  const json r = run_json(*api, run);
  EXPECT_EQ(r.value("state", ""), "stopped") << r.dump();
  Result<json> ckpts = api->checkpoints(run);
  ASSERT_TRUE(ckpts.ok()) << ckpts.error();
  bool committed = false;
  for (const json& c : ckpts->value("checkpoints", json::array()))
    committed = committed || c.value("state", "") == "committed";
  EXPECT_TRUE(committed) << ckpts->dump();
}

// The job's coordinator killed with SIGKILL mid-run: its supervisor starts it again on the same port, it
// re-adopts the gang the agents kept, and the run finishes.
TEST_F(Slurm, AKilledCoordinatorIsStartedAgainAndTheRunFinishes) {
  constexpr int64_t kSteps = 30;
  const fs::path cfg = tiny_config(kSteps);
  ASSERT_NO_FATAL_FAILURE(start_slurm(2));
  const std::string job =
      sbatch(2, cfg.string() + " --slots 2 --host 127.0.0.1", "GANTRY_TEST_WORKER_FAULT=0:slow_forward:100");
  ASSERT_FALSE(job.empty());
  int64_t run = -1;
  ASSERT_NO_FATAL_FAILURE(wait_for_run_step(job, 5, &run));
  const pid_t coordinator = static_cast<pid_t>(std::stol(slurp((dir_ / "job" / "coordinator.pid").string())));
  ASSERT_GT(coordinator, 0);
  ASSERT_EQ(::kill(coordinator, SIGKILL), 0);

  const auto [state, code] = wait_job(job, 180s);
  ASSERT_EQ(state, "COMPLETED") << slurp((dir_ / "job.out").string());
  EXPECT_EQ(code, 0);
  EXPECT_THAT(slurp((dir_ / "job.out").string()), HasSubstr("finished at step 30"));
  EXPECT_THAT(slurp((dir_ / "job" / "coordinator-supervisor.log").string()),
              HasSubstr("was killed by signal 9"));
  EXPECT_TRUE(SlurmCluster::wait_for([&] { return slurm_.processes("gantry-engine").empty(); }, 20s));
}

// Three nodes for a 2-node layout, and n2 crashes mid-run: its slurmd and its agent killed with SIGKILL
// (its workers die with the agent). The step's other agents run on (--no-kill, --kill-on-bad-exit=0), the
// coordinator declares n2 lost, and the run recovers onto n1 and the spare n3 from its newest checkpoint,
// at the same dp, and finishes.
TEST_F(Slurm, CrashedNodeIsLostAndTheSpareTakesItsRanks) {
  constexpr int64_t kSteps = 30;
  const fs::path cfg = tiny_config(kSteps, /*small=*/true);  // steps only: the crash lands at step 7 of 30
  ASSERT_NO_FATAL_FAILURE(start_slurm(3));
  const std::string job = sbatch(
      3,
      cfg.string() + " --nodes 2 --slots 2 --host 127.0.0.1 --submit-json '{\"checkpoint_every_steps\": 5}'",
      "GANTRY_TEST_WORKER_FAULT=0:slow_forward:100");
  ASSERT_FALSE(job.empty());
  int64_t run = -1;
  ASSERT_NO_FATAL_FAILURE(wait_for_run_step(job, 7, &run));
  const auto [url, token] = endpoint();
  ApiClient live({.url = url, .token = token});
  const pid_t n1 = agent_of("n1"), n2 = agent_of("n2"), n3 = agent_of("n3");
  ASSERT_GT(n1, 0);
  ASSERT_GT(n2, 0);
  ASSERT_GT(n3, 0);
  ASSERT_TRUE(slurm_.kill_slurmd(2));
  ASSERT_EQ(::kill(n2, SIGKILL), 0);

  ASSERT_TRUE(SlurmCluster::wait_for(
      [&] {
        Result<json> r = live.run(run);
        return (r.ok() && r->value("restarts", 0) >= 1) || !job_running(job);
      },
      60s));
  // The survivors' agents were left running by Slurm: the same processes as before the crash.
  EXPECT_EQ(::kill(n1, 0), 0);
  EXPECT_EQ(::kill(n3, 0), 0);

  const auto [state, code] = wait_job(job, 180s, /*completing_ends=*/true);
  EXPECT_THAT(state, ::testing::AnyOf("COMPLETED", "COMPLETING")) << slurp((dir_ / "job.out").string());
  EXPECT_EQ(code, 0);
  EXPECT_THAT(slurp((dir_ / "job.out").string()), HasSubstr("finished at step 30"));

  std::unique_ptr<ApiClient> api;
  EngineChild coordinator = reopen(&api);
  const json r = run_json(*api, run);
  EXPECT_EQ(r.value("state", ""), "finished") << r.dump();
  EXPECT_EQ(r.value("layout", json::object()).value("dp", 0), 4) << "the spare kept the run at its dp";
  testing_support::Outcome ev =
      testing_support::run_engine("ctl --json --url " + api->http().options().url + " --token-file " +
                                  (dir_ / "job" / "token").string() + " events " + std::to_string(run));
  ASSERT_EQ(ev.code, 0) << ev.err;
  std::vector<json> placed;
  std::istringstream lines(ev.out);
  for (std::string line; std::getline(lines, line);) {
    const json e = json::parse(line, nullptr, false);
    if (e.is_object() && e.value("kind", "") == "recovery_placed") placed.push_back(e);
  }
  ASSERT_EQ(placed.size(), 1u) << ev.out;
  EXPECT_THAT(placed[0].value("message", ""), HasSubstr("node lost"));
  EXPECT_THAT(placed[0].value("message", ""), HasSubstr("n3"));
}

}  // namespace
}  // namespace gantry
