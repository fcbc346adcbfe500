#include "engine/cluster/token.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>

namespace gantry {
namespace {

std::string errno_text(int e) {
  return std::strerror(e);
}

// "0644"
std::string octal_mode(mode_t m) {
  char buf[8];
  std::snprintf(buf, sizeof buf, "%04o", static_cast<unsigned>(m & 07777));
  return buf;
}

bool write_all(int fd, const char* p, size_t n) {
  while (n > 0) {
    ssize_t w = ::write(fd, p, n);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return false;
    p += w;
    n -= static_cast<size_t>(w);
  }
  return true;
}

}  // namespace

Result<std::string> token_generate() {
  int fd = ::open("/dev/urandom", O_RDONLY | O_CLOEXEC);
  if (fd < 0) return Status::error("cannot open /dev/urandom to make a token: " + errno_text(errno));
  unsigned char bytes[kTokenBytes];
  size_t have = 0;
  while (have < sizeof bytes) {
    ssize_t r = ::read(fd, bytes + have, sizeof bytes - have);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) {
      const int e = r < 0 ? errno : EIO;
      ::close(fd);
      return Status::error("cannot read /dev/urandom to make a token: " + errno_text(e));
    }
    have += static_cast<size_t>(r);
  }
  ::close(fd);
  static const char kHex[] = "0123456789abcdef";
  std::string token;
  token.reserve(2 * sizeof bytes);
  for (unsigned char b : bytes) {
    token += kHex[b >> 4];
    token += kHex[b & 15];
  }
  return token;
}

Status token_check(std::string_view token) {
  if (token.size() < 16) {
    return Status::error("token is " + std::to_string(token.size()) +
                         " characters long; it must have at least 16 (token_generate() makes 64)");
  }
  if (token.size() > 4096) return Status::error("token is longer than 4096 characters");
  for (size_t i = 0; i < token.size(); ++i) {
    const unsigned char c = static_cast<unsigned char>(token[i]);
    if (c <= 0x20 || c >= 0x7f) {
      return Status::error(
          "token has a space, control or non-ASCII character at offset " + std::to_string(i) +
          "; it must be printable ASCII without spaces to travel in an Authorization header");
    }
  }
  return Status();
}

Status token_file_write(const std::string& path, std::string_view token) {
  if (Status s = token_check(token); !s.ok()) return s;
  const std::string tmp = path + ".tmp." + std::to_string(::getpid());
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, 0600);
  if (fd < 0) return Status::error("cannot create token file " + tmp + ": " + errno_text(errno));
  // open's mode passes through the umask, which can only narrow it; fchmod makes it exactly 0600 even if
  // an old temporary file of a wider mode was there.
  std::string text(token);
  text += "\n";
  const bool ok = ::fchmod(fd, 0600) == 0 && write_all(fd, text.data(), text.size()) && ::fsync(fd) == 0;
  const int e = errno;
  if (::close(fd) != 0 || !ok) {
    ::unlink(tmp.c_str());
    return Status::error("cannot write token file " + tmp + ": " + errno_text(ok ? errno : e));
  }
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    const int re = errno;
    ::unlink(tmp.c_str());
    return Status::error("cannot rename " + tmp + " to token file " + path + ": " + errno_text(re));
  }
  return Status();
}

Result<std::string> token_file_read(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    const int e = errno;
    if (e == ENOENT) {
      return Status::error(
          "token file " + path +
          " does not exist (`gantry-engine up` writes one; or pass the file the coordinator was given)");
    }
    return Status::error("cannot open token file " + path + ": " + errno_text(e));
  }
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    const int e = errno;
    ::close(fd);
    return Status::error("cannot stat token file " + path + ": " + errno_text(e));
  }
  auto refuse = [&](const std::string& why) {
    ::close(fd);
    return Status::error("token file " + path + " " + why);
  };
  if (!S_ISREG(st.st_mode)) return refuse("is not a regular file");
  if ((st.st_mode & 077) != 0) {
    return refuse("has mode " + octal_mode(st.st_mode) +
                  ": it must be readable by its owner only (chmod 600 " + path + ")");
  }
  if (st.st_uid != ::geteuid() && ::geteuid() != 0) {
    return refuse("belongs to uid " + std::to_string(st.st_uid) + ", not to this user (uid " +
                  std::to_string(::geteuid()) + "): someone else could have chosen the token");
  }
  if (st.st_size > 8192)
    return refuse("is " + std::to_string(st.st_size) + " bytes; a token file holds one line");
  std::string text(static_cast<size_t>(st.st_size), '\0');
  size_t have = 0;
  while (have < text.size()) {
    ssize_t r = ::read(fd, text.data() + have, text.size() - have);
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) return refuse("cannot be read: " + errno_text(errno));
    if (r == 0) break;
    have += static_cast<size_t>(r);
  }
  ::close(fd);
  text.resize(have);
  while (!text.empty() &&
         (text.back() == '\n' || text.back() == '\r' || text.back() == ' ' || text.back() == '\t')) {
    text.pop_back();
  }
  if (text.empty())
    return Status::error("token file " + path + " is empty; it must hold the token on one line");
  if (Status s = token_check(text); !s.ok()) return Status::error("token file " + path + ": " + s.message());
  return text;
}

bool token_equal(std::string_view a, std::string_view b) {
  // Every byte of the longer one is looked at, whatever the contents, and no branch depends on them.
  const size_t n = a.size() > b.size() ? a.size() : b.size();
  unsigned diff = a.size() != b.size() ? 1u : 0u;
  for (size_t i = 0; i < n; ++i) {
    const unsigned char x = i < a.size() ? static_cast<unsigned char>(a[i]) : 0;
    const unsigned char y = i < b.size() ? static_cast<unsigned char>(b[i]) : 0;
    diff |= static_cast<unsigned>(x ^ y);
  }
  return diff == 0;
}

}  // namespace gantry
