// The tensor-parallel-ready layers (layers/parallel_linear.hpp, parallel_attention.hpp,
// vocab_parallel.hpp, replicated_norm.hpp). In a group of one rank each is the plain layer to the
// bit; split over 2 or 4 LocalWorld ranks (with and without sequence parallelism) each rank's
// slice starts from the slice of the one-rank values, and outputs, input gradients and every
// parameter gradient equal the one-rank layer's, element by element through the placement's runs.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <functional>
#include <mutex>
#include <string>
#include <vector>

#include "fourway/comm/launch.hpp"
#include "fourway/comm/local_world.hpp"
#include "fourway/layers/gelu.hpp"
#include "fourway/layers/linear.hpp"
#include "fourway/layers/parallel_attention.hpp"
#include "fourway/layers/parallel_linear.hpp"
#include "fourway/layers/replicated_norm.hpp"
#include "fourway/layers/rmsnorm.hpp"
#include "fourway/layers/vocab_parallel.hpp"

namespace fw = fourway;
using Host = fw::Host;
using Tensor = fw::Tensor<float, Host>;

namespace {

constexpr std::uint64_t kSeed = 11;

/// Deterministic values in [-1, 1).
std::vector<float> values(std::int64_t n, std::uint32_t seed) {
  std::vector<float> v(static_cast<std::size_t>(n));
  std::uint32_t x = seed * 2654435761u + 1;
  for (auto& e : v) {
    x = x * 1664525u + 1013904223u;
    e = static_cast<float>(x >> 8) / static_cast<float>(1u << 23) - 1.0f;
  }
  return v;
}

Tensor tensor(fw::MemoryAccountant& mem, fw::Shape shape, const std::vector<float>& v,
              std::int64_t first = 0) {
  Tensor t(shape, fw::MemTag::workspace, mem);
  for (std::int64_t i = 0; i < t.numel(); ++i) t[i] = v[static_cast<std::size_t>(first + i)];
  return t;
}

std::vector<float> host(const Tensor& t) {
  return std::vector<float>(t.data(), t.data() + t.numel());
}

struct Grads {
  std::vector<std::string> names;
  std::vector<std::vector<float>> weights, grads;
  std::vector<fw::Parameter<float, Host>> placed;  // copies of the descriptions (no storage)
};

template <class L>
Grads grads_of(L& layer) {
  Grads g;
  layer.visit_parameters([&](fw::Parameter<float, Host>& p) {
    g.names.push_back(p.name);
    g.weights.push_back(host(p.weight));
    g.grads.push_back(host(p.grad));
    fw::Parameter<float, Host> d;
    d.name = p.name;
    d.placement = p.placement;
    d.slice_count = p.slice_count;
    d.slice_index = p.slice_index;
    g.placed.push_back(std::move(d));
  });
  return g;
}

/// Every local element of a rank's slice equals the unsplit tensor's element it stands for
/// (padding is zero), within `tol` of the unsplit tensor's largest magnitude.
void expect_slice(const fw::Parameter<float, Host>& p, const std::vector<float>& local,
                  const std::vector<float>& full, double tol, const std::string& what) {
  double scale = 1e-30;
  for (float v : full) scale = std::max(scale, std::abs(double(v)));
  std::vector<bool> covered(local.size(), false);
  double worst = 0;
  p.placement.for_each_run(
      p.slice_count, p.slice_index, [&](std::int64_t from, std::int64_t to, std::int64_t n) {
        for (std::int64_t k = 0; k < n; ++k) {
          const auto l = static_cast<std::size_t>(to + k);
          covered[l] = true;
          worst = std::max(worst,
                           std::abs(double(local[l]) - full[static_cast<std::size_t>(from + k)]));
        }
      });
  for (std::size_t l = 0; l < local.size(); ++l) {
    if (!covered[l]) {
      EXPECT_EQ(local[l], 0.0f) << what << " padding element " << l;
    }
  }
  EXPECT_LE(worst / scale, tol) << what << " rank " << p.slice_index << " of " << p.slice_count;
}

void expect_near_all(const std::vector<float>& got, const std::vector<float>& want,
                     std::int64_t offset, double tol, const std::string& what) {
  double scale = 1e-30, worst = 0;
  for (float v : want) scale = std::max(scale, std::abs(double(v)));
  for (std::size_t i = 0; i < got.size(); ++i) {
    worst = std::max(worst, std::abs(double(got[i]) - want[static_cast<std::size_t>(offset) + i]));
  }
  EXPECT_LE(worst / scale, tol) << what;
}

/// What one rank (or the one-rank run) saw: output, input gradient, parameter values and grads.
struct Seen {
  std::vector<float> y, dx;
  Grads params;
  float loss = 0.0f;
};

// ---- an MLP: ColumnLinear (gelu fused) -> RowLinear ---------------------------------------------

constexpr std::int64_t kRows = 8, kC = 12, kHidden = 48;

template <class Comm>
Seen mlp_run(const fw::Context<Host>& ctx, fw::TpGroup<Comm> g) {
  auto& mem = ctx.memory();
  fw::ColumnLinear<float, Host, Comm> fc(ctx, "mlp.c_fc", kC, kHidden, kSeed, 0.02f, true, g);
  fw::RowLinear<float, Host, Comm> proj(ctx, "mlp.c_proj", kHidden, kC, kSeed, 0.05f, true, g);
  // under sequence parallelism this rank holds rows [r·R/N, (r+1)·R/N)
  const std::int64_t rows = g.sequence_parallel() ? kRows / g.size() : kRows;
  const std::int64_t first = g.sequence_parallel() ? rows * g.rank() : 0;
  const Tensor x = tensor(mem, fw::Shape{rows, kC}, values(kRows * kC, 1), first * kC);
  const Tensor dy = tensor(mem, fw::Shape{rows, kC}, values(kRows * kC, 2), first * kC);
  typename fw::ColumnLinear<float, Host, Comm>::Stash s1;
  typename fw::Gelu<float, Host>::Stash sg;
  typename fw::RowLinear<float, Host, Comm>::Stash s2;
  fw::Gelu<float, Host> gelu;
  Seen r;
  r.y = host(proj.forward(ctx, fc.forward_gelu(ctx, x, s1, sg), s2));
  const Tensor dh = proj.backward(ctx, dy, s2);
  r.dx = host(fc.backward(ctx, gelu.backward(ctx, dh, sg), s1));
  Grads a = grads_of(fc), b = grads_of(proj);
  for (std::size_t i = 0; i < b.names.size(); ++i) {
    a.names.push_back(b.names[i]);
    a.weights.push_back(b.weights[i]);
    a.grads.push_back(b.grads[i]);
    a.placed.push_back(std::move(b.placed[i]));
  }
  r.params = std::move(a);
  return r;
}

/// Runs `run` on N LocalWorld ranks and compares each rank with the one-rank run `want`.
template <class RunFn>
void expect_split_matches(int n, bool sp, const Seen& want, RunFn&& run, std::int64_t row_width,
                          std::int64_t total_rows, double tol) {
  std::mutex m;
  fw::launch<fw::LocalWorld>(n, [&](fw::World<fw::LocalWorld>& w) {
    const Seen got = run(w.ctx(), fw::TpGroup<fw::LocalComm>(w.comm(), sp));
    const std::lock_guard lock(m);
    const std::string at =
        "tp=" + std::to_string(n) + (sp ? " sp" : "") + " rank " + std::to_string(w.rank());
    const std::int64_t chunk = sp ? total_rows / n * row_width : 0;
    ASSERT_EQ(got.y.size(), sp ? static_cast<std::size_t>(chunk) : want.y.size()) << at;
    expect_near_all(got.y, want.y, chunk * w.rank(), tol, at + " output");
    if (!want.dx.empty()) expect_near_all(got.dx, want.dx, chunk * w.rank(), tol, at + " dx");
    EXPECT_NEAR(got.loss, want.loss, tol * std::max(1.0f, std::abs(want.loss))) << at;
    ASSERT_EQ(got.params.names, want.params.names) << at;
    for (std::size_t i = 0; i < want.params.names.size(); ++i) {
      const auto& p = got.params.placed[i];
      expect_slice(p, got.params.weights[i], want.params.weights[i], 0.0,
                   at + " initial " + p.name);
      expect_slice(p, got.params.grads[i], want.params.grads[i], tol, at + " gradient " + p.name);
    }
  });
}

}  // namespace

