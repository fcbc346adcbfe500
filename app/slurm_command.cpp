// gantry-engine slurm | slurm-agent: a Slurm allocation as the gang (docs/SLURM.md).
//   slurm        what assets/slurm/gantry.sbatch runs in the batch step (the allocation's first node): a
//                coordinator (or an existing one given by URL), one agent per node through one
//                `srun --no-kill` step, the run submitted, Slurm's node states watched (a drained or down
//                node is quarantined: its ranks move to a spare), until the run ends
//   slurm-agent  one srun task: the same Agent as `gantry-engine agent`, its node id, slots and spare role
//                taken from Slurm's variables
#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>  // PR_SET_PDEATHSIG: the coordinator and srun end with this process
#include <sys/wait.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <string_view>
#include <thread>

#include "app/commands.h"
#include "app/file_text.h"
#include "engine/cluster/agent.h"
#include "engine/cluster/api_client.h"
#include "engine/cluster/token.h"
#include "telemetry/host.h"

namespace gantry {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;
using Clock = std::chrono::steady_clock;
using namespace std::chrono_literals;

std::atomic<bool> g_slurm_stop{false};
extern "C" void slurm_on_stop_signal(int) {
  g_slurm_stop.store(true);
}

void slurm_install_stop_handlers() {
  struct sigaction sa = {};
  sa.sa_handler = slurm_on_stop_signal;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGINT, &sa, nullptr);
  sigaction(SIGTERM, &sa, nullptr);
}

std::string slurm_tail(const fs::path& p) {
  return file_text_tail(p, 2000);
}

void say(const std::string& line) {
  std::fprintf(stderr, "gantry-engine slurm: %s\n", line.c_str());
  std::fflush(stderr);
}

// A Slurm variable as a positive integer; 0 when unset or not one.
int slurm_int(const char* name) {
  const char* v = std::getenv(name);
  if (v == nullptr || *v == '\0') return 0;
  char* end = nullptr;
  const long n = std::strtol(v, &end, 10);
  return (end != nullptr && (*end == '\0' || *end == '(') && n > 0 && n < (1 << 20)) ? static_cast<int>(n)
                                                                                     : 0;
}

