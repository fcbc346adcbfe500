// The what-if view model against the real planner: candidates come out ranked and each is exactly what
// plan_evaluate says of its layout; a layout that does not fit is listed after those that do, with the
// reason; a run loads from its config TOML and layout as the API returns them; Apply is offered exactly
// for the layouts resume-from takes, with exactly its fields.
#include "ui/whatif/whatif_model.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <fstream>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "tests/ui/whatif/tiny_run.h"

namespace gantry::whatif {
namespace {

using testing_support::tiny_run;

using nlohmann::json;
using ::testing::HasSubstr;

// Each candidate against plan_evaluate of the model's input with that candidate's layout.
void expect_matches_plan_evaluate(const WhatIfModel& m) {
  for (const Candidate& c : m.candidates()) {
    PlanInput in = m.input();
    in.layout = c.plan.layout;
    Result<Plan> p = plan_evaluate(in);
    ASSERT_TRUE(p.ok()) << c.label() << ": " << p.error();
    EXPECT_EQ(p->step_s, c.plan.step_s) << c.label();
    EXPECT_EQ(p->tokens_per_s, c.plan.tokens_per_s) << c.label();
    EXPECT_EQ(p->mfu, c.plan.mfu) << c.label();
    EXPECT_EQ(p->memory.total(), c.plan.memory.total()) << c.label();
    EXPECT_EQ(p->bubble_s, c.plan.bubble_s) << c.label();
    EXPECT_EQ(p->exposed_comm_s, c.plan.exposed_comm_s) << c.label();
    EXPECT_EQ(p->fits, c.plan.fits) << c.label();
    EXPECT_EQ(c.score, p->tokens_per_s) << c.label();  // ranked by tokens/s (the form's default)
  }
}

TEST(WhatIfModel, CandidatesAreRankedAndEqualPlanEvaluate) {
  WhatIfModel m;
  m.form.preset = "gpt2-350m";
  m.form.gpus = 16;
  m.form.global_batch = 256;
  m.form.top = 6;
  m.evaluate();
  ASSERT_TRUE(m.issues().empty()) << m.issues()[0].message;
  ASSERT_GE(m.candidates().size(), 6u);
  EXPECT_GT(m.search_evaluated(), 100);
  for (size_t i = 1; i < m.candidates().size(); ++i) {
    const Candidate &a = m.candidates()[i - 1], &b = m.candidates()[i];
    ASSERT_TRUE(a.plan.fits || !b.plan.fits) << "a layout that does not fit ranks above one that does";
    if (a.plan.fits == b.plan.fits) {
      EXPECT_GE(a.score, b.score) << a.label() << " before " << b.label();
    }
  }
  expect_matches_plan_evaluate(m);
  // The best is the search's best, and the form's own layout is among the candidates.
  Result<SearchResult> s = plan_search(m.input(), SearchOptions{.top = 1});
  ASSERT_TRUE(s.ok());
  ASSERT_EQ(s->plans.size(), 1u);
  EXPECT_EQ(m.candidates()[0].plan.tokens_per_s, s->plans[0].tokens_per_s);
  int from_form = 0;
  for (const Candidate& c : m.candidates()) from_form += (c.sources & kFromForm) != 0;
  EXPECT_EQ(from_form, 1);
  EXPECT_EQ(m.selected(), 0);
}

TEST(WhatIfModel, ALayoutThatDoesNotFitRanksLastAndSaysWhy) {
  WhatIfModel m;
  m.form.preset = "llama3-70b";
  m.form.gpus = 64;
  m.form.global_batch = 512;
  m.form.top = 3;
  m.evaluate();  // the form's layout, tp = pp = 1 without ZeRO: a whole 70B model's state on each GPU
  ASSERT_TRUE(m.issues().empty()) << m.issues()[0].message;
  ASSERT_EQ(m.candidates().size(), 4u);
  const Candidate& last = m.candidates().back();
  EXPECT_EQ(last.sources, static_cast<unsigned>(kFromForm));
  EXPECT_FALSE(last.plan.fits);
  EXPECT_THAT(last.fit_note, HasSubstr("does not fit: needs"));
  EXPECT_THAT(last.fit_note, HasSubstr("of 79.6 GiB (optimizer"));  // 12 B/param of 70B: the largest bucket
  for (size_t i = 0; i + 1 < m.candidates().size(); ++i) {
    EXPECT_TRUE(m.candidates()[i].plan.fits);
    EXPECT_THAT(m.candidates()[i].fit_note, HasSubstr("fits: "));
  }
  expect_matches_plan_evaluate(m);
  // Memory bars: the buckets in order, summing to the plan's total.
  const std::vector<MemoryBar> bars = whatif_memory_bars(last.plan);
  ASSERT_EQ(bars.size(), 5u);
  EXPECT_EQ(bars[2].name, "optimizer");
  double sum = 0;
  for (const MemoryBar& b : bars) sum += b.bytes;
  EXPECT_DOUBLE_EQ(sum, last.plan.memory.total());
  double parts = 0;
  for (const TimePart& t : whatif_time_parts(m.candidates()[0].plan)) parts += t.seconds;
  EXPECT_DOUBLE_EQ(parts, m.candidates()[0].plan.step_s);
}

TEST(WhatIfModel, ARefusedLayoutIsAnIssueAndTheSearchStillRuns) {
  WhatIfModel m;
  m.form.gpus = 7;
  m.form.layout.tp = 2;
  m.evaluate();
  ASSERT_EQ(m.issues().size(), 1u);
  EXPECT_EQ(m.issues()[0].field, "gpus");
  ASSERT_FALSE(m.candidates().empty());
  for (const Candidate& c : m.candidates()) {
    EXPECT_EQ(c.sources, static_cast<unsigned>(kFromSearch));
    EXPECT_EQ(c.plan.gpus, 7);
  }
  expect_matches_plan_evaluate(m);
}

TEST(WhatIfModel, AFormWithoutAClusterHasNoCandidates) {
  WhatIfModel m;
  m.evaluate();
  ASSERT_FALSE(m.candidates().empty());
  m.form.gpu = "tpu-v9";
  m.evaluate();
  EXPECT_TRUE(m.candidates().empty());
  EXPECT_EQ(m.selection(), nullptr);
  ASSERT_EQ(m.issues().size(), 1u);
  EXPECT_EQ(m.issues()[0].field, "gpu");
}

TEST(WhatIfModel, TheSelectionFollowsItsLayoutAcrossEvaluations) {
  WhatIfModel m;
  m.form.gpus = 16;
  m.form.global_batch = 512;
  m.evaluate();
  ASSERT_GE(m.candidates().size(), 3u);
  m.select(2);
  const std::string chosen = m.candidates()[2].label();
  m.form.rank = SearchRank::kGoodput;  // another order, the same layouts among them
  m.evaluate();
  ASSERT_NE(m.selection(), nullptr);
  EXPECT_EQ(m.selection()->label(), chosen);
  m.select(99);
  EXPECT_EQ(m.selection(), nullptr);
}

TEST(WhatIfRun, LoadsTheModelBatchAndEitherLayoutForm) {
  Result<WhatIfRun> a = whatif_run_parse(tiny_run({{"dp", 2}, {"tp", 1}, {"pp", 1}, {"zero", 1}}));
  ASSERT_TRUE(a.ok()) << a.error();
  EXPECT_EQ(a->id, 7);
  EXPECT_EQ(a->model.layers, 2);
  EXPECT_EQ(a->model.hidden, 64);
  EXPECT_EQ(a->model.heads, 4);
  EXPECT_EQ(a->model.vocab, 256);
  EXPECT_EQ(a->model.seq, 64);
  EXPECT_EQ(a->global_batch, 16);
  EXPECT_EQ(a->micro_batch, 8);
  EXPECT_EQ(a->backend, "cpu");
  EXPECT_EQ(a->dp, 2);
  EXPECT_EQ(a->zero, 1);
  Result<WhatIfRun> b = whatif_run_parse(tiny_run("dp=2 tp=1 pp=1 zero=1"));
  ASSERT_TRUE(b.ok()) << b.error();
  EXPECT_EQ(b->dp, 2);
  EXPECT_EQ(b->zero, 1);
  // A key the coordinator may add later is skipped; a bad value of a known one is named.
  EXPECT_TRUE(whatif_run_parse(tiny_run({{"dp", 2}, {"cp", 1}})).ok());
  Result<WhatIfRun> bad = whatif_run_parse(tiny_run({{"dp", 0}}));
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.error(), "layout.dp = 0: allowed 1..1048576");
  EXPECT_EQ(whatif_run_parse(tiny_run("dp=two")).error(), "layout.dp: 'two' is not an integer");
  EXPECT_THAT(whatif_run_parse(tiny_run("dp 2")).error(), HasSubstr("is not key=value"));
  json zero_layers = tiny_run("dp=1");
  zero_layers["model"]["n_layer"] = 0;
  Result<WhatIfRun> bad_model = whatif_run_parse(zero_layers);
  ASSERT_FALSE(bad_model.ok());
  EXPECT_EQ(bad_model.error(), "run 7: model.n_layer = 0: allowed 1..16777216");
  json no_batch = tiny_run("dp=1");
  no_batch["batch"].erase("micro_batch");
  EXPECT_EQ(whatif_run_parse(no_batch).error(), "run 7: batch.micro_batch: expected an integer, got nothing");
}

TEST(WhatIfRun, TheWholeRunObjectLoadsIntoTheForm) {
  json run = tiny_run({{"dp", 2}, {"tp", 1}, {"pp", 1}, {"zero", 1}});
  run["world"] = 2;
  WhatIfModel m;
  ASSERT_TRUE(m.load_run(run).ok());
  ASSERT_TRUE(m.run().has_value());
  EXPECT_EQ(m.run()->state, "stopped");
  EXPECT_TRUE(m.form.custom_model);
  EXPECT_EQ(m.form.model.layers, 2);
  EXPECT_EQ(m.form.gpus, 2);
  EXPECT_EQ(m.form.global_batch, 16);
  EXPECT_EQ(m.form.layout.micro_batch, 8);
  EXPECT_EQ(m.form.layout.zero, 1);
  ASSERT_TRUE(m.issues().empty()) << m.issues()[0].message;
  // The run's own layout is a candidate that came from the form and from the engine, and applies.
  bool found = false;
  for (int i = 0; i < static_cast<int>(m.candidates().size()); ++i) {
    const Candidate& c = m.candidates()[i];
    if ((c.sources & kFromForm) == 0) continue;
    found = true;
    EXPECT_NE(c.sources & kFromEngine, 0u);
    EXPECT_EQ(c.apply_blocker, "");
    ASSERT_TRUE(m.apply(i).has_value());
    EXPECT_EQ(m.apply(i)->layout(), json({{"dp", 2}, {"tp", 1}, {"pp", 1}, {"vp", 1}, {"zero", 1}}));
  }
  EXPECT_TRUE(found);
  // The state follows the API without touching the form; Apply stays the caller's to carry out.
  m.form.gpus = 4;
  m.set_run_state("running");
  EXPECT_EQ(m.run()->state, "running");
  EXPECT_EQ(m.form.gpus, 4);
  // The list of runs carries no model or batch: refused by name.
  EXPECT_THAT(m.load_run(json{{"id", 7}, {"name", "tiny"}}).message(),
              HasSubstr("no \"model\" and \"batch\""));
}

// Issue 17: a move to another tp goes through the checkpoint (it reshards), and so does one to a pipeline;
// tensor parallel runs on both backends, so a GPU run is offered tp as a CPU run is.
TEST(WhatIfApply, ATpChangeIsOffered) {
  for (const char* backend : {"cpu", "cuda"}) {
    SCOPED_TRACE(backend);
    WhatIfModel m;
    json run = tiny_run({{"dp", 2}, {"tp", 1}, {"pp", 1}, {"zero", 1}});
    run["backend"] = backend;
    ASSERT_TRUE(m.load_run(run).ok());
    m.form.gpus = 4;  // dp 2 x tp 2 keeps the run's micro-batch of 8 on its global batch of 16
    m.form.layout.tp = 2;
    m.evaluate();
    ASSERT_TRUE(m.issues().empty()) << m.issues()[0].message;
    int tp_offered = 0;
    for (int i = 0; i < static_cast<int>(m.candidates().size()); ++i) {
      const Candidate& c = m.candidates()[i];
      const PlanLayout& l = c.plan.layout;
      if (l.tp == 2 && l.pp == 1 && c.apply_blocker.empty()) {
        ++tp_offered;
        ASSERT_TRUE(m.apply(i).has_value());
        EXPECT_EQ(m.apply(i)->layout(), json({{"dp", 2}, {"tp", 2}, {"pp", 1}, {"vp", 1}, {"zero", l.zero}}));
      }
    }
    EXPECT_GT(tp_offered, 0) << "no tp 2 layout was offered";
  }
}

// The form's own layout (kFromForm) with pp, for a tiny run (global batch 16, micro-batch 8) under
// `schedule`: the candidate's blocker ("" = Apply offered).
std::string pipeline_blocker(const std::string& schedule, int gpus, int pp, int vp, int* row = nullptr,
                             WhatIfModel* out = nullptr) {
  WhatIfModel local;
  WhatIfModel& m = out != nullptr ? *out : local;
  json run = tiny_run({{"dp", 2}, {"tp", 1}, {"pp", 1}, {"zero", 1}});
  run["pp_schedule"] = schedule;
  EXPECT_TRUE(m.load_run(run).ok());
  m.form.gpus = gpus;
  m.form.layout.pp = pp;
  m.form.layout.vp = vp;
  m.form.layout.micro_batch = 8;
  m.evaluate();
  EXPECT_TRUE(m.issues().empty()) << m.issues()[0].message;
  for (int i = 0; i < static_cast<int>(m.candidates().size()); ++i) {
    const Candidate& c = m.candidates()[i];
    if ((c.sources & kFromForm) == 0) continue;
    EXPECT_EQ(c.plan.layout.pp, pp);
    if (row != nullptr) *row = i;
    return c.apply_blocker;
  }
  ADD_FAILURE() << "the form's layout is not a candidate";
  return "no candidate";
}

// The form's own layouts for a GPU run (dp 2, ZeRO `zero`, train.pp_schedule `schedule`, 4 layers) moved onto
// `gpus` at tp x pp (x vp): each candidate's ZeRO stage and Apply blocker ("" = offered). Fails if there is
// none.
std::vector<std::pair<int, std::string>> gpu_pipeline_offers(const char* schedule, int zero, int gpus, int tp,
                                                             int pp, int vp = 1) {
  json gpu = tiny_run({{"dp", 2}, {"tp", 1}, {"pp", 1}, {"zero", zero}});
  gpu["backend"] = "cuda";
  gpu["pp_schedule"] = schedule;
  gpu["model"]["n_layer"] = 4;  // pp 2 x vp 2 stages of a layer each
  WhatIfModel g;
  EXPECT_TRUE(g.load_run(gpu).ok());
  g.form.gpus = gpus;
  g.form.layout.tp = tp;
  g.form.layout.pp = pp;
  g.form.layout.vp = vp;
  g.evaluate();
  std::vector<std::pair<int, std::string>> offers;
  for (const Candidate& c : g.candidates()) {
    if ((c.sources & kFromForm) != 0) offers.emplace_back(c.plan.layout.zero, c.apply_blocker);
  }
  EXPECT_FALSE(offers.empty()) << "the form's layout is not a candidate";
  return offers;
}

// Pipeline checkpoints reshard (issue 17), so a move to pp > 1 is offered where the run's schedule runs it
// with the micro-batches the run's config gives, and refused naming the rule where it does not.
TEST(WhatIfApply, APipelineIsOfferedWhereTheRunsScheduleRunsIt) {
  WhatIfModel m;
  int row = -1;
  // dp 1 x pp 2: 16 / 8 = 2 micro-batches fill a 1F1B pipe of 2.
  EXPECT_EQ(pipeline_blocker("1f1b", 2, 2, 1, &row, &m), "");
  ASSERT_TRUE(m.apply(row).has_value());
  EXPECT_EQ(m.apply(row)->layout(), json({{"dp", 1}, {"tp", 1}, {"pp", 2}, {"vp", 1}, {"zero", 1}}));
  EXPECT_EQ(m.apply(row)->text(), "dp=1 tp=1 pp=2 zero=1");
  // dp 2 x pp 2: one micro-batch per rank, which 1F1B and ZB-H1 cannot fill a pipe with; GPipe can.
  EXPECT_THAT(pipeline_blocker("1f1b", 4, 2, 1),
              HasSubstr("needs at least 2 micro-batches per step to fill the pipe, but dp = 2 gives 1"));
  EXPECT_THAT(pipeline_blocker("zbh1", 4, 2, 1), HasSubstr("\"zbh1\" needs at least 2 micro-batches"));
  EXPECT_EQ(pipeline_blocker("gpipe", 4, 2, 1), "");
  // Virtual stages only under the interleaved schedule, and it needs them.
  EXPECT_THAT(pipeline_blocker("interleaved", 2, 2, 1), HasSubstr("needs vp > 1"));
  WhatIfModel v;
  EXPECT_EQ(pipeline_blocker("interleaved", 1, 1, 1, &row, &v), "");  // pp 1: no pipeline, no schedule
  // A GPU run gets a pipeline under every schedule the GPU stage runs: GPipe, 1F1B, ZB-H1 (and interleaved
  // with vp > 1, whose checks are the CPU's).
  for (const char* schedule : {"1f1b", "zbh1"}) {
    SCOPED_TRACE(schedule);
    for (const auto& [zero, blocker] : gpu_pipeline_offers(schedule, 1, 2, 1, 2)) EXPECT_EQ(blocker, "");
  }
  // tp beside the GPU pipeline, and ZeRO 2-3 on its dp axis under every schedule the GPU stage runs
  // (pipeline_check): offered.
  for (const char* schedule : {"gpipe", "1f1b", "zbh1"}) {
    SCOPED_TRACE(schedule);
    for (const auto& [zero, blocker] : gpu_pipeline_offers(schedule, 3, 4, 2, 2)) {
      EXPECT_EQ(zero, 3);
      EXPECT_EQ(blocker, "");
    }
  }
  // Interleaved at ZeRO 2-3 (pp 2 x vp 2 on 2 GPUs: 2 micro-batches, a multiple of pp): offered; the
  // gantry-cuda profile prices it with each rank's chunks and their slots.
  for (int zero : {2, 3}) {
    for (const auto& [z, blocker] : gpu_pipeline_offers("interleaved", zero, 2, 1, 2, 2)) {
      EXPECT_EQ(z, zero);
      EXPECT_EQ(blocker, "") << zero;
    }
  }
  json gpu = tiny_run({{"dp", 2}, {"tp", 1}, {"pp", 1}, {"zero", 3}});
  gpu["backend"] = "cuda";
  gpu["pp_schedule"] = "interleaved";
  gpu["model"]["n_layer"] = 4;
  WhatIfModel g;
  ASSERT_TRUE(g.load_run(gpu).ok());
  g.form.engine = EngineKind::kGantryCuda;
  g.form.gpus = 2;
  g.form.layout.pp = 2;
  g.form.layout.vp = 2;
  g.evaluate();
  ASSERT_TRUE(g.issues().empty()) << g.issues()[0].message;
  int interleaved = 0, own = 0;
  for (const Candidate& c : g.candidates()) {
    if (c.plan.layout.vp != 2) continue;
    ++interleaved;
    // The other ZeRO stages of the same layout may be offered beside it (they are priced alike).
    own += c.plan.layout.micro_batch == g.form.layout.micro_batch && c.plan.layout.zero == g.form.layout.zero;
    ASSERT_EQ(c.plan.stage_memory.size(), 2u) << c.label();
    Result<EngineMemory> last = plan_cuda_rank_memory(
        g.input().model, c.plan.layout.micro_batch, 1, 2, 1, c.plan.micro_batches,
        CudaPipeSchedule::kInterleaved, {.dp = c.plan.layout.dp, .zero = c.plan.layout.zero}, 2);
    ASSERT_TRUE(last.ok()) << last.error();
    EXPECT_DOUBLE_EQ(c.plan.stage_memory[1].memory.total(), static_cast<double>(last->total)) << c.label();
    EXPECT_THAT(c.fit_note, HasSubstr("fits: ")) << c.label();
  }
  EXPECT_GE(interleaved, 1);
  EXPECT_EQ(own, 1) << "the form's own layout";
}

TEST(WhatIfApply, OfferedExactlyForLayoutsResumeFromTakes) {
  WhatIfModel m;
  ASSERT_TRUE(m.load_run(tiny_run({{"dp", 2}, {"tp", 1}, {"pp", 1}, {"zero", 1}})).ok());
  m.form.gpus = 4;  // what if the run went on on 4 ranks?
  m.evaluate();
  // 4 ranks × the run's micro-batch of 8 overshoot its global batch of 16: the form says so, by field.
  ASSERT_EQ(m.issues().size(), 1u);
  EXPECT_EQ(m.issues()[0].field, "global_batch");
  for (const Candidate& c : m.candidates()) EXPECT_EQ(c.sources & kFromForm, 0u);
  m.form.layout.micro_batch = 4;
  m.evaluate();
  ASSERT_TRUE(m.issues().empty()) << m.issues()[0].message;
  int applicable = 0, engine = 0;
  for (int i = 0; i < static_cast<int>(m.candidates().size()); ++i) {
    const Candidate& c = m.candidates()[i];
    const PlanLayout& l = c.plan.layout;
    // tp and pp reshard through the checkpoint (issue 17): a layout resumes where the engine cuts the run's
    // micro-batches of 8 into what the plan assumed (min(8, 16 / dp)), and 1F1B (the run's schedule) has
    // at least pp of them per step. At 4 ranks that is dp 4 (micro-batches of 4) only: a pipeline of dp 2
    // or dp 1 runs micro-batches of 8, not the form's 4.
    const int engine_micro = std::min(8, 16 / l.dp);
    const bool resumable = l.cp == 1 && l.vp == 1 && l.hsdp == 0 && l.recompute == Recompute::kNone &&
                           16 % l.dp == 0 && l.micro_batch == engine_micro &&
                           (l.pp == 1 || 16 / l.dp / engine_micro >= l.pp) && c.plan.fits;
    EXPECT_EQ(m.apply(i).has_value(), resumable) << c.label() << ": " << c.apply_blocker;
    EXPECT_EQ(c.apply_blocker.empty(), resumable) << c.label() << ": " << c.apply_blocker;
    if (c.sources & kFromEngine) ++engine;
    if (!resumable) {
      if (l.pp == 1 && l.cp == 1 && l.vp == 1 && l.hsdp == 0 && l.recompute == Recompute::kNone &&
          c.plan.fits) {
        EXPECT_THAT(c.apply_blocker, HasSubstr("micro-batch"));
      }
      continue;
    }
    ++applicable;
    const WhatIfApply a = *m.apply(i);
    EXPECT_EQ(a.run_id, 7);
    // Exactly resume-from's layout fields, nothing else.
    EXPECT_EQ(a.layout(), json({{"dp", l.dp}, {"tp", l.tp}, {"pp", l.pp}, {"vp", 1}, {"zero", l.zero}}));
    EXPECT_EQ(a.body(), json({{"checkpoint", "latest"}, {"layout", a.layout()}}));
    EXPECT_EQ(a.text(), "dp=" + std::to_string(l.dp) + " tp=" + std::to_string(l.tp) +
                            " pp=" + std::to_string(l.pp) + " zero=" + std::to_string(l.zero));
  }
  EXPECT_EQ(engine, 4);  // ZeRO 0..3 on dp 4, micro-batches of 16 / 4 = 4 as the engine cuts them
  EXPECT_GE(applicable, 4);

  // A global batch other than the run's cannot be applied: resume-from keeps the config.
  m.form.global_batch = 32;
  m.evaluate();
  for (int i = 0; i < static_cast<int>(m.candidates().size()); ++i) {
    EXPECT_FALSE(m.apply(i).has_value());
    EXPECT_THAT(m.candidates()[i].apply_blocker, HasSubstr("the run's train.global_batch is 16"));
  }
  // Nor a plan for another model than the run's.
  m.form.global_batch = 16;
  m.form.model.layers = 4;
  m.evaluate();
  ASSERT_FALSE(m.candidates().empty());
  for (int i = 0; i < static_cast<int>(m.candidates().size()); ++i) {
    EXPECT_FALSE(m.apply(i).has_value());
    EXPECT_THAT(m.candidates()[i].apply_blocker, HasSubstr("planned for another model"));
  }
  m.form.model.layers = 2;
  // Nor anything without a run.
  m.forget_run();
  m.form.global_batch = 16;
  m.evaluate();
  ASSERT_FALSE(m.candidates().empty());
  EXPECT_FALSE(m.apply(0).has_value());
  EXPECT_THAT(m.candidates()[0].apply_blocker, HasSubstr("no run is loaded"));
}

// gantry-cpu's step has a pipeline bubble and Gloo waits (issue 17): the panel's parts are the plan's and
// add up to its step; an interleaved pipeline's memory is the profile's figure for its heaviest rank, shown
// in the bars (once "memory unknown").
TEST(WhatIfModel, CpuInterleavedPipelineStepPartsAddUpAndItsMemoryIsShown) {
  PlanInput in;
  in.model = plan_model_preset("gpt2-124m").value();
  in.model.layers = 4;
  in.model.hidden = 64;
  in.model.heads = 4;
  in.model.vocab = 256;
  in.model.seq = 64;
  in.cluster = plan_cluster_default(GpuSpec{.name = "cpu", .hbm_bytes = 24e9}, 2, 2);
  in.layout = PlanLayout{.pp = 2, .vp = 2, .micro_batch = 4};  // interleaved
  in.training.global_batch = 16;
  in.engine = EngineKind::kGantryCpu;
  Result<Plan> p = plan_evaluate(in);
  ASSERT_TRUE(p.ok()) << p.error();
  double parts = 0, bubble = 0;
  for (const TimePart& t : whatif_time_parts(p.value())) {
    parts += t.seconds;
    if (t.name == "pipeline bubble") bubble = t.seconds;
  }
  EXPECT_GT(bubble, 0);
  EXPECT_NEAR(parts, p->step_s, 1e-12 * p->step_s);
  double heaviest = 0;
  for (int r = 0; r < 2; ++r) {
    Result<EngineMemory> e =
        plan_cpu_pipeline_memory(in.model, 4, 1, 2, r, 4, CudaPipeSchedule::kInterleaved, {}, 2);
    ASSERT_TRUE(e.ok()) << e.error();
    heaviest = std::max(heaviest, static_cast<double>(e->total));
  }
  EXPECT_DOUBLE_EQ(p->memory.total(), heaviest);
  double bars = 0;
  for (const MemoryBar& b : whatif_memory_bars(p.value())) bars += b.bytes;
  EXPECT_DOUBLE_EQ(bars, heaviest);
}

}  // namespace
}  // namespace gantry::whatif
