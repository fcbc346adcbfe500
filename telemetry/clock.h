// The one clock helper (CONVENTIONS.md): wall-clock seconds for records and events, which must agree
// between processes and machines, and monotonic seconds for durations, which must never jump.
//
//   rec.time_unix_s = unix_now_s();
//   const double t0 = monotonic_s();
//   work();
//   const double took_s = monotonic_s() - t0;
#pragma once

namespace gantry {

// Seconds since the Unix epoch, now (system clock: comparable across machines, may jump under NTP).
double unix_now_s();

// Seconds since an arbitrary fixed point (steady clock): for intervals within one process only.
double monotonic_s();

// CPU seconds the calling thread has used (CLOCK_THREAD_CPUTIME_ID): what a piece of work cost the thread
// that did it, apart from the time others on a shared machine took from it.
double thread_cpu_s();

// CPU seconds every thread of this process has used, in user space and in the kernel
// (CLOCK_PROCESS_CPUTIME_ID): what work spread over helper threads and system calls cost the host.
double process_cpu_s();

}  // namespace gantry
