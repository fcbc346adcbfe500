// A real Slurm cluster on loopback for one test process: munged on a socket of its own, slurmctld and N
// slurmd (multiple-slurmd: `slurmd -N n1`, all of them NodeHostname=localhost NodeAddr=127.0.0.1) on free
// ports, every state, spool, log and pid file in the test's scratch folder. Every client call (sbatch,
// srun, scontrol, sinfo) goes through sh() with SLURM_CONF pointing at this cluster's slurm.conf, so tests
// running in parallel (ctest --parallel) never talk to each other's daemons.
//
//   SlurmCluster slurm;
//   if (std::string missing = SlurmCluster::missing_package(); !missing.empty()) GTEST_SKIP() << missing;
//   ASSERT_TRUE(slurm.start(scratch_dir("slurm"), 3).ok());
//   testing_support::Outcome o = slurm.sh("srun -N2 -n2 hostname");
//   slurm.stop();  // also in the destructor: jobs cancelled, daemons stopped by pid, strays killed
#pragma once

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/prctl.h>  // PR_SET_PDEATHSIG: a crashed test leaves no daemon behind
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <regex>
#include <sstream>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "telemetry/status.h"
#include "tests/app/engine_process.h"  // slurp, Outcome

namespace gantry::testing_support {

class SlurmCluster {
 public:
  // The programs the cluster needs, by the Debian package that brings each (scripts/setup.sh installs
  // them); "" when all are there, else a sentence naming what is missing, for GTEST_SKIP.
  static std::string missing_package() {
    std::string missing;
    for (const auto& [program, package] :
         std::vector<std::pair<std::string, std::string>>{{"munged", "munge"},
                                                          {"mungekey", "munge"},
                                                          {"slurmctld", "slurmctld"},
                                                          {"slurmd", "slurmd"},
                                                          {"sbatch", "slurm-client"},
                                                          {"scontrol", "slurm-client"},
                                                          {"sinfo", "slurm-client"}}) {
      if (find_program(program).empty()) missing += " " + program + " (Debian package " + package + ")";
    }
    if (missing.empty()) return "";
    return "Slurm is not installed here; missing:" + missing +
           ". scripts/setup.sh installs slurmctld slurmd slurm-client munge";
  }

  ~SlurmCluster() { stop(); }

