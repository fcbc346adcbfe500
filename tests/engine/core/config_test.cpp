#include "engine/core/config.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

namespace gantry {
namespace {

using ::testing::HasSubstr;

// The sections every config must have (config.h), empty: what a test adds to them is what it tests.
constexpr const char* kRequired = "[model]\n[train]\n[data]\n";

std::string error_of(const std::string& toml) {
  Result<Config> c = config_parse(toml, "test.toml");
  EXPECT_FALSE(c.ok()) << "expected an error for:\n" << toml;
  return c.ok() ? "" : c.error();
}

TEST(Config, ShippedConfigsLoad) {
  for (const char* name : {"tiny", "gpt2-124m", "gpt2-350m"}) {
    Result<Config> c = config_load(std::string(GANTRY_SOURCE_DIR "/assets/configs/") + name + ".toml");
    ASSERT_TRUE(c.ok()) << name << ": " << c.error();
  }
  Result<Config> big = config_load(std::string(GANTRY_SOURCE_DIR "/assets/configs/gpt2-124m.toml"));
  EXPECT_EQ(big->model.n_layer, 12);
  EXPECT_EQ(big->model.n_embd, 768);
  EXPECT_EQ(big->model.vocab_size, 50304);
  EXPECT_EQ(big->model.seq_len, 1024);
}

TEST(Config, ValuesOverrideDefaults) {
  Result<Config> c =
      config_parse("[model]\nn_layer = 3\n[optim]\nlr = 2e-4\nwarmup_steps = 7\n[train]\n[data]\n", "t");
  ASSERT_TRUE(c.ok()) << c.error();
  EXPECT_EQ(c->model.n_layer, 3);
  EXPECT_DOUBLE_EQ(c->optim.lr, 2e-4);
  EXPECT_EQ(c->optim.warmup_steps, 7);
  EXPECT_EQ(c->model.n_embd, ModelConfig{}.n_embd);
}

TEST(Config, IntegerAcceptedForFloatField) {
  Result<Config> c = config_parse(std::string(kRequired) + "[optim]\ngrad_clip = 2\n", "t");
  ASSERT_TRUE(c.ok()) << c.error();
  EXPECT_DOUBLE_EQ(c->optim.grad_clip, 2.0);
}

TEST(Config, UnknownKeyNamesKeyLineAndKnownKeys) {
  std::string e = error_of("[model]\nn_layer = 2\nn_layers = 3\n");
  EXPECT_THAT(e, HasSubstr("test.toml:3"));
  EXPECT_THAT(e, HasSubstr("unknown key 'model.n_layers'"));
  EXPECT_THAT(e, HasSubstr("model.n_layer"));
}

TEST(Config, UnknownSectionListsSections) {
  std::string e = error_of("[modle]\nn_layer = 2\n");
  EXPECT_THAT(e, HasSubstr("unknown key 'modle.n_layer'"));
  EXPECT_THAT(e, HasSubstr("[model]"));
}

TEST(Config, OutOfRangeNamesAllowedRange) {
  std::string e = error_of("[model]\nn_head = 0\n");
  EXPECT_THAT(e, HasSubstr("test.toml:2"));
  EXPECT_THAT(e, HasSubstr("model.n_head"));
  EXPECT_THAT(e, HasSubstr("[1, 1024]"));
}

TEST(Config, WrongTypeNamesExpectedType) {
  std::string e = error_of("[optim]\nlr = \"fast\"\n");
  EXPECT_THAT(e, HasSubstr("optim.lr"));
  EXPECT_THAT(e, HasSubstr("expected a number"));
  EXPECT_THAT(e, HasSubstr("string"));
}

TEST(Config, FractionalIntegerRefused) {
  std::string e = error_of("[train]\nglobal_batch = 1.5\n");
  EXPECT_THAT(e, HasSubstr("train.global_batch"));
  EXPECT_THAT(e, HasSubstr("integer"));
}

TEST(Config, BooleansAreTrueOrFalse) {
  Result<Config> c = config_parse("[model]\n[data]\n[train]\ncuda_graphs = false\n", "t");
  ASSERT_TRUE(c.ok()) << c.error();
  EXPECT_FALSE(c->train.cuda_graphs);
  EXPECT_THAT(error_of("[train]\ncuda_graphs = 1\n"), HasSubstr("expected true or false"));
}

TEST(Config, StringChoicesListed) {
  std::string e = error_of("[data]\nkind = \"parquet\"\n");
  EXPECT_THAT(e, HasSubstr("\"synthetic\", \"shards\""));
}

TEST(Config, CrossFieldRules) {
  EXPECT_THAT(error_of("[model]\nn_embd = 64\nn_head = 5\n"), HasSubstr("must divide model.n_embd"));
  EXPECT_THAT(error_of("[train]\nglobal_batch = 10\nmicro_batch = 4\n"),
              HasSubstr("must divide train.global_batch"));
  EXPECT_THAT(error_of("[optim]\nlr = 1e-4\nmin_lr = 1e-3\n"), HasSubstr("optim.min_lr"));
  EXPECT_THAT(error_of("[data]\nkind = \"shards\"\n"), HasSubstr("data.dir"));
}

// An empty config, or one without [model], used to train the defaults (a toy model) and exit 0.
TEST(Config, RequiredSectionsAreNamedWithWhatTheyHold) {
  std::string empty = error_of("");
  EXPECT_THAT(empty, HasSubstr("test.toml: no [model] section"));
  EXPECT_THAT(empty, HasSubstr("n_layer, n_head, n_embd, vocab_size, seq_len"));
  EXPECT_THAT(error_of("[train]\nmax_steps = 5\n[data]\n"), HasSubstr("test.toml: no [model] section"));
  EXPECT_THAT(error_of("[model]\n[data]\n"), HasSubstr("no [train] section"));
  EXPECT_THAT(error_of("[model]\n[train]\n"), HasSubstr("no [data] section"));
  // [optim] may be left out, and a section may be present with no key in it.
  Result<Config> c = config_parse(kRequired, "t");
  ASSERT_TRUE(c.ok()) << c.error();
  EXPECT_DOUBLE_EQ(c->optim.beta2, OptimConfig{}.beta2);
}

TEST(Config, CollectiveTimeoutIsAFieldWithARange) {
  Result<Config> c = config_parse(kRequired, "t");
  ASSERT_TRUE(c.ok()) << c.error();
  EXPECT_DOUBLE_EQ(c->train.collective_timeout_s, 120.0);
  Result<Config> set = config_parse("[model]\n[data]\n[train]\ncollective_timeout_s = 3\n", "t");
  ASSERT_TRUE(set.ok()) << set.error();
  EXPECT_DOUBLE_EQ(set->train.collective_timeout_s, 3.0);
  std::string e = error_of("[model]\n[data]\n[train]\ncollective_timeout_s = 0\n");
  EXPECT_THAT(e, HasSubstr("train.collective_timeout_s"));
  EXPECT_THAT(e, HasSubstr("[1, 86400]"));
}

TEST(Config, SdcCheckIntervalHasARangeAndADefault) {
  Result<Config> c = config_parse(kRequired, "t");
  ASSERT_TRUE(c.ok()) << c.error();
  EXPECT_EQ(c->train.sdc_check_every, 100);
  Result<Config> off = config_parse("[model]\n[data]\n[train]\nsdc_check_every = 0\n", "t");
  ASSERT_TRUE(off.ok()) << off.error();
  EXPECT_EQ(off->train.sdc_check_every, 0);
  Result<Config> every = config_parse("[model]\n[data]\n[train]\nsdc_check_every = 1\n", "t");
  ASSERT_TRUE(every.ok()) << every.error();
  EXPECT_EQ(every->train.sdc_check_every, 1);
  std::string e = error_of("[train]\nsdc_check_every = -1\n");
  EXPECT_THAT(e, HasSubstr("train.sdc_check_every"));
  EXPECT_THAT(e, HasSubstr("-1 is out of range: allowed an integer in [0, 1000000000]"));
  e = error_of("[train]\nsdc_check_every = 2.5\n");
  EXPECT_THAT(e, HasSubstr("train.sdc_check_every"));
  EXPECT_THAT(e, HasSubstr("expected an integer in [0, 1000000000]"));
  e = error_of("[train]\nsdc_check_every = \"often\"\n");
  EXPECT_THAT(e, HasSubstr("train.sdc_check_every"));
  // The value survives the dump a checkpoint's manifest keeps.
  Result<Config> back = config_parse(config_dump(every.value()), "dump");
  ASSERT_TRUE(back.ok()) << back.error();
  EXPECT_EQ(back->train.sdc_check_every, 1);
}

// A 100 MB value used to be echoed whole (twice, in some messages): every quote of input is cut.
TEST(Config, StepGuardFieldsHaveRanges) {
  Result<Config> c = config_parse(kRequired, "t");
  ASSERT_TRUE(c.ok()) << c.error();
  EXPECT_EQ(c->train.guard_spike_factor, 0.0);  // off unless asked for
  EXPECT_EQ(c->train.guard_window, 20);
  EXPECT_EQ(c->train.guard_max_skips_in_row, 5);
  Result<Config> set = config_parse(
      "[model]\n[data]\n[train]\nguard_spike_factor = 4\nguard_window = 8\nguard_max_skips_in_row = 2\n",
      "t");
  ASSERT_TRUE(set.ok()) << set.error();
  EXPECT_EQ(set->train.guard_spike_factor, 4.0);
  EXPECT_EQ(set->train.guard_window, 8);
  EXPECT_EQ(set->train.guard_max_skips_in_row, 2);
  std::string e = error_of("[train]\nguard_window = 0\n");
  EXPECT_THAT(e, HasSubstr("train.guard_window"));
  EXPECT_THAT(e, HasSubstr("[1, 100000]"));
  e = error_of("[train]\nguard_max_skips_in_row = 0\n");
  EXPECT_THAT(e, HasSubstr("train.guard_max_skips_in_row"));
  EXPECT_THAT(e, HasSubstr("[1, 1000000]"));
  e = error_of("[train]\nguard_spike_factor = -1\n");
  EXPECT_THAT(e, HasSubstr("train.guard_spike_factor"));
  EXPECT_THAT(e, HasSubstr("[0, 1e+06]"));
  // A factor at or below 1 would skip every step above the median: refused, naming what is allowed.
  e = error_of("[model]\n[data]\n[train]\nguard_spike_factor = 0.5\n");
  EXPECT_THAT(e, HasSubstr("train.guard_spike_factor = 0.5"));
  EXPECT_THAT(e, HasSubstr("0 (no spike check) or above 1"));
  // What a streak of skips does: a rollback by default, bounded; anything but the two words is refused.
  EXPECT_EQ(c->train.guard_on_streak, "rollback");
  EXPECT_EQ(c->train.guard_max_rollbacks, 3);
  e = error_of("[train]\nguard_on_streak = \"retry\"\n");
  EXPECT_THAT(e, HasSubstr("train.guard_on_streak"));
  EXPECT_THAT(e, HasSubstr("use one of \"rollback\", \"stop\""));
  e = error_of("[train]\nguard_max_rollbacks = 0\n");
  EXPECT_THAT(e, HasSubstr("train.guard_max_rollbacks"));
  Config bad = c.value();
  bad.train.guard_on_streak = "Rollback";
  Status v = config_validate(bad);
  ASSERT_FALSE(v.ok());
  EXPECT_THAT(v.message(), HasSubstr("train.guard_on_streak = \"Rollback\" is not allowed"));
}

TEST(Config, HugeValuesAreQuotedBounded) {
  const std::string huge(10u << 20, 'x');
  for (const std::string& toml :
       {"[train]\nbackend = \"" + huge + "\"\n", "[train]\nmax_steps = 1" + huge + "\n",
        "[train]\n" + huge + " = 1\n", "[train]\nmax_steps = " + huge + "\n"}) {
    std::string e = error_of(toml);
    // Bounded by the excerpt, not the input: the rest is the list of known [train] keys, which grows.
    EXPECT_LT(e.size(), 1024u) << e.substr(0, 1024);
    EXPECT_THAT(e, HasSubstr(" bytes)"));  // says how much it left out
  }
  EXPECT_THAT(error_of("[train]\nbackend = \"" + huge + "\"\n"), HasSubstr("train.backend"));
}

TEST(Config, TomlSyntaxErrorsPassThrough) {
  EXPECT_THAT(error_of("[model]\nn_layer 2\n"), HasSubstr("test.toml:2"));
}

TEST(Config, MissingFileNamed) {
  Result<Config> c = config_load("/nonexistent/x.toml");
  ASSERT_FALSE(c.ok());
  EXPECT_THAT(c.error(), HasSubstr("/nonexistent/x.toml"));
}

TEST(Config, DumpParsesBackToTheSameConfig) {
  Config c;
  c.optim.lr = 0.1 + 0.2;  // not exactly representable in short decimal: the dump must keep every bit
  c.train.seed = 18446744073709551615ull >> 2;
  c.data.dir = "with \"quotes\"";
  Result<Config> back = config_parse(config_dump(c), "dump");
  ASSERT_TRUE(back.ok()) << back.error() << "\n" << config_dump(c);
  EXPECT_EQ(config_dump(back.value()), config_dump(c));
  EXPECT_EQ(back->optim.lr, c.optim.lr);
  EXPECT_TRUE(config_incompatibilities(c, back.value()).empty());
}

// A string the parser accepted through its "\n" escape must dump with the escape: a raw newline ended the
// dumped line mid-string, so a checkpoint's stored config did not parse back (found by the config fuzzer).
TEST(Config, DumpEscapesNewlinesAndTabsInStrings) {
  Result<Config> parsed = config_parse(
      "[model]\n[train]\n[data]\nkind = \"shards\"\ndir = \"a\\nb\\tc\\\\d \\\"e\\\"\"\n", "test.toml");
  ASSERT_TRUE(parsed.ok()) << parsed.error();
  EXPECT_EQ(parsed->data.dir, "a\nb\tc\\d \"e\"");
  Result<Config> back = config_parse(config_dump(parsed.value()), "dump");
  ASSERT_TRUE(back.ok()) << back.error() << "\n" << config_dump(parsed.value());
  EXPECT_EQ(back->data.dir, parsed->data.dir);
  EXPECT_EQ(config_dump(back.value()), config_dump(parsed.value()));
}

TEST(Config, IncompatibilitiesNameTheFields) {
  Config a, b;
  b.model.n_embd = 128;
  b.train.max_steps = a.train.max_steps + 100;  // may change on resume
  std::vector<std::string> d = config_incompatibilities(a, b);
  ASSERT_EQ(d.size(), 1u);
  EXPECT_THAT(d[0], HasSubstr("model.n_embd: checkpoint has 64, config has 128"));
}

}  // namespace
}  // namespace gantry
