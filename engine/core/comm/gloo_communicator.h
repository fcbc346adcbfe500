// The CPU communicator: Gloo's TCP transport carries the bytes, our code decides what goes where. Built
// only where Gloo is installed (GANTRY_HAVE_GLOO; the GPU machines lack it and use NCCL).
//
//   // In the worker: fd is its inherited socket to the launcher, which runs a StoreServer on the other end.
//   Result<std::unique_ptr<Communicator>> dp = gloo_communicator_create(rank, world, fd, "dp/", 30s);
//   if (!dp.ok()) return dp.status();   // "gloo create (rank 2 of 4): rendezvous failed: ..."
//
// Rendezvous: every rank's TCP device listens on `hostname` (127.0.0.1 by default), publishes its pair
// addresses under "<prefix><rank>" through the store (gloo_store.h) and connects a full mesh.
//
// The collectives are ours, written on Gloo's point-to-point unbound buffers, not Gloo's own
// allreduce/broadcast. Three reasons: (1) abort(): Gloo's collectives cannot be interrupted from another
// thread, while a wait on one of our buffers can; (2) reduce_scatter with contiguous blocks of uneven
// size (comm_block) is not in Gloo's buffer-based API; (3) all_reduce must equal reduce_scatter + all_gather
// bit for bit so ZeRO reproduces plain DP exactly.
//
// Sum order (the determinism contract): reduce_scatter and all_reduce are a ring. Block c of the buffer
// (comm_block(count, size, c)) is summed as ((x[c+1] + x[c+2]) + ...) + x[c], indices mod size, where
// x[k] is rank k's block; all_gather then copies the finished blocks around. The order depends on rank
// and block only, never on timing, and every rank ends with identical bits. broadcast is a binomial
// tree, barrier a dissemination barrier; both move bytes without arithmetic.
//
// Each message's Gloo slot carries the operation kind, a per-operation sequence number, a 16-bit
// fingerprint of `count` and the step, so ranks calling different operations or counts never match each
// other's messages (which would overrun a buffer): they time out with a message naming the operation.
//
// Gloo writes with writev(2), which raises SIGPIPE when a peer has died; creating a communicator sets
// SIGPIPE to ignored if it was at its default, so a dead peer is an error value, not a dead worker.
#pragma once

#include <chrono>
#include <memory>
#include <string>

#include "engine/core/comm/communicator.h"
#include "telemetry/status.h"

namespace gantry {

struct GlooCommOptions {
  // The address this rank's pairs listen on: loopback for one machine (and every test); a routable
  // address of this host for several.
  std::string hostname = "127.0.0.1";
};

// Rendezvouses with the other `size - 1` ranks through the launcher's store on `store_fd` (not taken
// over: the socket stays the caller's, and is not used again after this returns) and connects every
// pair. `prefix` namespaces the store keys, one per communicator ("dp/", "tp/0/"). `timeout` bounds the
// rendezvous; a rank that never shows up makes the others fail naming its key.
Result<std::unique_ptr<Communicator>> gloo_communicator_create(int rank, int size, int store_fd,
                                                               std::string prefix,
                                                               std::chrono::milliseconds timeout,
                                                               GlooCommOptions options = {});

}  // namespace gantry
