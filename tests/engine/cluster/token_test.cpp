// The bearer token: generation, the 0600 file, refusal of a file others can read, constant-time compare.
#include "engine/cluster/token.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>

#include "tests/scratch_dir.h"

namespace gantry {
namespace {

using ::testing::HasSubstr;

class TokenFile : public ::testing::Test {
 protected:
  void SetUp() override { dir_ = testing_support::scratch_dir("token"); }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  std::string path(const std::string& name) const { return (dir_ / name).string(); }
  static mode_t mode_of(const std::string& p) {
    struct stat st {};
    EXPECT_EQ(::stat(p.c_str(), &st), 0);
    return st.st_mode & 07777;
  }
  std::filesystem::path dir_;
};

TEST(Token, GeneratesDistinctHexTokens) {
  Result<std::string> a = token_generate(), b = token_generate();
  ASSERT_TRUE(a.ok()) << a.error();
  ASSERT_TRUE(b.ok());
  EXPECT_EQ(a->size(), 2 * kTokenBytes);
  EXPECT_EQ(a->find_first_not_of("0123456789abcdef"), std::string::npos);
  EXPECT_NE(a.value(), b.value());
  EXPECT_TRUE(token_check(a.value()).ok());
}

TEST(Token, EqualityAndChecks) {
  EXPECT_TRUE(token_equal("abcdef0123456789", "abcdef0123456789"));
  EXPECT_FALSE(token_equal("abcdef0123456789", "abcdef0123456788"));
  EXPECT_FALSE(token_equal("abcdef0123456789", "abcdef012345678"));  // a prefix is not equal
  EXPECT_FALSE(token_equal("", "x"));
  EXPECT_TRUE(token_equal("", ""));
  EXPECT_THAT(token_check("short").message(), HasSubstr("at least 16"));
  EXPECT_THAT(token_check("abcdefgh ijklmnopq").message(), HasSubstr("at offset 8"));
  EXPECT_THAT(token_check("abcdefghijklmnop\r\nX-Evil: 1").message(), HasSubstr("control"));
}

TEST_F(TokenFile, WritesMode0600AndReadsBack) {
  const std::string p = path("token");
  const std::string t = token_generate().value();
  ASSERT_TRUE(token_file_write(p, t).ok());
  EXPECT_EQ(mode_of(p), 0600u);
  Result<std::string> back = token_file_read(p);
  ASSERT_TRUE(back.ok()) << back.error();
  EXPECT_EQ(back.value(), t);
}

TEST_F(TokenFile, ReplacesAWiderFileWith0600) {
  const std::string p = path("token");
  { std::ofstream(p) << "old-token-old-token-old\n"; }
  ::chmod(p.c_str(), 0644);
  const std::string t = token_generate().value();
  ASSERT_TRUE(token_file_write(p, t).ok());
  EXPECT_EQ(mode_of(p), 0600u);
  EXPECT_EQ(token_file_read(p).value(), t);
}

TEST_F(TokenFile, RefusesAFileOthersCanRead) {
  const std::string p = path("token");
  ASSERT_TRUE(token_file_write(p, token_generate().value()).ok());
  ASSERT_EQ(::chmod(p.c_str(), 0644), 0);
  Result<std::string> r = token_file_read(p);
  ASSERT_FALSE(r.ok());
  EXPECT_THAT(r.error(), HasSubstr("token file " + p + " has mode 0644"));
  EXPECT_THAT(r.error(), HasSubstr("chmod 600 " + p));
  ASSERT_EQ(::chmod(p.c_str(), 0620), 0);  // group-writable is as bad
  EXPECT_FALSE(token_file_read(p).ok());
}

TEST_F(TokenFile, RefusesMissingEmptyAndMalformed) {
  EXPECT_THAT(token_file_read(path("none")).error(), HasSubstr("does not exist"));
  const std::string p = path("token");
  { std::ofstream(p) << "\n"; }
  ::chmod(p.c_str(), 0600);
  EXPECT_THAT(token_file_read(p).error(), HasSubstr("is empty"));
  { std::ofstream(p) << "two words are not a token\n"; }
  EXPECT_THAT(token_file_read(p).error(), HasSubstr("printable ASCII without spaces"));
  EXPECT_THAT(token_file_read(dir_.string()).error(), HasSubstr("is not a regular file"));
  EXPECT_THAT(token_file_write(path("nodir/token"), token_generate().value()).message(),
              HasSubstr("cannot create token file"));
}

}  // namespace
}  // namespace gantry
