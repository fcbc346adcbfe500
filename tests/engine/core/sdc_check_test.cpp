// The silent-data-corruption check's parts: the majority logic (ties included), the hashes' trip through
// floats, the replica hash, and the CPU backend's replicated state and test fault.
#include "engine/core/sdc_check.h"

#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "engine/core/backend.h"
#include "engine/core/gpt.h"
#include "engine/core/replica_hash.h"

namespace gantry {
namespace {

using Ranks = std::vector<int>;

TEST(SdcJudge, AllAgreeIsNoMismatch) {
  const SdcVerdict v = sdc_judge({7, 7, 7, 7});
  EXPECT_FALSE(v.mismatch);
  EXPECT_TRUE(v.majority);
  EXPECT_EQ(v.majority_hash, 7u);
  EXPECT_EQ(v.agreeing, 4);
  EXPECT_TRUE(v.suspects.empty());
}

TEST(SdcJudge, OneOfFourDifferingIsNamedAlone) {
  const SdcVerdict v = sdc_judge({7, 7, 9, 7});
  EXPECT_TRUE(v.mismatch);
  EXPECT_TRUE(v.majority);
  EXPECT_EQ(v.majority_hash, 7u);
  EXPECT_EQ(v.agreeing, 3);
  EXPECT_EQ(v.suspects, Ranks({2}));
}

TEST(SdcJudge, TwoOfFiveDifferingEachOtherAreBothNamed) {
  const SdcVerdict v = sdc_judge({1, 5, 5, 6, 5});
  EXPECT_TRUE(v.majority);
  EXPECT_EQ(v.majority_hash, 5u);
  EXPECT_EQ(v.agreeing, 3);
  EXPECT_EQ(v.suspects, Ranks({0, 3}));
}

TEST(SdcJudge, TwoReplicasDisagreeingHaveNoMajorityAndBothAreNamed) {
  const SdcVerdict v = sdc_judge({3, 4});
  EXPECT_TRUE(v.mismatch);
  EXPECT_FALSE(v.majority);
  EXPECT_EQ(v.agreeing, 0);
  EXPECT_EQ(v.suspects, Ranks({0, 1}));
}

TEST(SdcJudge, ATieIsNoMajorityAndNamesEveryRank) {
  const SdcVerdict v = sdc_judge({3, 4, 4, 3});
  EXPECT_TRUE(v.mismatch);
  EXPECT_FALSE(v.majority) << "half is not a majority";
  EXPECT_EQ(v.suspects, Ranks({0, 1, 2, 3}));
}

TEST(SdcJudge, APluralityWithoutAMajorityNamesEveryRank) {
  // Two of four agree and two others each differ: the two may share one corruption, so nobody is cleared.
  const SdcVerdict v = sdc_judge({8, 8, 1, 2});
  EXPECT_FALSE(v.majority);
  EXPECT_EQ(v.suspects, Ranks({0, 1, 2, 3}));
}

TEST(SdcJudge, ThreeReplicasTwoAgainstOneIsAMajority) {
  const SdcVerdict v = sdc_judge({0xffffffffffffffffull, 2, 0xffffffffffffffffull});
  EXPECT_TRUE(v.majority);
  EXPECT_EQ(v.majority_hash, 0xffffffffffffffffull);
  EXPECT_EQ(v.suspects, Ranks({1}));
}

TEST(SdcJudge, OneReplicaAlwaysAgreesWithItself) {
  EXPECT_FALSE(sdc_judge({42}).mismatch);
}

TEST(SdcHashSlots, SurviveTheirTripThroughFloatsAndASumWithZeros) {
  for (uint64_t h : std::vector<uint64_t>{0, 1, 0xffffffffffffffffull, 0x8000000000000001ull,
                                          0x0123456789abcdefull, 0xfedcba9876543210ull}) {
    float slots[kSdcFloatsPerHash];
    sdc_hash_encode(h, slots);
    for (float& f : slots) f += 0.0f;  // what the other ranks add
    EXPECT_EQ(sdc_hash_decode(slots), h) << std::hex << h;
  }
}

TEST(ReplicaHash, EqualBytesGiveEqualHashesAndAnyFlippedBitChangesIt) {
  std::vector<unsigned char> a(1003);
  for (size_t i = 0; i < a.size(); ++i) a[i] = static_cast<unsigned char>(i * 37 + 11);
  std::vector<unsigned char> b = a;
  const uint64_t h = replica_hash(a.data(), a.size());
  EXPECT_EQ(replica_hash(b.data(), b.size()), h);
  // Every bit, the zero-padded tail's included.
  for (size_t bit = 0; bit < a.size() * 8; ++bit) {
    b[bit / 8] ^= static_cast<unsigned char>(1u << (bit % 8));
    ASSERT_NE(replica_hash(b.data(), b.size()), h) << "bit " << bit;
    b[bit / 8] ^= static_cast<unsigned char>(1u << (bit % 8));
  }
}

TEST(ReplicaHash, DependsOnPositionAndLength) {
  std::vector<uint64_t> words = {1, 2, 3, 4};
  std::vector<uint64_t> swapped = {2, 1, 3, 4};
  EXPECT_NE(replica_hash(words.data(), 32), replica_hash(swapped.data(), 32)) << "a sum of the words alone";
  std::vector<unsigned char> zeros(16, 0);
  EXPECT_NE(replica_hash(zeros.data(), 15), replica_hash(zeros.data(), 16)) << "a zero tail must count";
  EXPECT_NE(replica_hash(zeros.data(), 0), replica_hash(zeros.data(), 8));
}

TEST(ReplicaHash, IsTheSumOfItsTermsInAnyOrder) {
  // The definition the GPU's reduction relies on (cuda/replica_hash.cuh): terms added in any order.
  std::vector<uint64_t> w(257);
  for (size_t i = 0; i < w.size(); ++i) w[i] = i * 0x9e3779b97f4a7c15ull;
  uint64_t backwards = replica_hash_mix(w.size() * 8);
  for (size_t i = w.size(); i-- > 0;) backwards += replica_hash_term(i, w[i]);
  EXPECT_EQ(replica_hash(w.data(), w.size() * 8), backwards);
}

TEST(CpuBackendReplica, HashesItsFullParametersAndTheTestFaultChangesThem) {
  const ModelConfig m{.n_layer = 1, .n_head = 2, .n_embd = 16, .vocab_size = 32, .seq_len = 8};
  std::unique_ptr<Backend> a = backend_cpu_create(m, 2, 1), b = backend_cpu_create(m, 2, 1);
  const size_t n = a->params().numel();
  std::vector<float> theta(n);
  gpt_init_params(m, a->params(), 3, theta.data());
  a->write_state(StateBuffer::kParams, 0, n, theta.data());
  b->write_state(StateBuffer::kParams, 0, n, theta.data());
  EXPECT_EQ(a->replicated_state(), "fp32 parameters");
  EXPECT_EQ(a->replicated_bytes(), n * sizeof(float));
  EXPECT_EQ(a->replicated_hash(), replica_hash(theta.data(), n * sizeof(float)));
  EXPECT_EQ(a->replicated_hash(), b->replicated_hash());

  const uint64_t bit = (n / 2) * 32 + 5;
  ASSERT_TRUE(b->test_flip_replicated_bit(bit));
  EXPECT_NE(a->replicated_hash(), b->replicated_hash());
  std::vector<float> after(n);
  b->read_state(StateBuffer::kParams, 0, n, after.data());
  size_t differing = 0;
  for (size_t i = 0; i < n; ++i) differing += std::memcmp(&after[i], &theta[i], sizeof(float)) != 0;
  EXPECT_EQ(differing, 1u) << "one bit of one parameter";
  EXPECT_FALSE(b->test_flip_replicated_bit(n * 32)) << "past the end";
  ASSERT_TRUE(b->test_flip_replicated_bit(bit));  // flipped back
  EXPECT_EQ(a->replicated_hash(), b->replicated_hash());
}

}  // namespace
}  // namespace gantry
