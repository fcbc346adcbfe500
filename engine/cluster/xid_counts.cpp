// Xid counts per GPU: see xid_counts.h.
#include "engine/cluster/xid_counts.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "engine/cluster/node_health.h"  // parse_xid_line: one parser of the driver's Xid lines

namespace gantry {
namespace {

// Hex digits up to `stop` (or the end); false when there are none or a non-hex character comes first.
bool hex_field(std::string_view& s, char stop, uint32_t* out) {
  uint64_t v = 0;
  size_t i = 0;
  for (; i < s.size() && s[i] != stop; ++i) {
    const char c = s[i];
    int d = -1;
    if (c >= '0' && c <= '9') d = c - '0';
    if (c >= 'a' && c <= 'f') d = c - 'a' + 10;
    if (c >= 'A' && c <= 'F') d = c - 'A' + 10;
    if (d < 0 || i >= 8) return false;
    v = v * 16 + static_cast<uint64_t>(d);
  }
  if (i == 0) return false;
  *out = static_cast<uint32_t>(v);
  s.remove_prefix(i < s.size() ? i + 1 : i);
  return true;
}

}  // namespace

std::optional<PciAddress> parse_pci_address(std::string_view text) {
  PciAddress a;
  if (!hex_field(text, ':', &a.domain) || !hex_field(text, ':', &a.bus) || !hex_field(text, '.', &a.device))
    return std::nullopt;
  return a;
}

XidCounter::XidCounter(std::string path) : path_(std::move(path)) {
  if (path_.empty()) {
    error_ = "no kernel log configured";
    return;
  }
  fd_ = ::open(path_.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  if (fd_ < 0) {
    error_ = path_ + " is not readable here (" + std::strerror(errno) + ")";
    return;
  }
  // From now on: the ring buffer's older records may have been overwritten already, so a count from boot
  // would be short by an unknown amount; a count from the agent's start is exact.
  ::lseek(fd_, 0, SEEK_END);
}

XidCounter::~XidCounter() {
  if (fd_ >= 0) ::close(fd_);
}

bool XidCounter::poll() {
  if (fd_ < 0) return false;
  // /dev/kmsg gives one record a read (EAGAIN when none is left, EPIPE when records were overwritten before
  // they were read: counted as lost below); a plain file gives lines, split here.
  char buf[8192];
  for (int reads = 0; reads < 4096; ++reads) {
    const ssize_t got = ::read(fd_, buf, sizeof buf);
    if (got < 0 && errno == EPIPE) {
      // Records overwritten before this read: the count would be short, so it is unknown from now on.
      error_ = path_ + ": the kernel overwrote records before they were read; Xid counts are unknown";
      ::close(fd_);
      fd_ = -1;
      return false;
    }
    if (got <= 0) break;
    tail_.append(buf, static_cast<size_t>(got));
    size_t start = 0;
    for (size_t nl; (nl = tail_.find('\n', start)) != std::string::npos; start = nl + 1) {
      const std::optional<XidEvent> x = parse_xid_line(std::string_view(tail_).substr(start, nl - start));
      if (!x) continue;
      if (const std::optional<PciAddress> a = parse_pci_address(x->pci)) ++counts_[*a];
    }
    tail_.erase(0, start);
  }
  return true;
}

std::optional<uint64_t> XidCounter::count(const PciAddress& pci) const {
  if (fd_ < 0) return std::nullopt;
  const auto it = counts_.find(pci);
  return it == counts_.end() ? 0 : it->second;
}

}  // namespace gantry
