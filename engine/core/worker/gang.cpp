#include "engine/core/worker/gang.h"

#include <dirent.h>  // /proc/driver/nvidia/gpus: one entry per GPU, no CUDA needed
#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>  // PR_SET_PDEATHSIG: a worker dies with its launcher
#include <sys/socket.h>
#include <sys/syscall.h>  // close_range, where the kernel headers know it
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <optional>
#include <utility>  // std::exchange

#include "engine/core/comm/store_server.h"
#include "engine/core/worker/hang_blame.h"
#include "engine/core/worker/worker_runtime.h"  // the worker's exit codes
#include "telemetry/record_codec.h"

extern char** environ;

namespace gantry {
namespace {

using Clock = std::chrono::steady_clock;
using namespace std::chrono_literals;

// A worker whose socket closed is given this long to exit before the launcher calls it a failure: a
// worker that finished closes its socket a moment before the kernel reports its exit.
constexpr auto kGoneGrace = 2s;
// After the last child is reaped, frames still in the sockets (a goodbye, the last records) are read for
// at most this long.
constexpr auto kDrainLimit = 1s;
constexpr auto kPoll = 50ms;

// Variables the launcher sets itself: an inherited value would contradict the worker's place in the gang.
const char* const kOwnVariables[] = {
    "RANK",        "WORLD_SIZE",          "LOCAL_RANK",        "LOCAL_WORLD_SIZE",
    "MASTER_ADDR", "MASTER_PORT",         "GANTRY_STORE_FD",   "GROUP_RANK",
    "ROLE_RANK",   "TORCHELASTIC_RUN_ID", "GANTRY_RENDEZVOUS", "GANTRY_HANG_TIMEOUT_MS"};

// Why a gang failed, in the order of how likely each is to be the root cause when several show up in the
// same round: a rank killed by a signal takes its peers down with "peer closed" errors, not the reverse.
enum class Cause { signal, hung, crashed, protocol, no_join, closed, failed, spawn };
int rank_of_cause(Cause c) {
  switch (c) {
    case Cause::spawn:
      return 0;
    case Cause::signal:
    case Cause::hung:  // as much a root cause: its peers wait for it, never the reverse
      return 1;
    case Cause::crashed:
      return 2;
    case Cause::protocol:
      return 3;
    case Cause::no_join:
      return 4;
    case Cause::closed:
      return 5;
    case Cause::failed:
      return 6;
  }
  return 7;
}

struct Failure {
  int rank = -1;
  Cause cause = Cause::failed;
  std::string detail;
};

struct Slot {
  GangWorker w;
  bool alive = false;  // started and not yet reaped
  int client = -1;
  std::optional<Clock::time_point> gone_at;  // its socket closed
  std::string gone_reason;
  bool gone_unclean = false;  // its socket closed in the middle of a frame
  Clock::time_point beat_at;  // when its newest heartbeat arrived
  // As the launcher saw it when the gang failed or was told to stop: for hang_blame.
  bool running_at_failure = false;
  char state_at_failure = 0;
  std::chrono::milliseconds silent_at_failure{0};
};

std::string seconds_text(std::chrono::milliseconds ms) {
  char buf[32];
  if (ms.count() % 1000 == 0) {
    std::snprintf(buf, sizeof buf, "%lld s", static_cast<long long>(ms.count() / 1000));
  } else {
    std::snprintf(buf, sizeof buf, "%.1f s", static_cast<double>(ms.count()) / 1e3);
  }
  return buf;
}

// Writes a message from the child between fork and exec, where only async-signal-safe calls are allowed.
void child_fail(const char* what, int err) {
  const char* e = std::strerror(err);  // glibc's table lookup; no allocation for known codes
  const char* parts[] = {"gantry-engine run: worker exec failed: ", what, ": ", e, "\n"};
  for (const char* p : parts) {
    [[maybe_unused]] ssize_t w = ::write(2, p, std::strlen(p));
  }
}

std::string rank_text(const GangWorker& w) {
  return "rank " + std::to_string(w.rank) + " (pid " + std::to_string(w.pid) + ")";
}

// The ranks as hang_blame reads them, from the slots' *_at_failure snapshot.
std::vector<RankWatch> watch_of(const std::vector<Slot>& slots) {
  std::vector<RankWatch> watch;
  for (const Slot& s : slots) {
    watch.push_back({.rank = s.w.rank,
                     .pid = s.w.pid,
                     .running = s.running_at_failure,
                     .process_state = s.state_at_failure,
                     .has_heartbeat = s.w.has_heartbeat,
                     .last = s.w.heartbeat,
                     .silent_for = s.silent_at_failure});
  }
  return watch;
}

// A rank failed with an error or lost its connection (f), or the launcher was told to stop the gang (f is
// null: another node's ranks of the run failed first, typically timing out on a collective with one of
// ours): if the ranks were waiting for one that stopped answering, that rank is the failure, and the one
// that gave up is named as the witness. Reads the slots' *_at_failure snapshot.
void blame_hang(const std::vector<Slot>& slots, int base, const Failure* f, GangResult& res) {
  const std::vector<HangCulprit> culprits = hang_blame(watch_of(slots));
  if (culprits.empty()) return;
  const GangWorker& hung = slots[static_cast<size_t>(culprits[0].rank - base)].w;
  res.hang = true;
  res.failed_rank = hung.rank;
  // A rank that stopped answering is as much the root cause as one killed by a signal: across nodes the
  // coordinator prefers it to the peers whose collectives timed out waiting for it.
  res.failed_cause_rank = rank_of_cause(Cause::signal);
  res.code = kWorkerExitFailed;
  res.error = rank_text(hung) + " stopped answering: " + culprits[0].reason;
  for (size_t k = 1; k < culprits.size(); ++k)
    res.error += "; also rank " + std::to_string(culprits[k].rank) + ": " + culprits[k].reason;
  // The witnesses: every rank whose collective timed out (each waited for the culprit, directly or through
  // a neighbour that did), else the rank whose failure came first.
  std::vector<const GangWorker*> witnesses;
  for (const Slot& s : slots) {
    if (s.w.has_heartbeat && s.w.heartbeat.timed_out && s.w.rank != hung.rank) witnesses.push_back(&s.w);
  }
  const bool timed_out = !witnesses.empty();
  if (!timed_out && f != nullptr && f->rank + base != hung.rank)
    witnesses.push_back(&slots[static_cast<size_t>(f->rank)].w);
  if (!witnesses.empty()) {
    res.error += witnesses.size() == 1 ? ". rank " : ". ranks ";
    for (size_t k = 0; k < witnesses.size(); ++k) {
      if (k > 0) res.error += k + 1 == witnesses.size() ? " and " : ", ";
      res.error += std::to_string(witnesses[k]->rank) + " (pid " + std::to_string(witnesses[k]->pid) + ")";
    }
    res.error += timed_out ? " gave up waiting for it after the collective timeout of " +
                                 seconds_text(std::chrono::milliseconds(witnesses[0]->heartbeat.timeout_ms)) +
                                 " (--collective-timeout, train.collective_timeout_s)"
                           : " failed first";
    const GangWorker& first = *witnesses[0];
    if (first.said_goodbye && !first.goodbye.message.empty())
      res.error += "; rank " + std::to_string(first.rank) + " said: " + first.goodbye.message;
  }
  if (f == nullptr) res.error += "; found when the launcher was told to stop the gang";
  int others = 0;
  for (const Slot& s : slots) others += s.w.rank != hung.rank && s.w.pid > 0;
  if (others > 0)
    res.error +=
        "; the other " + std::to_string(others) + (others == 1 ? " rank was" : " ranks were") + " stopped";
}

}  // namespace

std::string signal_name(int sig) {
  switch (sig) {
    case SIGKILL:
      return "SIGKILL";
    case SIGTERM:
      return "SIGTERM";
    case SIGINT:
      return "SIGINT";
    case SIGSEGV:
      return "SIGSEGV";
    case SIGABRT:
      return "SIGABRT";
    case SIGBUS:
      return "SIGBUS";
    case SIGFPE:
      return "SIGFPE";
    case SIGILL:
      return "SIGILL";
    case SIGPIPE:
      return "SIGPIPE";
    case SIGHUP:
      return "SIGHUP";
    case SIGQUIT:
      return "SIGQUIT";
    case SIGTRAP:
      return "SIGTRAP";
    case SIGXCPU:
      return "SIGXCPU";
    default:
      return "signal " + std::to_string(sig);
  }
}

std::vector<std::string> gang_cuda_devices() {
  std::vector<std::string> out;
  if (const char* v = std::getenv("CUDA_VISIBLE_DEVICES"); v != nullptr) {
    std::string s = v;
    for (size_t pos = 0; pos <= s.size();) {
      size_t comma = s.find(',', pos);
      if (comma == std::string::npos) comma = s.size();
      if (comma > pos) out.push_back(s.substr(pos, comma - pos));
      pos = comma + 1;
    }
    return out;
  }
  DIR* d = ::opendir("/proc/driver/nvidia/gpus");
  if (d == nullptr) return out;
  int n = 0;
  while (dirent* e = ::readdir(d)) {
    if (e->d_name[0] != '.') ++n;
  }
  ::closedir(d);
  for (int i = 0; i < n; ++i) out.push_back(std::to_string(i));
  return out;
}

void GangCommands::send(int rank, WorkerCommand command) {
  std::lock_guard<std::mutex> lock(mu_);
  queue_.emplace_back(rank, std::move(command));
}

std::vector<std::pair<int, WorkerCommand>> GangCommands::take() {
  std::lock_guard<std::mutex> lock(mu_);
  return std::exchange(queue_, {});
}

void GangCommands::signal(int rank, int sig) {
  std::lock_guard<std::mutex> lock(mu_);
  signals_.emplace_back(rank, sig);
}

std::vector<std::pair<int, int>> GangCommands::take_signals() {
  std::lock_guard<std::mutex> lock(mu_);
  return std::exchange(signals_, {});
}

void GangCommands::inject(int rank, WorkerInject fault) {
  std::lock_guard<std::mutex> lock(mu_);
  injects_.emplace_back(rank, fault);
}

std::vector<std::pair<int, WorkerInject>> GangCommands::take_injects() {
  std::lock_guard<std::mutex> lock(mu_);
  return std::exchange(injects_, {});
}

GangResult gang_run(const GangOptions& o) {
  GangResult res;
  const int n = o.nproc;
  const int base = o.first_rank;  // global rank of local worker 0
  const int world = o.world > 0 ? o.world : n;
  std::vector<Slot> slots(static_cast<size_t>(std::max(n, 0)));
  std::map<int, int> rank_of_client;
  std::optional<Failure> failure;
  // Problems found while handling one round's frames and exits; the most likely root cause wins.
  std::vector<Failure> round;

  StoreServerOptions so;
  so.on_frame = [&](int client, const Frame& f) {
    auto it = rank_of_client.find(client);
    if (it == rank_of_client.end()) return;
    const int rank = it->second;
    Slot& s = slots[static_cast<size_t>(rank)];
    std::span<const uint8_t> payload(f.payload);
    switch (static_cast<FrameType>(f.type)) {
      case FrameType::worker_hello: {
        Result<WorkerHello> h = worker_hello_decode(payload);
        if (!h.ok()) return round.push_back({rank, Cause::protocol, h.error()});
        if (h->rank != base + rank || h->world != world) {
          return round.push_back({rank, Cause::protocol,
                                  "its hello says rank " + std::to_string(h->rank) + " of " +
                                      std::to_string(h->world) + ", but it was started as rank " +
                                      std::to_string(base + rank) + " of " + std::to_string(world) +
                                      " (is RANK or WORLD_SIZE overridden?)"});
        }
        s.w.joined = true;
        s.w.host = h->host;
        if (o.on_hello) o.on_hello(h.value());
        return;
      }
      case FrameType::worker_records: {
        RecordBatch batch;
        std::string error;
        if (!record_batch_decode(f.payload.data(), f.payload.size(), &batch, &error)) {
          return round.push_back({rank, Cause::protocol, "bad step records: " + error});
        }
        if (o.on_records) o.on_records(base + rank, batch);
        return;
      }
      case FrameType::worker_exit: {
        Result<WorkerExit> e = worker_exit_decode(payload);
        if (!e.ok()) return round.push_back({rank, Cause::protocol, e.error()});
        s.w.said_goodbye = true;
        s.w.goodbye = e.value();
        return;
      }
      case FrameType::worker_heartbeat: {
        Result<WorkerHeartbeat> h = worker_heartbeat_decode(payload);
        if (!h.ok()) return round.push_back({rank, Cause::protocol, h.error()});
        s.w.has_heartbeat = true;
        s.w.heartbeat = h.value();
        s.beat_at = Clock::now();
        if (o.on_heartbeat) o.on_heartbeat(base + rank, h.value());
        return;
      }
      case FrameType::worker_run: {
        Result<WorkerRun> r = worker_run_decode(payload);
        if (!r.ok()) return round.push_back({rank, Cause::protocol, r.error()});
        if (o.on_run) o.on_run(base + rank, r.value());
        return;
      }
      default:
        // A newer worker's frame this launcher does not know: harmless to skip, the stream stays in step.
        return;
    }
  };
  StoreServer server(std::move(so));

  // ---- spawn ----------------------------------------------------------------------------------------------
  // Everything the children need is built before the first fork: between fork and exec only
  // async-signal-safe calls are allowed (the caller may have threads, e.g. SQLite's checkpointer).
  std::vector<std::string> base_env;
  for (char** e = environ; e && *e; ++e) {
    std::string kv = *e;
    const std::string name = kv.substr(0, kv.find('='));
    bool own = std::find_if(std::begin(kOwnVariables), std::end(kOwnVariables),
                            [&](const char* v) { return name == v; }) != std::end(kOwnVariables);
    own = own || (!o.cuda_devices.empty() && name == "CUDA_VISIBLE_DEVICES");
    for (const auto& [k, v] : o.env) own = own || name == k;
    if (!own) base_env.push_back(std::move(kv));
  }
  for (const auto& [k, v] : o.env) base_env.push_back(k + "=" + v);
  // argv[0] names the real binary (what ps and the worker's own messages show); exec still goes through
  // o.exe, so /proc/self/exe keeps working if the file is replaced while the gang runs.
  std::string argv0 = o.exe;
  if (char real[4096]; o.exe == "/proc/self/exe") {
    ssize_t len = ::readlink("/proc/self/exe", real, sizeof real - 1);
    if (len > 0) argv0.assign(real, static_cast<size_t>(len));
  }
  std::vector<std::string> argv_s = {argv0};
  argv_s.insert(argv_s.end(), o.args.begin(), o.args.end());
  std::vector<char*> argv;
  for (std::string& a : argv_s) argv.push_back(a.data());
  argv.push_back(nullptr);
  const pid_t launcher_pid = ::getpid();

  auto start_failure = [&](int rank, const std::string& what) {
    failure = Failure{rank, Cause::spawn, what + ": " + std::strerror(errno)};
  };
  if (n < 1)
    failure = Failure{-1, Cause::spawn, "--nproc " + std::to_string(n) + ": at least one worker is needed"};
  if (!failure && !o.cuda_devices.empty() && static_cast<int>(o.cuda_devices.size()) < n) {
    failure = Failure{-1, Cause::spawn,
                      std::to_string(n) + " workers but only " + std::to_string(o.cuda_devices.size()) +
                          " CUDA devices to pin them to"};
  }
  for (int r = 0; r < n && !failure; ++r) {
    int sp[2];
    if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sp) != 0) {
      start_failure(r, "socketpair");
      break;
    }
    std::vector<std::string> env_s = base_env;
    env_s.push_back("RANK=" + std::to_string(base + r));
    env_s.push_back("WORLD_SIZE=" + std::to_string(world));
    env_s.push_back("LOCAL_RANK=" + std::to_string(r));
    env_s.push_back("LOCAL_WORLD_SIZE=" + std::to_string(n));
    env_s.push_back("MASTER_ADDR=127.0.0.1");
    env_s.push_back("GANTRY_STORE_FD=" + std::to_string(sp[1]));
    if (o.hang_timeout.count() > 0)
      env_s.push_back("GANTRY_HANG_TIMEOUT_MS=" + std::to_string(o.hang_timeout.count()));
    if (!o.cuda_devices.empty())
      env_s.push_back("CUDA_VISIBLE_DEVICES=" + o.cuda_devices[static_cast<size_t>(r)]);
    std::vector<char*> envp;
    for (std::string& e : env_s) envp.push_back(e.data());
    envp.push_back(nullptr);

