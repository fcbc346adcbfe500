// Checking CUDA and cuBLAS calls: a failure throws FatalError with the call, file, line, host and rank
// (see engine/core/fatal.h). Every kernel launch is followed by CUDA_CHECK_LAUNCH().
#pragma once

#include <cublasLt.h>
#include <cuda_runtime.h>

#include <string>

#include "engine/core/fatal.h"

#define CUDA_CHECK(call)                                                                  \
  do {                                                                                    \
    cudaError_t gantry_err_ = (call);                                                     \
    if (gantry_err_ != cudaSuccess)                                                       \
      ::gantry::fatal_error(__FILE__, __LINE__,                                           \
                            std::string(#call) + ": " + cudaGetErrorString(gantry_err_)); \
  } while (0)

#define CUDA_CHECK_LAUNCH() CUDA_CHECK(cudaGetLastError())

#define CUBLAS_CHECK(call)                                                                         \
  do {                                                                                             \
    cublasStatus_t gantry_st_ = (call);                                                            \
    if (gantry_st_ != CUBLAS_STATUS_SUCCESS)                                                       \
      ::gantry::fatal_error(                                                                       \
          __FILE__, __LINE__,                                                                      \
          std::string(#call) + ": cuBLAS status " + std::to_string(static_cast<int>(gantry_st_))); \
  } while (0)
