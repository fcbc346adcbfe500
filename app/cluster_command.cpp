// gantry-engine coordinator | agent | up | down: the control plane's processes (docs/CLUSTER.md).
//   coordinator  the API, the run database, placement, rendezvous; until SIGTERM
//   agent        one per node: registers its slots, runs its share of placed jobs; until SIGTERM
//   up           a coordinator and K agents on this machine, in the background; prints the URL
//   coordinator-supervisor  (hidden) `up`'s keeper of its coordinator: starts it again when it dies
//   down         stops what `up` started (pid files in its folder), leaving no process behind
#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <thread>

#include "app/commands.h"
#include "app/file_text.h"
#include "engine/cluster/agent.h"
#include "engine/cluster/api_client.h"
#include "engine/cluster/coordinator.h"
#include "engine/cluster/run_store.h"
#include "engine/cluster/token.h"
#include "telemetry/host.h"

namespace gantry {
namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;
using namespace std::chrono_literals;

std::atomic<bool> g_stop{false};
extern "C" void cluster_on_stop_signal(int) {
  g_stop.store(true);
}

void install_stop_handlers() {
  struct sigaction sa = {};
  sa.sa_handler = cluster_on_stop_signal;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGINT, &sa, nullptr);
  sigaction(SIGTERM, &sa, nullptr);
}

// ---- coordinator
// -------------------------------------------------------------------------------------------

struct CoordinatorArgs {
  std::string dir, host = "127.0.0.1", token_file, url_file, rendezvous_host = "127.0.0.1", tls_cert, tls_key;
  std::string agent_token_file;  // "" = only the operator's token registers agents
  int port = 0;
  double node_timeout_s = 5;
  double max_beats_per_s = CoordinatorOptions{}.max_beats_per_s;
  double adopt_grace_s = 10;
  bool allow_fault_injection = false;
  std::string alerts_file;  // alert rules (TOML); "" = only those the API added
};

// This binary's path: each run's rendezvous store runs as `<it> rendezvous-store`.
std::string self_exe() {
  char self[4096];
  const ssize_t n = ::readlink("/proc/self/exe", self, sizeof self - 1);
  return n > 0 ? std::string(self, static_cast<size_t>(n)) : std::string();
}

int coordinator_main(const CoordinatorArgs& a) {
  Result<std::string> token = token_file_read(a.token_file);
  if (!token.ok()) {
    std::fprintf(stderr, "gantry-engine coordinator: %s\n", token.error().c_str());
    return kExitBadInput;
  }
  std::string agent_token;
  if (!a.agent_token_file.empty()) {
    Result<std::string> t = token_file_read(a.agent_token_file);
    if (!t.ok()) {
      std::fprintf(stderr, "gantry-engine coordinator: --agent-token-file: %s\n", t.error().c_str());
      return kExitBadInput;
    }
    agent_token = t.value();
  }
  Coordinator c({.dir = a.dir,
                 .host = a.host,
                 .port = a.port,
                 .token = token.value(),
                 .agent_token = agent_token,
                 .rendezvous_host = a.rendezvous_host,
                 .max_beats_per_s = a.max_beats_per_s,
                 .node_timeout = std::chrono::milliseconds(static_cast<int64_t>(a.node_timeout_s * 1e3)),
                 .allow_fault_injection = a.allow_fault_injection,
                 .tls_cert_file = a.tls_cert,
                 .tls_key_file = a.tls_key,
                 .store_exe = self_exe(),
                 .adopt_grace = std::chrono::milliseconds(static_cast<int64_t>(a.adopt_grace_s * 1e3)),
                 .alerts_file = a.alerts_file});
  install_stop_handlers();
  if (Status s = c.start(); !s.ok()) {
    std::fprintf(stderr, "gantry-engine coordinator: %s\n", s.message().c_str());
    return kExitFailed;
  }
  std::fprintf(stderr, "gantry-engine coordinator: serving %s (state in %s)\n", c.url().c_str(),
               a.dir.c_str());
  if (!a.url_file.empty()) {
    // Written whole and renamed, so `up` never reads half a URL.
    const std::string tmp = a.url_file + ".tmp";
    std::ofstream(tmp) << c.url() << "\n";
    fs::rename(tmp, a.url_file);
  }
  while (!g_stop.load()) std::this_thread::sleep_for(100ms);
  std::fprintf(stderr, "gantry-engine coordinator: stopping\n");
  c.stop();
  return 0;
}

