#include "engine/core/worker/worker_env.h"

#include <cerrno>
#include <cstdlib>
#include <limits>
#include <string_view>

#include "engine/core/worker/slurm_nodelist.h"

namespace gantry {
namespace {

// A whole decimal integer in [lo, hi]: "4" yes; "", "4x", " 4", "1e3" no (a typo must not become a rank).
bool parse_int(const std::string& s, long long lo, long long hi, long long* out) {
  if (s.empty() || s.size() > 19) return false;
  size_t i = s[0] == '-' ? 1 : 0;
  if (i == s.size()) return false;
  for (size_t k = i; k < s.size(); ++k) {
    if (s[k] < '0' || s[k] > '9') return false;
  }
  errno = 0;
  char* end = nullptr;
  long long v = std::strtoll(s.c_str(), &end, 10);
  if (errno != 0 || *end != '\0' || v < lo || v > hi) return false;
  *out = v;
  return true;
}

class Reader {
 public:
  explicit Reader(const EnvLookup& getenv) : getenv_(getenv) {}

  bool has(const char* name) const {
    const char* v = getenv_(name);
    return v != nullptr;
  }

  // The variable as an integer in [lo, hi]; `why` says what it is for when it is missing.
  Result<int> integer(const char* name, long long lo, long long hi, const std::string& why) const {
    const char* v = getenv_(name);
    if (v == nullptr) return Status::error(std::string(name) + " is not set: " + why);
    long long x = 0;
    if (!parse_int(v, lo, hi, &x)) {
      return Status::error(std::string(name) + " = '" + v + "': expected an integer in " +
                           std::to_string(lo) + ".." + std::to_string(hi));
    }
    return static_cast<int>(x);
  }

