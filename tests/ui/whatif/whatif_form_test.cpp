// The what-if form's validation: every problem is reported under the form field it concerns, with a
// message that says what is allowed; a valid form becomes exactly the planner input it describes.
#include "ui/whatif/whatif_form.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace gantry::whatif {
namespace {

using ::testing::HasSubstr;

// The message of the issue under `field`, or "" when there is none.
std::string issue(const std::vector<FormIssue>& issues, const std::string& field) {
  for (const FormIssue& i : issues) {
    if (i.field == field) return i.message;
  }
  return "";
}

TEST(WhatIfForm, TheDefaultFormIsValid) {
  const WhatIfForm f;
  EXPECT_TRUE(whatif_form_check(f).empty());
  Result<PlanInput> in = whatif_form_input(f);
  ASSERT_TRUE(in.ok()) << in.error();
  EXPECT_EQ(in->model.name, "gpt2-124m");
  EXPECT_EQ(in->cluster.gpus, 8);
  EXPECT_EQ(in->cluster.gpu.name, "h100");
}

TEST(WhatIfForm, OutOfRangeFieldsAreAllReportedTogether) {
  WhatIfForm f;
  f.gpus = 0;
  f.layout.zero = 4;
  f.layout.micro_batch = 0;
  f.gpu = "tpu-v9";
  const std::vector<FormIssue> issues = whatif_form_check(f);
  EXPECT_EQ(issues.size(), 4u);
  EXPECT_THAT(issue(issues, "gpus"), HasSubstr("gpus = 0: allowed 1.."));
  EXPECT_THAT(issue(issues, "zero"), HasSubstr("zero = 4: allowed 0..3"));
  EXPECT_THAT(issue(issues, "micro_batch"), HasSubstr("micro_batch = 0: allowed 1.."));
  EXPECT_THAT(issue(issues, "gpu"), HasSubstr("unknown GPU kind 'tpu-v9': allowed a100-40gb"));
  EXPECT_FALSE(whatif_form_input(f).ok());
}

TEST(WhatIfForm, GpusMustBeAMultipleOfTheModelParallelDegrees) {
  WhatIfForm f;
  f.gpus = 12;
  f.layout.tp = 8;
  const std::vector<FormIssue> issues = whatif_form_check(f);
  ASSERT_EQ(issues.size(), 1u);
  EXPECT_EQ(issues[0].field, "gpus");
  EXPECT_EQ(issues[0].message, "12 GPUs is not a multiple of tp × cp × pp = 8 × 1 × 1 = 8");
}

TEST(WhatIfForm, AnExplicitDpMustMatchTheGpus) {
  WhatIfForm f;
  f.gpus = 8;
  f.layout.tp = 2;
  f.layout.dp = 2;
  const std::vector<FormIssue> issues = whatif_form_check(f);
  ASSERT_EQ(issues.size(), 1u);
  EXPECT_EQ(issues[0].field, "dp");
  EXPECT_THAT(issues[0].message, HasSubstr("so dp = 4 (or 0 to derive it)"));
}

TEST(WhatIfForm, TensorParallelismStaysInsideANode) {
  WhatIfForm f;
  f.gpus = 16;
  f.gpus_per_node = 4;
  f.layout.tp = 8;  // divides heads (12)? no — but the node rule comes first and is the clearer one
  const std::vector<FormIssue> issues = whatif_form_check(f);
  ASSERT_EQ(issues.size(), 1u);
  EXPECT_EQ(issues[0].field, "tp");
  EXPECT_THAT(issues[0].message, HasSubstr("keep tp <= gpus_per_node"));
}

TEST(WhatIfForm, ThePlannersRefusalsLandUnderTheFieldTheyName) {
  WhatIfForm f;
  f.gpus = 8;
  f.layout.tp = 8;  // gpt2-124m has 12 heads: tp 8 does not divide them
  std::vector<FormIssue> issues = whatif_form_check(f);
  ASSERT_EQ(issues.size(), 1u);
  EXPECT_EQ(issues[0].field, "tp");
  EXPECT_THAT(issues[0].message, HasSubstr("must be >= 1 and divide heads (12)"));

  f.layout.tp = 1;
  f.layout.micro_batch = 3;
  f.global_batch = 32;  // 8 ranks × 3 sequences do not divide 32
  issues = whatif_form_check(f);
  ASSERT_EQ(issues.size(), 1u);
  EXPECT_EQ(issues[0].field, "global_batch");
  EXPECT_THAT(issues[0].message, HasSubstr("must be a multiple of dp × micro_batch = 8 × 3"));
}

TEST(WhatIfForm, CustomDimensionsAreCheckedByThePlannersModelRules) {
  WhatIfForm f;
  f.custom_model = true;
  f.model.hidden = 768;
  f.model.heads = 5;
  std::vector<FormIssue> issues = whatif_form_check(f);
  ASSERT_EQ(issues.size(), 1u);
  EXPECT_EQ(issues[0].field, "model.heads");
  EXPECT_THAT(issues[0].message, HasSubstr("must be >= 1 and divide hidden (768)"));

  f.model.heads = 12;
  f.model.layers = 6;
  EXPECT_TRUE(whatif_form_check(f).empty());
  Result<PlanInput> in = whatif_form_input(f);
  ASSERT_TRUE(in.ok());
  EXPECT_EQ(in->model.layers, 6);
}

TEST(WhatIfForm, AnUnknownPresetIsNamed) {
  WhatIfForm f;
  f.preset = "gpt5";
  const std::vector<FormIssue> issues = whatif_form_check(f);
  ASSERT_EQ(issues.size(), 1u);
  EXPECT_EQ(issues[0].field, "model");
  EXPECT_THAT(issues[0].message, HasSubstr("unknown model preset 'gpt5': allowed gpt2-124m"));
}

TEST(WhatIfForm, TheInputCarriesTheEnginesMeasuredEfficiency) {
  WhatIfForm f;
  f.engine = EngineKind::kGantryCuda;
  f.gpus = 1;
  Result<PlanInput> in = whatif_form_input(f);
  ASSERT_TRUE(in.ok());
  EXPECT_EQ(in->cluster.gpu.compute_efficiency, kGantryCudaHopperEfficiency);
  EXPECT_EQ(in->engine, EngineKind::kGantryCuda);
  EXPECT_TRUE(whatif_form_check(f).empty());
  f.gpus = 2;  // dp 2: the engine profile has the rank's table
  EXPECT_TRUE(whatif_form_check(f).empty());
  f.layout.cp = 2;  // context parallel is not in it
  const std::vector<FormIssue> issues = whatif_form_check(f);
  ASSERT_EQ(issues.size(), 1u);
  EXPECT_THAT(issues[0].message, HasSubstr("cp and hsdp are not in its table"));
}

}  // namespace
}  // namespace gantry::whatif
