#include "engine/cluster/device_sampler.h"

#include <dlfcn.h>
#include <sys/statvfs.h>

#include <cstdlib>
#include <fstream>
#include <sstream>
#include <type_traits>

namespace gantry {
namespace {

std::optional<std::string> read_text(const std::string& path) {
  std::ifstream in(path);
  if (!in) return std::nullopt;
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// The unsigned decimal numbers of one line, in order.
std::vector<uint64_t> numbers_of(std::string_view line) {
  std::vector<uint64_t> v;
  size_t i = 0;
  while (i < line.size()) {
    if (line[i] < '0' || line[i] > '9') {
      ++i;
      continue;
    }
    uint64_t x = 0;
    while (i < line.size() && line[i] >= '0' && line[i] <= '9')
      x = x * 10 + static_cast<uint64_t>(line[i++] - '0');
    v.push_back(x);
  }
  return v;
}

}  // namespace

std::optional<CpuTimes> parse_proc_stat(std::string_view text) {
  // "cpu  user nice system idle iowait irq softirq steal guest guest_nice"; guest time is inside user.
  if (text.substr(0, 4) != "cpu ") return std::nullopt;
  const std::vector<uint64_t> v = numbers_of(text.substr(4, text.find('\n') - 4));
  if (v.size() < 4) return std::nullopt;
  CpuTimes t;
  for (size_t i = 0; i < v.size() && i < 8; ++i) t.total += v[i];
  const uint64_t idle = v[3] + (v.size() > 4 ? v[4] : 0);  // idle + iowait
  t.busy = t.total - idle;
  return t;
}

std::optional<uint64_t> parse_meminfo_used(std::string_view text) {
  std::optional<uint64_t> total, available;
  size_t pos = 0;
  while (pos < text.size()) {
    const size_t nl = std::min(text.find('\n', pos), text.size());
    const std::string_view line = text.substr(pos, nl - pos);
    const auto kib = [&line] {
      const std::vector<uint64_t> v = numbers_of(line);
      return v.empty() ? std::optional<uint64_t>() : std::optional<uint64_t>(v[0] * 1024);
    };
    if (line.substr(0, 9) == "MemTotal:") total = kib();
    if (line.substr(0, 13) == "MemAvailable:") available = kib();
    pos = nl + 1;
  }
  if (!total || !available || *available > *total) return std::nullopt;
  return *total - *available;
}

std::optional<NetBytes> parse_net_dev(std::string_view text) {
  // Two header lines, then "  eth0: rx_bytes rx_packets ... (8 receive fields) tx_bytes ...".
  NetBytes b;
  bool any = false;
  size_t pos = 0;
  while (pos < text.size()) {
    const size_t nl = std::min(text.find('\n', pos), text.size());
    const std::string_view line = text.substr(pos, nl - pos);
    pos = nl + 1;
    const size_t colon = line.find(':');
    if (colon == std::string_view::npos) continue;
    std::string_view name = line.substr(0, colon);
    while (!name.empty() && name.front() == ' ') name.remove_prefix(1);
    const std::vector<uint64_t> v = numbers_of(line.substr(colon + 1));
    if (v.size() < 9) continue;
    any = true;
    if (name == "lo") continue;
    b.rx += v[0];
    b.tx += v[8];
  }
  if (!any) return std::nullopt;
  return b;
}

// NVML's C API, opened at run time. Handles and enums as the header declares them (nvml.h), not included:
// the build does not need the driver's headers.
struct DeviceSampler::Nvml {
  using Ret = int;  // nvmlReturn_t: 0 = NVML_SUCCESS
  using Device = void*;
  struct Utilization {
    unsigned gpu, memory;
  };
  struct Memory {
    unsigned long long total, free, used;
  };
  struct PciInfo {  // nvmlPciInfo_t (v2 and v3 share it)
    char bus_id_legacy[16];
    unsigned domain, bus, device, pci_device_id, pci_subsystem_id;
    char bus_id[32];
  };
  void* lib = nullptr;
  std::string error;
  Ret (*init)() = nullptr;
  Ret (*shutdown)() = nullptr;
  const char* (*error_string)(Ret) = nullptr;
  Ret (*count)(unsigned*) = nullptr;
  Ret (*handle)(unsigned, Device*) = nullptr;
  Ret (*utilization)(Device, Utilization*) = nullptr;
  Ret (*memory)(Device, Memory*) = nullptr;
  Ret (*clock)(Device, int, unsigned*) = nullptr;        // NVML_CLOCK_SM = 1, MHz
  Ret (*power)(Device, unsigned*) = nullptr;             // milliwatts
  Ret (*temperature)(Device, int, unsigned*) = nullptr;  // NVML_TEMPERATURE_GPU = 0
  Ret (*throttle)(Device, unsigned long long*) = nullptr;
  Ret (*ecc)(Device, int, int, unsigned long long*) = nullptr;  // uncorrected = 1, volatile = 0
  Ret (*pci)(Device, PciInfo*) = nullptr;

