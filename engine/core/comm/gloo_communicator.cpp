// The Gloo communicator. Index:
//   slots and errors     how messages are tagged, how Gloo's exceptions become our causes
//   class GlooCommunicator
//     run()              the frame every operation runs in: broken check, deadline, failure -> broken
//     Buf, exchange()    registered unbound buffers (abort() can reach them) and one ring step
//     collectives        all_reduce, reduce_scatter, all_gather, broadcast, send/recv, barrier
//   gloo_communicator_create
#include "engine/core/comm/gloo_communicator.h"

#include <gloo/common/error.h>              // gloo::Exception, gloo::IoException
#include <gloo/rendezvous/context.h>        // gloo::rendezvous::Context::connectFullMesh
#include <gloo/transport/tcp/device.h>      // gloo::transport::tcp::CreateDevice
#include <gloo/transport/unbound_buffer.h>  // point-to-point send/recv with waits that can be aborted
#include <signal.h>                         // sigaction: SIGPIPE ignored (see the header)

#include <algorithm>
#include <atomic>
#include <cstring>
#include <functional>
#include <mutex>
#include <optional>
#include <set>
#include <vector>

#include "engine/core/comm/gloo_store.h"
#include "engine/core/comm/store_client.h"

namespace gantry {
namespace {

using Clock = std::chrono::steady_clock;
using gloo::transport::UnboundBuffer;

// ---- slots and errors ------------------------------------------------------------------------------

enum class OpKind : uint8_t {
  all_reduce = 1,
  reduce_scatter = 2,
  all_gather = 3,
  broadcast = 4,
  barrier = 5,
  p2p = 6
};

// kind (8 bits, high bit set: clear of Gloo's own slot prefixes 0x01-0x08) | sequence (24) | count
// fingerprint (16) | step (16). The sequence wraps after 16M operations, harmless: operations run one at
// a time, so a wrapped number never meets a live message.
uint64_t make_slot(OpKind kind, uint32_t seq, size_t count, uint32_t step) {
  const uint64_t fingerprint = (static_cast<uint64_t>(count) * 0x9E3779B97F4A7C15ull) >> 48;
  return (static_cast<uint64_t>(0x80 | static_cast<uint8_t>(kind)) << 56) |
         (static_cast<uint64_t>(seq & 0xFFFFFF) << 32) | (fingerprint << 16) | (step & 0xFFFF);
}

bool contains(const std::string& s, const char* what) {
  return s.find(what) != std::string::npos;
}

// Gloo reports everything as IoException text; sort it into the causes our callers act on. `where` says
// what we were doing ("waiting for data from rank 2") and goes before Gloo's own words.
std::string classify(const std::string& gloo_msg, const std::string& where) {
  const char* kind = "transport error";
  if (contains(gloo_msg, "Timed out")) {
    kind = "timeout";
  } else if (contains(gloo_msg, "closed") || contains(gloo_msg, "reset") ||
             contains(gloo_msg, "Broken pipe") || contains(gloo_msg, "Read error") ||
             contains(gloo_msg, "writev") || contains(gloo_msg, "Application timeout")) {
    // "Application timeout caused pair closure" reaches us when another wait of ours timed out; Gloo
    // then closes every pair, which is the same situation as a peer vanishing.
    kind = "peer closed";
  }
  return std::string(kind) + where + " (gloo: " + gloo_msg + ")";
}

struct Deadline {
  Clock::time_point at;
  std::chrono::milliseconds timeout;
  std::chrono::milliseconds left() const {
    return std::max(std::chrono::milliseconds(0),
                    std::chrono::ceil<std::chrono::milliseconds>(at - Clock::now()));
  }
};

// Thrown inside an operation to leave it with a cause; run() turns it into the Status. Never escapes.
struct OpError {
  std::string cause;
  bool timeout = false;  // a wait on a peer outlasted the operation's deadline
};

void add_into(float* dst, const float* a, const float* b, size_t n) {
  // One rounding per element, a + b: commutative in IEEE arithmetic, so which operand is "ours" does not
  // change the bits; the association order is fixed by the ring.
  for (size_t i = 0; i < n; ++i) dst[i] = a[i] + b[i];
}

// ---- the communicator ------------------------------------------------------------------------------

class GlooCommunicator final : public Communicator {
 public:
  GlooCommunicator(int rank, int size, std::shared_ptr<gloo::transport::Device> device,
                   std::shared_ptr<gloo::rendezvous::Context> context)
      : rank_(rank),
        size_(size),
        device_(std::move(device)),
        context_(std::move(context)),
        send_seq_(static_cast<size_t>(size), 0),
        recv_seq_(static_cast<size_t>(size), 0) {}

