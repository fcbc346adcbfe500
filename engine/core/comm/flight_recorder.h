// A flight recorder of a rank's collectives: the last N (32) it entered, each with its sequence number,
// operation, size and when it was entered and left. The worker's heartbeat carries a snapshot to its
// launcher, so when a rank hangs the launcher can dump what that rank (and its node's peers) were doing
// into the run's `hang` event: the rank stuck inside #41 all_reduce while its peers left #40 and wait in #41.
//
//   FlightRecorder fr;                      // one per communicator
//   fr.enter(seq, "all_reduce", 4 * count); // as the collective begins (seq: CommProgress::entered)
//   ... the collective ...
//   fr.leave(status.ok());
//   std::vector<CollectiveRecord> last = fr.snapshot();  // any thread, oldest first
#pragma once

#include <cstdint>
#include <mutex>
#include <string>
#include <vector>

namespace gantry {

struct CollectiveRecord {
  uint64_t seq = 0;  // 1-based: the collective's number on this communicator (every rank numbers alike)
  std::string op;    // "all_reduce", "reduce_scatter", "all_gather", "broadcast", "barrier"
  uint64_t bytes = 0;
  int64_t entered_unix_ms = 0;
  int64_t left_unix_ms = 0;  // 0: still inside
  bool ok = true;            // false: it failed (a timeout, a peer gone, an abort)
};

class FlightRecorder {
 public:
  static constexpr size_t kDefaultCapacity = 32;
  explicit FlightRecorder(size_t capacity = kDefaultCapacity);

  // `op` must outlive the recorder (a string literal): entering costs no allocation.
  void enter(uint64_t seq, const char* op, uint64_t bytes);
  // Closes the newest entry; no effect when nothing is open.
  void leave(bool ok);
  std::vector<CollectiveRecord> snapshot() const;

 private:
  struct Entry {
    uint64_t seq = 0;
    const char* op = "";
    uint64_t bytes = 0;
    int64_t entered_unix_ms = 0;
    int64_t left_unix_ms = 0;
    bool ok = true;
  };
  mutable std::mutex mu_;
  std::vector<Entry> ring_;
  size_t next_ = 0;   // where the next entry goes
  size_t count_ = 0;  // entries held, up to the capacity
  bool open_ = false;
};

}  // namespace gantry
