// The checkpoint manifest reader: each input replaces manifest.json of a committed checkpoint (its shard
// file stays), and checkpoint_load must refuse it with a message or load it, never read outside the shard
// or its own buffers.
#include <cstdint>
#include <string>

#include "tests/fuzz/checkpoint_fixture.h"
#include "tests/fuzz/fuzz_support.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace gantry;
  static const fuzz::CheckpointFixture fixture =
      fuzz::checkpoint_fixture_make(fuzz::fuzz_scratch_dir("checkpoint_manifest"));
  fuzz::fuzz_write_file(fixture.dir + "/manifest.json", data, size);
  Result<CheckpointMeta> meta =
      checkpoint_load(fixture.dir, *fixture.backend, fixture.config, fuzz::kFixtureDataVersion);
  if (!meta.ok()) {
    FUZZ_CHECK(!meta.error().empty(), "a refused manifest has no message");
    return 0;
  }
  FUZZ_CHECK(config_incompatibilities(meta->config, fixture.config).empty(),
             "a manifest for another config loaded");
  return 0;
}
