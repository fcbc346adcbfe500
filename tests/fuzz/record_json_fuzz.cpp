// The records' JSON form (API uploads, SSE, JSON log lines): nlohmann's parser under record_json's
// strict reading (duplicate keys, depth), each of the five record kinds read from the same bytes; what is
// accepted survives record_to_json and record_from_json unchanged.
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

#include "telemetry/record_json.h"
#include "tests/fuzz/fuzz_support.h"

namespace {

template <typename Record>
void round_trip(std::string_view text) {
  Record r;
  std::string error;
  if (!gantry::record_from_json(text, &r, &error)) {
    FUZZ_CHECK(!error.empty(), "a refused record has no message");
    return;
  }
  const std::string again = gantry::record_to_json(r);
  Record back;
  FUZZ_CHECK(gantry::record_from_json(again, &back, &error), "a record's own JSON is refused");
  FUZZ_CHECK(back == r, "a record changed over record_to_json and record_from_json");
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  if (!nlohmann::json::accept(text.begin(), text.end())) {
    gantry::RecordBatch b;
    std::string error;
    FUZZ_CHECK(!gantry::record_from_json(text, &b, &error), "text nlohmann refuses was read as a batch");
    FUZZ_CHECK(!error.empty(), "a refused JSON text has no message");
    return 0;  // every record reader starts with the parse: nothing more to reach
  }
  round_trip<gantry::RankStepRecord>(text);
  round_trip<gantry::StepRecord>(text);
  round_trip<gantry::EventRecord>(text);
  round_trip<gantry::CheckpointRecord>(text);
  round_trip<gantry::RecordBatch>(text);
  return 0;
}
