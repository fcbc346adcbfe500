// The node registry (coordinator_impl.h): agents register and heartbeat, nodes are quarantined and
// released, and the health watch marks silent nodes lost.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <set>
#include <thread>
#include <tuple>

#include "engine/cluster/agent_beat.h"
#include "engine/cluster/coordinator_impl.h"
#include "engine/cluster/json_fields.h"
#include "engine/cluster/token.h"  // token_generate, token_equal: the agents' credentials

namespace gantry {
namespace {

using json = nlohmann::json;
using namespace std::chrono_literals;

}  // namespace

void Coordinator::Impl::upsert_node(const Node& n, const char* state) {
  writer->push_op(
      [info = NodeInfo{.host = n.id,
                       .devices = n.slots,
                       .device_name = "slot",
                       .state = state,
                       .last_seen_unix_s = n.last_seen_unix}](HistoryDb& d) { d.upsert_node(info); });
}

std::vector<PlacementNode> Coordinator::Impl::placement_nodes() const {
  std::vector<PlacementNode> out;
  for (const auto& [id, n] : nodes) {
    PlacementNode p{.id = id, .slots = n.slots, .state = n.state};
    for (const auto& [rid, r] : runs) {
      if (run_state_terminal(r.state)) continue;
      for (const NodeShare& s : r.shares) {
        if (s.node == id && !s.done) p.busy.insert(p.busy.end(), s.slots.begin(), s.slots.end());
      }
    }
    std::sort(p.busy.begin(), p.busy.end());
    out.push_back(std::move(p));
  }
  return out;
}

Coordinator::Impl::Node* Coordinator::Impl::requested_node(const HttpRequest& req, HttpResponse* fail,
                                                           bool* force) {
  JsonFields f(req.body);
  if (force != nullptr) *force = f.boolean("force", JsonFields::optional).value_or(false);
  if (Status s = f.finish(); !s.ok()) {
    *fail = HttpResponse::error(400, s.message());
    return nullptr;
  }
  const std::string& id = req.param("id");
  auto it = nodes.find(id);
  if (it == nodes.end()) {
    *fail = HttpResponse::error(404, "no node \"" + id + "\" (GET /v1/cluster lists them)");
    return nullptr;
  }
  return &it->second;
}

HttpResponse Coordinator::Impl::quarantine(const HttpRequest& req) {
  std::lock_guard<std::mutex> lock(mu);
  HttpResponse fail;
  // {"force": true} fences even the last usable node (an operator who knows it is broken).
  bool force = false;
  Node* node = requested_node(req, &fail, &force);
  if (node == nullptr) return fail;
  const std::string& id = req.param("id");
  if (node->state == NodeState::quarantined)
    return HttpResponse::error(409, "node \"" + id + "\" is already quarantined");
  // The last usable node is not fenced by mistake: nothing could run, and its runs would have nowhere to go.
  auto usable = [](NodeState st) { return st == NodeState::healthy || st == NodeState::spare; };
  if (usable(node->state) && !force) {
    std::string others;
    bool other_usable = false;
    for (const auto& [oid, o] : nodes) {
      if (oid == id) continue;
      other_usable = other_usable || usable(o.state);
      others += (others.empty() ? "" : ", ") + oid + " " + std::string(node_state_name(o.state));
    }
    if (!other_usable) {
      return HttpResponse::error(409, "node \"" + id + "\" is the last healthy node (others: " +
                                          (others.empty() ? std::string("none") : others) +
                                          "): quarantining it would leave nothing to run on; release or add "
                                          "a node first, or send {\"force\": true} to fence it anyway");
    }
  }
  const json moving = quarantine_node(*node, "from " + req.remote, req.remote);
  return HttpResponse::ok({{"node", id}, {"state", "quarantined"}, {"moving_runs", moving}}, 202);
}

json Coordinator::Impl::quarantine_node(Node& n, const std::string& by, const std::string& from) {
  const std::string id = n.id;
  n.state = NodeState::quarantined;
  upsert_node(n, "quarantined");
  return move_runs_off(id, "quarantined " + by, {{"from", from}});
}

json Coordinator::Impl::move_runs_off(const std::string& id, const std::string& why, const json& payload) {
  json moving = json::array();
  for (auto& [rid, r] : runs) {
    if (!run_action_check(RunAction::kQuarantineMove, r.state).ok()) continue;  // ending anyway: no move
    if (!r.relocate_node.empty()) continue;  // already moving off a node: one move at a time
    bool here = false;
    for (const NodeShare& s : r.shares) here = here || (s.node == id && !s.done);
    if (!here) continue;
    const uint64_t request = next_request++;
    nodes[r.shares.front().node].commands.push_back({{"run", r.id},
                                                     {"rank", 0},
                                                     {"action", static_cast<int>(TrainAction::stop)},
                                                     {"request", request},
                                                     {"from", "quarantine of " + id}});
    set_state(r, *run_action_target(RunAction::kQuarantineMove));
    r.relocate_node = id;
    r.relocate_checkpoint.clear();
    json p = payload;
    p["node"] = id;
    p["request"] = request;
    event(r.id, "quarantine_requested",
          "node " + id + " " + why + ": run " + std::to_string(r.id) +
              " checkpoints and stops at the next step boundary, then moves",
          std::move(p), r.last_step, id);
    moving.push_back(r.id);
  }
  return moving;
}

void Coordinator::Impl::apply_health(Node& n, const json& health) {
  n.health = health;
  const std::string state = health.value("state", "unknown");
  const std::string reason = health.value("reason", "");
  if (state == "unhealthy" && (n.state == NodeState::healthy || n.state == NodeState::spare)) {
    n.state = NodeState::unhealthy;
    upsert_node(n, "unhealthy");
    std::fprintf(stderr, "gantry-engine coordinator: node %s unhealthy: %s\n", n.id.c_str(), reason.c_str());
    n.unhealthy_runs.clear();
    for (auto& [rid, r] : runs) {
      if (run_state_terminal(r.state)) continue;
      bool here = false;
      for (const NodeShare& s : r.shares) here = here || (s.node == n.id && !s.done);
      if (!here) continue;
      event(rid, "node_unhealthy", "node " + n.id + " is unhealthy: " + reason,
            {{"node", n.id}, {"reason", reason}, {"health", health}}, r.last_step, n.id);
      n.unhealthy_runs.push_back(rid);
    }
    move_runs_off(n.id, "unhealthy (" + reason + ")", {{"from", "health checks"}, {"reason", reason}});
  } else if (state != "unhealthy" && n.state == NodeState::unhealthy) {
    // Passing again (ok), or no longer checkable (unknown): usable again, said so.
    n.state = n.spare ? NodeState::spare : NodeState::healthy;
    upsert_node(n, "ok");
    std::fprintf(stderr, "gantry-engine coordinator: node %s healthy again (%s)\n", n.id.c_str(),
                 state.c_str());
    for (int64_t rid : std::exchange(n.unhealthy_runs, {})) {
      auto it = runs.find(rid);
      if (it == runs.end()) continue;
      event(rid, "node_healthy", "node " + n.id + " passes its health checks again (" + state + ")",
            {{"node", n.id}, {"health", health}}, it->second.last_step, n.id);
    }
  }
}

void Coordinator::Impl::quarantine_for_sdc(Run& r, const EventRecord& e) {
  const json p = json::parse(e.payload, nullptr, false);
  if (!p.is_object() || !p.value("majority", false)) return;
  // The rank's node from the run's placement, not from the event's host name (several agents may share a
  // host, and the placement is what quarantine acts on).
  std::string id;
  for (const NodeShare& s : r.shares) {
    if (e.rank >= s.first_rank && e.rank < s.first_rank + s.ranks) id = s.node;
  }
  auto it = nodes.find(id);
  if (it == nodes.end() || it->second.state == NodeState::quarantined) return;
  it->second.state = NodeState::quarantined;
  upsert_node(it->second, "quarantined");
  event(r.id, "sdc_quarantine",
        "node " + id + " quarantined: rank " + std::to_string(e.rank) + "'s " + p.value("state", "replica") +
            " disagreed with " + std::to_string(p.value("agreeing", 0)) + " of " +
            std::to_string(p.value("replicas", 0)) + " replicas at step " + std::to_string(e.step) +
            " (silent data corruption); the run recovers without it from a checkpoint no newer than step " +
            std::to_string(r.sdc_trusted_step) + ", the last check every replica passed",
        {{"node", id}, {"rank", e.rank}}, e.step, id);
}

HttpResponse Coordinator::Impl::release(const HttpRequest& req) {
  std::lock_guard<std::mutex> lock(mu);
  HttpResponse fail;
  Node* node = requested_node(req, &fail);
  if (node == nullptr) return fail;
  Node& n = *node;
  const std::string& id = req.param("id");
  if (n.state != NodeState::quarantined) {
    return HttpResponse::error(
        409, "node \"" + id + "\" is " + std::string(node_state_name(n.state)) + ", not quarantined");
  }
  n.state = n.spare ? NodeState::spare : NodeState::healthy;
  upsert_node(n, "ok");
  return HttpResponse::ok({{"node", id}, {"state", node_state_name(n.state)}});
}

HttpResponse Coordinator::Impl::forget(const HttpRequest& req) {
  const std::string& id = req.param("id");
  std::lock_guard<std::mutex> lock(mu);
  auto it = nodes.find(id);
  if (it == nodes.end())
    return HttpResponse::error(404, "no node \"" + id + "\" (GET /v1/cluster lists them)");
  Node& n = it->second;
  // Only a lost node: forgetting one that beats would only have it register again at its next heartbeat,
  // and a quarantined one is kept out of placement already, with its reason on record.
  if (n.state != NodeState::lost) {
    const auto silent = std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - n.last_seen);
    return HttpResponse::error(409, "node \"" + id + "\" is " + std::string(node_state_name(n.state)) +
                                        " (last heartbeat " + std::to_string(silent.count()) +
                                        " ms ago): only a lost node is forgotten; stop its agent, and it is "
                                        "lost " +
                                        std::to_string(node_timeout().count()) +
                                        " ms after its last heartbeat");
  }
  for (const auto& [rid, r] : runs) {
    if (run_state_terminal(r.state)) continue;
    for (const NodeShare& sh : r.shares) {
      if (sh.node == id && !sh.done)
        return HttpResponse::error(409, "node \"" + id + "\" still holds ranks of run " +
                                            std::to_string(rid) + " (" +
                                            std::string(run_state_name(r.state)) +
                                            "): forget it once that run has moved off it or ended");
    }
  }
  // The history keeps the node (its runs and device series name it), marked forgotten; an agent that comes
  // back under this name registers as a new node.
  upsert_node(n, "forgotten");
  nodes.erase(it);
  std::fprintf(stderr, "gantry-engine coordinator: node %s forgotten (from %s)\n", id.c_str(),
               req.remote.c_str());
  return HttpResponse::ok({{"node", id}, {"state", "forgotten"}});
}

