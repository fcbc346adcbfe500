// Checkpoint v1: a damaged or foreign checkpoint is refused with a message naming the file and the
// problem, nothing is half-loaded, and the previous checkpoint still loads.
#include "engine/core/checkpoint.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>  // edits a manifest
#include <vector>

#include "engine/core/token_dataset.h"
#include "engine/core/train.h"
#include "engine/core/xxhash64.h"
#include "tests/engine/core/small_config.h"

namespace gantry {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;
using testing_support::fresh_dir;
using testing_support::small_config;

class CheckpointTest : public ::testing::Test {
 protected:
  void SetUp() override {
    config_ = small_config();
    config_.train.checkpoint_every = 2;
    out_ = fresh_dir(::testing::UnitTest::GetInstance()->current_test_info()->name());
    Result<TrainSummary> s = train_run(config_, {.out_dir = out_, .max_steps = 4}, nullptr);
    ASSERT_TRUE(s.ok()) << s.error();
    root_ = out_ + "/checkpoints";
    older_ = root_ + "/step_00000002";
    newer_ = root_ + "/step_00000004";
    ASSERT_EQ(checkpoint_list(root_), (std::vector<std::string>{older_, newer_}));
    Result<std::vector<std::string>> shards = token_shard_glob(out_ + "/data", "train_");
    ASSERT_TRUE(shards.ok());
    Result<TokenDataset> ds = TokenDataset::open(shards.value(), config_.model.seq_len);
    ASSERT_TRUE(ds.ok());
    data_version_ = ds->data_version();
    backend_ = backend_cpu_create(config_.model, config_.train.micro_batch, 1);
    // Recognisable contents, to prove a refused load leaves them untouched.
    std::vector<float> marker(backend_->params().numel(), 0.25f);
    backend_->write_state(StateBuffer::kParams, 0, marker.size(), marker.data());
    marker_hash_ = params_hash();
  }

  uint64_t params_hash() {
    std::vector<float> p(backend_->params().numel());
    backend_->read_state(StateBuffer::kParams, 0, p.size(), p.data());
    return xxhash64(p.data(), p.size() * sizeof(float));
  }

  std::string load_error(const std::string& dir) {
    damaged_.clear();
    Result<CheckpointMeta> m = checkpoint_load(dir, *backend_, config_, data_version_, &damaged_);
    EXPECT_FALSE(m.ok()) << "a damaged checkpoint loaded: " << dir;
    EXPECT_EQ(params_hash(), marker_hash_) << "a refused checkpoint changed the model";
    return m.ok() ? "" : m.error();
  }

  void expect_older_still_loads() {
    Result<CheckpointMeta> m = checkpoint_load(older_, *backend_, config_, data_version_);
    ASSERT_TRUE(m.ok()) << m.error();
    EXPECT_EQ(m->step, 2);
  }