// ---- agent
// -------------------------------------------------------------------------------------------------

struct AgentArgs {
  std::string url, token_file, node, dir, ca_file, metrics_host = "127.0.0.1", memory_dir;
  int slots = 1, metrics_port = 0;
  bool spare = false;
  double stop_grace_s = 30;
  double min_free_disk_gb = AgentOptions{}.min_free_disk_gb;
};

int agent_main(const AgentArgs& a) {
  Result<std::string> token = token_file_read(a.token_file);
  if (!token.ok()) {
    std::fprintf(stderr, "gantry-engine agent: %s\n", token.error().c_str());
    return kExitBadInput;
  }
  std::string node = a.node;
  if (node.empty()) {
    node = host_name();
  }
  Agent agent({.url = a.url,
               .token = token.value(),
               .ca_file = a.ca_file,
               .node = node,
               .slots = a.slots,
               .spare = a.spare,
               .dir = a.dir.empty() ? "gantry-agent-" + node : a.dir,
               .stop_grace = std::chrono::milliseconds(static_cast<int64_t>(a.stop_grace_s * 1e3)),
               .metrics_host = a.metrics_host,
               .metrics_port = a.metrics_port,
               .min_free_disk_gb = a.min_free_disk_gb,
               .memory_dir = a.memory_dir});
  install_stop_handlers();
  Status s = agent.run(&g_stop);
  if (!s.ok()) {
    std::fprintf(stderr, "gantry-engine agent %s: %s\n", node.c_str(), s.message().c_str());
    return kExitFailed;
  }
  return 0;
}

// ---- up / down
// ---------------------------------------------------------------------------------------------

// A process `up` started, by its pid file: alive only if it still runs this binary (a pid file outliving a
// reboot must not make `down` signal a stranger) and is not a zombie waiting for its reaper.
bool ours_alive(pid_t pid) {
  if (pid <= 0 || ::kill(pid, 0) != 0) return false;
  const std::string stat = file_text_read("/proc/" + std::to_string(pid) + "/stat");
  const size_t close = stat.rfind(')');
  if (close != std::string::npos && close + 2 < stat.size() && stat[close + 2] == 'Z') return false;
  return file_text_read("/proc/" + std::to_string(pid) + "/cmdline").find("gantry-engine") !=
         std::string::npos;
}

pid_t read_pid(const fs::path& p) {
  std::string t = file_text_read(p);
  return static_cast<pid_t>(std::atol(t.c_str()));
}

