#include "engine/cluster/node_health.h"

#include <dlfcn.h>
#include <fcntl.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <map>

namespace gantry {
namespace {

std::string gib(uint64_t bytes) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.2f GiB", static_cast<double>(bytes) / (1024.0 * 1024.0 * 1024.0));
  return buf;
}

}  // namespace

std::string_view health_state_name(HealthState s) {
  switch (s) {
    case HealthState::kUnknown:
      return "unknown";
    case HealthState::kOk:
      return "ok";
    case HealthState::kUnhealthy:
      return "unhealthy";
  }
  return "unknown";
}

HealthReport health_combine(std::vector<HealthCheck> checks) {
  HealthReport r;
  bool any_ok = false;
  for (const HealthCheck& c : checks) {
    if (c.state == HealthState::kUnhealthy) {
      r.state = HealthState::kUnhealthy;
      r.reason += (r.reason.empty() ? "" : "; ") + c.name + ": " + c.detail;
    }
    any_ok = any_ok || c.state == HealthState::kOk;
  }
  if (r.state != HealthState::kUnhealthy && any_ok) r.state = HealthState::kOk;
  r.checks = std::move(checks);
  return r;
}

nlohmann::json health_report_json(const HealthReport& r) {
  nlohmann::json checks = nlohmann::json::array();
  for (const HealthCheck& c : r.checks)
    checks.push_back({{"name", c.name}, {"state", health_state_name(c.state)}, {"detail", c.detail}});
  return {{"state", health_state_name(r.state)}, {"reason", r.reason}, {"checks", checks}};
}

HealthCheck disk_verdict(const std::string& path, uint64_t free_bytes, uint64_t min_free_bytes) {
  HealthCheck c{.name = "disk"};
  const std::string seen = path + " has " + gib(free_bytes) + " free";
  if (free_bytes < min_free_bytes) {
    c.state = HealthState::kUnhealthy;
    c.detail = seen + ", below the threshold of " + gib(min_free_bytes) +
               " (agent --min-free-disk-gb): checkpoints there may fail";
  } else {
    c.state = HealthState::kOk;
    c.detail = seen + " (threshold " + gib(min_free_bytes) + ")";
  }
  return c;
}

HealthCheck disk_check(const std::string& path, uint64_t min_free_bytes) {
  struct statvfs st {};
  if (::statvfs(path.c_str(), &st) != 0) {
    return {.name = "disk",
            .state = HealthState::kUnknown,
            .detail = "statvfs " + path + ": " + std::strerror(errno)};
  }
  const uint64_t free_bytes = static_cast<uint64_t>(st.f_bavail) * static_cast<uint64_t>(st.f_frsize);
  return disk_verdict(path, free_bytes, min_free_bytes);
}

std::optional<XidEvent> parse_xid_line(std::string_view line) {
  static constexpr std::string_view kTag = "NVRM: Xid";
  const size_t at = line.find(kTag);
  if (at == std::string_view::npos) return std::nullopt;
  std::string_view rest = line.substr(at + kTag.size());
  while (!rest.empty() && rest.front() == ' ') rest.remove_prefix(1);
  XidEvent e;
  // "(PCI:0000:3b:00): 79, ..." — the device in parentheses, then ": ", then the code.
  if (!rest.empty() && rest.front() == '(') {
    const size_t close = rest.find(')');
    if (close == std::string_view::npos) return std::nullopt;
    std::string_view dev = rest.substr(1, close - 1);
    if (dev.rfind("PCI:", 0) == 0) dev.remove_prefix(4);
    e.pci = std::string(dev);
    rest.remove_prefix(close + 1);
  }
  while (!rest.empty() && (rest.front() == ':' || rest.front() == ' ')) rest.remove_prefix(1);
  size_t digits = 0;
  while (digits < rest.size() && digits < 6 && rest[digits] >= '0' && rest[digits] <= '9') ++digits;
  if (digits == 0 || (digits < rest.size() && rest[digits] >= '0' && rest[digits] <= '9'))
    return std::nullopt;
  e.code = std::stoi(std::string(rest.substr(0, digits)));
  rest.remove_prefix(digits);
  while (!rest.empty() && (rest.front() == ',' || rest.front() == ' ')) rest.remove_prefix(1);
  while (!rest.empty() && (rest.back() == '\n' || rest.back() == ' ')) rest.remove_suffix(1);
  e.text = std::string(rest);
  return e;
}