bool Coordinator::Impl::agent_may(const std::string& method, const std::string& path,
                                  std::string_view token) {
  if (method != "POST") return false;
  if (path == "/v1/agents") return !opt.agent_token.empty() && token_equal(token, opt.agent_token);
  static const std::string prefix = "/v1/agents/", suffix = "/heartbeat";
  if (path.size() <= prefix.size() + suffix.size() || path.rfind(prefix, 0) != 0 ||
      path.compare(path.size() - suffix.size(), suffix.size(), suffix) != 0) {
    return false;
  }
  const std::string node = path.substr(prefix.size(), path.size() - prefix.size() - suffix.size());
  std::lock_guard<std::mutex> lock(mu);
  auto it = nodes.find(node);
  return it != nodes.end() && !it->second.credential.empty() && token_equal(token, it->second.credential);
}

HttpResponse Coordinator::Impl::agent_register(const HttpRequest& req) {
  JsonFields f(req.body);
  std::optional<std::string> id = f.string("node");
  std::optional<int64_t> slots = f.integer("slots", 1, 4096);
  std::optional<int64_t> pid = f.integer("pid", 0, INT64_MAX, JsonFields::optional);
  std::optional<std::string> host = f.string("host", JsonFields::optional);
  std::optional<bool> spare = f.boolean("spare", JsonFields::optional);
  std::optional<std::string> metrics_url = f.string("metrics_url", JsonFields::optional);
  // An agent registering again (its coordinator restarted): the gangs it runs, or that ended while no
  // coordinator could hear it, for re-adoption; and the records it had to drop meanwhile.
  const json* gangs = f.any("gangs", JsonFields::optional);
  std::optional<int64_t> dropped = f.integer("records_dropped", 0, INT64_MAX, JsonFields::optional);
  if (Status s = f.finish(); !s.ok()) return HttpResponse::error(400, s.message());
  if (gangs != nullptr && !gangs->is_array())
    return HttpResponse::error(400,
                               "field \"gangs\": expected an array of {run, generation, first_rank, "
                               "ranks, slots}, got " +
                                   json_type_phrase(*gangs));
  // Each gang's numbers checked before anything changes: adopt_gangs reads them after the node is
  // registered, and a {"run": "x"} used to throw there, a 400 that left the node registered anyway.
  for (size_t i = 0; gangs != nullptr && i < gangs->size(); ++i) {
    const json& g = gangs->at(i);
    const std::string at = "field \"gangs[" + std::to_string(i) + "]";
    if (!g.is_object())
      return HttpResponse::error(400, at + "\": expected an object, got " + json_type_phrase(g));
    for (const char* key : {"run", "generation", "first_rank", "ranks"}) {
      if (g.contains(key) && !g.at(key).is_number_integer())
        return HttpResponse::error(
            400, at + "." + key + "\": expected an integer, got " + json_type_phrase(g.at(key)));
    }
    if (g.contains("slots") && !g.at("slots").is_array())
      return HttpResponse::error(400,
                                 at + ".slots\": expected an array, got " + json_type_phrase(g.at("slots")));
  }
  if (Status s = check_name("node", *id, kMaxNodeName); !s.ok()) return HttpResponse::error(400, s.message());
  // The name is a path segment of the node's routes: one they cannot carry ("a/b", "a b", "..") used to
  // register, and the node was lost a node timeout later, every heartbeat answered 404.
  if (Status s = agent_node_name_check(*id); !s.ok())
    return HttpResponse::error(400, "field \"node\": " + s.message());
  if (metrics_url && (metrics_url->size() > 2048 ||
                      (metrics_url->rfind("http://", 0) != 0 && metrics_url->rfind("https://", 0) != 0))) {
    return HttpResponse::error(
        400, "field \"metrics_url\": expected an http:// or https:// URL of at most 2048 characters");
  }
  std::lock_guard<std::mutex> lock(mu);
  Node& n = nodes[*id];
  const bool back = n.id == *id;
  if (back && n.state != NodeState::lost && pid.value_or(0) != n.pid) {
    HttpResponse busy =
        HttpResponse::error(409, "node \"" + *id + "\" is already registered by another agent (pid " +
                                     std::to_string(n.pid) + "): give each agent its own --node");
    // When that agent would be lost if it stays silent: a restarted agent (its predecessor died within the
    // node timeout) waits this long and registers again (agent.cpp).
    const auto silent = std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - n.last_seen);
    busy.json["lost_in_ms"] = std::max<int64_t>((node_timeout() - silent).count(), 1);
    return busy;
  }
  n.id = *id;
  n.slots = static_cast<int>(*slots);
  n.pid = pid.value_or(0);
  n.host = host.value_or("");
  n.metrics_url = metrics_url.value_or("");
  // A fresh credential each registration: a restarted agent's predecessor's is void.
  Result<std::string> credential = token_generate();
  if (!credential.ok())
    return HttpResponse::error(500, "cannot make the node's credential: " + credential.error());
  n.credential = credential.value();
  n.spare = spare.value_or(false);
  if (!back) n.state = n.spare ? NodeState::spare : NodeState::healthy;
  if (n.state == NodeState::lost)
    n.state = n.spare ? NodeState::spare : NodeState::healthy;  // a quarantine stays
  n.last_seen = Clock::now();
  n.last_seen_unix = unix_now_s();
  upsert_node(n, "ok");
  if (gangs != nullptr) adopt_gangs(n.id, *gangs);
  if (dropped.value_or(0) > 0 && gangs != nullptr) {
    // Said in each run it ran: the records it lost are that run's (rank-step records, the oldest first).
    for (const json& g : *gangs) {
      auto it = runs.find(g.value("run", int64_t{-1}));
      if (it == runs.end()) continue;
      event(
          it->first, "records_dropped",
          n.id + " dropped " + std::to_string(*dropped) +
              " rank-step records (the oldest first) while it could not reach a coordinator: its buffer was "
              "full; steps, events and checkpoints were kept",
          {{"node", n.id}, {"dropped", *dropped}}, -1, n.id);
    }
  }
  return HttpResponse::ok(
      {{"node", n.id}, {"heartbeat_ms", beat_interval().count()}, {"credential", n.credential}});
}

