// The worker runtime's frame payloads (hello, exit, run summary, command): each decoder over the same
// bytes. Every field is fixed-width or length-prefixed, so an accepted payload re-encodes to exactly the
// bytes it came from.
#include <cstdint>
#include <span>
#include <vector>

#include "engine/core/worker/worker_frames.h"
#include "tests/fuzz/fuzz_support.h"

namespace {

template <typename T>
void round_trip(std::span<const uint8_t> payload, gantry::Result<T> (*decode)(std::span<const uint8_t>),
                std::vector<uint8_t> (*encode)(const T&)) {
  gantry::Result<T> got = decode(payload);
  if (!got.ok()) {
    FUZZ_CHECK(!got.error().empty(), "a refused payload has no message");
    return;
  }
  const std::vector<uint8_t> again = encode(got.value());
  FUZZ_CHECK(std::vector<uint8_t>(payload.begin(), payload.end()) == again,
             "an accepted payload does not re-encode to its own bytes");
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace gantry;
  const std::span<const uint8_t> payload(data, size);
  round_trip<WorkerHello>(payload, worker_hello_decode, worker_hello_encode);
  round_trip<WorkerExit>(payload, worker_exit_decode, worker_exit_encode);
  round_trip<WorkerRun>(payload, worker_run_decode, worker_run_encode);
  round_trip<WorkerCommand>(payload, worker_command_decode, worker_command_encode);
  return 0;
}