TEST(ParallelLayers, ColumnAndRowInAGroupOfOneAreLinearToTheBit) {
  fw::MemoryAccountant mem;
  fw::Context<Host> ctx(mem);
  fw::Linear<float, Host> fc(ctx, "mlp.c_fc", kC, kHidden, kSeed, 0.02f);
  fw::Linear<float, Host> proj(ctx, "mlp.c_proj", kHidden, kC, kSeed, 0.05f);
  const Tensor x = tensor(mem, fw::Shape{kRows, kC}, values(kRows * kC, 1));
  const Tensor dy = tensor(mem, fw::Shape{kRows, kC}, values(kRows * kC, 2));
  fw::Linear<float, Host>::Stash s1, s2;
  fw::Gelu<float, Host>::Stash sg;
  fw::Gelu<float, Host> gelu;
  const auto y = host(proj.forward(ctx, fc.forward_gelu(ctx, x, s1, sg), s2));
  const auto dx = host(fc.backward(ctx, gelu.backward(ctx, proj.backward(ctx, dy, s2), sg), s1));
  const Grads a = grads_of(fc), b = grads_of(proj);

  const Seen one = mlp_run(ctx, fw::TpGroup<>{});
  EXPECT_EQ(one.y, y);
  EXPECT_EQ(one.dx, dx);
  EXPECT_EQ(one.params.weights[0], a.weights[0]);
  EXPECT_EQ(one.params.weights[2], b.weights[0]);
  EXPECT_EQ(one.params.grads[0], a.grads[0]);
  EXPECT_EQ(one.params.grads[1], a.grads[1]);
  EXPECT_EQ(one.params.grads[2], b.grads[0]);
  EXPECT_EQ(one.params.grads[3], b.grads[1]);
  // the parameters say how they split
  EXPECT_EQ(one.params.placed[0].placement.split, fw::tp::Split::column);
  EXPECT_EQ(one.params.placed[2].placement.split, fw::tp::Split::row);
  EXPECT_EQ(one.params.placed[3].placement.split, fw::tp::Split::replicated);
}