std::chrono::milliseconds Coordinator::Impl::beat_interval() const {
  size_t live = 0;
  for (const auto& [id, n] : nodes) live += n.state != NodeState::lost;
  const auto spread = std::chrono::milliseconds(
      static_cast<int64_t>(std::ceil(1e3 * static_cast<double>(live) / opt.max_beats_per_s)));
  return std::max(opt.heartbeat, spread);
}

std::chrono::milliseconds Coordinator::Impl::node_timeout() const {
  return std::max(opt.node_timeout, kMissedBeatsLost * beat_interval());
}

HttpResponse Coordinator::Impl::agent_heartbeat(const HttpRequest& req) {
  const std::string& id = req.param("node");
  AgentBeat beat;  // decoded before the lock: the binary records never become text (agent_beat.h)
  if (Status s = agent_beat_decode(req.raw_body, &beat); !s.ok())
    return HttpResponse::error(400, s.message());
  JsonFields f(beat.control);
  const json* ended = f.any("ended", JsonFields::optional);
  std::optional<bool> replay = f.boolean("replay", JsonFields::optional);
  const json* health = f.any("health", JsonFields::optional);  // node_health.h's report (newer agents)
  const json* memory = f.any("memory", JsonFields::optional);
  if (Status s = f.finish(); !s.ok()) return HttpResponse::error(400, "beat: control: " + s.message());
  if (health != nullptr &&
      (!health->is_object() || !health->contains("state") || !health->at("state").is_string() ||
       (health->contains("reason") && !health->at("reason").is_string()))) {
    return HttpResponse::error(400,
                               "beat: control: field \"health\": expected an object {state: \"ok\"|"
                               "\"unhealthy\"|\"unknown\", reason: string, checks: [...]}, got " +
                                   (health->is_object() ? std::string("an object without a string state or "
                                                                      "with a reason that is no string")
                                                        : json_type_phrase(*health)));
  }
  RecordBatch& batch = beat.records;
  if (replay.value_or(false)) {
    const size_t before = batch.size();
    drop_recorded(batch);
    std::fprintf(stderr,
                 "gantry-engine coordinator: node %s replayed %zu records; dropped %zu events and checkpoint "
                 "records already recorded (steps are written once whatever)\n",
                 id.c_str(), before, before - batch.size());
  }
  return agent_beat_locked(id, ended, health, batch, memory);
}

