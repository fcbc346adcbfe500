// gantry-engine ctl: the coordinator's API from a terminal (engine/cluster/api_client.h). Tables by
// default, the API's JSON with --json.
//   ctl --url U --token-file F status | runs | submit --config C --dp N [--tp T] [--pp P] [--vp V]
//   [--checkpoint-every N] [--keep-last
//   K] [--hang-timeout S] |
//       checkpoint|pause|resume|stop RUN | ranks RUN | events RUN | quarantine|release NODE |
//       resume-from RUN [--checkpoint latest|STEP|step_N] [--dp N] [--tp T] [--zero Z] | goodput RUN |
//       inject RUN kill|hang|slow|nan [--rank N] [--ms MS] |
//       straggler RUN --on|--off [--windows N] [--window-steps N] [--min-samples N] |
//       alerts [list | add NAME --kind K [--series S] [--above X | --below X] [--clear X] [--seconds N]
//               [--for-run R] [--hook CMD [--hook-timeout S]] | delete NAME]
#include <CLI/CLI.hpp>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "app/commands.h"
#include "engine/cluster/api_client.h"
#include "engine/cluster/token.h"
#include "telemetry/straggler.h"  // straggler_excess_text: the words the console uses too

namespace gantry {
namespace {

using json = nlohmann::json;

struct CtlArgs {
  std::string url, token_file, ca_file;
  bool json_out = false;
  std::string config;
  int dp = 1, zero = 0;
  int tp = 1, pp = 1, vp = 1;  // world = dp x tp x pp (ParallelDims' order: tp innermost, then pp, dp)
  int64_t max_steps = -1;
  int64_t checkpoint_every = 0;   // 0: no checkpoint policy
  std::string checkpoint_policy;  // "": the coordinator's default (fixed)
  int min_dp = 0, max_dp = 0;     // 0: not sent (the coordinator's defaults: 1 and no bound)
  int keep_last = 0;              // 0: keep every checkpoint
  int hang_timeout_s = 0;         // 0: the coordinator's default (10 s)
  std::string name;
  int64_t run = 0;
  std::string node;
  std::string checkpoint = "latest";
  int resume_dp = 0, resume_zero = -1;  // 0 / -1: the run's own
  int resume_tp = 0, resume_pp = 0;     // 0: the run's own
  std::string fault;
  int rank = -1;   // inject: -1 = one at random
  int64_t ms = 0;  // inject slow: the forward's delay
  // straggler: the policy's quarantine on or off (neither: unchanged), and scoring options (0: unchanged).
  bool straggler_on = false, straggler_off = false;
  int windows = 0, window_steps = 0, min_samples = 0;
  // alerts: what to do with the rules, and a rule's fields as given (a JSON value each; null: not given).
  std::string alerts_action = "list", alert_name;
  nlohmann::json alert_rule = nlohmann::json::object();
};

std::string cell(const json& v) {
  if (v.is_string()) return v.get<std::string>();
  if (v.is_null()) return "-";
  return v.dump();
}

// A plain table: a header, then rows, columns padded to their widest cell.
void print_table(const std::vector<std::string>& head, const std::vector<std::vector<std::string>>& rows) {
  std::vector<size_t> w(head.size());
  for (size_t c = 0; c < head.size(); ++c) w[c] = head[c].size();
  for (const auto& r : rows)
    for (size_t c = 0; c < r.size() && c < w.size(); ++c) w[c] = std::max(w[c], r[c].size());
  auto line = [&](const std::vector<std::string>& r) {
    std::string out;
    for (size_t c = 0; c < r.size(); ++c) {
      out += r[c];
      if (c + 1 < r.size()) out += std::string(w[c] - r[c].size() + 2, ' ');
    }
    std::printf("%s\n", out.c_str());
  };
  line(head);
  for (const auto& r : rows) line(r);
}

void print_alerts(const json& r) {
  std::vector<std::vector<std::string>> rows;
  for (const json& rule : r.at("rules")) {
    std::string cond;
    for (const char* k : {"series", "above", "below", "clear", "seconds", "run"})
      if (rule.contains(k)) cond += (cond.empty() ? "" : " ") + std::string(k) + "=" + cell(rule.at(k));
    rows.push_back({cell(rule.at("name")), cell(rule.at("kind")), cond, rule.value("hook", "-")});
  }
  print_table({"RULE", "KIND", "CONDITION", "HOOK"}, rows);
  const json& firing = r.at("firing");
  std::printf("\n%zu firing\n", firing.size());
  for (const json& f : firing) std::printf("FIRING  %s\n", f.value("message", "").c_str());
}

void print_runs(const json& runs) {
  std::vector<std::vector<std::string>> rows;
  for (const json& r : runs) {
    const json& l = r.at("layout");
    rows.push_back({cell(r.at("id")), cell(r.at("name")), cell(r.at("state")),
                    "dp=" + cell(l.at("dp")) + " tp=" + cell(l.value("tp", json(1))) +
                        " pp=" + cell(l.value("pp", json(1))) + " zero=" + cell(l.at("zero")),
                    cell(r.at("last_step")), cell(r.at("message"))});
  }
  print_table({"RUN", "NAME", "STATE", "LAYOUT", "STEP", "MESSAGE"}, rows);
}

std::string fixed(const json& v, int digits) {
  if (!v.is_number()) return "-";
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.*f", digits, v.get<double>());
  return buf;
}

// GET /v1/runs/{id}/ranks: each rank's place and latest step, and its straggler scores.
void print_ranks(const json& r) {
  std::vector<std::vector<std::string>> rows;
  for (const json& k : r.at("ranks")) {
    const json& s = k.at("straggler");
    const bool scored = s.is_object();
    // The same words as the console's Stragglers panel: the slow phase and its time over the other ranks'.
    const std::string slow =
        scored ? straggler_excess_text(s.value("slow_phase", ""), s.value("slow_phase_excess_s", 0.0)) : "-";
    // (dp, pp, tp): the rank's coordinate, so a slow stage or tp group shows in the column beside it.
    const json c = k.value("coord", json::object());
    const std::string coord =
        c.is_object() && c.contains("dp")
            ? "(" + cell(c.at("dp")) + "," + cell(c.at("pp")) + "," + cell(c.at("tp")) + ")"
            : "-";
    rows.push_back({cell(k.at("rank")), coord, cell(k.at("node")), cell(k.at("slot")),
                    cell(k.at("last_step")), fixed(k.at("step_seconds"), 4),
                    scored ? fixed(s.at("median_s"), 4) : "-", scored ? fixed(s.at("relative"), 3) : "-",
                    scored ? fixed(s.at("individual"), 3) : "-",
                    scored && s.value("flagged", false) ? "STRAGGLER" : (scored ? "ok" : "-"), slow});
  }
  const json& sum = r.at("straggler");
  const json& o = sum.at("options");
  std::printf(
      "run %s: straggler scores on the %s basis, window %s steps, evaluated at step %s (%s evaluations)\n",
      cell(r.at("run")).c_str(), cell(o.at("basis")).c_str(), cell(o.at("window_steps")).c_str(),
      cell(sum.at("evaluated_at_step")).c_str(), cell(sum.at("evaluations")).c_str());
  print_table({"RANK", "DP,PP,TP", "NODE", "SLOT", "STEP", "STEP_S", "MEDIAN_S", "RELATIVE", "INDIVIDUAL",
               "FLAG", "EXCESS"},
              rows);
}

// GET /v1/runs/{id}/goodput: the ledger's categories with their share of the wall, the failures with their
// cost, and the Young/Daly interval. A figure not known prints "unknown", never 0.
void print_goodput(const json& g) {
  const auto secs = [](const json& v) { return v.is_number() ? fixed(v, 2) + " s" : std::string("unknown"); };
  const double wall = g.value("wall_s", 0.0);
  std::printf(
      "run %s: wall %s, ETTR %s%s\n", cell(g.at("run")).c_str(), secs(g.at("wall_s")).c_str(),
      g.at("ettr").is_number() ? (fixed(g.at("ettr").get<double>() * 100, 1) + " %").c_str() : "unknown",
      g.value("live", false) ? " (live: up to now)" : "");
  if (!g.value("known", false)) std::printf("ledger unknown: %s\n", g.value("why_unknown", "").c_str());
  std::vector<std::vector<std::string>> rows;
  // In the ledger's order (engine/cluster/goodput.h), not the JSON object's alphabetical one.
  for (const char* name :
       {"productive", "checkpoint_stall", "detection", "restore", "recomputed", "paused", "waiting"}) {
    const json& v = g.at("seconds").value(name, json());
    rows.push_back(
        {name, secs(v), v.is_number() && wall > 0 ? fixed(100 * v.get<double>() / wall, 1) + " %" : "-"});
  }
  print_table({"CATEGORY", "SECONDS", "SHARE"}, rows);
  if (g.value("checkpoints_stall_unknown", 0) > 0)
    std::printf("(%s checkpoints have no recorded stall: not counted as stall)\n",
                cell(g.at("checkpoints_stall_unknown")).c_str());
  const json& failures = g.at("failures");
  std::printf("\n%zu failure%s\n", failures.size(), failures.size() == 1 ? "" : "s");
  if (!failures.empty()) {
    const double t0 = g.value("created_unix_s", 0.0);
    std::vector<std::vector<std::string>> f;
    for (const json& x : failures) {
      const std::string fault = x.value("fault", "");
      f.push_back({"+" + fixed(x.at("time_unix_s").get<double>() - t0, 1) + " s", cell(x.at("generation")),
                   cell(x.at("kind")) + (fault.empty() ? "" : " (injected " + fault + ")"),
                   cell(x.at("node")), fixed(x.at("detection_s"), 2), fixed(x.at("restore_s"), 2),
                   fixed(x.at("recomputed_s"), 2), fixed(x.at("cost_s"), 2),
                   x.value("recovered", false) ? "yes" : "no"});
    }
    print_table({"AT", "GEN", "KIND", "NODE", "DETECT_S", "RESTORE_S", "RECOMP_S", "COST_S", "RECOVERED"}, f);
  }
  const json& y = g.at("young_daly");
  const int64_t every = y.value("checkpoint_every_steps", int64_t{0});
  std::printf("\ncheckpoint policy %s, %s\n", cell(y.at("policy")).c_str(),
              every > 0 ? ("every " + std::to_string(every) + " steps").c_str() : "no periodic checkpoints");
  std::printf("Young/Daly sqrt(2 x C x MTBF): C (median stall of %s checkpoints) %s, MTBF %s (%s failures)\n",
              cell(y.at("checkpoints_measured")).c_str(), secs(y.at("checkpoint_cost_s")).c_str(),
              secs(y.at("mtbf_s")).c_str(), cell(y.at("failures")).c_str());
  if (y.at("interval_s").is_number()) {
    std::printf("recommended interval: %s = %s steps (mean step %s)\n", secs(y.at("interval_s")).c_str(),
                y.at("interval_steps").is_number() ? cell(y.at("interval_steps")).c_str() : "unknown",
                secs(y.at("step_s")).c_str());
  } else {
    std::printf("recommended interval: unknown (%s)\n", y.value("why_unknown", "").c_str());
  }
}

int ctl_main(const std::string& what, const CtlArgs& a) {
  auto fail = [](const std::string& m, int code = kExitFailed) {
    std::fprintf(stderr, "gantry-engine ctl: %s\n", m.c_str());
    return code;
  };
  Result<std::string> token = token_file_read(a.token_file);
  if (!token.ok()) return fail(token.error(), kExitBadInput);
  HttpClientOptions o{.url = a.url, .token = token.value(), .ca_file = a.ca_file};
  const std::string run = std::to_string(a.run);

  if (what == "events") {
    HttpEventStream s(o);
    Status st = ApiClient::follow_events(s, a.run, [&](const SseEvent& e) {
      if (a.json_out) {
        std::printf("%s\n", e.data.c_str());
      } else {
        json j = json::parse(e.data, nullptr, false);
        std::printf("%-6s %-18s step %-6s rank %-3s %s\n", e.id.c_str(), e.event.c_str(),
                    j.is_object() ? cell(j.value("step", json())).c_str() : "-",
                    j.is_object() ? cell(j.value("rank", json())).c_str() : "-",
                    j.is_object() ? j.value("message", "").c_str() : e.data.c_str());
      }
      std::fflush(stdout);
      return true;
    });
    return st.ok() ? 0 : fail(st.message());
  }

  ApiClient api(o);
  Result<json> r = Status::error("");
  if (what == "status") {
    r = api.cluster();
  } else if (what == "runs") {
    r = api.runs();
  } else if (what == "ranks") {
    r = api.ranks(a.run);
  } else if (what == "goodput") {
    r = api.goodput(a.run);
  } else if (what == "submit") {
    std::ifstream in(a.config);
    if (!in) return fail("cannot read --config " + a.config, kExitBadInput);
    std::stringstream ss;
    ss << in.rdbuf();
    json body = {{"config", ss.str()},
                 {"layout", {{"dp", a.dp}, {"tp", a.tp}, {"pp", a.pp}, {"vp", a.vp}, {"zero", a.zero}}}};
    if (a.max_steps >= 0) body["max_steps"] = a.max_steps;
    if (a.checkpoint_every > 0) body["checkpoint_every_steps"] = a.checkpoint_every;
    if (a.keep_last > 0) body["keep_last"] = a.keep_last;
    if (!a.checkpoint_policy.empty()) body["checkpoint_policy"] = a.checkpoint_policy;
    if (a.min_dp > 0) body["min_dp"] = a.min_dp;
    if (a.max_dp > 0) body["max_dp"] = a.max_dp;
    if (a.hang_timeout_s > 0) body["hang_timeout_s"] = a.hang_timeout_s;
    if (!a.name.empty()) body["name"] = a.name;
    r = api.submit(body);
    if (!r.ok() && r.error().find(" 409 ") != std::string::npos) return fail(r.error(), 3);
  } else if (what == "quarantine" || what == "release") {
    r = what == "quarantine" ? api.quarantine(a.node) : api.release(a.node);
  } else if (what == "forget") {
    r = api.forget(a.node);
  } else if (what == "inject") {
    r = api.inject(a.run, a.fault, a.rank, a.ms);
  } else if (what == "straggler") {
    json policy = json::object();
    if (a.straggler_on) policy["enabled"] = policy["quarantine"] = true;  // quarantine needs the scoring on
    if (a.straggler_off) policy["quarantine"] = false;
    if (a.windows > 0) policy["windows_to_flag"] = a.windows;
    if (a.window_steps > 0) policy["window_steps"] = a.window_steps;
    if (a.min_samples > 0) policy["min_samples"] = a.min_samples;
    if (policy.empty())
      return fail(
          "straggler: give --on or --off, or an option to change (--windows, --window-steps, --min-samples)",
          kExitBadInput);
    r = api.straggler(a.run, policy);
  } else if (what == "alerts") {
    if (a.alerts_action == "list") {
      r = api.alerts();
    } else if (a.alert_name.empty()) {
      return fail("alerts " + a.alerts_action + ": give the rule's NAME", kExitBadInput);
    } else if (a.alerts_action == "add") {
      json rule = a.alert_rule;
      rule["name"] = a.alert_name;
      r = api.alert_add(rule);
    } else {
      r = api.alert_delete(a.alert_name);
    }
  } else if (what == "resume-from") {
    // A step number travels as a number, so that "42" names step 42 rather than a directory called "42".
    json ckpt = a.checkpoint;
    if (!a.checkpoint.empty() && a.checkpoint.find_first_not_of("0123456789") == std::string::npos) {
      ckpt = std::stoll(a.checkpoint);
    }
    json body = {{"checkpoint", ckpt}};
    if (a.resume_dp > 0) body["layout"]["dp"] = a.resume_dp;
    if (a.resume_zero >= 0) body["layout"]["zero"] = a.resume_zero;
    if (a.resume_tp > 0) body["layout"]["tp"] = a.resume_tp;
    if (a.resume_pp > 0) body["layout"]["pp"] = a.resume_pp;
    r = api.resume_from(a.run, body);
    if (!r.ok() && r.error().find(" 409 ") != std::string::npos) return fail(r.error(), 3);
  } else {
    const std::optional<RunAction> action = run_action_from_name(what);
    if (!action) return fail("unknown command " + what, kExitBadInput);
    r = api.action(a.run, *action);
  }
  if (!r.ok()) {
    // The coordinator's word that the request itself was wrong (a bad field, no such run or node, a body
    // too large) is bad input, as everywhere else: exit 2.
    const bool bad_input =
        r.error().find(": 400 ") != std::string::npos || r.error().find(": 403 ") != std::string::npos ||
        r.error().find(": 404 ") != std::string::npos || r.error().find(": 409 ") != std::string::npos ||
        r.error().find(": 413 ") != std::string::npos;
    return fail(r.error(), bad_input ? kExitBadInput : kExitFailed);
  }
  if (a.json_out) {
    std::printf("%s\n", r->dump().c_str());
    return 0;
  }
  if (what == "status") {
    std::vector<std::vector<std::string>> rows;
    for (const json& n : r->at("nodes")) {
      // The agent's health checks: "ok", "unknown" (none could be made, or an older agent), or
      // "unhealthy: <reason>".
      const json h = n.value("health", json());
      std::string health = h.is_object() ? h.value("state", "unknown") : "unknown";
      if (h.is_object() && !h.value("reason", "").empty()) health += ": " + h.value("reason", "");
      rows.push_back({cell(n.at("id")), cell(n.at("state")), cell(n.at("slots")), cell(n.at("busy_slots")),
                      cell(n.at("runs")), health});
    }
    std::printf("coordinator %s: %s slots, %s busy, %s live runs\n", a.url.c_str(),
                cell(r->at("slots")).c_str(), cell(r->at("busy_slots")).c_str(),
                cell(r->at("runs_live")).c_str());
    print_table({"NODE", "STATE", "SLOTS", "BUSY", "RUNS", "HEALTH"}, rows);
  } else if (what == "runs") {
    print_runs(r->at("runs"));
  } else if (what == "ranks") {
    print_ranks(r.value());
  } else if (what == "goodput") {
    print_goodput(r.value());
  } else if (what == "submit") {
    print_runs(json::array({r.value()}));
  } else if (what == "quarantine") {
    std::printf("node %s quarantined; runs moving off it: %s (follow with `ctl events RUN`)\n",
                a.node.c_str(), r->at("moving_runs").empty() ? "none" : r->at("moving_runs").dump().c_str());
  } else if (what == "release") {
    std::printf("node %s released: %s\n", a.node.c_str(), cell(r->at("state")).c_str());
  } else if (what == "forget") {
    std::printf("node %s forgotten: no longer listed (its runs' history keeps it)\n", a.node.c_str());
  } else if (what == "inject") {
    std::printf("run %s: %s injected into rank %s on %s (follow with `ctl events RUN`)\n", run.c_str(),
                a.fault.c_str(), cell(r->at("rank")).c_str(), cell(r->at("node")).c_str());
  } else if (what == "straggler") {
    const json& p = r->at("straggler");
    std::printf(
        "run %s: straggler policy %s (quarantine %s, scoring %s, window_steps %s, windows_to_flag %s)\n",
        run.c_str(), cell(r->at("change")).c_str(), p.value("quarantine", false) ? "on" : "off",
        p.value("enabled", false) ? "on" : "off", cell(p.at("window_steps")).c_str(),
        cell(p.at("windows_to_flag")).c_str());
  } else if (what == "alerts") {
    if (a.alerts_action == "list") {
      print_alerts(r.value());
    } else if (a.alerts_action == "add") {
      std::printf("alert rule %s added: %s\n", a.alert_name.c_str(), r->at("rule").dump().c_str());
    } else {
      std::printf("alert rule %s deleted (a firing of it clears with an alert_cleared event)\n",
                  a.alert_name.c_str());
    }
  } else if (what == "resume-from") {
    std::printf("run %s resumes from %s (step %s)\n", run.c_str(), cell(r->at("checkpoint")).c_str(),
                cell(r->at("from_step")).c_str());
    print_runs(json::array({r.value()}));
  } else {
    std::printf("run %s: %s requested (request %s); it takes effect at the next step boundary\n", run.c_str(),
                what.c_str(), cell(r->at("request")).c_str());
  }
  return 0;
}

}  // namespace

void ctl_command_add(CLI::App& app, int* exit_code) {
  auto a = std::make_shared<CtlArgs>();
  CLI::App* ctl = app.add_subcommand("ctl", "Talk to a coordinator: status, runs, submit, actions, events");
  ctl->add_option("--url", a->url, "The coordinator's URL (`gantry-engine up` prints it)")->required();
  ctl->add_option("--token-file", a->token_file, "The bearer token's file (up writes DIR/token)")->required();
  ctl->add_option("--ca-file", a->ca_file, "CA certificate for an HTTPS coordinator");
  ctl->add_flag("--json", a->json_out, "Print the API's JSON instead of tables");
  ctl->require_subcommand(1);
  auto add = [&](const std::string& name, const std::string& help) {
    CLI::App* sub = ctl->add_subcommand(name, help);
    sub->callback([a, exit_code, name] { *exit_code = ctl_main(name, *a); });
    return sub;
  };
  add("status", "Nodes, slots and live runs");
  add("runs", "Every run and its state");
  CLI::App* submit = add("submit", "Submit a run (placed all-or-nothing; exit 3 when it cannot be placed)");
  submit->add_option("--config", a->config, "Training config (TOML)")->required()->check(CLI::ExistingFile);
  submit->add_option("--dp", a->dp, "Data-parallel ranks")->check(CLI::Range(1, 1 << 20));
  submit->add_option("--zero", a->zero, "ZeRO stage 0-3")->check(CLI::Range(0, 3));
  submit->add_option("--tp", a->tp, "Tensor-parallel degree (each group of tp ranks on one node)")
      ->check(CLI::Range(1, 1 << 10));
  submit->add_option("--pp", a->pp, "Pipeline-parallel stages (train.pp_schedule)")
      ->check(CLI::Range(1, 1 << 10));
  submit->add_option("--vp", a->vp, "Virtual stages per rank (interleaved 1F1B)")
      ->check(CLI::Range(1, 1 << 10));
  submit->add_option("--max-steps", a->max_steps, "Stop after this step")->check(CLI::NonNegativeNumber);
  submit->add_option("--name", a->name, "The run's name");
  submit->add_option("--min-dp", a->min_dp, "The smallest dp a recovery may shrink the run to (default 1)")
      ->check(CLI::Range(1, 1 << 20));
  submit->add_option("--max-dp", a->max_dp, "The largest dp a resume-from may ask for (default: no bound)")
      ->check(CLI::Range(1, 1 << 20));
  submit
      ->add_option("--checkpoint-every", a->checkpoint_every,
                   "The coordinator asks for a checkpoint every N steps (the checkpoint action, from policy)")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 40));
  submit
      ->add_option(
          "--checkpoint-policy", a->checkpoint_policy,
          "fixed (every --checkpoint-every steps) or young_daly (that interval until a failure, then "
          "sqrt(2 x checkpoint stall x MTBF) from what the run measured)")
      ->check(CLI::IsMember({"fixed", "young_daly"}));
  submit
      ->add_option("--keep-last", a->keep_last,
                   "Keep the newest K committed checkpoints; the coordinator deletes older ones")
      ->check(CLI::Range(1, 100000));
  submit
      ->add_option("--hang-timeout", a->hang_timeout_s,
                   "Seconds a running worker may send no heartbeat before its gang fails naming it as hung "
                   "(default 10)")
      ->check(CLI::Range(1, 3600));
  for (const char* action : {"checkpoint", "pause", "resume", "stop"}) {
    CLI::App* sub = add(action, std::string("Ask run RUN to ") + action + " at its next step boundary");
    sub->add_option("run", a->run, "The run's id")->required();
  }
  for (const char* action : {"quarantine", "release"}) {
    CLI::App* sub = add(action, std::string(action) == "quarantine"
                                    ? "Exclude node NODE; its runs checkpoint, stop and resume elsewhere"
                                    : "Let node NODE take work again");
    sub->add_option("node", a->node, "The node's id (ctl status lists them)")->required();
  }
  add("forget", "Drop lost node NODE from the cluster's list (refused for any node that is not lost)")
      ->add_option("node", a->node, "The node's id (ctl status lists them)")
      ->required();
  CLI::App* resume_from = add("resume-from",
                              "Resume a stopped, failed or interrupted run from one of its checkpoints (exit "
                              "3 when it cannot be placed)");
  resume_from->add_option("run", a->run, "The run's id")->required();
  resume_from->add_option("--checkpoint", a->checkpoint,
                          "latest (default), a step number, or a step_* directory name of the run");
  resume_from->add_option("--dp", a->resume_dp, "Data-parallel ranks (default the run's)")
      ->check(CLI::Range(1, 1 << 20));
  resume_from->add_option("--zero", a->resume_zero, "ZeRO stage 0-3 (default the run's)")
      ->check(CLI::Range(0, 3));
  resume_from->add_option("--tp", a->resume_tp, "Tensor-parallel degree (default the run's)")
      ->check(CLI::Range(1, 1 << 10));
  resume_from->add_option("--pp", a->resume_pp, "Pipeline stages (default the run's)")
      ->check(CLI::Range(1, 1 << 10));
  CLI::App* inject =
      add("inject",
          "A drill: kill (SIGKILL), hang (SIGSTOP), slow (its forward slowed by --ms from its next step "
          "on) or nan (its next step's gradients NaN: the step guard skips it) one worker of a live run; "
          "refused unless the coordinator was started with --allow-fault-injection");
  inject->add_option("run", a->run, "The run's id")->required();
  inject->add_option("fault", a->fault, "kill, hang, slow or nan")
      ->required()
      ->check(CLI::IsMember({"kill", "hang", "slow", "nan"}));
  inject->add_option("--ms", a->ms, "slow: milliseconds added to each forward pass (1..600000)")
      ->check(CLI::Range(int64_t{1}, int64_t{600000}));
  inject->add_option("--rank", a->rank, "The rank (default: one at random)")->check(CLI::Range(0, 1 << 20));
  CLI::App* straggler =
      add("straggler",
          "Change a live run's straggler policy: --on quarantines the node of a rank flagged "
          "--windows evaluations in a row (the run moves off it), --off only flags");
  straggler->add_option("run", a->run, "The run's id")->required();
  CLI::Option* on = straggler->add_flag("--on", a->straggler_on, "Quarantine a flagged rank's node");
  CLI::Option* off = straggler->add_flag("--off", a->straggler_off, "Only flag stragglers (the default)");
  on->excludes(off);
  straggler->add_option("--windows", a->windows, "Evaluations in a row a rank must be slow to be flagged")
      ->check(CLI::Range(1, 100000));
  straggler->add_option("--window-steps", a->window_steps, "Steps per evaluation")
      ->check(CLI::Range(1, 100000));
  straggler->add_option("--min-samples", a->min_samples, "Steps a rank needs in a window to be scored")
      ->check(CLI::Range(1, 100000));
  CLI::App* ranks = add("ranks", "A run's ranks: node, slot, latest step, straggler scores");
  ranks->add_option("run", a->run, "The run's id")->required();
  CLI::App* goodput = add("goodput",
                          "A run's goodput ledger: where its wall time went, its failures, ETTR, "
                          "and the Young/Daly checkpoint interval");
  goodput->add_option("run", a->run, "The run's id")->required();
  CLI::App* alerts =
      add("alerts",
          "Alert rules the coordinator evaluates: list them and what fires now, add one, delete "
          "one (docs/CLUSTER.md, \"Alerts\")");
  alerts->add_option("action", a->alerts_action, "list (default), add or delete")
      ->check(CLI::IsMember({"list", "add", "delete"}));
  alerts->add_option("name", a->alert_name, "add, delete: the rule's name");
  // Each field goes to the coordinator as given; it checks the rule and names what is wrong.
  auto field = [&](const std::string& flag, const std::string& key, const std::string& help, bool number) {
    alerts->add_option_function<std::string>(
        flag,
        [a, key, number](const std::string& v) {
          a->alert_rule[key] = number ? json::parse(v, nullptr, false) : json(v);
          if (a->alert_rule[key].is_discarded()) a->alert_rule[key] = v;  // the coordinator says why not
        },
        help);
  };
  field("--kind", "kind", "threshold, nan, absence, rank_excess or ettr", false);
  field("--series", "series", "threshold, nan: loss, grad_norm, step_s, tokens_per_s, mfu, lr or val_loss",
        false);
  field("--above", "above", "threshold, rank_excess: fire above this value (rank_excess: seconds)", true);
  field("--below", "below", "threshold, ettr: fire below this value", true);
  field("--clear", "clear", "clear at this value rather than the threshold (hysteresis)", true);
  field("--seconds", "seconds", "absence: fire when no step came for this long", true);
  field("--for-run", "run", "only this run (default: every live run)", true);
  field("--hook", "hook", "a shell command run when the rule fires (GANTRY_ALERT_* in its environment)",
        false);
  field("--hook-timeout", "hook_timeout_s", "seconds before the hook is killed (default 10)", true);
  CLI::App* events = add("events", "Follow a run's events until it ends");
  events->add_option("run", a->run, "The run's id")->required();
}

}  // namespace gantry
