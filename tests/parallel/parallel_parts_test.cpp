// The byte movers under ShardedStrategy, each on its own: ParameterLayout, GradientReducer,
// UnitGatherer and WorkQueue on the host backend with LocalWorld (ranks as threads), and the
// tensor-parallel placement table and conjugate operators (parallel/tp/) and the pipeline's
// ChunkSet (parallel/pp/). Every
// expected value is computed here from the inputs by plain loops — the segments by the rule in
// parameter_layout.hpp's comment (`reference_layout`), the reduced gradients by summing what each
// rank added, the gathered weights from the values the shards were filled with — never by asking
// the code under test.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <exception>
#include <memory>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "fourway/comm/counting.hpp"
#include "fourway/comm/local_world.hpp"
#include "fourway/layers/conjugate.hpp"
#include "fourway/layers/gpt.hpp"
#include "fourway/parallel/dp/gradient_reducer.hpp"
#include "fourway/parallel/dp/parameter_layout.hpp"
#include "fourway/parallel/dp/unit_gatherer.hpp"
#include "fourway/parallel/pp/chunk_set.hpp"
#include "fourway/parallel/step_scalars.hpp"
#include "fourway/parallel/tp/placement.hpp"
#include "fourway/parallel/work_queue.hpp"

namespace fw = fourway;
using fw::Host;
using Param = fw::Parameter<float, Host>;
using Layout = fw::ParameterLayout<float, Host>;
using CountedComm = fw::Counting<fw::LocalComm>;

namespace {

// ---- a model of bare parameters, and the layout rule applied by hand --------------------------

/// Parameter sizes and which units touch each one (a parameter in two units is tied).
struct Spec {
  std::vector<std::int64_t> numels;
  std::vector<std::vector<int>> units;  // units[u]: parameter indices, in visit order
};

/// The smallest thing ParameterLayout accepts as a model: 1-D parameters, visited in index order,
/// and units that list them. Parameters are deferred (no storage); the layout binds them.
struct Toy {
  std::vector<std::unique_ptr<Param>> params;
  std::vector<std::vector<int>> unit_params;

  Toy(const fw::Context<Host>& ctx, const Spec& spec) : unit_params(spec.units) {
    const fw::DeferredInit deferred;
    for (std::size_t i = 0; i < spec.numels.size(); ++i) {
      params.push_back(
          std::make_unique<Param>(ctx, fw::detail::cat("p", i), fw::Shape{spec.numels[i]}));
    }
  }
  template <class F>
  void visit_parameters(F&& f) {
    for (auto& p : params) f(*p);
  }
  [[nodiscard]] int units() const { return static_cast<int>(unit_params.size()); }
  template <class F>
  void visit_unit_parameters(int u, F&& f) {
    for (int i : unit_params[static_cast<std::size_t>(u)]) f(*params[static_cast<std::size_t>(i)]);
  }
};

struct RefSlot {
  int param;
  std::int64_t at;  // first element within the segment
  std::int64_t numel;
};
struct RefSeg {
  std::vector<RefSlot> slots;
  std::int64_t numel = 0, padded = 0, shard = 0, offset = 0, shard_offset = 0;
  int ready = 0;
};
struct RefLayout {
  std::vector<RefSeg> segs;
  std::vector<std::vector<int>> unit_segs;
  std::int64_t padded = 0, shard = 0;
  /// Which (segment, slot) holds parameter i.
  [[nodiscard]] std::pair<int, int> where(int i) const {
    for (std::size_t s = 0; s < segs.size(); ++s) {
      for (std::size_t k = 0; k < segs[s].slots.size(); ++k) {
        if (segs[s].slots[k].param == i) return {static_cast<int>(s), static_cast<int>(k)};
      }
    }
    return {-1, -1};
  }
};

/// The layout by the header's words: a parameter belongs to the lowest unit touching it; stage 3
/// has one segment per unit (parameters in visit order), other stages fill buckets of
/// `bucket_bytes` greedily in backward order (unit U-1 first, parameters in reverse); padding to a
/// multiple of n (1 at stage 0) at each segment's end.
RefLayout reference_layout(const Spec& spec, int stage, int n, std::int64_t bucket_bytes) {
  const int P = static_cast<int>(spec.numels.size());
  const int U = static_cast<int>(spec.units.size());
  std::vector<int> home(static_cast<std::size_t>(P), U);
  for (int u = 0; u < U; ++u) {
    for (int i : spec.units[static_cast<std::size_t>(u)]) {
      home[static_cast<std::size_t>(i)] = std::min(home[static_cast<std::size_t>(i)], u);
    }
  }
  RefLayout ref;
  auto add = [&](RefSeg& seg, int i) {
    seg.slots.push_back({i, seg.numel, spec.numels[static_cast<std::size_t>(i)]});
    seg.numel += spec.numels[static_cast<std::size_t>(i)];
  };
  if (stage == 3) {
    for (int u = 0; u < U; ++u) {
      RefSeg seg;
      seg.ready = u;
      for (int i = 0; i < P; ++i) {
        if (home[static_cast<std::size_t>(i)] == u) add(seg, i);
      }
      ref.segs.push_back(seg);
    }
  } else {
    for (int u = U - 1; u >= 0; --u) {
      for (int i = P - 1; i >= 0; --i) {
        if (home[static_cast<std::size_t>(i)] != u) continue;
        const std::int64_t bytes = spec.numels[static_cast<std::size_t>(i)] * 4;
        if (ref.segs.empty() || (bucket_bytes > 0 && ref.segs.back().numel > 0 &&
                                 ref.segs.back().numel * 4 + bytes > bucket_bytes)) {
          ref.segs.emplace_back().ready = U;
        }
        add(ref.segs.back(), i);
        ref.segs.back().ready = std::min(ref.segs.back().ready, u);
      }
    }
  }
  const int parts = stage == 0 ? 1 : n;
  for (auto& seg : ref.segs) {
    seg.shard = (seg.numel + parts - 1) / parts;
    seg.padded = seg.shard * parts;
    seg.offset = ref.padded;
    seg.shard_offset = ref.shard;
    ref.padded += seg.padded;
    ref.shard += seg.shard;
  }
  for (int u = 0; u < U; ++u) {
    std::set<int> touched;
    for (int i : spec.units[static_cast<std::size_t>(u)]) touched.insert(ref.where(i).first);
    ref.unit_segs.emplace_back(touched.begin(), touched.end());
  }
  return ref;
}

/// Four units like a GPT's: p0 (the tied embedding) is read by unit 0 and by the head, unit 3.
Spec gpt_like() { return Spec{{5, 3, 7, 1, 4, 6, 2}, {{0, 1}, {2, 3}, {4, 5}, {6, 0}}}; }

/// Random sizes, units and ties; a unit may hold only parameters an earlier unit owns (its
/// stage-3 segment is then empty).
Spec random_spec(std::mt19937& rng) {
  std::uniform_int_distribution<int> nparams(1, 7), nunits(1, 4);
  std::uniform_int_distribution<std::int64_t> numel(1, 13);
  Spec spec;
  const int P = nparams(rng);
  const int U = nunits(rng);
  for (int i = 0; i < P; ++i) spec.numels.push_back(numel(rng));
  spec.units.resize(static_cast<std::size_t>(U));
  std::uniform_int_distribution<int> pick(0, U - 1), coin(0, 3);
  for (int i = 0; i < P; ++i) {
    const int u = pick(rng);
    spec.units[static_cast<std::size_t>(u)].push_back(i);
    const int v = pick(rng);
    if (coin(rng) == 0 && v != u) spec.units[static_cast<std::size_t>(v)].push_back(i);
  }
  for (auto& members : spec.units) std::sort(members.begin(), members.end());
  return spec;
}

std::vector<Spec> specs() {
  std::mt19937 rng(20261202);
  std::vector<Spec> out{gpt_like()};
  for (int k = 0; k < 7; ++k) out.push_back(random_spec(rng));
  return out;
}

void expect_layout(const Layout& got, const RefLayout& ref, const std::string& what) {
  const auto& flat = got.flat();
  ASSERT_EQ(got.segment_count(), static_cast<int>(ref.segs.size())) << what;
  EXPECT_EQ(flat.padded(), ref.padded) << what;
  EXPECT_EQ(flat.shard(), ref.shard) << what;
  for (int s = 0; s < got.segment_count(); ++s) {
    const auto& r = ref.segs[static_cast<std::size_t>(s)];
    const auto& seg = flat.segment(s);
    EXPECT_EQ(seg.offset, r.offset) << what << " segment " << s;
    EXPECT_EQ(seg.numel, r.numel) << what << " segment " << s;
    EXPECT_EQ(seg.padded, r.padded) << what << " segment " << s;
    EXPECT_EQ(seg.shard, r.shard) << what << " segment " << s;
    EXPECT_EQ(seg.shard_offset, r.shard_offset) << what << " segment " << s;
    EXPECT_EQ(got.ready_unit(s), r.ready) << what << " segment " << s;
    for (int rank = 0; rank < flat.parts(); ++rank) {
      EXPECT_EQ(flat.owned_begin(s, rank), r.offset + rank * r.shard) << what << " rank " << rank;
    }
    const auto slots = flat.slots_of(s);
    ASSERT_EQ(slots.size(), r.slots.size()) << what << " segment " << s;
    for (std::size_t k = 0; k < slots.size(); ++k) {
      EXPECT_EQ(slots[k].param, r.slots[k].param) << what << " segment " << s << " slot " << k;
      EXPECT_EQ(slots[k].offset, r.offset + r.slots[k].at) << what << " segment " << s;
      EXPECT_EQ(slots[k].numel, r.slots[k].numel) << what << " segment " << s;
    }
  }
  for (int u = 0; u < got.units(); ++u) {
    EXPECT_EQ(got.unit_segments(u), ref.unit_segs[static_cast<std::size_t>(u)])
        << what << " unit " << u;
  }
}

/// The flat element of parameter i's element j.
std::int64_t flat_index(const RefLayout& ref, int i, std::int64_t j) {
  const auto [s, k] = ref.where(i);
  const auto& seg = ref.segs[static_cast<std::size_t>(s)];
  return seg.offset + seg.slots[static_cast<std::size_t>(k)].at + j;
}

/// What sits at element e (< padded) of segment s: (parameter, element) or (-1, -1) for padding.
std::pair<int, std::int64_t> element_at(const RefSeg& seg, std::int64_t e) {
  for (const auto& slot : seg.slots) {
    if (e >= slot.at && e < slot.at + slot.numel) return {slot.param, e - slot.at};
  }
  return {-1, -1};
}

std::string describe(int stage, int n, std::int64_t bucket_bytes, std::size_t spec) {
  return "stage " + std::to_string(stage) + " n=" + std::to_string(n) +
         " bucket_bytes=" + std::to_string(bucket_bytes) + " spec " + std::to_string(spec);
}

}  // namespace