// A replayed batch: records the agent sent before without learning that they were written (a coordinator
// killed meanwhile, a reply lost). Steps, rank steps and checkpoints are keyed in the database and written
// once whatever; events are not, nor are a checkpoint record's event, so those already there are dropped.
// Rare (after a failure only), so it may read the database.
void Coordinator::Impl::drop_recorded(RecordBatch& batch) {
  std::set<int64_t> runs_named;
  for (const EventRecord& e : batch.events) runs_named.insert(e.run_id);
  for (const CheckpointRecord& c : batch.checkpoints) runs_named.insert(c.run_id);
  if (runs_named.empty()) return;
  using EventKey = std::tuple<int64_t, double, std::string, int32_t, int64_t, std::string>;
  std::set<EventKey> events;
  {
    std::unique_lock<std::mutex> db_lock = read_lock();  // what this coordinator queued is written first
    for (int64_t run : runs_named) {
      std::vector<EventRow> rows;
      if (db->read_events(run, 0, SIZE_MAX, &rows)) {
        for (const EventRow& r : rows) {
          const EventRecord& e = r.event;
          events.insert({e.run_id, e.time_unix_s, e.kind, e.rank, e.step, e.message});
        }
      }
    }
  }
  std::erase_if(batch.events, [&](const EventRecord& e) {
    return events.count({e.run_id, e.time_unix_s, e.kind, e.rank, e.step, e.message}) > 0;
  });
  // A checkpoint record is its event too (HistoryDb::ingest writes both): recorded if its event is.
  std::erase_if(batch.checkpoints, [&](const CheckpointRecord& c) {
    const EventRecord e = checkpoint_event(c);
    return events.count({e.run_id, e.time_unix_s, e.kind, e.rank, e.step, e.message}) > 0;
  });
}

