// The straggler policy while a run lives (coordinator_impl.h): an operator's change of it (POST
// /v1/runs/{id}/straggler) and its action, the quarantine of a flagged rank's node.
#include <string>
#include <vector>

#include "engine/cluster/coordinator_impl.h"
#include "engine/cluster/json_fields.h"

namespace gantry {
namespace {

using json = nlohmann::json;

// "quarantine off -> on, window_steps 20 -> 5": the fields that differ, in the options' JSON order.
std::string options_change_text(const json& before, const json& after) {
  std::string out;
  for (const auto& [key, value] : after.items()) {
    if (before.contains(key) && before.at(key) == value) continue;
    auto word = [](const json& v) {
      if (v.is_boolean()) return std::string(v.get<bool>() ? "on" : "off");
      return v.is_string() ? v.get<std::string>() : v.dump();
    };
    out += (out.empty() ? "" : ", ") + key + " " + (before.contains(key) ? word(before.at(key)) : "-") +
           " -> " + word(value);
  }
  return out.empty() ? "no change" : out;
}

}  // namespace

HttpResponse Coordinator::Impl::straggler_policy(const HttpRequest& req) {
  std::lock_guard<std::mutex> lock(mu);
  HttpResponse err;
  Run* found = find_run(req, &err);
  if (found == nullptr) return err;
  Run& r = *found;
  if (run_state_terminal(r.state)) {
    return HttpResponse::error(409, "run " + std::to_string(r.id) + " is " +
                                        std::string(run_state_name(r.state)) +
                                        ": its straggler policy changes only while it lives");
  }
  // The fields given over the run's current options, then the submit's parser on the whole: the same
  // ranges, the same messages, and an unknown field is refused by name.
  const json before = straggler_watch_options_json(r.straggler.options());
  json merged = before;
  for (const auto& [key, value] : req.body.items()) merged[key] = value;
  Result<StragglerWatchOptions> o = straggler_watch_parse(&merged);
  if (!o.ok()) return HttpResponse::error(400, o.error());
  const json after = straggler_watch_options_json(o.value());
  const std::string change = options_change_text(before, after);
  record(
      r.straggler.set_options(o.value(), r.id, unix_now_s(), [&r](int32_t rank) { return r.node_of(rank); }));
  event(r.id, "straggler_policy",
        "straggler policy of run " + std::to_string(r.id) + " changed from " + req.remote + ": " + change,
        {{"from", req.remote}, {"source", "api"}, {"before", before}, {"after", after}, {"change", change}},
        -1,  // an act in time, not a step's: a recovery's rewind keeps it
        "");
  // A restarted coordinator reads the run's options back (restore_runs): the change outlives this one.
  writer->push_op([id = r.id, options = run_options(r).dump()](HistoryDb& d) {
    d.update_run(id, RunStatus::running, "", options);
  });
  straggler_act(r);  // a rank flagged already is acted on now, not at the next evaluation's change
  json out = {{"run", r.id}, {"straggler", after}, {"change", change}};
  return HttpResponse::ok(out);
}

void Coordinator::Impl::straggler_act(Run& r) {
  if (!r.straggler.options().quarantine || r.adopting || r.state != RunState::kRunning ||
      !r.relocate_node.empty())
    return;
  for (const int32_t rank : r.straggler.flagged_ranks()) {
    const std::string node = r.node_of(rank);
    auto it = nodes.find(node);
    if (node.empty() || it == nodes.end() || it->second.state == NodeState::quarantined) continue;
    const int windows = r.straggler.options().scoring.windows_to_flag;
    event(r.id, "straggler_quarantine",
          "the straggler policy of run " + std::to_string(r.id) + " quarantines node " + node + ": rank " +
              std::to_string(rank) + " was flagged (" + std::to_string(windows) + " window" +
              (windows == 1 ? "" : "s") + " in a row slower than the threshold)",
          {{"rank", rank}, {"node", node}, {"windows_to_flag", windows}, {"source", "policy"}},
          r.straggler.evaluated_at_step(), node);
    quarantine_node(it->second, "by the straggler policy of run " + std::to_string(r.id), "straggler policy");
    return;  // one move at a time: the run is stopping now, and is scored afresh where it lands
  }
}

}  // namespace gantry