  ~GlooCommunicator() override {
    // Pairs close softly with the context; peers still inside an operation with us see "peer closed".
    context_.reset();
  }

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  const char* backend() const override { return "gloo"; }

  CommProgress progress() const override {
    return {.entered = entered_.load(), .inside = inside_.load(), .timed_out = timed_out_.load()};
  }
  std::vector<CollectiveRecord> flight_record() const override { return recorder_.snapshot(); }

  Status health() const override {
    std::lock_guard<std::mutex> lock(mu_);
    return broken_.empty() ? Status() : Status::error(broken_);
  }

  void abort() override {
    std::lock_guard<std::mutex> lock(mu_);
    aborted_ = true;
    // Wake the waits in progress; their buffers keep the flag, so a wait that has not started yet
    // returns at once too.
    for (UnboundBuffer* b : inflight_) {
      b->abortWaitRecv();
      b->abortWaitSend();
    }
    if (broken_.empty()) broken_ = "aborted";
    // The operation thread closes the connections itself when it sees the abort (Gloo's pairs are not
    // meant to be closed under a thread still posting on them); with no operation running, close now.
    if (!in_op_ && !closed_) close_connections_locked();
  }

  Status all_reduce(float* data, size_t count, Timeout timeout) override {
    return run("all_reduce", count, timeout, /*collective=*/true, [&](const Deadline& d, uint32_t seq) {
      check_ptr(data, count);
      if (size_ == 1 || count == 0) return;
      ring_reduce_scatter_in_place(data, count, seq, d);
      ring_all_gather_in_place(data, count, seq, static_cast<uint32_t>(size_ - 1), OpKind::all_reduce, d);
    });
  }

  Status reduce_scatter(const float* in, float* out, size_t count, Timeout timeout) override {
    return run("reduce_scatter", count, timeout, /*collective=*/true, [&](const Deadline& d, uint32_t seq) {
      const CommBlock mine = comm_block(count, size_, rank_);
      check_ptr(in, count);
      check_ptr(out, mine.count);
      if (out != in + mine.offset && out < in + count && in < out + mine.count) {
        throw OpError{"invalid argument: out overlaps in without being in + offset " +
                      std::to_string(mine.offset)};
      }
      if (size_ == 1) {
        if (out != in && count) std::memcpy(out, in, count * sizeof(float));
        return;
      }
      if (count == 0) return;
      ring_reduce_scatter(in, out, count, seq, d);
    });
  }

  Status all_gather(const float* in, float* out, size_t count, Timeout timeout) override {
    return run("all_gather", count, timeout, /*collective=*/true, [&](const Deadline& d, uint32_t seq) {
      const CommBlock mine = comm_block(count, size_, rank_);
      check_ptr(in, mine.count);
      check_ptr(out, count);
      // memmove: `in` may overlap its own place in `out` (it is usually exactly that place).
      if (mine.count && in != out + mine.offset)
        std::memmove(out + mine.offset, in, mine.count * sizeof(float));
      if (size_ == 1 || count == 0) return;
      ring_all_gather_in_place(out, count, seq, 0, OpKind::all_gather, d);
    });
  }