HttpResponse Coordinator::Impl::agent_beat_locked(const std::string& id, const json* ended,
                                                  const json* health, RecordBatch& batch,
                                                  const json* memory) {
  std::lock_guard<std::mutex> lock(mu);
  auto it = nodes.find(id);
  if (it == nodes.end())
    return HttpResponse::error(404, "node \"" + id + "\" is not registered (register first)");
  Node& n = it->second;
  n.last_seen = Clock::now();
  n.last_seen_unix = unix_now_s();
  if (n.state == NodeState::lost) n.state = n.spare ? NodeState::spare : NodeState::healthy;
  // Backpressure: with the database writer this far behind, the beat is refused whole (its records and
  // its gangs' ends; the agent keeps both for its next beat) rather than queued without bound.
  const size_t reserved = batch.size();
  if (!writer->reserve(reserved)) {
    return HttpResponse::error(503, "the coordinator's database writer is behind (" +
                                        std::to_string(writer->stats().queued_records) +
                                        " records queued): this beat was not taken; send it again");
  }
  ingest(batch, reserved);
  if (health != nullptr) apply_health(n, *health);
  if (ended != nullptr && ended->is_array()) {
    for (const json& e : *ended) {
      const int64_t run_id = e.value("run", int64_t{-1});
      auto rit = runs.find(run_id);
      if (rit == runs.end()) continue;
      Run& r = rit->second;
      if (e.value("generation", 0) != r.generation) continue;  // a late word of an earlier placement
      for (NodeShare& s : r.shares) {
        if (s.node != id || s.done) continue;
        s.done = true;
        s.code = e.value("code", 1);
        s.error = e.value("error", "");
        s.final_message = e.value("final_message", "");
        s.cause_rank = e.value("cause_rank", -1);
        s.agent_stopping = e.value("agent_stopping", false);
        if (const json* hang = e.contains("hang") ? &e.at("hang") : nullptr; hang && hang->is_object()) {
          // The culprit named by its own node (gang.h's hang detection): rank, node, phase, last
          // collective and its flight recorder, before the failure it causes.
          try {
            json payload = *hang;
            payload["node"] = id;
            const int64_t rank = hang->value("rank", int64_t{-1});
            event(r.id, "hang",
                  "rank " + std::to_string(rank) + " on " + id + " hung at step " +
                      std::to_string(hang->value("step", int64_t{0})) + " (" + hang->value("phase", "") +
                      "), collective #" + std::to_string(hang->value("collective", uint64_t{0})) +
                      (hang->value("in_collective", false) ? " (inside)" : " (after it)") + ": " +
                      hang->value("error", ""),
                  std::move(payload), -1, id);
          } catch (const json::exception&) {
            // A malformed report is the agent's defect; the failure below still names the rank.
          }
        }
        if (s.code != 0 && s.code != 130) {
          // One node's gang failed: the others cannot finish a collective without it.
          event(r.id, "node_failed", id + ": " + s.error, {{"code", s.code}}, -1, id);
          stop_shares(r, id);
        }
      }
      maybe_finish(r);
    }
  }
  // Which of this node's records are in the database: the agent keeps each batch until `written` reaches
  // its beat's `ticket`, and sends it again (replay) to a coordinator that never got that far.
  const uint64_t ticket = writer->queued_items();
  json reply = {{"ticket", ticket},
                {"written", writer->written_items()},
                {"start", std::exchange(n.start, json::array())},
                {"commands", std::exchange(n.commands, json::array())},
                {"stop", std::exchange(n.stop, json::array())},
                {"inject", std::exchange(n.inject, json::array())},
                {"heartbeat_ms", beat_interval().count()}};
  memory_copies_beat(id, memory, reply);
  return HttpResponse::ok(reply);
}

