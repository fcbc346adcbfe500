#include "engine/core/worker/slurm_nodelist.h"

#include <gtest/gtest.h>

namespace gantry {
namespace {

TEST(SlurmNodelist, FirstHostOfEachForm) {
  EXPECT_EQ(slurm_first_host("gpu17").value(), "gpu17");
  EXPECT_EQ(slurm_first_host("login1,login2").value(), "login1");
  EXPECT_EQ(slurm_first_host("gpu[01-04,07],login2").value(), "gpu01");
  EXPECT_EQ(slurm_first_host("gpu[7,3-5]").value(), "gpu7");  // Slurm's order, not the smallest
  EXPECT_EQ(slurm_first_host("rack[1-2]-n[008-009]").value(), "rack1-n008");
  EXPECT_EQ(slurm_first_host("node-a.cluster").value(), "node-a.cluster");
}

TEST(SlurmNodelist, MalformedListsAreNamed) {
  for (const char* bad : {"", ",gpu1", "gpu[01-04", "gpu]1", "gpu[]", "gpu[a-b]", "gpu[1-x]"}) {
    Result<std::string> r = slurm_first_host(bad);
    ASSERT_FALSE(r.ok()) << "'" << bad << "'";
    EXPECT_NE(r.error().find("Slurm node list '" + std::string(bad) + "'"), std::string::npos) << r.error();
  }
}

}  // namespace
}  // namespace gantry