  Status broadcast(float* data, size_t count, int root, Timeout timeout) override {
    return run("broadcast", count, timeout, /*collective=*/true, [&](const Deadline& d, uint32_t seq) {
      check_ptr(data, count);
      check_rank(root, "root");
      if (size_ == 1 || count == 0) return;
      // Binomial tree over ranks renumbered so the root is 0: in round k, the 2^k ranks that have the
      // data send it to the ranks 2^k above them. log2(size) rounds, each rank receives exactly once.
      const int vr = mod(rank_ - root);
      Buf send_buf(*this, data, count * sizeof(float));
      Buf recv_buf(*this, data, count * sizeof(float));
      uint32_t round = 0;
      for (int mask = 1; mask < size_; mask <<= 1, ++round) {
        const uint64_t slot = make_slot(OpKind::broadcast, seq, count, round);
        if (vr < mask && vr + mask < size_) {
          const int peer = mod(vr + mask + root);
          post_send(send_buf, peer, slot, 0, count * sizeof(float));
          wait_send(send_buf, peer, d);
        } else if (vr >= mask && vr < 2 * mask) {
          const int peer = mod(vr - mask + root);
          post_recv(recv_buf, peer, slot, 0, count * sizeof(float));
          wait_recv(recv_buf, peer, d);
        }
      }
    });
  }

  Status send(const float* data, size_t count, int peer, Timeout timeout) override {
    return run("send", count, timeout, /*collective=*/false, [&](const Deadline& d, uint32_t) {
      check_ptr(data, count);
      check_rank(peer, "peer");
      if (peer == rank_) throw OpError{"invalid argument: send to self"};
      const uint32_t seq = send_seq_[static_cast<size_t>(peer)]++;
      if (count == 0) return;
      Buf buf(*this, const_cast<float*>(data), count * sizeof(float));  // only read: it is a send buffer
      post_send(buf, peer, make_slot(OpKind::p2p, seq, count, 0), 0, count * sizeof(float));
      wait_send(buf, peer, d);
    });
  }

  Status recv(float* data, size_t count, int peer, Timeout timeout) override {
    return run("recv", count, timeout, /*collective=*/false, [&](const Deadline& d, uint32_t) {
      check_ptr(data, count);
      check_rank(peer, "peer");
      if (peer == rank_) throw OpError{"invalid argument: recv from self"};
      const uint32_t seq = recv_seq_[static_cast<size_t>(peer)]++;
      if (count == 0) return;
      Buf buf(*this, data, count * sizeof(float));
      post_recv(buf, peer, make_slot(OpKind::p2p, seq, count, 0), 0, count * sizeof(float));
      wait_recv(buf, peer, d);
    });
  }

  Status send_recv(const float* send_data, size_t send_count, int send_peer, float* recv_data,
                   size_t recv_count, int recv_peer, Timeout timeout) override {
    return run("send_recv", send_count + recv_count, timeout, /*collective=*/false,
               [&](const Deadline& d, uint32_t) {
                 if (send_count > 0) {
                   check_ptr(send_data, send_count);
                   check_rank(send_peer, "peer");
                   if (send_peer == rank_) throw OpError{"invalid argument: send to self"};
                 }
                 if (recv_count > 0) {
                   check_ptr(recv_data, recv_count);
                   check_rank(recv_peer, "peer");
                   if (recv_peer == rank_) throw OpError{"invalid argument: recv from self"};
                 }
                 // Both posted before either wait: the peer's matching pair of calls may be in either order.
                 std::optional<Buf> out, in;
                 if (send_count > 0) {
                   const uint32_t seq = send_seq_[static_cast<size_t>(send_peer)]++;
                   out.emplace(*this, const_cast<float*>(send_data), send_count * sizeof(float));
                   post_send(*out, send_peer, make_slot(OpKind::p2p, seq, send_count, 0), 0,
                             send_count * sizeof(float));
                 }
                 if (recv_count > 0) {
                   const uint32_t seq = recv_seq_[static_cast<size_t>(recv_peer)]++;
                   in.emplace(*this, recv_data, recv_count * sizeof(float));
                   post_recv(*in, recv_peer, make_slot(OpKind::p2p, seq, recv_count, 0), 0,
                             recv_count * sizeof(float));
                 }
                 if (in) wait_recv(*in, recv_peer, d);
                 if (out) wait_send(*out, send_peer, d);
               });
  }

