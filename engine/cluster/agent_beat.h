// An agent's heartbeat on the wire: what the node has to say (its gangs that ended, as a small JSON
// object) and its records since the last beat, in the records' one binary codec (telemetry/record_codec.h,
// "GTLM"), so a rank-step record crosses from worker to coordinator without ever becoming text.
//
//   bytes 0..3   magic "GBEA" (u32 0x41454247, little-endian)
//   bytes 4..5   u16 version = 1 (a reader refuses any other)
//   bytes 6..7   u16 reserved = 0
//   bytes 8..11  u32 control length C
//   bytes 12..15 u32 records length R (0 = no records); the body is exactly 16 + C + R bytes, so a beat cut
//                short anywhere, even between its parts, is refused rather than taken as one without records
//   16..16+C     the control part: one JSON object, {"ended": [...]}
//   the rest     R bytes: one GTLM frame
//
//   std::string body = agent_beat_encode({{"ended", ended}}, batch);
//   client.post_bytes("/v1/agents/n0/heartbeat", body, kAgentBeatMediaType);
//   ...
//   AgentBeat beat;  // the coordinator's handler
//   if (Status s = agent_beat_decode(req.raw_body, &beat); !s.ok()) return HttpResponse::error(400,
//   s.message());
//
// Decoding trusts nothing: lengths are checked against the bytes present before anything is read, the
// control part parses with a depth bound, the records decode under the codec's own checks; an error names
// the part and what was wrong, and the output is left empty.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>  // the control part
#include <string>
#include <string_view>

#include "telemetry/records.h"
#include "telemetry/status.h"

namespace gantry {

inline constexpr uint32_t kAgentBeatMagic = 0x41454247;  // "GBEA" in byte order
inline constexpr uint16_t kAgentBeatVersion = 1;
inline constexpr size_t kAgentBeatHeaderBytes = 16;
inline constexpr char kAgentBeatMediaType[] = "application/vnd.gantry.beat";

struct AgentBeat {
  nlohmann::json control = nlohmann::json::object();
  RecordBatch records;
};

// The beat's bytes. An error only when the records are over the codec's size limit.
Result<std::string> agent_beat_encode(const nlohmann::json& control, const RecordBatch& records);

// Replaces *out with the beat in `body`; on error *out is left empty and the message says what and where.
Status agent_beat_decode(std::string_view body, AgentBeat* out);

// A node's name is one path segment of its routes (/v1/agents/NAME/heartbeat, /v1/nodes/NAME/...) and a part
// of the agent's own paths (/dev/shm/gantry-agent-NAME-PID): 1-128 letters, digits, '.', '_' or '-', not
// "." or "..". Host names and Slurm's node names fit. Checked by the agent before it makes anything, and
// by the coordinator at registration.
Status agent_node_name_check(std::string_view node);

}  // namespace gantry
