// Xid errors per GPU (issue 21's device telemetry): the NVIDIA driver logs each Xid to the kernel log as
//   "NVRM: Xid (PCI:0000:3b:00): 79, pid=1923, name=python3, GPU has fallen off the bus."
// and NVML has no counter of them (only an event stream, nvmlEventTypeXidCriticalError, which sees the
// critical ones while a listener waits). So the agent's device sampler reads /dev/kmsg, as its health check
// does (node_health.h, which keeps only the fatal codes), and counts every Xid per PCI address from the
// moment it opened the log; NVML's PCI info of each GPU (domain, bus, device) picks its count.
//
//   XidCounter x("/dev/kmsg");          // opened at its end: Xids from now on
//   x.poll();                           // each sample: reads what the kernel added
//   std::optional<uint64_t> n = x.count(*parse_pci_address("0000:3b:00"));   // nullopt: cannot be read
//
// The log not readable (no such file, EPERM: /dev/kmsg needs CAP_SYSLOG where dmesg_restrict is set) gives
// nullopt, unknown, never 0; error() says why.
#pragma once

#include <compare>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>

namespace gantry {

struct PciAddress {
  uint32_t domain = 0, bus = 0, device = 0;
  auto operator<=>(const PciAddress&) const = default;
};
// "0000:3b:00" (the driver's Xid line), "00000000:3B:00.0" (NVML's busId): hex domain:bus:device[.function].
std::optional<PciAddress> parse_pci_address(std::string_view text);

class XidCounter {
 public:
  explicit XidCounter(std::string path);
  ~XidCounter();
  XidCounter(const XidCounter&) = delete;
  XidCounter& operator=(const XidCounter&) = delete;

  // Reads the records the log has gained since the last call; false when it cannot be read.
  bool poll();
  // Xids logged for the GPU at `pci` since the log was opened (0 is a real 0: the log was read and held
  // none); nullopt when the log cannot be read.
  std::optional<uint64_t> count(const PciAddress& pci) const;
  const std::string& error() const { return error_; }

 private:
  std::string path_;
  int fd_ = -1;
  std::string error_;
  std::string tail_;  // a line not yet ended (a plain file read mid-write)
  std::map<PciAddress, uint64_t> counts_;
};

}  // namespace gantry
