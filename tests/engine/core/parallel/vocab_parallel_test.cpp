// The vocab-parallel embedding and cross-entropy (cpu/vocab_parallel_cpu.h) across real processes over
// loopback Gloo, against the one-process ops (cpu/ops_cpu.h) on the same logits: each tp rank holds only
// its vocabulary's columns of the logits (they are never gathered).
//
// Tolerance: the embedding, the softmax's share and its gradient are bitwise (the maximum is exact, the
// owner's row plus zeros is exact); the loss within 1e-6 relative, as the sum of exponentials is added
// per rank and then over the ranks in double precision where one process adds it in one run.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "engine/core/comm/gloo_communicator.h"
#include "engine/core/cpu/ops_cpu.h"
#include "engine/core/cpu/vocab_parallel_cpu.h"
#include "engine/core/rng.h"
#include "tests/engine/core/comm/worker_harness.h"

namespace gantry {
namespace {

using namespace std::chrono_literals;
using comm_test::expect_all_passed;
using comm_test::run_workers;
using comm_test::RunResult;

constexpr int kB = 2, kT = 5, kN = kB * kT, kV = 24, kC = 3;

std::vector<float> logits_of_all() {
  Rng rng{7};
  std::vector<float> l(static_cast<size_t>(kN) * kV);
  for (float& x : l) x = static_cast<float>(4.0 * rng.normal());
  return l;
}

std::vector<int32_t> tokens(uint64_t seed) {
  Rng rng{seed};
  std::vector<int32_t> t(kN);
  for (int32_t& x : t) x = static_cast<int32_t>(rng.next_u64() % kV);
  return t;
}

std::string check(int rank, int tp, int fd) {
  Result<std::unique_ptr<Communicator>> made = gloo_communicator_create(rank, tp, fd, "tp/", 30s);
  if (!made.ok()) return made.error();
  const int Vl = kV / tp, v0 = rank * Vl;
  const std::vector<float> all = logits_of_all();
  const std::vector<int32_t> targets = tokens(11), inputs = tokens(12);

  // One process: the whole vocabulary.
  std::vector<float> probs = all, losses(kN), dlogits(all.size());
  softmax_crossentropy_forward(nullptr, probs.data(), losses.data(), probs.data(), targets.data(), kN, kV);
  softmax_crossentropy_backward(nullptr, dlogits.data(), probs.data(), targets.data(), 0.25f, kN, kV);

  // This rank: its columns only.
  std::vector<float> mine(static_cast<size_t>(kN) * Vl), my_losses(kN), my_d(mine.size());
  for (int n = 0; n < kN; ++n)
    std::memcpy(&mine[static_cast<size_t>(n) * Vl], &all[static_cast<size_t>(n) * kV + v0],
                Vl * sizeof(float));
  double comm_s = 0;
  Status st = vocab_parallel_crossentropy_forward(made.value().get(), 30s, nullptr, mine.data(),
                                                  my_losses.data(), targets.data(), v0, kN, Vl, &comm_s);
  if (!st.ok()) return st.message();
  vocab_parallel_crossentropy_backward(nullptr, my_d.data(), mine.data(), targets.data(), 0.25f, v0, kN, Vl);
  for (int n = 0; n < kN; ++n) {
    if (!(std::fabs(my_losses[n] - losses[n]) <= 1e-6 * std::fabs(losses[n])))
      return "loss " + std::to_string(n) + ": " + std::to_string(my_losses[n]) + " vs " +
             std::to_string(losses[n]);
    for (int v = 0; v < Vl; ++v) {
      const size_t at = static_cast<size_t>(n) * kV + v0 + v, here = static_cast<size_t>(n) * Vl + v;
      if (mine[here] != probs[at])
        return "prob (" + std::to_string(n) + ", " + std::to_string(v0 + v) + ") differs";
      if (my_d[here] != dlogits[at])
        return "dlogit (" + std::to_string(n) + ", " + std::to_string(v0 + v) + ") differs";
    }
  }

  // The embedding: this rank's rows (zeros for the others' tokens), summed over the group, plus positions.
  Rng rng{3};
  std::vector<float> wte(static_cast<size_t>(kV) * kC), wpe(static_cast<size_t>(kT) * kC);
  for (float& x : wte) x = static_cast<float>(rng.normal());
  for (float& x : wpe) x = static_cast<float>(rng.normal());
  std::vector<float> want(static_cast<size_t>(kN) * kC), got(want.size());
  encoder_forward(want.data(), inputs.data(), wte.data(), wpe.data(), kB, kT, kC);
  vocab_parallel_encoder_forward(got.data(), inputs.data(), wte.data() + static_cast<size_t>(v0) * kC, v0, Vl,
                                 kN, kC);
  if (Status s = made.value()->all_reduce(got.data(), got.size(), 30s); !s.ok()) return s.message();
  vocab_parallel_add_positions(got.data(), wpe.data(), kB, kT, kC);
  if (got != want) return "the embedding differs from one process's";
  // Its backward: this rank's rows of dwte as one process has them, dwpe whole.
  std::vector<float> dwte(wte.size(), 0.0f), dwpe(wpe.size(), 0.0f),
      my_dwte(static_cast<size_t>(Vl) * kC, 0.0f), my_dwpe(wpe.size(), 0.0f);
  encoder_backward(dwte.data(), dwpe.data(), want.data(), inputs.data(), kB, kT, kC);
  vocab_parallel_encoder_backward(my_dwte.data(), my_dwpe.data(), want.data(), inputs.data(), v0, Vl, kB, kT,
                                  kC);
  if (my_dwpe != dwpe) return "dwpe differs";
  if (std::memcmp(my_dwte.data(), dwte.data() + static_cast<size_t>(v0) * kC,
                  my_dwte.size() * sizeof(float)) != 0)
    return "dwte rows differ";
  return "";
}

TEST(VocabParallel, CrossEntropyAndEmbeddingMatchOneProcess) {
  for (int tp : {2, 4}) {
    SCOPED_TRACE("tp " + std::to_string(tp));
    const RunResult res = run_workers(
        tp, [&](int rank, int n, int fd) { return check(rank, n, fd); }, 60s);
    ASSERT_EQ(res.workers.size(), static_cast<size_t>(tp));
    expect_all_passed(res);  // each rank's check: "" or what differed
  }
}

}  // namespace
}  // namespace gantry
