// The compact binary form of a RecordBatch, for the worker → agent → coordinator path (12.5k node batches
// per step at 100k GPUs, so every byte and every allocation counts). The layout is in docs/TELEMETRY.md.
// Decoding never trusts its input: anything malformed is an error with a message, never a crash, and
// the output holds nothing half-decoded.
//
//   std::vector<uint8_t> wire;
//   record_batch_encode(batch, &wire);
//   ...
//   RecordBatch got;  // reused between calls: its vectors keep their capacity
//   std::string error;
//   if (!record_batch_decode(wire.data(), wire.size(), &got, &error)) log("bad batch: " + error);
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "telemetry/records.h"

namespace gantry {

inline constexpr uint32_t kRecordCodecMagic = 0x4D4C5447;  // "GTLM" in file order
// 2: rank steps carry mfu/hfu, and a step's mfu/hfu are optional (flag bits). 3: checkpoint records (a
// fourth section; before, a checkpoint was an event with a JSON payload). 4: device samples (a fifth section:
// the agents' GPU and node readings). A reader refuses any other.
inline constexpr uint16_t kRecordCodecVersion = 4;
inline constexpr size_t kRecordCodecHeaderBytes = 12;  // magic u32, version u16, reserved u16, body u32
// Limits a decoder enforces, so a hostile length cannot make it allocate: a batch is at most this large.
inline constexpr size_t kRecordCodecMaxBodyBytes = size_t{1} << 30;

// Replaces *out with the encoded batch. Fails (with a message) only when the batch is over the size
// limit above; nothing is written then.
bool record_batch_encode(const RecordBatch& batch, std::vector<uint8_t>* out, std::string* error = nullptr);

// Decodes exactly one batch occupying all `size` bytes. On failure *out is left empty and *error says
// what was wrong and where.
bool record_batch_decode(const uint8_t* data, size_t size, RecordBatch* out, std::string* error);

// For stream readers: how many bytes the batch starting at data occupies, read from its header; 0 when
// fewer than a header's bytes are present or the header is not one of ours (then *error says why).
size_t record_batch_frame_size(const uint8_t* data, size_t size, std::string* error);

}  // namespace gantry
