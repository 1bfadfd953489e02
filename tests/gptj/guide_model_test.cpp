// docs/guide.md's "Your own model on a 3D mesh, in one page", compiled and run: the page's model
// (copied below from the guide) on the page's 3D mesh (tp 2 x pipeline 2 x 2 ZeRO-1 replicas)
// against the one-rank run (fw::check_mesh), and its block's backward against finite differences.
// Keep the two in step: the guide shows what this test proves.
#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <vector>

#include "fourway/fourway.hpp"
#include "support/gradcheck.hpp"

// the page's layout, kept as it is there
// clang-format off
namespace fw = fourway;

namespace my {
struct Config { std::int64_t vocab = 256, dim = 64, heads = 4, max_seq = 64; int layers = 4;
                bool checkpoint = false; };

template <class T, class B, class Comm>            // tokens -> rows (split by vocabulary rows)
struct Embed : fw::VocabEmbedding<T, B, Comm> {
  Embed(const fw::Context<B>& ctx, const Config& c, fw::TpGroup<Comm> g, std::uint64_t seed)
      : fw::VocabEmbedding<T, B, Comm>(ctx, "wte", c.vocab, c.dim, seed, 0.02f, g) {}
};

template <class T, class B, class Comm>            // x + attention(norm(x)), then + mlp(norm(.))
struct Block {
  using value_type = T; using backend_type = B; using Input = fw::Tensor<T, B>;
  using Norm = fw::ReplicatedNorm<fw::LayerNorm<T, B>, Comm>;
  struct Stash { typename Norm::Stash n1, n2; typename fw::ParallelAttention<T, B, Comm>::Stash a;
                 typename fw::ColumnLinear<T, B, Comm>::Stash fc; typename fw::Gelu<T, B>::Stash g;
                 typename fw::RowLinear<T, B, Comm>::Stash proj; fw::Tensor<T, B> r, y; };
  Block(const fw::Context<B>& ctx, const Config& c, int i, fw::TpGroup<Comm> g, std::uint64_t seed)
      : n1(ctx, name(i, "ln_1"), c.dim, 1e-5f, g), n2(ctx, name(i, "ln_2"), c.dim, 1e-5f, g),
        attn(ctx, name(i, "attn.c_attn"), name(i, "attn.c_proj"),
             fw::AttentionSpec{c.dim, c.heads, true, 10000.0f, seed}, g),   // rotary q, k
        fc(ctx, name(i, "mlp.c_fc"), c.dim, 4 * c.dim, seed, 0.02f, true, g),
        proj(ctx, name(i, "mlp.c_proj"), 4 * c.dim, c.dim, seed, 0.02f, true, g) {}
  fw::Tensor<T, B> forward(const fw::Context<B>& ctx, const fw::Tensor<T, B>& x, Stash& s) {
    const auto a = attn.forward(ctx, n1.forward(ctx, x, s.n1), s.a);
    s.r = add(ctx, x, a);
    const auto m = proj.forward(ctx, fc.forward_gelu(ctx, n2.forward(ctx, s.r, s.n2), s.fc, s.g),
                                s.proj);
    s.y = add(ctx, s.r, m);
    return s.y.view();
  }
  fw::Tensor<T, B> backward(const fw::Context<B>& ctx, const fw::Tensor<T, B>& dy, Stash& s) {
    auto dr = n2.backward(ctx, fc.backward(ctx, fw::Gelu<T, B>{}.backward(ctx,
                              proj.backward(ctx, dy, s.proj), s.g), s.fc), s.n2);
    dr = add(ctx, dr, dy);
    auto dx = n1.backward(ctx, attn.backward(ctx, dr, s.a), s.n1);
    return add(ctx, dx, dr);
  }
  template <class F> void visit_parameters(F&& f) {
    n1.visit_parameters(f); attn.visit_parameters(f); n2.visit_parameters(f);
    fc.visit_parameters(f); proj.visit_parameters(f);
  }
  void set_sequence_length(std::int64_t t) { attn.set_sequence_length(t); }  // sequence parallel
  void bind_sequence_shard(fw::SequenceShard<T, B>* s) { attn.bind_sequence_shard(s); }  // cp
  Norm n1, n2;
  fw::ParallelAttention<T, B, Comm> attn;
  fw::ColumnLinear<T, B, Comm> fc;
  fw::RowLinear<T, B, Comm> proj;
  static std::string name(int i, const char* what) { return "h." + std::to_string(i) + "." + what; }
  static fw::Tensor<T, B> add(const fw::Context<B>& ctx, const fw::Tensor<T, B>& a,
                              const fw::Tensor<T, B>& b) {
    auto y = fw::detail::activation<T, B>(ctx, a.shape());
    fw::Ops<B>::residual_forward(ctx, y.data(), a.data(), b.data(), a.numel());
    return y;
  }
};

template <class T, class B, class Comm>            // final norm, untied head, cross-entropy
struct Head {
  using value_type = T; using backend_type = B;
  struct Stash { typename fw::LayerNorm<T, B>::Stash n; typename fw::VocabHead<T, B, Comm>::Stash h; };
  Head(const fw::Context<B>& ctx, const Config& c, fw::TpGroup<Comm> g, std::uint64_t seed)
      : norm(ctx, "ln_f", c.dim, 1e-5f, g), head(ctx, "lm_head", c.vocab, c.dim, seed, 0.02f, g) {}
  float forward(const fw::Context<B>& ctx, const fw::Tensor<T, B>& x,
                const fw::Tensor<std::int32_t, B>& targets, Stash& s, const fw::LossSink* sink) {
    return head.forward(ctx, norm.forward(ctx, x, s.n), targets, s.h, sink);
  }
  fw::Tensor<T, B> backward(const fw::Context<B>& ctx, Stash& s, float scale) {
    return norm.backward(ctx, head.backward(ctx, s.h, scale), s.n);
  }
  template <class F> void visit_parameters(F&& f) { norm.visit_parameters(f); head.visit_parameters(f); }
  fw::ReplicatedNorm<fw::LayerNorm<T, B>, Comm> norm;
  fw::VocabHead<T, B, Comm> head;
};
}  // namespace my

