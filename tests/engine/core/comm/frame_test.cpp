// The framed-message protocol over a real socketpair: round trips (including frames larger than the
// socket buffer), and every way a stream can be wrong: truncated, bad magic, bad version, oversized,
// silent, closed.
#include "engine/core/comm/frame.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <thread>
#include <vector>

namespace gantry {
namespace {

using ::testing::HasSubstr;
using namespace std::chrono_literals;

struct SocketPair {
  int a = -1, b = -1;
  SocketPair() {
    int fds[2];
    EXPECT_EQ(::socketpair(AF_UNIX, SOCK_STREAM, 0, fds), 0);
    a = fds[0];
    b = fds[1];
  }
  ~SocketPair() {
    if (a >= 0) ::close(a);
    if (b >= 0) ::close(b);
  }
  void close_a() {
    ::close(a);
    a = -1;
  }
  void close_b() {
    ::close(b);
    b = -1;
  }
};

void write_all(int fd, const std::vector<uint8_t>& bytes) {
  size_t off = 0;
  while (off < bytes.size()) {
    ssize_t w = ::write(fd, bytes.data() + off, bytes.size() - off);
    ASSERT_GT(w, 0);
    off += static_cast<size_t>(w);
  }
}

std::vector<uint8_t> pattern(size_t n, uint8_t seed) {
  std::vector<uint8_t> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = static_cast<uint8_t>(seed + i * 31 + (i >> 8));
  return v;
}

TEST(Frame, RoundTripSmallFrames) {
  SocketPair sp;
  for (size_t n : {size_t{0}, size_t{1}, size_t{11}, size_t{12}, size_t{4096}}) {
    auto payload = pattern(n, static_cast<uint8_t>(n));
    ASSERT_TRUE(frame_send(sp.a, FrameType::store_set, payload, 1s).ok());
    FrameErrc errc;
    Result<Frame> f = frame_recv(sp.b, 1s, kFrameMaxPayload, &errc);
    ASSERT_TRUE(f.ok()) << f.error();
    EXPECT_EQ(errc, FrameErrc::ok);
    EXPECT_EQ(f->type, static_cast<uint8_t>(FrameType::store_set));
    EXPECT_EQ(f->payload, payload) << "payload of " << n << " bytes";
  }
}

TEST(Frame, RoundTripFrameLargerThanTheSocketBuffer) {
  // 8 MiB cannot sit in a socketpair's buffer: the sender must wait for the reader (poll between writes).
  SocketPair sp;
  auto payload = pattern(8u << 20, 7);
  Status sent;
  std::thread writer([&] { sent = frame_send(sp.a, 0x20, payload, 10s); });
  Result<Frame> f = frame_recv(sp.b, 10s);
  writer.join();
  ASSERT_TRUE(sent.ok()) << sent.message();
  ASSERT_TRUE(f.ok()) << f.error();
  EXPECT_EQ(f->type, 0x20);
  EXPECT_TRUE(f->payload == payload);
}

TEST(Frame, HeaderLayoutIsLittleEndianWithMagicFirst) {
  uint8_t h[kFrameHeaderBytes];
  frame_header_encode(0x11, 0x01020304, h);
  const uint8_t want[kFrameHeaderBytes] = {'G', 'N', 'T', 'F', 1, 0x11, 0, 0, 0x04, 0x03, 0x02, 0x01};
  EXPECT_EQ(std::vector<uint8_t>(h, h + 12), std::vector<uint8_t>(want, want + 12));
}

TEST(Frame, TruncatedHeaderIsAnError) {
  SocketPair sp;
  auto bytes = frame_encode(0x10, pattern(10, 1));
  bytes.resize(5);
  write_all(sp.a, bytes);
  sp.close_a();
  FrameErrc errc;
  Result<Frame> f = frame_recv(sp.b, 1s, kFrameMaxPayload, &errc);
  ASSERT_FALSE(f.ok());
  EXPECT_EQ(errc, FrameErrc::truncated);
  EXPECT_THAT(f.error(), HasSubstr("truncated frame"));
  EXPECT_THAT(f.error(), HasSubstr("5 of 12 header bytes"));
}

TEST(Frame, TruncatedPayloadIsAnError) {
  SocketPair sp;
  auto bytes = frame_encode(0x10, pattern(100, 1));
  bytes.resize(kFrameHeaderBytes + 40);
  write_all(sp.a, bytes);
  sp.close_a();
  FrameErrc errc;
  Result<Frame> f = frame_recv(sp.b, 1s, kFrameMaxPayload, &errc);
  ASSERT_FALSE(f.ok());
  EXPECT_EQ(errc, FrameErrc::truncated);
  EXPECT_THAT(f.error(), HasSubstr("40 of 100 payload bytes"));
}

TEST(Frame, BadMagicIsRejected) {
  SocketPair sp;
  auto bytes = frame_encode(0x10, pattern(4, 1));
  bytes[0] = 'X';
  write_all(sp.a, bytes);
  FrameErrc errc;
  Result<Frame> f = frame_recv(sp.b, 1s, kFrameMaxPayload, &errc);
  ASSERT_FALSE(f.ok());
  EXPECT_EQ(errc, FrameErrc::bad_magic);
  EXPECT_THAT(f.error(), HasSubstr("bad magic"));
}

TEST(Frame, UnknownVersionAndReservedBitsAreRejected) {
  SocketPair sp;
  auto bytes = frame_encode(0x10, {});
  bytes[4] = 2;
  write_all(sp.a, bytes);
  FrameErrc errc;
  Result<Frame> f = frame_recv(sp.b, 1s, kFrameMaxPayload, &errc);
  ASSERT_FALSE(f.ok());
  EXPECT_EQ(errc, FrameErrc::bad_version);
  EXPECT_THAT(f.error(), HasSubstr("version 2"));

  SocketPair sp2;
  bytes = frame_encode(0x10, {});
  bytes[7] = 1;
  write_all(sp2.a, bytes);
  f = frame_recv(sp2.b, 1s, kFrameMaxPayload, &errc);
  ASSERT_FALSE(f.ok());
  EXPECT_EQ(errc, FrameErrc::bad_header);
}

TEST(Frame, OversizedFrameIsRejectedBeforeItsPayloadIsRead) {
  SocketPair sp;
  // Only the header is sent: a reader that tried to read the claimed 1 MiB would time out instead.
  uint8_t h[kFrameHeaderBytes];
  frame_header_encode(0x10, 1u << 20, h);
  write_all(sp.a, std::vector<uint8_t>(h, h + kFrameHeaderBytes));
  FrameErrc errc;
  auto t0 = std::chrono::steady_clock::now();
  Result<Frame> f = frame_recv(sp.b, 5s, /*max_payload=*/64 * 1024, &errc);
  ASSERT_FALSE(f.ok());
  EXPECT_EQ(errc, FrameErrc::too_large);
  EXPECT_THAT(f.error(), HasSubstr("oversized frame: payload of 1048576 bytes exceeds the limit of 65536"));
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 1s);
}

TEST(Frame, SilentPeerTimesOut) {
  SocketPair sp;
  FrameErrc errc;
  auto t0 = std::chrono::steady_clock::now();
  Result<Frame> f = frame_recv(sp.b, 100ms, kFrameMaxPayload, &errc);
  auto waited = std::chrono::steady_clock::now() - t0;
  ASSERT_FALSE(f.ok());
  EXPECT_EQ(errc, FrameErrc::timeout);
  EXPECT_THAT(f.error(), HasSubstr("timed out after 100 ms"));
  EXPECT_GE(waited, 90ms);
  EXPECT_LT(waited, 2s);
}

TEST(Frame, ClosedPeerAtAFrameBoundaryIsAnOrderlyEnd) {
  SocketPair sp;
  ASSERT_TRUE(frame_send(sp.a, 0x10, pattern(3, 0), 1s).ok());
  sp.close_a();
  FrameErrc errc;
  ASSERT_TRUE(frame_recv(sp.b, 1s).ok());
  Result<Frame> f = frame_recv(sp.b, 1s, kFrameMaxPayload, &errc);
  ASSERT_FALSE(f.ok());
  EXPECT_EQ(errc, FrameErrc::closed);
  EXPECT_THAT(f.error(), HasSubstr("peer closed"));
}

TEST(Frame, SendToAClosedPeerIsAnErrorNotSigpipe) {
  SocketPair sp;
  sp.close_b();
  FrameErrc errc;
  Status st = frame_send(sp.a, 0x10, pattern(100, 0), 1s, &errc);  // SIGPIPE would end this process
  ASSERT_FALSE(st.ok());
  EXPECT_EQ(errc, FrameErrc::closed);
  EXPECT_THAT(st.message(), HasSubstr("peer closed"));
}

TEST(FrameDecoder, ReassemblesFramesFedOneByteAtATime) {
  std::vector<uint8_t> stream;
  for (uint8_t t : {0x10, 0x11, 0x12}) {
    auto f = frame_encode(t, pattern(t, t));
    stream.insert(stream.end(), f.begin(), f.end());
  }
  FrameDecoder dec;
  std::vector<Frame> got;
  for (uint8_t b : stream) {
    dec.feed(&b, 1);
    for (;;) {
      auto r = dec.next();
      ASSERT_TRUE(r.ok()) << r.error();
      if (!r.value()) break;
      got.push_back(std::move(*r.value()));
    }
  }
  ASSERT_EQ(got.size(), 3u);
  EXPECT_EQ(got[1].type, 0x11);
  EXPECT_EQ(got[2].payload, pattern(0x12, 0x12));
  EXPECT_FALSE(dec.mid_frame());
}

TEST(FrameDecoder, ErrorsAreStickyAndMidFrameIsVisible) {
  FrameDecoder dec(/*max_payload=*/100);
  auto f = frame_encode(0x10, pattern(50, 0));
  dec.feed(f.data(), 20);
  auto r = dec.next();
  ASSERT_TRUE(r.ok());
  EXPECT_FALSE(r.value().has_value());
  EXPECT_TRUE(dec.mid_frame());  // EOF now would be a truncated frame

  FrameDecoder big(/*max_payload=*/100);
  auto g = frame_encode(0x10, pattern(101, 0));
  big.feed(g.data(), g.size());
  r = big.next();
  ASSERT_FALSE(r.ok());
  EXPECT_THAT(r.error(), HasSubstr("oversized"));
  EXPECT_EQ(big.error(), FrameErrc::too_large);
  auto ok = frame_encode(0x10, {});
  big.feed(ok.data(), ok.size());
  EXPECT_FALSE(big.next().ok());  // out of step for good
}

}  // namespace
}  // namespace gantry