// ---- ParameterLayout
// -----------------------------------------------------------------------------

// Worked by hand from the rule (bucket of 40 B = 10 floats, n = 3). Backward order is p6 (2),
// p5 (6), p4 (4), p3 (1), p2 (7), p1 (3), p0 (5); buckets {p6,p5}=8, {p4,p3}=5, {p2,p1}=10, {p0}=5
// pad to 9, 6, 12, 6. If the tied p0 went to the *highest* unit touching it (a plausible slip:
// "last" read as the last unit index), it would join p6's bucket and every number here changes.
TEST(ParallelParts, LayoutBucketsByHand) {
  fw::MemoryAccountant mem(0);
  fw::Context<Host> ctx(mem);
  Toy toy(ctx, gpt_like());
  const Layout layout(toy, 1, 3, 40);
  ASSERT_EQ(layout.segment_count(), 4);
  const std::int64_t offset[] = {0, 9, 15, 27}, padded[] = {9, 6, 12, 6}, shard[] = {3, 2, 4, 2};
  const int ready[] = {2, 1, 0, 0};
  const std::vector<std::vector<int>> members = {{6, 5}, {4, 3}, {2, 1}, {0}};
  for (int s = 0; s < 4; ++s) {
    EXPECT_EQ(layout.flat().segment(s).offset, offset[s]);
    EXPECT_EQ(layout.flat().segment(s).padded, padded[s]);
    EXPECT_EQ(layout.flat().segment(s).shard, shard[s]);
    EXPECT_EQ(layout.ready_unit(s), ready[s]);
    std::vector<int> got;
    for (const auto& slot : layout.flat().slots_of(s)) got.push_back(slot.param);
    EXPECT_EQ(got, members[static_cast<std::size_t>(s)]);
  }
  EXPECT_EQ(layout.flat().padded(), 33);
  EXPECT_EQ(layout.flat().shard(), 11);
  EXPECT_EQ(layout.unit_segments(0), (std::vector<int>{2, 3}));
  EXPECT_EQ(layout.unit_segments(3), (std::vector<int>{0, 3}));
  // stage 3, n = 2: one segment per unit, the tied p0 in unit 0's: 8, 8, 10, 2 elements
  const Layout fsdp(toy, 3, 2, 40);
  ASSERT_EQ(fsdp.segment_count(), 4);
  EXPECT_EQ(fsdp.flat().segment(3).offset, 26);
  EXPECT_EQ(fsdp.flat().segment(3).numel, 2);
  EXPECT_EQ(fsdp.unit_segments(3), (std::vector<int>{0, 3}));
  EXPECT_EQ(fsdp.ready_unit(3), 3);
}

