// The goodput ledger (coordinator_impl.h; the arithmetic in goodput.h): the marks the coordinator records
// as a run goes (generation_placed in start_generation, generation_first_step here), and the ledger derived
// from the run's stored history on each query, so that it survives a coordinator restart unchanged.
#include <algorithm>
#include <cmath>

#include "engine/cluster/coordinator_impl.h"
#include "telemetry/clock.h"

namespace gantry {
namespace {

using json = nlohmann::json;

// Events whose first one in a generation is the coordinator's notice of its failure.
bool failure_notice(const std::string& kind) {
  // sdc_mismatch: the check found it (each suspect reports one; the first is the notice); hang: the
  // hang timeout found it (recorded before its node_failed).
  // adopt_missing: ranks no agent brought back to a restarted coordinator (their node failed while it was
  // away).
  return kind == "node_failed" || kind == "node_lost" || kind == "sdc_mismatch" || kind == "hang" ||
         kind == "adopt_missing";
}

GoodputCause cause_from_name(const std::string& name) {
  for (GoodputCause c :
       {GoodputCause::kSubmit, GoodputCause::kRecovery, GoodputCause::kResume, GoodputCause::kQuarantine})
    if (goodput_cause_name(c) == name) return c;
  return GoodputCause::kSubmit;
}

json seconds_or_null(const std::optional<double>& v) {
  return v ? json(*v) : json(nullptr);
}

}  // namespace

void Coordinator::Impl::goodput_step(Run& r, const StepRecord& s) {
  if (r.gen_stepped || s.step <= r.gen_from_step || r.gen_placed_unix == 0) return;
  r.gen_stepped = true;
  const double start = s.time_unix_s - s.step_s;
  char took[32];
  std::snprintf(took, sizeof took, "%.2f", start - r.gen_placed_unix);
  event(r.id, "generation_first_step",
        "generation " + std::to_string(r.generation) + " began its first step (step " +
            std::to_string(s.step) + ") " + took + " s after its placement",
        {{"generation", r.generation}, {"step", s.step}, {"start_unix_s", start}});
}

void Coordinator::Impl::young_daly_apply(Run& r) {
  if (r.checkpoint_policy.options().mode != CheckpointPolicyMode::kYoungDaly) return;
  const double wall = unix_now_s() - r.created_unix;
  const std::optional<double> step_s =
      r.latest_step.step_s > 0 ? std::optional<double>(r.latest_step.step_s) : std::nullopt;
  const YoungDaly yd = young_daly(r.checkpoint_stalls, r.restarts, wall, step_s);
  if (!yd.interval_steps || *yd.interval_steps == r.checkpoint_policy.options().every_steps) return;
  const int64_t before = r.checkpoint_policy.options().every_steps;
  r.checkpoint_policy.set_every_steps(*yd.interval_steps);
  char text[160];
  std::snprintf(text, sizeof text,
                "checkpoint interval %lld -> %lld steps (Young/Daly: sqrt(2 x %.3f s x %.1f s) = %.1f s)",
                static_cast<long long>(before), static_cast<long long>(*yd.interval_steps),
                *yd.checkpoint_cost_s, *yd.mtbf_s, *yd.interval_s);
  event(r.id, "checkpoint_interval", text,
        {{"policy", "young_daly"},
         {"previous_every_steps", before},
         {"every_steps", *yd.interval_steps},
         {"interval_s", *yd.interval_s},
         {"checkpoint_cost_s", *yd.checkpoint_cost_s},
         {"mtbf_s", *yd.mtbf_s},
         {"failures", r.restarts}});
  writer->push_op([id = r.id, options = run_options(r).dump()](HistoryDb& d) {
    RunRow row;
    if (d.get_run(id, &row)) d.update_run(id, row.status, row.message, options);
  });
}

Result<nlohmann::json> Coordinator::Impl::goodput_json(int64_t run_id) {
  double created = 0;
  bool live = false;
  int64_t every = 0;
  std::string policy;
  {
    std::lock_guard<std::mutex> lock(mu);
    auto it = runs.find(run_id);
    if (it == runs.end()) return Status::error("run " + std::to_string(run_id) + " not found");
    const Run& r = it->second;
    created = r.created_unix;
    live = !run_state_terminal(r.state);
    every = r.checkpoint_policy.options().every_steps;
    policy = checkpoint_policy_mode_name(r.checkpoint_policy.options().mode);
  }
  GoodputInput in{.created_unix = created, .end_unix = unix_now_s(), .live = live};
  std::vector<CheckpointInfo> catalog;
  std::optional<double> step_s;
  {
    std::unique_lock<std::mutex> db_lock = read_lock();
    RunRow row;
    if (!db->get_run(run_id, &row))
      return Status::error("cannot read run " + std::to_string(run_id) + ": " + db->error());
    if (row.info.created_unix_s > 0) in.created_unix = row.info.created_unix_s;
    if (!live && row.finished_unix_s > 0) in.end_unix = row.finished_unix_s;
    std::vector<EventRow> rows;
    int64_t after = 0;
    std::map<int, double> first_steps;  // generation -> its first step's start (the earliest mark: a
                                        // restarted coordinator may record a generation's again)
    std::vector<std::optional<double>> previous_progress;
    for (;;) {
      rows.clear();
      if (!db->read_events(run_id, after, 4096, &rows))
        return Status::error("cannot read the run's events: " + db->error());
      if (rows.empty()) break;
      after = rows.back().id;
      for (const EventRow& row_e : rows) {
        const EventRecord& e = row_e.event;
        const json p = json::parse(e.payload, nullptr, false);
        const auto num = [&](const char* key) -> std::optional<double> {
          if (p.is_object() && p.contains(key) && p[key].is_number()) return p[key].get<double>();
          return std::nullopt;
        };
        if (e.kind == "generation_placed") {
          GoodputGeneration g;
          g.generation = static_cast<int>(num("generation").value_or(0));
          g.cause = cause_from_name(p.is_object() ? p.value("cause", "") : "");
          g.placed_unix = e.time_unix_s;
          g.from_step = static_cast<int64_t>(num("from_step").value_or(-1));
          in.generations.push_back(g);
          previous_progress.push_back(num("previous_last_progress_unix_s"));
        } else if (e.kind == "generation_first_step") {
          const int g = static_cast<int>(num("generation").value_or(0));
          if (std::optional<double> start = num("start_unix_s"); start && !first_steps.count(g))
            first_steps[g] = *start;
        } else if (failure_notice(e.kind)) {
          in.notices.push_back({e.time_unix_s, e.kind, e.node, e.message});
        } else if (e.kind == "fault_injected") {
          in.faults.push_back({e.time_unix_s, p.is_object() ? p.value("fault", "") : "",
                               static_cast<int>(num("rank").value_or(-1)), e.node});
        } else if ((e.kind == "action_pause" || e.kind == "action_resume") && e.rank == 0) {
          in.pauses.push_back({e.time_unix_s, e.kind == "action_pause"});
        } else if (e.kind == "run_finished" || e.kind == "run_failed" || e.kind == "run_stopped" ||
                   e.kind == "run_interrupted") {
          in.ended_unix.push_back(e.time_unix_s);
        }
      }
    }
    for (size_t k = 0; k < in.generations.size(); ++k) {
      GoodputGeneration& g = in.generations[k];
      if (auto f = first_steps.find(g.generation); f != first_steps.end()) g.first_step_start = f->second;
      // A generation's last progress: the next one's placement recorded it; the last one's is its newest
      // step record (kept: nothing rewinds the live generation's own steps).
      if (k + 1 < in.generations.size()) g.last_progress = previous_progress[k + 1];
    }
    if (!in.generations.empty() && row.last_step >= 0) {
      std::vector<StepRecord> last;
      if (db->read_steps(run_id, row.last_step, kStepEnd, 1, &last) && !last.empty())
        in.generations.back().last_progress = last.front().time_unix_s;
    }
    for (const GoodputGeneration& g : in.generations) {
      if (g.from_step < 0 || in.step_end_unix.count(g.from_step)) continue;
      std::vector<StepRecord> at;
      if (db->read_steps(run_id, g.from_step, g.from_step + 1, 1, &at) && !at.empty())
        in.step_end_unix[g.from_step] = at.front().time_unix_s;
    }
    if (!db->list_checkpoints(run_id, &catalog))
      return Status::error("cannot read the run's checkpoints: " + db->error());
    BandResult band;
    if (db->query_step_band(run_id, StepMetric::step_s, 0, kStepEnd, 1, &band) && !band.buckets.empty() &&
        band.buckets.front().count > 0)
      step_s = band.buckets.front().mean;
  }
  std::vector<double> stalls;
  for (const CheckpointInfo& c : catalog) {
    if (c.state == "failed")
      continue;  // not a cost of checkpointing that paid off; its stall still counts below
    if (c.stall_s) stalls.push_back(*c.stall_s);
  }
  for (const CheckpointInfo& c : catalog) {
    in.checkpoints.push_back({.step = c.step,
                              .time_unix = c.time_unix_s,
                              .write_s = c.write_s,
                              .stall_s = c.stall_s,
                              .committed = c.state != "failed"});
  }
  const GoodputLedger l = goodput_ledger(in);
  json seconds = json::object();
  for (int k = 0; k < kGoodputCategoryCount; ++k) {
    const auto c = static_cast<GoodputCategory>(k);
    seconds[std::string(goodput_category_name(c))] = l.known ? json(l.of(c)) : json(nullptr);
  }
  json failures = json::array();
  for (const GoodputFailure& f : l.failures) {
    failures.push_back({{"generation", f.generation},
                        {"time_unix_s", f.time_unix},
                        {"noticed", f.noticed},
                        {"kind", f.kind},
                        {"node", f.node},
                        {"message", f.message},
                        {"fault", f.fault},
                        {"fault_rank", f.fault_rank},
                        {"fault_node", f.fault_node},
                        {"detection_s", f.detection_s},
                        {"restore_s", f.restore_s},
                        {"recomputed_s", f.recomputed_s},
                        {"cost_s", f.cost_s()},
                        {"recovered", f.recovered}});
  }
  json generations = json::array();
  for (const GoodputGeneration& g : in.generations) {
    generations.push_back({{"generation", g.generation},
                           {"cause", goodput_cause_name(g.cause)},
                           {"placed_unix_s", g.placed_unix},
                           {"from_step", g.from_step},
                           {"first_step_unix_s", seconds_or_null(g.first_step_start)},
                           {"last_progress_unix_s", seconds_or_null(g.last_progress)}});
  }
  const YoungDaly yd = young_daly(stalls, static_cast<int>(l.failures.size()), l.wall_s, step_s);
  json young = {{"checkpoint_cost_s", seconds_or_null(yd.checkpoint_cost_s)},
                {"checkpoints_measured", stalls.size()},
                {"failures", l.failures.size()},
                {"mtbf_s", seconds_or_null(yd.mtbf_s)},
                {"step_s", seconds_or_null(yd.step_s)},
                {"interval_s", seconds_or_null(yd.interval_s)},
                {"interval_steps", yd.interval_steps ? json(*yd.interval_steps) : json(nullptr)},
                {"why_unknown", yd.why_unknown},
                {"policy", policy},
                {"checkpoint_every_steps", every}};
  return json{{"run", run_id},
              {"live", live},
              {"known", l.known},
              {"why_unknown", l.why_unknown},
              {"created_unix_s", in.created_unix},
              {"end_unix_s", std::max(in.created_unix, in.end_unix)},
              {"wall_s", l.wall_s},
              {"ettr", seconds_or_null(l.ettr())},
              {"seconds", seconds},
              {"checkpoints_stall_unknown", l.checkpoints_stall_unknown},
              {"failures", failures},
              {"generations", generations},
              {"young_daly", young}};
}

HttpResponse Coordinator::Impl::goodput(const HttpRequest& req) {
  HttpResponse err;
  const RunKey key = run_key(req, &err);
  if (key.id < 0) return err;
  Result<json> j = goodput_json(key.id);
  if (!j.ok()) return HttpResponse::error(500, j.error());
  return HttpResponse::ok(j.value());
}

}  // namespace gantry