std::string Coordinator::Impl::failed_peer_of(const std::string& node) const {
  for (const auto& [rid, r] : runs) {
    if (run_state_terminal(r.state)) continue;
    bool holds_live_share = false;
    const NodeShare* failed = nullptr;
    for (const NodeShare& s : r.shares) {
      if (s.node == node && !s.done) holds_live_share = true;
      if (s.node != node && s.done && s.code != 0 && !s.agent_stopping) failed = &s;
    }
    if (holds_live_share && failed != nullptr) return failed->node;
  }
  return "";
}

std::string Coordinator::Impl::agent_url(const Node& n) {
  static const std::string suffix = "/metrics";
  const std::string& u = n.metrics_url;
  if (u.size() >= suffix.size() && u.compare(u.size() - suffix.size(), suffix.size(), suffix) == 0)
    return u.substr(0, u.size() - suffix.size());
  return u;
}

void Coordinator::Impl::memory_copies_beat(const std::string& id, const json* memory, json& reply) {
  if (memory == nullptr || !memory->is_array()) return;  // an agent that keeps none
  std::vector<MemoryCopyHeld> held;
  for (const json& h : *memory) {
    if (!h.is_object()) continue;
    try {
      held.push_back({.run = h.value("run", int64_t{-1}),
                      .rank = h.value("rank", -1),
                      .step = h.value("step", int64_t{-1}),
                      .world = h.value("world", 0)});
    } catch (const json::exception&) {
      // A malformed entry is the agent's defect; its other copies still count.
    }
  }
  memory_copies.report(id, std::move(held));
  json pulls = json::array(), drops = json::array();
  for (int64_t run : memory_copies.runs_on(id)) {
    auto rit = runs.find(run);
    if (rit == runs.end() || run_state_terminal(rit->second.state)) {
      drops.push_back(run);
      continue;
    }
    // The run's ring: its nodes in placement order; each rank's copy goes to the node after its own.
    const Run& r = rit->second;
    std::vector<std::string> ring;
    std::map<int, std::string> rank_node;
    for (const NodeShare& s : r.shares) {
      if (std::find(ring.begin(), ring.end(), s.node) == ring.end()) ring.push_back(s.node);
      for (int k = 0; k < s.ranks; ++k) rank_node[s.first_rank + k] = s.node;
    }
    if (std::find(ring.begin(), ring.end(), id) == ring.end()) continue;
    for (const MemoryCopyPull& p : memory_copies.pulls(run, ring, rank_node)) {
      auto from = nodes.find(p.from);
      if (p.to != id || from == nodes.end() || from->second.state == NodeState::lost) continue;
      pulls.push_back({{"run", p.run}, {"rank", p.rank}, {"step", p.step}, {"url", agent_url(from->second)}});
    }
  }
  if (!pulls.empty()) reply["memory_pull"] = std::move(pulls);
  if (!drops.empty()) reply["memory_drop"] = std::move(drops);
}