bool xid_is_fatal(int code) {
  switch (code) {
    case 48:  // double-bit ECC error
    case 63:  // ECC page retirement or row remapping recorded
    case 64:  // ECC page retirement or row remapping failure
    case 74:  // NVLink error
    case 79:  // GPU has fallen off the bus
    case 92:  // high single-bit ECC error rate
    case 94:  // contained ECC error
    case 95:  // uncontained ECC error
      return true;
    default:
      return false;
  }
}

// NVML's few entry points, resolved from the library at run time: a node without the driver has no
// libnvidia-ml, and the agent must run there (CPU slots) saying "not present" rather than failing to load.
struct NodeHealth::Nvml {
  using Device = void*;
  using Ret = int;  // nvmlReturn_t: 0 = NVML_SUCCESS
  static constexpr Ret kSuccess = 0;
  void* lib = nullptr;
  std::string error;  // why NVML cannot be used ("" = it can)
  Ret (*init)() = nullptr;
  Ret (*shutdown)() = nullptr;
  const char* (*error_string)(Ret) = nullptr;
  Ret (*count)(unsigned*) = nullptr;
  Ret (*handle)(unsigned, Device*) = nullptr;
  // (device, NVML_MEMORY_ERROR_TYPE_UNCORRECTED = 1, NVML_VOLATILE_ECC = 0, count)
  Ret (*total_ecc)(Device, int, int, unsigned long long*) = nullptr;
  Ret (*retired_pending)(Device, int*) = nullptr;  // nvmlEnableState_t
  Ret (*remapped_rows)(Device, unsigned*, unsigned*, unsigned*,
                       unsigned*) = nullptr;                // corr, unc, pending, failed
  std::map<unsigned, unsigned long long> last_uncorrected;  // per GPU index, from the previous check

