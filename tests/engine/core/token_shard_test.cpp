#include "engine/core/token_shard.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <stdlib.h>  // mkdtemp

#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "engine/core/token_dataset.h"
#include "engine/core/xxhash64.h"
#include "tests/scratch_dir.h"

namespace gantry {
namespace {

using ::testing::HasSubstr;

std::string make_temp_dir() {
  static int serial = 0;  // several directories a test
  return testing_support::scratch_dir("shard" + std::to_string(serial++)).string();
}

void write_bytes(const std::string& path, const std::vector<unsigned char>& bytes) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
  ASSERT_TRUE(f.good()) << path;
}

std::vector<unsigned char> read_bytes(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return std::vector<unsigned char>(std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>());
}

void put_le32(std::vector<unsigned char>& b, size_t at, uint32_t v) {
  for (int i = 0; i < 4; ++i) b[at + i] = static_cast<unsigned char>(v >> (8 * i));
}

// A shard laid out by hand: header ints, then `token_bytes`-wide little-endian tokens.
std::vector<unsigned char> raw_shard(int32_t magic, int32_t version, int32_t count,
                                     const std::vector<uint32_t>& tokens, int token_bytes) {
  std::vector<unsigned char> b(1024 + tokens.size() * token_bytes, 0);
  put_le32(b, 0, static_cast<uint32_t>(magic));
  put_le32(b, 4, static_cast<uint32_t>(version));
  put_le32(b, 8, static_cast<uint32_t>(count));
  for (size_t i = 0; i < tokens.size(); ++i) {
    for (int k = 0; k < token_bytes; ++k)
      b[1024 + i * token_bytes + k] = static_cast<unsigned char>(tokens[i] >> (8 * k));
  }
  return b;
}

std::vector<uint32_t> read_all(const TokenShard& shard) {
  std::vector<int32_t> buf(shard.size());
  shard.read(0, shard.size(), buf.data());
  return std::vector<uint32_t>(buf.begin(), buf.end());
}

TEST(TokenShard, Version1RoundTrip) {
  const std::string path = make_temp_dir() + "/v1.bin";
  std::vector<uint32_t> tokens = {0, 1, 255, 256, 50256, 65535, 7};
  ASSERT_TRUE(token_shard_write(path, tokens, 1).ok());
  EXPECT_FALSE(std::filesystem::exists(path + ".tmp"));
  Result<TokenShard> shard = TokenShard::open(path);
  ASSERT_TRUE(shard.ok()) << shard.error();
  EXPECT_EQ(shard->version(), 1);
  EXPECT_EQ(shard->size(), tokens.size());
  EXPECT_EQ(shard->file_bytes(), 1024u + 2 * tokens.size());
  EXPECT_EQ(shard->path(), path);
  EXPECT_EQ(read_all(shard.value()), tokens);
  for (size_t i = 0; i < tokens.size(); ++i) EXPECT_EQ(shard->at(i), tokens[i]);
  std::vector<int32_t> mid(3);
  shard->read(2, 3, mid.data());
  EXPECT_EQ(mid, (std::vector<int32_t>{255, 256, 50256}));
}

TEST(TokenShard, Version2RoundTrip) {
  const std::string path = make_temp_dir() + "/v2.bin";
  std::vector<uint32_t> tokens = {0, 65535, 65536, 100000, 2000000, 3};
  ASSERT_TRUE(token_shard_write(path, tokens, 2).ok());
  Result<TokenShard> shard = TokenShard::open(path);
  ASSERT_TRUE(shard.ok()) << shard.error();
  EXPECT_EQ(shard->version(), 2);
  EXPECT_EQ(shard->file_bytes(), 1024u + 4 * tokens.size());
  EXPECT_EQ(read_all(shard.value()), tokens);
  EXPECT_EQ(shard->at(4), 2000000u);
}

TEST(TokenShard, LargeRoundTripCrossesWriteChunks) {
  const std::string path = make_temp_dir() + "/big.bin";
  std::vector<uint32_t> tokens(200000);
  for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<uint32_t>((i * 2654435761u) % 65536);
  ASSERT_TRUE(token_shard_write(path, tokens, 1).ok());
  Result<TokenShard> shard = TokenShard::open(path);
  ASSERT_TRUE(shard.ok()) << shard.error();
  EXPECT_EQ(read_all(shard.value()), tokens);
}

TEST(TokenShard, EmptyShardRoundTrips) {
  const std::string path = make_temp_dir() + "/empty.bin";
  ASSERT_TRUE(token_shard_write(path, {}, 1).ok());
  Result<TokenShard> shard = TokenShard::open(path);
  ASSERT_TRUE(shard.ok()) << shard.error();
  EXPECT_EQ(shard->size(), 0u);
}

TEST(TokenShard, Version1RefusesLargeToken) {
  const std::string path = make_temp_dir() + "/big_token.bin";
  std::vector<uint32_t> tokens = {1, 2, 65536, 3};
  Status st = token_shard_write(path, tokens, 1);
  ASSERT_FALSE(st.ok());
  EXPECT_THAT(st.message(), HasSubstr("65536"));
  EXPECT_THAT(st.message(), HasSubstr("index 2"));
  EXPECT_THAT(st.message(), HasSubstr("version 2"));
  EXPECT_THAT(st.message(), HasSubstr(path));
  EXPECT_FALSE(std::filesystem::exists(path));
  EXPECT_FALSE(std::filesystem::exists(path + ".tmp"));
}

TEST(TokenShard, WriteRefusesUnknownVersion) {
  const std::string path = make_temp_dir() + "/v3.bin";
  Status st = token_shard_write(path, std::vector<uint32_t>{1}, 3);
  ASSERT_FALSE(st.ok());
  EXPECT_THAT(st.message(), HasSubstr("version 3"));
  EXPECT_FALSE(std::filesystem::exists(path));
}

TEST(TokenShard, WriteIntoMissingDirectoryFails) {
  const std::string path = make_temp_dir() + "/no/such/dir/x.bin";
  Status st = token_shard_write(path, std::vector<uint32_t>{1}, 1);
  ASSERT_FALSE(st.ok());
  EXPECT_THAT(st.message(), HasSubstr(path));
}

TEST(TokenShard, RewriteReplacesFile) {
  const std::string path = make_temp_dir() + "/re.bin";
  ASSERT_TRUE(token_shard_write(path, std::vector<uint32_t>{1, 2, 3, 4}, 1).ok());
  ASSERT_TRUE(token_shard_write(path, std::vector<uint32_t>{9}, 2).ok());
  Result<TokenShard> shard = TokenShard::open(path);
  ASSERT_TRUE(shard.ok()) << shard.error();
  EXPECT_EQ(read_all(shard.value()), std::vector<uint32_t>{9});
}

// Byte for byte what llm.c's data scripts (write_datafile) produce: np.zeros(256, int32) header with
// [0] = 20240520, [1] = 1, [2] = len(toks), then np.array(toks, uint16).tobytes().
TEST(TokenShard, ReadsLlmcPythonWriterOutput) {
  const std::string path = make_temp_dir() + "/llmc_train.bin";
  const std::vector<uint32_t> toks = {50256, 464, 2068, 7586, 21831, 18045, 625, 262, 16931, 3290, 13};
  int32_t header[256] = {};
  header[0] = 20240520;
  header[1] = 1;
  header[2] = static_cast<int32_t>(toks.size());
  std::vector<unsigned char> bytes;
  for (int32_t h : header) {
    for (int k = 0; k < 4; ++k)
      bytes.push_back(static_cast<unsigned char>(static_cast<uint32_t>(h) >> (8 * k)));
  }
  for (uint32_t t : toks) {
    const uint16_t u = static_cast<uint16_t>(t);
    bytes.push_back(static_cast<unsigned char>(u & 0xff));
    bytes.push_back(static_cast<unsigned char>(u >> 8));
  }
  write_bytes(path, bytes);
  Result<TokenShard> shard = TokenShard::open(path);
  ASSERT_TRUE(shard.ok()) << shard.error();
  EXPECT_EQ(shard->version(), 1);
  EXPECT_EQ(read_all(shard.value()), toks);

  // And our writer produces the same bytes.
  const std::string ours = path + ".ours";
  ASSERT_TRUE(token_shard_write(ours, toks, 1).ok());
  EXPECT_EQ(read_bytes(ours), bytes);
}

TEST(TokenShard, OpenMissingFileNamesPath) {
  const std::string path = make_temp_dir() + "/missing.bin";
  Result<TokenShard> shard = TokenShard::open(path);
  ASSERT_FALSE(shard.ok());
  EXPECT_THAT(shard.error(), HasSubstr(path));
}

TEST(TokenShard, OpenRefusesShortFile) {
  const std::string path = make_temp_dir() + "/short.bin";
  write_bytes(path, std::vector<unsigned char>(100, 0));
  Result<TokenShard> shard = TokenShard::open(path);
  ASSERT_FALSE(shard.ok());
  EXPECT_THAT(shard.error(), HasSubstr(path));
  EXPECT_THAT(shard.error(), HasSubstr("100 bytes"));
  EXPECT_THAT(shard.error(), HasSubstr("header"));
}

TEST(TokenShard, OpenRefusesEmptyFile) {
  const std::string path = make_temp_dir() + "/zero.bin";
  write_bytes(path, {});
  Result<TokenShard> shard = TokenShard::open(path);
  ASSERT_FALSE(shard.ok());
  EXPECT_THAT(shard.error(), HasSubstr(path));
}

TEST(TokenShard, OpenRefusesBadMagic) {
  const std::string path = make_temp_dir() + "/magic.bin";
  write_bytes(path, raw_shard(12345, 1, 2, {1, 2}, 2));
  Result<TokenShard> shard = TokenShard::open(path);
  ASSERT_FALSE(shard.ok());
  EXPECT_THAT(shard.error(), HasSubstr(path));
  EXPECT_THAT(shard.error(), HasSubstr("12345"));
  EXPECT_THAT(shard.error(), HasSubstr("20240520"));
}

TEST(TokenShard, OpenRecognisesModelCheckpoint) {
  const std::string path = make_temp_dir() + "/gpt2_124M.bin";
  write_bytes(path, raw_shard(20240326, 3, 0, {}, 2));
  Result<TokenShard> shard = TokenShard::open(path);
  ASSERT_FALSE(shard.ok());
  EXPECT_THAT(shard.error(), HasSubstr("model checkpoint"));
}

TEST(TokenShard, OpenRefusesUnknownVersion) {
  const std::string path = make_temp_dir() + "/version.bin";
  write_bytes(path, raw_shard(20240520, 7, 2, {1, 2}, 2));
  Result<TokenShard> shard = TokenShard::open(path);
  ASSERT_FALSE(shard.ok());
  EXPECT_THAT(shard.error(), HasSubstr(path));
  EXPECT_THAT(shard.error(), HasSubstr("version 7"));
  EXPECT_THAT(shard.error(), HasSubstr("1"));
  EXPECT_THAT(shard.error(), HasSubstr("2"));
}

TEST(TokenShard, OpenRefusesTruncatedFile) {
  const std::string path = make_temp_dir() + "/trunc.bin";
  write_bytes(path, raw_shard(20240520, 1, 10, {1, 2, 3, 4, 5}, 2));  // header says 10, holds 5
  Result<TokenShard> shard = TokenShard::open(path);
  ASSERT_FALSE(shard.ok());
  EXPECT_THAT(shard.error(), HasSubstr(path));
  EXPECT_THAT(shard.error(), HasSubstr("expected 1044 bytes"));
  EXPECT_THAT(shard.error(), HasSubstr("1034"));
  EXPECT_THAT(shard.error(), HasSubstr("truncated"));
}

TEST(TokenShard, OpenRefusesTrailingBytes) {
  const std::string path = make_temp_dir() + "/trailing.bin";
  std::vector<unsigned char> bytes = raw_shard(20240520, 2, 3, {1, 2, 3}, 4);
  bytes.push_back(0);
  write_bytes(path, bytes);
  Result<TokenShard> shard = TokenShard::open(path);
  ASSERT_FALSE(shard.ok());
  EXPECT_THAT(shard.error(), HasSubstr(path));
  EXPECT_THAT(shard.error(), HasSubstr("expected 1036 bytes"));
  EXPECT_THAT(shard.error(), HasSubstr("1037"));
  EXPECT_THAT(shard.error(), HasSubstr("trailing"));
}

TEST(TokenShard, OpenRefusesVersion1ReadAsWrongWidth) {
  // A version 2 header over version 1 data: the size check catches the mismatch.
  const std::string path = make_temp_dir() + "/width.bin";
  write_bytes(path, raw_shard(20240520, 2, 4, {1, 2, 3, 4}, 2));
  Result<TokenShard> shard = TokenShard::open(path);
  ASSERT_FALSE(shard.ok());
  EXPECT_THAT(shard.error(), HasSubstr("truncated"));
}

TEST(TokenShard, MoveKeepsMapping) {
  const std::string path = make_temp_dir() + "/move.bin";
  ASSERT_TRUE(token_shard_write(path, std::vector<uint32_t>{5, 6, 7}, 1).ok());
  Result<TokenShard> opened = TokenShard::open(path);
  ASSERT_TRUE(opened.ok());
  TokenShard a = std::move(opened).value();
  TokenShard b = std::move(a);
  EXPECT_EQ(b.at(2), 7u);
  Result<TokenShard> other = TokenShard::open(path);
  ASSERT_TRUE(other.ok());
  b = std::move(other).value();
  EXPECT_EQ(b.size(), 3u);
  EXPECT_EQ(b.at(0), 5u);
}

// ---- TokenDataset ----

std::vector<uint32_t> iota_tokens(uint32_t first, size_t n) {
  std::vector<uint32_t> t(n);
  for (size_t i = 0; i < n; ++i) t[i] = first + static_cast<uint32_t>(i);
  return t;
}

TEST(TokenDataset, WindowsWithinAndAcrossShards) {
  const std::string dir = make_temp_dir();
  ASSERT_TRUE(token_shard_write(dir + "/train_000000.bin", iota_tokens(0, 10), 1).ok());   // 3 windows
  ASSERT_TRUE(token_shard_write(dir + "/train_000001.bin", iota_tokens(100, 8), 1).ok());  // 2 windows
  // Listed out of order: the dataset sorts them.
  Result<TokenDataset> ds = TokenDataset::open({dir + "/train_000001.bin", dir + "/train_000000.bin"}, 3);
  ASSERT_TRUE(ds.ok()) << ds.error();
  EXPECT_EQ(ds->num_windows(), 5u);
  EXPECT_EQ(ds->seq_len(), 3);
  EXPECT_EQ(ds->paths(), (std::vector<std::string>{dir + "/train_000000.bin", dir + "/train_000001.bin"}));

  const std::vector<std::vector<int32_t>> want_inputs = {
      {0, 1, 2}, {3, 4, 5}, {6, 7, 8}, {100, 101, 102}, {103, 104, 105}};
  for (uint64_t w = 0; w < 5; ++w) {
    std::vector<int32_t> x(3, -1), y(3, -1);
    ds->window(w, x.data(), y.data());
    EXPECT_EQ(x, want_inputs[w]) << "window " << w;
    std::vector<int32_t> want_targets = want_inputs[w];
    for (int32_t& t : want_targets) ++t;
    EXPECT_EQ(y, want_targets) << "window " << w;
  }
  EXPECT_EQ(ds->max_token(), 107u);
}

TEST(TokenDataset, MaxTokenSeesVersion2) {
  const std::string dir = make_temp_dir();
  ASSERT_TRUE(token_shard_write(dir + "/a.bin", std::vector<uint32_t>{1, 2, 3}, 1).ok());
  ASSERT_TRUE(token_shard_write(dir + "/b.bin", std::vector<uint32_t>{4, 70000, 5}, 2).ok());
  Result<TokenDataset> ds = TokenDataset::open({dir + "/a.bin", dir + "/b.bin"}, 2);
  ASSERT_TRUE(ds.ok()) << ds.error();
  EXPECT_EQ(ds->max_token(), 70000u);
  std::vector<int32_t> x(2), y(2);
  ds->window(1, x.data(), y.data());
  EXPECT_EQ(x, (std::vector<int32_t>{4, 70000}));
  EXPECT_EQ(y, (std::vector<int32_t>{70000, 5}));
}

TEST(TokenDataset, DataVersionFollowsNamesSizesAndContents) {
  const std::string dir = make_temp_dir();
  const std::string a = dir + "/train_000000.bin", b = dir + "/train_000001.bin";
  ASSERT_TRUE(token_shard_write(a, iota_tokens(0, 10), 1).ok());
  ASSERT_TRUE(token_shard_write(b, iota_tokens(0, 8), 1).ok());
  Result<TokenDataset> first = TokenDataset::open({a, b}, 3);
  ASSERT_TRUE(first.ok()) << first.error();
  auto hex = [](const std::vector<unsigned char>& bytes) {
    char buf[24];
    std::snprintf(buf, sizeof buf, "%016llx",
                  static_cast<unsigned long long>(xxhash64(bytes.data(), bytes.size())));
    return std::string(buf);
  };
  const std::string text =
      "train_000000.bin:1044:" + hex(read_bytes(a)) + "\ntrain_000001.bin:1040:" + hex(read_bytes(b)) + "\n";
  EXPECT_EQ(first->data_version(), xxhash64(text.data(), text.size()));

  Result<TokenDataset> again = TokenDataset::open({b, a}, 5);
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(again->data_version(), first->data_version());

  ASSERT_TRUE(token_shard_write(b, iota_tokens(0, 9), 1).ok());
  Result<TokenDataset> resized = TokenDataset::open({a, b}, 3);
  ASSERT_TRUE(resized.ok());
  EXPECT_NE(resized->data_version(), first->data_version());

  Result<TokenDataset> fewer = TokenDataset::open({a}, 3);
  ASSERT_TRUE(fewer.ok());
  EXPECT_NE(fewer->data_version(), first->data_version());

  // The defect: other tokens in a shard of the same name and size went unseen.
  ASSERT_TRUE(token_shard_write(b, iota_tokens(0, 8), 1).ok());
  Result<TokenDataset> same = TokenDataset::open({a, b}, 3);
  ASSERT_TRUE(same.ok());
  EXPECT_EQ(same->data_version(), first->data_version());
  ASSERT_TRUE(token_shard_write(b, iota_tokens(1, 8), 1).ok());
  Result<TokenDataset> rewritten = TokenDataset::open({a, b}, 3);
  ASSERT_TRUE(rewritten.ok());
  EXPECT_NE(rewritten->data_version(), first->data_version());
}

TEST(TokenDataset, Errors) {
  const std::string dir = make_temp_dir();
  const std::string a = dir + "/a.bin";
  ASSERT_TRUE(token_shard_write(a, iota_tokens(0, 4), 1).ok());

  Result<TokenDataset> empty = TokenDataset::open({}, 3);
  ASSERT_FALSE(empty.ok());
  EXPECT_THAT(empty.error(), HasSubstr("no shard"));

  Result<TokenDataset> too_short = TokenDataset::open({a}, 4);  // needs 5 tokens
  ASSERT_FALSE(too_short.ok());
  EXPECT_THAT(too_short.error(), HasSubstr(a));
  EXPECT_THAT(too_short.error(), HasSubstr("4 tokens"));
  EXPECT_THAT(too_short.error(), HasSubstr("5"));

  EXPECT_TRUE(TokenDataset::open({a}, 3).ok());  // exactly seq_len + 1 tokens: one window

  Result<TokenDataset> bad_len = TokenDataset::open({a}, 0);
  ASSERT_FALSE(bad_len.ok());
  EXPECT_THAT(bad_len.error(), HasSubstr("seq_len"));

  Result<TokenDataset> twice = TokenDataset::open({a, a}, 2);
  ASSERT_FALSE(twice.ok());
  EXPECT_THAT(twice.error(), HasSubstr(a));

  Result<TokenDataset> missing = TokenDataset::open({a, dir + "/nope.bin"}, 2);
  ASSERT_FALSE(missing.ok());
  EXPECT_THAT(missing.error(), HasSubstr(dir + "/nope.bin"));
}

TEST(TokenShardGlob, ListsMatchingShardsSorted) {
  const std::string dir = make_temp_dir();
  for (const char* name : {"train_000002.bin", "train_000000.bin", "train_000001.bin", "val_000000.bin"}) {
    ASSERT_TRUE(token_shard_write(dir + "/" + name, std::vector<uint32_t>{1, 2}, 1).ok());
  }
  write_bytes(dir + "/train_000003.bin.tmp", {1});
  write_bytes(dir + "/train_notes.txt", {1});
  std::filesystem::create_directory(dir + "/train_dir.bin");
  Result<std::vector<std::string>> train = token_shard_glob(dir, "train_");
  ASSERT_TRUE(train.ok()) << train.error();
  EXPECT_EQ(train.value(), (std::vector<std::string>{dir + "/train_000000.bin", dir + "/train_000001.bin",
                                                     dir + "/train_000002.bin"}));
  Result<std::vector<std::string>> val = token_shard_glob(dir, "val_");
  ASSERT_TRUE(val.ok());
  EXPECT_EQ(val->size(), 1u);

  Result<std::vector<std::string>> none = token_shard_glob(dir, "test_");
  ASSERT_FALSE(none.ok());
  EXPECT_THAT(none.error(), HasSubstr(dir));
  EXPECT_THAT(none.error(), HasSubstr("test_"));

  Result<std::vector<std::string>> no_dir = token_shard_glob(dir + "/absent", "train_");
  ASSERT_FALSE(no_dir.ok());
  EXPECT_THAT(no_dir.error(), HasSubstr(dir + "/absent"));
}

}  // namespace
}  // namespace gantry
