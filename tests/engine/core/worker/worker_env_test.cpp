// Reading a worker's place in the gang from torchrun's, Slurm's and our launcher's variables; the
// rendezvous address; the test-only fault variable.
#include "engine/core/worker/worker_env.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <map>
#include <string>

namespace gantry {
namespace {

using ::testing::HasSubstr;
using Vars = std::map<std::string, std::string>;

Result<WorkerEnv> read(const Vars& vars) {
  return worker_env_read([&](const char* name) -> const char* {
    auto it = vars.find(name);
    return it == vars.end() ? nullptr : it->second.c_str();
  });
}

const Vars kTorchrun = {{"RANK", "5"},
                        {"WORLD_SIZE", "8"},
                        {"LOCAL_RANK", "1"},
                        {"LOCAL_WORLD_SIZE", "4"},
                        {"MASTER_ADDR", "node0"},
                        {"MASTER_PORT", "29500"}};

TEST(WorkerEnv, TorchrunVariables) {
  Result<WorkerEnv> e = read(kTorchrun);
  ASSERT_TRUE(e.ok()) << e.error();
  EXPECT_STREQ(e->source, "torchrun");
  EXPECT_EQ(e->rank, 5);
  EXPECT_EQ(e->world, 8);
  EXPECT_EQ(e->local_rank, 1);
  EXPECT_EQ(e->local_world, 4);
  EXPECT_EQ(e->master_addr, "node0");
  EXPECT_EQ(e->master_port, 29500);
  EXPECT_EQ(e->store_fd, -1);
}

TEST(WorkerEnv, GantryLauncherAddsTheStoreSocket) {
  Vars v = {{"RANK", "0"},
            {"WORLD_SIZE", "2"},
            {"LOCAL_RANK", "0"},
            {"LOCAL_WORLD_SIZE", "2"},
            {"MASTER_ADDR", "127.0.0.1"},
            {"GANTRY_STORE_FD", "7"}};
  Result<WorkerEnv> e = read(v);
  ASSERT_TRUE(e.ok()) << e.error();
  EXPECT_EQ(e->store_fd, 7);
  EXPECT_EQ(e->master_port, 0);  // not needed with an inherited socket
}

TEST(WorkerEnv, SlurmVariables) {
  Vars v = {
      {"SLURM_PROCID", "6"}, {"SLURM_NTASKS", "16"}, {"SLURM_LOCALID", "2"}, {"SLURM_NTASKS_PER_NODE", "8"}};
  Result<WorkerEnv> e = read(v);
  ASSERT_TRUE(e.ok()) << e.error();
  EXPECT_STREQ(e->source, "slurm");
  EXPECT_EQ(e->rank, 6);
  EXPECT_EQ(e->world, 16);
  EXPECT_EQ(e->local_rank, 2);
  EXPECT_EQ(e->local_world, 8);
  // Uneven layouts ("2(x3),1") leave the local world unknown rather than guessed.
  v["SLURM_NTASKS_PER_NODE"] = "2(x3),1";
  e = read(v);
  ASSERT_TRUE(e.ok()) << e.error();
  EXPECT_EQ(e->local_world, 0);
}

TEST(WorkerEnv, SlurmRendezvousHostIsTheNodeListsFirst) {
  Vars v = {{"SLURM_PROCID", "1"},
            {"SLURM_NTASKS", "8"},
            {"SLURM_LOCALID", "1"},
            {"SLURM_JOB_NODELIST", "gpu[07-08],login3"},
            {"MASTER_PORT", "29500"}};
  Result<WorkerEnv> e = read(v);
  ASSERT_TRUE(e.ok()) << e.error();
  EXPECT_EQ(e->master_addr, "gpu07");
  EXPECT_EQ(e->master_port, 29500);
  v["MASTER_ADDR"] = "10.0.0.5";  // an explicit address wins
  EXPECT_EQ(read(v)->master_addr, "10.0.0.5");
  v.erase("MASTER_ADDR");
  v["SLURM_JOB_NODELIST"] = "gpu[07-08";
  e = read(v);
  ASSERT_FALSE(e.ok());
  EXPECT_THAT(e.error(), HasSubstr("Slurm node list 'gpu[07-08'"));
}

TEST(WorkerEnv, TorchrunWinsOverSlurm) {
  Vars v = kTorchrun;
  v["SLURM_PROCID"] = "0";
  v["SLURM_NTASKS"] = "1";
  v["SLURM_LOCALID"] = "0";
  Result<WorkerEnv> e = read(v);
  ASSERT_TRUE(e.ok()) << e.error();
  EXPECT_STREQ(e->source, "torchrun");
  EXPECT_EQ(e->rank, 5);
}

TEST(WorkerEnv, NoRankAtAllSaysHowToStartWorkers) {
  Result<WorkerEnv> e = read({});
  ASSERT_FALSE(e.ok());
  EXPECT_THAT(e.error(), HasSubstr("RANK and WORLD_SIZE are not set"));
  EXPECT_THAT(e.error(), HasSubstr("SLURM_PROCID"));
  EXPECT_THAT(e.error(), HasSubstr("gantry-engine run --nproc N"));
}

TEST(WorkerEnv, MissingVariablesAreNamed) {
  for (const char* name : {"WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"}) {
    Vars v = kTorchrun;
    v.erase(name);
    Result<WorkerEnv> e = read(v);
    ASSERT_FALSE(e.ok()) << name;
    EXPECT_THAT(e.error(), HasSubstr(std::string(name) + " is not set")) << e.error();
  }
  Vars v = kTorchrun;
  v.erase("RANK");  // WORLD_SIZE alone still means torchrun-style, so RANK is missing
  Result<WorkerEnv> e = read(v);
  ASSERT_FALSE(e.ok());
  EXPECT_THAT(e.error(), HasSubstr("RANK is not set"));
  Vars s = {{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "2"}};
  e = read(s);
  ASSERT_FALSE(e.ok());
  EXPECT_THAT(e.error(), HasSubstr("SLURM_LOCALID is not set"));
}

TEST(WorkerEnv, BadValuesAreNamedWithTheAllowedRange) {
  struct Case {
    const char* name;
    const char* value;
    const char* expect;
  };
  for (const Case& c :
       {Case{"WORLD_SIZE", "four", "WORLD_SIZE = 'four': expected an integer in 1.."},
        Case{"WORLD_SIZE", "0", "WORLD_SIZE = '0'"},
        Case{"RANK", "8", "RANK = '8': expected an integer in 0..7"}, Case{"RANK", "-1", "RANK = '-1'"},
        Case{"RANK", "3x", "RANK = '3x'"}, Case{"RANK", " 3", "RANK = ' 3'"}, Case{"RANK", "", "RANK = ''"},
        Case{"LOCAL_RANK", "4", "LOCAL_RANK = '4': expected an integer in 0..3"},
        Case{"LOCAL_WORLD_SIZE", "9", "LOCAL_WORLD_SIZE = '9': expected an integer in 1..8"},
        Case{"MASTER_PORT", "0", "MASTER_PORT = '0': expected an integer in 1..65535"},
        Case{"MASTER_PORT", "70000", "MASTER_PORT = '70000'"},
        Case{"MASTER_PORT", "http", "MASTER_PORT = 'http'"},
        Case{"MASTER_ADDR", "", "MASTER_ADDR is set but empty"},
        Case{"GANTRY_STORE_FD", "-3", "GANTRY_STORE_FD = '-3'"},
        Case{"GANTRY_STORE_FD", "sock", "GANTRY_STORE_FD = 'sock'"}}) {
    Vars v = kTorchrun;
    v[c.name] = c.value;
    Result<WorkerEnv> e = read(v);
    ASSERT_FALSE(e.ok()) << c.name << "=" << c.value;
    EXPECT_THAT(e.error(), HasSubstr(c.expect));
  }
  Vars s = {{"SLURM_PROCID", "4"}, {"SLURM_NTASKS", "4"}, {"SLURM_LOCALID", "0"}};
  Result<WorkerEnv> e = read(s);
  ASSERT_FALSE(e.ok());
  EXPECT_THAT(e.error(), HasSubstr("SLURM_PROCID = '4': expected an integer in 0..3"));
}

TEST(WorkerEnv, HostPort) {
  Result<HostPort> a = host_port_parse("10.0.0.1:29500", "--rendezvous");
  ASSERT_TRUE(a.ok()) << a.error();
  EXPECT_EQ(a->host, "10.0.0.1");
  EXPECT_EQ(a->port, 29500);
  Result<HostPort> b = host_port_parse("[::1]:80", "--rendezvous");
  ASSERT_TRUE(b.ok()) << b.error();
  EXPECT_EQ(b->host, "::1");
  EXPECT_EQ(b->port, 80);
  Result<HostPort> c = host_port_parse("node-7.cluster:1", "--rendezvous");
  ASSERT_TRUE(c.ok()) << c.error();
  EXPECT_EQ(c->host, "node-7.cluster");
  for (const char* bad :
       {"node0", "node0:", ":29500", "node0:0", "node0:65536", "node0:29x", "::1:80", "[::1]80", "[::1:80"}) {
    Result<HostPort> r = host_port_parse(bad, "--rendezvous");
    ASSERT_FALSE(r.ok()) << bad;
    EXPECT_THAT(r.error(), HasSubstr(std::string("--rendezvous '") + bad + "'"));
    EXPECT_THAT(r.error(), HasSubstr("expected HOST:PORT"));
  }
}

TEST(WorkerEnv, TestFaultParsing) {
  Result<WorkerFault> f = worker_fault_parse("1:exit_at_start", 1);
  ASSERT_TRUE(f.ok()) << f.error();
  EXPECT_EQ(f->kind, WorkerFault::exit_at_start);
  f = worker_fault_parse("1:exit_at_start", 0);
  ASSERT_TRUE(f.ok());
  EXPECT_EQ(f->kind, WorkerFault::none);
  f = worker_fault_parse("0:hang_at_start,2:exit_after_step:7", 2);
  ASSERT_TRUE(f.ok()) << f.error();
  EXPECT_EQ(f->kind, WorkerFault::exit_after_step);
  EXPECT_EQ(f->step, 7);
  f = worker_fault_parse("0:hang_at_start,2:exit_after_step:7", 0);
  ASSERT_TRUE(f.ok());
  EXPECT_EQ(f->kind, WorkerFault::hang_at_start);
  f = worker_fault_parse("1:nan_grad:3", 1);
  ASSERT_TRUE(f.ok()) << f.error();
  EXPECT_EQ(f->kind, WorkerFault::nan_grad);
  EXPECT_EQ(f->step, 3);
  f = worker_fault_parse("0:nan_grad:2,3:flip_bit:5", 3);
  ASSERT_TRUE(f.ok()) << f.error();
  EXPECT_EQ(f->kind, WorkerFault::flip_bit);
  EXPECT_EQ(f->step, 5);
  for (const char* bad :
       {"exit_at_start", "x:exit_at_start", "1:explode", "1:exit_after_step:", "1:exit_after_step:0",
        "1:exit_at_start,", "1:nan_grad:0", "1:nan_grad:", "1:flip_bit:0", "1:flip_bit:x", "1:flip_bit"}) {
    Result<WorkerFault> r = worker_fault_parse(bad, 1);
    ASSERT_FALSE(r.ok()) << bad;
    EXPECT_THAT(r.error(), HasSubstr("GANTRY_TEST_WORKER_FAULT"));
    EXPECT_THAT(r.error(), HasSubstr("<rank>:flip_bit:<k>"));
  }
}

TEST(WorkerEnv, CheckpointFaultParsing) {
  Result<WorkerFault> f = worker_fault_parse("0:kill_in_checkpoint:before_commit:4", 0);
  ASSERT_TRUE(f.ok()) << f.error();
  EXPECT_EQ(f->kind, WorkerFault::kill_in_checkpoint);
  EXPECT_EQ(f->stage, CheckpointStage::kBeforeCommit);
  EXPECT_EQ(f->step, 4);
  f = worker_fault_parse("1:hold_checkpoint:2", 1);
  ASSERT_TRUE(f.ok()) << f.error();
  EXPECT_EQ(f->kind, WorkerFault::hold_checkpoint);
  EXPECT_EQ(f->step, 2);
  for (const char* bad :
       {"1:kill_in_checkpoint:flush:4", "1:kill_in_checkpoint:write", "1:kill_in_checkpoint:write:0",
        "1:hold_checkpoint:", "1:kill_in_checkpoint:wait_previous:2"}) {
    Result<WorkerFault> r = worker_fault_parse(bad, 1);
    ASSERT_FALSE(r.ok()) << bad;
    EXPECT_THAT(r.error(), HasSubstr("GANTRY_TEST_WORKER_FAULT"));
  }
  Result<WorkerFault> r = worker_fault_parse("1:kill_in_checkpoint:flush:4", 1);
  EXPECT_THAT(r.error(), HasSubstr("copy, write, before_commit or after_commit"));
}

}  // namespace
}  // namespace gantry
