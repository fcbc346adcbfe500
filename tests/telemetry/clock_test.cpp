// The clock helper's thread CPU time (telemetry/clock.h), which the console's frame benchmarks read: it
// counts the calling thread's own work only, not another thread's, and not time spent blocked.
#include "telemetry/clock.h"

#include <gtest/gtest.h>

#include <thread>

namespace gantry {
namespace {

// Arithmetic until this thread has used `cpu_s` seconds of CPU by its own clock.
void burn(double cpu_s) {
  volatile double x = 1;
  const double t0 = thread_cpu_s();
  while (thread_cpu_s() - t0 < cpu_s) {
    for (int k = 0; k < 10000; ++k) x = x * 1.0000001 + 1e-9;
  }
}

TEST(Clock, ThreadCpuTimeCountsTheThreadsOwnWorkOnly) {
  double worker_s = 0;
  const double main0 = thread_cpu_s();
  std::thread worker([&] {
    const double t0 = thread_cpu_s();
    burn(0.2);
    worker_s = thread_cpu_s() - t0;
  });
  worker.join();  // blocked: the main thread does no work while the worker burns its 0.2 s
  const double main_s = thread_cpu_s() - main0;
  EXPECT_GE(worker_s, 0.2);
  EXPECT_LT(main_s, worker_s / 2) << "the main thread was charged for the worker's CPU time";
}

TEST(Clock, ThreadCpuTimeNeverGoesBack) {
  double last = thread_cpu_s();
  for (int k = 0; k < 1000; ++k) {
    const double now = thread_cpu_s();
    ASSERT_GE(now, last);
    last = now;
  }
}

}  // namespace
}  // namespace gantry
