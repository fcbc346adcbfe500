// An agent's heartbeat as the coordinator reads it (engine/cluster/agent_beat.h): header, JSON control
// part, binary records. A refused beat leaves nothing behind and says why; an accepted one has an object
// for its control part and re-encodes to a beat that decodes to the same control and records.
#include <cstdint>
#include <string>
#include <string_view>

#include "engine/cluster/agent_beat.h"
#include "tests/fuzz/fuzz_support.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace gantry;
  const std::string_view body(reinterpret_cast<const char*>(data), size);
  AgentBeat beat;
  if (Status s = agent_beat_decode(body, &beat); !s.ok()) {
    FUZZ_CHECK(beat.records.empty(), "a refused beat left records behind");
    FUZZ_CHECK(beat.control.is_object() && beat.control.empty(), "a refused beat left a control part behind");
    FUZZ_CHECK(!s.message().empty(), "a refused beat has no message");
    return 0;
  }
  FUZZ_CHECK(beat.control.is_object(), "an accepted beat's control part is not an object");
  Result<std::string> again = agent_beat_encode(beat.control, beat.records);
  FUZZ_CHECK(again.ok(), "a decoded beat does not encode");
  AgentBeat back;
  FUZZ_CHECK(agent_beat_decode(again.value(), &back).ok(), "a re-encoded beat does not decode");
  FUZZ_CHECK(back.control == beat.control, "a beat's control part changed over encode and decode");
  FUZZ_CHECK(back.records == beat.records, "a beat's records changed over encode and decode");
  return 0;
}