// Offsets, padding, shard ranges, bucket boundaries, ready units and unit segments for every
// stage, world sizes 1..5 (sizes rarely divisible by n) and bucket sizes from "one parameter per
// bucket" to "one bucket".
TEST(ParallelParts, LayoutMatchesTheRuleForEveryStageAndWorldSize) {
  fw::MemoryAccountant mem(0);
  fw::Context<Host> ctx(mem);
  const auto all = specs();
  for (std::size_t k = 0; k < all.size(); ++k) {
    Toy toy(ctx, all[k]);
    for (int stage = 0; stage <= 3; ++stage) {
      for (int n = 1; n <= 5; ++n) {
        for (std::int64_t bb : {0, 4, 24, 40, 1000}) {
          const Layout layout(toy, stage, n, bb);
          expect_layout(layout, reference_layout(all[k], stage, n, bb), describe(stage, n, bb, k));
          if (HasFatalFailure()) return;
        }
      }
    }
  }
}

// bind_weights / bind_grads point each parameter at its own elements of a segment's buffer, and
// at nothing (keeping the shape) when the buffer is null.
TEST(ParallelParts, LayoutBindsViewsAtTheParameterOffsets) {
  fw::MemoryAccountant mem(0);
  fw::Context<Host> ctx(mem);
  const Spec spec = gpt_like();
  Toy toy(ctx, spec);
  for (int stage : {0, 2, 3}) {
    const Layout layout(toy, stage, 3, 24);
    const RefLayout ref = reference_layout(spec, stage, 3, 24);
    std::vector<float> flat(static_cast<std::size_t>(ref.padded));
    for (std::size_t e = 0; e < flat.size(); ++e) flat[e] = static_cast<float>(e);
    std::vector<float> grads(flat.size());
    for (std::size_t e = 0; e < flat.size(); ++e) grads[e] = -static_cast<float>(e);
    for (int s = 0; s < layout.segment_count(); ++s) {
      layout.bind_weights(s, flat.data() + layout.flat().segment(s).offset);
      layout.bind_grads(s, grads.data() + layout.flat().segment(s).offset);
    }
    for (int i = 0; i < static_cast<int>(spec.numels.size()); ++i) {
      const Param& p = *toy.params[static_cast<std::size_t>(i)];
      ASSERT_EQ(p.weight.numel(), spec.numels[static_cast<std::size_t>(i)]);
      for (std::int64_t j = 0; j < p.numel(); ++j) {
        EXPECT_EQ(p.weight.data()[j], static_cast<float>(flat_index(ref, i, j)))
            << "stage " << stage << " p" << i << "[" << j << "]";
        EXPECT_EQ(p.grad.data()[j], -static_cast<float>(flat_index(ref, i, j)));
      }
    }
    for (int s = 0; s < layout.segment_count(); ++s) layout.bind_weights(s, nullptr);
    for (const auto& p : toy.params) {
      EXPECT_EQ(p->weight.data(), nullptr);
      EXPECT_TRUE(p->deferred());
      EXPECT_NE(p->grad.data(), nullptr);
    }
  }
}

// Bad input is a ConfigError naming the problem: an empty group, and a parameter no unit visits
// (its gradients would never be reduced).
TEST(ParallelParts, LayoutRefusesAnEmptyGroupAndAnOrphanParameter) {
  fw::MemoryAccountant mem(0);
  fw::Context<Host> ctx(mem);
  Toy toy(ctx, gpt_like());
  EXPECT_THROW(Layout(toy, 1, 0, 40), fw::ConfigError);
  Spec orphan = gpt_like();
  orphan.units[2] = {4};  // p5 is in no unit now
  Toy bad(ctx, orphan);
  try {
    const Layout layout(bad, 2, 2, 40);
    ADD_FAILURE() << "a parameter in no unit was accepted";
  } catch (const fw::ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("'p5' belongs to no unit"), std::string::npos) << e.what();
  }
}

// ---- GradientReducer ----------------------------------------------------------------------------

namespace {

/// What rank r adds to element j of parameter i in the backward of unit u, micro-batch m: small
/// integers, so every sum below is exact in fp32.
float grad_value(int r, int m, int u, int i, std::int64_t j) {
  return static_cast<float>((r + 1) + 2 * m + 5 * u + (i * 7 + j) % 3);
}

/// Σ over ranks, micro-batches and the units touching parameter i.
float expected_grad(const Spec& spec, int n, int M, int i, std::int64_t j) {
  float sum = 0.0f;
  for (int r = 0; r < n; ++r) {
    for (int m = 0; m < M; ++m) {
      for (int u = 0; u < static_cast<int>(spec.units.size()); ++u) {
        const auto& members = spec.units[static_cast<std::size_t>(u)];
        if (std::find(members.begin(), members.end(), i) != members.end()) {
          sum += grad_value(r, m, u, i, j);
        }
      }
    }
  }
  return sum;
}

/// The bytes one rank's LocalComm moves for an all-reduce of `count` elements (the file comment
/// of local_world.hpp): its slice of count/n (+1 for the first count%n ranks), read from and
/// written to n-1 peers.
std::int64_t all_reduce_bytes(std::int64_t count, int n, int r) {
  const std::int64_t slice = count / n + (r < count % n ? 1 : 0);
  return 2 * (n - 1) * slice * 4;
}

/// One step of M micro-batches through GradientReducer<Stage> on n ranks, driven the way the
/// strategy's hooks drive it; checks the issue points, the reduced gradients and the traffic.
template <int Stage>
void reduce_and_check(const Spec& spec, int n, int M, bool overlap, std::int64_t bucket_bytes,
                      const std::string& what) {
  const RefLayout ref = reference_layout(spec, Stage, n, bucket_bytes);
  const int U = static_cast<int>(spec.units.size());
  const int S = static_cast<int>(ref.segs.size());
  fw::launch<fw::LocalWorld>(n, [&](fw::World<fw::LocalWorld>& w) {
    const int r = w.rank();
    CountedComm comm(std::move(w.comm()));
    Toy toy(w.ctx(), spec);
    const Layout layout(toy, Stage, n, bucket_bytes);
    fw::WorkQueue queue;
    fw::GradientReducer<Stage, float, Host, CountedComm> reducer(w.ctx(), comm, layout, queue,
                                                                 overlap);
    const fw::CommOp op = Stage == 0 ? fw::CommOp::all_reduce : fw::CommOp::reduce_scatter;
    auto issued = [&] { return static_cast<int>(comm.count(op).calls); };
    reducer.begin_step();
    for (int m = 0; m < M; ++m) {
      reducer.begin_micro_batch(m, M);
      reducer.begin_forward();
      const bool fires_now = overlap && (Stage >= 2 || m == M - 1);
      const int before = Stage >= 2 ? m * S : 0;
      for (int u = U - 1; u >= 0; --u) {
        reducer.pre_backward(u);
        for (int i : spec.units[static_cast<std::size_t>(u)]) {
          Param& p = *toy.params[static_cast<std::size_t>(i)];
          ASSERT_NE(p.grad.data(), nullptr) << what << " p" << i << " unbound in unit " << u;
          for (std::int64_t j = 0; j < p.numel(); ++j)
            p.grad.data()[j] += grad_value(r, m, u, i, j);
        }
        reducer.post_backward(u);
        reducer.post_backward(u);  // a second call issues nothing more
        // with overlap, a segment is issued by the post_backward of its ready unit, no earlier
        int ready = 0;
        for (const auto& seg : ref.segs) ready += seg.ready >= u ? 1 : 0;
        EXPECT_EQ(issued(), before + (fires_now ? ready : 0)) << what << " m=" << m << " u=" << u;
        queue.poll();
      }
      reducer.end_micro_batch();
      EXPECT_EQ(issued(), Stage >= 2 ? (m + 1) * S : (fires_now ? S : 0)) << what << " m=" << m;
    }
    reducer.before_step();
    EXPECT_EQ(issued(), Stage >= 2 ? M * S : S) << what;
    queue.wait_all();

    std::int64_t bytes = 0;
    for (int s = 0; s < S; ++s) {
      const auto& seg = ref.segs[static_cast<std::size_t>(s)];
      if (Stage == 0) {
        for (const auto& slot : seg.slots) {
          const Param& p = *toy.params[static_cast<std::size_t>(slot.param)];
          for (std::int64_t j = 0; j < slot.numel; ++j) {
            EXPECT_EQ(p.grad.data()[j], expected_grad(spec, n, M, slot.param, j))
                << what << " rank " << r << " p" << slot.param << "[" << j << "]";
          }
        }
        bytes += all_reduce_bytes(seg.numel, n, r);
        continue;
      }
      // stages 1-3: rank r's part [r*shard, (r+1)*shard) of the segment, summed; padding zero
      const float* part = Stage == 1 ? reducer.full() + seg.offset + r * seg.shard
                                     : reducer.shard() + seg.shard_offset;
      for (std::int64_t k = 0; k < seg.shard; ++k) {
        const auto [i, j] = element_at(seg, r * seg.shard + k);
        EXPECT_EQ(part[k], i < 0 ? 0.0f : expected_grad(spec, n, M, i, j))
            << what << " rank " << r << " segment " << s << " element " << r * seg.shard + k;
      }
      bytes += (Stage == 1 ? 1 : M) * seg.shard * 4 * (n - 1);
    }
    EXPECT_EQ(comm.inner().traffic().moved(op), static_cast<std::uint64_t>(bytes))
        << what << " rank " << r;
    if constexpr (Stage >= 2) {  // the transient full buckets are all freed
      EXPECT_EQ(w.memory().current(fw::MemTag::grads), static_cast<std::size_t>(ref.shard * 4))
          << what;
    }
  });
}

template <int Stage>
void reduce_every_case() {
  const auto all = specs();
  for (std::size_t k = 0; k < all.size(); k += 2) {  // the GPT-like spec and three random ones
    for (int n : {1, 2, 3, 5}) {
      for (int M : {1, 3}) {
        for (bool overlap : {false, true}) {
          const std::int64_t bb = k == 0 ? 24 : 16;
          reduce_and_check<Stage>(
              all[k], n, M, overlap, bb,
              describe(Stage, n, bb, k) + " M=" + std::to_string(M) + (overlap ? " overlap" : ""));
        }
      }
    }
  }
}

}  // namespace