TEST(ParallelLayers, MlpSplitOverTheGroupEqualsTheOneRankMlp) {
  fw::MemoryAccountant mem;
  fw::Context<Host> ctx(mem);
  const Seen want = mlp_run(ctx, fw::TpGroup<>{});
  for (int n : {2, 4}) {
    for (bool sp : {false, true}) {
      expect_split_matches(
          n, sp, want, [](const auto& c, auto g) { return mlp_run(c, g); }, kC, kRows, 2e-6);
    }
  }
}

TEST(ParallelLayers, SplitsThatDoNotDivideAreRefusedWithTheNumbers) {
  fw::launch<fw::LocalWorld>(4, [](fw::World<fw::LocalWorld>& w) {
    const fw::TpGroup<fw::LocalComm> g(w.comm());
    try {
      fw::ColumnLinear<float, Host, fw::LocalComm> c(w.ctx(), "qkv", 8, 18, 1, 0.02f, true, g, 3);
      ADD_FAILURE() << "no error for 18 columns in 3 parts over 4 ranks";
    } catch (const fw::ConfigError& e) {
      EXPECT_NE(std::string(e.what()).find("18 must divide by 3 x 4 = 12"), std::string::npos)
          << e.what();
    }
    EXPECT_THROW((fw::RowLinear<float, Host, fw::LocalComm>(w.ctx(), "p", 6, 8, 1, 0.02f, true, g)),
                 fw::ConfigError);
    EXPECT_THROW((fw::ParallelAttention<float, Host, fw::LocalComm>(w.ctx(), "a.qkv", "a.o",
                                                                    fw::AttentionSpec{24, 6}, g)),
                 fw::ConfigError);  // 6 heads over 4 ranks
  });
}