// `argv` as a child in this process's group (not a session of its own: Slurm's process tracking then stops
// it with the batch step), output appended to `log`, and ended by SIGTERM when this process dies.
Result<pid_t> spawn_child(const std::vector<std::string>& args, const fs::path& log) {
  std::vector<std::string> argv_s = args;
  std::vector<char*> argv;
  for (std::string& s : argv_s) argv.push_back(s.data());
  argv.push_back(nullptr);
  const std::string log_s = log.string();
  const pid_t parent = ::getpid();
  const pid_t pid = ::fork();
  if (pid < 0) return Status::error(std::string("fork: ") + std::strerror(errno));
  if (pid == 0) {
    ::prctl(PR_SET_PDEATHSIG, SIGTERM);
    if (::getppid() != parent) ::_exit(126);
    const int out = ::open(log_s.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
    const int in = ::open("/dev/null", O_RDONLY);
    if (in < 0 || out < 0) ::_exit(126);
    ::dup2(in, 0);
    ::dup2(out, 1);
    ::dup2(out, 2);
    ::execvp(argv[0], argv.data());
    std::fprintf(stderr, "cannot run %s: %s\n", argv[0], std::strerror(errno));
    ::_exit(127);
  }
  return pid;
}

bool child_exited(pid_t pid, int* status) {
  return pid > 0 && ::waitpid(pid, status, WNOHANG) == pid;
}

// SIGTERM, then SIGKILL after `grace`; reaps it.
void child_stop(pid_t pid, std::chrono::milliseconds grace) {
  if (pid <= 0) return;
  int status = 0;
  if (child_exited(pid, &status)) return;
  ::kill(pid, SIGTERM);
  const auto deadline = Clock::now() + grace;
  while (Clock::now() < deadline) {
    if (child_exited(pid, &status)) return;
    std::this_thread::sleep_for(50ms);
  }
  ::kill(pid, SIGKILL);
  ::waitpid(pid, &status, 0);
}

std::string self_path() {
  char self[4096];
  const ssize_t n = ::readlink("/proc/self/exe", self, sizeof self - 1);
  return n > 0 ? std::string(self, static_cast<size_t>(n)) : std::string("gantry-engine");
}

// Each node of the job, by its Slurm state ("allocated", "draining", "down*", ...), from sinfo.
std::map<std::string, std::string> slurm_node_states(const std::string& nodelist) {
  std::map<std::string, std::string> out;
  const std::string cmd = "sinfo -h -N -o '%N %T' -n '" + nodelist + "' 2>/dev/null";
  FILE* p = ::popen(cmd.c_str(), "r");
  if (p == nullptr) return out;
  char line[512];
  while (std::fgets(line, sizeof line, p) != nullptr) {
    std::istringstream in(line);
    std::string node, state;
    if (in >> node >> state) out[node] = state;
  }
  ::pclose(p);
  return out;
}

// Slurm's word for a node that is leaving the job: drained or draining (an administrator's or a health
// check's), down, failing or not responding (a '*' suffix).
bool slurm_state_leaving(const std::string& state) {
  for (const char* w : {"drain", "down", "fail", "not_responding", "maint", "reboot"})
    if (state.find(w) != std::string::npos) return true;
  return !state.empty() && state.back() == '*';
}

bool run_ended(const std::string& state) {
  return state == "finished" || state == "stopped" || state == "failed";
}

// ---- slurm
// -------------------------------------------------------------------------------------------------

struct SlurmArgs {
  std::string config, dir, host, coordinator, token_file, agent_token_file, submit_json = "{}";
  int nodes = 0, slots = 0, dp = 0, port = 0;
  int64_t max_steps = 0;
  double timeout_s = 120, node_timeout_s = 5, watch_s = 2, stop_grace_s = 30;
};

int slurm_main(const SlurmArgs& a) {
  const char* job_id = std::getenv("SLURM_JOB_ID");
  const char* nodelist = std::getenv("SLURM_JOB_NODELIST");
  const int job_nodes =
      slurm_int("SLURM_JOB_NUM_NODES") > 0 ? slurm_int("SLURM_JOB_NUM_NODES") : slurm_int("SLURM_NNODES");
  if (job_id == nullptr || nodelist == nullptr || job_nodes == 0) {
    say("not inside a Slurm allocation: SLURM_JOB_ID, SLURM_JOB_NODELIST and SLURM_JOB_NUM_NODES are not all "
        "set (submit assets/slurm/gantry.sbatch with sbatch, or run this under salloc)");
    return kExitBadInput;
  }
  const int nodes = a.nodes > 0 ? a.nodes : job_nodes;
  if (nodes > job_nodes) {
    say("--nodes " + std::to_string(nodes) + " is more than the job's " + std::to_string(job_nodes) +
        " nodes (" + nodelist + "): ask sbatch for --nodes=" + std::to_string(nodes) + " or more");
    return kExitBadInput;
  }
  json extra = json::parse(a.submit_json, nullptr, /*allow_exceptions=*/false);
  if (!extra.is_object()) {
    say("--submit-json '" + a.submit_json + "' is not a JSON object (e.g. {\"max_restarts\": 3})");
    return kExitBadInput;
  }
  if (!a.coordinator.empty() && a.token_file.empty()) {
    say("--coordinator needs --token-file (the operator's token: this command submits the run)");
    return kExitBadInput;
  }
  const std::string config = file_text_read(a.config);
  if (config.empty()) {
    say("--config " + a.config + " is missing or empty (a training config, e.g. assets/configs/tiny.toml)");
    return kExitBadInput;
  }
  const fs::path dir = fs::absolute(a.dir.empty() ? "gantry-slurm-" + std::string(job_id) : a.dir);
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) {
    say("cannot create " + dir.string() + ": " + ec.message());
    return kExitBadInput;
  }
  slurm_install_stop_handlers();

  // The coordinator: ours on this node, or the one given. Its URL and the operator's token go into the job's
  // folder either way, for `gantry --connect` and `ctl`.
  const std::string self = self_path();
  const fs::path token_file = dir / "token", agent_token_file = dir / "agent_token", url_file = dir / "url";
  pid_t coordinator = -1;
  std::string url = a.coordinator, token;
  if (url.empty()) {
    Result<std::string> t = token_generate(), at = token_generate();
    if (!t.ok() || !at.ok()) {
      say(!t.ok() ? t.error() : at.error());
      return kExitFailed;
    }
    token = t.value();
    for (const auto& [file, value] :
         {std::pair{token_file, t.value()}, std::pair{agent_token_file, at.value()}}) {
      if (Status s = token_file_write(file.string(), value); !s.ok()) {
        say(s.message());
        return kExitFailed;
      }
    }
    const std::string host = a.host.empty() ? host_name() : a.host;
    fs::remove(url_file, ec);
    // Under `up`'s supervisor: a coordinator that dies is started again on the same folder and port, and
    // re-adopts the gangs the agents kept (docs/CLUSTER.md, "Restarts").
    Result<pid_t> c = spawn_child({self,
                                   "coordinator-supervisor",
                                   "--dir",
                                   dir.string(),
                                   "--",
                                   "coordinator",
                                   "--dir",
                                   (dir / "coordinator").string(),
                                   "--host",
                                   host,
                                   "--rendezvous-host",
                                   host,
                                   "--port",
                                   std::to_string(a.port),
                                   "--token-file",
                                   token_file.string(),
                                   "--agent-token-file",
                                   agent_token_file.string(),
                                   "--url-file",
                                   url_file.string(),
                                   "--node-timeout",
                                   json(a.node_timeout_s).dump()},
                                  dir / "coordinator-supervisor.log");
    if (!c.ok()) {
      say(c.error());
      return kExitFailed;
    }
    coordinator = c.value();
    const auto deadline = Clock::now() + std::chrono::milliseconds(static_cast<int64_t>(a.timeout_s * 1e3));
    for (;;) {
      url = file_text_read(url_file);
      while (!url.empty() && (url.back() == '\n' || url.back() == ' ')) url.pop_back();
      if (!url.empty()) break;
      int status = 0;
      if (child_exited(coordinator, &status) || Clock::now() > deadline || g_slurm_stop.load()) {
        say("the coordinator did not start; its log:\n" + slurm_tail(dir / "coordinator.log"));
        child_stop(coordinator, 1s);
        return kExitFailed;
      }
      std::this_thread::sleep_for(20ms);
    }
  } else {
    Result<std::string> t = token_file_read(a.token_file);
    if (!t.ok()) {
      say("--token-file: " + t.error());
      return kExitBadInput;
    }
    token = t.value();
    if (Status s = token_file_write(token_file.string(), token); !s.ok()) {
      say(s.message());
      return kExitFailed;
    }
    std::ofstream(url_file) << url << "\n";
  }
  const std::string agent_token = a.coordinator.empty()        ? agent_token_file.string()
                                  : a.agent_token_file.empty() ? a.token_file
                                                               : a.agent_token_file;
  say("coordinator " + url + "; URL and token in " + dir.string());

  // One agent per node of the allocation: one srun step, its tasks left running when one node fails
  // (--no-kill, --kill-on-bad-exit=0), each given the whole node (--whole: every CPU and GPU of it).
  std::vector<std::string> srun = {"srun",
                                   "--no-kill",
                                   "--kill-on-bad-exit=0",
                                   "--whole",
                                   "--nodes=" + std::to_string(job_nodes),
                                   "--ntasks=" + std::to_string(job_nodes),
                                   "--ntasks-per-node=1",
                                   "--output=" + (dir / "srun.log").string(),
                                   "--open-mode=append",
                                   self,
                                   "slurm-agent",
                                   "--coordinator",
                                   url,
                                   "--token-file",
                                   agent_token,
                                   "--layout-nodes",
                                   std::to_string(nodes),
                                   "--dir",
                                   (dir / "agents").string(),
                                   "--log-dir",
                                   dir.string()};
  if (a.slots > 0) {
    srun.push_back("--slots");
    srun.push_back(std::to_string(a.slots));
  }
  Result<pid_t> step = spawn_child(srun, dir / "srun.log");
  if (!step.ok()) {
    say(step.error());
    child_stop(coordinator, 5s);
    return kExitFailed;
  }
  int rc = kExitFailed;
  int64_t run_id = -1;
  auto finish = [&](int code) {
    child_stop(step.value(), std::chrono::milliseconds(static_cast<int64_t>(a.stop_grace_s * 1e3)));
    child_stop(coordinator, std::chrono::milliseconds(static_cast<int64_t>(a.stop_grace_s * 1e3)));
    return code;
  };

  ApiClient api({.url = url, .token = token});
  const auto deadline = Clock::now() + std::chrono::milliseconds(static_cast<int64_t>(a.timeout_s * 1e3));
  std::set<std::string> registered;
  for (;;) {
    int status = 0;
    if (child_exited(step.value(), &status)) {
      say("the agents' srun step ended before they all registered; " + (dir / "srun.log").string() + ":\n" +
          slurm_tail(dir / "srun.log"));
      return finish(kExitFailed);
    }
    Result<json> c = api.cluster();
    registered.clear();
    if (c.ok())
      for (const json& n : c->at("nodes")) registered.insert(n.value("id", ""));
    if (static_cast<int>(registered.size()) >= job_nodes) break;
    if (Clock::now() > deadline || g_slurm_stop.load()) {
      say(std::to_string(registered.size()) + " of " + std::to_string(job_nodes) +
          " agents registered in time; see " + dir.string() + "/agent-*.log");
      return finish(kExitFailed);
    }
    std::this_thread::sleep_for(100ms);
  }

  json body = {{"config", config}};
  const int dp = a.dp > 0 ? a.dp : 0;
  if (dp > 0) body["layout"] = {{"dp", dp}};
  if (a.max_steps > 0) body["max_steps"] = a.max_steps;
  body.update(extra);
  if (!body.contains("layout")) {
    // Every slot of the layout's nodes: the spares' slots are not counted.
    int slots = 0;
    if (Result<json> c = api.cluster(); c.ok()) {
      for (const json& n : c->at("nodes"))
        if (n.value("state", "") != "spare") slots += n.value("slots", 0);
    }
    body["layout"] = {{"dp", slots}};
  }
  Result<json> sub = api.submit(body);
  if (!sub.ok()) {
    say("the run was refused: " + sub.error());
    return finish(kExitBadInput);
  }
  run_id = sub->at("id").get<int64_t>();
  std::ofstream(dir / "run_id") << run_id << "\n";
  say("run " + std::to_string(run_id) + " submitted (" + body["layout"].dump() + ") on " +
      std::to_string(nodes) + " of " + std::to_string(job_nodes) + " nodes (" + nodelist +
      "); follow it: gantry --connect " + url + " --token-file " + token_file.string());

  // Until the run ends: Slurm's view of each node (an administrator's drain, a node down) becomes the
  // coordinator's quarantine, which checkpoints the run and places it again without that node.
  std::set<std::string> quarantined;
  auto last_watch = Clock::now() - 1h;
  bool stop_sent = false;
  std::string state;
  for (;;) {
    if (Result<json> r = api.run(run_id); r.ok()) state = r->value("state", "");
    if (run_ended(state)) break;
    if (g_slurm_stop.load() && !stop_sent) {
      // scancel or the time limit: the run checkpoints and stops before the agents go.
      say("stopping: run " + std::to_string(run_id) + " checkpoints and stops");
      Result<json> s = api.action(run_id, RunAction::kStop);
      if (!s.ok()) say("stop: " + s.error());
      stop_sent = true;
    }
    if (Clock::now() - last_watch > std::chrono::milliseconds(static_cast<int64_t>(a.watch_s * 1e3))) {
      last_watch = Clock::now();
      for (const auto& [node, slurm_state] : slurm_node_states(nodelist)) {
        if (!slurm_state_leaving(slurm_state) || quarantined.count(node) || !registered.count(node)) continue;
        Result<json> q = api.quarantine(node);
        say("node " + node + " is " + slurm_state + " in Slurm: " +
            (q.ok() ? "quarantined, its ranks move off it" : "quarantine refused: " + q.error()));
        quarantined.insert(node);
      }
    }
    std::this_thread::sleep_for(200ms);
  }
  Result<json> r = api.run(run_id);
  say("run " + std::to_string(run_id) + " " + state +
      (r.ok() ? " at step " + std::to_string(r->value("last_step", int64_t{-1})) : std::string()) +
      (r.ok() && !r->value("message", "").empty() ? ": " + r->value("message", "") : std::string()));
  rc = state == "finished" ? 0 : state == "stopped" ? kExitInterrupted : kExitFailed;
  return finish(rc);
}