// Summed (not averaged) gradients in the right place for every stage. Would fail if: the ready
// unit were the highest unit touching a tied parameter (its bucket would fire before unit 0 adds
// to it: the issue counts, and at stages 2-3 the sums, go wrong); stages 2-3 dropped the copy of
// the accumulated shard into the fresh bucket (M = 3 would keep only the last micro-batch); or a
// segment were issued twice.
TEST(ParallelParts, ReducerStage0SumsEveryBucketAtItsReadyUnit) { reduce_every_case<0>(); }
TEST(ParallelParts, ReducerStage1ScattersIntoTheOwnSlice) { reduce_every_case<1>(); }
TEST(ParallelParts, ReducerStage2AccumulatesMicroBatchesInTheShard) { reduce_every_case<2>(); }
TEST(ParallelParts, ReducerStage3AccumulatesMicroBatchesInTheShard) { reduce_every_case<3>(); }

// Ranks whose layouts disagree (different bucket sizes) issue collectives of different counts:
// LocalComm refuses them with CommMismatch on the queue's wait instead of reading out of bounds.
TEST(ParallelParts, ReducerWithDisagreeingLayoutsFailsWithCommMismatch) {
  const Spec spec = gpt_like();
  std::atomic<int> mismatches{0};
  fw::launch<fw::LocalWorld>(2, [&](fw::World<fw::LocalWorld>& w) {
    Toy toy(w.ctx(), spec);
    const Layout layout(toy, 1, 2, w.rank() == 0 ? 0 : 24);
    fw::WorkQueue queue;
    fw::GradientReducer<1, float, Host, fw::LocalComm> reducer(w.ctx(), w.comm(), layout, queue,
                                                               false);
    reducer.begin_step();
    reducer.begin_micro_batch(0, 1);
    reducer.before_step();
    try {
      queue.wait_all();
    } catch (const fw::CommMismatch&) {
      ++mismatches;
    } catch (const fw::CommError&) {  // the rank left behind when its peer returned
    }
  });
  EXPECT_GE(mismatches.load(), 1);
}

// ---- UnitGatherer -------------------------------------------------------------------------------