  // Starts munged, slurmctld and `nodes` slurmd (n1..nN) in `dir` and waits until sinfo shows every node
  // idle.
  Status start(const std::filesystem::path& dir, int nodes) {
    dir_ = dir;
    conf_ = (dir / "slurm.conf").string();
    // munged's socket and slurmd's step sockets (spool-nK/nK_JOB.STEP) must fit a unix socket's 108 bytes.
    const std::string sock = (dir / "munge.sock").string();
    if (dir.string().size() > 80)
      return Status::error("the scratch folder's path is too long for munge's and slurmd's unix sockets (" +
                           std::to_string(dir.string().size()) +
                           " > 80 bytes; shorten the test's name): " + dir.string());
    std::filesystem::permissions(dir, std::filesystem::perms(0755));
    std::vector<int> ports = free_ports(nodes + 1);
    if (static_cast<int>(ports.size()) != nodes + 1) return Status::error("no free loopback ports");

    Outcome key = sh(find_program("mungekey") + " -c -b 1024 -k " + (dir / "munge.key").string());
    if (key.code != 0) return Status::error("mungekey: " + key.err);
    Result<pid_t> munged =
        spawn({find_program("munged"), "-F", "-f", "-S", sock, "--key-file=" + (dir / "munge.key").string(),
               "--log-file=" + (dir / "munged.log").string(), "--pid-file=" + (dir / "munged.pid").string(),
               "--seed-file=" + (dir / "munged.seed").string()},
              dir / "munged.out");
    if (!munged.ok()) return munged.status();
    if (!wait_for([&] { return std::filesystem::exists(sock); }, std::chrono::seconds(10)))
      return Status::error("munged did not create its socket: " + slurp((dir / "munged.out").string()));

    char host[256] = {};
    ::gethostname(host, sizeof host - 1);
    std::string short_host = host;
    short_host = short_host.substr(0, short_host.find('.'));
    const std::string d = dir.string();
    std::ofstream conf(conf_);
    conf << "ClusterName=gantry" << ::getpid() << "\n"
         << "SlurmctldHost=" << short_host << "(127.0.0.1)\n"
         << "SlurmctldPort=" << ports[0] << "\n"
         << "SlurmUser=root\nSlurmdUser=root\n"
         << "AuthType=auth/munge\nCredType=cred/munge\nAuthInfo=socket=" << sock << "\n"
         << "StateSaveLocation=" << d << "/state\n"
         << "SlurmdSpoolDir=" << d << "/spool-%n\n"
         << "SlurmctldPidFile=" << d << "/slurmctld.pid\n"
         << "SlurmdPidFile=" << d << "/slurmd-%n.pid\n"
         << "SlurmctldLogFile=" << d << "/slurmctld.log\n"
         << "SlurmdLogFile=" << d << "/slurmd-%n.log\n"
         << "ProctrackType=proctrack/pgid\nTaskPlugin=task/none\n"
         << "SelectType=select/cons_tres\nSelectTypeParameters=CR_CPU\n"
         << "SchedulerType=sched/builtin\nMpiDefault=none\nSwitchType=switch/none\n"
         << "JobAcctGatherType=jobacct_gather/none\nAccountingStorageType=accounting_storage/none\n"
         // The nodes' CPU counts are the config's (the host has fewer cores than three nodes claim).
         << "SlurmdParameters=config_overrides\nReturnToService=2\n"
         << "SlurmdTimeout=30\nInactiveLimit=0\nKillWait=5\nMinJobAge=600\n";
    for (int i = 1; i <= nodes; ++i) {
      conf << "NodeName=n" << i << " NodeHostname=localhost NodeAddr=127.0.0.1 Port=" << ports[i]
           << " CPUs=2\n";
    }
    conf << "PartitionName=gantry Nodes=n[1-" << nodes << "] Default=YES MaxTime=INFINITE State=UP\n";
    conf.close();
    std::filesystem::create_directories(dir / "state");

    Result<pid_t> ctld = spawn({find_program("slurmctld"), "-D"}, dir / "slurmctld.out");
    if (!ctld.ok()) return ctld.status();
    for (int i = 1; i <= nodes; ++i) {
      const std::string n = "n" + std::to_string(i);
      Result<pid_t> d_pid = spawn({find_program("slurmd"), "-D", "-N", n}, dir / ("slurmd-" + n + ".out"));
      if (!d_pid.ok()) return d_pid.status();
      slurmd_.push_back(d_pid.value());
    }
    const bool idle = wait_for(
        [&] {
          const std::map<std::string, std::string> s = node_states();
          int n_idle = 0;
          for (const auto& [node, state] : s) n_idle += state == "idle";
          return n_idle == nodes;
        },
        std::chrono::seconds(60));
    if (!idle) {
      return Status::error("the nodes did not all become idle: " + sh("sinfo -N").out + "\nslurmctld.log:\n" +
                           tail(dir / "slurmctld.log") + "\nslurmd-n1.log:\n" + tail(dir / "slurmd-n1.log"));
    }
    return Status();
  }

  // `cmd` under sh with this cluster's SLURM_CONF (and `env`, "K=V K2=V2"); stdout and stderr captured.
  Outcome sh(const std::string& cmd, const std::string& env = "") const {
    static int serial = 0;
    const std::string base = (dir_ / ("sh" + std::to_string(serial++))).string();
    const std::string full =
        "SLURM_CONF=" + conf_ + " " + env + " " + cmd + " >" + base + ".out 2>" + base + ".err </dev/null";
    const int status = std::system(full.c_str());
    Outcome r;
    r.code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
    r.out = slurp(base + ".out");
    r.err = slurp(base + ".err");
    return r;
  }

