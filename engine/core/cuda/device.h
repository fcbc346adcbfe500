// What GPUs this process can see. Declared without CUDA types so CPU code and tests can ask; built only
// where nvcc is found (GANTRY_HAVE_CUDA), with cuda_device_count() returning 0 when no driver or device is there.
#pragma once

#include <string>

namespace gantry {

int cuda_device_count();                 // 0 without a driver or a device
std::string cuda_device_name(int index);  // "NVIDIA H100 80GB HBM3", or "" when absent

}  // namespace gantry
