// The coordinator's ledger of in-memory copies (train.memory_copy_every; engine/core/memory_copy.h): which
// node agents hold which rank's state of which run at which step, from their heartbeats; the copies each
// node should take from the node before it in the run's ring; and, at a recovery, whether to restore from
// the newest complete set in memory or from the newest committed checkpoint on disk. Pure bookkeeping,
// standard library only, so it is tested on its own.
//
//   MemoryCopyTable t;
//   t.report("node-1", {{.run = 7, .rank = 0, .step = 20, .world = 2}, ...});   // each beat, whole
//   t.forget_node("node-1");                                                   // its agent is lost
//   RestoreChoice c = restore_choose(t.newest_complete(7, INT64_MAX), disk_step);
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

namespace gantry {

// One rank's committed copy of one step on a node (its own rank's, or one it took from a peer).
struct MemoryCopyHeld {
  int64_t run = 0;
  int rank = 0;
  int64_t step = 0;
  int world = 0;  // the world that wrote it: a set is complete with ranks 0..world-1
  bool operator==(const MemoryCopyHeld&) const = default;
};

// A complete set: every rank of the writing world at one step, and the nodes holding each rank's copy.
struct MemoryCopySet {
  int64_t step = -1;
  int world = 0;
  std::map<int, std::vector<std::string>> holders;  // rank -> nodes, in name order
};

// One copy a node should take from another (the ring's next node from the rank's own node).
struct MemoryCopyPull {
  std::string to, from;
  int64_t run = 0;
  int rank = 0;
  int64_t step = 0;
  bool operator==(const MemoryCopyPull&) const = default;
};

class MemoryCopyTable {
 public:
  // What `node` holds now, replacing what it said before.
  void report(const std::string& node, std::vector<MemoryCopyHeld> held);
  // A lost node's copies are gone with its agent.
  void forget_node(const std::string& node);
  // The newest step <= max_step of `run` at which every rank of its world has a copy on some node;
  // nullopt when there is none.
  std::optional<MemoryCopySet> newest_complete(int64_t run, int64_t max_step) const;
  // Every step of `run` held anywhere, newest first, complete or not (for the views).
  std::vector<MemoryCopySet> all(int64_t run) const;
  // The copies the ring still lacks: each rank's newest copy on its own node (rank_node: where the run's
  // current placement puts it), wanted on the next node of `ring` (the run's nodes in placement order,
  // wrapping round). A ring of one node has no peer: nothing to pull.
  std::vector<MemoryCopyPull> pulls(int64_t run, const std::vector<std::string>& ring,
                                    const std::map<int, std::string>& rank_node) const;
  // The runs `node` holds copies of.
  std::vector<int64_t> runs_on(const std::string& node) const;

 private:
  std::map<std::string, std::vector<MemoryCopyHeld>> by_node_;
};

enum class RestoreSource { kMemory, kDisk, kStart };
const char* restore_source_name(RestoreSource s);  // "memory", "disk", "start"

struct RestoreChoice {
  RestoreSource source = RestoreSource::kStart;
  int64_t step = 0;
  std::string why;  // one line for the event: why this source and not the other
};
// Memory when a complete set is newer than the newest committed disk checkpoint (disk_step -1: none),
// else disk, else the start. newest_seen: the newest step held in memory at all (-1: none), to say why an
// incomplete newer set was passed over.
RestoreChoice restore_choose(const std::optional<MemoryCopySet>& memory, int64_t disk_step,
                             int64_t newest_seen);

}  // namespace gantry
