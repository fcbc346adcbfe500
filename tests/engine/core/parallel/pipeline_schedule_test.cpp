// The pipeline's arithmetic: stages balanced by cost, the schedules' action orders and what they hold, the
// bubble formula, and the layouts refused with the numbers named.
#include "engine/core/parallel/pipeline_schedule.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "engine/core/gpt.h"
#include "engine/core/parallel/shard_plan.h"

namespace gantry {
namespace {

using ::testing::HasSubstr;

Config tiny(int layers) {
  Result<Config> c = config_load(std::string(GANTRY_SOURCE_DIR "/assets/configs/tiny.toml"));
  EXPECT_TRUE(c.ok()) << c.error();
  Config cfg = c.value();
  cfg.model.n_layer = layers;
  cfg.train.checkpoint_every = 0;
  return cfg;
}

ParallelDims dims(int world, int dp, int tp, int pp, int zero = 0) {
  Result<ParallelDims> d =
      ParallelDims::make({.world = world, .rank = 0, .dp = dp, .tp = tp, .pp = pp, .zero = zero});
  EXPECT_TRUE(d.ok()) << d.error();
  return d.value();
}

TEST(PipelinePartition, EqualBlocksSplitEvenlyWhenTheHeadIsCheap) {
  const Config c = tiny(4);
  const PipelinePartition p = pipeline_partition(c.model, 2);
  EXPECT_EQ(p.layers, (std::vector<int>{2, 2}));
  EXPECT_EQ(p.first_layer, (std::vector<int>{0, 2}));
  const PipelinePartition q = pipeline_partition(c.model, 4);
  EXPECT_EQ(q.layers, (std::vector<int>{1, 1, 1, 1}));
}

TEST(PipelinePartition, ACostlyClassifierTakesLayersOffTheLastStage) {
  // vocab 65536 at d 64: the classifier's forward and input gradient (2 x 2VC per token) outweigh several
  // blocks, so the last stage gets fewer of them; the first stage's share of the head (VC) counts too.
  Config c = tiny(8);
  c.model.vocab_size = 65536;
  const PipelinePartition p = pipeline_partition(c.model, 2);
  EXPECT_EQ(p.layers[0] + p.layers[1], 8);
  EXPECT_GT(p.layers[0], p.layers[1]) << p.describe();
  // Optimal: no other split has a smaller costliest stage.
  const double block = pipeline_block_cost(c.model), vc = 2.0 * c.model.vocab_size * c.model.n_embd;
  const double best = std::max(p.cost[0], p.cost[1]);
  for (int k = 1; k < 8; ++k) EXPECT_LE(best, std::max(k * block + vc, (8 - k) * block + 2 * vc) + 1e-6);
}

// The GPU stage computes the classifier's weight gradient on the last stage (the CPU pipeline on the first):
// priced where it runs, the last stage gives up more layers. Call X6 (docs/PERF.md): at 350M on pp 2 the
// first-stage pricing left the last stage's backward 25 % longer than the first's.
TEST(PipelinePartition, TheClassifierGradientIsPricedOnTheStageThatRunsIt) {
  Config m = tiny(24);  // GPT-2 350M's shape
  m.model.n_embd = 1024;
  m.model.n_head = 16;
  m.model.vocab_size = 50304;
  m.model.seq_len = 1024;
  const PipelinePartition cpu = pipeline_partition(m.model, 2);
  const PipelinePartition gpu = pipeline_partition(m.model, 2, ClassifierGradStage::kLast);
  EXPECT_EQ(cpu.layers, (std::vector<int>{13, 11})) << cpu.describe();
  EXPECT_EQ(gpu.layers, (std::vector<int>{14, 10})) << gpu.describe();
  const double block = pipeline_block_cost(m.model), vc = 2.0 * m.model.vocab_size * m.model.n_embd;
  EXPECT_DOUBLE_EQ(gpu.cost[0], gpu.layers[0] * block);
  EXPECT_DOUBLE_EQ(gpu.cost[1], gpu.layers[1] * block + 3 * vc);
  // Optimal: no other split has a smaller costliest stage.
  const double best = std::max(gpu.cost[0], gpu.cost[1]);
  for (int k = 1; k < 24; ++k) EXPECT_LE(best, std::max(k * block, (24 - k) * block + 3 * vc) + 1e-6);
}

TEST(PipelinePartition, StageTablesCoverTheModelOnceAndSliceByName) {
  const Config c = tiny(4);
  const TensorTable whole = gpt_param_table(c.model);
  std::vector<float> all(whole.numel());
  std::iota(all.begin(), all.end(), 0.0f);
  const PipelinePartition p = pipeline_partition(c.model, 3);
  std::set<std::string> seen;
  size_t total = 0;
  for (int s = 0; s < 3; ++s) {
    const TensorTable t = pipeline_stage_table(c.model, p, s);
    std::vector<float> mine(t.numel());
    pipeline_slice(whole, all.data(), t, mine.data());
    for (const TensorInfo& x : t.tensors()) {
      EXPECT_TRUE(seen.insert(x.name).second) << x.name << " on two stages";
      EXPECT_EQ(mine[x.offset], all[whole.at(x.name).offset]) << x.name;
      EXPECT_EQ(mine[x.offset + x.numel - 1], all[whole.at(x.name).offset + x.numel - 1]) << x.name;
    }
    total += t.numel();
  }
  EXPECT_EQ(total, whole.numel());
  EXPECT_NE(pipeline_stage_table(c.model, p, 0).find("wte"), nullptr);  // owned by the first stage
  EXPECT_NE(pipeline_stage_table(c.model, p, 2).find("lnf.weight"), nullptr);
}

// An interleaved GPU stage begins a dp bucket at each of its chunks 1 to vp − 1's first block (the plan both
// backend_cuda.cu and train.cpp's printout build): pipeline_chunk_bucket_starts names the unit of the rank
// table's shard plan that holds that block, for every rank of pp 2-4 at vp 1-3; each then starts a bucket,
// however large the buckets may be.
TEST(PipelinePartition, ChunkBucketStartsAreEachChunksFirstBlock) {
  const Config c = tiny(12);
  for (int pp = 2; pp <= 4; ++pp) {
    for (int vp = 1; vp <= 3; ++vp) {
      const PipelinePartition part = pipeline_partition(c.model, pp * vp, ClassifierGradStage::kLast);
      for (int rank = 0; rank < pp; ++rank) {
        SCOPED_TRACE("pp " + std::to_string(pp) + " vp " + std::to_string(vp) + " rank " +
                     std::to_string(rank));
        const TensorTable t = pipeline_rank_table(c.model, part, pp, rank);
        const std::vector<int> starts = pipeline_chunk_bucket_starts(part, pp, rank);
        ASSERT_EQ(starts.size(), static_cast<size_t>(vp - 1));
        const ShardPlan plan = shard_plan_make(t, 2, 0, 2, size_t{1} << 30, starts);
        for (int chunk = 1; chunk < vp; ++chunk) {
          const int u = starts[static_cast<size_t>(chunk - 1)];
          const int first_layer = part.first_layer[static_cast<size_t>(chunk * pp + rank)];
          const TensorInfo* first = nullptr;
          for (const TensorInfo& x : t.tensors())
            if (first == nullptr && x.layer == first_layer) first = &x;
          ASSERT_NE(first, nullptr) << "layer " << first_layer;
          ASSERT_TRUE(u >= 1 && u < static_cast<int>(plan.units.size())) << u;
          EXPECT_EQ(plan.units[static_cast<size_t>(u)].offset, first->offset) << "chunk " << chunk;
          EXPECT_NE(plan.unit_bucket[static_cast<size_t>(u)], plan.unit_bucket[static_cast<size_t>(u - 1)])
              << "chunk " << chunk;
        }
        // Without them the 1 GiB buckets hold every unit above unit 0 together (unit 0, the embeddings or on
        // a later rank its first block, is always a bucket of its own).
        const ShardPlan whole = shard_plan_make(t, 2, 0, 2, size_t{1} << 30);
        for (int u : starts) {
          if (u - 1 >= 1) {
            EXPECT_EQ(whole.unit_bucket[static_cast<size_t>(u)],
                      whole.unit_bucket[static_cast<size_t>(u - 1)]);
          }
        }
      }
    }
  }
}

// Every micro-batch's forward comes before its backward, backwards run in micro-batch order, and the
// activations held never exceed the schedule's bound: m for GPipe, pp - stage for 1F1B.
TEST(PipelineActions, OrdersAndActivationsHeld) {
  for (PipelineSchedule s : {PipelineSchedule::kGpipe, PipelineSchedule::kOneFOneB}) {
    for (int pp : {2, 4}) {
      for (int m : {4, 8}) {
        for (int stage = 0; stage < pp; ++stage) {
          const std::vector<PipelineAction> a = pipeline_actions(s, pp, stage, m);
          ASSERT_EQ(a.size(), static_cast<size_t>(2 * m));
          std::vector<int> forward_at(m, -1);
          int next_backward = 0;
          for (size_t i = 0; i < a.size(); ++i) {
            if (a[i].op == PipelineOp::kForward) {
              forward_at[a[i].micro] = static_cast<int>(i);
            } else {
              EXPECT_EQ(a[i].micro, next_backward++);
              EXPECT_GE(forward_at[a[i].micro], 0);
            }
          }
          const int bound = s == PipelineSchedule::kGpipe ? m : std::min(m, pp - stage);
          EXPECT_EQ(pipeline_in_flight(a), bound)
              << pipeline_schedule_name(s) << " pp " << pp << " stage " << stage << " m " << m;
        }
      }
    }
  }
}

// Interleaved 1F1B: every (chunk, micro-batch) once forward and once backward, each chunk's backward passes
// in micro-batch order, a forward before its backward; Megatron's warm-up 2(p - s - 1) + (v - 1)p.
TEST(PipelineActions, InterleavedVisitsEveryChunkInOrder) {
  for (int pp : {2, 4}) {
    for (int vp : {2, 3}) {
      for (int m : {pp, 2 * pp, 4 * pp}) {
        for (int stage = 0; stage < pp; ++stage) {
          const std::vector<PipelineAction> a =
              pipeline_actions(PipelineSchedule::kInterleaved, pp, stage, m, vp);
          ASSERT_EQ(a.size(), static_cast<size_t>(2 * m * vp));
          std::vector<std::vector<int>> forward_at(vp, std::vector<int>(m, -1));
          std::vector<int> next_backward(vp, 0), next_forward(vp, 0);
          int warmup = 0;
          for (size_t i = 0; i < a.size(); ++i) {
            ASSERT_GE(a[i].chunk, 0);
            ASSERT_LT(a[i].chunk, vp);
            if (a[i].op == PipelineOp::kForward) {
              EXPECT_EQ(a[i].micro, next_forward[a[i].chunk]++);
              forward_at[a[i].chunk][a[i].micro] = static_cast<int>(i);
              if (warmup == static_cast<int>(i)) ++warmup;
            } else {
              EXPECT_EQ(a[i].op, PipelineOp::kBackward);
              EXPECT_EQ(a[i].micro, next_backward[a[i].chunk]++);
              EXPECT_GE(forward_at[a[i].chunk][a[i].micro], 0);
            }
          }
          // The warm-up, then one more forward before the first backward.
          EXPECT_EQ(warmup,
                    std::min(2 * (pp - stage - 1) + (vp - 1) * pp, m * vp) + (warmup < m * vp ? 1 : 0))
              << "pp " << pp << " vp " << vp << " m " << m << " stage " << stage;
        }
      }
    }
  }
}

// ZB-H1: F, B (input gradient) and W (weight gradient) once each per micro-batch, B and W in micro-batch
// order, W after its B; at most pp activations held on every stage (1F1B's peak).
TEST(PipelineActions, ZeroBubbleSplitsTheBackwardAndHoldsWhat1F1BHolds) {
  for (int pp : {2, 4, 8}) {
    for (int m : {pp, 2 * pp, 3 * pp + 1}) {
      for (int stage = 0; stage < pp; ++stage) {
        const std::vector<PipelineAction> a = pipeline_actions(PipelineSchedule::kZeroBubbleH1, pp, stage, m);
        ASSERT_EQ(a.size(), static_cast<size_t>(3 * m));
        int f = 0, b = 0, w = 0;
        for (const PipelineAction& x : a) {
          if (x.op == PipelineOp::kForward) {
            EXPECT_EQ(x.micro, f++);
          }
          if (x.op == PipelineOp::kInput) {
            EXPECT_EQ(x.micro, b++);
            EXPECT_LT(x.micro, f);
          }
          if (x.op == PipelineOp::kWeight) {
            EXPECT_EQ(x.micro, w++);
            EXPECT_LT(x.micro, b);
          }
          EXPECT_NE(x.op, PipelineOp::kBackward);
        }
        EXPECT_EQ(pipeline_in_flight(a), pp) << "pp " << pp << " m " << m << " stage " << stage;
      }
    }
  }
}

// Every schedule's program, simulated with unit costs, leaves the idle fraction of its formula: GPipe and
// 1F1B (p-1)/(m+p-1), interleaved (p-1)/(vm+p-1), ZB-H1 (p-1)/(3m+p-1), a third of 1F1B's idle time.
TEST(PipelineProgram, SimulatedBubbleIsEachSchedulesFormula) {
  struct Case {
    PipelineSchedule s;
    int pp, vp, m;
  };
  for (const Case& c :
       {Case{PipelineSchedule::kGpipe, 4, 1, 8}, Case{PipelineSchedule::kOneFOneB, 2, 1, 4},
        Case{PipelineSchedule::kOneFOneB, 8, 1, 16}, Case{PipelineSchedule::kInterleaved, 2, 2, 4},
        Case{PipelineSchedule::kInterleaved, 4, 2, 8}, Case{PipelineSchedule::kInterleaved, 8, 2, 16},
        Case{PipelineSchedule::kZeroBubbleH1, 2, 1, 4}, Case{PipelineSchedule::kZeroBubbleH1, 4, 1, 8},
        Case{PipelineSchedule::kZeroBubbleH1, 8, 1, 16}}) {
    EXPECT_NEAR(pipeline_simulated_bubble(c.s, c.pp, c.vp, c.m),
                pipeline_schedule_bubble(c.s, c.pp, c.vp, c.m), 1e-12)
        << pipeline_schedule_name(c.s) << " pp " << c.pp << " vp " << c.vp << " m " << c.m;
  }
  EXPECT_DOUBLE_EQ(pipeline_schedule_bubble(PipelineSchedule::kZeroBubbleH1, 4, 1, 8), 3.0 / 27.0);
}

// Timed with the unit costs the messages were placed by (and transfers free), every schedule's programs
// leave the formula's idle fraction on the busiest rank, messages and all: the timing runs the programs the
// engines run, in their order.
TEST(PipelineProgram, TimedWithUnitCostsTheProgramsLeaveTheFormulasBubble) {
  for (const auto& [pp, m] : std::vector<std::pair<int, int>>{{2, 4}, {4, 8}, {8, 16}, {4, 4}})
    for (PipelineSchedule s : {PipelineSchedule::kGpipe, PipelineSchedule::kOneFOneB,
                               PipelineSchedule::kInterleaved, PipelineSchedule::kZeroBubbleH1}) {
      const int vp = s == PipelineSchedule::kInterleaved ? 2 : 1;
      const size_t stages = static_cast<size_t>(pp * vp);
      PipelineCosts c{.forward = std::vector<double>(stages, 1.0),
                      .backward = std::vector<double>(stages, 2.0),
                      .input = std::vector<double>(stages, 1.0),
                      .weight = std::vector<double>(stages, 1.0)};
      const PipelineTiming t = pipeline_program_timing(s, pp, vp, m, c);
      const double busy = *std::max_element(t.busy.begin(), t.busy.end());
      EXPECT_DOUBLE_EQ(busy, 3.0 * m * vp);
      EXPECT_NEAR((t.makespan - busy) / t.makespan, pipeline_schedule_bubble(s, pp, vp, m), 1e-12)
          << pipeline_schedule_name(s) << " pp " << pp << " m " << m;
    }
}

// What the formula leaves out, and what placing the messages by the passes' costs gives back (docs/PERF.md
// calls U2-U3: GPT-2 350M at tp 2 x pp 2 on 4 NVIDIA H200, 8 micro-batches of 16, each pass's mean from a
// per-step timeline). On the GPU the last stage runs the classifier inside its backward and ZB-H1's input
// pass costs more than a forward (stage 0: forward 10.9 ms, input 13.1, weight 4.7; the last: 7.6, 14.6,
// 4.4). With the messages placed by units, stage 0 waited for a gradient before a forward that did not
// need it: the schedule ran 277.1 ms, 13 % over 1F1B. Placed by those costs, it ran 245.4 ms.
TEST(PipelineProgram, MessagesPlacedByTheMeasuredCostsLetZeroBubbleWork) {
  const PipelineCosts c{.forward = {10.9, 7.6},
                        .backward = {16.1, 18.0},
                        .input = {13.1, 14.6},
                        .weight = {4.7, 4.5},
                        .transfer_s = 0.1};
  const PipelineSchedule zb = PipelineSchedule::kZeroBubbleH1;
  // Units: the model of the program keeps the measured span within 1 %, and so with the costs.
  EXPECT_NEAR(pipeline_program_timing(zb, 2, 1, 8, c, false).makespan, 277.1, 0.01 * 277.1);
  EXPECT_NEAR(pipeline_program_timing(zb, 2, 1, 8, c).makespan, 245.4, 0.01 * 245.4);
  // Where it went: stage 0's second gradient. By units it comes before the third forward, which does not
  // need it; by the costs after it (the input pass that produces it ends later than that forward starts).
  auto order = [](const std::vector<PipelineStep>& prog) {
    std::string s;
    for (const PipelineStep& x : prog) {
      if (x.kind == PipelineStep::Kind::kCompute) {
        s += std::string(x.action.op == PipelineOp::kForward ? "F"
                         : x.action.op == PipelineOp::kInput ? "I"
                                                             : "W");
      } else {
        s += std::string(x.kind == PipelineStep::Kind::kSend ? "s" : "r") + (x.grad ? "G" : "A");
      }
      s += std::to_string(x.action.micro) + " ";
    }
    return s;
  };
  EXPECT_THAT(order(pipeline_program(zb, 2, 1, 0, 8)), HasSubstr("W0 rG1 F2 sA2 I1"));
  EXPECT_THAT(order(pipeline_program(zb, 2, 1, 0, 8, &c)), HasSubstr("W0 F2 rG1 sA2 I1"));
  // The placement moves only messages: each rank's computes keep their order (and so the numbers).
  for (int r = 0; r < 2; ++r) {
    std::vector<std::string> units, costed;
    for (const PipelineStep& x : pipeline_program(zb, 2, 1, r, 8))
      if (x.kind == PipelineStep::Kind::kCompute) units.push_back(order({x}));
    for (const PipelineStep& x : pipeline_program(zb, 2, 1, r, 8, &c))
      if (x.kind == PipelineStep::Kind::kCompute) costed.push_back(order({x}));
    EXPECT_EQ(units, costed) << "rank " << r;
  }
  EXPECT_TRUE(pipeline_placement_keeps_slots(zb, 2, 1, 8, c));
  // Equal passes (F = I = W) have the formula's gain either way.
  const PipelineCosts equal{.forward = {1, 1}, .backward = {2, 2}, .input = {1, 1}, .weight = {1, 1}};
  for (bool place : {false, true}) {
    EXPECT_LT(pipeline_program_timing(zb, 2, 1, 8, equal, place).makespan,
              0.95 * pipeline_program_timing(PipelineSchedule::kOneFOneB, 2, 1, 8, equal, place).makespan);
  }
}

// A placement by costs can take a slot earlier than units do: an activation that arrives before the pass
// that would free a slot is received into a new one. The GPU stage keeps units then (its memory is the
// planner's, counted by units): pipeline_placement_keeps_slots says which.
TEST(PipelineProgram, APlacementThatTakesMoreSlotsIsRefused) {
  const PipelineSchedule zb = PipelineSchedule::kZeroBubbleH1;
  const PipelineCosts fast_first{
      .forward = {0.59, 2.72}, .backward = {0.65, 0.53}, .input = {2.22, 2.21}, .weight = {2.60, 2.53}};
  const std::vector<int> units = pipeline_program_slots(pipeline_program(zb, 2, 1, 1, 4), 1, 1, 4, true);
  const std::vector<int> placed =
      pipeline_program_slots(pipeline_program(zb, 2, 1, 1, 4, &fast_first), 1, 1, 4, true);
  EXPECT_EQ(units, std::vector<int>{2});
  EXPECT_EQ(placed, std::vector<int>{3});
  EXPECT_FALSE(pipeline_placement_keeps_slots(zb, 2, 1, 4, fast_first));
  // 1F1B and GPipe take none more with these costs.
  EXPECT_TRUE(pipeline_placement_keeps_slots(PipelineSchedule::kOneFOneB, 2, 1, 4, fast_first));
  EXPECT_TRUE(pipeline_placement_keeps_slots(PipelineSchedule::kGpipe, 2, 1, 4, fast_first));
}

// Uneven passes for placements: every virtual stage's forward, backward, input and weight pass different
// (a fixed pseudo-random draw between 0.2 and 3 units), `seed` choosing the draw.
PipelineCosts uneven_costs(int stages, unsigned seed) {
  PipelineCosts c;
  unsigned x = seed * 2654435761u + 1;
  auto next = [&] {
    x = x * 1664525u + 1013904223u;
    return 0.2 + 2.8 * static_cast<double>(x >> 8) / static_cast<double>(1u << 24);
  };
  for (int v = 0; v < stages; ++v) {
    c.forward.push_back(next());
    c.backward.push_back(next());
    c.input.push_back(next());
    c.weight.push_back(next());
  }
  return c;
}

// The programs pair up: rank r's k-th send to rank q is rank q's k-th receive from r, the same message
// (activation or gradient, micro-batch, chunks next to each other), and every rank's messages come in one
// global order (so blocking sends cannot deadlock): merging the ranks' message lists by that order works.
TEST(PipelineProgram, SendsAndReceivesPairUpInOneOrder) {
  // Every schedule at pp 2, 3 and 4 with m = pp and 2·pp micro-batches (the GPU stage's sends and
  // receives, cuda/backend_cuda.cu, are these programs' at any tp).
  for (const auto& [pp, m] : std::vector<std::pair<int, int>>{{2, 2}, {2, 4}, {3, 3}, {3, 6}, {4, 4}, {4, 8}})
    for (PipelineSchedule s : {PipelineSchedule::kGpipe, PipelineSchedule::kOneFOneB,
                               PipelineSchedule::kInterleaved, PipelineSchedule::kZeroBubbleH1}) {
      const int vp = s == PipelineSchedule::kInterleaved ? 2 : 1;
      // Placed by units, and by three uneven sets of costs (any placement must pair up).
      for (unsigned seed = 0; seed < 4; ++seed) {
        const PipelineCosts costs = uneven_costs(pp * vp, seed);
        SCOPED_TRACE("pp " + std::to_string(pp) + ", m " + std::to_string(m) + ", costs " +
                     std::to_string(seed));
        std::vector<std::vector<PipelineStep>> prog(pp);
        for (int r = 0; r < pp; ++r) prog[r] = pipeline_program(s, pp, vp, r, m, seed > 0 ? &costs : nullptr);
        // Replay with rendezvous: a message goes when its sender is at the send and its receiver at the
        // receive.
        std::vector<size_t> at(pp, 0);
        size_t messages = 0;
        for (bool moved = true; moved;) {
          moved = false;
          for (int r = 0; r < pp; ++r) {
            while (at[r] < prog[r].size() && prog[r][at[r]].kind == PipelineStep::Kind::kCompute)
              ++at[r], moved = true;
            if (at[r] >= prog[r].size() || prog[r][at[r]].kind != PipelineStep::Kind::kSend) continue;
            const PipelineStep& x = prog[r][at[r]];
            const int q = x.peer;
            while (at[q] < prog[q].size() && prog[q][at[q]].kind == PipelineStep::Kind::kCompute) ++at[q];
            if (at[q] >= prog[q].size()) continue;
            const PipelineStep& y = prog[q][at[q]];
            if (y.kind != PipelineStep::Kind::kRecv || y.peer != r) continue;
            EXPECT_EQ(x.grad, y.grad);
            EXPECT_EQ(x.action.micro, y.action.micro);
            const int from = x.action.chunk * pp + r, to = y.action.chunk * pp + q;
            EXPECT_EQ(to, x.grad ? from - 1 : from + 1);
            ++at[r], ++at[q], ++messages, moved = true;
          }
        }
        for (int r = 0; r < pp; ++r)
          EXPECT_EQ(at[r], prog[r].size()) << pipeline_schedule_name(s) << " rank " << r;
        // Each micro-batch crosses pp·vp - 1 boundaries each way.
        EXPECT_EQ(messages, static_cast<size_t>(2 * m * (pp * vp - 1))) << pipeline_schedule_name(s);
      }
    }
}

// The GPU stage at ZeRO 2-3 (cuda/backend_cuda.cu, pipeline_step) makes each micro-batch's completing pass
// (a whole backward of one chunk; ZB-H1's weight pass) a micro-batch of its dp state, reduced as it goes,
// so stage 0 takes the tied classifier's gradient (sent by the last stage after its program) just before
// its last one, which must be its program's last step, chunk 0's (the embeddings'), with no message after
// it; each stage runs m of them per chunk, each chunk's in micro-batch order (the dp state's count). With
// that extra message the programs still pair up in one order: a rendezvous replay (every send waits for
// its receive) finishes on every rank.
TEST(PipelineProgram, TheTiedGradientReachesStageZeroBeforeItsLastBackward) {
  for (const auto& [pp, m] : std::vector<std::pair<int, int>>{{2, 2}, {2, 4}, {3, 3}, {3, 6}, {4, 4}, {4, 8}})
    for (PipelineSchedule s : {PipelineSchedule::kGpipe, PipelineSchedule::kOneFOneB,
                               PipelineSchedule::kZeroBubbleH1, PipelineSchedule::kInterleaved}) {
      const int vp = s == PipelineSchedule::kInterleaved ? 2 : 1;
      SCOPED_TRACE(std::string(pipeline_schedule_name(s)) + " pp " + std::to_string(pp) + ", m " +
                   std::to_string(m));
      const PipelineOp completes =
          s == PipelineSchedule::kZeroBubbleH1 ? PipelineOp::kWeight : PipelineOp::kBackward;
      for (unsigned seed = 0; seed < 4; ++seed) {  // units, and three uneven sets of costs
        const PipelineCosts costs = uneven_costs(pp * vp, seed);
        SCOPED_TRACE("costs " + std::to_string(seed));
        std::vector<std::vector<PipelineStep>> prog(pp);
        for (int r = 0; r < pp; ++r) {
          prog[r] = pipeline_program(s, pp, vp, r, m, seed > 0 ? &costs : nullptr);
          std::vector<std::vector<int>> order(vp);
          for (const PipelineStep& x : prog[r]) {
            if (x.kind == PipelineStep::Kind::kCompute && x.action.op == completes) {
              order[x.action.chunk].push_back(x.action.micro);
            }
          }
          std::vector<int> expected(m);
          for (int k = 0; k < m; ++k) expected[k] = k;
          for (int c = 0; c < vp; ++c) EXPECT_EQ(order[c], expected) << "rank " << r << " chunk " << c;
        }
        ASSERT_FALSE(prog[0].empty());
        EXPECT_EQ(prog[0].back().kind, PipelineStep::Kind::kCompute);
        EXPECT_EQ(prog[0].back().action.op, completes);
        EXPECT_EQ(prog[0].back().action.chunk, 0);
        PipelineStep send{.kind = PipelineStep::Kind::kSend, .peer = 0};
        PipelineStep recv{.kind = PipelineStep::Kind::kRecv, .peer = pp - 1};
        send.action.micro = recv.action.micro = -1;  // the tied gradient: no micro-batch's
        prog[pp - 1].push_back(send);
        prog[0].insert(prog[0].end() - 1, recv);
        std::vector<size_t> at(pp, 0);
        auto skip_computes = [&](int r) {
          while (at[r] < prog[r].size() && prog[r][at[r]].kind == PipelineStep::Kind::kCompute) ++at[r];
        };
        for (bool moved = true; moved;) {
          moved = false;
          for (int r = 0; r < pp; ++r) {
            skip_computes(r);
            if (at[r] >= prog[r].size() || prog[r][at[r]].kind != PipelineStep::Kind::kSend) continue;
            const PipelineStep& x = prog[r][at[r]];
            skip_computes(x.peer);
            if (at[x.peer] >= prog[x.peer].size()) continue;
            const PipelineStep& y = prog[x.peer][at[x.peer]];
            if (y.kind != PipelineStep::Kind::kRecv || y.peer != r) continue;
            EXPECT_EQ(x.action.micro, y.action.micro);
            ++at[r], ++at[x.peer], moved = true;
          }
        }
        for (int r = 0; r < pp; ++r) {
          skip_computes(r);
          EXPECT_EQ(at[r], prog[r].size()) << "rank " << r << " stopped";
        }
      }
    }
}

TEST(PipelineBubble, Formula) {
  EXPECT_DOUBLE_EQ(pipeline_bubble_formula(4, 1, 8), 3.0 / 11.0);
  EXPECT_DOUBLE_EQ(pipeline_bubble_formula(4, 2, 8), 3.0 / 19.0);
  EXPECT_DOUBLE_EQ(pipeline_bubble_formula(1, 1, 8), 0.0);
}

TEST(PipelineCheck, RefusesBadLayoutsNamingTheNumbers) {
  Config c = tiny(2);
  c.train.micro_batch = 2;  // 8 micro-batches at dp 1
  EXPECT_TRUE(pipeline_check(c, dims(2, 1, 1, 2), 8).ok());
  EXPECT_THAT(pipeline_check(c, dims(4, 1, 1, 4), 8).message(),
              HasSubstr("pp 4 x vp 1 = 4 stages but model.n_layer is 2"));
  EXPECT_THAT(pipeline_check(c, dims(2, 1, 1, 2), 8, 2).message(),
              HasSubstr("pp 2 x vp 2 = 4 stages but model.n_layer is 2"));
  {
    Config v = tiny(4);
    v.train.micro_batch = 2;
    EXPECT_THAT(
        pipeline_check(v, dims(2, 1, 1, 2), 8, 2).message(),
        HasSubstr("pp 2 with vp 2 and train.pp_schedule = \"1f1b\": virtual stages run only under the "
                  "interleaved schedule"));
    v.train.pp_schedule = "interleaved";
    EXPECT_TRUE(pipeline_check(v, dims(2, 1, 1, 2), 8, 2).ok());
    EXPECT_THAT(pipeline_check(v, dims(2, 1, 1, 2), 8, 1).message(), HasSubstr("pp 2 with vp 1 and"));
    EXPECT_THAT(pipeline_check(v, dims(2, 1, 1, 2), 3, 2).message(),
                HasSubstr("needs micro-batches per step a multiple of pp (2), but global_batch 16 / (dp 1 x "
                          "micro_batch 2) gives 3"));
    EXPECT_THAT(pipeline_check(v, dims(1, 1, 1, 1), 8, 2).message(), HasSubstr("vp 2 with pp 1"));
    v.train.pp_schedule = "zbh1";
    EXPECT_TRUE(pipeline_check(v, dims(2, 1, 1, 2), 8).ok());
    EXPECT_THAT(pipeline_check(v, dims(2, 1, 1, 2), 1).message(),
                HasSubstr("pp 2 with train.pp_schedule = \"zbh1\" needs at least 2 micro-batches"));
    v.train.pp_schedule = "zb";
    EXPECT_THAT(
        pipeline_check(v, dims(2, 1, 1, 2), 8).message(),
        HasSubstr("train.pp_schedule = \"zb\": use \"gpipe\", \"1f1b\", \"interleaved\" or \"zbh1\""));
  }
  c.train.micro_batch = 8;
  EXPECT_THAT(pipeline_check(c, dims(2, 1, 1, 2), 1).message(),
              HasSubstr("pp 2 with train.pp_schedule = \"1f1b\" needs at least 2 micro-batches per step"));
  c.train.pp_schedule = "gpipe";
  EXPECT_TRUE(pipeline_check(c, dims(2, 1, 1, 2), 1).ok());     // GPipe runs (all bubble) with one
  EXPECT_TRUE(pipeline_check(c, dims(4, 2, 1, 2, 2), 2).ok());  // ZeRO 2 and 3 run on the dp axis
  EXPECT_TRUE(pipeline_check(c, dims(4, 2, 1, 2, 3), 2).ok());
  EXPECT_TRUE(pipeline_check(c, dims(4, 1, 2, 2), 2).ok());  // tp x pp composes (stages run tensor-parallel)
  c.train.checkpoint_every = 10;
  EXPECT_TRUE(pipeline_check(c, dims(2, 1, 1, 2), 2).ok());  // checkpoints reshard by tensor name
  c.train.checkpoint_every = 0;
  c.train.memory_copy_every = 5;
  EXPECT_THAT(
      pipeline_check(c, dims(2, 1, 1, 2), 2).message(),
      HasSubstr(
          "pp 2 with train.memory_copy_every = 5: in-memory copies of a pipeline's stages are refused"));
  c.train.memory_copy_every = 0;
  // The GPU pipeline (cuda/backend_cuda.cu): every schedule at ZeRO 0 or 1 over dp, GPipe and 1F1B at ZeRO
  // 2-3 too; the rest is refused
  // with the value and what would run.
  c.train.backend = "cuda";
  c.train.pp_schedule = "gpipe";
  EXPECT_TRUE(pipeline_check(c, dims(2, 1, 1, 2), 2).ok());
  c.train.pp_schedule = "1f1b";
  EXPECT_TRUE(pipeline_check(c, dims(4, 2, 1, 2, 1), 2).ok());
  EXPECT_TRUE(pipeline_check(c, dims(4, 2, 1, 2, 2), 2).ok());  // ZeRO 2 and 3 on a stage's dp axis
  EXPECT_TRUE(pipeline_check(c, dims(4, 2, 1, 2, 3), 2).ok());
  // tp x pp (x dp) on the GPU: the same schedules and ZeRO stages, refused alike beyond them.
  EXPECT_TRUE(pipeline_check(c, dims(4, 1, 2, 2, 0), 2).ok());
  EXPECT_TRUE(pipeline_check(c, dims(8, 2, 2, 2, 1), 2).ok());
  EXPECT_TRUE(pipeline_check(c, dims(8, 2, 2, 2, 2), 2).ok());
  EXPECT_TRUE(pipeline_check(c, dims(8, 2, 2, 2, 3), 2).ok());
  // ZB-H1 too (its split backward), with at least pp micro-batches as on the CPU, ZeRO 2-3 included (each
  // weight pass completes its micro-batch's buckets), tp beside it too.
  c.train.pp_schedule = "zbh1";
  EXPECT_TRUE(pipeline_check(c, dims(2, 1, 1, 2), 2).ok());
  EXPECT_TRUE(pipeline_check(c, dims(4, 1, 2, 2, 1), 2).ok());
  EXPECT_TRUE(pipeline_check(c, dims(4, 2, 1, 2, 2), 2).ok());
  EXPECT_TRUE(pipeline_check(c, dims(4, 2, 1, 2, 3), 2).ok());
  EXPECT_TRUE(pipeline_check(c, dims(8, 2, 2, 2, 3), 2).ok());
  EXPECT_THAT(pipeline_check(c, dims(2, 1, 1, 2), 1).message(),
              HasSubstr("pp 2 with train.pp_schedule = \"zbh1\" needs at least 2 micro-batches"));
  // Interleaved runs on the GPU as on the CPU: vp > 1, micro-batches a multiple of pp, ZeRO 0-3, tp too.
  {
    Config v = c;
    v.model.n_layer = 4;  // pp x vp
    v.train.pp_schedule = "interleaved";
    EXPECT_TRUE(pipeline_check(v, dims(2, 1, 1, 2), 2, 2).ok());
    EXPECT_TRUE(pipeline_check(v, dims(4, 2, 1, 2, 1), 4, 2).ok());
    EXPECT_TRUE(pipeline_check(v, dims(4, 1, 2, 2, 1), 2, 2).ok());
    // ZeRO 2-3 on the dp axis too (each chunk's backward completes its own buckets).
    EXPECT_TRUE(pipeline_check(v, dims(4, 2, 1, 2, 2), 2, 2).ok());
    EXPECT_TRUE(pipeline_check(v, dims(4, 2, 1, 2, 3), 2, 2).ok());
    EXPECT_THAT(pipeline_check(v, dims(2, 1, 1, 2), 3, 2).message(),
                HasSubstr("needs micro-batches per step a multiple of pp (2)"));
    EXPECT_THAT(pipeline_check(v, dims(2, 1, 1, 2), 2, 1).message(),
                HasSubstr("virtual stages run only under the interleaved schedule"));
  }
  c.train.pp_schedule = "1f1b";
  c.train.backend = "tpu";
  EXPECT_THAT(pipeline_check(c, dims(2, 1, 1, 2), 2).message(),
              HasSubstr("pp 2 with train.backend = \"tpu\": pipeline parallel runs on the \"cpu\" and "
                        "\"cuda\" backends"));
  // The product that is not the world is ParallelDims' to refuse.
  Result<ParallelDims> d = ParallelDims::make({.world = 6, .rank = 0, .dp = 2, .tp = 1, .pp = 2});
  ASSERT_FALSE(d.ok());
  EXPECT_THAT(d.error(), HasSubstr("dp 2 x tp 1 x pp 2 = 4 but the world has 6 ranks"));
}

}  // namespace
}  // namespace gantry
