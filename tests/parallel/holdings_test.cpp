// The map of who holds what (train/holdings.hpp): the text of a piece list, the optimizer-state
// pieces of every ZeRO stage against the model's own tensors (every element owned exactly once
// over the ranks) and a tensor-parallel rank's slice against GPT-2's layer structure.
#include "fourway/train/holdings.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "fourway/mesh/mesh.hpp"
#include "fourway/models/gpt2.hpp"
#include "fourway/parallel/tp/placement.hpp"
#include "parallel_harness.hpp"
#include "tp_harness.hpp"

namespace {

using fw::TensorPiece;

TEST(Holdings, DescribePiecesMergesRunsThatContinueIntoTheNextTensor) {
  const std::vector<TensorPiece> none;
  EXPECT_EQ(fw::describe_pieces(none), "nothing");
  const std::vector<TensorPiece> one = {{"a", 0, 10, 10}};
  EXPECT_EQ(fw::describe_pieces(one), "a");
  // a flat run: the tail of a, all of b, the head of c
  const std::vector<TensorPiece> run = {{"a", 4, 6, 10}, {"b", 0, 5, 5}, {"c", 0, 3, 8}};
  EXPECT_EQ(fw::describe_pieces(run), "a[4:10) .. c[0:3) (3 tensors)");
  // a stops before its end: two runs
  const std::vector<TensorPiece> broken = {{"a", 0, 5, 10}, {"b", 0, 5, 5}};
  EXPECT_EQ(fw::describe_pieces(broken), "a[0:5); b");
  // the next piece does not start at 0: two runs
  const std::vector<TensorPiece> gap = {{"a", 0, 10, 10}, {"b", 1, 4, 5}, {"c", 0, 2, 2}};
  EXPECT_EQ(fw::describe_pieces(gap), "a; b[1:5) .. c (2 tensors)");
}

/// Every rank's optimizer pieces under ShardedStrategy<Stage> on `ranks` ranks (small buckets,
/// so tensors are cut), and every rank's map entry.
template <int Stage>
std::pair<std::vector<std::vector<TensorPiece>>, std::vector<std::string>> pieces_of(int ranks) {
  using Model = fw::models::Gpt<float, fw::Host>;
  using S = fw::ShardedStrategy<Stage, Model, fw::Precision<float>, fw::Host, fw::LocalComm>;
  std::vector<std::vector<TensorPiece>> pieces(static_cast<std::size_t>(ranks));
  std::vector<std::string> entries(static_cast<std::size_t>(ranks));
  fw::launch<fw::LocalWorld>(ranks, [&](fw::World<fw::LocalWorld>& w) {
    fw::LocalComm dp = w.comm().split(0, w.rank(), "dp");
    Model model = Model::deferred(w.ctx(), harness::tiny_gpt(), harness::kSeed);
    fw::ShardedOptions so;
    so.bucket_bytes = 512;
    S strategy(w.ctx(), model, dp, harness::adamw(), so);
    const auto mine = fw::optimizer_pieces(strategy);
    fw::RankHoldings h;
    h.rank = w.rank();
    h.position = fw::Mesh<fw::DataParallel>(ranks).position(w.rank());
    h.set_sharding<fw::data_parallel_policy_t<Stage>>(mine);
    h.count_bytes(w.memory());
    const auto r = static_cast<std::size_t>(w.rank());
    pieces[r] = mine;
    entries[r] = h.text();
  });
  return {pieces, entries};
}

/// name -> numel of the one-rank model, the independent expectation.
std::map<std::string, std::int64_t> tensors_of_one_rank_model() {
  fw::MemoryAccountant mem;
  fw::Context<fw::Host> ctx(mem);
  fw::models::Gpt<float, fw::Host> model(ctx, harness::tiny_gpt(), harness::kSeed);
  std::map<std::string, std::int64_t> out;
  model.visit_parameters([&](auto& p) { out[p.name] = p.numel(); });
  return out;
}

template <int Stage>
void expect_every_element_owned_once(int ranks) {
  SCOPED_TRACE(testing::Message() << "stage " << Stage << ", " << ranks << " ranks");
  const auto [pieces, entries] = pieces_of<Stage>(ranks);
  std::map<std::string, std::vector<std::pair<std::int64_t, std::int64_t>>> covered;
  for (const auto& rank : pieces) {
    EXPECT_FALSE(rank.empty());
    for (const auto& p : rank) covered[p.tensor].push_back({p.first, p.first + p.count});
  }
  const auto expected = tensors_of_one_rank_model();
  ASSERT_EQ(covered.size(), expected.size());
  int cut = 0;  // tensors split between ranks: the small buckets must cut some
  for (auto& [name, spans] : covered) {
    ASSERT_TRUE(expected.count(name)) << name;
    std::sort(spans.begin(), spans.end());
    std::int64_t at = 0;
    for (const auto& [lo, hi] : spans) {
      EXPECT_EQ(lo, at) << name << ": a gap or an overlap";
      at = hi;
    }
    EXPECT_EQ(at, expected.at(name)) << name;
    cut += spans.size() > 1 ? 1 : 0;
  }
  EXPECT_GT(cut, 0);
  // each entry names the kinds of state the stage shards, and the rank's own pieces
  const char* kinds = Stage == 3   ? "weights, grads, fp32 masters and Adam moments of "
                      : Stage == 2 ? "grads, fp32 masters and Adam moments of "
                                   : "fp32 masters and Adam moments of ";
  for (std::size_t r = 0; r < entries.size(); ++r) {
    EXPECT_NE(entries[r].find("  ZeRO-" + std::to_string(Stage) + "     " + kinds +
                              fw::describe_pieces(pieces[r])),
              std::string::npos)
        << entries[r];
    EXPECT_EQ(entries[r].rfind("rank " + std::to_string(r) + " (tp 0/1, pp 0/1, dp " +
                                   std::to_string(r) + "/" + std::to_string(ranks) + ")\n",
                               0),
              0u)
        << entries[r];
  }
}

TEST(Holdings, EveryZeroStageOwnsEachElementOfEachTensorOnce) {
  expect_every_element_owned_once<1>(2);
  expect_every_element_owned_once<1>(3);
  expect_every_element_owned_once<2>(3);
  expect_every_element_owned_once<3>(2);
  expect_every_element_owned_once<3>(4);
}

TEST(Holdings, DataParallelSaysReplicated) {
  fw::RankHoldings h;
  h.set_sharding<fw::DataParallel>({});
  EXPECT_EQ(h.sharding, "DataParallel");
  EXPECT_EQ(h.optimizer, "fp32 masters and Adam moments of every tensor it holds (replicated)");
}

TEST(Holdings, TextHasOneLinePerPartAndTheAccountantsBytes) {
  fw::MemoryAccountant mem;
  fw::Context<fw::Host> ctx(mem);
  const fw::Tensor<float, fw::Host> w(fw::Shape{10}, fw::MemTag::weights, mem);
  const fw::Tensor<float, fw::Host> g(fw::Shape{6}, fw::MemTag::grads, mem);
  const fw::Tensor<float, fw::Host> m(fw::Shape{4}, fw::MemTag::master_weights, mem);
  const fw::Tensor<float, fw::Host> o(fw::Shape{8}, fw::MemTag::optimizer_state, mem);
  const fw::Tensor<float, fw::Host> a(fw::Shape{100}, fw::MemTag::activations, mem);  // not state
  fw::RankHoldings h;
  h.rank = 3;
  h.position = "tp 1/2, pp 1/2, dp 0/1";
  h.layers = "chunk 1: blocks [2,4), head (a copy of wte)";
  h.tp_slice = "row slice 1/2 of 4";
  h.sharding = "DataParallel";
  h.optimizer = "every tensor";
  h.count_bytes(mem);
  h.one_rank_bytes = 448;
  EXPECT_EQ(h.model_state_bytes(), 4u * (10 + 6 + 4 + 8));
  EXPECT_EQ(h.text(),
            "rank 3 (tp 1/2, pp 1/2, dp 0/1)\n"
            "  layers     chunk 1: blocks [2,4), head (a copy of wte)\n"
            "  tp slice   row slice 1/2 of 4\n"
            "  DataParallel every tensor\n"
            "  bytes      model states 112 B (weights 40, grads 24, masters and moments 48); "
            "one rank alone 448 B, 4.00x more\n");
}

TEST(Holdings, TensorParallelSliceFollowsGpt2sLayers) {
  fw::models::GptConfig cfg = harness::tiny_gpt();  // 2 layers, width 12, vocab 37
  const int layers = cfg.layers;
  // per block: c_attn weight and bias, c_fc weight and bias split by columns; the two c_proj
  // weights by rows; LayerNorms and the c_proj biases replicated; wpe and ln_f replicated too
  const auto table = tph::gpt_placements(cfg, 2, 4);  // vocab 37 padded to 40 (2 x 4 x 5)
  EXPECT_EQ(fw::tp::describe_slice(table, 2, 0),
            "column slice 0/2 of " + std::to_string(4 * layers) + " tensors, row slice 0/2 of " +
                std::to_string(2 * layers) + ", vocab rows [0,20) of wte.weight, " +
                std::to_string(6 * layers + 3) + " replicated");
  // rank 1 holds rows [20, 40), of which 37 - 20 = 17 are real and 3 padding
  EXPECT_NE(fw::tp::describe_slice(table, 2, 1)
                .find("vocab rows [20,37) of wte.weight (+3 padding rows)"),
            std::string::npos);
}

}  // namespace
