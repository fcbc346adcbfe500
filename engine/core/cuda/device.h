// What GPUs this process can see, and their sensors. Declared without CUDA types so CPU code and tests can
// ask; built only where nvcc is found (GANTRY_HAVE_CUDA), with cuda_device_count() returning 0 when no driver
// or device is there.
//
//   DeviceSensorMonitor sensors(0);                  // opens NVML (if the driver has it) and reads once
//   DeviceSensors now = sensors.latest();            // never waits on NVML: a background thread refreshes it
//   if (now.power_watts) ...                         // absent where NVML or the reading is unavailable
#pragma once

#include <chrono>
#include <memory>
#include <optional>
#include <string>

namespace gantry {

int cuda_device_count();                  // 0 without a driver or a device
std::string cuda_device_name(int index);  // "NVIDIA H100 80GB HBM3", or "" when absent

struct DeviceSensors {
  std::optional<double> temperature_celsius;  // GPU core
  std::optional<double> sm_clock_hertz;       // current SM clock
  std::optional<double> power_watts;          // board power draw
};

// One CUDA device's sensors through NVML. The library is the driver's libnvidia-ml.so.1, opened at run time
// (dlopen) rather than linked, so a binary built with the toolkit still starts where the driver is absent;
// there, or where NVML fails, every reading stays absent and nothing else happens. The device is found by its
// PCI bus id (then its UUID), so CUDA_VISIBLE_DEVICES renumbering cannot point it at another GPU. Reading
// power can take milliseconds, so readings are taken on a background thread every `period`; latest() only
// copies them.
class DeviceSensorMonitor {
 public:
  explicit DeviceSensorMonitor(int cuda_device,
                               std::chrono::milliseconds period = std::chrono::milliseconds(500));
  ~DeviceSensorMonitor();
  DeviceSensorMonitor(const DeviceSensorMonitor&) = delete;
  DeviceSensorMonitor& operator=(const DeviceSensorMonitor&) = delete;

  DeviceSensors latest() const;
  bool nvml_available() const;  // NVML opened and the device found in it

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace gantry
