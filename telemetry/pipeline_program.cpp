#include "telemetry/pipeline_program.h"

#include <algorithm>
#include <map>
#include <stdexcept>
#include <tuple>

namespace gantry {

const char* pipeline_schedule_name(PipelineSchedule s) {
  switch (s) {
    case PipelineSchedule::kGpipe:
      return "gpipe";
    case PipelineSchedule::kOneFOneB:
      return "1f1b";
    case PipelineSchedule::kInterleaved:
      return "interleaved";
    case PipelineSchedule::kZeroBubbleH1:
      return "zbh1";
  }
  return "?";
}

bool pipeline_schedule_from_name(const std::string& name, PipelineSchedule* out) {
  if (name == "gpipe") {
    *out = PipelineSchedule::kGpipe;
    return true;
  }
  if (name == "1f1b") {
    *out = PipelineSchedule::kOneFOneB;
    return true;
  }
  if (name == "interleaved") {
    *out = PipelineSchedule::kInterleaved;
    return true;
  }
  if (name == "zbh1") {
    *out = PipelineSchedule::kZeroBubbleH1;
    return true;
  }
  return false;
}

std::vector<PipelineAction> pipeline_actions(PipelineSchedule s, int pp, int stage, int m, int vp) {
  std::vector<PipelineAction> a;
  auto add = [&](PipelineOp op, int micro, int chunk = 0) { a.push_back({op, micro, chunk}); };
  if (s == PipelineSchedule::kGpipe) {
    for (int i = 0; i < m; ++i) add(PipelineOp::kForward, i);
    for (int i = 0; i < m; ++i) add(PipelineOp::kBackward, i);
    return a;
  }
  if (s == PipelineSchedule::kInterleaved) {
    // Megatron's interleaved 1F1B: the k-th forward of a rank is chunk (k / pp) mod vp of micro-batch
    // (k / (pp·vp))·pp + k mod pp, so pp micro-batches pass through one chunk before the next chunk starts
    // (m a multiple of pp, pipeline_check); the k-th backward walks the chunks from the last. The warm-up
    // fills the pipe of pp·vp virtual stages: 2(pp − stage − 1) + (vp − 1)·pp forwards.
    const int total = m * vp;
    auto micro_of = [&](int k) { return (k / (pp * vp)) * pp + k % pp; };
    auto fwd = [&](int k) { add(PipelineOp::kForward, micro_of(k), (k / pp) % vp); };
    auto bwd = [&](int k) { add(PipelineOp::kBackward, micro_of(k), vp - 1 - (k / pp) % vp); };
    const int warmup = std::min(2 * (pp - stage - 1) + (vp - 1) * pp, total);
    int f = 0, b = 0;
    for (; f < warmup; ++f) fwd(f);
    while (f < total) {
      fwd(f++);
      bwd(b++);
    }
    while (b < total) bwd(b++);
    return a;
  }
  // 1F1B: the stage runs ahead by the forwards its successors need to fill the pipe, then alternates.
  const int warmup = std::min(pp - stage - 1, m);
  int f = 0, b = 0, w = 0;
  for (; f < warmup; ++f) add(PipelineOp::kForward, f);
  if (s == PipelineSchedule::kZeroBubbleH1) {
    // ZB-H1: the same warm-up; then F, B (input gradient) and W (weight gradient), stage i deferring its
    // first i W's, which keeps at most pp activations on every stage (1F1B's peak, on stage 0); the
    // cool-down's waits for the next B are filled with the deferred W's.
    for (int k = 0; f < m; ++k) {
      add(PipelineOp::kForward, f++);
      add(PipelineOp::kInput, b++);
      if (k >= stage) add(PipelineOp::kWeight, w++);
    }
    while (b < m) {
      add(PipelineOp::kInput, b++);
      add(PipelineOp::kWeight, w++);
    }
    while (w < m) add(PipelineOp::kWeight, w++);
    return a;
  }
  while (f < m) {
    add(PipelineOp::kForward, f++);
    add(PipelineOp::kBackward, b++);
  }
  while (b < m) add(PipelineOp::kBackward, b++);
  return a;
}

int pipeline_in_flight(const std::vector<PipelineAction>& actions) {
  int now = 0, most = 0;
  for (const PipelineAction& x : actions) {
    if (x.op == PipelineOp::kForward) ++now;
    if (x.op == PipelineOp::kBackward || x.op == PipelineOp::kWeight) --now;
    most = std::max(most, now);
  }
  return most;
}

namespace {

// The whole pipeline's step under unit costs: every rank's actions with their start times, and the
// messages with the time they can be taken (their producer's finish). Each round starts the action that
// can start earliest over all ranks (ties: the lower rank), so the result is the same on every rank.
struct Simulation {
  std::vector<std::vector<PipelineAction>> actions;  // [rank]
  std::vector<std::vector<double>> start;            // [rank][action]
  struct Message {
    double time;
    int seq;  // order of production: ties in time keep it
    int from, to;
    bool grad;
    int micro, from_chunk, to_chunk;
  };
  std::vector<Message> messages;
  double makespan = 0;
  std::vector<double> busy;
};

// A pass's cost for the placement: the given per-virtual-stage costs, or units (a whole backward 2, any
// other pass 1).
double pass_cost(const PipelineCosts* costs, int pp, int rank, const PipelineAction& a) {
  if (costs == nullptr) return a.op == PipelineOp::kBackward ? 2.0 : 1.0;
  const size_t v = static_cast<size_t>(a.chunk) * pp + rank;
  switch (a.op) {
    case PipelineOp::kForward:
      return costs->forward[v];
    case PipelineOp::kBackward:
      return costs->backward[v];
    case PipelineOp::kInput:
      return costs->input[v];
    case PipelineOp::kWeight:
      return costs->weight[v];
  }
  return 0.0;
}

Simulation simulate(PipelineSchedule s, int pp, int vp, int m, const PipelineCosts* costs) {
  Simulation sim;
  const int stages = pp * vp;
  sim.actions.resize(pp);
  sim.start.resize(pp);
  sim.busy.assign(pp, 0.0);
  for (int r = 0; r < pp; ++r) sim.actions[r] = pipeline_actions(s, pp, r, m, vp);
  // done_f[stage][micro], done_b[stage][micro]: when the activation / input gradient left that stage.
  const double never = -1;
  std::vector<std::vector<double>> done_f(stages, std::vector<double>(m, never)), done_b = done_f;
  std::vector<size_t> next(pp, 0);
  std::vector<double> clock(pp, 0.0);
  for (;;) {
    int pick = -1;
    double pick_start = 0;
    bool left = false;
    for (int r = 0; r < pp; ++r) {
      if (next[r] >= sim.actions[r].size()) continue;
      left = true;
      const PipelineAction& a = sim.actions[r][next[r]];
      const int v = a.chunk * pp + r;
      double ready = clock[r];
      if (a.op == PipelineOp::kForward && v > 0) {
        if (done_f[v - 1][a.micro] == never) continue;
        ready = std::max(ready, done_f[v - 1][a.micro]);
      }
      if ((a.op == PipelineOp::kBackward || a.op == PipelineOp::kInput) && v < stages - 1) {
        if (done_b[v + 1][a.micro] == never) continue;
        ready = std::max(ready, done_b[v + 1][a.micro]);
      }
      if (pick < 0 || ready < pick_start) pick = r, pick_start = ready;
    }
    if (!left) break;
    // No rank can go on: the schedule's own orders are inconsistent (a bug here, never the input's).
    if (pick < 0) {
      throw std::logic_error(std::string("pipeline schedule ") + pipeline_schedule_name(s) + " (pp " +
                             std::to_string(pp) + ", vp " + std::to_string(vp) + ", m " + std::to_string(m) +
                             ") deadlocks");
    }
    const PipelineAction& a = sim.actions[pick][next[pick]];
    const int v = a.chunk * pp + pick;
    const double cost = pass_cost(costs, pp, pick, a);
    const double end = pick_start + cost;
    sim.start[pick].push_back(pick_start);
    sim.busy[pick] += cost;
    clock[pick] = end;
    ++next[pick];
    const int seq = static_cast<int>(sim.messages.size());
    if (a.op == PipelineOp::kForward) {
      done_f[v][a.micro] = end;
      if (v < stages - 1)
        sim.messages.push_back({end, seq, pick, (v + 1) % pp, false, a.micro, a.chunk, (v + 1) / pp});
    } else if (a.op != PipelineOp::kWeight) {
      done_b[v][a.micro] = end;
      if (v > 0) sim.messages.push_back({end, seq, pick, (v - 1) % pp, true, a.micro, a.chunk, (v - 1) / pp});
    }
    sim.makespan = std::max(sim.makespan, end);
  }
  std::stable_sort(sim.messages.begin(), sim.messages.end(), [](const auto& x, const auto& y) {
    return x.time < y.time || (x.time == y.time && x.seq < y.seq);
  });
  return sim;
}

}  // namespace

namespace {

void check_costs(PipelineSchedule s, int pp, int vp, const PipelineCosts& costs) {
  const size_t stages = static_cast<size_t>(pp) * vp;
  const bool split = s == PipelineSchedule::kZeroBubbleH1;
  for (const std::vector<double>* v : {&costs.forward, split ? &costs.input : &costs.backward}) {
    if (v->size() != stages) throw std::invalid_argument("pipeline costs: one per virtual stage");
  }
  if (split && costs.weight.size() != stages) {
    throw std::invalid_argument("pipeline costs: ZB-H1 needs weight costs per virtual stage");
  }
}

}  // namespace

std::vector<PipelineStep> pipeline_program(PipelineSchedule s, int pp, int vp, int stage, int m,
                                           const PipelineCosts* place) {
  if (place != nullptr) check_costs(s, pp, vp, *place);
  const Simulation sim = simulate(s, pp, vp, m, place);
  const std::vector<PipelineAction>& acts = sim.actions[stage];
  std::vector<PipelineStep> out;
  size_t k = 0;
  // Before each action, this rank's messages that can be taken by its start (its inputs among them: they
  // were produced before it started); the rest after the last action.
  auto flush = [&](double until, bool all) {
    for (; k < sim.messages.size(); ++k) {
      const Simulation::Message& x = sim.messages[k];
      if (!all && x.time > until) break;
      if (x.from == stage)
        out.push_back(
            {PipelineStep::Kind::kSend, {PipelineOp::kForward, x.micro, x.from_chunk}, x.grad, x.to});
      else if (x.to == stage)
        out.push_back(
            {PipelineStep::Kind::kRecv, {PipelineOp::kForward, x.micro, x.to_chunk}, x.grad, x.from});
    }
  };
  for (size_t i = 0; i < acts.size(); ++i) {
    flush(sim.start[stage][i], false);
    out.push_back({PipelineStep::Kind::kCompute, acts[i], false, -1});
  }
  flush(0, true);
  return out;
}

std::vector<int> pipeline_program_slots(const std::vector<PipelineStep>& program, int stage, int vp, int m,
                                        bool split) {
  std::vector<std::vector<bool>> busy(static_cast<size_t>(vp));
  std::vector<std::vector<int>> slot_of(static_cast<size_t>(vp),
                                        std::vector<int>(static_cast<size_t>(m), -1));
  auto acquire = [&](size_t c, size_t k) {
    std::vector<bool>& b = busy[c];
    size_t i = 0;
    while (i < b.size() && b[i]) ++i;
    if (i == b.size()) b.push_back(false);
    b[i] = true;
    slot_of[c][k] = static_cast<int>(i);
  };
  auto release = [&](size_t c, size_t k) {
    if (slot_of[c][k] >= 0) busy[c][static_cast<size_t>(slot_of[c][k])] = false;
  };
  for (const PipelineStep& st : program) {
    const size_t k = static_cast<size_t>(st.action.micro), c = static_cast<size_t>(st.action.chunk);
    if (st.kind == PipelineStep::Kind::kRecv) {
      if (!st.grad) acquire(c, k);
    } else if (st.kind == PipelineStep::Kind::kSend) {
      if (st.grad && !split) release(c, k);
    } else if (st.action.op == PipelineOp::kForward) {
      if (slot_of[c][k] < 0) acquire(c, k);
    } else if (st.action.op == PipelineOp::kWeight) {
      release(c, k);
    } else if (stage == 0 && c == 0 && !split) {  // the model's first chunk sends no gradient up
      release(c, k);
    }
  }
  std::vector<int> slots;
  for (const std::vector<bool>& b : busy) slots.push_back(static_cast<int>(b.size()));
  return slots;
}

bool pipeline_placement_keeps_slots(PipelineSchedule s, int pp, int vp, int m, const PipelineCosts& costs) {
  const bool split = s == PipelineSchedule::kZeroBubbleH1;
  for (int r = 0; r < pp; ++r) {
    const std::vector<int> units = pipeline_program_slots(pipeline_program(s, pp, vp, r, m), r, vp, m, split);
    const std::vector<int> placed =
        pipeline_program_slots(pipeline_program(s, pp, vp, r, m, &costs), r, vp, m, split);
    for (size_t c = 0; c < units.size(); ++c) {
      if (placed[c] > units[c]) return false;
    }
  }
  return true;
}

double pipeline_simulated_bubble(PipelineSchedule s, int pp, int vp, int m) {
  const Simulation sim = simulate(s, pp, vp, m, nullptr);
  double idle = 0;
  for (double b : sim.busy) idle = std::max(idle, sim.makespan - b);
  return sim.makespan > 0 ? idle / sim.makespan : 0.0;
}

PipelineTiming pipeline_program_timing(PipelineSchedule s, int pp, int vp, int m, const PipelineCosts& costs,
                                       bool place_by_costs) {
  check_costs(s, pp, vp, costs);
  std::vector<std::vector<PipelineStep>> prog(pp);
  for (int r = 0; r < pp; ++r) prog[r] = pipeline_program(s, pp, vp, r, m, place_by_costs ? &costs : nullptr);
  PipelineTiming t;
  t.busy.assign(pp, 0.0);
  t.waits.assign(pp, 0.0);
  std::vector<size_t> at(pp, 0);
  std::vector<double> clock(pp, 0.0);
  // Each rank runs until it reaches a receive whose message has not been sent yet.
  std::map<std::tuple<int, int, bool, int, int>, double> arrives;  // (from, to, grad, micro, chunk): when
  for (bool moved = true; moved;) {
    moved = false;
    for (int r = 0; r < pp; ++r) {
      for (; at[r] < prog[r].size(); ++at[r], moved = true) {
        const PipelineStep& x = prog[r][at[r]];
        if (x.kind == PipelineStep::Kind::kCompute) {
          const double c = pass_cost(&costs, pp, r, x.action);
          clock[r] += c;
          t.busy[r] += c;
        } else if (x.kind == PipelineStep::Kind::kSend) {
          clock[r] += costs.transfer_s;
          t.waits[r] += costs.transfer_s;
          // The receiver names the chunk it feeds: the next virtual stage's (activation) or the one before.
          const int v = x.action.chunk * pp + r, to = x.grad ? v - 1 : v + 1;
          arrives[{r, x.peer, x.grad, x.action.micro, to / pp}] = clock[r];
        } else {
          const auto it = arrives.find({x.peer, r, x.grad, x.action.micro, x.action.chunk});
          if (it == arrives.end()) break;
          const double ready = std::max(clock[r], it->second);
          t.waits[r] += ready - clock[r];
          clock[r] = ready;
        }
      }
    }
  }
  for (int r = 0; r < pp; ++r) {
    if (at[r] != prog[r].size()) {
      throw std::logic_error(std::string("pipeline schedule ") + pipeline_schedule_name(s) +
                             ": a receive whose message never comes (rank " + std::to_string(r) + ")");
    }
    t.makespan = std::max(t.makespan, clock[r]);
  }
  return t;
}

}  // namespace gantry
