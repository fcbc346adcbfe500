// The rendezvous store's request and reply payloads, shared by StoreServer and StoreClient. Each rides in
// one frame (frame.h) whose type says which it is; integers are little-endian. Every request starts with
// a request id that its reply repeats, so a client that gave up on a request can recognise and drop the
// late reply.
//
//   store_set   id u64 | key_len u32 | key | value (the rest of the payload)      -> store_ok
//   store_get   id u64 | wait_ms u32 | key_len u32 | key                          -> store_value |
//   store_error store_wait  id u64 | wait_ms u32 | count u32 | count × (key_len u32 | key)    -> store_ok |
//   store_error store_ok    id u64 store_value id u64 | value (the rest) store_error id u64 | code u32 |
//   message (UTF-8, the rest)
//
// get and wait block on the server until every key is set or wait_ms passes (0: answer at once); the
// timeout error names the keys still missing, which is how a launcher learns which rank never joined.
#pragma once

#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>
#include <vector>

namespace gantry {

enum class StoreErrorCode : uint32_t {
  not_found = 1,    // get with wait_ms 0 on an absent key
  timeout = 2,      // get/wait: the keys were not all set within wait_ms
  bad_request = 3,  // malformed payload, key too long, too many pending requests
  too_large = 4,    // the value would take the store past its byte limit
};

// Appends little-endian fields to a payload.
class StoreWriter {
 public:
  void u32(uint32_t v) {
    for (int i = 0; i < 4; ++i) out_.push_back(static_cast<uint8_t>(v >> (8 * i)));
  }
  void u64(uint64_t v) {
    for (int i = 0; i < 8; ++i) out_.push_back(static_cast<uint8_t>(v >> (8 * i)));
  }
  void bytes(const void* p, size_t n) {
    const auto* b = static_cast<const uint8_t*>(p);
    out_.insert(out_.end(), b, b + n);
  }
  void str(std::string_view s) {  // key_len u32 | key
    u32(static_cast<uint32_t>(s.size()));
    bytes(s.data(), s.size());
  }
  std::vector<uint8_t>& out() { return out_; }

 private:
  std::vector<uint8_t> out_;
};

// Reads fields back; any read past the end sets a sticky failure the caller checks once at the end.
class StoreReader {
 public:
  StoreReader(const uint8_t* p, size_t n) : p_(p), n_(n) {}
  uint32_t u32() {
    uint32_t v = 0;
    if (!need(4)) return 0;
    for (int i = 0; i < 4; ++i) v |= static_cast<uint32_t>(p_[pos_ + i]) << (8 * i);
    pos_ += 4;
    return v;
  }
  uint64_t u64() {
    uint64_t v = 0;
    if (!need(8)) return 0;
    for (int i = 0; i < 8; ++i) v |= static_cast<uint64_t>(p_[pos_ + i]) << (8 * i);
    pos_ += 8;
    return v;
  }
  std::string str() {
    uint32_t len = u32();
    if (!need(len)) return {};
    std::string s(reinterpret_cast<const char*>(p_ + pos_), len);
    pos_ += len;
    return s;
  }
  std::vector<uint8_t> rest() {
    std::vector<uint8_t> v(p_ + pos_, p_ + n_);
    pos_ = n_;
    return v;
  }
  size_t left() const { return n_ - pos_; }
  bool ok() const { return ok_; }

 private:
  bool need(size_t k) {
    if (!ok_ || n_ - pos_ < k) {
      ok_ = false;
      return false;
    }
    return true;
  }
  const uint8_t* p_;
  size_t n_;
  size_t pos_ = 0;
  bool ok_ = true;
};

}  // namespace gantry
