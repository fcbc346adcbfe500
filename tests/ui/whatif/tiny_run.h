// The tiny config's run as GET /v1/runs/{id} shows it to the what-if panel: the model's dimensions and the
// batch read from assets/configs/tiny.toml with the engine's own parser (so the tests follow the asset), in
// the coordinator's keys (engine/cluster/coordinator_views.cpp, run_json).
#pragma once

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <string>

#include "engine/core/config.h"

namespace gantry::whatif::testing_support {

inline nlohmann::json tiny_run(const nlohmann::json& layout, const std::string& state = "stopped") {
  Result<Config> c = config_load(std::string(GANTRY_SOURCE_DIR "/assets/configs/tiny.toml"));
  EXPECT_TRUE(c.ok()) << c.error();
  if (!c.ok()) return nlohmann::json::object();
  return {{"id", 7},
          {"name", "tiny"},
          {"state", state},
          {"backend", c->train.backend},
          {"model",
           {{"n_layer", c->model.n_layer},
            {"n_head", c->model.n_head},
            {"n_embd", c->model.n_embd},
            {"vocab_size", c->model.vocab_size},
            {"seq_len", c->model.seq_len}}},
          {"batch", {{"global_batch", c->train.global_batch}, {"micro_batch", c->train.micro_batch}}},
          {"layout", layout}};
}

}  // namespace gantry::whatif::testing_support
