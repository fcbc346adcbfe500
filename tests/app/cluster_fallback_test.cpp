// Recovery past a damaged checkpoint, against a real `up` cluster on loopback (two agents, four workers):
// a gang told to resume from a checkpoint whose shard is bit-flipped or truncated exits 5 on every rank
// (the checkpoint is damaged, not bad input), and the coordinator places the run again from the checkpoint
// before it, keeping the damaged one in checkpoints_damaged/ for inspection and saying so in a
// `checkpoint_damaged` event; the run then finishes on the loss curve of a run never disturbed. With every
// checkpoint damaged the run fails, naming each damaged file; so it does after three fallbacks in a row
// (kMaxCheckpointFallbacks), even with an undamaged checkpoint left. Before, the first damaged checkpoint
// failed the run (exit 2, "bad input": not recovered).
#include <signal.h>

#include "engine/core/checkpoint.h"       // checkpoint_list: what the run can still resume from
#include "engine/core/data_cursor_log.h"  // where each generation's ranks went on reading
#include "tests/app/cluster_fixture.h"

namespace gantry {
namespace {

using namespace cluster_testing;  // NOLINT: the fixture and its helpers are this suite's vocabulary

constexpr int64_t kSteps = 20;

// Rank 0's forward is slowed by 100 ms (the arithmetic is the same), so the run is still training when the
// test pauses it.
class ClusterFallback : public ClusterCli {
 protected:
  std::string worker_fault() const override { return "0:slow_forward:100"; }

  // A dp-4 run of kSteps whose config checkpoints every 5 steps (at steps 5, 10, 15, 20, on every rank).
  int64_t submit(const json& extra) {
    return submit_tiny(kSteps, {{"checkpoint_every", 5}}, {{"dp", 4}}, extra);
  }

  fs::path checkpoints(int64_t id) const { return dir_ / "runs" / std::to_string(id) / "checkpoints"; }
  static std::string step_name(int64_t step) {
    char name[32];
    std::snprintf(name, sizeof name, "step_%08lld", static_cast<long long>(step));
    return name;
  }

  // The largest shard of the checkpoint at `step` (every rank reads every shard of a dp run).
  fs::path shard_of(int64_t id, int64_t step) const {
    fs::path best;
    uintmax_t most = 0;
    for (const fs::directory_entry& e : fs::directory_iterator(checkpoints(id) / step_name(step))) {
      if (e.path().filename() == "manifest.json" || !e.is_regular_file()) continue;
      if (e.file_size() > most) most = e.file_size(), best = e.path();
    }
    EXPECT_FALSE(best.empty()) << "no shard in " << (checkpoints(id) / step_name(step));
    return best;
  }

  static void flip_a_bit(const fs::path& file) {
    std::fstream f(file, std::ios::in | std::ios::out | std::ios::binary);
    ASSERT_TRUE(f) << file;
    f.seekg(static_cast<std::streamoff>(fs::file_size(file) / 2));
    char c = 0;
    f.get(c);
    f.seekp(static_cast<std::streamoff>(fs::file_size(file) / 2));
    f.put(static_cast<char>(c ^ 0x10));
  }

  // A run that checkpointed at steps 5 and 10, paused past step 10 (so no newer checkpoint comes), its
  // workers noted.
  void reach_two_checkpoints_and_pause(int64_t* id) {
    *id = submit(json::object());
    ASSERT_GE(*id, 0);
    ASSERT_NO_FATAL_FAILURE(pause_past(*id, 11));
    const std::vector<std::string> have = checkpoint_list(checkpoints(*id).string());
    ASSERT_EQ(have.size(), 2u) << "want the checkpoints of steps 5 and 10 only: " << json(have).dump();
    ASSERT_EQ(checkpoint_dir_step(have[0]), 5);
    ASSERT_EQ(checkpoint_dir_step(have[1]), 10);
  }

  // The run paused once past `step` (so no newer checkpoint comes), its workers noted.
  void pause_past(int64_t id, int64_t step) {
    ASSERT_TRUE(eventually([&] { return last_step(id) >= step; }, 120s)) << run_state(id).dump();
    ASSERT_TRUE(api_->post_json("/v1/runs/" + std::to_string(id) + "/pause", json::object()).ok());
    ASSERT_TRUE(eventually([&] { return run_state(id)["state"] == "paused"; }, 30s)) << run_state(id).dump();
    workers_ = children_of(pids_);
  }