// ---- slurm-agent
// -------------------------------------------------------------------------------------------

struct SlurmAgentArgs {
  std::string url, token_file, dir, node, ca_file, log_dir;
  int layout_nodes = 0, slots = 0;
  double stop_grace_s = 30;
};

int slurm_agent_main(const SlurmAgentArgs& a) {
  Result<std::string> token = token_file_read(a.token_file);
  if (!token.ok()) {
    std::fprintf(stderr, "gantry-engine slurm-agent: %s\n", token.error().c_str());
    return kExitBadInput;
  }
  // Multiple slurmd on one host name their nodes apart (SLURMD_NODENAME); one slurmd a host is the host.
  std::string node = a.node;
  if (node.empty() && std::getenv("SLURMD_NODENAME") != nullptr) node = std::getenv("SLURMD_NODENAME");
  if (node.empty()) node = host_name();
  // The nodes past the layout's are spares: SLURM_NODEID counts the job's nodes from 0.
  const char* node_id = std::getenv("SLURM_NODEID");
  if (node_id == nullptr) {
    std::fprintf(stderr,
                 "gantry-engine slurm-agent: SLURM_NODEID is not set: run it as an srun task "
                 "(assets/slurm/gantry.sbatch does)\n");
    return kExitBadInput;
  }
  if (!a.log_dir.empty()) {
    // Its own log by node name (srun's %N is the host's name, the same for every slurmd of one host).
    const std::string log = (fs::path(a.log_dir) / ("agent-" + node + ".log")).string();
    const int fd = ::open(log.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
    if (fd < 0) {
      std::fprintf(stderr, "gantry-engine slurm-agent %s: cannot open %s: %s\n", node.c_str(), log.c_str(),
                   std::strerror(errno));
      return kExitFailed;
    }
    ::dup2(fd, 1);
    ::dup2(fd, 2);
    ::close(fd);
  }
  const bool spare = a.layout_nodes > 0 && std::atoi(node_id) >= a.layout_nodes;
  // Slots: --slots (CPU ranks), else the GPUs Slurm gave this node (--gpus-per-node, --gres=gpu:N):
  // SLURM_GPUS_ON_NODE, else the devices its GRES plugin put in CUDA_VISIBLE_DEVICES (older set-ups). The
  // agent's workers get one of those devices each (gang.h).
  int slots = a.slots;
  if (slots == 0) slots = slurm_int("SLURM_GPUS_ON_NODE");
  if (const char* cvd = std::getenv("CUDA_VISIBLE_DEVICES");
      slots == 0 && cvd != nullptr && *cvd != '\0' && std::string_view(cvd) != "NoDevFiles") {
    slots = 1 + static_cast<int>(std::count(cvd, cvd + std::strlen(cvd), ','));
  }
  if (slots == 0) {
    std::fprintf(
        stderr,
        "gantry-engine slurm-agent %s: no GPUs from Slurm (SLURM_GPUS_ON_NODE and CUDA_VISIBLE_DEVICES are "
        "not set): ask sbatch "
        "for --gpus-per-node=N (or --gres=gpu:N), or give --slots N for CPU ranks\n",
        node.c_str());
    return kExitBadInput;
  }
  Agent agent({.url = a.url,
               .token = token.value(),
               .ca_file = a.ca_file,
               .node = node,
               .slots = slots,
               .spare = spare,
               .dir = (fs::path(a.dir) / node).string(),
               .stop_grace = std::chrono::milliseconds(static_cast<int64_t>(a.stop_grace_s * 1e3))});
  std::fprintf(stderr, "gantry-engine slurm-agent: node %s, %d slots%s, coordinator %s\n", node.c_str(),
               slots, spare ? " (spare)" : "", a.url.c_str());
  slurm_install_stop_handlers();
  Status s = agent.run(&g_slurm_stop);
  if (!s.ok()) {
    std::fprintf(stderr, "gantry-engine slurm-agent %s: %s\n", node.c_str(), s.message().c_str());
    return kExitFailed;
  }
  return 0;
}

}  // namespace