void Coordinator::Impl::watch_loop() {
  while (!stopping.load()) {
    std::this_thread::sleep_for(100ms);
    std::lock_guard<std::mutex> lock(mu);
    const auto now = Clock::now();
    adopt_expired(now);
    const std::chrono::milliseconds timeout = node_timeout();
    const std::chrono::milliseconds suspect_timeout =
        std::min(timeout, kMissedBeatsSuspect * beat_interval());
    for (auto& [id, n] : nodes) {
      if (n.state == NodeState::lost || now - n.last_seen < suspect_timeout) continue;
      const std::string failed_peer = failed_peer_of(id);
      if (now - n.last_seen < timeout && failed_peer.empty()) continue;
      const auto silent = std::chrono::duration_cast<std::chrono::milliseconds>(now - n.last_seen);
      const std::string why = now - n.last_seen < timeout
                                  ? "node lost (no heartbeat for " + std::to_string(silent.count()) +
                                        " ms after its gang's peer on " + failed_peer + " failed)"
                                  : "node lost (no heartbeat for " + std::to_string(timeout.count()) + " ms)";
      n.state = NodeState::lost;
      upsert_node(n, "lost");
      memory_copies.forget_node(id);  // its in-memory copies died with its agent
      for (auto& [rid, r] : runs) {
        if (run_state_terminal(r.state)) continue;
        for (NodeShare& s : r.shares) {
          if (s.node != id || s.done) continue;
          s.done = true;
          s.code = 1;
          s.node_lost = true;
          s.error = why;
          event(rid, "node_lost", id + ": " + s.error, json::object(), -1, id);
          stop_shares(r, id);
        }
        maybe_finish(r);
      }
    }
  }
}

}  // namespace gantry