  // Whether a run's state (one read: two reads could see "paused", then "running") is final.
  static bool ended(const json& run) {
    const std::string st = run.value("state", std::string());
    return st == "finished" || st == "failed" || st == "stopped" || st == "interrupted";
  }

  // Rank 1 killed with -9 (the gang fails and the coordinator's recovery begins), then the run's final
  // state once it has one (the new workers noted); an empty object, and a failure, when it has none in time.
  json kill_rank_1_and_wait_for_the_end(int64_t id) {
    const pid_t victim = pid_of_rank(workers_, 1);
    EXPECT_GT(victim, 0) << "no worker with RANK=1";
    if (victim <= 0 || ::kill(victim, SIGKILL) != 0) return json::object();
    json state;
    const bool done = eventually(
        [&] {
          state = run_state(id);
          return ended(state);
        },
        180s);
    workers_ = children_of(pids_);
    EXPECT_TRUE(done) << state.dump();
    return done ? state : json::object();
  }
};

TEST_F(ClusterFallback, ADamagedNewestCheckpointFallsBackToTheOneBeforeOnTheSameLossCurve) {
  const int64_t ref = submit({{"max_restarts", 0}});
  ASSERT_GE(ref, 0);
  ASSERT_TRUE(eventually([&] { return run_state(ref)["state"] != "running"; }, 120s))
      << run_state(ref).dump();
  ASSERT_EQ(run_state(ref)["state"], "finished") << run_state(ref).dump();

  int64_t id = -1;
  ASSERT_NO_FATAL_FAILURE(reach_two_checkpoints_and_pause(&id));
  const fs::path bad = shard_of(id, 10);
  ASSERT_NO_FATAL_FAILURE(flip_a_bit(bad));
  const std::string bad_bytes = slurp(bad.string());
  const json state = kill_rank_1_and_wait_for_the_end(id);
  ASSERT_EQ(state.value("state", ""), "finished") << state.dump();
  EXPECT_EQ(state["last_step"], kSteps);
  EXPECT_EQ(state["generation"], 3) << "the first, the recovery from step 10, the fallback to step 5";

  // Every step's loss, bit for bit, as the run never disturbed: the fallback is a normal resume from step 5
  // (parameters, optimizer state, data cursor).
  const std::map<int64_t, double> want = losses(ref), got = losses(id);
  ASSERT_EQ(want.size(), static_cast<size_t>(kSteps));
  ASSERT_EQ(got.size(), want.size());
  for (const auto& [step, loss] : want) EXPECT_EQ(got.at(step), loss) << "step " << step;
  // And the data cursor: the committed history read each step's batch once, the same samples rank by rank
  // as the undisturbed run (a resume one batch off fails it, naming the step).
  const auto history = [&](int64_t run) {
    Result<DataCursorHistory> h = data_cursor_read((dir_ / "runs" / std::to_string(run)).string());
    EXPECT_TRUE(h.ok()) << h.error();
    return h.ok() ? h.value() : DataCursorHistory{};
  };
  const DataCursorHistory want_cursor = history(ref), got_cursor = history(id);
  const Status cursor_ok = data_cursor_check(got_cursor, kSteps, /*tiny.toml's global_batch*/ 16, {});
  EXPECT_TRUE(cursor_ok.ok()) << cursor_ok.message();
  EXPECT_EQ(got_cursor.steps, want_cursor.steps);

  // One event names the damaged file, where it is kept, and the step it fell back to.
  const std::vector<json> damaged = events(id, "checkpoint_damaged");
  ASSERT_EQ(damaged.size(), 1u) << json(damaged).dump(1);
  const std::string message = damaged[0]["message"].get<std::string>();
  EXPECT_THAT(message, HasSubstr(bad.string())) << message;
  EXPECT_THAT(message, HasSubstr("is corrupt")) << message;
  EXPECT_THAT(message, HasSubstr("falls back to the checkpoint at step 5")) << message;
  const json payload = json::parse(damaged[0]["payload"].get<std::string>());
  EXPECT_EQ(payload["step"], 10) << payload.dump();
  EXPECT_EQ(payload["fallback_step"], 5) << payload.dump();
  EXPECT_EQ(payload["source"], "disk") << payload.dump();
  ASSERT_TRUE(payload["moved_to"].is_string()) << payload.dump();
  EXPECT_THAT(message, HasSubstr("kept for inspection in " + payload["moved_to"].get<std::string>()));

  // The damaged checkpoint is kept as it was, out of the way of the generation that wrote step 10 again.
  const fs::path kept = fs::path(payload["moved_to"].get<std::string>()) / bad.filename();
  ASSERT_TRUE(fs::exists(kept)) << kept;
  EXPECT_TRUE(slurp(kept.string()) == bad_bytes) << kept << " is not the damaged shard as it was";
  EXPECT_TRUE(fs::exists(fs::path(payload["moved_to"].get<std::string>()) / "manifest.json"));
  EXPECT_TRUE(slurp(bad.string()) != bad_bytes) << "step 10 was not written again";
  const json run = run_state(id);
  EXPECT_EQ(run["damaged_checkpoints"].size(), 1u) << run.dump();
}

TEST_F(ClusterFallback, EveryCheckpointDamagedFailsTheRunNamingEachOne) {
  int64_t id = -1;
  ASSERT_NO_FATAL_FAILURE(reach_two_checkpoints_and_pause(&id));
  const fs::path bad10 = shard_of(id, 10), bad5 = shard_of(id, 5);
  fs::resize_file(bad10, fs::file_size(bad10) - 100);  // truncated
  ASSERT_NO_FATAL_FAILURE(flip_a_bit(bad5));
  const json state = kill_rank_1_and_wait_for_the_end(id);
  ASSERT_EQ(state.value("state", ""), "failed") << state.dump();
  const std::string message = state["message"].get<std::string>();
  EXPECT_THAT(message, HasSubstr("no undamaged checkpoint is left")) << message;
  EXPECT_THAT(message, HasSubstr(bad10.string() + "' has")) << message;
  EXPECT_THAT(message, HasSubstr("(truncated)")) << message;
  EXPECT_THAT(message, HasSubstr(bad5.string() + "' is corrupt")) << message;
  // Neither was started over from scratch nor deleted: both are kept.
  EXPECT_EQ(state["generation"], 3) << state.dump();
  EXPECT_TRUE(checkpoint_list(checkpoints(id).string()).empty());
  const fs::path damaged = dir_ / "runs" / std::to_string(id) / "checkpoints_damaged";
  EXPECT_TRUE(fs::exists(damaged / "generation_2" / step_name(10) / bad10.filename())) << damaged;
  EXPECT_TRUE(fs::exists(damaged / "generation_3" / step_name(5) / bad5.filename())) << damaged;
  EXPECT_EQ(events(id, "checkpoint_damaged").size(), 1u);
}

// The fallbacks stop at kMaxCheckpointFallbacks (3) in a row, though an undamaged checkpoint is left: the
// newest four of a run checkpointed every step are damaged, the recovery falls back past three of them and
// then fails the run, naming all four.
TEST_F(ClusterFallback, FourDamagedInARowStopAfterThreeFallbacks) {
  const int64_t id = submit_tiny(kSteps, {{"checkpoint_every", 1}, {"keep_checkpoints", 10}}, {{"dp", 4}});
  ASSERT_GE(id, 0);
  ASSERT_NO_FATAL_FAILURE(pause_past(id, 5));
  // Writes are asynchronous: the checkpoint of the step the run paused after may commit after the pause.
  std::vector<std::string> have;
  ASSERT_TRUE(eventually(
      [&] {
        have = checkpoint_list(checkpoints(id).string());
        return !have.empty() && checkpoint_dir_step(have.back()) == last_step(id);
      },
      30s))
      << json(have).dump() << run_state(id).dump();
  ASSERT_GE(have.size(), 5u) << json(have).dump();
  std::vector<fs::path> bad;  // newest first
  for (size_t k = 1; k <= 4; ++k) {
    bad.push_back(shard_of(id, checkpoint_dir_step(have[have.size() - k])));
    ASSERT_NO_FATAL_FAILURE(flip_a_bit(bad.back()));
  }
  const json state = kill_rank_1_and_wait_for_the_end(id);
  ASSERT_EQ(state.value("state", ""), "failed") << state.dump();
  const std::string message = state["message"].get<std::string>();
  EXPECT_THAT(message, HasSubstr("4 damaged checkpoints in a row (at most 3 fallbacks)")) << message;
  for (const fs::path& b : bad) EXPECT_THAT(message, HasSubstr(b.string() + "' is corrupt")) << message;
  EXPECT_EQ(state["generation"], 5) << "the first, the recovery, three fallbacks: " << state.dump();
  EXPECT_EQ(state["damaged_checkpoints"].size(), 4u) << state.dump();
  EXPECT_EQ(events(id, "checkpoint_damaged").size(), 3u);
  EXPECT_EQ(checkpoint_list(checkpoints(id).string()).size(), have.size() - 4) << "the older ones are left";
}

}  // namespace
}  // namespace gantry