// Starts `gantry-engine <args>` in a session of its own (so the terminal's Ctrl-C and `up` exiting leave it
// alone), its output appended to `log`, and writes its pid file.
Result<pid_t> spawn_daemon(const std::vector<std::string>& args, const fs::path& log,
                           const fs::path& pid_file) {
  char self[4096];
  ssize_t n = ::readlink("/proc/self/exe", self, sizeof self - 1);
  if (n <= 0) return Status::error("cannot find this binary (/proc/self/exe)");
  self[n] = '\0';
  std::vector<std::string> argv_s = {self};
  argv_s.insert(argv_s.end(), args.begin(), args.end());
  std::vector<char*> argv;
  for (std::string& s : argv_s) argv.push_back(s.data());
  argv.push_back(nullptr);
  const std::string log_s = log.string();
  pid_t pid = ::fork();
  if (pid < 0) return Status::error(std::string("fork: ") + std::strerror(errno));
  if (pid == 0) {
    ::setsid();
    int in = ::open("/dev/null", O_RDONLY);
    int out = ::open(log_s.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
    if (in < 0 || out < 0) ::_exit(126);
    ::dup2(in, 0);
    ::dup2(out, 1);
    ::dup2(out, 2);
    ::execv(argv[0], argv.data());
    ::_exit(127);
  }
  std::ofstream(pid_file) << pid << "\n";
  return pid;
}

struct UpArgs {
  int nodes = 1, slots = 1, port = 0;
  int spares = 0;  // extra nodes registered as spares, named spare-0.. (placement holds them back)
  std::string dir = "gantry-cluster";
  double timeout_s = 20;
  double max_beats_per_s = CoordinatorOptions{}.max_beats_per_s;
  double node_timeout_s = 5;
  bool allow_fault_injection = false;
  std::string alerts_file;  // passed to the coordinator as an absolute path
  bool restart = true;      // a supervisor starts the coordinator again when it dies (--no-restart: not)
};

std::string log_tail(const fs::path& p) {
  return file_text_tail(p, 2000);
}

// ---- the coordinator's supervisor
// ------------------------------------------------------------------------------

// What `up` hands its supervisor: the coordinator's arguments (its port fixed once the first one listened,
// so that a restarted one answers on the same URL the agents and clients have) and the folder.
struct SupervisorArgs {
  std::string dir;
  std::vector<std::string> coordinator_args;
  double backoff_s = 0.5, max_backoff_s = 30;
};

// `up`'s coordinator, kept alive: started as the supervisor's child (its pid in coordinator.pid, where
// `down` and the tests find it), and started again on the same folder and port when it dies by itself (a
// crash, kill -9), after a backoff that doubles while it keeps dying soon after a start and starts over once
// it has lived a minute. Only the coordinator: the agents and their gangs are left alone, and the new
// coordinator re-adopts the gangs they report. A dead agent is not started again: its node is lost, and the
// coordinator's recovery moves its runs (a spare, else a shrink). SIGTERM (`down`) stops the coordinator
// and then the supervisor. Each start and death is a line of coordinator-supervisor.log.
int supervisor_main(const SupervisorArgs& a) {
  install_stop_handlers();
  const fs::path dir = a.dir;
  auto say = [](const std::string& line) {
    std::fprintf(stderr, "gantry-engine coordinator-supervisor: %s\n", line.c_str());
    std::fflush(stderr);
  };
  double backoff = a.backoff_s;
  int restarts = 0;
  std::vector<std::string> args = a.coordinator_args;
  bool listened = false;  // the coordinator wrote its URL once: its port is known and kept from then on
  const fs::path url_file = dir / "url";
  while (!g_stop.load()) {
    Result<pid_t> child = spawn_daemon(args, dir / "coordinator.log", dir / "coordinator.pid");
    if (!child.ok()) {
      say("cannot start the coordinator: " + child.error());
      return kExitFailed;
    }
    const auto started = Clock::now();
    say("coordinator started (pid " + std::to_string(child.value()) +
        (restarts > 0 ? ", restart " + std::to_string(restarts) : std::string()) + ")");
    int status = 0;
    bool stopping = false;
    for (;;) {
      const pid_t w = ::waitpid(child.value(), &status, WNOHANG);
      if (w == child.value()) break;
      if (!listened) {
        // Its port, from the URL it wrote (with --port 0 a free one was chosen): a restart asks for it.
        const std::string url = file_text_read(url_file);
        const size_t colon = url.rfind(':');
        if (colon != std::string::npos && url.find('\n') != std::string::npos) {
          const std::string port = std::to_string(std::atoi(url.c_str() + colon + 1));
          for (size_t k = 0; k + 1 < args.size(); ++k)
            if (args[k] == "--port") args[k + 1] = port;
          listened = true;
        }
      }
      if (w < 0 && errno != EINTR) {
        say(std::string("waitpid: ") + std::strerror(errno));
        return kExitFailed;
      }
      if (g_stop.load() && !stopping) {
        stopping = true;  // `down`: the coordinator interrupts its live runs and exits; then so do we
        ::kill(child.value(), SIGTERM);
      }
      std::this_thread::sleep_for(50ms);
    }
    if (g_stop.load()) break;
    if (!listened) {
      // It never came up (a bad argument, a port taken): starting it again would fail the same way.
      say("the coordinator exited before it listened; not starting it again (see coordinator.log)");
      return kExitFailed;
    }
    const std::string how = WIFSIGNALED(status) ? "was killed by signal " + std::to_string(WTERMSIG(status))
                                                : "exited with code " + std::to_string(WEXITSTATUS(status));
    if (Clock::now() - started > 60s) backoff = a.backoff_s;  // it had been up a while: not a crash loop
    char wait_text[32];
    std::snprintf(wait_text, sizeof wait_text, "%.1f", backoff);
    say("coordinator pid " + std::to_string(child.value()) + " " + how + "; starting it again in " +
        wait_text + " s on the same folder and port (the agents keep their gangs; it re-adopts them)");
    const auto until = Clock::now() + std::chrono::milliseconds(static_cast<int64_t>(backoff * 1e3));
    while (!g_stop.load() && Clock::now() < until) std::this_thread::sleep_for(20ms);
    backoff = std::min(backoff * 2, a.max_backoff_s);
    ++restarts;
  }
  say("stopped");
  return 0;
}

int down_dir(const fs::path& dir, double grace_s, bool quiet);

int up_main(const UpArgs& a) {
  const fs::path dir = fs::absolute(a.dir);
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) {
    std::fprintf(stderr, "gantry-engine up: cannot create %s: %s\n", dir.c_str(), ec.message().c_str());
    return kExitBadInput;
  }
  if (ours_alive(read_pid(dir / "coordinator.pid")) || ours_alive(read_pid(dir / "supervisor.pid"))) {
    std::fprintf(
        stderr,
        "gantry-engine up: a cluster is already up in %s (coordinator pid %d): `gantry-engine down --dir %s` "
        "first, or choose another --dir\n",
        dir.c_str(), read_pid(dir / "coordinator.pid"), dir.c_str());
    return kExitBadInput;
  }
  Result<std::string> token = token_generate();
  if (!token.ok()) {
    std::fprintf(stderr, "gantry-engine up: %s\n", token.error().c_str());
    return kExitFailed;
  }
  const fs::path token_file = dir / "token";
  if (Status s = token_file_write(token_file.string(), token.value()); !s.ok()) {
    std::fprintf(stderr, "gantry-engine up: %s\n", s.message().c_str());
    return kExitFailed;
  }
  // The agents get a token of their own: it registers nodes and opens their /metrics, and steers nothing.
  Result<std::string> agent_token = token_generate();
  const fs::path agent_token_file = dir / "agent_token";
  if (!agent_token.ok()) {
    std::fprintf(stderr, "gantry-engine up: %s\n", agent_token.error().c_str());
    return kExitFailed;
  }
  if (Status s = token_file_write(agent_token_file.string(), agent_token.value()); !s.ok()) {
    std::fprintf(stderr, "gantry-engine up: %s\n", s.message().c_str());
    return kExitFailed;
  }
  fs::remove(dir / "url", ec);
  auto fail = [&](const std::string& why) {
    std::fprintf(stderr, "gantry-engine up: %s\n", why.c_str());
    down_dir(dir, 5, true);  // nothing half-started is left running
    return kExitFailed;
  };
  std::vector<std::string> coordinator_args = {
      "coordinator",
      "--dir",
      dir.string(),
      "--token-file",
      token_file.string(),
      "--agent-token-file",
      agent_token_file.string(),
      "--url-file",
      (dir / "url").string(),
      "--port",
      std::to_string(a.port),
      "--max-beats-per-s",
      nlohmann::json(a.max_beats_per_s).dump(),  // the shortest exact text
      "--node-timeout",
      nlohmann::json(a.node_timeout_s).dump()};
  if (a.allow_fault_injection) coordinator_args.push_back("--allow-fault-injection");
  if (!a.alerts_file.empty()) {
    coordinator_args.push_back("--alerts");
    coordinator_args.push_back(fs::absolute(a.alerts_file).string());  // the coordinator's cwd may differ
  }
  // Supervised (the default), the supervisor starts the coordinator and starts it again when it dies;
  // `up` waits on the supervisor, which exits if the first coordinator never listens.
  std::vector<std::string> supervisor_args = {"coordinator-supervisor", "--dir", dir.string(), "--"};
  supervisor_args.insert(supervisor_args.end(), coordinator_args.begin(), coordinator_args.end());
  Result<pid_t> coord =
      a.restart ? spawn_daemon(supervisor_args, dir / "coordinator-supervisor.log", dir / "supervisor.pid")
                : spawn_daemon(coordinator_args, dir / "coordinator.log", dir / "coordinator.pid");
  if (!coord.ok()) return fail(coord.error());
  const auto deadline = Clock::now() + std::chrono::milliseconds(static_cast<int64_t>(a.timeout_s * 1e3));
  std::string url;
  while (url.empty()) {
    url = file_text_read(dir / "url");
    while (!url.empty() && (url.back() == '\n' || url.back() == ' ')) url.pop_back();
    if (!url.empty()) break;
    // The coordinator is still our child here: ask waitpid, not /proc (whose cmdline reads empty while the
    // child is in the middle of exec, which made a healthy start look like an exit).
    int status = 0;
    if (::waitpid(coord.value(), &status, WNOHANG) == coord.value()) {
      return fail("the coordinator exited at start; its log:\n" + log_tail(dir / "coordinator.log"));
    }
    if (Clock::now() > deadline)
      return fail("the coordinator did not start listening in time; its log:\n" +
                  log_tail(dir / "coordinator.log"));
    std::this_thread::sleep_for(20ms);
  }
  for (int i = 0; i < a.nodes + a.spares; ++i) {
    const bool spare = i >= a.nodes;
    const std::string node = spare ? "spare-" + std::to_string(i - a.nodes) : "node-" + std::to_string(i);
    std::vector<std::string> args = {"agent",
                                     "--coordinator",
                                     url,
                                     "--token-file",
                                     agent_token_file.string(),
                                     "--slots",
                                     std::to_string(a.slots),
                                     "--node",
                                     node,
                                     "--dir",
                                     (dir / "agents" / node).string()};
    if (spare) args.push_back("--spare");
    Result<pid_t> p = spawn_daemon(args, dir / ("agent-" + node + ".log"), dir / ("agent-" + node + ".pid"));
    if (!p.ok()) return fail(p.error());
  }
  ApiClient api({.url = url, .token = token.value()});
  for (;;) {
    Result<nlohmann::json> c = api.cluster();
    if (c.ok() && static_cast<int>(c->at("nodes").size()) >= a.nodes + a.spares) break;
    if (Clock::now() > deadline) {
      return fail("the agents did not all register in time (" +
                  (c.ok() ? std::to_string(c->at("nodes").size()) : c.error()) + "); see " + dir.string() +
                  "/agent-*.log");
    }
    std::this_thread::sleep_for(50ms);
  }
  std::printf("%s\n", url.c_str());
  std::fprintf(stderr,
               "gantry-engine up: coordinator %s with %d nodes x %d slots; token in %s; stop with "
               "`gantry-engine down --dir %s`\n",
               url.c_str(), a.nodes, a.slots, token_file.c_str(), dir.c_str());
  return 0;
}

