// fourway-train --backend strict (docs/comm.md, "The strict world"): every strategy, schedule
// and program flag that talks to a communicator, run with LocalWorld held to NCCL's contract.
// A host pointer handed to a communicator, a pipeline exchange that waits for itself, or a
// gather on an unbound group fails these runs; their losses must equal the lenient world's
// bitwise (the strict world moves the same bytes the same way), and --check must pass.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <sstream>
#include <string>
#include <vector>

#include "fourway/checkpoint/safetensors.hpp"
#include "support/program.hpp"

namespace fw = fourway;

namespace {

const std::string exe = FOURWAY_TRAIN_EXE;

std::filesystem::path scratch(const std::string& name) {
  return fw::test::scratch_path("fourway_train_strict_test", name);
}

fw::test::ProgramRun run(const std::string& args) {
  return fw::test::run_program(exe, args, "fourway_train_strict_test");
}

/// The "loss" of every line of a --log-json file.
std::vector<double> losses(const std::filesystem::path& log) {
  std::vector<double> v;
  std::istringstream in(fw::test::slurp(log));
  for (std::string l; std::getline(in, l);) {
    const auto k = l.find("\"loss\":");
    if (k != std::string::npos) v.push_back(std::strtod(l.c_str() + k + 7, nullptr));
  }
  return v;
}

const std::string shape = "--dim 32 --heads 4 --vocab 256 --seq 8 --batch 8 --seed 3 ";
const std::string tiny = "--layers 2 " + shape;

}  // namespace

// Every flag that gathers, saves, resumes or reports on a 3D mesh with ZeRO-3, strict against
// lenient: the same losses bit for bit, the same saved file byte for byte, a resumed run that
// continues the uninterrupted one.
TEST(FourwayTrainStrict, EveryFlagOnA3DMeshMatchesTheLenientWorld) {
  const std::string mesh = tiny + "--tp 2 --pp 2 --dp 2 --zero 3 --micro-batches 2 ";
  std::vector<double> lenient, strict;
  for (const std::string backend : {"local", "strict"}) {
    const auto log = scratch(backend + ".jsonl"), file = scratch(backend + ".safetensors"),
               dir = scratch(backend + "_dir");
    std::filesystem::remove_all(dir);
    fw::test::ProgramRun r = run(mesh + "--backend " + backend + " --steps 4 --log-json '" +
                                 log.string() + "' --save '" + file.string() + "' --save-dir '" +
                                 dir.string() + "' --save-every 2 --memory-report --quiet");
    ASSERT_EQ(r.status, 0) << backend << ": " << r.err << r.out;
    EXPECT_NE(r.out.find("memory of rank 0"), std::string::npos) << r.out;
    (backend == "local" ? lenient : strict) = losses(log);
    // resume at step 2 in the same world and continue to step 4
    const auto resumed = scratch(backend + "_resumed.jsonl");
    r = run(mesh + "--backend " + backend + " --steps 4 --resume '" +
            (dir / "step-00000002").string() + "' --log-json '" + resumed.string() + "' --quiet");
    ASSERT_EQ(r.status, 0) << backend << ": " << r.err;
    const auto whole = losses(log), tail = losses(resumed);
    ASSERT_EQ(whole.size(), 4u);
    ASSERT_EQ(tail.size(), 2u);
    EXPECT_EQ(tail[0], whole[2]) << backend;
    EXPECT_EQ(tail[1], whole[3]) << backend;
  }
  EXPECT_EQ(strict, lenient);
  EXPECT_EQ(fw::test::slurp(scratch("strict.safetensors")),
            fw::test::slurp(scratch("local.safetensors")));
}

// --check in the strict world for every strategy and every schedule (and context parallelism),
// with more micro-batches
// than stages (where interleaved and ZB-V need their sends not to hold the rank back).
TEST(FourwayTrainStrict, CheckPassesForEveryStrategyAndSchedule) {
  const std::vector<std::string> meshes = {
      "--ranks 4 --zero 0",
      "--ranks 4 --zero 1",
      "--ranks 4 --zero 2",
      "--ranks 4 --zero 3",
      "--tp 2 --dp 2 --zero 1",
      "--tp 2 --sequence-parallel --dp 2 --zero 3",
      "--pp 2 --micro-batches 4 --schedule gpipe",
      "--pp 2 --micro-batches 4 --schedule 1f1b --dp 2 --zero 2",
      "--pp 2 --micro-batches 4 --schedule interleaved",
      "--pp 2 --micro-batches 4 --schedule zb-h1",
      "--pp 2 --micro-batches 4 --schedule zb-v",
      "--tp 2 --pp 2 --dp 2 --zero 3 --micro-batches 2",
      // context parallelism (issue 48): the ring's sends and recvs, grouped, in the strict world
      "--cp 2 --dp 2 --zero 3",
      "--tp 2 --cp 2 --pp 2 --micro-batches 2 --schedule interleaved",
  };
  for (const auto& m : meshes) {
    const fw::test::ProgramRun r =
        run("--layers 4 " + shape + "--steps 2 --backend strict --check " + m);
    EXPECT_EQ(r.status, 0) << m << "\n" << r.out << r.err;
    EXPECT_NE(r.out.find("check passed"), std::string::npos) << m << "\n" << r.out;
  }
}

// A pipeline whose messages exceed NCCL's default 4 MiB buffer (NCCL_BUFFSIZE), where a send
// that waited for its recv on one stream would deadlock: 80 rows x 256 positions x width 64 in
// fp32 is 5.24 MB per activation (a narrow model keeps the step cheap).
TEST(FourwayTrainStrict, PipelineMessagesLargerThanNcclsBufferComplete) {
  for (const std::string schedule : {"1f1b", "interleaved"}) {
    const fw::test::ProgramRun r =
        run("--layers 4 --dim 64 --heads 4 --vocab 256 --seq 256 --batch 160 --micro-batches 2 "
            "--pp 2 --steps 1 --quiet --backend strict --schedule " +
            schedule);
    EXPECT_EQ(r.status, 0) << schedule << ": " << r.err;
  }
}

// --comm-timeout is the deadline of every wait; nonsense is refused before anything runs.
TEST(FourwayTrainStrict, CommTimeoutIsCheckedAndUsed) {
  for (const std::string bad : {"0", "-1"}) {
    const fw::test::ProgramRun r = run(tiny + "--steps 1 --comm-timeout " + bad);
    EXPECT_EQ(r.status, 1) << bad;
    EXPECT_NE(r.err.find("--comm-timeout must be in (0, 1e6] seconds"), std::string::npos) << r.err;
  }
  const fw::test::ProgramRun r =
      run(tiny + "--steps 1 --ranks 2 --backend strict --comm-timeout 30 --quiet");
  EXPECT_EQ(r.status, 0) << r.err;
}
