// Alerts (coordinator_impl.h): the rules (GET/POST/DELETE /v1/alerts, a rules file, kept in
// <dir>/alerts.json across restarts) and their evaluation on a thread of the coordinator's own, every
// kAlertPeriod, over each live run's latest figures (alert_rules.h): a rule that fires or clears is an event
// of the run ("alert", "alert_cleared"), and a firing one runs its command hook (alert_hook.h), whose end
// is an event too ("alert_hook").
#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "engine/cluster/coordinator_impl.h"
#include "engine/cluster/json_fields.h"  // json_parse_bounded: the kept rules file

namespace gantry {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;
using namespace std::chrono_literals;

// Fine enough for an absence of a second; a threshold is read from the latest step at each evaluation.
constexpr auto kAlertPeriod = 250ms;
// The goodput ledger is read from the database: at most this often, and only while an ETTR rule exists.
constexpr auto kEttrPeriod = 2s;

json value_json(const std::optional<double>& v) {
  if (!v) return nullptr;
  if (!std::isfinite(*v)) return std::isnan(*v) ? json("nan") : json(*v > 0 ? "inf" : "-inf");
  return *v;
}

json firing_json(const AlertFiring& f) {
  return {{"rule", f.rule},
          {"run", f.run},
          {"since_unix_s", f.since_unix_s},
          {"value", value_json(f.value)},
          {"rank", f.rank >= 0 ? json(f.rank) : json(nullptr)},
          {"message", f.message}};
}

}  // namespace

Status Coordinator::Impl::alerts_load() {
  alert_hooks = std::make_unique<AlertHooks>((fs::path(opt.dir) / "alert_hooks.log").string());
  // The rules the API added, as the last coordinator on this folder left them; then the file's, which
  // replace any of the same name (the operator's file is the newer word).
  const fs::path kept = fs::path(opt.dir) / "alerts.json";
  std::error_code ec;
  if (fs::exists(kept, ec)) {
    std::ifstream in(kept);
    std::stringstream ss;
    ss << in.rdbuf();
    Result<json> doc = json_parse_bounded(ss.str());
    if (!doc.ok() || !doc->is_object() || !doc->contains("rules") || !doc->at("rules").is_array()) {
      return Status::error(kept.string() + ": not the coordinator's alert rules (" +
                           (doc.ok() ? std::string("no \"rules\" array") : doc.error()) +
                           "): move it away to start without them");
    }
    for (const json& j : doc->at("rules")) {
      Result<AlertRule> r = alert_rule_parse(j);
      if (!r.ok()) return Status::error(kept.string() + ": " + r.error());
      alert_rules.push_back(std::move(r.value()));
    }
  }
  if (!opt.alerts_file.empty()) {
    std::ifstream in(opt.alerts_file);
    if (!in) return Status::error("cannot read the alert rules file " + opt.alerts_file);
    std::stringstream ss;
    ss << in.rdbuf();
    Result<std::vector<AlertRule>> rules = alert_rules_parse_toml(ss.str(), opt.alerts_file);
    if (!rules.ok()) return rules.status();
    for (AlertRule& r : rules.value()) {
      std::erase_if(alert_rules, [&](const AlertRule& x) { return x.name == r.name; });
      alert_rules.push_back(std::move(r));
    }
    alerts_save();
  }
  return Status();
}

void Coordinator::Impl::alerts_save() {
  json rules = json::array();
  for (const AlertRule& r : alert_rules) rules.push_back(alert_rule_json(r));
  const fs::path path = fs::path(opt.dir) / "alerts.json";
  const fs::path tmp = path.string() + ".tmp";
  {
    std::ofstream out(tmp, std::ios::trunc);
    out << json{{"rules", rules}}.dump(2) << "\n";
    if (!out) {
      std::fprintf(stderr,
                   "coordinator: cannot write %s: the alert rules will not outlive this coordinator\n",
                   tmp.c_str());
      return;
    }
  }
  std::error_code ec;
  fs::rename(tmp, path, ec);  // the rename is the commit: a crash leaves the old set or the new one
  if (ec) std::fprintf(stderr, "coordinator: cannot rename %s: %s\n", tmp.c_str(), ec.message().c_str());
}

HttpResponse Coordinator::Impl::alerts_list() {
  std::lock_guard<std::mutex> lock(mu);
  json rules = json::array(), firing = json::array();
  for (const AlertRule& r : alert_rules) rules.push_back(alert_rule_json(r));
  for (const AlertFiring& f : alert_eval.firing()) firing.push_back(firing_json(f));
  return HttpResponse::ok({{"rules", rules}, {"firing", firing}});
}

HttpResponse Coordinator::Impl::alerts_add(const HttpRequest& req) {
  Result<AlertRule> r = alert_rule_parse(req.body);
  if (!r.ok()) return HttpResponse::error(400, r.error());
  std::lock_guard<std::mutex> lock(mu);
  for (const AlertRule& x : alert_rules) {
    if (x.name == r->name) {
      return HttpResponse::error(409, "alert rule \"" + r->name +
                                          "\" exists: delete it first (DELETE /v1/alerts/" + r->name +
                                          ") or give the new one another name");
    }
  }
  alert_rules.push_back(r.value());
  alerts_save();
  return HttpResponse::ok({{"rule", alert_rule_json(r.value())}}, 201);
}

HttpResponse Coordinator::Impl::alerts_delete(const HttpRequest& req) {
  const std::string& name = req.param("name");
  std::lock_guard<std::mutex> lock(mu);
  const size_t before = alert_rules.size();
  std::erase_if(alert_rules, [&](const AlertRule& x) { return x.name == name; });
  if (alert_rules.size() == before) {
    std::string known;
    for (const AlertRule& x : alert_rules) known += (known.empty() ? "" : ", ") + x.name;
    return HttpResponse::error(
        404, "no alert rule \"" + name + "\" (rules: " + (known.empty() ? "none" : known) + ")");
  }
  alerts_save();
  // Its firings clear at the next evaluation, each with an alert_cleared event saying the rule was deleted.
  return HttpResponse::ok({{"deleted", name}});
}