TEST(ParallelLayers, DeferredSlicesMaterialiseTheSameValuesAsEagerOnes) {
  fw::launch<fw::LocalWorld>(2, [](fw::World<fw::LocalWorld>& w) {
    const fw::TpGroup<fw::LocalComm> g(w.comm());
    fw::ColumnLinear<float, Host, fw::LocalComm> eager(w.ctx(), "qkv", 8, 24, 3, 0.02f, true, g, 3);
    std::vector<float> deferred_values;
    {
      const fw::DeferredInit scope;
      fw::ColumnLinear<float, Host, fw::LocalComm> d(w.ctx(), "qkv", 8, 24, 3, 0.02f, true, g, 3);
      EXPECT_TRUE(d.weight().deferred());
      Tensor out(d.weight().weight.shape(), fw::MemTag::workspace, w.memory());
      // elements [5, numel) only, as a shard owner asks
      fw::write_init_rule(w.ctx(), d.weight(), out.data() + 5, 5, out.numel() - 5);
      deferred_values = host(out);
    }
    const auto want = host(eager.weight().weight);
    for (std::size_t i = 5; i < want.size(); ++i) ASSERT_EQ(deferred_values[i], want[i]) << i;
  });
}

// ---- attention split by heads, with rotary embeddings -------------------------------------------

constexpr std::int64_t kB = 2, kT = 4, kHeads = 4, kDim = 16;

/// Multi-head (kv_heads 0) or grouped-query attention with rotary embeddings.
template <class Comm>
fw::ParallelAttention<float, Host, Comm> attention(const fw::Context<Host>& ctx,
                                                   fw::TpGroup<Comm> g, std::int64_t kv_heads) {
  const fw::AttentionSpec spec{kDim, kHeads, true, 10000.0f, kSeed, 0.2f, 0.1f, kv_heads};
  if (kv_heads == 0) return {ctx, "attn.qkv", "attn.out", spec, g};
  return {ctx, "attn.q", "attn.kv", "attn.out", spec, g};
}

template <class Comm>
Seen attention_run(const fw::Context<Host>& ctx, fw::TpGroup<Comm> g, std::int64_t kv_heads = 0) {
  auto& mem = ctx.memory();
  auto attn = attention(ctx, g, kv_heads);
  attn.set_sequence_length(kT);
  const std::int64_t rows = g.sequence_parallel() ? kB * kT / g.size() : kB * kT;
  const std::int64_t first = g.sequence_parallel() ? rows * g.rank() : 0;
  const fw::Shape shape = g.sequence_parallel() ? fw::Shape{rows, kDim} : fw::Shape{kB, kT, kDim};
  const Tensor x = tensor(mem, shape, values(kB * kT * kDim, 3), first * kDim);
  const Tensor dy = tensor(mem, shape, values(kB * kT * kDim, 4), first * kDim);
  typename fw::ParallelAttention<float, Host, Comm>::Stash s;
  Seen r;
  r.y = host(attn.forward(ctx, x, s));
  r.dx = host(attn.backward(ctx, dy, s));
  r.params = grads_of(attn);
  return r;
}

TEST(ParallelLayers, AttentionSplitByHeadsEqualsTheOneRankAttention) {
  fw::MemoryAccountant mem;
  fw::Context<Host> ctx(mem);
  const Seen want = attention_run(ctx, fw::TpGroup<>{});
  for (int n : {2, 4}) {
    for (bool sp : {false, true}) {
      expect_split_matches(
          n, sp, want, [](const auto& c, auto g) { return attention_run(c, g); }, kDim, kB * kT,
          2e-6);
    }
  }
}

