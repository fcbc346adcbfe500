// The JSON form of the records, for the HTTP API, Server-Sent Events and JSON log lines: nlohmann
// serializers (to_json / from_json, found by ADL), so a record nests in any larger document as
// `j["latest"] = record` and the whole project speaks one JSON library. Flat objects with the unit in each
// key ("forward_s", "mem_peak_bytes"); docs/TELEMETRY.md lists every key.
//
// Reading is strict: an unknown key, a wrong type, an integer out of range or with a fraction, or a
// missing required key is an error naming the key; the text parser (record_from_json) also refuses
// duplicate keys and nesting deeper than 64. Optional keys (the NVML readings, val_loss, and an event's
// step, rank, node, message and payload; a checkpoint's manifest_xxh64 and message) may be absent or null.
// Doubles round-trip exactly; NaN and the infinities travel as "NaN", "Infinity", "-Infinity" (protobuf's
// JSON mapping).
//
//   nlohmann::json j = step_record;                            // or record_to_json(r): text, one line
//   StepRecord back;
//   std::string error;
//   if (!record_from_json(text, &back, &error)) reply_400(error);
//   if (!record_read_json(j, &back, &error)) ...               // an already parsed value
//
// A batch is {"rank_steps": [...], "steps": [...], "events": [...], "checkpoints": [...],
// "device_samples": [...]}; each array may be omitted (device_samples is left out when empty). A checkpoint's
// state is "written", "committed" or "failed".
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

#include "telemetry/records.h"

namespace gantry {

// nlohmann's serializers. from_json throws nlohmann::json::type_error (id 302) with the key in its
// message; record_read_json below is the same without exceptions.
void to_json(nlohmann::json& j, const RankStepRecord& r);
void to_json(nlohmann::json& j, const StepRecord& r);
void to_json(nlohmann::json& j, const EventRecord& r);
void to_json(nlohmann::json& j, const CheckpointRecord& r);
void to_json(nlohmann::json& j, const DeviceSampleRecord& r);
void to_json(nlohmann::json& j, const RecordBatch& b);
void from_json(const nlohmann::json& j, RankStepRecord& r);
void from_json(const nlohmann::json& j, StepRecord& r);
void from_json(const nlohmann::json& j, EventRecord& r);
void from_json(const nlohmann::json& j, CheckpointRecord& r);
void from_json(const nlohmann::json& j, DeviceSampleRecord& r);
void from_json(const nlohmann::json& j, RecordBatch& b);

// Text: one object, no newline; invalid UTF-8 in a string is replaced by U+FFFD, so the text is valid.
std::string record_to_json(const RankStepRecord& r);
std::string record_to_json(const StepRecord& r);
std::string record_to_json(const EventRecord& r);
std::string record_to_json(const CheckpointRecord& r);
std::string record_to_json(const RecordBatch& b);

// On failure *out is unchanged and *error names the key (in a batch, the element too:
// `batch: "events"[1]: event: missing key "kind"`).
bool record_from_json(std::string_view text, RankStepRecord* out, std::string* error);
bool record_from_json(std::string_view text, StepRecord* out, std::string* error);
bool record_from_json(std::string_view text, EventRecord* out, std::string* error);
bool record_from_json(std::string_view text, CheckpointRecord* out, std::string* error);
bool record_from_json(std::string_view text, RecordBatch* out, std::string* error);

bool record_read_json(const nlohmann::json& v, RankStepRecord* out, std::string* error);
bool record_read_json(const nlohmann::json& v, StepRecord* out, std::string* error);
bool record_read_json(const nlohmann::json& v, EventRecord* out, std::string* error);
bool record_read_json(const nlohmann::json& v, CheckpointRecord* out, std::string* error);
bool record_read_json(const nlohmann::json& v, DeviceSampleRecord* out, std::string* error);
bool record_read_json(const nlohmann::json& v, RecordBatch* out, std::string* error);

}  // namespace gantry
