// The JSON form of the records, for the HTTP API, Server-Sent Events and JSON log lines. Flat objects with
// the unit in each key ("forward_s", "mem_peak_bytes"); docs/TELEMETRY.md lists every key. Reading is
// strict: an unknown key, a wrong type or a missing required key is an error naming the key. Optional
// keys (the NVML readings, val_loss, and an event's step, rank, node, message and payload) may be absent
// or null. Doubles round-trip exactly; NaN and the infinities travel as "NaN", "Infinity", "-Infinity".
//
//   std::string line = record_to_json(step_record);          // one object, no newline
//   StepRecord back;
//   std::string error;
//   if (!record_from_json(line, &back, &error)) reply_400(error);
//
// A batch is {"rank_steps": [...], "steps": [...], "events": [...]}; each array may be omitted.
#pragma once

#include <string>
#include <string_view>

#include "telemetry/json.h"
#include "telemetry/records.h"

namespace gantry {

std::string record_to_json(const RankStepRecord& r);
std::string record_to_json(const StepRecord& r);
std::string record_to_json(const EventRecord& r);
std::string record_to_json(const RecordBatch& b);

bool record_from_json(std::string_view text, RankStepRecord* out, std::string* error);
bool record_from_json(std::string_view text, StepRecord* out, std::string* error);
bool record_from_json(std::string_view text, EventRecord* out, std::string* error);
bool record_from_json(std::string_view text, RecordBatch* out, std::string* error);

// The same, into and out of a writer or an already parsed value, for callers that nest records in a
// larger document (an SSE envelope, an API reply).
void record_write_json(JsonWriter& w, const RankStepRecord& r);
void record_write_json(JsonWriter& w, const StepRecord& r);
void record_write_json(JsonWriter& w, const EventRecord& r);
bool record_read_json(const JsonValue& v, RankStepRecord* out, std::string* error);
bool record_read_json(const JsonValue& v, StepRecord* out, std::string* error);
bool record_read_json(const JsonValue& v, EventRecord* out, std::string* error);

}  // namespace gantry
