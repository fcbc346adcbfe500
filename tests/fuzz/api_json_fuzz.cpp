// The HTTP API's request bodies: json_parse_bounded, then the JsonFields reads the coordinator makes of
// a submit body (with its nested layout and straggler objects) and of an agent's registration and record
// upload. Whatever the bytes, the result is a value or a message, and a document that parsed is shallow
// enough to copy and dump (the recursion the depth bound exists for).
#include <cstdint>
#include <string_view>

#include "engine/cluster/json_fields.h"
#include "tests/fuzz/fuzz_support.h"

namespace gantry {
namespace {

using json = nlohmann::json;

// The fields of POST /v1/runs (coordinator.cpp submit), read as the route reads them.
void read_submit(const json& body) {
  JsonFields f(body);
  f.string("config");
  f.string("name", JsonFields::optional);
  f.integer("max_steps", 0, int64_t{1} << 40, JsonFields::optional);
  const json* layout = f.object("layout");
  const json* straggler = f.object("straggler", JsonFields::optional);
  f.integer("checkpoint_every_steps", 1, int64_t{1} << 40, JsonFields::optional);
  f.integer("keep_last", 1, 100000, JsonFields::optional);
  if (layout != nullptr) {
    JsonFields l(*layout, "layout.");
    l.integer("dp", 1, 1 << 20);
    l.integer("zero", 0, 3, JsonFields::optional);
    l.integer("tp", 1, 1, JsonFields::optional);
    l.integer("pp", 1, 1, JsonFields::optional);
    const Status s = l.finish();
    FUZZ_CHECK(s.ok() || !s.message().empty(), "a refused layout has no message");
  }
  if (straggler != nullptr) {
    JsonFields s(*straggler, "straggler.");
    s.boolean("enabled", JsonFields::optional);
    s.integer("window_steps", 1, 100000, JsonFields::optional);
    s.number("relative_threshold", 0, 1, JsonFields::optional);
    s.string("basis", JsonFields::optional);
    (void)s.finish();
  }
  const Status s = f.finish();
  FUZZ_CHECK(f.ok() || !s.ok(), "a reader with an error finished ok");
  FUZZ_CHECK(s.ok() || !s.message().empty(), "a refused body has no message");
}

// An agent's registration and record upload: the other field kinds (boolean, any).
void read_agent(const json& body) {
  JsonFields f(body);
  f.integer("pid", 0, INT64_MAX, JsonFields::optional);
  f.string("host", JsonFields::optional);
  f.boolean("spare", JsonFields::optional);
  f.string("metrics_url", JsonFields::optional);
  f.object("records", JsonFields::optional);
  f.any("ended", JsonFields::optional);
  f.number("lr", -1e300, 1e300, JsonFields::optional);
  (void)f.finish();
}

}  // namespace
}  // namespace gantry

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using gantry::json_parse_bounded;
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  gantry::Result<nlohmann::json> body = json_parse_bounded(text);
  // A tighter bound refuses at least what the default refuses.
  gantry::Result<nlohmann::json> shallow = json_parse_bounded(text, 2);
  FUZZ_CHECK(body.ok() || !shallow.ok(), "a depth bound of 2 accepted what 64 refused");
  if (!body.ok()) {
    FUZZ_CHECK(!body.error().empty(), "a refused body has no message");
    return 0;
  }
  const nlohmann::json& j = body.value();
  (void)gantry::json_type_phrase(j);
  gantry::read_submit(j);
  gantry::read_agent(j);
  // Copying, comparing and dumping recurse: the depth bound is what keeps them off the stack's end.
  const nlohmann::json copy = j;
  FUZZ_CHECK(copy == j, "a parsed body differs from its copy");
  const std::string dumped = j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  FUZZ_CHECK(json_parse_bounded(dumped).ok(), "a parsed body does not parse again once dumped");
  return 0;
}