// Agents first (they stop their workers, which checkpoint, and report to the coordinator), then the
// coordinator. SIGKILL for what outlives the grace; an agent's workers die with it (PR_SET_PDEATHSIG).
int down_dir(const fs::path& dir, double grace_s, bool quiet) {
  // The supervisor before the coordinator: stopped, it stops the coordinator and does not start it again.
  std::vector<std::pair<fs::path, pid_t>> agents, supervisor, coordinator;
  std::error_code ec;
  for (const fs::directory_entry& e : fs::directory_iterator(dir, ec)) {
    const std::string name = e.path().filename().string();
    if (name.size() > 4 && name.ends_with(".pid")) {
      (name == "coordinator.pid"  ? coordinator
       : name == "supervisor.pid" ? supervisor
                                  : agents)
          .emplace_back(e.path(), read_pid(e.path()));
    }
  }
  if (ec) {
    if (!quiet)
      std::fprintf(stderr, "gantry-engine down: cannot read %s: %s\n", dir.c_str(), ec.message().c_str());
    return kExitBadInput;
  }
  int stopped = 0, killed = 0;
  for (auto* group : {&agents, &supervisor, &coordinator}) {
    for (const auto& [file, pid] : *group)
      if (ours_alive(pid)) ::kill(pid, SIGTERM), ++stopped;
    const auto deadline = Clock::now() + std::chrono::milliseconds(static_cast<int64_t>(grace_s * 1e3));
    for (;;) {
      bool any = false;
      for (const auto& [file, pid] : *group) any = any || ours_alive(pid);
      if (!any) break;
      if (Clock::now() > deadline) {
        for (const auto& [file, pid] : *group)
          if (ours_alive(pid)) ::kill(pid, SIGKILL), ++killed;
        std::this_thread::sleep_for(100ms);
        break;
      }
      std::this_thread::sleep_for(50ms);
    }
    for (const auto& [file, pid] : *group) fs::remove(file, ec);
  }
  fs::remove(dir / "url", ec);
  if (!quiet) {
    std::fprintf(
        stderr, "gantry-engine down: stopped %d process%s in %s%s\n", stopped, stopped == 1 ? "" : "es",
        dir.c_str(),
        killed > 0 ? (" (" + std::to_string(killed) + " killed after the grace period)").c_str() : "");
  }
  return 0;
}

}  // namespace

