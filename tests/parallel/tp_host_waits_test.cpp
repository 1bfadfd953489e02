// The host waits of a tensor-parallel training step (issue 43): the split models::Gpt under
// TensorParallelStrategy on a LocalWorld of tp ranks (dp = 1), every group a Counting<LocalComm>
// that records how each operation was completed (comm/counting.hpp), and the context's count of
// synchronising calls (core/sync_counter.hpp). The counts are what the algorithm asks for, so
// they hold for the same step on NCCL, where a device order costs the host nothing and a host
// wait drains the GPU's queue.
//
// A step's irreducible host waits, named (train/sharded_strategy.hpp `finish_step`,
// parallel/step_scalars.hpp):
//   1. dp group, all_reduce: the step scalars (loss sum, and Σg² under ZeRO) summed over the
//      data-parallel replicas, waited on the host with the deadline;
//   2. tp group, all_reduce: Σg² of every rank's slices summed over the tensor-parallel group
//      (`sum_over_model_parallel`), likewise;
//   3. the context's one synchronising call: the read-back of those scalars.
// Everything inside the layers is ordered on the device: the conjugate all-reduces / all-gathers
// / reduce-scatters and the vocabulary-parallel loss's two all-reduces, whose number below comes
// from the algorithm (Megatron-LM's f/g, Korthikanti et al.'s ḡ/ḡ'), not from the code, and the
// loss never leaves the device before the step's end (Gpt::forward_into).
#include <gtest/gtest.h>

#include <array>
#include <cstdint>
#include <cstdio>
#include <mutex>
#include <string>
#include <vector>

#include "tp_harness.hpp"

namespace {

struct StepWaits {
  std::uint64_t syncs = 0;  // the context's synchronising calls in the step
  std::uint64_t tp_host = 0;
  std::uint64_t dp_host = 0;
  std::uint64_t other_host = 0;  // host waits in any other group (none expected)
  fw::OpCount tp_all_reduce, tp_reduce_scatter, tp_all_gather, dp_all_reduce;
  std::string table;  // the counters, for the failure message
};

/// Step 1's counts on every rank (step 0 warms up: it is the same algorithm, but a first step
/// may set things up once).
std::vector<StepWaits> measure(int tp, bool sequence_parallel, int micro_batches) {
  using Model = fw::models::Gpt<float, fw::Host, tph::Comm>;
  using S = fw::TensorParallelStrategy<0, float, fw::Host, tph::Comm>;
  std::vector<StepWaits> out(static_cast<std::size_t>(tp));
  std::mutex mu;
  fw::launch<fw::LocalWorld>(tp, [&](fw::World<fw::LocalWorld>& w) {
    const tph::TpMesh mesh(tp, {.tp = tp});
    tph::Comm all(w.comm().split(0, w.rank(), "world"));
    fw::MeshGroups<tph::Comm> groups(mesh, all);
    fw::tp::TpOptions to;
    to.sequence_parallel = sequence_parallel;
    Model model(w.ctx(), tph::config(), groups.tp(), tph::kSeed, to);
    fw::TrainerOptions topt;
    topt.micro_batches = micro_batches;
    fw::Trainer<S> t(topt, w.ctx(), model, groups.dp(), tph::adamw());
    (void)t.step(tph::batch(0).view());
    all.counters().reset();
    const std::uint64_t before = w.ctx().syncs();
    (void)t.step(tph::batch(1).view());
    StepWaits s;
    s.syncs = w.ctx().syncs() - before;
    const auto& k = all.counters();
    const std::string tp_name = groups.group_name(fw::Axis::tp);
    const std::string dp_name = groups.group_name(fw::Axis::dp);
    s.tp_host = k.completed(tp_name, fw::Completion::host_wait);
    s.dp_host = k.completed(dp_name, fw::Completion::host_wait);
    s.other_host = k.completed({}, fw::Completion::host_wait) - s.tp_host - s.dp_host;
    s.tp_all_reduce = k.get(tp_name, fw::CommOp::all_reduce);
    s.tp_reduce_scatter = k.get(tp_name, fw::CommOp::reduce_scatter);
    s.tp_all_gather = k.get(tp_name, fw::CommOp::all_gather);
    s.dp_all_reduce = k.get(dp_name, fw::CommOp::all_reduce);
    s.table = k.table();
    std::lock_guard lock(mu);
    out[static_cast<std::size_t>(w.rank())] = s;
  });
  return out;
}

/// The collectives of the layers in one forward + backward of a GPT of L blocks over a
/// tensor-parallel group, from the operators' definitions (layers/conjugate.hpp's table):
///   without sequence parallelism, all-reduces: the embedding's g (1), per block two g forward
///     and two f backward (4L), the loss's MAX and SUM (2), the head's f backward (1);
///   with it: per block ḡ (all-gather) before each column split and ḡ' (reduce-scatter) after
///     each row split, forward and backward (4L of each), the embedding's ḡ' forward and ḡ
///     backward, the head's ḡ forward and ḡ' backward (2 more of each); all-reduces: the loss's
///     two, the LayerNorm gains' and biases' gradients of the 2L block norms and ln_f (2L + 1).
struct LayerCollectives {
  std::uint64_t all_reduce, reduce_scatter, all_gather;
};
LayerCollectives per_micro_batch(int layers, bool sp) {
  const auto L = static_cast<std::uint64_t>(layers);
  if (!sp) return {4 * L + 4, 0, 0};
  return {2 * L + 3, 4 * L + 2, 4 * L + 2};
}

}  // namespace

