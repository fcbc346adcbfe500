// Writes the seed corpus of the binary formats from their own encoders, so the seeds are real messages:
// token shards, record batches (binary and JSON), frames, worker frame payloads and a checkpoint
// manifest. The text formats' seeds (API bodies, TOML, token files) are written by hand.
//
//   build-fuzz/tests/fuzz/fuzz_make_seeds tests/fuzz/corpus     # rewrites the generated files only
#include <unistd.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "engine/cluster/agent_beat.h"
#include "engine/core/comm/frame.h"
#include "engine/core/token_shard.h"
#include "engine/core/worker/worker_frames.h"
#include "telemetry/record_codec.h"
#include "telemetry/record_json.h"
#include "tests/fuzz/checkpoint_fixture.h"

namespace gantry::fuzz {
namespace {

namespace fs = std::filesystem;

void write_seed(const fs::path& dir, const std::string& name, const std::string& bytes) {
  fs::create_directories(dir);
  std::ofstream out(dir / name, std::ios::binary | std::ios::trunc);
  out << bytes;
  FUZZ_CHECK(out.good(), "cannot write a seed");
}

std::string text_of(const std::vector<uint8_t>& v) {
  return {v.begin(), v.end()};
}

std::string read_text(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

RecordBatch sample_batch() {
  RecordBatch b;
  RankStepRecord r{.run_id = 3, .step = 42, .rank = 1, .host = "node-a", .device = 0};
  r.phases.forward = 0.012;
  r.phases.backward = 0.024;
  r.phases.comm_exposed = 0.003;
  r.total_s = 0.041;
  r.tokens = 4096;
  r.mem_allocated_bytes = 1u << 30;
  r.mem_peak_bytes = 3u << 29;
  r.temperature_celsius = 61.5;
  r.power_watts = 412.0;
  r.mfu = 0.38;
  r.hfu = 0.43;
  b.rank_steps.push_back(r);
  b.rank_steps.push_back({.run_id = 3, .step = 42, .rank = 2, .host = "node-b"});
  b.steps.push_back({.run_id = 3,
                     .step = 42,
                     .time_unix_s = 1.7e9,
                     .loss = 2.5,
                     .grad_norm = 0.8,
                     .lr = 1e-3,
                     .tokens_per_s = 1e5,
                     .step_s = 0.041,
                     .mfu = 0.41,
                     .hfu = 0.45,
                     .val_loss = 2.6});
  b.steps.push_back({.run_id = 3, .step = 43, .loss = std::nan("")});
  b.events.push_back({.run_id = 3,
                      .time_unix_s = 1.7e9,
                      .step = 42,
                      .kind = "straggler",
                      .rank = 2,
                      .node = "node-b",
                      .message = "rank 2 is 30% slower",
                      .payload = "{\"score\":1.3}"});
  b.checkpoints.push_back({.run_id = 3,
                           .step = 42,
                           .time_unix_s = 1.7e9,
                           .rank = kCheckpointAllRanks,
                           .host = "node-a",
                           .dir = "runs/3/checkpoints/step_00000042",
                           .state = CheckpointState::kCommitted,
                           .bytes = 1u << 20,
                           .shards = 2,
                           .write_s = 0.25,
                           .stall_s = 0.25,
                           .manifest_xxh64 = "00ff00ff00ff00ff"});
  b.checkpoints.push_back({.run_id = 3,
                           .step = 43,
                           .rank = 1,
                           .host = "node-b",
                           .dir = "runs/3/checkpoints/step_00000043",
                           .state = CheckpointState::kFailed,
                           .write_s = 0.5,
                           .stall_s = 0.5,
                           .message = "rank 1: cannot write shard_r1.bin: No space left on device"});
  return b;
}

void token_shard_seeds(const fs::path& dir) {
  const std::string scratch = fuzz_scratch_dir("make_seeds");
  const std::vector<uint32_t> small = {0, 1, 2, 3, 65535, 7, 8, 9};
  const std::vector<uint32_t> wide = {0, 70000, 1u << 31, 5};
  auto shard = [&](const std::vector<uint32_t>& tokens, int version) {
    const std::string p = scratch + "/s.bin";
    FUZZ_CHECK(token_shard_write(p, tokens, version).ok(), "cannot write a seed shard");
    return read_text(p);
  };
  write_seed(dir, "v1.bin", shard(small, 1));
  write_seed(dir, "v2.bin", shard(wide, 2));
  write_seed(dir, "empty.bin", shard({}, 1));
  std::string truncated = shard(small, 1);
  truncated.resize(truncated.size() - 3);
  write_seed(dir, "truncated.bin", truncated);
}

void record_seeds(const fs::path& codec_dir, const fs::path& json_dir) {
  const RecordBatch b = sample_batch();
  std::vector<uint8_t> wire;
  FUZZ_CHECK(record_batch_encode(b, &wire), "cannot encode the seed batch");
  write_seed(codec_dir, "batch.bin", text_of(wire));
  FUZZ_CHECK(record_batch_encode(RecordBatch{}, &wire), "cannot encode the empty batch");
  write_seed(codec_dir, "empty.bin", text_of(wire));
  RecordBatch events;
  events.events = b.events;
  FUZZ_CHECK(record_batch_encode(events, &wire), "cannot encode the events batch");
  write_seed(codec_dir, "events.bin", text_of(wire));
  RecordBatch checkpoints;
  checkpoints.checkpoints = b.checkpoints;
  FUZZ_CHECK(record_batch_encode(checkpoints, &wire), "cannot encode the checkpoints batch");
  write_seed(codec_dir, "checkpoints.bin", text_of(wire));

  write_seed(json_dir, "rank_step.json", record_to_json(b.rank_steps[0]));
  write_seed(json_dir, "step.json", record_to_json(b.steps[0]));
  write_seed(json_dir, "step_nan.json", record_to_json(b.steps[1]));
  write_seed(json_dir, "event.json", record_to_json(b.events[0]));
  write_seed(json_dir, "checkpoint.json", record_to_json(b.checkpoints[0]));
  write_seed(json_dir, "checkpoint_failed.json", record_to_json(b.checkpoints[1]));
  write_seed(json_dir, "batch.json", record_to_json(b));
}

void beat_seeds(const fs::path& dir) {
  const RecordBatch b = sample_batch();
  const nlohmann::json ended = {{"ended", nlohmann::json::array({{{"run", 3},
                                                                  {"generation", 1},
                                                                  {"code", 130},
                                                                  {"error", ""},
                                                                  {"final_message", "stopped at step 6"},
                                                                  {"failed_rank", -1},
                                                                  {"cause_rank", -1},
                                                                  {"agent_stopping", true}}})}};
  write_seed(dir, "records.bin", agent_beat_encode({{"ended", nlohmann::json::array()}}, b).value());
  write_seed(dir, "ended.bin", agent_beat_encode(ended, RecordBatch{}).value());
  write_seed(dir, "both.bin", agent_beat_encode(ended, b).value());
  // The node's health checks (node_health.h), as an agent with a full disk reports them.
  const nlohmann::json health = {
      {"ended", nlohmann::json::array()},
      {"health",
       {{"state", "unhealthy"},
        {"reason", "disk: /a has 0.10 GiB free, below the threshold of 1.00 GiB"},
        {"checks",
         nlohmann::json::array({{{"name", "disk"}, {"state", "unhealthy"}, {"detail", "full"}},
                                {{"name", "nvml"}, {"state", "unknown"}, {"detail", "not present"}}})}}}};
  write_seed(dir, "health.bin", agent_beat_encode(health, RecordBatch{}).value());
}

void frame_seeds(const fs::path& frame_dir, const fs::path& worker_dir) {
  const std::vector<uint8_t> hello = worker_hello_encode(
      {.rank = 1, .world = 4, .local_rank = 1, .pid = 4242, .device = 0, .host = "node-a"});
  const std::vector<uint8_t> exit = worker_exit_encode({.code = 0, .message = "done: step 6, loss 1.4"});
  const std::vector<uint8_t> run = worker_run_encode({.summary = "tiny",
                                                      .config_toml = "[model]\nn_layer = 2\n",
                                                      .code_version = "v1",
                                                      .data_version = "00ff",
                                                      .backend = "cpu",
                                                      .params = 123456,
                                                      .peak_name = "cpu (configured)",
                                                      .peak_flops = 134.4e9,
                                                      .flops_per_token = 772608,
                                                      .mfu_formula = "MFU = ..."});
  const std::vector<uint8_t> command =
      worker_command_encode({.action = TrainAction::checkpoint, .id = 9, .from = "ctl@127.0.0.1:51234"});
  write_seed(worker_dir, "hello.bin", text_of(hello));
  write_seed(worker_dir, "exit.bin", text_of(exit));
  write_seed(worker_dir, "run.bin", text_of(run));
  write_seed(worker_dir, "command.bin", text_of(command));

  // frame_fuzz: one byte of piece size, then the stream.
  auto stream = [](uint8_t piece, std::initializer_list<std::pair<FrameType, std::vector<uint8_t>>> frames) {
    std::string s(1, static_cast<char>(piece));
    for (const auto& [type, payload] : frames)
      s += text_of(frame_encode(static_cast<uint8_t>(type), payload));
    return s;
  };
  write_seed(frame_dir, "hello_exit.bin",
             stream(12, {{FrameType::worker_hello, hello}, {FrameType::worker_exit, exit}}));
  write_seed(frame_dir, "command.bin", stream(1, {{FrameType::worker_command, command}}));
  write_seed(frame_dir, "empty_payload.bin",
             stream(63, {{FrameType::store_ok, {}}, {FrameType::store_get, {1, 2, 3}}}));
  std::string cut = stream(5, {{FrameType::worker_run, run}});
  cut.resize(cut.size() - 4);
  write_seed(frame_dir, "truncated.bin", cut);
}

void checkpoint_seeds(const fs::path& dir) {
  const std::string root = fuzz_scratch_dir("make_seeds") + "/checkpoints";
  const CheckpointFixture fixture = checkpoint_fixture_make(root);
  write_seed(dir, "manifest.json", read_text(fs::path(fixture.dir) / "manifest.json"));
}

}  // namespace
}  // namespace gantry::fuzz

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s CORPUS_DIR (tests/fuzz/corpus)\n", argv[0]);
    return 2;
  }
  using namespace gantry::fuzz;
  const std::filesystem::path corpus = argv[1];
  token_shard_seeds(corpus / "token_shard");
  record_seeds(corpus / "record_codec", corpus / "record_json");
  beat_seeds(corpus / "agent_beat");
  frame_seeds(corpus / "frame", corpus / "worker_frames");
  checkpoint_seeds(corpus / "checkpoint_manifest");
  return 0;
}