  Config config_;
  std::string out_, root_, older_, newer_;
  uint64_t data_version_ = 0;
  std::unique_ptr<Backend> backend_;
  uint64_t marker_hash_ = 0;
  std::string damaged_;  // load_error's: the file checkpoint_load called damaged
};

TEST_F(CheckpointTest, GoodCheckpointLoadsItsState) {
  Result<CheckpointMeta> m = checkpoint_load(newer_, *backend_, config_, data_version_);
  ASSERT_TRUE(m.ok()) << m.error();
  EXPECT_EQ(m->step, 4);
  EXPECT_EQ(m->sampler_seed, config_.train.seed);
  EXPECT_NE(params_hash(), marker_hash_);
}

TEST_F(CheckpointTest, FlippedByteInShardIsRefused) {
  const std::string shard = newer_ + "/shard_r00000.bin";
  {
    std::fstream f(shard, std::ios::in | std::ios::out | std::ios::binary);
    f.seekg(1000);
    char ch;
    f.read(&ch, 1);
    ch ^= 0x40;
    f.seekp(1000);
    f.write(&ch, 1);
  }
  std::string e = load_error(newer_);
  EXPECT_THAT(e, HasSubstr(shard));
  EXPECT_THAT(e, HasSubstr("corrupt"));
  EXPECT_EQ(damaged_, shard);  // damage, not a checkpoint that does not fit: an older one may load
  expect_older_still_loads();
}

TEST_F(CheckpointTest, TruncatedShardIsRefused) {
  const std::string shard = newer_ + "/shard_r00000.bin";
  fs::resize_file(shard, fs::file_size(shard) - 100);
  std::string e = load_error(newer_);
  EXPECT_THAT(e, HasSubstr(shard));
  EXPECT_THAT(e, HasSubstr("truncated"));
  EXPECT_EQ(damaged_, shard);
  expect_older_still_loads();
}

TEST_F(CheckpointTest, MissingShardIsRefused) {
  fs::remove(newer_ + "/shard_r00000.bin");
  std::string e = load_error(newer_);
  EXPECT_THAT(e, HasSubstr(newer_ + "/shard_r00000.bin"));
  EXPECT_THAT(e, HasSubstr("missing"));
  EXPECT_EQ(damaged_, newer_ + "/shard_r00000.bin");
}

TEST_F(CheckpointTest, MissingManifestIsNotACheckpoint) {
  fs::remove(newer_ + "/manifest.json");
  std::string e = load_error(newer_);
  EXPECT_THAT(e, HasSubstr(newer_));
  EXPECT_THAT(e, HasSubstr("no manifest.json"));
  // An uncommitted directory is invisible to "latest".
  Result<std::string> latest = checkpoint_latest(root_);
  ASSERT_TRUE(latest.ok());
  EXPECT_EQ(latest.value(), older_);
  expect_older_still_loads();
}

TEST_F(CheckpointTest, ManifestFromAnotherConfigIsRefused) {
  Config other = config_;
  other.model.n_embd = 64;
  auto be = backend_cpu_create(other.model, other.train.micro_batch, 1);
  std::string damaged;
  Result<CheckpointMeta> m = checkpoint_load(newer_, *be, other, data_version_, &damaged);
  ASSERT_FALSE(m.ok());
  EXPECT_EQ(damaged, "") << "whole, but for another config: not damaged";
  EXPECT_THAT(m.error(), HasSubstr(newer_ + "/manifest.json"));
  EXPECT_THAT(m.error(), HasSubstr("model.n_embd: checkpoint has 32, config has 64"));
  expect_older_still_loads();
}

TEST_F(CheckpointTest, OtherTrainingDataIsRefused) {
  std::string damaged;
  Result<CheckpointMeta> m = checkpoint_load(newer_, *backend_, config_, data_version_ ^ 1, &damaged);
  ASSERT_FALSE(m.ok());
  EXPECT_THAT(m.error(), HasSubstr("other training data"));
  EXPECT_EQ(damaged, "");
}

TEST_F(CheckpointTest, GarbledManifestIsRefused) {
  {
    std::ofstream f(newer_ + "/manifest.json", std::ios::trunc);
    f << "{\"format\": \"gantry-checkpoint\", \"format_version\": ";
  }
  std::string e = load_error(newer_);
  EXPECT_THAT(e, HasSubstr(newer_ + "/manifest.json"));
  EXPECT_THAT(e, HasSubstr("not valid JSON"));
  expect_older_still_loads();
}

TEST_F(CheckpointTest, EditedSliceHashIsRefused) {
  // A manifest whose checksum was edited no longer matches the data: refused as corrupt.
  std::ifstream in(newer_ + "/manifest.json");
  std::string text((std::istreambuf_iterator<char>(in)), {});
  const size_t at = text.find("\"xxh64\": \"");
  ASSERT_NE(at, std::string::npos);
  char& digit = text[at + 10];
  digit = digit == '0' ? '1' : '0';
  std::ofstream(newer_ + "/manifest.json", std::ios::trunc) << text;
  EXPECT_THAT(load_error(newer_), HasSubstr("corrupt"));
}

TEST_F(CheckpointTest, FutureFormatVersionIsRefused) {
  std::ifstream in(newer_ + "/manifest.json");
  std::string text((std::istreambuf_iterator<char>(in)), {});
  const std::string key = "\"format_version\": 1";
  const size_t at = text.find(key);
  ASSERT_NE(at, std::string::npos);
  text.replace(at, key.size(), "\"format_version\": 9");
  std::ofstream(newer_ + "/manifest.json", std::ios::trunc) << text;
  EXPECT_THAT(load_error(newer_), HasSubstr("format_version 9 is not supported"));
}

TEST_F(CheckpointTest, ResumeThroughTrainRunRefusesCorruptLatest) {
  fs::resize_file(newer_ + "/shard_r00000.bin", 10);
  Result<TrainSummary> s = train_run(config_, {.out_dir = out_, .resume = "latest"}, nullptr);
  ASSERT_FALSE(s.ok());
  EXPECT_THAT(s.error(), HasSubstr(newer_));
  Result<TrainSummary> ok = train_run(config_, {.out_dir = out_, .resume = older_, .max_steps = 3}, nullptr);
  ASSERT_TRUE(ok.ok()) << ok.error();
  EXPECT_EQ(ok->first_step, 2);
  EXPECT_EQ(ok->last_step, 3);
}

// One process holds every tensor whole: format 1 with no shares, which builds before tensor-parallel
// checkpoints still read.
TEST_F(CheckpointTest, OneProcessWritesFormatOneWithoutShares) {
  std::ifstream in(newer_ + "/manifest.json");
  const nlohmann::json m = nlohmann::json::parse(in);
  EXPECT_EQ(m.at("format_version"), 1);
  for (const nlohmann::json& sh : m.at("shards")) {
    for (const nlohmann::json& sl : sh.at("slices")) EXPECT_FALSE(sl.contains("share")) << sl.dump();
  }
}

// A slice's share (tensor parallelism, docs/FORMATS.md) that is malformed or reaches past its tensor is
// refused naming the slice, before anything is loaded.
TEST_F(CheckpointTest, ABadShareIsRefused) {
  const std::string path = newer_ + "/manifest.json";
  nlohmann::json original;
  {
    std::ifstream in(path);
    original = nlohmann::json::parse(in);
  }
  auto with_share = [&](const nlohmann::json& share) {
    nlohmann::json m = original;
    m["format_version"] = 2;
    m["shards"][0]["slices"][0]["share"] = share;
    std::ofstream(path, std::ios::trunc) << m.dump(1);
  };
  const std::string tensor = original["shards"][0]["slices"][0]["tensor"].get<std::string>();
  const uint64_t count = original["shards"][0]["slices"][0]["count"].get<uint64_t>();
  with_share({0, 0, 4});
  std::string e = load_error(newer_);
  EXPECT_THAT(e, HasSubstr("slice " + tensor + " has a bad share [0,0,4]"));
  EXPECT_THAT(e, HasSubstr("0 < width <= stride"));
  with_share({0, 1, count + 1});  // a stride past the whole tensor
  EXPECT_THAT(load_error(newer_), HasSubstr("has a bad share"));
  with_share({1, count, count});  // the slice's last element one past the tensor's end
  EXPECT_THAT(load_error(newer_), HasSubstr("slice " + tensor + " lies outside its tensor or file"));
  expect_older_still_loads();
}

}  // namespace
}  // namespace gantry
