#include "engine/core/worker/worker_frames.h"

#include <bit>  // std::bit_cast: doubles travel as their bits

#include "engine/core/comm/store_protocol.h"  // StoreWriter / StoreReader: little-endian fields

namespace gantry {
namespace {

Status bad(const char* what, size_t size) {
  return Status::error(std::string(what) + " frame of " + std::to_string(size) +
                       " bytes is malformed (a field runs past its end or bytes are left over)");
}

}  // namespace

std::vector<uint8_t> worker_hello_encode(const WorkerHello& h) {
  StoreWriter w;
  w.u32(static_cast<uint32_t>(h.rank));
  w.u32(static_cast<uint32_t>(h.world));
  w.u32(static_cast<uint32_t>(h.local_rank));
  w.u32(static_cast<uint32_t>(h.pid));
  w.u32(static_cast<uint32_t>(h.device));
  w.str(h.host);
  return std::move(w.out());
}

Result<WorkerHello> worker_hello_decode(std::span<const uint8_t> payload) {
  StoreReader in(payload.data(), payload.size());
  WorkerHello h;
  h.rank = static_cast<int>(in.u32());
  h.world = static_cast<int>(in.u32());
  h.local_rank = static_cast<int>(in.u32());
  h.pid = static_cast<int64_t>(in.u32());
  h.device = static_cast<int32_t>(in.u32());
  h.host = in.str();
  if (!in.ok() || in.left() != 0) return bad("worker_hello", payload.size());
  return h;
}

std::vector<uint8_t> worker_exit_encode(const WorkerExit& e) {
  StoreWriter w;
  w.u32(static_cast<uint32_t>(e.code));
  w.bytes(e.message.data(), e.message.size());
  return std::move(w.out());
}

Result<WorkerExit> worker_exit_decode(std::span<const uint8_t> payload) {
  StoreReader in(payload.data(), payload.size());
  WorkerExit e;
  e.code = static_cast<int>(in.u32());
  std::vector<uint8_t> msg = in.rest();
  if (!in.ok()) return bad("worker_exit", payload.size());
  e.message.assign(msg.begin(), msg.end());
  return e;
}

std::vector<uint8_t> worker_run_encode(const WorkerRun& r) {
  StoreWriter w;
  w.str(r.summary);
  w.str(r.config_toml);
  w.str(r.code_version);
  w.str(r.data_version);
  w.str(r.backend);
  w.u64(r.params);
  w.str(r.peak_name);
  w.u64(std::bit_cast<uint64_t>(r.peak_flops));
  w.u64(std::bit_cast<uint64_t>(r.flops_per_token));
  w.str(r.mfu_formula);
  return std::move(w.out());
}

Result<WorkerRun> worker_run_decode(std::span<const uint8_t> payload) {
  StoreReader in(payload.data(), payload.size());
  WorkerRun r;
  r.summary = in.str();
  r.config_toml = in.str();
  r.code_version = in.str();
  r.data_version = in.str();
  r.backend = in.str();
  r.params = in.u64();
  r.peak_name = in.str();
  r.peak_flops = std::bit_cast<double>(in.u64());
  r.flops_per_token = std::bit_cast<double>(in.u64());
  r.mfu_formula = in.str();
  if (!in.ok() || in.left() != 0) return bad("worker_run", payload.size());
  return r;
}

std::vector<uint8_t> worker_command_encode(const WorkerCommand& c) {
  StoreWriter w;
  w.u32(static_cast<uint32_t>(c.action));
  w.u64(c.id);
  w.str(c.from);
  return std::move(w.out());
}

Result<WorkerCommand> worker_command_decode(std::span<const uint8_t> payload) {
  StoreReader in(payload.data(), payload.size());
  WorkerCommand c;
  const uint32_t action = in.u32();
  c.id = in.u64();
  c.from = in.str();
  if (!in.ok() || in.left() != 0) return bad("worker_command", payload.size());
  if (action < static_cast<uint32_t>(TrainAction::checkpoint) ||
      action > static_cast<uint32_t>(TrainAction::stop)) {
    return Status::error("worker_command frame names action " + std::to_string(action) +
                         ": expected 1 (checkpoint), 2 (pause), 3 (resume) or 4 (stop)");
  }
  c.action = static_cast<TrainAction>(action);
  return c;
}

std::vector<uint8_t> worker_inject_encode(const WorkerInject& i) {
  StoreWriter w;
  w.u32(static_cast<uint32_t>(i.kind));
  w.u32(i.delay_ms);
  return std::move(w.out());
}

Result<WorkerInject> worker_inject_decode(std::span<const uint8_t> payload) {
  StoreReader in(payload.data(), payload.size());
  const uint32_t kind = in.u32();
  const uint32_t delay = in.u32();
  if (!in.ok() || in.left() != 0) return bad("worker_inject", payload.size());
  if (kind != 1 && kind != 2)
    return Status::error("worker_inject frame names fault " + std::to_string(kind) +
                         ": expected 1 (slow) or 2 (nan)");
  return WorkerInject{.kind = static_cast<WorkerInject::Kind>(kind), .delay_ms = delay};
}

std::vector<uint8_t> worker_heartbeat_encode(const WorkerHeartbeat& h) {
  StoreWriter w;
  w.u64(static_cast<uint64_t>(h.step));
  w.u32(static_cast<uint32_t>(h.phase));
  w.u64(h.collectives);
  w.u32((h.in_collective ? 1u : 0u) | (h.timed_out ? 2u : 0u));
  w.u32(h.interval_ms);
  w.u32(h.timeout_ms);
  w.u32(static_cast<uint32_t>(h.recent.size()));
  for (const CollectiveRecord& c : h.recent) {
    w.u64(c.seq);
    w.str(c.op);
    w.u64(c.bytes);
    w.u64(static_cast<uint64_t>(c.entered_unix_ms));
    w.u64(static_cast<uint64_t>(c.left_unix_ms));
    w.u32(c.ok ? 1u : 0u);
  }
  return std::move(w.out());
}

Result<WorkerHeartbeat> worker_heartbeat_decode(std::span<const uint8_t> payload) {
  StoreReader in(payload.data(), payload.size());
  WorkerHeartbeat h;
  h.step = static_cast<int64_t>(in.u64());
  const uint32_t phase = in.u32();
  h.collectives = in.u64();
  const uint32_t flags = in.u32();
  h.interval_ms = in.u32();
  h.timeout_ms = in.u32();
  if (in.ok() && in.left() > 0) {  // the flight recorder; an older worker's beat ends before it
    const uint32_t n = in.u32();
    // Each entry is at least 40 bytes: a count past what is left is a corrupt frame, not an allocation.
    if (n > in.left() / 40) return bad("worker_heartbeat", payload.size());
    for (uint32_t k = 0; k < n && in.ok(); ++k) {
      CollectiveRecord c;
      c.seq = in.u64();
      c.op = in.str();
      c.bytes = in.u64();
      c.entered_unix_ms = static_cast<int64_t>(in.u64());
      c.left_unix_ms = static_cast<int64_t>(in.u64());
      c.ok = in.u32() != 0;
      h.recent.push_back(std::move(c));
    }
  }
  if (!in.ok() || in.left() != 0) return bad("worker_heartbeat", payload.size());
  if (phase > static_cast<uint32_t>(TrainPhase::kDone)) {
    return Status::error("worker_heartbeat frame names phase " + std::to_string(phase) + ": expected 0.." +
                         std::to_string(static_cast<uint32_t>(TrainPhase::kDone)));
  }
  h.phase = static_cast<TrainPhase>(phase);
  h.in_collective = (flags & 1u) != 0;
  h.timed_out = (flags & 2u) != 0;
  return h;
}

}  // namespace gantry