namespace {

float weight_value(int i, std::int64_t j) { return static_cast<float>(1000 * (i + 1) + j); }

/// Bytes of the union of two units' stage-3 segments.
std::int64_t held_bytes(const RefLayout& ref, int a, int b) {
  std::set<int> segs(ref.unit_segs[static_cast<std::size_t>(a)].begin(),
                     ref.unit_segs[static_cast<std::size_t>(a)].end());
  if (b >= 0) {
    segs.insert(ref.unit_segs[static_cast<std::size_t>(b)].begin(),
                ref.unit_segs[static_cast<std::size_t>(b)].end());
  }
  std::int64_t bytes = 0;
  for (int s : segs) bytes += ref.segs[static_cast<std::size_t>(s)].padded * 4;
  return bytes;
}

void gather_and_check(const Spec& spec, int n, bool prefetch, const std::string& what) {
  const RefLayout ref = reference_layout(spec, 3, n, 0);
  const int U = static_cast<int>(spec.units.size());
  fw::launch<fw::LocalWorld>(n, [&](fw::World<fw::LocalWorld>& w) {
    const int r = w.rank();
    CountedComm comm(std::move(w.comm()));
    Toy toy(w.ctx(), spec);
    const Layout layout(toy, 3, n, 0);
    // this rank's shard at rest: part r of every segment, filled from the reference layout
    std::vector<float> shard(static_cast<std::size_t>(ref.shard), -1.0f);
    for (const auto& seg : ref.segs) {
      for (std::int64_t k = 0; k < seg.shard; ++k) {
        const auto [i, j] = element_at(seg, r * seg.shard + k);
        shard[static_cast<std::size_t>(seg.shard_offset + k)] = i < 0 ? 0.0f : weight_value(i, j);
      }
    }
    fw::WorkQueue queue;
    fw::UnitGatherer<float, Host, CountedComm> gatherer(w.ctx(), comm, layout, queue, shard.data());
    auto gathers = [&] { return static_cast<int>(comm.count(fw::CommOp::all_gather).calls); };
    // a unit's weights in use: every element is the value its owner's shard holds
    auto expect_unit = [&](int u, const char* when) {
      for (int i : spec.units[static_cast<std::size_t>(u)]) {
        const Param& p = *toy.params[static_cast<std::size_t>(i)];
        ASSERT_NE(p.weight.data(), nullptr) << what << " " << when << " unit " << u << " p" << i;
        for (std::int64_t j = 0; j < p.numel(); ++j) {
          ASSERT_EQ(p.weight.data()[j], weight_value(i, j)) << what << " p" << i << "[" << j << "]";
        }
      }
    };
    // after release(u, next): u's segments that next needs stay bound, the others hold nothing
    auto expect_released = [&](int u, int next) {
      for (int i : spec.units[static_cast<std::size_t>(u)]) {
        const int s = ref.where(i).first;
        const auto& keep = ref.unit_segs[static_cast<std::size_t>(std::max(next, 0))];
        const bool kept = next >= 0 && std::find(keep.begin(), keep.end(), s) != keep.end();
        const Param& p = *toy.params[static_cast<std::size_t>(i)];
        EXPECT_EQ(p.weight.data() != nullptr, kept)
            << what << " release(" << u << ", " << next << ") p" << i;
      }
    };
    // a prefetch issues the missing segments of the next unit; acquiring it then issues nothing
    auto start = [&](int u, int next) {
      if (!prefetch) return;
      int missing = 0;
      for (int s : ref.unit_segs[static_cast<std::size_t>(next)]) {
        const auto& have = ref.unit_segs[static_cast<std::size_t>(u)];
        if (ref.segs[static_cast<std::size_t>(s)].padded > 0 &&
            std::find(have.begin(), have.end(), s) == have.end()) {
          ++missing;
        }
      }
      const int before = gathers();
      gatherer.start(next);
      gatherer.start(next);
      EXPECT_EQ(gathers(), before + missing) << what << " start(" << next << ")";
    };
    for (int s = 0; s < layout.segment_count(); ++s) layout.bind_weights(s, nullptr);
    std::int64_t peak = 0;
    for (int u = 0; u < U; ++u) {  // forward, as ShardedStrategy's hooks
      const int next = u + 1 < U ? u + 1 : U - 1;
      gatherer.acquire(u);
      start(u, next);
      peak = std::max(peak, held_bytes(ref, u, prefetch ? next : -1));
      expect_unit(u, "forward");
      const int before = gathers();
      if (prefetch) {  // already in flight: acquiring it issues no second gather
        gatherer.acquire(next);
        EXPECT_EQ(gathers(), before) << what;
      }
      gatherer.release(u, next);
      expect_released(u, next);
    }
    for (int u = U - 1; u >= 0; --u) {  // backward
      gatherer.acquire(u);
      if (u > 0) start(u, u - 1);
      peak = std::max(peak, held_bytes(ref, u, prefetch && u > 0 ? u - 1 : -1));
      expect_unit(u, "backward");
      gatherer.release(u, u > 0 ? u - 1 : -1);
      expect_released(u, u > 0 ? u - 1 : -1);
    }
    gatherer.release_all();
    queue.wait_all();
    EXPECT_EQ(gatherer.peak_bytes(), peak) << what;
    EXPECT_EQ(w.memory().peak(fw::MemTag::weights), static_cast<std::size_t>(peak)) << what;
    EXPECT_EQ(w.memory().current(fw::MemTag::weights), 0u) << what;
    for (const auto& p : toy.params) EXPECT_EQ(p->weight.data(), nullptr) << what;

    // every unit started, then acquired: each non-empty segment gathered exactly once, moving
    // (n-1) parts of `shard` elements into this rank
    comm.inner().reset_traffic();
    const int before = gathers();
    for (int u = 0; u < U; ++u) gatherer.start(u);
    for (int u = 0; u < U; ++u) gatherer.acquire(u);
    for (int u = 0; u < U; ++u) expect_unit(u, "all");
    int nonempty = 0;
    for (const auto& seg : ref.segs) nonempty += seg.padded > 0 ? 1 : 0;
    EXPECT_EQ(gathers(), before + nonempty) << what;
    EXPECT_EQ(comm.inner().traffic().moved(fw::CommOp::all_gather),
              static_cast<std::uint64_t>(ref.shard * 4 * (n - 1)))
        << what;
    gatherer.release_all();
  });
}

}  // namespace

// Gathered weights equal the concatenated shards; release keeps exactly what the next unit needs;
// prefetch holds at most two units and is never gathered twice; the peak and the accountant agree.
// Would fail if release ignored `next` (at the forward/backward turn, release(U-1, U-1) would drop
// the last unit's weights, which backward needs at once: they read as unbound), or if a started
// gather were issued again on acquire.
TEST(ParallelParts, GathererGathersReleasesAndPrefetches) {
  const auto all = specs();
  for (std::size_t k = 0; k < all.size(); ++k) {
    for (int n : {1, 2, 3, 5}) {
      for (bool prefetch : {false, true}) {
        gather_and_check(all[k], n, prefetch,
                         describe(3, n, 0, k) + (prefetch ? " prefetch" : " no prefetch"));
      }
    }
  }
}

// ---- WorkQueue ----------------------------------------------------------------------------------

namespace {

/// A Work completed by the test, through the completion state LocalWorld's async ops use.
struct Gate {
  std::shared_ptr<fw::detail::CompletionState> state =
      std::make_shared<fw::detail::CompletionState>();
  [[nodiscard]] fw::Work work() const { return fw::Work(state); }
  void open(std::exception_ptr error = nullptr) const { state->finish(std::move(error)); }
};

}  // namespace

// poll completes only the finished prefix, in issue order, even when later entries finished first.
TEST(ParallelParts, WorkQueuePollCompletesOnlyTheFinishedPrefix) {
  fw::WorkQueue q;
  std::vector<int> done;
  Gate a, b, c;
  q.push(a.work(), 0, fw::WorkKind::gradient, [&] { done.push_back(0); });
  q.push(b.work(), 1, fw::WorkKind::gradient, [&] { done.push_back(1); });
  q.push(c.work(), 2, fw::WorkKind::gradient, [&] { done.push_back(2); });
  b.open();
  c.open();
  q.poll();
  EXPECT_TRUE(done.empty());  // b and c finished, but a (issued first) has not
  a.open();
  q.poll();
  EXPECT_EQ(done, (std::vector<int>{0, 1, 2}));
  EXPECT_TRUE(q.empty());
}