 private:
  const EnvLookup& getenv_;
};

constexpr long long kMaxRanks = 1 << 24;  // far past any cluster; keeps the arithmetic in int

}  // namespace

Result<WorkerEnv> worker_env_read(const EnvLookup& getenv) {
  Reader env(getenv);
  WorkerEnv w;
  if (env.has("RANK") || env.has("WORLD_SIZE")) {
    w.source = "torchrun";
    const std::string why =
        "torchrun and gantry-engine run set RANK, WORLD_SIZE, LOCAL_RANK and LOCAL_WORLD_SIZE "
        "together";
    Result<int> world = env.integer("WORLD_SIZE", 1, kMaxRanks, why);
    if (!world.ok()) return world.status();
    Result<int> rank = env.integer("RANK", 0, world.value() - 1, why);
    if (!rank.ok()) return rank.status();
    Result<int> local_world = env.integer("LOCAL_WORLD_SIZE", 1, world.value(), why);
    if (!local_world.ok()) return local_world.status();
    Result<int> local_rank = env.integer("LOCAL_RANK", 0, local_world.value() - 1, why);
    if (!local_rank.ok()) return local_rank.status();
    w.world = world.value();
    w.rank = rank.value();
    w.local_world = local_world.value();
    w.local_rank = local_rank.value();
  } else if (env.has("SLURM_PROCID")) {
    w.source = "slurm";
    const std::string why = "srun sets SLURM_PROCID, SLURM_NTASKS and SLURM_LOCALID for every task";
    Result<int> world = env.integer("SLURM_NTASKS", 1, kMaxRanks, why);
    if (!world.ok()) return world.status();
    Result<int> rank = env.integer("SLURM_PROCID", 0, world.value() - 1, why);
    if (!rank.ok()) return rank.status();
    Result<int> local_rank = env.integer("SLURM_LOCALID", 0, world.value() - 1, why);
    if (!local_rank.ok()) return local_rank.status();
    w.world = world.value();
    w.rank = rank.value();
    w.local_rank = local_rank.value();
    // Only a plain count is understood: Slurm writes uneven layouts as "2(x3),1", which says nothing
    // about this node without SLURM_NODEID arithmetic the worker does not need.
    long long per_node = 0;
    const char* ntpn = getenv("SLURM_NTASKS_PER_NODE");
    if (ntpn != nullptr && parse_int(ntpn, 1, w.world, &per_node) && per_node > w.local_rank) {
      w.local_world = static_cast<int>(per_node);
    }
  } else {
    return Status::error(
        "no rank in the environment: RANK and WORLD_SIZE are not set (torchrun, gantry-engine run) and "
        "neither is "
        "SLURM_PROCID (srun). Start workers with `gantry-engine run --nproc N`, torchrun or srun, or set "
        "RANK, "
        "WORLD_SIZE, LOCAL_RANK and LOCAL_WORLD_SIZE yourself");
  }

  if (env.has("GANTRY_STORE_FD")) {
    Result<int> fd = env.integer("GANTRY_STORE_FD", 0, std::numeric_limits<int>::max(),
                                 "gantry-engine run sets it to the worker's inherited socket");
    if (!fd.ok()) return fd.status();
    w.store_fd = fd.value();
  }
  if (const char* at = getenv(kRendezvousVariable); at != nullptr) {
    if (w.store_fd < 0) {
      return Status::error(std::string(kRendezvousVariable) +
                           " is set but GANTRY_STORE_FD is not: a node agent sets both (the frames go to the "
                           "agent, the store is the coordinator's); external launchers use --rendezvous");
    }
    Result<HostPort> hp = host_port_parse(at, kRendezvousVariable);
    if (!hp.ok()) return hp.status();
    w.rendezvous = at;
  }
  if (const char* addr = getenv("MASTER_ADDR"); addr != nullptr) {
    if (*addr == '\0')
      return Status::error("MASTER_ADDR is set but empty: expected the host name or address of rank 0");
    w.master_addr = addr;
  }
  if (w.master_addr.empty() && std::string_view(w.source) == "slurm") {
    // srun starts rank 0 on the first host of the job's node list.
    const char* list = getenv("SLURM_JOB_NODELIST");
    if (list == nullptr) list = getenv("SLURM_NODELIST");
    if (list != nullptr) {
      Result<std::string> first = slurm_first_host(list);
      if (!first.ok()) return first.status();
      w.master_addr = first.value();
    }
  }
  if (env.has("MASTER_PORT")) {
    Result<int> port = env.integer("MASTER_PORT", 1, 65535, "");
    if (!port.ok()) return port.status();
    w.master_port = port.value();
  }
  return w;
}

Result<WorkerEnv> worker_env_read() {
  return worker_env_read([](const char* name) -> const char* { return std::getenv(name); });
}

Result<HostPort> host_port_parse(const std::string& text, const std::string& what) {
  auto bad = [&](const std::string& why) {
    return Status::error(what + " '" + text + "': " + why +
                         " (expected HOST:PORT, e.g. 10.0.0.1:29500 or [::1]:29500)");
  };
  HostPort hp;
  std::string port;
  if (!text.empty() && text[0] == '[') {
    size_t close = text.find(']');
    if (close == std::string::npos) return bad("no closing ']' after the IPv6 address");
    hp.host = text.substr(1, close - 1);
    if (close + 1 >= text.size() || text[close + 1] != ':') return bad("no ':PORT' after the address");
    port = text.substr(close + 2);
  } else {
    size_t colon = text.rfind(':');
    if (colon == std::string::npos) return bad("no port");
    hp.host = text.substr(0, colon);
    if (hp.host.find(':') != std::string::npos) return bad("an IPv6 address must be in brackets");
    port = text.substr(colon + 1);
  }
  if (hp.host.empty()) return bad("no host");
  long long p = 0;
  if (!parse_int(port, 1, 65535, &p)) return bad("port '" + port + "' is not in 1..65535");
  hp.port = static_cast<int>(p);
  return hp;
}

Result<WorkerFault> worker_fault_parse(const std::string& text, int rank) {
  WorkerFault mine;
  size_t pos = 0;
  while (pos <= text.size() && !text.empty()) {
    size_t end = text.find(',', pos);
    if (end == std::string::npos) end = text.size();
    const std::string item = text.substr(pos, end - pos);
    pos = end + 1;
    auto bad = [&](const std::string& why) {
      return Status::error(
          std::string(kWorkerFaultVariable) + " item '" + item + "': " + why +
          " (expected <rank>:exit_at_start, <rank>:hang_at_start, <rank>:exit_after_step:<k> or "
          "<rank>:slow_forward:<ms>, <rank>:nan_grad:<k>, <rank>:kill_in_checkpoint:<stage>:<k>, "
          "<rank>:hold_checkpoint:<k> or <rank>:flip_bit:<k>)");
    };
    size_t colon = item.find(':');
    long long r = 0;
    if (colon == std::string::npos || !parse_int(item.substr(0, colon), 0, kMaxRanks, &r))
      return bad("no rank");
    const std::string fault = item.substr(colon + 1);
    WorkerFault f;
    if (fault == "exit_at_start") {
      f.kind = WorkerFault::exit_at_start;
    } else if (fault == "hang_at_start") {
      f.kind = WorkerFault::hang_at_start;
    } else if (fault.rfind("exit_after_step:", 0) == 0) {
      long long k = 0;
      if (!parse_int(fault.substr(16), 1, std::numeric_limits<int64_t>::max(), &k))
        return bad("step must be >= 1");
      f.kind = WorkerFault::exit_after_step;
      f.step = k;
    } else if (fault.rfind("slow_forward:", 0) == 0) {
      long long ms = 0;
      if (!parse_int(fault.substr(13), 1, 60000, &ms)) return bad("the delay must be 1..60000 ms");
      f.kind = WorkerFault::slow_forward;
      f.delay_ms = ms;
    } else if (fault.rfind("nan_grad:", 0) == 0) {
      long long k = 0;
      if (!parse_int(fault.substr(9), 1, std::numeric_limits<int64_t>::max(), &k))
        return bad("step must be >= 1");
      f.kind = WorkerFault::nan_grad;
      f.step = k;
    } else if (fault.rfind("kill_in_checkpoint:", 0) == 0) {
      const std::string rest = fault.substr(19);
      const size_t c2 = rest.find(':');
      const std::string stage = rest.substr(0, c2);
      bool known = false;
      for (CheckpointStage st : {CheckpointStage::kCopy, CheckpointStage::kWrite,
                                 CheckpointStage::kBeforeCommit, CheckpointStage::kAfterCommit}) {
        if (stage == checkpoint_stage_name(st)) {
          f.stage = st;
          known = true;
        }
      }
      if (!known) return bad("the stage must be copy, write, before_commit or after_commit");
      long long k = 0;
      if (c2 == std::string::npos ||
          !parse_int(rest.substr(c2 + 1), 1, std::numeric_limits<int64_t>::max(), &k))
        return bad("step must be >= 1");
      f.kind = WorkerFault::kill_in_checkpoint;
      f.step = k;
    } else if (fault.rfind("hold_checkpoint:", 0) == 0) {
      long long k = 0;
      if (!parse_int(fault.substr(16), 1, std::numeric_limits<int64_t>::max(), &k))
        return bad("step must be >= 1");
      f.kind = WorkerFault::hold_checkpoint;
      f.step = k;
    } else if (fault.rfind("flip_bit:", 0) == 0) {
      long long k = 0;
      if (!parse_int(fault.substr(9), 1, std::numeric_limits<int64_t>::max(), &k))
        return bad("step must be >= 1");
      f.kind = WorkerFault::flip_bit;
      f.step = k;
    } else {
      return bad("unknown fault '" + fault + "'");
    }
    if (r == rank) mine = f;
    if (end == text.size()) break;
  }
  return mine;
}

}  // namespace gantry