class TpHostWaits : public ::testing::TestWithParam<std::tuple<bool, int>> {};

TEST_P(TpHostWaits, AreTheStepScalarsAloneAndNoneInsideTheLayers) {
  const auto [sp, micro_batches] = GetParam();
  const int tp = 2;
  const auto got = measure(tp, sp, micro_batches);
  const auto M = static_cast<std::uint64_t>(micro_batches);
  const LayerCollectives layer = per_micro_batch(tph::config().layers, sp);
  for (std::size_t r = 0; r < got.size(); ++r) {
    const StepWaits& s = got[r];
    const std::string where = std::string(sp ? "tp2 + sequence parallel" : "tp2") + ", " +
                              std::to_string(micro_batches) + " micro-batch(es), rank " +
                              std::to_string(r) + "\n" + s.table;
    // the irreducible ones (named in the file comment)
    EXPECT_EQ(s.syncs, 1u) << "the scalars' read-back only; " << where;
    EXPECT_EQ(s.dp_host, 1u) << "the step scalars over dp; " << where;
    EXPECT_EQ(s.dp_all_reduce.host_waits, 1u) << where;
    EXPECT_EQ(s.tp_host, 1u) << "Σg² over tp; " << where;
    EXPECT_EQ(s.tp_all_reduce.host_waits, 1u) << where;
    EXPECT_EQ(s.other_host, 0u) << where;
    // zero inside the layers: every collective of the layers was ordered on the device
    EXPECT_EQ(s.tp_all_reduce.device_orders, M * layer.all_reduce) << where;
    EXPECT_EQ(s.tp_reduce_scatter.device_orders, M * layer.reduce_scatter) << where;
    EXPECT_EQ(s.tp_all_gather.device_orders, M * layer.all_gather) << where;
    EXPECT_EQ(s.tp_reduce_scatter.host_waits + s.tp_all_gather.host_waits, 0u) << where;
    // and every call is accounted for: the layers' and the step scalars' one
    EXPECT_EQ(s.tp_all_reduce.calls, M * layer.all_reduce + 1) << where;
  }
  std::printf(
      "%s, %d micro-batch(es): per step %llu host wait(s) in tp, %llu in dp, %llu "
      "synchronising call(s); %llu collectives of the layers ordered on the device\n",
      sp ? "tp2 + sp" : "tp2", micro_batches, static_cast<unsigned long long>(got[0].tp_host),
      static_cast<unsigned long long>(got[0].dp_host),
      static_cast<unsigned long long>(got[0].syncs),
      static_cast<unsigned long long>(got[0].tp_all_reduce.device_orders +
                                      got[0].tp_reduce_scatter.device_orders +
                                      got[0].tp_all_gather.device_orders));
}

INSTANTIATE_TEST_SUITE_P(Tp2, TpHostWaits,
                         ::testing::Combine(::testing::Bool(), ::testing::Values(1, 2)),
                         [](const auto& info) {
                           return std::string(std::get<0>(info.param) ? "SequenceParallel"
                                                                      : "Plain") +
                                  "_M" + std::to_string(std::get<1>(info.param));
                         });
