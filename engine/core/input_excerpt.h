// How an error message quotes what the user gave it (a config value or line, a flag's value, a path): whole
// when it is short, else about kInputExcerptBytes of it (its start and its end, which for a path is the
// file's name) and its size. Every message that echoes input goes through here, so a 100 MB value in a
// config or on a command line cannot turn one error into 100 MB of stderr, while the message still names
// the key or flag it is about.
//
//   "unknown value '" + input_excerpt(tok) + "'"        // 'aaaa...aaaa (104857600 bytes)', 80 bytes of it
//   input_excerpt_words(cli_error.what())              // every over-long word of a finished message cut
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

namespace gantry {

inline constexpr size_t kInputExcerptBytes = 80;

inline std::string input_excerpt(std::string_view text, size_t max_bytes = kInputExcerptBytes) {
  if (text.size() <= max_bytes) return std::string(text);
  const auto continuation = [&](size_t i) { return (static_cast<unsigned char>(text[i]) & 0xC0) == 0x80; };
  // Both cuts land on the start of a UTF-8 sequence, so the excerpt never holds half a character.
  size_t head = max_bytes - max_bytes / 4 - 3;
  while (head > 0 && continuation(head)) --head;
  size_t tail = text.size() - max_bytes / 4;
  while (tail < text.size() && continuation(tail)) ++tail;
  return std::string(text.substr(0, head)) + "..." + std::string(text.substr(tail)) + " (" +
         std::to_string(text.size()) + " bytes)";
}

// For messages composed by code we do not own (CLI11's): cuts every run of non-blank characters longer
// than max_bytes with input_excerpt, leaving the words around it (the flag's name, the rule) whole.
inline std::string input_excerpt_words(std::string_view message, size_t max_bytes = kInputExcerptBytes) {
  std::string out;
  size_t pos = 0;
  while (pos < message.size()) {
    size_t end = message.find_first_of(" \t\n", pos);
    if (end == std::string_view::npos) end = message.size();
    out += input_excerpt(message.substr(pos, end - pos), max_bytes);
    if (end < message.size()) out += message[end];
    pos = end + 1;
  }
  return out;
}

}  // namespace gantry