template <> struct fourway::model_family<my::Config>                 // the one line
    : fourway::decoder_family<my::Config, my::Embed, my::Block, my::Head> {};
// clang-format on

TEST(GuideModel, ItsBlockPassesTheGradientCheck) {
  fw::MemoryAccountant mem;
  fw::Context<fw::Host> ctx(mem);
  my::Block<float, fw::Host, fw::Alone> block(ctx, my::Config{.dim = 16, .heads = 2}, 0,
                                              fw::TpGroup<>{}, 3);
  (void)fw::test::randomize_parameters(ctx, block, 5, 0.3);
  fw::Tensor<float, fw::Host> x(fw::Shape{2, 4, 16}, fw::MemTag::activations, mem);
  fw::test::upload(ctx, x, fw::test::randn(static_cast<std::size_t>(x.numel()), 9));
  const auto r = fw::check_gradients(ctx, block, x);
  EXPECT_TRUE(r.within(1e-2)) << r.str();
}

TEST(GuideModel, TrainsOnThe3dMeshLikeOneRank) {
  using Mesh = fw::Mesh<fw::TensorParallel<2>, fw::Pipeline<2, 4>, fw::Sharded<1>>;
  const my::Config cfg{.vocab = 37, .dim = 16, .heads = 2, .max_seq = 8, .layers = 2};
  constexpr std::int64_t B = 8, T = 8;
  std::vector<std::int32_t> in, tg;
  for (std::int64_t i = 0; i < B * T; ++i) {
    in.push_back(static_cast<std::int32_t>((i * 7 + 1) % 37));
    tg.push_back(static_cast<std::int32_t>((i * 5 + 2) % 37));
  }
  fw::launch<fw::LocalWorld>(8, [&](fw::World<fw::LocalWorld>& w) {
    const Mesh mesh(w.size());
    fw::MeshGroups<fw::LocalComm> groups(mesh, w.comm());
    fw::TrainerOptions options;
    options.micro_batches = 4;
    fw::CheckOptions co;
    co.steps = 2;
    const auto r = fw::check_mesh<Mesh, fw::Precision<float>>(
        w.ctx(), mesh, groups, w.comm(), cfg, 1, fw::MeshOptions{}, fw::AdamW{}, options,
        [&](int) {
          return fw::Batch{in, tg, B, T};
        },
        co);
    if (w.rank() == 0) {
      EXPECT_TRUE(r.ok()) << r.text();
    }
  });
}