  Status barrier(Timeout timeout) override {
    return run("barrier", 0, timeout, /*collective=*/true, [&](const Deadline& d, uint32_t seq) {
      if (size_ == 1) return;
      // Dissemination: in round k every rank signals rank + 2^k and hears from rank - 2^k; after
      // ceil(log2 size) rounds each rank has (transitively) heard from all.
      Buf out(*this, &token_out_, sizeof token_out_);
      Buf in(*this, &token_in_, sizeof token_in_);
      uint32_t round = 0;
      for (int k = 1; k < size_; k <<= 1, ++round) {
        const uint64_t slot = make_slot(OpKind::barrier, seq, 0, round);
        const int to = mod(rank_ + k), from = mod(rank_ - k);
        post_recv(in, from, slot, 0, sizeof token_in_);
        post_send(out, to, slot, 0, sizeof token_out_);
        wait_recv(in, from, d);
        wait_send(out, to, d);
      }
    });
  }

 private:
  // An unbound buffer that abort() can reach while a wait on it is in progress.
  class Buf {
   public:
    Buf(GlooCommunicator& comm, void* ptr, size_t bytes) : comm_(comm) {
      ub_ = comm.context_->createUnboundBuffer(ptr, bytes);
      std::lock_guard<std::mutex> lock(comm.mu_);
      // Registered under the same lock abort() takes: either abort() sees this buffer, or we see the flag.
      if (comm.aborted_) throw OpError{"aborted"};
      comm.inflight_.insert(ub_.get());
    }
    ~Buf() {
      std::lock_guard<std::mutex> lock(comm_.mu_);
      comm_.inflight_.erase(ub_.get());
    }
    UnboundBuffer& operator*() { return *ub_; }
    UnboundBuffer* operator->() { return ub_.get(); }

   private:
    GlooCommunicator& comm_;
    std::unique_ptr<UnboundBuffer> ub_;
  };

  int mod(int x) const { return ((x % size_) + size_) % size_; }

  void check_ptr(const float* p, size_t n) const {
    if (n && !p) throw OpError{"invalid argument: null buffer for " + std::to_string(n) + " floats"};
  }
  void check_rank(int r, const char* what) const {
    if (r < 0 || r >= size_) {
      throw OpError{std::string("invalid argument: ") + what + " " + std::to_string(r) + " is not in [0, " +
                    std::to_string(size_) + ")"};
    }
  }

  // Posting fails at once when the pair already broke (the peer died since the last operation).
  void post_send(Buf& b, int peer, uint64_t slot, size_t offset, size_t bytes) {
    try {
      b->send(peer, slot, offset, bytes);
    } catch (const gloo::Exception& e) {
      throw OpError{cause_of(e.what(), " sending to rank " + std::to_string(peer))};
    }
  }
  void post_recv(Buf& b, int peer, uint64_t slot, size_t offset, size_t bytes) {
    try {
      b->recv(peer, slot, offset, bytes);
    } catch (const gloo::Exception& e) {
      throw OpError{cause_of(e.what(), " receiving from rank " + std::to_string(peer))};
    }
  }
  void wait_send(Buf& b, int peer, const Deadline& d) { wait(b, peer, d, /*is_send=*/true); }
  void wait_recv(Buf& b, int peer, const Deadline& d) { wait(b, peer, d, /*is_send=*/false); }

