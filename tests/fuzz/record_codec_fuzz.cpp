// The binary record codec (worker -> agent -> coordinator): record_batch_frame_size and
// record_batch_decode over any bytes. A refused batch leaves the output empty; an accepted one
// re-encodes to bytes that decode to the same batch.
#include <cstdint>
#include <string>
#include <vector>

#include "telemetry/record_codec.h"
#include "tests/fuzz/fuzz_support.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace gantry;
  std::string error;
  const size_t frame = record_batch_frame_size(data, size, &error);
  FUZZ_CHECK(frame != 0 || !error.empty() || size < kRecordCodecHeaderBytes,
             "a refused header has no message");

  RecordBatch batch;
  error.clear();
  if (!record_batch_decode(data, size, &batch, &error)) {
    FUZZ_CHECK(batch.empty(), "a refused batch left records behind");
    FUZZ_CHECK(!error.empty(), "a refused batch has no message");
    return 0;
  }
  FUZZ_CHECK(frame == size, "a batch decoded from bytes its header does not span");
  std::vector<uint8_t> wire;
  FUZZ_CHECK(record_batch_encode(batch, &wire, &error), "a decoded batch does not encode");
  RecordBatch back;
  FUZZ_CHECK(record_batch_decode(wire.data(), wire.size(), &back, &error),
             "a re-encoded batch does not decode");
  FUZZ_CHECK(back == batch, "a batch changed over encode and decode");
  return 0;
}