  explicit Nvml(const std::string& name) {
    lib = ::dlopen(name.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (lib == nullptr) {
      const char* e = ::dlerror();
      error = e ? e : name + ": cannot open";
      return;
    }
    auto sym = [this](auto& fn, const char* symbol) {
      fn = reinterpret_cast<std::remove_reference_t<decltype(fn)>>(::dlsym(lib, symbol));
      if (fn == nullptr && error.empty()) error = std::string("NVML has no ") + symbol;
    };
    sym(init, "nvmlInit_v2");
    sym(shutdown, "nvmlShutdown");
    sym(error_string, "nvmlErrorString");
    sym(count, "nvmlDeviceGetCount_v2");
    sym(handle, "nvmlDeviceGetHandleByIndex_v2");
    if (!error.empty()) return;
    // Optional readings: a library without one leaves that reading unknown.
    utilization = reinterpret_cast<decltype(utilization)>(::dlsym(lib, "nvmlDeviceGetUtilizationRates"));
    memory = reinterpret_cast<decltype(memory)>(::dlsym(lib, "nvmlDeviceGetMemoryInfo"));
    clock = reinterpret_cast<decltype(clock)>(::dlsym(lib, "nvmlDeviceGetClockInfo"));
    power = reinterpret_cast<decltype(power)>(::dlsym(lib, "nvmlDeviceGetPowerUsage"));
    temperature = reinterpret_cast<decltype(temperature)>(::dlsym(lib, "nvmlDeviceGetTemperature"));
    throttle = reinterpret_cast<decltype(throttle)>(::dlsym(lib, "nvmlDeviceGetCurrentClocksEventReasons"));
    if (throttle == nullptr)
      throttle =
          reinterpret_cast<decltype(throttle)>(::dlsym(lib, "nvmlDeviceGetCurrentClocksThrottleReasons"));
    ecc = reinterpret_cast<decltype(ecc)>(::dlsym(lib, "nvmlDeviceGetTotalEccErrors"));
    pci = reinterpret_cast<decltype(pci)>(::dlsym(lib, "nvmlDeviceGetPciInfo_v3"));
    if (pci == nullptr) pci = reinterpret_cast<decltype(pci)>(::dlsym(lib, "nvmlDeviceGetPciInfo_v2"));
    if (Ret r = init(); r != 0) error = std::string("nvmlInit: ") + error_string(r);
    initialised = error.empty();
  }
  ~Nvml() {
    if (initialised) shutdown();
    if (lib != nullptr) ::dlclose(lib);
  }
  bool initialised = false;
};

DeviceSampler::DeviceSampler(DeviceSamplerOptions options) : opt_(std::move(options)) {}
DeviceSampler::~DeviceSampler() = default;

void DeviceSampler::sample_gpus(double now, std::vector<DeviceSampleRecord>* out) {
  if (opt_.nvml_library.empty()) {
    nvml_status_ = "no NVML library configured";
    return;
  }
  if (!nvml_) nvml_ = std::make_unique<Nvml>(opt_.nvml_library);
  Nvml& n = *nvml_;
  if (!n.error.empty()) {
    nvml_status_ = n.error;
    return;
  }
  unsigned count = 0;
  if (Nvml::Ret r = n.count(&count); r != 0) {
    nvml_status_ = std::string("nvmlDeviceGetCount: ") + n.error_string(r);
    return;
  }
  nvml_status_ = std::to_string(count) + " GPUs";
  if (!xids_) xids_ = std::make_unique<XidCounter>(opt_.kmsg_path);
  xids_->poll();
  for (unsigned i = 0; i < count; ++i) {
    Nvml::Device d = nullptr;
    if (n.handle(i, &d) != 0) continue;
    const auto put = [&](DeviceMetric m, double v) {
      out->push_back({.host = opt_.host,
                      .device = static_cast<int32_t>(i),
                      .time_unix_s = now,
                      .metric = m,
                      .value = v});
    };
    if (Nvml::Utilization u{}; n.utilization && n.utilization(d, &u) == 0)
      put(DeviceMetric::kGpuUtilisation, u.gpu / 100.0);
    if (Nvml::Memory m{}; n.memory && n.memory(d, &m) == 0)
      put(DeviceMetric::kGpuMemoryUsed, static_cast<double>(m.used));
    if (unsigned mhz = 0; n.clock && n.clock(d, 1, &mhz) == 0) put(DeviceMetric::kGpuSmClock, mhz * 1e6);
    if (unsigned mw = 0; n.power && n.power(d, &mw) == 0) put(DeviceMetric::kGpuPower, mw / 1000.0);
    if (unsigned c = 0; n.temperature && n.temperature(d, 0, &c) == 0) put(DeviceMetric::kGpuTemperature, c);
    if (unsigned long long r = 0; n.throttle && n.throttle(d, &r) == 0)
      put(DeviceMetric::kGpuThrottleReasons, static_cast<double>(r));
    if (unsigned long long e = 0; n.ecc && n.ecc(d, 1, 0, &e) == 0)
      put(DeviceMetric::kGpuEccErrors, static_cast<double>(e));
    // The kernel log names a GPU by its PCI address; without NVML's for this GPU, or without the log, the
    // count is unknown (no record).
    if (Nvml::PciInfo p{}; n.pci && n.pci(d, &p) == 0) {
      if (std::optional<uint64_t> x = xids_->count({.domain = p.domain, .bus = p.bus, .device = p.device}))
        put(DeviceMetric::kGpuXidErrors, static_cast<double>(*x));
    }
  }
}

void DeviceSampler::sample(double now, std::vector<DeviceSampleRecord>* out) {
  const auto put = [&](DeviceMetric m, double v) {
    out->push_back({.host = opt_.host, .device = kDeviceNode, .time_unix_s = now, .metric = m, .value = v});
  };
  if (std::optional<std::string> t = read_text(opt_.proc_root + "/stat")) {
    const std::optional<CpuTimes> cpu = parse_proc_stat(*t);
    // Linux's iowait can go backwards, and with it idle: a busy share above 1 would follow, so that interval
    // is left unknown.
    if (cpu && last_cpu_ && cpu->total > last_cpu_->total && cpu->busy >= last_cpu_->busy &&
        cpu->total - cpu->busy >= last_cpu_->total - last_cpu_->busy) {
      put(DeviceMetric::kNodeCpu, static_cast<double>(cpu->busy - last_cpu_->busy) /
                                      static_cast<double>(cpu->total - last_cpu_->total));
    }
    if (cpu) last_cpu_ = cpu;
  }
  if (std::optional<std::string> t = read_text(opt_.proc_root + "/meminfo")) {
    if (std::optional<uint64_t> used = parse_meminfo_used(*t))
      put(DeviceMetric::kNodeMemoryUsed, static_cast<double>(*used));
  }
  if (!opt_.disk_path.empty()) {
    struct statvfs fs {};
    if (::statvfs(opt_.disk_path.c_str(), &fs) == 0 && fs.f_blocks >= fs.f_bfree) {
      put(DeviceMetric::kNodeDiskUsed,
          static_cast<double>(fs.f_blocks - fs.f_bfree) * static_cast<double>(fs.f_frsize));
    }
  }
  if (std::optional<std::string> t = read_text(opt_.proc_root + "/net/dev")) {
    const std::optional<NetBytes> net = parse_net_dev(*t);
    if (net && last_net_ && now > last_net_time_ && net->rx >= last_net_->rx && net->tx >= last_net_->tx) {
      const double dt = now - last_net_time_;
      put(DeviceMetric::kNodeNetReceive, static_cast<double>(net->rx - last_net_->rx) / dt);
      put(DeviceMetric::kNodeNetTransmit, static_cast<double>(net->tx - last_net_->tx) / dt);
    }
    if (net) {
      last_net_ = net;
      last_net_time_ = now;
    }
  }
  sample_gpus(now, out);
}

}  // namespace gantry