  void wait(Buf& b, int peer, const Deadline& d, bool is_send) {
    const std::string where = is_send ? " sending to rank " + std::to_string(peer)
                                      : " waiting for data from rank " + std::to_string(peer);
    auto left = d.left();
    if (left.count() == 0) {
      throw OpError{"timeout after " + std::to_string(d.timeout.count()) + " ms" + where, true};
    }
    bool done;
    try {
      done = is_send ? b->waitSend(nullptr, left) : b->waitRecv(nullptr, left);
    } catch (const gloo::Exception& e) {
      if (contains(e.what(), "Timed out")) {
        throw OpError{"timeout after " + std::to_string(d.timeout.count()) + " ms" + where, true};
      }
      throw OpError{cause_of(e.what(), where)};
    }
    if (!done) throw OpError{"aborted" + where};
  }

  std::string cause_of(const std::string& gloo_msg, const std::string& where) const {
    if (aborted_) return "aborted" + where;
    return classify(gloo_msg, where);
  }

  // One ring step: receive `rb_bytes` at `rb_off` of recv buffer from the left neighbour while sending
  // `sb_bytes` at `sb_off` of the send buffer to the right one. Empty blocks (count < size) are skipped
  // on both ends alike, since both compute the same comm_block.
  void exchange(Buf& sbuf, size_t sb_off, size_t sb_bytes, Buf& rbuf, size_t rb_off, size_t rb_bytes,
                uint64_t slot, const Deadline& d, const std::function<void()>& on_received = {}) {
    const int right = mod(rank_ + 1), left = mod(rank_ - 1);
    if (rb_bytes) post_recv(rbuf, left, slot, rb_off, rb_bytes);
    if (sb_bytes) post_send(sbuf, right, slot, sb_off, sb_bytes);
    if (rb_bytes) wait_recv(rbuf, left, d);
    if (on_received) on_received();  // reduce while our own send may still be draining
    if (sb_bytes) wait_send(sbuf, right, d);
  }

  std::vector<CommBlock> blocks(size_t count) const {
    std::vector<CommBlock> b(static_cast<size_t>(size_));
    for (int r = 0; r < size_; ++r) b[static_cast<size_t>(r)] = comm_block(count, size_, r);
    return b;
  }

  size_t max_block(size_t count) const { return comm_block(count, size_, 0).count; }

  // Ring reduce-scatter in place: in step s rank r sends block r-s-1 (accumulated so far) to r+1 and
  // adds block r-s-2 arriving from r-1 to its own; after size-1 steps block r holds the full sum.
  void ring_reduce_scatter_in_place(float* data, size_t count, uint32_t seq, const Deadline& d) {
    const auto b = blocks(count);
    scratch_.resize(max_block(count));
    Buf sbuf(*this, data, count * sizeof(float));
    Buf rbuf(*this, scratch_.data(), scratch_.size() * sizeof(float));
    for (int s = 0; s + 1 < size_; ++s) {
      const CommBlock sb = b[static_cast<size_t>(mod(rank_ - s - 1))];
      const CommBlock rb = b[static_cast<size_t>(mod(rank_ - s - 2))];
      exchange(sbuf, sb.offset * sizeof(float), sb.count * sizeof(float), rbuf, 0, rb.count * sizeof(float),
               make_slot(OpKind::all_reduce, seq, count, static_cast<uint32_t>(s)), d,
               [&] { add_into(data + rb.offset, data + rb.offset, scratch_.data(), rb.count); });
    }
  }