void Coordinator::Impl::alert_loop() {
  std::map<int64_t, std::pair<int64_t, Clock::time_point>> step_seen;  // run -> (latest step, when it came)
  std::map<int64_t, std::optional<double>> ettr;
  Clock::time_point ettr_read{};
  while (!stopping.load()) {
    std::this_thread::sleep_for(kAlertPeriod);
    // The ledger first, without mu (goodput_json takes it, then reads the database).
    bool want_ettr = false;
    std::vector<int64_t> live;
    {
      std::lock_guard<std::mutex> lock(mu);
      for (const AlertRule& r : alert_rules) want_ettr = want_ettr || r.kind == AlertKind::kEttr;
      for (const auto& [id, r] : runs)
        if (!run_state_terminal(r.state)) live.push_back(id);
    }
    if (want_ettr && Clock::now() - ettr_read >= kEttrPeriod) {
      ettr_read = Clock::now();
      ettr.clear();
      for (int64_t id : live) {
        Result<json> g = goodput_json(id);
        if (g.ok() && g->contains("ettr") && g->at("ettr").is_number())
          ettr[id] = g->at("ettr").get<double>();
      }
    }
    std::lock_guard<std::mutex> lock(mu);
    const auto now = Clock::now();
    std::vector<AlertRunSample> samples;
    for (const auto& [id, r] : runs) {
      // Live and training here: a run being re-adopted, stopping or ended has no figures of its own now.
      if (run_state_terminal(r.state) || r.state == RunState::kStopping || r.adopting) continue;
      AlertRunSample s;
      s.run = id;
      // A run moving off a node takes no steps until it lands: not an absence.
      s.paused = r.state == RunState::kPaused || !r.relocate_node.empty();
      s.step = r.last_step;
      auto [it, fresh] = step_seen.try_emplace(id, r.last_step, now);
      if (!fresh && it->second.first != r.last_step) it->second = {r.last_step, now};
      s.seconds_since_step = std::chrono::duration<double>(now - it->second.second).count();
      if (r.last_step >= 0) s.series = alert_series_of(r.latest_step);
      for (int32_t rank = 0; rank < r.world(); ++rank) {
        const json k = r.straggler.rank_json(rank);
        if (!k.is_object() || !k.contains("excess_s") || !k.at("excess_s").is_number()) continue;
        const double e = k.at("excess_s").get<double>();
        if (!s.max_excess_s || e > *s.max_excess_s) s.max_excess_s = e, s.excess_rank = rank;
      }
      if (auto e = ettr.find(id); e != ettr.end()) s.ettr = e->second;
      samples.push_back(std::move(s));
    }
    std::erase_if(step_seen, [&](const auto& kv) { return !runs.count(kv.first); });
    if (alert_rules.empty() && alert_eval.firing().empty()) continue;
    for (const AlertTransition& t : alert_eval.evaluate(alert_rules, samples, unix_now_s())) {
      const bool fired = t.change == AlertChange::kFired;
      json p = {
          {"rule", t.rule_name}, {"value", value_json(t.value)}, {"state", fired ? "firing" : "cleared"}};
      std::string node;
      if (t.rule) {
        p["kind"] = alert_kind_name(t.rule->kind);
        const json rj = alert_rule_json(*t.rule);
        for (const char* k : {"series", "above", "below", "clear", "seconds"})
          if (rj.contains(k)) p[k] = rj.at(k);
        p["threshold"] = t.rule->kind == AlertKind::kAbsence ? json(t.rule->seconds)
                         : t.rule->kind == AlertKind::kNan   ? json(nullptr)
                                                             : json(t.rule->threshold);
      }
      if (t.rank >= 0) {
        p["rank"] = t.rank;
        if (auto r = runs.find(t.run); r != runs.end()) node = r->second.node_of(t.rank);
      }
      event(t.run, fired ? "alert" : "alert_cleared", t.message, p, t.step, node);
      if (!fired || !t.rule || t.rule->hook.empty()) continue;
      const std::string rule = t.rule_name;
      const int64_t run = t.run;
      const double timeout = t.rule->hook_timeout_s;
      const std::string command = t.rule->hook;
      alert_hooks->start(
          command, timeout,
          {{"GANTRY_ALERT_RULE", rule},
           {"GANTRY_ALERT_RUN", std::to_string(run)},
           {"GANTRY_ALERT_STEP", std::to_string(t.step)},
           {"GANTRY_ALERT_VALUE", value_json(t.value).dump()},
           {"GANTRY_ALERT_MESSAGE", t.message}},
          [this, rule, run, timeout, command](const AlertHookResult& h) {
            json hp = {{"rule", rule},
                       {"command", command},
                       {"timed_out", h.end == AlertHookResult::End::kTimedOut},
                       {"exit_code", h.end == AlertHookResult::End::kExited ? json(h.code) : json(nullptr)},
                       {"signal", h.end == AlertHookResult::End::kSignalled ? json(h.code) : json(nullptr)},
                       {"seconds", h.seconds},
                       {"timeout_s", timeout}};
            if (h.end == AlertHookResult::End::kNotStarted) hp["error"] = h.error;
            std::lock_guard<std::mutex> hook_lock(mu);
            event(run, "alert_hook", "alert " + rule + "'s hook " + h.text(timeout), hp);
          });
    }
  }
}

}  // namespace gantry