  // Each node's state as sinfo says it (idle, allocated, draining, down* ...).
  std::map<std::string, std::string> node_states() const {
    std::map<std::string, std::string> out;
    std::istringstream in(sh("sinfo -h -N -o '%N %T'").out);
    std::string node, state;
    while (in >> node >> state) out[node] = state;
    return out;
  }

  // A job's state (PENDING, RUNNING, COMPLETED, FAILED, CANCELLED ...) and its exit code, from scontrol.
  std::pair<std::string, int> job_state(const std::string& id) const {
    const std::string s = sh("scontrol show job " + id).out;
    std::smatch m;
    std::string state;
    int code = -1;
    if (std::regex_search(s, m, std::regex(R"(JobState=(\w+))"))) state = m[1];
    if (std::regex_search(s, m, std::regex(R"(\bExitCode=(\d+):)"))) code = std::stoi(m[1]);
    return {state, code};
  }

  // The live processes (not zombies) that run with this cluster's SLURM_CONF in their environment, whose
  // command line holds `what` ("" = any), other than this test process: what its jobs started.
  std::vector<pid_t> processes(const std::string& what = "") const {
    std::vector<pid_t> out;
    const std::string mark = "SLURM_CONF=" + conf_;
    for (const std::filesystem::directory_entry& e : std::filesystem::directory_iterator("/proc")) {
      const std::string name = e.path().filename().string();
      if (name.find_first_not_of("0123456789") != std::string::npos) continue;
      const pid_t pid = static_cast<pid_t>(std::stol(name));
      if (pid == ::getpid() || zombie(pid)) continue;
      std::string env = slurp(e.path().string() + "/environ");
      std::replace(env.begin(), env.end(), '\0', '\n');
      if (("\n" + env + "\n").find("\n" + mark + "\n") == std::string::npos) continue;
      std::string cmdline = slurp(e.path().string() + "/cmdline");
      std::replace(cmdline.begin(), cmdline.end(), '\0', ' ');
      if (what.empty() || cmdline.find(what) != std::string::npos) out.push_back(pid);
    }
    return out;
  }

  // Cancels every job, stops every daemon it started (by pid: SIGTERM, then SIGKILL after 5 s) and kills
  // whatever still runs with this cluster's SLURM_CONF. Safe to call twice.
  void stop() {
    if (daemons_.empty()) return;
    const std::string jobs = sh("squeue -h -o %i").out;
    if (jobs.find_first_not_of(" \n") != std::string::npos) {
      std::string ids = jobs;
      std::replace(ids.begin(), ids.end(), '\n', ' ');
      sh("scancel " + ids);
      wait_for([&] { return sh("squeue -h -o %i").out.find_first_not_of(" \n") == std::string::npos; },
               std::chrono::seconds(15));
    }
    // The slurmd first, munged last: slurmctld and the slurmd still authenticate while they stop.
    for (auto it = daemons_.rbegin(); it != daemons_.rend(); ++it) ::kill(*it, SIGTERM);
    for (auto it = daemons_.rbegin(); it != daemons_.rend(); ++it) {
      const pid_t pid = *it;
      int status = 0;
      if (!wait_for([&] { return ::waitpid(pid, &status, WNOHANG) == pid; }, std::chrono::seconds(5))) {
        ::kill(pid, SIGKILL);
        ::waitpid(pid, &status, 0);
      }
    }
    daemons_.clear();
    slurmd_.clear();
    for (pid_t p : processes()) ::kill(p, SIGKILL);
    wait_for([&] { return processes().empty(); }, std::chrono::seconds(5));
  }