// wait_for(key, kind) completes entries in order up to and including the first with that key AND
// kind, and no further. Would fail if it matched on the key alone (it would stop at (1, gradient)).
TEST(ParallelParts, WorkQueueWaitForStopsAtTheFirstMatchOfKeyAndKind) {
  fw::WorkQueue q;
  std::vector<int> done;
  Gate g[5];
  q.push(g[0].work(), 1, fw::WorkKind::gradient, [&] { done.push_back(0); });
  q.push(g[1].work(), 2, fw::WorkKind::gather, [&] { done.push_back(1); });
  q.push(g[2].work(), 1, fw::WorkKind::gather, [&] { done.push_back(2); });
  q.push(g[3].work(), 1, fw::WorkKind::gather, [&] { done.push_back(3); });
  q.push(g[4].work(), -1, fw::WorkKind::other, [&] { done.push_back(4); });
  // finished from another thread, last first: wait_for must block on each in turn
  std::thread t([&] {
    for (int i = 4; i >= 0; --i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
      g[i].open();
    }
  });
  q.wait_for(1, fw::WorkKind::gather);
  EXPECT_EQ(done, (std::vector<int>{0, 1, 2}));
  EXPECT_FALSE(q.empty());
  q.wait_for(7, fw::WorkKind::gradient);  // no such entry: everything completes
  EXPECT_EQ(done, (std::vector<int>{0, 1, 2, 3, 4}));
  EXPECT_TRUE(q.empty());
  t.join();
}

// A failed collective's error reaches whoever completes it; its on_done does not run, and later
// entries stay queued for the next wait. The destructor waits on what is left, running nothing.
TEST(ParallelParts, WorkQueuePropagatesErrorsAndTheDestructorRunsNoCompletion) {
  std::vector<int> done;
  Gate ok, bad, late;
  std::thread t;
  {
    fw::WorkQueue q;
    q.push(ok.work(), 0, fw::WorkKind::other, [&] { done.push_back(0); });
    q.push(bad.work(), 1, fw::WorkKind::other, [&] { done.push_back(1); });
    q.push(late.work(), 2, fw::WorkKind::other, [&] { done.push_back(2); });
    ok.open();
    bad.open(std::make_exception_ptr(fw::CommError("fourway: test collective failed")));
    EXPECT_THROW(q.wait_all(), fw::CommError);
    EXPECT_EQ(done, (std::vector<int>{0}));
    EXPECT_FALSE(q.empty());
    t = std::thread([state = late.state] {
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
      state->finish(std::make_exception_ptr(fw::CommError("fourway: also failed")));
    });
  }  // ~WorkQueue: waits for `late`, swallows its error, runs no completion
  t.join();
  EXPECT_EQ(done, (std::vector<int>{0}));
  EXPECT_TRUE(late.state->test());
}

namespace {

/// A Work that can be waited on the device, as NcclComm's on its communication stream: the test
/// finishes it; `wait_on_device` only records that the stream was ordered after it, and `wait`
/// counts a host wait that had to block (it was not finished yet).
struct StreamWork final : fw::Work::State {
  bool finished = false;
  int device_waits = 0;
  int blocking_host_waits = 0;
  std::exception_ptr error;
  void wait() override {
    if (!finished) ++blocking_host_waits;
    finished = true;
    if (error) std::rethrow_exception(error);
  }
  bool test() override { return finished; }
  void wait_on_device() override {
    ++device_waits;
    if (finished && error) std::rethrow_exception(error);
  }
};

}  // namespace

// On a backend whose Work can be waited on the device, wait_for and order_all order the stream
// and go on (on_done at once, in issue order), keeping what has not finished for the next
// wait_all, which waits on the host for all of it; poll forgets the finished ones. Would fail if
// wait_for waited on the host (blocking_host_waits > 0 before wait_all: no overlap on a GPU), or
// if wait_all forgot the device-waited ones (a collective that never finishes would hang a later
// copy instead of timing out).
TEST(ParallelParts, WorkQueueWaitsOnTheDeviceUntilWaitAll) {
  fw::WorkQueue q;
  std::vector<int> done;
  std::vector<std::shared_ptr<StreamWork>> w;
  for (int k = 0; k < 4; ++k) {
    w.push_back(std::make_shared<StreamWork>());
    q.push(fw::Work(w.back()), k, fw::WorkKind::gradient, [&done, k] { done.push_back(k); });
  }
  q.wait_for(1, fw::WorkKind::gradient);
  EXPECT_EQ(done, (std::vector<int>{0, 1}));
  EXPECT_EQ(w[0]->device_waits + w[1]->device_waits, 2);
  EXPECT_EQ(w[2]->device_waits, 0);
  EXPECT_EQ(q.ordered(), 2u);
  w[1]->finished = true;  // the second finished first: the first still holds the list
  q.poll();
  EXPECT_EQ(q.ordered(), 2u);
  w[0]->finished = true;
  q.poll();
  EXPECT_EQ(q.ordered(), 0u);
  q.order_all();
  EXPECT_EQ(done, (std::vector<int>{0, 1, 2, 3}));
  EXPECT_TRUE(q.empty());
  EXPECT_EQ(q.ordered(), 2u);
  for (const auto& x : w) EXPECT_EQ(x->blocking_host_waits, 0);
  q.wait_all();
  EXPECT_EQ(q.ordered(), 0u);
  EXPECT_EQ(w[2]->blocking_host_waits + w[3]->blocking_host_waits, 2);
  for (const auto& x : w) EXPECT_EQ(x->device_waits, 1);

  // a failure already known when the stream would be ordered is thrown there, on_done not run
  auto bad = std::make_shared<StreamWork>();
  bad->finished = true;
  bad->error = std::make_exception_ptr(fw::CommError("fourway: test collective failed"));
  q.push(fw::Work(bad), 9, fw::WorkKind::gradient, [&done] { done.push_back(9); });
  EXPECT_THROW(q.order_all(), fw::CommError);
  EXPECT_EQ(done.back(), 3);
  // one that surfaces later is thrown by the host wait
  auto late = std::make_shared<StreamWork>();
  late->error = std::make_exception_ptr(fw::CommTimeout("fourway: test collective timed out"));
  q.push(fw::Work(late), 10, fw::WorkKind::gradient);
  q.order_all();
  EXPECT_THROW(q.wait_all(), fw::CommTimeout);
}

// On the host backends a device wait is a host wait: LocalComm's results are there after
// wait_device, and nothing is left for wait_all.
TEST(ParallelParts, WorkQueueOnTheHostWaitsOnTheHost) {
  fw::launch<fw::LocalWorld>(2, [](fw::World<fw::LocalWorld>& w) {
    fw::WorkQueue q;
    std::vector<float> buf(6, static_cast<float>(w.rank() + 1));
    q.push(w.comm().all_reduce_async(buf.data(), buf.data(), 6, fw::ReduceOp::sum));
    q.order_all();
    EXPECT_EQ(q.ordered(), 0u);
    EXPECT_EQ(buf, std::vector<float>(6, 3.0f));
  });
}

