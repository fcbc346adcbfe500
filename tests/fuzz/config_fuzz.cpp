// TOML configs: toml_parse over any bytes, and config_parse, whose accepted configs must survive
// config_dump and config_parse unchanged (checkpoints store the dump and compare it on resume).
#include <cstdint>
#include <string>
#include <string_view>

#include "engine/core/config.h"
#include "engine/core/toml.h"
#include "tests/fuzz/fuzz_support.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace gantry;
  const std::string text(reinterpret_cast<const char*>(data), size);

  Result<TomlDocument> doc = toml_parse(text, "fuzz.toml");
  if (doc.ok()) {
    for (const auto& [key, value] : doc->entries) {
      FUZZ_CHECK(doc->find(key) == &value, "a key of the document is not found, or found twice");
      (void)doc->location(value);
      (void)toml_kind_name(value.kind);
    }
  } else {
    FUZZ_CHECK(doc.error().rfind("fuzz.toml:", 0) == 0, "a TOML error does not start with its source");
  }

  Result<Config> cfg = config_parse(text, "fuzz.toml");
  if (!cfg.ok()) {
    FUZZ_CHECK(!cfg.error().empty(), "a refused config has no message");
    return 0;
  }
  FUZZ_CHECK(config_validate(cfg.value()).ok(), "config_parse accepted a config config_validate refuses");
  const std::string dump = config_dump(cfg.value());
  Result<Config> back = config_parse(dump, "dump.toml");
  FUZZ_CHECK(back.ok(), "the dump of an accepted config does not parse");
  FUZZ_CHECK(config_dump(back.value()) == dump, "config_dump is not stable over config_parse");
  FUZZ_CHECK(config_incompatibilities(cfg.value(), back.value()).empty(),
             "a config is incompatible with its own dump");
  return 0;
}
