#include "engine/core/worker/hang_blame.h"

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <sstream>

namespace gantry {
namespace {

std::string seconds_text(std::chrono::milliseconds ms) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f s", static_cast<double>(ms.count()) / 1e3);
  return buf;
}

// What its newest heartbeat said, so the operator sees where the rank was when it went quiet.
std::string last_words(const RankWatch& w) {
  if (!w.has_heartbeat) return "it sent no heartbeat";
  return "its last heartbeat, " + seconds_text(w.silent_for) + " before the gang failed, was at " +
         hang_where(w.last);
}

bool silent(const RankWatch& w) {
  if (!w.running || !w.has_heartbeat || w.last.interval_ms == 0) return false;
  const auto interval = std::chrono::milliseconds(w.last.interval_ms);
  const auto half_timeout = std::chrono::milliseconds(w.last.timeout_ms / 2);
  return w.silent_for > std::max(3 * interval, half_timeout);
}

}  // namespace

std::vector<HangCulprit> hang_blame(const std::vector<RankWatch>& ranks) {
  std::vector<HangCulprit> out;
  for (const RankWatch& w : ranks) {
    if (w.running && (w.process_state == 'T' || w.process_state == 't')) {
      out.push_back({w.rank, std::string("its process is stopped (state ") + w.process_state + " in /proc/" +
                                 std::to_string(w.pid) + "/stat: SIGSTOP or a debugger); " + last_words(w)});
    }
  }
  if (out.empty()) {
    for (const RankWatch& w : ranks) {
      if (silent(w)) out.push_back({w.rank, "its heartbeats stopped; " + last_words(w)});
    }
  }
  if (out.empty()) {
    // The collective the others gave up on: the newest one a timed-out rank was in.
    uint64_t waited_in = 0;
    for (const RankWatch& w : ranks) {
      if (w.has_heartbeat && w.last.timed_out) waited_in = std::max(waited_in, w.last.collectives);
    }
    for (const RankWatch& w : ranks) {
      if (waited_in == 0 || !w.has_heartbeat || w.last.collectives >= waited_in) continue;
      out.push_back({w.rank, "it never entered collective #" + std::to_string(waited_in) +
                                 ", which the others waited in; " + last_words(w)});
    }
  }
  std::sort(out.begin(), out.end(),
            [](const HangCulprit& a, const HangCulprit& b) { return a.rank < b.rank; });
  return out;
}

std::string hang_where(const WorkerHeartbeat& h) {
  std::string where = "step " + std::to_string(h.step) + " (" + train_phase_name(h.phase) + ")";
  if (h.collectives > 0) {
    where += h.in_collective ? ", inside collective #" + std::to_string(h.collectives)
                             : ", after collective #" + std::to_string(h.collectives);
    // The flight recorder's newest entry is that collective: its operation and size.
    if (!h.recent.empty() && h.recent.back().seq == h.collectives) {
      where += " (" + h.recent.back().op + ", " + std::to_string(h.recent.back().bytes) + " bytes)";
    }
  }
  return where;
}

char hang_process_state(int64_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/stat");
  std::stringstream ss;
  ss << in.rdbuf();
  const std::string stat = ss.str();
  // "pid (comm) S ...": the name may hold spaces and parentheses, so the state follows the last ')'.
  const size_t close = stat.rfind(')');
  if (close == std::string::npos || close + 2 >= stat.size()) return 0;
  return stat[close + 2];
}

}  // namespace gantry