  // The same ring, leaving `in` untouched: partial sums alternate between two accumulators (one is being
  // sent while the other is filled). The last step writes straight into `out`. Same additions, same
  // order, as the in-place version: all_reduce == reduce_scatter + all_gather, bit for bit.
  void ring_reduce_scatter(const float* in, float* out, size_t count, uint32_t seq, const Deadline& d) {
    const auto b = blocks(count);
    const size_t m = max_block(count);
    scratch_.resize(m);
    acc_[0].resize(m);
    acc_[1].resize(m);
    Buf in_buf(*this, const_cast<float*>(in), count * sizeof(float));  // only read: it is a send buffer
    Buf acc0(*this, acc_[0].data(), m * sizeof(float));
    Buf acc1(*this, acc_[1].data(), m * sizeof(float));
    Buf rbuf(*this, scratch_.data(), m * sizeof(float));
    for (int s = 0; s + 1 < size_; ++s) {
      const CommBlock sb = b[static_cast<size_t>(mod(rank_ - s - 1))];
      const CommBlock rb = b[static_cast<size_t>(mod(rank_ - s - 2))];
      const bool last = s + 2 == size_;
      Buf& sbuf = s == 0 ? in_buf : ((s - 1) % 2 == 0 ? acc0 : acc1);
      const size_t sb_off = s == 0 ? sb.offset * sizeof(float) : 0;
      float* dst = last ? out : acc_[static_cast<size_t>(s % 2)].data();
      exchange(sbuf, sb_off, sb.count * sizeof(float), rbuf, 0, rb.count * sizeof(float),
               make_slot(OpKind::reduce_scatter, seq, count, static_cast<uint32_t>(s)), d,
               [&] { add_into(dst, in + rb.offset, scratch_.data(), rb.count); });
    }
  }

  // Ring all-gather in place: rank r holds block r; in step s it passes block r-s on and receives block
  // r-s-1. `step0` keeps all_reduce's second half on slots distinct from its first.
  void ring_all_gather_in_place(float* data, size_t count, uint32_t seq, uint32_t step0, OpKind kind,
                                const Deadline& d) {
    const auto b = blocks(count);
    Buf sbuf(*this, data, count * sizeof(float));
    Buf rbuf(*this, data, count * sizeof(float));
    for (int s = 0; s + 1 < size_; ++s) {
      const CommBlock sb = b[static_cast<size_t>(mod(rank_ - s))];
      const CommBlock rb = b[static_cast<size_t>(mod(rank_ - s - 1))];
      exchange(sbuf, sb.offset * sizeof(float), sb.count * sizeof(float), rbuf, rb.offset * sizeof(float),
               rb.count * sizeof(float), make_slot(kind, seq, count, step0 + static_cast<uint32_t>(s)), d);
    }
  }

  // Every operation: refuse if broken, run the body under a deadline, and on any failure mark the
  // communicator broken and close its connections so the peers' operations fail promptly too.
  template <class Body>
  Status run(const char* op, size_t count, Timeout timeout, bool collective, Body&& body) {
    const std::string prefix = comm_error_prefix("gloo", op, rank_, size_, count);
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (!broken_.empty()) return Status::error(prefix + comm_unusable_text(aborted_, broken_));
      in_op_ = true;
    }
    const Deadline d{Clock::now() + timeout, timeout};
    // Only collectives take a sequence number: every rank calls them, in the same order. Point-to-point
    // calls involve two ranks and are numbered per peer instead (send_seq_/recv_seq_).
    const uint32_t seq = collective ? seq_++ : 0;
    if (collective) {
      recorder_.enter(entered_.fetch_add(1) + 1, op, count * sizeof(float));
      inside_.store(true);
    }
    std::string cause;
    bool timed_out = false;
    try {
      body(d, seq);
    } catch (const OpError& e) {
      cause = e.cause;
      timed_out = e.timeout;
    } catch (const gloo::Exception& e) {
      cause = cause_of(e.what(), "");
    } catch (const std::exception& e) {
      cause = std::string("internal error: ") + e.what();
    }
    std::lock_guard<std::mutex> lock(mu_);
    in_op_ = false;
    inside_.store(false);
    if (timed_out && broken_.empty()) timed_out_.store(true);
    if (aborted_ && (cause.empty() || !contains(cause, "aborted"))) {
      // abort() raced with a finishing operation: report it as aborted, as the caller asked.
      cause = cause.empty() ? "aborted" : "aborted (" + cause + ")";
    }
    if (collective) recorder_.leave(cause.empty());
    if (cause.empty()) return Status();
    const std::string message = prefix + cause;
    if (broken_.empty() || broken_ == "aborted") broken_ = message;
    if (!closed_) close_connections_locked();
    return Status::error(message);
  }