  explicit Nvml(const std::string& name) {
    lib = ::dlopen(name.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (lib == nullptr) {
      error = "not present (" + name + " cannot be loaded: no NVIDIA driver on this node)";
      return;
    }
    auto sym = [&](auto& fn, const char* symbol) {
      fn = reinterpret_cast<std::remove_reference_t<decltype(fn)>>(::dlsym(lib, symbol));
      if (fn == nullptr && error.empty()) error = std::string(name) + " has no " + symbol;
    };
    sym(init, "nvmlInit_v2");
    sym(shutdown, "nvmlShutdown");
    sym(error_string, "nvmlErrorString");
    sym(count, "nvmlDeviceGetCount_v2");
    sym(handle, "nvmlDeviceGetHandleByIndex_v2");
    sym(total_ecc, "nvmlDeviceGetTotalEccErrors");
    sym(retired_pending, "nvmlDeviceGetRetiredPagesPendingStatus");
    sym(remapped_rows, "nvmlDeviceGetRemappedRows");
    if (!error.empty()) return;
    if (Ret r = init(); r != kSuccess) error = std::string("nvmlInit: ") + error_string(r);
  }
  ~Nvml() {
    if (lib != nullptr && error.empty() && shutdown != nullptr) shutdown();
    if (lib != nullptr) ::dlclose(lib);
  }
};

NodeHealth::NodeHealth(NodeHealthOptions options) : opt_(std::move(options)) {}

NodeHealth::~NodeHealth() {
  if (kmsg_fd_ >= 0) ::close(kmsg_fd_);
}

HealthCheck NodeHealth::nvml_check() {
  HealthCheck c{.name = "nvml"};
  if (opt_.nvml_library.empty()) {
    c.detail = "not checked (no library configured)";
    return c;
  }
  if (!nvml_) nvml_ = std::make_unique<Nvml>(opt_.nvml_library);
  Nvml& n = *nvml_;
  if (!n.error.empty()) {
    c.detail = n.error;
    return c;
  }
  unsigned gpus = 0;
  if (Nvml::Ret r = n.count(&gpus); r != Nvml::kSuccess) {
    c.detail = std::string("nvmlDeviceGetCount: ") + n.error_string(r);
    return c;
  }
  std::string bad, seen;
  for (unsigned i = 0; i < gpus; ++i) {
    Nvml::Device d = nullptr;
    if (n.handle(i, &d) != Nvml::kSuccess) continue;
    const std::string gpu = "GPU " + std::to_string(i);
    unsigned long long unc = 0;
    if (n.total_ecc(d, 1, 0, &unc) == Nvml::kSuccess) {  // ECC off or unsupported: nothing to say
      auto it = n.last_uncorrected.find(i);
      if (it != n.last_uncorrected.end() && unc > it->second) {
        bad += (bad.empty() ? "" : ", ") + gpu + " uncorrectable ECC errors rose from " +
               std::to_string(it->second) + " to " + std::to_string(unc);
      }
      n.last_uncorrected[i] = unc;
      seen += (seen.empty() ? "" : ", ") + gpu + " " + std::to_string(unc) + " uncorrectable ECC";
    }
    int pending = 0;
    if (n.retired_pending(d, &pending) == Nvml::kSuccess && pending != 0)
      bad += (bad.empty() ? "" : ", ") + gpu + " has pages pending retirement (needs a reset)";
    unsigned corr = 0, unc_rows = 0, rows_pending = 0, failed = 0;
    if (n.remapped_rows(d, &corr, &unc_rows, &rows_pending, &failed) == Nvml::kSuccess) {
      if (rows_pending != 0)
        bad += (bad.empty() ? "" : ", ") + gpu + " has row remapping pending (needs a reset)";
      if (failed != 0) bad += (bad.empty() ? "" : ", ") + gpu + " had a row remapping failure";
    }
  }
  c.state = bad.empty() ? HealthState::kOk : HealthState::kUnhealthy;
  c.detail = bad.empty() ? std::to_string(gpus) + " GPUs" + (seen.empty() ? "" : ": " + seen) : bad;
  return c;
}

HealthCheck NodeHealth::xid_check() {
  HealthCheck c{.name = "xid"};
  if (opt_.kmsg_path.empty()) {
    c.detail = "not checked (no kernel log configured)";
    return c;
  }
  if (!kmsg_tried_) {
    kmsg_tried_ = true;
    kmsg_fd_ = ::open(opt_.kmsg_path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
    if (kmsg_fd_ < 0) {
      kmsg_error_ = opt_.kmsg_path + " is not readable here (" + std::strerror(errno) + ")";
    } else {
      // Only what happens from now: an Xid before the agent started may predate the GPU's last reset.
      ::lseek(kmsg_fd_, 0, SEEK_END);
    }
  }
  if (kmsg_fd_ < 0) {
    c.detail = kmsg_error_;
    return c;
  }
  // /dev/kmsg gives one record a read (EAGAIN when none is left, EPIPE when records were overwritten
  // before we read them); a plain file gives lines, split here.
  char buf[8192];
  std::string tail;
  for (int reads = 0; reads < 4096; ++reads) {
    const ssize_t got = ::read(kmsg_fd_, buf, sizeof buf);
    if (got < 0 && errno == EPIPE) continue;
    if (got <= 0) break;
    tail.append(buf, static_cast<size_t>(got));
    size_t start = 0;
    for (size_t nl; (nl = tail.find('\n', start)) != std::string::npos; start = nl + 1) {
      std::optional<XidEvent> x = parse_xid_line(std::string_view(tail).substr(start, nl - start));
      if (x && xid_is_fatal(x->code)) {
        if (fatal_xids_.size() >= 16) fatal_xids_.erase(fatal_xids_.begin());
        fatal_xids_.push_back(std::move(*x));
      }
    }
    tail.erase(0, start);
  }
  if (fatal_xids_.empty()) {
    c.state = HealthState::kOk;
    c.detail = "no fatal Xid in " + opt_.kmsg_path + " since the agent started";
    return c;
  }
  const XidEvent& x = fatal_xids_.back();
  c.state = HealthState::kUnhealthy;
  c.detail = "fatal Xid " + std::to_string(x.code) + " on " + (x.pci.empty() ? "a GPU" : x.pci) + ": " +
             x.text +
             (fatal_xids_.size() > 1 ? " (" + std::to_string(fatal_xids_.size()) + " fatal Xids seen)" : "");
  return c;
}

HealthReport NodeHealth::check() {
  std::vector<HealthCheck> checks;
  if (!opt_.disk_path.empty() && opt_.min_free_disk_bytes > 0)
    checks.push_back(disk_check(opt_.disk_path, opt_.min_free_disk_bytes));
  checks.push_back(nvml_check());
  checks.push_back(xid_check());
  return health_combine(std::move(checks));
}

}  // namespace gantry