// Real async collectives of LocalComm in one queue complete in issue order with their results.
TEST(ParallelParts, WorkQueueCompletesLocalCommCollectivesInIssueOrder) {
  fw::launch<fw::LocalWorld>(3, [](fw::World<fw::LocalWorld>& w) {
    fw::WorkQueue q;
    std::vector<std::vector<float>> bufs(4, std::vector<float>(10));
    std::vector<int> done;
    for (int k = 0; k < 4; ++k) {
      for (int e = 0; e < 10; ++e) {
        bufs[static_cast<std::size_t>(k)][static_cast<std::size_t>(e)] =
            static_cast<float>(w.rank() + k * e);
      }
      q.push(w.comm().all_reduce_async(bufs[static_cast<std::size_t>(k)].data(),
                                       bufs[static_cast<std::size_t>(k)].data(), 10,
                                       fw::ReduceOp::sum),
             k, fw::WorkKind::gradient, [&done, k] { done.push_back(k); });
    }
    q.wait_for(2, fw::WorkKind::gradient);
    EXPECT_EQ(done, (std::vector<int>{0, 1, 2}));
    q.wait_all();
    EXPECT_EQ(done, (std::vector<int>{0, 1, 2, 3}));
    for (int k = 0; k < 4; ++k) {
      for (int e = 0; e < 10; ++e) {  // (0 + 1 + 2) + 3·k·e
        EXPECT_EQ(bufs[static_cast<std::size_t>(k)][static_cast<std::size_t>(e)],
                  static_cast<float>(3 + 3 * k * e));
      }
    }
  });
}

// ---- tp::Placement
// --------------------------------------------------------------------------------

namespace {

/// For rank r of n, the full element behind each local element (-1: vocabulary padding), by the
/// table in placement.hpp's comment.
std::vector<std::int64_t> local_to_full(const fw::tp::Placement& p, int n, int r) {
  std::vector<std::int64_t> out;
  switch (p.split) {
    case fw::tp::Split::replicated:
      for (std::int64_t e = 0; e < p.rows * p.cols; ++e) out.push_back(e);
      break;
    case fw::tp::Split::row:
      for (std::int64_t i = r * p.rows / n; i < (r + 1) * p.rows / n; ++i) {
        for (std::int64_t c = 0; c < p.cols; ++c) out.push_back(i * p.cols + c);
      }
      break;
    case fw::tp::Split::vocab:
      for (std::int64_t i = r * p.padded_rows / n; i < (r + 1) * p.padded_rows / n; ++i) {
        for (std::int64_t c = 0; c < p.cols; ++c) out.push_back(i < p.rows ? i * p.cols + c : -1);
      }
      break;
    case fw::tp::Split::column: {
      const std::int64_t block = p.cols / p.parts;  // each block's columns split n ways
      for (std::int64_t i = 0; i < p.rows; ++i) {
        for (int k = 0; k < p.parts; ++k) {
          for (std::int64_t c = r * block / n; c < (r + 1) * block / n; ++c) {
            out.push_back(i * p.cols + k * block + c);
          }
        }
      }
      break;
    }
  }
  return out;
}

}  // namespace

// for_each_run visits exactly the (full, local) pairs of the table, in increasing offsets, never
// the padding; over the group each full element is held once (n times when replicated). Would
// fail if a column split ignored `parts` (q|k|v would be split as one block: the heads of q
// would all land on rank 0).
TEST(ParallelParts, PlacementRunsFollowTheSplitTable) {
  using fw::tp::Split;
  for (int n = 1; n <= 5; ++n) {
    std::vector<fw::tp::Placement> table;
    table.push_back({"ln.weight", Split::replicated, 1, 7});
    table.push_back({"c_attn.weight", Split::column, 4, 3 * 2 * n, 3});
    table.push_back({"c_fc.weight", Split::column, 3, 4 * n, 1});
    table.push_back({"c_proj.weight", Split::row, 2 * n, 5});
    table.push_back({"wte", Split::vocab, 10, 3, 1, fw::tp::padded_vocab(10, n, 2)});
    for (const auto& p : table) {
      std::vector<int> held(static_cast<std::size_t>(p.full_numel()), 0);
      for (int r = 0; r < n; ++r) {
        const auto expect = local_to_full(p, n, r);
        EXPECT_EQ(p.local_numel(n), static_cast<std::int64_t>(expect.size())) << p.name << n;
        std::vector<std::int64_t> got(expect.size(), -1);
        std::int64_t last = -1;
        p.for_each_run(n, r, [&](std::int64_t full, std::int64_t local, std::int64_t count) {
          EXPECT_GT(local, last) << p.name << " runs out of order";
          last = local;
          for (std::int64_t t = 0; t < count; ++t) {
            ASSERT_LT(local + t, static_cast<std::int64_t>(got.size())) << p.name;
            got[static_cast<std::size_t>(local + t)] = full + t;
            ++held[static_cast<std::size_t>(full + t)];
          }
        });
        EXPECT_EQ(got, expect) << p.name << " n=" << n << " r=" << r;
        EXPECT_EQ(p.counts_in_norm(r), p.split != Split::replicated || r == 0) << p.name;
      }
      const int copies = p.split == Split::replicated ? n : 1;
      for (int h : held) ASSERT_EQ(h, copies) << p.name << " n=" << n;
    }
  }
}

// Vp by hand (GPT-2's 50257 over 4 ranks aligned to 128: a multiple of 512, 99·512 = 50688), the
// real rows of each rank, and a ConfigError for sizes below 1.
TEST(ParallelParts, PlacementPadsTheVocabularyAndRefusesEmptySizes) {
  EXPECT_EQ(fw::tp::padded_vocab(50257, 4, 128), 50688);
  EXPECT_EQ(fw::tp::padded_vocab(512, 4, 128), 512);
  EXPECT_EQ(fw::tp::padded_vocab(10, 1, 1), 10);
  fw::tp::Placement wte{"wte", fw::tp::Split::vocab, 10, 3, 1, 12};  // 4 ranks of 3 rows
  const std::int64_t valid[] = {3, 3, 3, 1};
  for (int r = 0; r < 4; ++r) {
    EXPECT_EQ(wte.vocab_start(4, r), 3 * r);
    EXPECT_EQ(wte.valid_rows(4, r), valid[r]);
  }
  fw::tp::Placement tail{"wte", fw::tp::Split::vocab, 5, 3, 1, 8};  // rank 3 of 4 is all padding
  EXPECT_EQ(tail.valid_rows(4, 3), 0);
  int runs = 0;
  tail.for_each_run(4, 3, [&](auto, auto, auto) { ++runs; });
  EXPECT_EQ(runs, 0);
  EXPECT_THROW((void)fw::tp::padded_vocab(0, 4, 128), fw::ConfigError);
  EXPECT_THROW((void)fw::tp::padded_vocab(10, 0, 128), fw::ConfigError);
  EXPECT_THROW((void)fw::tp::padded_vocab(10, 4, 0), fw::ConfigError);
}

// ---- tp conjugate operators
// ----------------------------------------------------------------------