void slurm_commands_add(CLI::App& app, int* exit_code) {
  {
    auto a = std::make_shared<SlurmArgs>();
    CLI::App* sub = app.add_subcommand(
        "slurm",
        "Inside a Slurm job (assets/slurm/gantry.sbatch): a coordinator, one agent per node, the run");
    sub->add_option("--config", a->config, "The training config (TOML)")->required();
    sub->add_option("--dir", a->dir,
                    "The job's folder: URL, token, logs, the coordinator's state and checkpoints (default "
                    "gantry-slurm-$SLURM_JOB_ID)");
    sub->add_option("--nodes", a->nodes,
                    "Nodes the layout uses (default all of the job's); the job's other nodes are hot spares")
        ->check(CLI::Range(1, 100000));
    sub->add_option("--slots", a->slots,
                    "Ranks per node (default the GPUs Slurm gives each node; required without GPUs)")
        ->check(CLI::Range(1, 4096));
    sub->add_option("--dp", a->dp, "Data-parallel degree (default every slot of the layout's nodes)")
        ->check(CLI::Range(1, 1 << 20));
    sub->add_option("--max-steps", a->max_steps, "Override the config's train.max_steps")
        ->check(CLI::PositiveNumber);
    sub->add_option("--submit-json", a->submit_json,
                    "More fields of the run's submission, a JSON object (e.g. {\"max_restarts\": 5})");
    sub->add_option("--host", a->host,
                    "Address the coordinator serves on and the agents reach (default this node's host name)");
    sub->add_option("--port", a->port, "The coordinator's port (0 = a free one)")
        ->check(CLI::Range(0, 65535));
    sub->add_option("--coordinator", a->coordinator, "Use this running coordinator instead of starting one");
    sub->add_option("--token-file", a->token_file, "With --coordinator: the operator's token's file");
    sub->add_option("--agent-token-file", a->agent_token_file,
                    "With --coordinator: the agents' token's file (default --token-file)");
    sub->add_option("--timeout", a->timeout_s, "Seconds for the coordinator and the agents to start")
        ->check(CLI::PositiveNumber);
    sub->add_option("--node-timeout", a->node_timeout_s,
                    "Seconds without a heartbeat before the coordinator declares a node lost")
        ->check(CLI::PositiveNumber);
    sub->add_option("--watch-interval", a->watch_s, "Seconds between reads of Slurm's node states (sinfo)")
        ->check(CLI::PositiveNumber);
    sub->add_option("--stop-grace", a->stop_grace_s, "Seconds the agents and the coordinator have to stop")
        ->check(CLI::PositiveNumber);
    sub->callback([a, exit_code] { *exit_code = slurm_main(*a); });
  }
  {
    auto a = std::make_shared<SlurmAgentArgs>();
    CLI::App* sub =
        app.add_subcommand("slurm-agent", "One srun task of `gantry-engine slurm`: this node's agent");
    sub->add_option("--coordinator", a->url, "The coordinator's URL")->required();
    sub->add_option("--token-file", a->token_file, "The agents' token's file (mode 0600)")->required();
    sub->add_option("--dir", a->dir, "The agents' folder: this node's is <dir>/<node>")->required();
    sub->add_option("--layout-nodes", a->layout_nodes,
                    "Nodes the layout uses: a task with SLURM_NODEID past them registers as a spare")
        ->check(CLI::Range(1, 100000));
    sub->add_option("--slots", a->slots, "Slots (default the node's GPUs: SLURM_GPUS_ON_NODE)")
        ->check(CLI::Range(1, 4096));
    sub->add_option("--node", a->node, "Node id (default SLURMD_NODENAME, else the host name)");
    sub->add_option("--ca-file", a->ca_file, "CA certificate for an HTTPS coordinator");
    sub->add_option("--log-dir", a->log_dir, "Write this agent's output to <log-dir>/agent-<node>.log");
    sub->add_option("--stop-grace", a->stop_grace_s,
                    "Seconds workers have to checkpoint and exit when stopped")
        ->check(CLI::PositiveNumber);
    sub->callback([a, exit_code] { *exit_code = slurm_agent_main(*a); });
  }
}

}  // namespace gantry
