#include "engine/core/xxhash64.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#ifdef GANTRY_HAVE_LIBXXHASH
#include <xxhash.h>  // XXH64, the reference implementation
#endif

namespace gantry {
namespace {

// The byte pattern of xxHash's own sanity check, so these vectors can be compared with published ones.
std::vector<unsigned char> sanity_buffer(size_t n) {
  std::vector<unsigned char> buf(n);
  uint64_t gen = 2654435761U;
  for (size_t i = 0; i < n; ++i) {
    buf[i] = static_cast<unsigned char>(gen >> 56);
    gen *= 0x9E3779B185EBCA8DULL;
  }
  return buf;
}

std::vector<unsigned char> random_bytes(std::mt19937_64& rng, size_t n) {
  std::vector<unsigned char> buf(n);
  for (auto& b : buf) b = static_cast<unsigned char>(rng());
  return buf;
}

uint64_t hash_string(const std::string& s, uint64_t seed = 0) {
  return xxhash64(s.data(), s.size(), seed);
}

TEST(XxHash64, EmptyInput) {
  EXPECT_EQ(xxhash64(nullptr, 0), 0xEF46DB3751D8E999ULL);
  EXPECT_EQ(xxhash64("", 0, 0), 0xEF46DB3751D8E999ULL);
  EXPECT_EQ(xxhash64(nullptr, 0, 2654435761U), 0xAC75FDA2929B17EFULL);
  XxHash64Stream stream;
  EXPECT_EQ(stream.digest(), 0xEF46DB3751D8E999ULL);
  stream.update(nullptr, 0);
  EXPECT_EQ(stream.digest(), 0xEF46DB3751D8E999ULL);
}

// Lengths chosen to reach every path: byte tail only, the 4-byte tail, 8-byte tails, exactly one stripe,
// stripes plus every kind of tail.
TEST(XxHash64, KnownVectorsOnSanityBuffer) {
  struct Vector {
    size_t len;
    uint64_t seed0;
    uint64_t seed_prime;
  };
  const Vector vectors[] = {
      {1, 0xE934A84ADB052768ULL, 0x5014607643A9B4C3ULL},
      {3, 0xFF7E1959CB50794AULL, 0xAA8584E83660F7D1ULL},
      {4, 0x9136A0DCA57457EEULL, 0xCAAB286BD8E9FDB5ULL},
      {8, 0xCDBCF538E71D1348ULL, 0xFE0C047A5353CDACULL},
      {14, 0x8282DCC4994E35C8ULL, 0xC3BD6BF63DEB6DF0ULL},
      {31, 0x299B39A290E6D783ULL, 0xDA673D5FEB5C1D79ULL},
      {32, 0x18B216492BB44B70ULL, 0xB3F33BDF93ADE409ULL},
      {33, 0x55C8DC3E578F5B59ULL, 0xE92C292F64BC3071ULL},
      {63, 0xA9EFBE0FA0F3F4E7ULL, 0x6C911FADB05B6FC2ULL},
      {64, 0xEF558F8ACAC2B5CDULL, 0xB5EEBA99264CC44FULL},
      {100, 0x4BFE019CD91D9EA4ULL, 0x4853706DC9625CAEULL},
      {222, 0xB641AE8CB691C174ULL, 0x20CB8AB7AE10C14AULL},
      {256, 0x5E3F5BF94D574981ULL, 0x34733CBD9CC1B0D5ULL},
  };
  const std::vector<unsigned char> buf = sanity_buffer(256);
  for (const Vector& v : vectors) {
    SCOPED_TRACE("len " + std::to_string(v.len));
    EXPECT_EQ(xxhash64(buf.data(), v.len, 0), v.seed0);
    EXPECT_EQ(xxhash64(buf.data(), v.len, 2654435761U), v.seed_prime);
  }
}

TEST(XxHash64, KnownVectorsOnStrings) {
  EXPECT_EQ(hash_string("a"), 0xD24EC4F1A98C6E5BULL);
  EXPECT_EQ(hash_string("abc"), 0x44BC2CF5AD770999ULL);
  EXPECT_EQ(hash_string("message digest"), 0x066ED728FCEEB3BEULL);
  EXPECT_EQ(hash_string("abcdefghijklmnopqrstuvwxyz"), 0xCFE1F278FA89835CULL);
  EXPECT_EQ(hash_string("The quick brown fox jumps over the lazy dog"), 0x0B242D361FDA71BCULL);
  EXPECT_EQ(hash_string("The quick brown fox jumps over the lazy dog", 1), 0xDF5091B6DAD2C6DBULL);
  std::string digits;
  for (int i = 0; i < 8; ++i) digits += "1234567890";
  EXPECT_EQ(hash_string(digits), 0xE04A477F19EE145DULL);
}

TEST(XxHash64, SeedAndEveryByteChangeTheHash) {
  std::mt19937_64 rng(7);
  const std::vector<unsigned char> buf = random_bytes(rng, 100);
  const uint64_t base = xxhash64(buf.data(), buf.size(), 0);
  EXPECT_NE(xxhash64(buf.data(), buf.size(), 1), base);
  for (size_t i = 0; i < buf.size(); ++i) {
    std::vector<unsigned char> flipped = buf;
    flipped[i] ^= 0x01;
    EXPECT_NE(xxhash64(flipped.data(), flipped.size(), 0), base) << "byte " << i;
  }
}

// Loads go through memcpy; this checks every misalignment gives the same answer as aligned data (and,
// under UBSan, that none of them is undefined).
TEST(XxHash64, UnalignedInputMatchesAligned) {
  std::mt19937_64 rng(11);
  for (size_t len : {0, 1, 5, 12, 31, 32, 45, 77, 200}) {
    const std::vector<unsigned char> data = random_bytes(rng, len);
    const uint64_t expected = xxhash64(data.data(), len, 99);
    std::vector<unsigned char> shifted(len + 16);
    for (size_t offset = 1; offset < 16; ++offset) {
      if (len > 0) std::memcpy(shifted.data() + offset, data.data(), len);
      EXPECT_EQ(xxhash64(shifted.data() + offset, len, 99), expected)
          << "len " << len << " offset " << offset;
      XxHash64Stream stream(99);
      stream.update(shifted.data() + offset, len);
      EXPECT_EQ(stream.digest(), expected) << "len " << len << " offset " << offset;
    }
  }
}

TEST(XxHash64Stream, MatchesOneShotForRandomSplits) {
  std::mt19937_64 rng(1234);
  for (size_t len = 0; len <= 300; ++len) {
    const std::vector<unsigned char> data = random_bytes(rng, len);
    const uint64_t seed = rng();
    const uint64_t expected = xxhash64(data.data(), len, seed);
    for (int trial = 0; trial < 20; ++trial) {
      XxHash64Stream stream(seed);
      size_t pos = 0;
      while (pos < len) {
        // Mix empty updates, tiny pieces and pieces longer than a stripe.
        const size_t max_piece = (trial % 3 == 0) ? 3 : (trial % 3 == 1) ? 40 : 100;
        size_t piece = static_cast<size_t>(rng() % (max_piece + 1));
        if (piece > len - pos) piece = len - pos;
        stream.update(data.data() + pos, piece);
        pos += piece;
      }
      ASSERT_EQ(stream.digest(), expected) << "len " << len << " trial " << trial;
    }
  }
}

TEST(XxHash64Stream, ByteAtATimeAndTwoPieceSplits) {
  std::mt19937_64 rng(99);
  const std::vector<unsigned char> data = random_bytes(rng, 300);
  for (size_t len : {0, 1, 31, 32, 33, 64, 65, 300}) {
    const uint64_t expected = xxhash64(data.data(), len, 5);
    XxHash64Stream bytewise(5);
    for (size_t i = 0; i < len; ++i) bytewise.update(data.data() + i, 1);
    EXPECT_EQ(bytewise.digest(), expected) << "len " << len;
    for (size_t split = 0; split <= len; ++split) {
      XxHash64Stream two(5);
      two.update(data.data(), split);
      two.update(data.data() + split, len - split);
      ASSERT_EQ(two.digest(), expected) << "len " << len << " split " << split;
    }
  }
}

TEST(XxHash64Stream, DigestMidStreamDoesNotDisturbAndResetStartsOver) {
  std::mt19937_64 rng(3);
  const std::vector<unsigned char> data = random_bytes(rng, 150);
  XxHash64Stream stream(42);
  stream.update(data.data(), 70);
  EXPECT_EQ(stream.digest(), xxhash64(data.data(), 70, 42));
  stream.update(data.data() + 70, 80);
  EXPECT_EQ(stream.digest(), xxhash64(data.data(), 150, 42));

  stream.reset(7);
  EXPECT_EQ(stream.digest(), xxhash64(nullptr, 0, 7));
  stream.update(data.data(), 40);
  EXPECT_EQ(stream.digest(), xxhash64(data.data(), 40, 7));
}

#ifdef GANTRY_HAVE_LIBXXHASH
TEST(XxHash64, MatchesLibxxhash) {
  std::mt19937_64 rng(2024);
  std::vector<size_t> lengths;
  for (size_t len = 0; len <= 1100; ++len) lengths.push_back(len);
  for (size_t len : {4095, 4096, 65537, 1 << 20}) lengths.push_back(len);
  for (size_t len : lengths) {
    const std::vector<unsigned char> data = random_bytes(rng, len);
    for (uint64_t seed : {uint64_t{0}, uint64_t{1}, ~uint64_t{0}, uint64_t{rng()}}) {
      const uint64_t reference = XXH64(data.data(), len, seed);
      ASSERT_EQ(xxhash64(data.data(), len, seed), reference) << "len " << len << " seed " << seed;
    }
    const uint64_t seed = rng();
    XxHash64Stream stream(seed);
    size_t pos = 0;
    while (pos < len) {
      size_t piece = static_cast<size_t>(rng() % 70);
      if (piece > len - pos) piece = len - pos;
      stream.update(data.data() + pos, piece);
      pos += piece;
    }
    ASSERT_EQ(stream.digest(), XXH64(data.data(), len, seed)) << "streamed, len " << len;
  }
}
#endif

}  // namespace
}  // namespace gantry
