// The timeline's view model (ui/console/timeline.h): the step-aligned layout, culling to the view, folding
// of sub-pixel spans per pixel column with the longest kept, the bound on draw items at 1,024 lanes ×
// 1,000 steps, and the Chrome/Perfetto export.
#include "ui/console/timeline.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <map>
#include <random>
#include <set>

#include "tests/scratch_dir.h"
#include "ui/console/script.h"  // wait_timeline, export_timeline

namespace gantry::console {
namespace {

RankStepRecord rec(int64_t step, int rank, double data, double fwd, double bwd, double opt, double comm,
                   double ckpt, double total) {
  RankStepRecord r;
  r.step = step;
  r.rank = rank;
  r.phases = {.data_wait = data,
              .forward = fwd,
              .backward = bwd,
              .optimizer = opt,
              .comm_exposed = comm,
              .checkpoint_stall = ckpt};
  r.total_s = total;
  return r;
}

// Spans the records make (each phase > 0, and a remainder where the total exceeds the phases).
size_t spans_of(const std::vector<RankStepRecord>& rs) {
  size_t n = 0;
  for (const RankStepRecord& r : rs) {
    for (int k = 0; k < kPhaseCount; ++k) n += r.phases.get(static_cast<Phase>(k)) > 0;
    n += r.total_s - r.phases.sum() > kTimelineMinRemainderS;
  }
  return n;
}

size_t counted(const TimelineFrame& f) {
  size_t n = 0;
  for (const TimelineItem& i : f.items) n += i.count;
  return n;
}

TEST(Timeline, StepsAreAlignedAtTheSlowestRanksEnd) {
  // Rank 1's step 1 takes 3 s (forward 2), rank 0's 1 s: step 2 begins at 3 s on both lanes.
  const std::vector<RankStepRecord> rs = {
      rec(1, 0, 0.1, 0.4, 0.4, 0.1, 0, 0, 1.0), rec(1, 1, 0.1, 2.0, 0.4, 0.1, 0.2, 0, 3.0),
      rec(2, 0, 0.1, 0.4, 0.4, 0.1, 0, 0, 1.0), rec(2, 1, 0.1, 0.4, 0.4, 0.1, 0, 0, 1.0)};
  const TimelineWindow w = timeline_window(7, 1, 2, 2, rs);
  ASSERT_EQ(w.step_begin.size(), 3u);
  EXPECT_DOUBLE_EQ(w.step_begin[1], 3.0);
  EXPECT_NEAR(w.length_s(), 4.0, 1e-6);
  EXPECT_NEAR(w.at(1, 1).seconds[kTimelineUnattributed], 0.2, 1e-6);  // 3.0 − 2.8 covered by the phases
  EXPECT_EQ(w.complete_steps(), 2);
  EXPECT_EQ(timeline_slowest_rank(w), 1);
}

// The slow lane is the rank slow at every step, not one whose single step was long: rank 0's first step
// takes 3 s of data wait (a warm-up on a loaded node), rank 2's forward is 0.3 s slower at every step. By the
// window's sum rank 0 would win (3.45 + 5 × 0.5 = 5.95 s against 6 × 0.8 = 4.8 s); by the median step,
// rank 2.
TEST(Timeline, TheSlowLaneIsSlowAtEveryStepNotInOne) {
  std::vector<RankStepRecord> rs;
  for (int64_t step = 1; step <= 6; ++step)
    for (int rank = 0; rank < 4; ++rank) {
      const double data = rank == 0 && step == 1 ? 3.0 : 0.05;
      const double fwd = rank == 2 ? 0.45 : 0.15;
      rs.push_back(rec(step, rank, data, fwd, 0.25, 0.05, 0, 0, data + fwd + 0.3 + 0.3));
    }
  const TimelineWindow w = timeline_window(7, 1, 6, 4, rs);
  const std::vector<TimelineRankSummary> sum = timeline_rank_summaries(w);
  EXPECT_GT(sum[0].busy_s, sum[2].busy_s) << "the case a sum gets wrong";
  EXPECT_NEAR(sum[2].busy_median_s, 0.8, 1e-6);
  EXPECT_NEAR(sum[0].busy_median_s, 0.5, 1e-6);
  EXPECT_EQ(timeline_slowest_rank(w), 2);
}

TEST(Timeline, AStepARankDidNotReportIsAbsentNotZero) {
  const std::vector<RankStepRecord> rs = {rec(1, 0, 0, 1, 1, 0, 0, 0, 2), rec(1, 1, 0, 1, 1, 0, 0, 0, 2),
                                          rec(2, 0, 0, 1, 1, 0, 0, 0, 2)};
  const TimelineWindow w = timeline_window(1, 1, 2, 2, rs);
  EXPECT_FALSE(w.at(1, 2).present);
  EXPECT_EQ(w.complete_steps(), 1);
  TimelineFrame f;
  timeline_build(w, {.t0 = 0, .t1 = w.length_s(), .width_px = 400}, f);
  ASSERT_EQ(f.lanes.size(), 2u);
  EXPECT_EQ(f.lanes[0].count, 4u);  // forward and backward of two steps
  EXPECT_EQ(f.lanes[1].count, 2u);  // step 2 absent: nothing drawn for it
}

// The panel's Export CSV: a row per rank and step with each kind's seconds and the total; a step the rank did
// not report is a row of empty values, not zeros.
TEST(Timeline, TheCsvHasARowPerRankAndStepAndLeavesAnUnreportedStepEmpty) {
  const std::vector<RankStepRecord> rs = {rec(1, 0, 0.25, 1, 1, 0, 0, 0, 2.5), rec(1, 1, 0, 1, 1, 0, 0, 0, 2),
                                          rec(2, 0, 0, 1, 1, 0, 0, 0, 2)};
  const TimelineWindow w = timeline_window(1, 1, 2, 2, rs);
  const std::string csv = timeline_csv(w);
  std::vector<std::string> lines;
  for (size_t at = 0, nl; (nl = csv.find('\n', at)) != std::string::npos; at = nl + 1)
    lines.push_back(csv.substr(at, nl - at));
  ASSERT_EQ(lines.size(), 5u) << csv;
  EXPECT_EQ(
      lines[0],
      "rank,step,data_wait (s),forward (s),backward (s),optimizer (s),comm_exposed (s),checkpoint_stall "
      "(s),unattributed (s),total (s)");
  EXPECT_EQ(lines[1], "0,1,0.25,1,1,0,0,0,0.25,2.5");  // 0.25 s of the 2.5 s no phase covers
  EXPECT_EQ(lines[3], "1,1,0,1,1,0,0,0,0,2");
  EXPECT_EQ(lines[4], "1,2,,,,,,,,");  // rank 1 never reported step 2
}

TEST(Timeline, EverySpanWiderThanAPixelIsDrawnAsItIs) {
  const std::vector<RankStepRecord> rs = {rec(1, 0, 0.5, 1, 2, 0.5, 0.25, 0.25, 5),  // remainder 0.5
                                          rec(1, 1, 0.5, 1, 2, 0.5, 0, 0, 4)};
  const TimelineWindow w = timeline_window(1, 1, 1, 2, rs);
  TimelineFrame f;
  // 5 s over 1,000 px: 200 px a second, the shortest span (0.25 s) 50 px wide.
  timeline_build(w, {.t0 = 0, .t1 = 5, .width_px = 1000}, f);
  ASSERT_EQ(f.items.size(), spans_of(rs));
  EXPECT_EQ(f.spans_folded, 0u);
  const TimelineItem* it = &f.items[f.lanes[0].first];
  const float expect[][2] = {{0, 100},   {100, 300}, {300, 700}, {700, 800},
                             {800, 850}, {850, 900}, {900, 1000}};
  for (int k = 0; k < kTimelineKinds; ++k) {
    EXPECT_FALSE(it[k].folded);
    EXPECT_EQ(it[k].kind, k);
    EXPECT_NEAR(it[k].x0, expect[k][0], 1e-3) << timeline_kind_name(static_cast<uint8_t>(k));
    EXPECT_NEAR(it[k].x1, expect[k][1], 1e-3) << timeline_kind_name(static_cast<uint8_t>(k));
  }
}

// "Kept" means: the column's one item carries the longest span folded into it (its phase as the colour, its
// step and its seconds), and counts every span it stands for. A span one pixel wide or more is never folded.
TEST(Timeline, SpansNarrowerThanAPixelAreFoldedPerColumnWithTheLongestKept) {
  // Ten steps of 1 s each on one lane, drawn 4 px wide: 2.5 steps per pixel. Step 6's forward is 0.7 s
  // (its other phases short), the longest span of the lane.
  std::vector<RankStepRecord> rs;
  for (int64_t s = 1; s <= 10; ++s)
    rs.push_back(s == 6 ? rec(s, 0, 0.05, 0.7, 0.15, 0.05, 0.05, 0, 1.0)
                        : rec(s, 0, 0.1, 0.3, 0.4, 0.1, 0.1, 0, 1.0));
  const TimelineWindow w = timeline_window(1, 1, 10, 1, rs);
  TimelineFrame f;
  timeline_build(w, {.t0 = 0, .t1 = 10, .width_px = 4}, f);
  EXPECT_EQ(f.spans_visible, spans_of(rs));
  EXPECT_EQ(f.spans_folded, spans_of(rs));  // every span is < 1 px here
  EXPECT_EQ(counted(f), spans_of(rs)) << "every span is in exactly one item";
  ASSERT_LE(f.items.size(), 4u + 1);  // one item per column (a boundary span may start a fifth)
  // Column 2 holds steps 6..7.5: its item is step 6's forward.
  const TimelineItem* col2 = nullptr;
  for (const TimelineItem& i : f.items)
    if (i.x0 == 2) col2 = &i;
  ASSERT_NE(col2, nullptr);
  EXPECT_TRUE(col2->folded);
  EXPECT_EQ(col2->x1, 3);
  EXPECT_EQ(col2->kind, static_cast<uint8_t>(Phase::forward));
  EXPECT_EQ(col2->step, 6);
  EXPECT_NEAR(col2->seconds, 0.7, 1e-6);
  // Elsewhere the longest is a 0.4 s backward.
  for (const TimelineItem& i : f.items) {
    if (&i == col2) continue;
    EXPECT_EQ(i.kind, static_cast<uint8_t>(Phase::backward)) << "column " << i.x0;
    EXPECT_NEAR(i.seconds, 0.4, 1e-6);
  }
}

TEST(Timeline, AWideSpanAmongNarrowOnesIsDrawnWholeAndTheRestFolded) {
  // Step 1: forward 10 s, the other phases 0.001 s each, 100 px over 10.005 s: forward ~100 px wide.
  const std::vector<RankStepRecord> rs = {rec(1, 0, 0.001, 10, 0.001, 0.001, 0.001, 0.001, 10.005)};
  const TimelineWindow w = timeline_window(1, 1, 1, 1, rs);
  TimelineFrame f;
  timeline_build(w, {.t0 = 0, .t1 = w.length_s(), .width_px = 100}, f);
  size_t whole = 0, folded = 0;
  for (const TimelineItem& i : f.items) {
    if (i.folded) {
      ++folded;
      EXPECT_LT(i.seconds, 0.01);
    } else {
      ++whole;
      EXPECT_EQ(i.kind, static_cast<uint8_t>(Phase::forward));
      EXPECT_GT(i.x1 - i.x0, 99.0f);
    }
  }
  EXPECT_EQ(whole, 1u);
  EXPECT_EQ(folded, 2u);  // data wait in column 0; backward..checkpoint stall in column 99
  EXPECT_EQ(counted(f), 6u);
}

TEST(Timeline, WhatLiesOutsideTheViewIsCulled) {
  std::vector<RankStepRecord> rs;
  for (int64_t s = 1; s <= 100; ++s)
    for (int r = 0; r < 8; ++r) rs.push_back(rec(s, r, 0.1, 0.3, 0.4, 0.1, 0.1, 0, 1.0));
  const TimelineWindow w = timeline_window(1, 1, 100, 8, rs);
  TimelineFrame f;
  // Steps 41 and 42 (40 s .. 42 s), half of step 43's first span too, lanes 2..4.
  timeline_build(w, {.t0 = 40.0, .t1 = 42.05, .width_px = 800, .lane_first = 2, .lane_count = 3}, f);
  ASSERT_EQ(f.lanes.size(), 3u);
  EXPECT_EQ(f.lanes[0].rank, 2);
  EXPECT_EQ(f.lanes[2].rank, 4);
  EXPECT_EQ(f.spans_visible, 3u * (5 + 5 + 1));
  for (const TimelineItem& i : f.items) {
    EXPECT_GE(i.step, 41);
    EXPECT_LE(i.step, 43);
    EXPECT_GE(i.x0, 0.0f);
    EXPECT_LE(i.x1, 800.0f);
    EXPECT_FALSE(i.folded);
    if (i.step == 43) {
      EXPECT_EQ(i.kind, static_cast<uint8_t>(Phase::data_wait));
      EXPECT_NEAR(i.x1, 800.0f, 1e-3) << "a span across the right edge is clipped to it";
    }
  }
  // Lanes past the window's are not made up.
  timeline_build(w, {.t0 = 0, .t1 = 100, .width_px = 800, .lane_first = 6, .lane_count = 10}, f);
  EXPECT_EQ(f.lanes.size(), 2u);
  // A view beyond the window's end shows nothing.
  timeline_build(w, {.t0 = 200, .t1 = 300, .width_px = 800}, f);
  EXPECT_TRUE(f.items.empty());
  EXPECT_EQ(f.spans_visible, 0u);
}

TEST(Timeline, ZoomedToOneStepEveryLaneShowsItsSpansWhole) {
  std::vector<RankStepRecord> rs;
  for (int64_t s = 1; s <= 50; ++s)
    for (int r = 0; r < 4; ++r) rs.push_back(rec(s, r, 0.01, 0.1 + 0.05 * r, 0.2, 0.02, 0.03, 0, 0.5));
  const TimelineWindow w = timeline_window(3, 1, 50, 4, rs);
  TimelineFrame f;
  timeline_build(w, timeline_view_of_steps(w, 20, 21, 600), f);
  EXPECT_EQ(f.spans_folded, 0u);
  ASSERT_EQ(f.lanes.size(), 4u);
  for (const TimelineItem& i : f.items) EXPECT_EQ(i.step, 20);
  // Rank 3's forward is the longest on screen.
  float longest = 0;
  int longest_lane = -1;
  for (const TimelineLane& l : f.lanes)
    for (size_t k = l.first; k < l.first + l.count; ++k)
      if (f.items[k].kind == static_cast<uint8_t>(Phase::forward) &&
          f.items[k].x1 - f.items[k].x0 > longest) {
        longest = f.items[k].x1 - f.items[k].x0;
        longest_lane = l.rank;
      }
  EXPECT_EQ(longest_lane, 3);
}

// The frame-rate bound: 1,024 lanes × 1,000 steps in 1,000 px gives at most 2·width + 3 items per lane,
// whatever the steps, and a straggler's one long step still shows in its column.
TEST(Timeline, AThousandLanesOfAThousandStepsGiveABoundedNumberOfItems) {
  constexpr int kRanks = 1024, kSteps = 1000, kWidth = 1000;
  std::mt19937 rng(42);
  std::uniform_real_distribution<float> jitter(0.9f, 1.1f);
  // Filled cell by cell (a million records would hold their host strings too).
  TimelineWindow w;
  w.run = 1;
  w.first_step = 1;
  w.steps = kSteps;
  w.ranks = kRanks;
  w.cells.resize(static_cast<size_t>(kRanks) * kSteps);
  size_t spans = 0;
  for (int r = 0; r < kRanks; ++r)
    for (int64_t s = 1; s <= kSteps; ++s) {
      TimelineCell& c = w.cells[static_cast<size_t>(r) * kSteps + static_cast<size_t>(s - 1)];
      const float phases[kTimelineKinds] = {
          0.01f * jitter(rng), (r == 517 && s == 500) ? 2.0f : 0.1f * jitter(rng),
          0.2f * jitter(rng),  0.02f,
          0.03f * jitter(rng), 0.0f,
          0.04f * jitter(rng)};
      std::copy(std::begin(phases), std::end(phases), c.seconds);
      c.present = true;
      for (float x : phases) spans += x > 0;
    }
  timeline_layout(w);
  TimelineFrame f;
  timeline_build(w, {.t0 = 0, .t1 = w.length_s(), .width_px = kWidth}, f);
  ASSERT_EQ(f.lanes.size(), static_cast<size_t>(kRanks));
  for (const TimelineLane& l : f.lanes) ASSERT_LE(l.count, static_cast<size_t>(2 * kWidth + 3)) << l.rank;
  EXPECT_LE(f.items.size(), static_cast<size_t>(kRanks) * (2 * kWidth + 3));
  EXPECT_LT(f.items.size(), f.spans_visible / 2) << "folding must cut the items well below the spans";
  EXPECT_EQ(f.spans_visible, spans);
  EXPECT_EQ(counted(f), f.spans_visible);
  // Rank 517's 2 s forward at step 500 is wider than a pixel here (step 500 is 2.3 s of ~400 s): drawn
  // whole; and on a narrower view it is folded and kept.
  bool found = false;
  const TimelineLane& lane = f.lanes[517];
  for (size_t k = lane.first; k < lane.first + lane.count; ++k)
    found |= f.items[k].step == 500 && f.items[k].kind == static_cast<uint8_t>(Phase::forward) &&
             std::abs(f.items[k].seconds - 2.0f) < 1e-6f;
  EXPECT_TRUE(found);
  timeline_build(w, {.t0 = 0, .t1 = w.length_s(), .width_px = 100}, f);
  for (const TimelineLane& l : f.lanes) ASSERT_LE(l.count, static_cast<size_t>(2 * 100 + 3));
  found = false;
  for (size_t k = f.lanes[517].first; k < f.lanes[517].first + f.lanes[517].count; ++k)
    found |= f.items[k].folded && f.items[k].step == 500 && std::abs(f.items[k].seconds - 2.0f) < 1e-6f;
  EXPECT_TRUE(found) << "the straggler's long forward was folded away";
  // A panel shows a few dozen lanes: only those are visited.
  timeline_build(w, {.t0 = 0, .t1 = w.length_s(), .width_px = kWidth, .lane_first = 500, .lane_count = 40},
                 f);
  EXPECT_EQ(f.lanes.size(), 40u);
  EXPECT_LE(f.items.size(), 40u * (2 * kWidth + 3));
}

TEST(Timeline, TheTraceHoldsOneCompleteEventPerSpan) {
  std::vector<RankStepRecord> rs;
  for (int64_t s = 5; s <= 9; ++s)
    for (int r = 0; r < 3; ++r)
      rs.push_back(rec(s, r, 0.01, r == 2 ? 0.5 : 0.1, 0.2, 0.02, r == 2 ? 0 : 0.4, s == 7 ? 0.3 : 0, 0.9));
  const TimelineWindow w = timeline_window(12, 5, 5, 3, rs);
  const std::string text = timeline_trace_json(w).dump();
  const nlohmann::json j = nlohmann::json::parse(text, nullptr, false);
  ASSERT_FALSE(j.is_discarded());
  ASSERT_TRUE(j["traceEvents"].is_array());
  size_t complete = 0;
  std::set<std::string> thread_names;
  std::map<std::pair<int, int64_t>, double> forward;
  for (const nlohmann::json& e : j["traceEvents"]) {
    if (e["ph"] == "M" && e["name"] == "thread_name")
      thread_names.insert(e["args"]["name"].get<std::string>());
    if (e["ph"] != "X") continue;
    ++complete;
    EXPECT_EQ(e["pid"], 12);
    EXPECT_GT(e["dur"].get<double>(), 0);
    EXPECT_GE(e["ts"].get<double>(), 0);
    if (e["name"] == "forward")
      forward[{e["tid"].get<int>(), e["args"]["step"].get<int64_t>()}] = e["dur"].get<double>();
  }
  EXPECT_EQ(complete, spans_of(rs));
  EXPECT_EQ(thread_names, (std::set<std::string>{"rank 0", "rank 1", "rank 2"}));
  EXPECT_NEAR(forward.at({2, 7}), 0.5e6, 0.1);  // µs; the cells hold floats
  EXPECT_NEAR(forward.at({0, 5}), 0.1e6, 0.1);

  const std::string path = (testing_support::scratch_dir("timeline_trace") / "trace.json").string();
  ASSERT_TRUE(timeline_trace_write(w, path).ok());
  const Status bad = timeline_trace_write(w, "/nonexistent-dir/trace.json");
  EXPECT_FALSE(bad.ok());
  EXPECT_NE(bad.message().find("/nonexistent-dir/trace.json"), std::string::npos) << bad.message();
}

// The script's two timeline commands: parsed with their arguments; wait_timeline waits for the followed
// run's window to hold N whole steps; export_timeline writes a trace that parses, and fails (naming why) on
// an empty window or a path it cannot write.
TEST(TimelineScript, WaitsForWholeStepsAndExportsTheWindow) {
  Result<std::vector<ScriptCommand>> cmds =
      script_parse("wait_timeline 2\nexport_timeline \"" +
                       (testing_support::scratch_dir("timeline_script") / "trace.json").string() + "\"\n",
                   "s.txt");
  ASSERT_TRUE(cmds.ok()) << cmds.error();
  ASSERT_EQ(cmds->size(), 2u);
  EXPECT_EQ(cmds.value()[0].kind, ScriptCommand::Kind::wait_timeline);
  EXPECT_EQ(cmds.value()[0].number, 2);
  EXPECT_EQ(cmds.value()[1].kind, ScriptCommand::Kind::export_timeline);
  const std::string path = cmds.value()[1].text;
  EXPECT_FALSE(script_parse("wait_timeline", "s.txt").ok());
  EXPECT_FALSE(script_parse("export_timeline", "s.txt").ok());

  ScriptRunner runner(cmds.value());
  ConsoleSnapshot s;
  s.connected = true;
  s.run.id = 4;
  ClickTargets none;
  // Step 2 lacks rank 1: one whole step, the wait goes on.
  const std::vector<RankStepRecord> part = {rec(1, 0, 0, 1, 1, 0, 0, 0, 2), rec(1, 1, 0, 1, 1, 0, 0, 0, 2),
                                            rec(2, 0, 0, 1, 1, 0, 0, 0, 2)};
  s.timeline = std::make_shared<TimelineWindow>(timeline_window(4, 1, 2, 2, part));
  runner.step(s, none);
  EXPECT_FALSE(runner.done());
  std::vector<RankStepRecord> all = part;
  all.push_back(rec(2, 1, 0, 1.5, 1, 0, 0, 0, 2.5));
  s.timeline = std::make_shared<TimelineWindow>(timeline_window(4, 1, 2, 2, all));
  runner.step(s, none);
  EXPECT_TRUE(runner.done());
  EXPECT_FALSE(runner.failed()) << runner.failure();
  std::ifstream in(path);
  const nlohmann::json j = nlohmann::json::parse(in, nullptr, false);
  ASSERT_FALSE(j.is_discarded()) << path;
  size_t complete = 0;
  for (const nlohmann::json& e : j["traceEvents"]) complete += e["ph"] == "X";
  EXPECT_EQ(complete, spans_of(all));

  ScriptRunner empty(script_parse("export_timeline /tmp/x.json", "s.txt").value());
  s.timeline = std::make_shared<TimelineWindow>();
  empty.step(s, none);
  EXPECT_TRUE(empty.failed());
  EXPECT_NE(empty.failure().find("holds no steps"), std::string::npos) << empty.failure();
  ScriptRunner bad(script_parse("export_timeline /nonexistent-dir/x.json", "s.txt").value());
  s.timeline = std::make_shared<TimelineWindow>(timeline_window(4, 1, 2, 2, all));
  bad.step(s, none);
  EXPECT_TRUE(bad.failed());
  EXPECT_NE(bad.failure().find("/nonexistent-dir/x.json"), std::string::npos) << bad.failure();
}

}  // namespace
}  // namespace gantry::console