// g (all-reduce), ḡ (gather rows) and ḡ' (reduce-scatter rows) against sums and concatenations
// computed here, on 1..4 ranks; one rank moves nothing.
TEST(ParallelParts, ConjugateOperatorsSumGatherAndScatterRows) {
  constexpr std::int64_t R = 2, C = 3;  // rows per rank, columns
  auto value = [](int r, std::int64_t e) { return static_cast<float>(10 * r + e % 7); };
  for (int n = 1; n <= 4; ++n) {
    fw::launch<fw::LocalWorld>(n, [&](fw::World<fw::LocalWorld>& w) {
      const int r = w.rank();
      auto& comm = w.comm();
      fw::Tensor<float, Host> t(fw::Shape{R, C}, fw::MemTag::activations, w.memory());
      for (std::int64_t e = 0; e < R * C; ++e) t.data()[e] = value(r, e);
      fw::tp::all_reduce_sum(comm, t);
      for (std::int64_t e = 0; e < R * C; ++e) {
        float sum = 0.0f;
        for (int q = 0; q < n; ++q) sum += value(q, e);
        EXPECT_EQ(t.data()[e], sum) << "all_reduce n=" << n;
      }
      fw::Tensor<float, Host> chunk(fw::Shape{R, C}, fw::MemTag::activations, w.memory());
      for (std::int64_t e = 0; e < R * C; ++e) chunk.data()[e] = value(r, e);
      const auto full =
          fw::tp::gather_rows(w.ctx(), comm, chunk, fw::Shape{n * R, C}, fw::MemTag::activations);
      for (int q = 0; q < n; ++q) {  // rank q's chunk is rows [q·R, (q+1)·R)
        for (std::int64_t e = 0; e < R * C; ++e) {
          EXPECT_EQ(full.data()[q * R * C + e], value(q, e)) << "gather n=" << n;
        }
      }
      fw::Tensor<float, Host> mine(fw::Shape{n * R, C}, fw::MemTag::activations, w.memory());
      for (std::int64_t e = 0; e < n * R * C; ++e) mine.data()[e] = value(r, e);
      const auto part = fw::tp::reduce_scatter_rows(w.ctx(), comm, mine, fw::MemTag::activations);
      ASSERT_EQ(part.numel(), R * C);
      for (std::int64_t e = 0; e < R * C; ++e) {
        float sum = 0.0f;
        for (int q = 0; q < n; ++q) sum += value(q, r * R * C + e);
        EXPECT_EQ(part.data()[e], sum) << "reduce_scatter n=" << n;
      }
      if (n == 1) {
        EXPECT_EQ(comm.traffic().total(), 0u);
        EXPECT_EQ(comm.sequence(), 0u);
      }
    });
  }
}

// Shapes that do not split are a ShapeError on every rank before any collective (nothing hangs).
TEST(ParallelParts, ConjugateOperatorsRefuseRowsThatDoNotSplit) {
  std::atomic<int> refused{0};
  fw::launch<fw::LocalWorld>(2, [&](fw::World<fw::LocalWorld>& w) {
    fw::Tensor<float, Host> odd(fw::Shape{5, 3}, fw::MemTag::activations, w.memory());
    try {
      (void)fw::tp::reduce_scatter_rows(w.ctx(), w.comm(), odd, fw::MemTag::activations);
    } catch (const fw::ShapeError& e) {
      EXPECT_NE(std::string(e.what()).find("B·T=5 rows over tp=2"), std::string::npos) << e.what();
      ++refused;
    }
    fw::Tensor<float, Host> chunk(fw::Shape{2, 3}, fw::MemTag::activations, w.memory());
    EXPECT_THROW((void)fw::tp::gather_rows(w.ctx(), w.comm(), chunk, fw::Shape{5, 3},
                                           fw::MemTag::activations),
                 fw::ShapeError);
    EXPECT_EQ(w.comm().sequence(), 0u);
  });
  EXPECT_EQ(refused.load(), 2);
}

// ---- pp::ChunkSet
// ----------------------------------------------------------------------------------

// A rank holding chunks 0 and 2 of a 3-chunk GPT (as under ZB-V): units are chunk 0's then chunk
// 2's, parameters chunk by chunk, and only the head's copy of wte is left out of the norm. Would
// fail if the unit lookup picked the chunk with `>=` (unit 2, chunk 2's first, would go to chunk
// 0).
TEST(ParallelParts, ChunkSetJoinsChunksIntoOneModel) {
  const fw::models::GptConfig cfg{.layers = 3, .heads = 2, .dim = 4, .vocab = 7, .max_seq = 3};
  using Gpt = fw::models::Gpt<float, Host>;
  fw::launch<fw::LocalWorld>(2, [&](fw::World<fw::LocalWorld>& w) {
    Gpt first(w.ctx(), cfg, 1, fw::models::GptPart{0, 1, true, false});
    Gpt last(w.ctx(), cfg, 1, fw::models::GptPart{2, 3, false, true});
    const Param* tied = nullptr;  // the head's wte: the first parameter the last chunk visits
    last.visit_parameters([&](Param& p) {
      if (tied == nullptr) tied = &p;
    });
    ASSERT_EQ(tied->name, "wte.weight");
    fw::pp::ChunkSet<float, Host, fw::LocalComm, fw::models::Gpt<float, Host>> set({&first, &last},
                                                                                   tied, w.comm());
    ASSERT_EQ(set.units(), 4);  // (embedding, h.0) + (h.2, head)
    std::vector<const Param*> expect;
    first.visit_parameters([&](Param& p) { expect.push_back(&p); });
    last.visit_parameters([&](Param& p) { expect.push_back(&p); });
    std::vector<const Param*> got;
    set.visit_parameters([&](Param& p) { got.push_back(&p); });
    EXPECT_EQ(got, expect);
    for (std::size_t i = 0; i < expect.size(); ++i) {
      EXPECT_EQ(set.counts_in_norm(static_cast<int>(i)), expect[i] != tied) << expect[i]->name;
    }
    const std::pair<Gpt*, int> owner[] = {{&first, 0}, {&first, 1}, {&last, 0}, {&last, 1}};
    const char* prefix[] = {"w", "h.0.", "h.2.", ""};  // unit 3: ln_f.* then the tied wte
    for (int u = 0; u < 4; ++u) {
      std::vector<const Param*> want, have;
      owner[u].first->visit_unit_parameters(owner[u].second, [&](Param& p) { want.push_back(&p); });
      set.visit_unit_parameters(u, [&](Param& p) { have.push_back(&p); });
      EXPECT_EQ(have, want) << "unit " << u;
      for (const Param* p : have) {
        EXPECT_EQ(p->name.rfind(prefix[u], 0), 0u) << "unit " << u << ": " << p->name;
      }
    }
    EXPECT_THROW(set.visit_unit_parameters(4, [](Param&) {}), fw::ConfigError);
    EXPECT_THROW(set.visit_unit_parameters(-1, [](Param&) {}), fw::ConfigError);
    fw::StepScalars<Host> scalars(w.ctx());
    scalars.set(1, w.rank() + 1.5);
    set.sum_over_model_parallel(scalars, 1);  // in place, in the backend's memory
    EXPECT_EQ(scalars.read<2>()[1], 1.5 + 2.5);
    EXPECT_THROW((fw::pp::ChunkSet<float, Host, fw::LocalComm, fw::models::Gpt<float, Host>>(
                     {}, nullptr, w.comm())),
                 fw::ConfigError);
  });
}
