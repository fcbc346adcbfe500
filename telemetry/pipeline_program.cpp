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

double unit_cost(PipelineOp op) {
  return op == PipelineOp::kBackward ? 2.0 : 1.0;
}

Simulation simulate(PipelineSchedule s, int pp, int vp, int m) {
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
    const double end = pick_start + unit_cost(a.op);
    sim.start[pick].push_back(pick_start);
    sim.busy[pick] += unit_cost(a.op);
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

std::vector<PipelineStep> pipeline_program(PipelineSchedule s, int pp, int vp, int stage, int m) {
  const Simulation sim = simulate(s, pp, vp, m);
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

double pipeline_simulated_bubble(PipelineSchedule s, int pp, int vp, int m) {
  const Simulation sim = simulate(s, pp, vp, m);
  double idle = 0;
  for (double b : sim.busy) idle = std::max(idle, sim.makespan - b);
  return sim.makespan > 0 ? idle / sim.makespan : 0.0;
}

PipelineTiming pipeline_program_timing(PipelineSchedule s, int pp, int vp, int m,
                                       const PipelineCosts& costs) {
  const size_t stages = static_cast<size_t>(pp) * vp;
  const bool split = s == PipelineSchedule::kZeroBubbleH1;
  for (const std::vector<double>* v : {&costs.forward, split ? &costs.input : &costs.backward}) {
    if (v->size() != stages) throw std::invalid_argument("pipeline_program_timing: a cost per virtual stage");
  }
  if (split && costs.weight.size() != stages) {
    throw std::invalid_argument("pipeline_program_timing: ZB-H1 needs weight costs per virtual stage");
  }
  std::vector<std::vector<PipelineStep>> prog(pp);
  for (int r = 0; r < pp; ++r) prog[r] = pipeline_program(s, pp, vp, r, m);
  PipelineTiming t;
  t.busy.assign(pp, 0.0);
  t.waits.assign(pp, 0.0);
  std::vector<size_t> at(pp, 0);
  std::vector<double> clock(pp, 0.0);
  auto compute_cost = [&](int r, const PipelineAction& a) {
    const size_t v = static_cast<size_t>(a.chunk) * pp + r;
    switch (a.op) {
      case PipelineOp::kForward:
        return costs.forward[v];
      case PipelineOp::kBackward:
        return costs.backward[v];
      case PipelineOp::kInput:
        return costs.input[v];
      case PipelineOp::kWeight:
        return costs.weight[v];
    }
    return 0.0;
  };
  // Each rank runs until it reaches a receive whose message has not been sent yet.
  std::map<std::tuple<int, int, bool, int, int>, double> arrives;  // (from, to, grad, micro, chunk): when
  for (bool moved = true; moved;) {
    moved = false;
    for (int r = 0; r < pp; ++r) {
      for (; at[r] < prog[r].size(); ++at[r], moved = true) {
        const PipelineStep& x = prog[r][at[r]];
        if (x.kind == PipelineStep::Kind::kCompute) {
          const double c = compute_cost(r, x.action);
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
