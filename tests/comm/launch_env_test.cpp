// Reading the launcher's environment (comm/launch_env.hpp): torchrun-style variables, srun's
// (with Slurm's compressed node lists), mpirun's, which wins when several are set, and a typed
// ConfigError naming the variable and its value for everything malformed or missing. The
// environments are maps handed to the reader; expected values are written out by hand.
#include "fourway/comm/launch_env.hpp"

#include <gtest/gtest.h>

#include <cstdlib>
#include <map>
#include <string>
#include <vector>

namespace fw = fourway;

namespace {

using Vars = std::map<std::string, std::string>;

fw::EnvLookup lookup(const Vars& vars) {
  return [vars](const std::string& name) -> std::optional<std::string> {
    const auto it = vars.find(name);
    if (it == vars.end()) return std::nullopt;
    return it->second;
  };
}

fw::LaunchEnv read(const Vars& vars) { return fw::read_launch_env(lookup(vars)); }

/// The ConfigError reading `vars` throws ("" when none).
std::string refusal(const Vars& vars) {
  try {
    (void)read(vars);
  } catch (const fw::ConfigError& e) {
    return e.what();
  }
  return {};
}

bool has(const std::string& s, const std::string& part) {
  return s.find(part) != std::string::npos;
}

const Vars torchrun{{"RANK", "5"},
                    {"WORLD_SIZE", "8"},
                    {"LOCAL_RANK", "1"},
                    {"MASTER_ADDR", "node-a.cluster"},
                    {"MASTER_PORT", "29500"}};

const Vars slurm{{"SLURM_PROCID", "6"},
                 {"SLURM_NTASKS", "16"},
                 {"SLURM_LOCALID", "2"},
                 {"SLURM_JOB_ID", "123456"},
                 {"SLURM_JOB_NODELIST", "gpu[01-04,07],login1"}};

Vars with(Vars v, const Vars& changes) {
  for (const auto& [k, x] : changes) v[k] = x;
  return v;
}
Vars without(Vars v, const std::string& name) {
  v.erase(name);
  return v;
}

/// `e` says launcher `l`, rank `rank` of `size`, local rank `local`, rank 0 at `addr`:`port`.
void expect_place(const fw::LaunchEnv& e, fw::Launcher l, int rank, int size, int local,
                  const std::string& addr, int port) {
  EXPECT_EQ(e.launcher, l);
  EXPECT_EQ(e.rank, rank);
  EXPECT_EQ(e.size, size);
  EXPECT_EQ(e.local_rank, local);
  EXPECT_EQ(e.master_addr, addr);
  EXPECT_EQ(e.master_port, port);
}

TEST(LaunchEnv, NoLauncherIsRankZeroOfOne) {
  expect_place(read({{"HOME", "/root"}, {"MASTER_ADDR", "x"}}), fw::Launcher::none, 0, 1, 0, "", 0);
}

TEST(LaunchEnv, TorchrunStyleVariablesGiveThePlaceAndRankZerosAddress) {
  const fw::LaunchEnv e = read(torchrun);
  expect_place(e, fw::Launcher::torchrun, 5, 8, 1, "node-a.cluster", 29500);
  const fw::RendezvousConfig c = fw::rendezvous_config(e, std::chrono::milliseconds(1500));
  EXPECT_EQ(c.host, "node-a.cluster");
  EXPECT_EQ(c.port, 29500);
  EXPECT_EQ(c.rank, 5);
  EXPECT_EQ(c.size, 8);
  EXPECT_EQ(c.deadline.count(), 1500);
}

TEST(LaunchEnv, SrunVariablesGiveThePlaceTheFirstHostAndAPortFromTheJob) {
  // the port: 10000 + 123456 % 20000 = 13456 (docs/comm.md's formula)
  expect_place(read(slurm), fw::Launcher::slurm, 6, 16, 2, "gpu01", 13456);
}

TEST(LaunchEnv, SrunTakesTheStepsNodeListFirstAndMasterAddrAndPortWhenSet) {
  // the step's list names where task 0 runs; the job's list may start elsewhere
  EXPECT_EQ(read(with(slurm, {{"SLURM_STEP_NODELIST", "gpu[03-04]"}})).master_addr, "gpu03");
  EXPECT_EQ(
      read(with(without(slurm, "SLURM_JOB_NODELIST"), {{"SLURM_NODELIST", "n7"}})).master_addr,
      "n7");
  expect_place(read(with(slurm, {{"MASTER_ADDR", "10.0.0.9"}, {"MASTER_PORT", "4242"}})),
               fw::Launcher::slurm, 6, 16, 2, "10.0.0.9", 4242);
  // with MASTER_PORT set the job id is not needed
  EXPECT_EQ(read(with(without(slurm, "SLURM_JOB_ID"), {{"MASTER_PORT", "4242"}})).master_port,
            4242);
}

TEST(LaunchEnv, SlurmNodeListsOfEveryFormGiveTheirFirstHost) {
  const std::vector<std::pair<std::string, std::string>> cases{
      {"gpu[01-04,07],login1", "gpu01"},
      {"node7", "node7"},
      {"login1,gpu[3-4]", "login1"},
      {"a[009-011]", "a009"},
      {"rack[2-3]-n[05-06]", "rack2-n05"},
      {"gpu[7,1-2]", "gpu7"},  // Slurm's order is the order written
      {"c-1.example.org,c-2.example.org", "c-1.example.org"},
  };
  for (const auto& [list, first] : cases) {
    EXPECT_EQ(fw::first_slurm_host(list), first) << list;
    EXPECT_EQ(read(with(slurm, {{"SLURM_JOB_NODELIST", list}})).master_addr, first) << list;
  }
}

TEST(LaunchEnv, SlurmNodeListsExpandInSlurmsOrder) {
  using L = std::vector<std::string>;
  EXPECT_EQ(fw::expand_slurm_nodelist("gpu[01-04,07],login1"),
            (L{"gpu01", "gpu02", "gpu03", "gpu04", "gpu07", "login1"}));
  EXPECT_EQ(fw::expand_slurm_nodelist("n[8-11]"), (L{"n8", "n9", "n10", "n11"}));
  EXPECT_EQ(fw::expand_slurm_nodelist("a[098-101]"), (L{"a098", "a099", "a100", "a101"}));
  EXPECT_EQ(fw::expand_slurm_nodelist("r[1-2]n[1-2]"), (L{"r1n1", "r1n2", "r2n1", "r2n2"}));
  EXPECT_EQ(fw::expand_slurm_nodelist("solo"), (L{"solo"}));
}

TEST(LaunchEnv, MalformedNodeListsAreConfigErrorsNamingTheList) {
  for (const std::string list : {"gpu[01-", "gpu]01[", "gpu[04-01]", "gpu[a-b]", "a,,b", "gpu[]",
                                 "gpu[1-2]]", "x,", "gpu[[1]]", "gpu[1-2,]"}) {
    try {
      (void)fw::expand_slurm_nodelist(list);
      ADD_FAILURE() << "accepted '" << list << "'";
    } catch (const fw::ConfigError& e) {
      EXPECT_TRUE(has(e.what(), "the Slurm node list '" + list + "' is malformed")) << e.what();
      EXPECT_TRUE(has(e.what(), "set MASTER_ADDR")) << e.what();
    }
    const std::string m = refusal(with(slurm, {{"SLURM_JOB_NODELIST", list}}));
    EXPECT_TRUE(has(m, "fourway: started by srun (SLURM_PROCID), but SLURM_JOB_NODELIST='" + list +
                           "' is malformed"))
        << list << ": " << m;
  }
  EXPECT_THROW((void)fw::expand_slurm_nodelist("n[1-100]", 50), fw::ConfigError);
  EXPECT_THROW((void)fw::expand_slurm_nodelist("a[1-8]b[1-8]", 50), fw::ConfigError);
  EXPECT_EQ(fw::expand_slurm_nodelist("a[1-5]b[1-10]", 50).size(), 50U);
}

TEST(LaunchEnv, TorchrunWinsOverMpirunAndSlurmAndMpirunOverSlurm) {
  const Vars mpirun{{"OMPI_COMM_WORLD_RANK", "3"},
                    {"OMPI_COMM_WORLD_SIZE", "4"},
                    {"OMPI_COMM_WORLD_LOCAL_RANK", "3"}};
  Vars all = torchrun;
  all.insert(slurm.begin(), slurm.end());
  all.insert(mpirun.begin(), mpirun.end());
  // srun torchrun ...: the inner launcher wins
  expect_place(read(all), fw::Launcher::torchrun, 5, 8, 1, "node-a.cluster", 29500);
  Vars mpi_in_slurm = slurm;
  mpi_in_slurm.insert(mpirun.begin(), mpirun.end());
  const fw::LaunchEnv e = read(mpi_in_slurm);  // mpirun inside an sbatch allocation
  expect_place(e, fw::Launcher::mpirun, 3, 4, 3, "", 0);
  EXPECT_THROW((void)fw::rendezvous_config(e, std::chrono::seconds(1)), fw::ConfigError);
}

TEST(LaunchEnv, MalformedValuesAreConfigErrorsNamingTheVariableAndValue) {
  const std::vector<std::pair<Vars, std::vector<std::string>>> cases{
      {with(torchrun, {{"RANK", "abc"}}), {"RANK='abc' is not a whole number"}},
      {with(torchrun, {{"RANK", "-1"}}), {"RANK='-1' is not a whole number"}},
      {with(torchrun, {{"RANK", " 1"}}), {"RANK=' 1' is not a whole number"}},
      {with(torchrun, {{"RANK", "3x"}}), {"RANK='3x' is not a whole number"}},
      {with(torchrun, {{"RANK", ""}}), {"RANK is empty"}},
      {with(torchrun, {{"RANK", "8"}}), {"RANK=8 is not below WORLD_SIZE=8", "ranks are 0..7"}},
      {with(torchrun, {{"WORLD_SIZE", "0"}}), {"WORLD_SIZE=0 is not in 1.."}},
      {with(torchrun, {{"LOCAL_RANK", "8"}}), {"LOCAL_RANK=8 is not in 0..7"}},
      {with(torchrun, {{"MASTER_PORT", "70000"}}), {"MASTER_PORT=70000 is not in 1..65535"}},
      {with(torchrun, {{"MASTER_PORT", "29500a"}}), {"MASTER_PORT='29500a' is not a whole"}},
      {with(slurm, {{"SLURM_PROCID", "16"}}), {"SLURM_PROCID=16 is not below SLURM_NTASKS=16"}},
      {with(slurm, {{"SLURM_NTASKS", "many"}}), {"SLURM_NTASKS='many' is not a whole number"}},
      {with(slurm, {{"SLURM_JOB_ID", "j1"}}), {"SLURM_JOB_ID='j1' is not a whole number"}},
      {with(slurm, {{"MASTER_PORT", "0"}}), {"MASTER_PORT=0 is not in 1..65535"}},
  };
  for (const auto& [vars, parts] : cases) {
    const std::string m = refusal(vars);
    ASSERT_FALSE(m.empty()) << "accepted: " << parts.front();
    EXPECT_TRUE(has(m, "fourway: started by ")) << m;
    for (const std::string& p : parts) EXPECT_TRUE(has(m, p)) << m;
  }
}

TEST(LaunchEnv, AMissingPartnerVariableIsAConfigErrorNamingIt) {
  const std::vector<std::pair<Vars, std::string>> cases{
      {without(torchrun, "WORLD_SIZE"), "WORLD_SIZE is not set"},
      {without(torchrun, "RANK"), "RANK is not set"},
      {without(torchrun, "LOCAL_RANK"), "LOCAL_RANK is not set"},
      {without(torchrun, "MASTER_ADDR"), "MASTER_ADDR is not set"},
      {without(torchrun, "MASTER_PORT"), "MASTER_PORT is not set"},
      {without(slurm, "SLURM_NTASKS"), "SLURM_NTASKS is not set"},
      {without(slurm, "SLURM_LOCALID"), "SLURM_LOCALID is not set"},
      {without(slurm, "SLURM_JOB_ID"), "SLURM_JOB_ID is not set"},
      {without(slurm, "SLURM_JOB_NODELIST"), "none of SLURM_STEP_NODELIST, SLURM_JOB_NODELIST"},
      {{{"OMPI_COMM_WORLD_RANK", "0"}}, "OMPI_COMM_WORLD_SIZE is not set"},
  };
  for (const auto& [vars, part] : cases) {
    const std::string m = refusal(vars);
    EXPECT_TRUE(has(m, part)) << part << ": " << m;
    EXPECT_TRUE(has(m, ": set ")) << m;  // and the fix
  }
}

TEST(LaunchEnv, TheProcessEnvironmentIsRead) {
  ::setenv("FOURWAY_LAUNCH_ENV_TEST_PROBE", "probe-7", 1);
  const fw::EnvLookup env = fw::process_env();
  EXPECT_EQ(env("FOURWAY_LAUNCH_ENV_TEST_PROBE"), std::optional<std::string>("probe-7"));
  ::unsetenv("FOURWAY_LAUNCH_ENV_TEST_PROBE");
  EXPECT_EQ(env("FOURWAY_LAUNCH_ENV_TEST_PROBE"), std::nullopt);
}

}  // namespace