    pid_t pid = ::fork();
    if (pid == 0) {
      // The child: die with the launcher, whatever kills it; no inherited signal state; only its own
      // socket survives exec (everything else the launcher holds is close-on-exec, and this makes sure).
      ::prctl(PR_SET_PDEATHSIG, SIGKILL);
      if (::getppid() != launcher_pid) ::_exit(kWorkerExitFailed);  // the launcher died before prctl
      sigset_t none;
      sigemptyset(&none);
      ::sigprocmask(SIG_SETMASK, &none, nullptr);
      for (int sig : {SIGINT, SIGTERM, SIGPIPE, SIGCHLD}) ::signal(sig, SIG_DFL);
#ifdef SYS_close_range
      // CLOSE_RANGE_CLOEXEC (4): mark, do not close, so a failing exec can still report on stderr.
      if (sp[1] > 3) ::syscall(SYS_close_range, 3u, static_cast<unsigned>(sp[1] - 1), 4u);
      ::syscall(SYS_close_range, static_cast<unsigned>(sp[1] + 1), ~0u, 4u);
#endif
      // stdout belongs to the launcher's --json lines; anything a worker prints goes to stderr instead.
      ::dup2(2, 1);
      if (::fcntl(sp[1], F_SETFD, 0) != 0) {
        child_fail("fcntl on the store socket", errno);
        ::_exit(127);
      }
      ::execve(o.exe.c_str(), argv.data(), envp.data());
      child_fail(o.exe.c_str(), errno);
      ::_exit(127);
    }
    ::close(sp[1]);
    if (pid < 0) {
      ::close(sp[0]);
      start_failure(r, "fork");
      break;
    }
    Slot& s = slots[static_cast<size_t>(r)];
    s.w.rank = base + r;
    s.w.pid = pid;
    s.alive = true;
    s.client = server.add_client(sp[0], "rank " + std::to_string(base + r));
    rank_of_client[s.client] = r;
    if (o.on_spawn) o.on_spawn(base + r, pid);
  }

  // ---- watch ----------------------------------------------------------------------------------------------
  const auto started = Clock::now();
  bool stopping = false;
  Clock::time_point kill_at;
  auto alive_count = [&] {
    return std::count_if(slots.begin(), slots.end(), [](const Slot& s) { return s.alive; });
  };
  auto begin_stop = [&](std::chrono::milliseconds grace) {
    if (stopping) return;
    stopping = true;
    kill_at = Clock::now() + grace;
    for (Slot& s : slots) {
      if (!s.alive) continue;
      s.w.signalled_by_launcher = true;
      ::kill(static_cast<pid_t>(s.w.pid), SIGTERM);
    }
  };
  if (failure) begin_stop(o.fail_grace);
  // Before a failure or an outside stop changes anything: which ranks are still running, stopped, or silent.
  auto snapshot = [&](Clock::time_point now) {
    for (Slot& s : slots) {
      s.running_at_failure = s.alive;
      s.state_at_failure = s.alive ? hang_process_state(s.w.pid) : 0;
      s.silent_at_failure = std::chrono::duration_cast<std::chrono::milliseconds>(now - s.beat_at);
    }
  };
  bool stopped_on_hang = false;  // an outside stop found a rank that had stopped answering

  while (alive_count() > 0) {
    if (o.commands != nullptr) {
      for (auto& [rank, command] : o.commands->take()) {
        const int local = rank - base;
        if (local < 0 || local >= n || !slots[static_cast<size_t>(local)].alive) continue;  // gone: moot
        // Queued on the worker's socket; a worker that has gone is reported by take_gone, not here.
        (void)server.send(slots[static_cast<size_t>(local)].client,
                          static_cast<uint8_t>(FrameType::worker_command), worker_command_encode(command));
      }
      for (auto [rank, fault] : o.commands->take_injects()) {
        const int local = rank - base;
        if (local < 0 || local >= n || !slots[static_cast<size_t>(local)].alive) continue;
        (void)server.send(slots[static_cast<size_t>(local)].client,
                          static_cast<uint8_t>(FrameType::worker_inject), worker_inject_encode(fault));
      }
      for (auto [rank, sig] : o.commands->take_signals()) {
        const int local = rank - base;
        if (local < 0 || local >= n || !slots[static_cast<size_t>(local)].alive) continue;
        ::kill(static_cast<pid_t>(slots[static_cast<size_t>(local)].w.pid), sig);
      }
    }
    if (Status st = server.poll_once(kPoll); !st.ok()) {
      // poll(2) itself failed: nothing more can be served. Stop the gang rather than spin.
      if (!failure) failure = Failure{-1, Cause::spawn, "the launcher's poll loop failed: " + st.message()};
      begin_stop(o.fail_grace);
    }
    const auto now = Clock::now();
    for (const StoreClientGone& g : server.take_gone()) {
      auto it = rank_of_client.find(g.client);
      if (it == rank_of_client.end()) continue;
      Slot& s = slots[static_cast<size_t>(it->second)];
      s.gone_at = now;
      s.gone_reason = g.reason;
      // A frame cut short by the peer's own close is what a worker killed mid-send leaves: its socket
      // closes before its exit status can be collected, so the verdict waits (kGoneGrace) for waitpid
      // to name the signal. A bad frame from a live peer is the protocol's fault at once.
      if (!g.clean && !g.peer_closed) round.push_back({it->second, Cause::protocol, g.reason});
      s.gone_unclean = !g.clean;
    }
    for (Slot& s : slots) {
      if (!s.alive) continue;
      int status = 0;
      pid_t got = ::waitpid(static_cast<pid_t>(s.w.pid), &status, WNOHANG);
      if (got == static_cast<pid_t>(s.w.pid)) {
        s.alive = false;
        s.w.exited = WIFEXITED(status);
        s.w.code = s.w.exited ? WEXITSTATUS(status) : -1;
        s.w.signal = WIFSIGNALED(status) ? WTERMSIG(status) : 0;
        if (stopping) continue;  // on its way out because the launcher said so
        const int local = s.w.rank - base;
        if (!s.w.exited) {
          round.push_back({local, Cause::signal, ""});
        } else if (s.w.code == kWorkerExitInterrupted && s.w.said_goodbye && s.w.joined) {
          res.stopped = true;  // an operator's stop action: the gang stops together at one boundary
        } else if (s.w.code != 0 || !s.w.joined) {
          round.push_back({local, s.w.said_goodbye ? Cause::failed : Cause::crashed, ""});
        }
      } else if (got < 0 && errno == ECHILD) {
        s.alive = false;  // reaped elsewhere (a caller's SIGCHLD handler): gone all the same
      } else if (!stopping) {
        if (!s.w.joined && now - started >= o.join_timeout)
          round.push_back({s.w.rank - base, Cause::no_join, ""});
        if (s.gone_at && now - *s.gone_at >= kGoneGrace)
          round.push_back({s.w.rank - base, s.gone_unclean ? Cause::protocol : Cause::closed, s.gone_reason});
        // Silent while running: hung. Only after its first beat (before it, the join timeout and the
        // rendezvous' own timeout cover start-up) and until it says it has stopped beating.
        if (o.hang_timeout.count() > 0 && s.w.has_heartbeat && s.w.heartbeat.interval_ms > 0 &&
            now - s.beat_at >= o.hang_timeout)
          round.push_back({s.w.rank - base, Cause::hung, ""});
      }
    }
    if (!round.empty()) {
      if (!failure && !stopping) {
        failure = *std::min_element(round.begin(), round.end(), [](const Failure& a, const Failure& b) {
          return std::make_pair(rank_of_cause(a.cause), a.rank) <
                 std::make_pair(rank_of_cause(b.cause), b.rank);
        });
        snapshot(now);
        if (failure->cause == Cause::hung) {
          // A hung rank cannot act on SIGTERM (a stopped one does not even run): waiting out the grace for
          // it only delays the recovery. Its peers, blocked in a collective with it, fail at once when its
          // connections close. Killed before the others' SIGTERM, so SIGKILL is what ends it.
          Slot& h = slots[static_cast<size_t>(failure->rank)];
          h.w.killed_by_launcher = true;
          ::kill(static_cast<pid_t>(h.w.pid), SIGKILL);
        }
        begin_stop(o.fail_grace);
      }
      round.clear();
    }
    if (!stopping && o.stop != nullptr && o.stop->load()) {
      res.interrupted = true;
      // A stop from outside may be the run ending because another node's ranks failed waiting for one of
      // ours: which one they waited for is only seen here (its /proc state, its silence), and the
      // coordinator prefers that report to theirs. Snapshotted before SIGTERM changes anything; a rank
      // found stopped cannot act on SIGTERM, so SIGKILL ends it without waiting out the grace.
      snapshot(now);
      const std::vector<HangCulprit> culprits = hang_blame(watch_of(slots));
      stopped_on_hang = !culprits.empty();
      for (const HangCulprit& c : culprits) {
        Slot& h = slots[static_cast<size_t>(c.rank - base)];
        if (!h.alive || (h.state_at_failure != 'T' && h.state_at_failure != 't')) continue;
        h.w.killed_by_launcher = true;
        ::kill(static_cast<pid_t>(h.w.pid), SIGKILL);
      }
      begin_stop(o.stop_grace);
    }
    if (stopping && o.kill_now != nullptr && o.kill_now->load()) kill_at = Clock::now();
    if (stopping && Clock::now() >= kill_at) {
      for (Slot& s : slots) {
        if (!s.alive || s.w.killed_by_launcher) continue;
        s.w.killed_by_launcher = true;
        ::kill(static_cast<pid_t>(s.w.pid), SIGKILL);
      }
    }
  }
  // Goodbyes and last records may still sit in the sockets of workers reaped this round.
  const auto drain_until = Clock::now() + kDrainLimit;
  while (server.client_count() > 0 && Clock::now() < drain_until) {
    if (!server.poll_once(20ms).ok()) break;
    server.take_gone();
  }
  round.clear();

  // ---- the verdict ----------------------------------------------------------------------------------------
  for (Slot& s : slots) res.workers.push_back(s.w);
  if (!slots.empty() && slots[0].w.said_goodbye) res.final_message = slots[0].w.goodbye.message;
  if (failure && (failure->cause == Cause::failed || failure->cause == Cause::crashed ||
                  failure->cause == Cause::closed)) {
    blame_hang(slots, base, &*failure, res);
  }
  if (!failure && stopped_on_hang) blame_hang(slots, base, nullptr, res);
  if (failure && failure->cause == Cause::hung) {
    const Slot& s = slots[static_cast<size_t>(failure->rank)];
    res.hang = res.hang_by_timeout = true;
    res.hang_silent_ms = s.silent_at_failure.count();
    res.hang_process_state = s.state_at_failure;
    res.failed_rank = s.w.rank;
    res.failed_cause_rank = rank_of_cause(Cause::hung);
    res.code = kWorkerExitFailed;
    const char st = s.state_at_failure;
    res.error =
        rank_text(s.w) + " hung: no heartbeat for " + seconds_text(s.silent_at_failure) + " (hang timeout " +
        seconds_text(o.hang_timeout) + ") while its process was running" +
        (st == 'T' || st == 't' ? std::string(" but stopped (state ") + st + ": SIGSTOP or a debugger)"
         : st != 0              ? std::string(" (state ") + st + ")"
                                : std::string()) +
        "; its last heartbeat was at " + hang_where(s.w.heartbeat);
    int others = 0;
    for (const Slot& o2 : slots) others += o2.w.rank != s.w.rank && o2.w.pid > 0;
    if (others > 0)
      res.error +=
          "; the other " + std::to_string(others) + (others == 1 ? " rank was" : " ranks were") + " stopped";
  } else if (failure && !res.hang) {
    const Failure& f = *failure;
    res.failed_rank = f.rank < 0 ? -1 : base + f.rank;
    res.failed_cause_rank = rank_of_cause(f.cause);
    res.code = kWorkerExitFailed;
    if (f.rank < 0) {
      res.error = "cannot start the gang: " + f.detail;
    } else {
      const GangWorker& w = slots[static_cast<size_t>(f.rank)].w;
      std::string who = "rank " + std::to_string(w.rank) + " (pid " + std::to_string(w.pid) + ")";
      std::string goodbye = w.said_goodbye && !w.goodbye.message.empty() ? ": " + w.goodbye.message : "";
      switch (f.cause) {
        case Cause::spawn:
          res.error = "cannot start rank " + std::to_string(base + f.rank) + ": " + f.detail;
          break;
        case Cause::signal:
          res.error = who + " was killed by " + signal_name(w.signal) + " (signal " +
                      std::to_string(w.signal) + ")" + (w.joined ? "" : " before joining");
          break;
        case Cause::crashed:
        case Cause::failed:
          res.error =
              who + " exited with code " + std::to_string(w.code) + (w.joined ? "" : " before joining") +
              (goodbye.empty() ? " (it sent no exit message; its own output above may say why)" : goodbye);
          if (w.code == kWorkerExitBadInput) res.code = kWorkerExitBadInput;
          if (w.code == kWorkerExitGuardStreak)
            res.code = kWorkerExitGuardStreak;  // the coordinator rolls back
          if (w.code == kWorkerExitCheckpointDamaged)
            res.code = kWorkerExitCheckpointDamaged;  // the coordinator falls back to an older checkpoint
          break;
        case Cause::no_join:
          res.error = who + " did not join within " + seconds_text(o.join_timeout) +
                      " (it never said hello to the launcher; raise --join-timeout if start-up is slow)";
          break;
        case Cause::closed:
          res.error = who + " closed its connection to the launcher (" + f.detail + ") but kept running";
          break;
        case Cause::protocol:
          res.error = who + " broke the launcher protocol: " + f.detail;
          break;
        case Cause::hung:  // named above, with its last heartbeat
          break;
      }
      int others = 0;
      for (const Slot& s : slots) others += s.w.rank != w.rank && s.w.pid > 0;
      if (others > 0)
        res.error += "; the other " + std::to_string(others) + (others == 1 ? " rank was" : " ranks were") +
                     " stopped";
    }
  } else if (!failure && !res.hang && (res.interrupted || res.stopped)) {
    res.code = kWorkerExitInterrupted;
  }
  return res;
}

}  // namespace gantry
