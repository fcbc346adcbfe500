#include "engine/cluster/agent_beat.h"

#include <algorithm>
#include <cctype>
#include <cstring>
#include <string>
#include <vector>

#include "engine/cluster/json_fields.h"  // json_parse_bounded: the control part is outside bytes
#include "telemetry/record_codec.h"

namespace gantry {
namespace {

void put_u32(std::string& out, size_t at, uint32_t v) {
  for (int i = 0; i < 4; ++i) out[at + static_cast<size_t>(i)] = static_cast<char>((v >> (8 * i)) & 0xff);
}

uint32_t get_u32(std::string_view in, size_t at) {
  uint32_t v = 0;
  for (int i = 0; i < 4; ++i)
    v |= static_cast<uint32_t>(static_cast<uint8_t>(in[at + static_cast<size_t>(i)])) << (8 * i);
  return v;
}

uint16_t get_u16(std::string_view in, size_t at) {
  return static_cast<uint16_t>(static_cast<uint8_t>(in[at]) | (static_cast<uint8_t>(in[at + 1]) << 8));
}

}  // namespace

Result<std::string> agent_beat_encode(const nlohmann::json& control, const RecordBatch& records) {
  const std::string text = control.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  std::vector<uint8_t> frame;
  if (!records.empty()) {
    std::string error;
    if (!record_batch_encode(records, &frame, &error)) return Status::error("beat: records: " + error);
  }
  std::string out(kAgentBeatHeaderBytes, '\0');
  put_u32(out, 0, kAgentBeatMagic);
  out[4] = static_cast<char>(kAgentBeatVersion & 0xff);
  out[5] = static_cast<char>(kAgentBeatVersion >> 8);
  put_u32(out, 8, static_cast<uint32_t>(text.size()));
  put_u32(out, 12, static_cast<uint32_t>(frame.size()));
  out.reserve(kAgentBeatHeaderBytes + text.size() + frame.size());
  out += text;
  out.append(reinterpret_cast<const char*>(frame.data()), frame.size());
  return out;
}

Status agent_beat_decode(std::string_view body, AgentBeat* out) {
  out->control = nlohmann::json::object();
  out->records.clear();
  if (body.size() < kAgentBeatHeaderBytes) {
    return Status::error("beat: " + std::to_string(body.size()) + " bytes, shorter than its " +
                         std::to_string(kAgentBeatHeaderBytes) + "-byte header (send Content-Type: " +
                         kAgentBeatMediaType + " with an encoded beat)");
  }
  if (get_u32(body, 0) != kAgentBeatMagic) return Status::error("beat: bad magic (not a Gantry heartbeat)");
  if (const uint16_t v = get_u16(body, 4); v != kAgentBeatVersion) {
    return Status::error("beat: version " + std::to_string(v) + " (this coordinator reads version " +
                         std::to_string(kAgentBeatVersion) + ")");
  }
  if (get_u16(body, 6) != 0) return Status::error("beat: reserved bytes 6..7 are not 0");
  const uint64_t control_bytes = get_u32(body, 8);
  const uint64_t record_bytes = get_u32(body, 12);
  if (kAgentBeatHeaderBytes + control_bytes + record_bytes != body.size()) {
    return Status::error("beat: the header says " + std::to_string(control_bytes) + " bytes of control and " +
                         std::to_string(record_bytes) + " of records, but " +
                         std::to_string(body.size() - kAgentBeatHeaderBytes) + " bytes follow it");
  }
  const std::string_view control_text = body.substr(kAgentBeatHeaderBytes, control_bytes);
  Result<nlohmann::json> control = json_parse_bounded(control_text);
  if (!control.ok()) return Status::error("beat: control: " + control.error());
  if (!control->is_object()) {
    return Status::error("beat: control: expected a JSON object, got " + json_type_phrase(control.value()));
  }
  const std::string_view frame = body.substr(kAgentBeatHeaderBytes + control_bytes);
  RecordBatch records;
  if (!frame.empty()) {
    std::string error;
    if (!record_batch_decode(reinterpret_cast<const uint8_t*>(frame.data()), frame.size(), &records,
                             &error)) {
      return Status::error("beat: records (at byte " + std::to_string(kAgentBeatHeaderBytes + control_bytes) +
                           "): " + error);
    }
  }
  out->control = std::move(control.value());
  out->records = std::move(records);
  return Status();
}

Status agent_node_name_check(std::string_view node) {
  const bool segment = std::all_of(node.begin(), node.end(), [](char c) {
    return std::isalnum(static_cast<unsigned char>(c)) != 0 || c == '.' || c == '_' || c == '-';
  });
  if (!node.empty() && node.size() <= 128 && segment && node != "." && node != "..") return Status();
  const std::string shown = node.size() > 40 ? std::string(node.substr(0, 40)) + "..." : std::string(node);
  return Status::error(
      "\"" + shown +
      "\" cannot name a node: use 1-128 letters, digits, '.', '_' and '-' (a host name), not "
      "\".\" or \"..\"");
}

}  // namespace gantry
