// The API's bearer token: made from /dev/urandom, kept in a file only its owner can read (as ssh keeps
// keys), compared in constant time.
//
//   Result<std::string> t = token_generate();              // 64 hex digits: 256 random bits
//   Status s = token_file_write(dir + "/token", t.value());  // mode 0600, replaced atomically
//   Result<std::string> back = token_file_read(dir + "/token");
//   // "token file /x/token has mode 0644: it must be readable by its owner only (chmod 600 /x/token)"
#pragma once

#include <string>
#include <string_view>

#include "telemetry/status.h"

namespace gantry {

inline constexpr size_t kTokenBytes = 32;  // 256 bits, written as 64 hex digits

Result<std::string> token_generate();

// Writes "<token>\n" to a temporary file of mode 0600 in the same directory, syncs it and renames it over
// `path`, so a reader sees the old token or the new one, never a part, and never a moment of wider mode.
Status token_file_write(const std::string& path, std::string_view token);

// Reads the token back. Refuses (naming the path and the fix) a missing file, one that is not a regular
// file, one whose mode lets the group or others read or write it, one owned by another user, and an empty
// or malformed token (only printable ASCII without spaces can go into an Authorization header).
Result<std::string> token_file_read(const std::string& path);

// Whether a token is usable in a header: 16..4096 printable ASCII characters, no spaces. The message
// says what is wrong.
Status token_check(std::string_view token);

// Equality whose time depends on the lengths only, never on where the two first differ.
bool token_equal(std::string_view a, std::string_view b);

}  // namespace gantry