void cluster_commands_add(CLI::App& app, int* exit_code) {
  {
    auto a = std::make_shared<CoordinatorArgs>();
    CLI::App* sub = app.add_subcommand(
        "coordinator", "Serve the cluster's HTTP API, run database, placement and rendezvous");
    sub->add_option("--dir", a->dir, "State folder: cluster.sqlite and runs/<id>/")->required();
    sub->add_option("--token-file", a->token_file, "The bearer token's file (mode 0600)")->required();
    sub->add_option(
        "--agent-token-file", a->agent_token_file,
        "The agents' token's file (mode 0600): it registers nodes and nothing else; each node then "
        "gets a credential for its own heartbeats (default: only --token-file registers)");
    sub->add_option("--host", a->host, "Address to serve on (default 127.0.0.1; another address wants TLS)");
    sub->add_option("--port", a->port, "Port (0 = a free one)")->check(CLI::Range(0, 65535));
    sub->add_option("--url-file", a->url_file, "Write the URL here once listening");
    sub->add_option("--rendezvous-host", a->rendezvous_host,
                    "Address of the runs' rendezvous stores (workers of every node must reach it)");
    sub->add_option("--node-timeout", a->node_timeout_s,
                    "Seconds without a heartbeat before a node is lost (at least 5 beat intervals)")
        ->check(CLI::PositiveNumber);
    sub->add_option("--max-beats-per-s", a->max_beats_per_s,
                    "Heartbeats per second the coordinator asks for at most, over all nodes: with more nodes "
                    "each beats less often (default 2500: every 5 s at 12,500 nodes)")
        ->check(CLI::PositiveNumber);
    sub->add_flag(
        "--allow-fault-injection", a->allow_fault_injection,
        "Accept POST /v1/runs/{id}/inject (`ctl inject`): kill, hang, slow or NaN a worker on purpose, for "
        "drills and tests; off by default");
    sub->add_option("--tls-cert", a->tls_cert, "PEM certificate for HTTPS (with --tls-key)");
    sub->add_option("--tls-key", a->tls_key, "PEM key for HTTPS");
    sub->add_option("--adopt-grace", a->adopt_grace_s,
                    "Seconds a run that was live when the last coordinator on --dir went away waits for its "
                    "agents to report its gang (re-adoption) before it is interrupted (default 10)")
        ->check(CLI::PositiveNumber);
    sub->add_option(
           "--alerts", a->alerts_file,
           "Alert rules (TOML, one [alert.NAME] table a rule: docs/CLUSTER.md, \"Alerts\"), over those "
           "kept in --dir from the API")
        ->check(CLI::ExistingFile);
    sub->callback([a, exit_code] { *exit_code = coordinator_main(*a); });
  }
  {
    // Started by the coordinator, one per run placement (run_store.h); not for people.
    auto o = std::make_shared<RunStoreProcessOptions>();
    CLI::App* sub =
        app.add_subcommand("rendezvous-store", "One run's rendezvous store (the coordinator starts it)");
    sub->group("");  // hidden from --help
    sub->add_option("--host", o->host, "Address to serve on");
    sub->add_option("--port-file", o->port_file, "Where to write \"<port> <pid>\" once listening")
        ->required();
    sub->callback([o, exit_code] {
      install_stop_handlers();
      Status s = run_store_main(*o, &g_stop);
      if (!s.ok()) std::fprintf(stderr, "gantry-engine rendezvous-store: %s\n", s.message().c_str());
      *exit_code = s.ok() ? 0 : kExitFailed;
    });
  }
  {
    auto a = std::make_shared<AgentArgs>();
    CLI::App* sub = app.add_subcommand("agent", "Run this node's share of the cluster's jobs");
    sub->add_option("--coordinator", a->url, "The coordinator's URL, e.g. http://127.0.0.1:7077")->required();
    sub->add_option("--token-file", a->token_file, "The bearer token's file (mode 0600)")->required();
    sub->add_option("--slots", a->slots, "Device slots this node offers (GPUs, or CPU worker slots)")
        ->check(CLI::Range(1, 4096));
    sub->add_option("--node", a->node, "This node's id, unique in the cluster (default the host name)");
    sub->add_option("--dir", a->dir, "The agent's folder (default gantry-agent-<node>)");
    sub->add_option("--memory-dir", a->memory_dir,
                    "Where the runs' in-memory copies (train.memory_copy_every) are kept: a tmpfs "
                    "(default /dev/shm/gantry-agent-<node>-<pid>, removed when the agent ends)");
    sub->add_option("--ca-file", a->ca_file, "CA certificate for an HTTPS coordinator");
    sub->add_option("--stop-grace", a->stop_grace_s,
                    "Seconds workers have to checkpoint and exit when stopped")
        ->check(CLI::PositiveNumber);
    sub->add_option("--metrics-port", a->metrics_port,
                    "Port of this node's /metrics (0 = a free one; default 0)")
        ->check(CLI::Range(0, 65535));
    sub->add_option("--metrics-host", a->metrics_host,
                    "Address of this node's /metrics (default 127.0.0.1); the URL is logged and written to "
                    "<dir>/metrics_url");
    sub->add_flag("--spare", a->spare,
                  "Register as a spare: used only when the other nodes cannot hold a job");
    sub->add_option("--min-free-disk-gb", a->min_free_disk_gb,
                    "Free space of --dir below this many GiB marks the node unhealthy: its runs move off "
                    "it (0 = no disk check; default 1; <dir>/min_free_disk_gb overrides it at run time)")
        ->check(CLI::Range(0.0, 1e9));
    sub->callback([a, exit_code] { *exit_code = agent_main(*a); });
  }
  {
    auto a = std::make_shared<UpArgs>();
    CLI::App* sub =
        app.add_subcommand("up", "Start a coordinator and K agents on this machine; print the URL");
    sub->add_option("--nodes", a->nodes, "Agents to start (each one node)")->check(CLI::Range(1, 256));
    sub->add_option("--slots", a->slots, "Slots per node")->check(CLI::Range(1, 4096));
    sub->add_option("--spares", a->spares, "Spare nodes to start besides (spare-0..; held back until needed)")
        ->check(CLI::Range(0, 256));
    sub->add_option("--dir", a->dir,
                    "Folder for the token, pid files, logs and state (default gantry-cluster)");
    sub->add_option("--port", a->port, "The coordinator's port (0 = a free one)")
        ->check(CLI::Range(0, 65535));
    sub->add_option("--timeout", a->timeout_s, "Seconds to wait for everything to start")
        ->check(CLI::PositiveNumber);
    sub->add_option("--max-beats-per-s", a->max_beats_per_s,
                    "The coordinator's heartbeat budget (see `coordinator --help`)")
        ->check(CLI::PositiveNumber);
    sub->add_option("--node-timeout", a->node_timeout_s,
                    "The coordinator's node timeout in seconds (see `coordinator --help`)")
        ->check(CLI::PositiveNumber);
    sub->add_flag("--allow-fault-injection", a->allow_fault_injection,
                  "The coordinator accepts `ctl inject` (kill, hang, slow or NaN a worker on purpose)");
    sub->add_option("--alerts", a->alerts_file, "Alert rules for the coordinator (see `coordinator --help`)")
        ->check(CLI::ExistingFile);
    sub->add_flag(
        "!--no-restart", a->restart,
        "Do not start the coordinator again when it dies (by default a supervisor does, on the same "
        "port, with a backoff; the agents and their gangs are left running and are re-adopted)");
    sub->callback([a, exit_code] { *exit_code = up_main(*a); });
  }
  {
    auto a = std::make_shared<SupervisorArgs>();
    CLI::App* sub = app.add_subcommand("coordinator-supervisor", "`up`'s keeper of its coordinator");
    sub->group("");  // hidden from --help: `up` starts it
    sub->add_option("--dir", a->dir, "The cluster's folder")->required();
    sub->add_option("coordinator_args", a->coordinator_args, "The coordinator's arguments, after --")
        ->required();
    sub->callback([a, exit_code] { *exit_code = supervisor_main(*a); });
  }
  {
    auto dir = std::make_shared<std::string>("gantry-cluster");
    auto grace = std::make_shared<double>(30);
    CLI::App* sub = app.add_subcommand("down", "Stop what `gantry-engine up` started");
    sub->add_option("--dir", *dir, "The folder given to up (default gantry-cluster)");
    sub->add_option("--grace", *grace, "Seconds to wait for each process before SIGKILL")
        ->check(CLI::PositiveNumber);
    sub->callback([dir, grace, exit_code] {
      if (!fs::is_directory(*dir)) {
        std::fprintf(stderr, "gantry-engine down: %s is not a folder (give the --dir that up was given)\n",
                     dir->c_str());
        *exit_code = kExitBadInput;
        return;
      }
      *exit_code = down_dir(fs::absolute(*dir), *grace, false);
    });
  }
}

}  // namespace gantry
