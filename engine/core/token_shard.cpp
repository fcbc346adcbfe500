#include "engine/core/token_shard.h"

#include <fcntl.h>     // open
#include <sys/mman.h>  // mmap, munmap
#include <sys/stat.h>  // fstat
#include <unistd.h>    // write, fsync, close

#include <algorithm>
#include <cerrno>
#include <cstdio>  // std::rename, std::remove
#include <limits>
#include <system_error>  // errno text that is safe to build from several threads
#include <utility>
#include <vector>

namespace gantry {
namespace {

std::string errno_text(int err) {
  return std::error_code(err, std::generic_category()).message();
}

// Explicit byte order, so shards are the same bytes whatever the host's order.
void put_le32(unsigned char* p, uint32_t v) {
  p[0] = static_cast<unsigned char>(v);
  p[1] = static_cast<unsigned char>(v >> 8);
  p[2] = static_cast<unsigned char>(v >> 16);
  p[3] = static_cast<unsigned char>(v >> 24);
}

uint32_t get_le32(const unsigned char* p) {
  return static_cast<uint32_t>(p[0]) | static_cast<uint32_t>(p[1]) << 8 | static_cast<uint32_t>(p[2]) << 16 |
         static_cast<uint32_t>(p[3]) << 24;
}

uint32_t get_le16(const unsigned char* p) {
  return static_cast<uint32_t>(p[0]) | static_cast<uint32_t>(p[1]) << 8;
}

Status write_all(int fd, const unsigned char* data, size_t bytes, const std::string& tmp) {
  while (bytes > 0) {
    ssize_t n = ::write(fd, data, bytes);
    if (n < 0) {
      if (errno == EINTR) continue;
      return Status::error("token shard " + tmp + ": write failed (" + errno_text(errno) + ")");
    }
    data += n;
    bytes -= static_cast<size_t>(n);
  }
  return Status();
}

Status write_file(const std::string& tmp, std::span<const uint32_t> tokens, int version) {
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return Status::error("token shard " + tmp + ": cannot create (" + errno_text(errno) + ")");

  unsigned char header[kTokenShardHeaderBytes] = {};
  put_le32(header + 0, static_cast<uint32_t>(kTokenShardMagic));
  put_le32(header + 4, static_cast<uint32_t>(version));
  put_le32(header + 8, static_cast<uint32_t>(tokens.size()));
  Status st = write_all(fd, header, sizeof header, tmp);

  // Encoded in bounded chunks so writing a large shard does not double its memory.
  const size_t token_bytes = version == 1 ? 2 : 4;
  const size_t chunk = size_t{1} << 16;
  std::vector<unsigned char> buf(chunk * token_bytes);
  for (size_t first = 0; st.ok() && first < tokens.size(); first += chunk) {
    size_t n = std::min(chunk, tokens.size() - first);
    for (size_t i = 0; i < n; ++i) {
      uint32_t t = tokens[first + i];
      unsigned char* p = buf.data() + i * token_bytes;
      p[0] = static_cast<unsigned char>(t);
      p[1] = static_cast<unsigned char>(t >> 8);
      if (token_bytes == 4) {
        p[2] = static_cast<unsigned char>(t >> 16);
        p[3] = static_cast<unsigned char>(t >> 24);
      }
    }
    st = write_all(fd, buf.data(), n * token_bytes, tmp);
  }
  // fsync before the rename: otherwise a crash can leave the real name pointing at an empty file.
  if (st.ok() && ::fsync(fd) != 0) {
    st = Status::error("token shard " + tmp + ": fsync failed (" + errno_text(errno) + ")");
  }
  if (::close(fd) != 0 && st.ok()) {
    st = Status::error("token shard " + tmp + ": close failed (" + errno_text(errno) + ")");
  }
  return st;
}

}  // namespace

Status token_shard_write(const std::string& path, std::span<const uint32_t> tokens, int version) {
  if (version != 1 && version != 2) {
    return Status::error("token shard " + path + ": cannot write version " + std::to_string(version) +
                         " (allowed: 1 = uint16 tokens, 2 = uint32 tokens)");
  }
  if (tokens.size() > static_cast<size_t>(std::numeric_limits<int32_t>::max())) {
    return Status::error("token shard " + path + ": " + std::to_string(tokens.size()) +
                         " tokens do not fit the header's int32 count (at most 2147483647); split them "
                         "over several shards");
  }
  // Checked before anything is created, so a refused write leaves no file behind.
  if (version == 1) {
    for (size_t i = 0; i < tokens.size(); ++i) {
      if (tokens[i] > 65535) {
        return Status::error("token shard " + path + ": token " + std::to_string(tokens[i]) + " at index " +
                             std::to_string(i) +
                             " does not fit version 1 (uint16, at most 65535); write with version 2");
      }
    }
  }
  const std::string tmp = path + ".tmp";
  Status st = write_file(tmp, tokens, version);
  if (st.ok() && std::rename(tmp.c_str(), path.c_str()) != 0) {
    st = Status::error("token shard " + path + ": cannot rename " + tmp + " to it (" + errno_text(errno) +
                       ")");
  }
  if (!st.ok()) std::remove(tmp.c_str());
  return st;
}

Result<TokenShard> TokenShard::open(const std::string& path) {
  const std::string where = "token shard " + path + ": ";
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return Status::error(where + "cannot open (" + errno_text(errno) + ")");
  struct stat info = {};
  if (::fstat(fd, &info) != 0) {
    int err = errno;
    ::close(fd);
    return Status::error(where + "cannot stat (" + errno_text(err) + ")");
  }
  if (!S_ISREG(info.st_mode)) {
    ::close(fd);
    return Status::error(where + "is not a regular file (expected an llm.c .bin token shard)");
  }
  const uint64_t file_bytes = static_cast<uint64_t>(info.st_size);
  if (file_bytes < kTokenShardHeaderBytes) {
    ::close(fd);
    return Status::error(where + "file is " + std::to_string(file_bytes) + " bytes, shorter than the " +
                         std::to_string(kTokenShardHeaderBytes) +
                         "-byte header (256 int32); expected an llm.c token shard");
  }
  void* map = ::mmap(nullptr, file_bytes, PROT_READ, MAP_PRIVATE, fd, 0);
  int map_err = errno;
  ::close(fd);  // the mapping keeps the file alive on its own
  if (map == MAP_FAILED) return Status::error(where + "mmap failed (" + errno_text(map_err) + ")");

  TokenShard shard;  // owns the mapping from here, so every early return below unmaps it
  shard.path_ = path;
  shard.map_ = static_cast<const unsigned char*>(map);
  shard.file_bytes_ = file_bytes;
  shard.mtime_ns_ = static_cast<int64_t>(info.st_mtim.tv_sec) * 1000000000 + info.st_mtim.tv_nsec;

  const int32_t magic = static_cast<int32_t>(get_le32(shard.map_));
  if (magic != kTokenShardMagic) {
    std::string hint;
    if (magic == 20240326) hint = " (this is an llm.c model checkpoint, not a token shard)";
    if (magic == 20240328) hint = " (this is an llm.c tokenizer file, not a token shard)";
    return Status::error(where + "bad magic " + std::to_string(magic) + ", expected " +
                         std::to_string(kTokenShardMagic) + hint);
  }
  const int32_t version = static_cast<int32_t>(get_le32(shard.map_ + 4));
  if (version != 1 && version != 2) {
    return Status::error(where + "unknown version " + std::to_string(version) +
                         " (allowed: 1 = uint16 tokens, 2 = uint32 tokens)");
  }
  const int32_t count = static_cast<int32_t>(get_le32(shard.map_ + 8));
  if (count < 0) {
    return Status::error(where + "header token count is negative (" + std::to_string(count) +
                         "); expected 0 or more");
  }
  const uint64_t token_bytes = version == 1 ? 2 : 4;
  const uint64_t expected = kTokenShardHeaderBytes + static_cast<uint64_t>(count) * token_bytes;
  if (file_bytes != expected) {
    return Status::error(where + "header says " + std::to_string(count) + " tokens of version " +
                         std::to_string(version) + " (" + std::to_string(token_bytes) +
                         " bytes each), so expected " + std::to_string(expected) +
                         " bytes, but the file has " + std::to_string(file_bytes) + ": " +
                         (file_bytes < expected ? "truncated" : "trailing data after the last token"));
  }
  shard.version_ = version;
  shard.size_ = static_cast<uint64_t>(count);
  return shard;
}

TokenShard::TokenShard(TokenShard&& other) noexcept
    : path_(std::move(other.path_)),
      map_(std::exchange(other.map_, nullptr)),
      file_bytes_(std::exchange(other.file_bytes_, 0)),
      mtime_ns_(std::exchange(other.mtime_ns_, 0)),
      size_(std::exchange(other.size_, 0)),
      version_(std::exchange(other.version_, 0)) {}

TokenShard& TokenShard::operator=(TokenShard&& other) noexcept {
  if (this != &other) {
    release();
    path_ = std::move(other.path_);
    map_ = std::exchange(other.map_, nullptr);
    file_bytes_ = std::exchange(other.file_bytes_, 0);
    mtime_ns_ = std::exchange(other.mtime_ns_, 0);
    size_ = std::exchange(other.size_, 0);
    version_ = std::exchange(other.version_, 0);
  }
  return *this;
}

TokenShard::~TokenShard() {
  release();
}

void TokenShard::release() {
  if (map_ != nullptr) ::munmap(const_cast<unsigned char*>(map_), file_bytes_);
  map_ = nullptr;
}

uint32_t TokenShard::at(uint64_t i) const {
  const unsigned char* tokens = map_ + kTokenShardHeaderBytes;
  return version_ == 1 ? get_le16(tokens + i * 2) : get_le32(tokens + i * 4);
}

void TokenShard::read(uint64_t first, uint64_t count, int32_t* out) const {
  const unsigned char* tokens = map_ + kTokenShardHeaderBytes;
  if (version_ == 1) {
    const unsigned char* p = tokens + first * 2;
    for (uint64_t i = 0; i < count; ++i) out[i] = static_cast<int32_t>(get_le16(p + i * 2));
  } else {
    const unsigned char* p = tokens + first * 4;
    for (uint64_t i = 0; i < count; ++i) out[i] = static_cast<int32_t>(get_le32(p + i * 4));
  }
}

}  // namespace gantry