  // Kills node `k`'s slurmd (n1 is 1) with SIGKILL, as a crashed daemon: what it started (slurmstepd, the
  // job's tasks) runs on. False when there is no such daemon.
  bool kill_slurmd(int k) {
    if (k < 1 || static_cast<size_t>(k) > slurmd_.size() || slurmd_[static_cast<size_t>(k) - 1] <= 0)
      return false;
    const pid_t pid = slurmd_[static_cast<size_t>(k) - 1];
    ::kill(pid, SIGKILL);
    int status = 0;
    ::waitpid(pid, &status, 0);
    daemons_.erase(std::find(daemons_.begin(), daemons_.end(), pid));
    slurmd_[static_cast<size_t>(k) - 1] = 0;
    return true;
  }

  const std::string& conf() const { return conf_; }
  const std::filesystem::path& dir() const { return dir_; }

  static std::string find_program(const std::string& name) {
    std::string path = std::getenv("PATH") != nullptr ? std::getenv("PATH") : "";
    path += ":/usr/sbin:/sbin:/usr/bin:/bin";
    std::istringstream in(path);
    std::string d;
    while (std::getline(in, d, ':')) {
      const std::string p = d + "/" + name;
      if (!d.empty() && ::access(p.c_str(), X_OK) == 0) return p;
    }
    return "";
  }

  static std::string tail(const std::filesystem::path& p) {
    const std::string t = slurp(p.string());
    return t.size() > 3000 ? t.substr(t.size() - 3000) : t;
  }

  template <class F>
  static bool wait_for(F pred, std::chrono::milliseconds limit) {
    const auto deadline = std::chrono::steady_clock::now() + limit;
    while (std::chrono::steady_clock::now() < deadline) {
      if (pred()) return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    return pred();
  }

 private:
  static bool zombie(pid_t pid) {
    const std::string stat = slurp("/proc/" + std::to_string(pid) + "/stat");
    const size_t close = stat.rfind(')');
    return close == std::string::npos || close + 2 >= stat.size() || stat[close + 2] == 'Z';
  }

  // `n` distinct free TCP ports on loopback: all bound at once (so no two are the same), then released.
  static std::vector<int> free_ports(int n) {
    std::vector<int> fds, ports;
    for (int i = 0; i < n; ++i) {
      const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
      sockaddr_in a{};
      a.sin_family = AF_INET;
      a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
      socklen_t len = sizeof a;
      if (fd < 0 || ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 ||
          ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) != 0) {
        if (fd >= 0) ::close(fd);
        break;
      }
      fds.push_back(fd);
      ports.push_back(ntohs(a.sin_port));
    }
    for (int fd : fds) ::close(fd);
    return ports;
  }

  // A daemon in the foreground, our child, with this cluster's SLURM_CONF; its output to `log`.
  Result<pid_t> spawn(std::vector<std::string> args, const std::filesystem::path& log) {
    if (args[0].empty()) return Status::error("a Slurm or munge program is missing");
    std::vector<char*> argv;
    for (std::string& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    const std::string log_s = log.string(), conf = conf_;
    const pid_t pid = ::fork();
    if (pid < 0) return Status::error("fork failed");
    if (pid == 0) {
      ::prctl(PR_SET_PDEATHSIG, SIGKILL);
      const int in = ::open("/dev/null", O_RDONLY);
      const int out = ::open(log_s.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
      if (in < 0 || out < 0) ::_exit(126);
      ::dup2(in, 0);
      ::dup2(out, 1);
      ::dup2(out, 2);
      ::setenv("SLURM_CONF", conf.c_str(), 1);
      ::execv(argv[0], argv.data());
      ::_exit(127);
    }
    daemons_.push_back(pid);
    return pid;
  }

  std::filesystem::path dir_;
  std::string conf_;
  std::vector<pid_t> daemons_;  // in start order: munged, slurmctld, the slurmd
  std::vector<pid_t> slurmd_;   // n1's, n2's ...; 0 once killed
};

}  // namespace gantry::testing_support