// Grouped-query attention is multi-head attention whose key/value heads are repeated over their
// group of query heads (Hugging Face Llama's repeat_kv): an MHA with the GQA's weights placed that
// way gives the same output and input gradient, its q gradient is the GQA's, and each GQA key/value
// gradient is the sum of the MHA's over its group.
TEST(ParallelLayers, GroupedQueryAttentionIsMultiHeadWithRepeatedKeyValueHeads) {
  constexpr std::int64_t kKv = 2, hs = kDim / kHeads, group = kHeads / kKv;
  fw::MemoryAccountant mem;
  fw::Context<Host> ctx(mem);
  auto gqa = attention(ctx, fw::TpGroup<>{}, kKv);
  auto mha = attention(ctx, fw::TpGroup<>{}, 0);
  std::vector<fw::Parameter<float, Host>*> g, m;  // gqa: q w, q b, kv w, kv b, out w, out b
  gqa.visit_parameters([&](fw::Parameter<float, Host>& p) { g.push_back(&p); });
  mha.visit_parameters([&](fw::Parameter<float, Host>& p) { m.push_back(&p); });
  ASSERT_EQ(g.size(), 6u);
  ASSERT_EQ(m.size(), 4u);
  // MHA column c of q|k|v (width 3C) <- GQA q column c, or the kv column of head h / group
  const auto source = [&](std::int64_t c) -> std::pair<int, std::int64_t> {
    if (c < kDim) return {0, c};
    const std::int64_t part = c / kDim - 1, h = (c % kDim) / hs, e = c % hs;
    return {1, part * kKv * hs + (h / group) * hs + e};
  };
  for (std::int64_t r = 0; r <= kDim; ++r) {  // the weight's C rows, then the bias row
    for (std::int64_t c = 0; c < 3 * kDim; ++c) {
      const auto [which, col] = source(c);
      const fw::Parameter<float, Host>& from =
          *g[static_cast<std::size_t>(2 * which + (r == kDim))];
      const std::int64_t width = which == 0 ? kDim : 2 * kKv * hs;
      const float v = r == kDim ? from.weight[col] : from.weight[r * width + col];
      if (r == kDim) {
        m[1]->weight[c] = v;
      } else {
        m[0]->weight[r * 3 * kDim + c] = v;
      }
    }
  }
  for (std::int64_t i = 0; i < m[2]->numel(); ++i) m[2]->weight[i] = g[4]->weight[i];
  for (std::int64_t i = 0; i < m[3]->numel(); ++i) m[3]->weight[i] = g[5]->weight[i];

  const Tensor x = tensor(mem, fw::Shape{kB, kT, kDim}, values(kB * kT * kDim, 3));
  const Tensor dy = tensor(mem, fw::Shape{kB, kT, kDim}, values(kB * kT * kDim, 4));
  decltype(gqa)::Stash sg;
  decltype(mha)::Stash sm;
  const auto yg = host(gqa.forward(ctx, x, sg));
  const auto ym = host(mha.forward(ctx, x, sm));
  expect_near_all(yg, ym, 0, 1e-6, "output");
  expect_near_all(host(gqa.backward(ctx, dy, sg)), host(mha.backward(ctx, dy, sm)), 0, 1e-5,
                  "input gradient");
  // gradients: q from the MHA's first C columns; each kv column the sum over its group
  std::vector<double> want_q(static_cast<std::size_t>((kDim + 1) * kDim), 0.0);
  std::vector<double> want_kv(static_cast<std::size_t>((kDim + 1) * 2 * kKv * hs), 0.0);
  for (std::int64_t r = 0; r <= kDim; ++r) {
    for (std::int64_t c = 0; c < 3 * kDim; ++c) {
      const float d = r == kDim ? m[1]->grad[c] : m[0]->grad[r * 3 * kDim + c];
      const auto [which, col] = source(c);
      if (which == 0) {
        want_q[static_cast<std::size_t>(r * kDim + col)] += d;
      } else {
        want_kv[static_cast<std::size_t>(r * 2 * kKv * hs + col)] += d;
      }
    }
  }
  const auto rows_of = [](const fw::Parameter<float, Host>& w,
                          const fw::Parameter<float, Host>& b) {
    std::vector<float> v = host(w.grad);
    const auto bias = host(b.grad);
    v.insert(v.end(), bias.begin(), bias.end());
    return v;
  };
  expect_near_all(rows_of(*g[0], *g[1]), std::vector<float>(want_q.begin(), want_q.end()), 0, 1e-5,
                  "q gradient");
  expect_near_all(rows_of(*g[2], *g[3]), std::vector<float>(want_kv.begin(), want_kv.end()), 0,
                  1e-5, "k|v gradient");
}