  void close_connections_locked() {
    closed_ = true;
    try {
      context_->closeConnections();
    } catch (const std::exception&) {
      // Closing is best effort: a pair Gloo already tore down after an error may refuse.
    }
  }

  const int rank_;
  const int size_;
  std::shared_ptr<gloo::transport::Device> device_;
  std::shared_ptr<gloo::rendezvous::Context> context_;

  // Operation state: only the operation thread touches these.
  uint32_t seq_ = 0;
  std::vector<uint32_t> send_seq_, recv_seq_;  // per peer, for send/recv matching
  std::vector<float> scratch_;
  std::vector<float> acc_[2];
  uint8_t token_out_ = 1, token_in_ = 0;

  // Shared with abort(), which may run on any thread.
  mutable std::mutex mu_;
  std::set<UnboundBuffer*> inflight_;
  std::atomic<bool> aborted_{false};  // also read without the lock, to label a failure's cause
  // progress(), for the heartbeat thread.
  std::atomic<uint64_t> entered_{0};
  FlightRecorder recorder_;  // the last collectives, for a hang's report (the heartbeat carries it)
  std::atomic<bool> inside_{false};
  std::atomic<bool> timed_out_{false};
  bool in_op_ = false;
  bool closed_ = false;
  std::string broken_;
};

void ignore_sigpipe_once() {
  static std::once_flag once;
  std::call_once(once, [] {
    struct sigaction current;
    if (::sigaction(SIGPIPE, nullptr, &current) == 0 && current.sa_handler == SIG_DFL) {
      struct sigaction ign = {};
      ign.sa_handler = SIG_IGN;
      sigemptyset(&ign.sa_mask);
      ::sigaction(SIGPIPE, &ign, nullptr);
    }
  });
}

}  // namespace

Result<std::unique_ptr<Communicator>> gloo_communicator_create(int rank, int size, int store_fd,
                                                               std::string prefix,
                                                               std::chrono::milliseconds timeout,
                                                               GlooCommOptions options) {
  const std::string where =
      "gloo create (rank " + std::to_string(rank) + " of " + std::to_string(size) + "): ";
  // all_reduce uses 2(size-1) ring steps in a 16-bit step field; Gloo's full mesh is also unfit far earlier.
  if (size < 1 || size > 16384) return Status::error(where + "size must be in [1, 16384]");
  if (rank < 0 || rank >= size) return Status::error(where + "rank must be in [0, size)");
  if (timeout.count() <= 0) return Status::error(where + "timeout must be positive");
  ignore_sigpipe_once();
  StoreClient client(store_fd);
  try {
    gloo::transport::tcp::attr attr;
    attr.hostname = options.hostname;
    std::shared_ptr<gloo::transport::Device> device = gloo::transport::tcp::CreateDevice(attr);
    auto context = std::make_shared<gloo::rendezvous::Context>(rank, size);
    context->setTimeout(timeout);
    GlooStore store(client, std::move(prefix), timeout);
    context->connectFullMesh(store, device);
    return std::unique_ptr<Communicator>(
        new GlooCommunicator(rank, size, std::move(device), std::move(context)));
  } catch (const gloo::Exception& e) {
    const std::string msg = e.what();
    // Store failures arrive here as the IoException GlooStore threw, our message inside Gloo's framing.
    if (contains(msg, "store ")) return Status::error(where + "rendezvous failed: " + msg);
    return Status::error(where + classify(msg, " connecting the full mesh"));
  } catch (const std::exception& e) {
    return Status::error(where + "internal error: " + e.what());
  }
}

}  // namespace gantry
