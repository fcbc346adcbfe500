#include <cuda_runtime.h>
#include <dlfcn.h>  // dlopen, dlsym: NVML is the driver's library, loaded at run time

#include <condition_variable>
#include <cstdio>
#include <mutex>
#include <thread>

#include "engine/core/cuda/device.h"

namespace gantry {

int cuda_device_count() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();  // clear the sticky "no driver" error so later calls start clean
    return 0;
  }
  return n;
}

std::string cuda_device_name(int index) {
  cudaDeviceProp prop{};
  if (index < 0 || index >= cuda_device_count() || cudaGetDeviceProperties(&prop, index) != cudaSuccess)
    return "";
  return prop.name;
}

namespace {

// The few NVML entry points used, as nvml.h declares them (its C ABI has been stable since the _v2 names):
// nvmlReturn_t is an int (0 = NVML_SUCCESS), enums are ints, a device is an opaque pointer.
using NvmlDevice = struct NvmlDeviceOpaque*;
using NvmlInit = int (*)();
using NvmlShutdown = int (*)();
using NvmlHandleBy = int (*)(const char*, NvmlDevice*);       // ..._v2 by PCI bus id, ...ByUUID
using NvmlTemperature = int (*)(NvmlDevice, int, unsigned*);  // sensor 0 = NVML_TEMPERATURE_GPU, °C
using NvmlClock = int (*)(NvmlDevice, int, unsigned*);        // clock 1 = NVML_CLOCK_SM, MHz
using NvmlPower = int (*)(NvmlDevice, unsigned*);             // milliwatts
constexpr int kNvmlSuccess = 0, kNvmlTemperatureGpu = 0, kNvmlClockSm = 1;

template <class F>
F symbol(void* lib, const char* name) {
  return reinterpret_cast<F>(dlsym(lib, name));
}

}  // namespace

struct DeviceSensorMonitor::Impl {
  void* lib = nullptr;
  NvmlShutdown shutdown = nullptr;
  NvmlTemperature temperature = nullptr;
  NvmlClock clock = nullptr;
  NvmlPower power = nullptr;
  NvmlDevice device = nullptr;
  std::chrono::milliseconds period;

  mutable std::mutex mu;
  std::condition_variable wake;
  bool stop = false;
  DeviceSensors readings;
  std::thread thread;

  // Opens NVML and finds the device; false (and everything closed again) where either fails.
  bool open(int cuda_device) {
    lib = dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
    if (lib == nullptr) return false;
    auto init = symbol<NvmlInit>(lib, "nvmlInit_v2");
    shutdown = symbol<NvmlShutdown>(lib, "nvmlShutdown");
    auto by_bus = symbol<NvmlHandleBy>(lib, "nvmlDeviceGetHandleByPciBusId_v2");
    auto by_uuid = symbol<NvmlHandleBy>(lib, "nvmlDeviceGetHandleByUUID");
    temperature = symbol<NvmlTemperature>(lib, "nvmlDeviceGetTemperature");
    clock = symbol<NvmlClock>(lib, "nvmlDeviceGetClockInfo");
    power = symbol<NvmlPower>(lib, "nvmlDeviceGetPowerUsage");
    if (init == nullptr || shutdown == nullptr || init() != kNvmlSuccess) {
      dlclose(lib);
      lib = nullptr;
      return false;
    }
    char bus[32] = {};
    if (by_bus != nullptr && cudaDeviceGetPCIBusId(bus, sizeof bus, cuda_device) == cudaSuccess &&
        by_bus(bus, &device) == kNvmlSuccess) {
      return true;
    }
    cudaGetLastError();
    cudaDeviceProp prop{};
    if (by_uuid != nullptr && cudaGetDeviceProperties(&prop, cuda_device) == cudaSuccess) {
      const auto* u = reinterpret_cast<const unsigned char*>(prop.uuid.bytes);
      char uuid[64];
      std::snprintf(uuid, sizeof uuid,
                    "GPU-%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x", u[0], u[1],
                    u[2], u[3], u[4], u[5], u[6], u[7], u[8], u[9], u[10], u[11], u[12], u[13], u[14], u[15]);
      if (by_uuid(uuid, &device) == kNvmlSuccess) return true;
    }
    cudaGetLastError();
    device = nullptr;
    shutdown();
    dlclose(lib);
    lib = nullptr;
    return false;
  }

  DeviceSensors read() const {
    DeviceSensors s;
    unsigned v = 0;
    if (temperature != nullptr && temperature(device, kNvmlTemperatureGpu, &v) == kNvmlSuccess) {
      s.temperature_celsius = v;
    }
    if (clock != nullptr && clock(device, kNvmlClockSm, &v) == kNvmlSuccess) s.sm_clock_hertz = v * 1e6;
    if (power != nullptr && power(device, &v) == kNvmlSuccess) s.power_watts = v * 1e-3;
    return s;
  }

  void run() {
    std::unique_lock<std::mutex> lock(mu);
    while (!wake.wait_for(lock, period, [this] { return stop; })) {
      lock.unlock();
      const DeviceSensors s = read();
      lock.lock();
      readings = s;
    }
  }
};

DeviceSensorMonitor::DeviceSensorMonitor(int cuda_device, std::chrono::milliseconds period)
    : impl_(std::make_unique<Impl>()) {
  impl_->period = period;
  if (!impl_->open(cuda_device)) return;
  impl_->readings = impl_->read();  // the first reading is there when the constructor returns
  impl_->thread = std::thread([this] { impl_->run(); });
}

DeviceSensorMonitor::~DeviceSensorMonitor() {
  if (impl_->thread.joinable()) {
    {
      std::lock_guard<std::mutex> lock(impl_->mu);
      impl_->stop = true;
    }
    impl_->wake.notify_all();
    impl_->thread.join();
  }
  if (impl_->lib != nullptr) {
    impl_->shutdown();
    dlclose(impl_->lib);
  }
}

DeviceSensors DeviceSensorMonitor::latest() const {
  std::lock_guard<std::mutex> lock(impl_->mu);
  return impl_->readings;
}

bool DeviceSensorMonitor::nvml_available() const {
  return impl_->lib != nullptr;
}

}  // namespace gantry