TEST(ParallelLayers, GroupedQueryAttentionSplitOverTheGroupEqualsTheOneRankAttention) {
  fw::MemoryAccountant mem;
  fw::Context<Host> ctx(mem);
  const Seen want = attention_run(ctx, fw::TpGroup<>{}, 2);
  for (bool sp : {false, true}) {  // 2 key/value heads: at most 2 ranks
    expect_split_matches(
        2, sp, want, [](const auto& c, auto g) { return attention_run(c, g, 2); }, kDim, kB * kT,
        2e-6);
  }
  fw::launch<fw::LocalWorld>(4, [](fw::World<fw::LocalWorld>& w) {
    try {
      (void)attention(w.ctx(), fw::TpGroup<fw::LocalComm>(w.comm()), 2);
      ADD_FAILURE() << "no error for 2 key/value heads over 4 ranks";
    } catch (const fw::ConfigError& e) {
      EXPECT_NE(std::string(e.what()).find("kv_heads=2 divisible by 4"), std::string::npos)
          << e.what();
    }
  });
}

// ---- the vocabulary: embedding and untied head with its loss, an RMSNorm between ---------------

constexpr std::int64_t kVocab = 37;  // not a multiple of 2 or 4: the last rank has padding rows

template <class Comm>
Seen vocab_run(const fw::Context<Host>& ctx, fw::TpGroup<Comm> g) {
  auto& mem = ctx.memory();
  fw::VocabEmbedding<float, Host, Comm> emb(ctx, "tok", kVocab, kDim, kSeed, 0.5f, g);
  fw::ReplicatedNorm<fw::RMSNorm<float, Host>, Comm> norm(ctx, "norm", kDim, 1e-5f, g);
  fw::VocabHead<float, Host, Comm> head(ctx, "output", kVocab, kDim, kSeed, 0.5f, g);
  fw::Tensor<std::int32_t, Host> tok(fw::Shape{kB, kT}, fw::MemTag::workspace, mem);
  fw::Tensor<std::int32_t, Host> tgt(fw::Shape{kB, kT}, fw::MemTag::workspace, mem);
  for (std::int64_t i = 0; i < tok.numel(); ++i) {
    tok[i] = static_cast<std::int32_t>((i * 7 + 3) % kVocab);
    tgt[i] = static_cast<std::int32_t>((i * 5 + 36) % kVocab);  // ids on every rank's rows
  }
  typename fw::VocabEmbedding<float, Host, Comm>::Stash se;
  typename fw::RMSNorm<float, Host>::Stash sn;
  typename fw::VocabHead<float, Host, Comm>::Stash sh;
  Seen r;
  const Tensor e = emb.forward(ctx, tok, se);
  r.y = host(e);
  r.loss = head.forward(ctx, norm.forward(ctx, e, sn), tgt, sh);
  const Tensor dh = head.backward(ctx, sh, 2.0f);
  const Tensor de = norm.backward(ctx, dh, sn);
  r.dx = host(de);
  (void)emb.backward(ctx, de, se);
  Grads a = grads_of(emb), b = grads_of(norm), c = grads_of(head);
  for (Grads* more : {&b, &c}) {
    for (std::size_t i = 0; i < more->names.size(); ++i) {
      a.names.push_back(more->names[i]);
      a.weights.push_back(more->weights[i]);
      a.grads.push_back(more->grads[i]);
      a.placed.push_back(std::move(more->placed[i]));
    }
  }
  r.params = std::move(a);
  return r;
}

TEST(ParallelLayers, VocabularySplitOverTheGroupEqualsTheOneRankEmbeddingAndLoss) {
  fw::MemoryAccountant mem;
  fw::Context<Host> ctx(mem);
  const Seen want = vocab_run(ctx, fw::TpGroup<>{});
  EXPECT_GT(want.loss, 0.0f);
  for (int n : {2, 4}) {
    for (bool sp : {false, true}) {
      expect_split_matches(
          n, sp, want, [](const auto& c, auto g) { return vocab_run(c, g); }, kDim, kB * kT, 2e-6);
    }
  }
}
