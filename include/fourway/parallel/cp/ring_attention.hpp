//! Context parallelism's attention: causal self-attention over sequences split across the `c`
//! ranks of a context-parallel group, each rank holding T/c tokens of every sequence, computed by
//! passing key/value blocks around a ring (Liu, Zaharia, Abbeel 2023, "Ring Attention with
//! Blockwise Transformers"; Megatron-Core's context parallelism). This is the host form; every
//! other layer of a block is local to its tokens.
//!
//! The split (`BalancedSplit`, as Megatron-Core cuts it): a sequence of T tokens in 2c chunks of
//! T/(2c); rank r holds chunks r and 2c − 1 − r, local rows [0, T/2c) and [T/2c, T/c). Under the
//! causal mask a chunk's work grows with its position, and each rank pairs an early chunk with a
//! late one, so every rank scores the same number of (query, key) pairs
//! (`BalancedSplit::visible_pairs`).
//!
//!   T = 8 tokens, c = 2:   chunks  0 1 2 3   rank 0 holds chunks 0 and 3
//!                                            rank 1 holds chunks 1 and 2
//!
//! Forward, on every rank, c steps: the rank's queries against the key/value block it holds
//! (its own at step 0, rank r − s's at step s), keys after a query's position masked, merged
//! into the running max m, sum ℓ and output accumulator of each query row exactly as the flash
//! kernels merge key tiles (online softmax, host/flash_attention.hpp). Every rank passes the
//! block it holds to rank r + 1 and takes rank r − 1's, one send and one recv in one group
//! (comm/group.hpp; every peer, tag and size from the exchange of parallel/cp/ring_schedule.hpp,
//! verified for the whole group first), posted *before* the step's compute and waited for after it:
//! the block travels while the rank computes with it (both only read it; the next one lands in a
//! second buffer), so the ring's traffic hides behind attention as the planner assumes. The output
//! is acc/ℓ; the log-sum-exp L = m + log ℓ is kept, O(T/c) per head, as the flash kernels keep it.
//!
//! Backward, c steps again with the global L: for the block of rank j held at step s,
//! P = exp(S − L) (masked), dV_j += Pᵀ dO, dP = dO V_jᵀ, dS = P ∘ (dP − D) with D = rowsum(dO ∘ O),
//! dQ += scale·dS K_j, dK_j += scale·dSᵀ Q. The block is passed on while the step computes
//! (as forward); its dK_j and dV_j (fp32), which the step adds to, follow once it is done, so
//! they travel with it; after the c-th step one more pass brings each rank its own block's
//! gradients. A group of one rank is the flash attention without a message.
//!
//! Layout as the attention layers': `qkv (B, T/c, 3C)` (q, k, v side by side, head h owning
//! columns [h·hs, (h+1)·hs) of each third), `out (B, T/c, C)`, `lse (B, NH, T/c)` fp32; the rows
//! are the rank's local rows in the split's order. Scale 1/√hs.
//!
//! Precision: q, k, v and dO are read into fp32; scores, probabilities, statistics and every
//! accumulator are fp32, and the key/value gradients travel in fp32; `out` and `dqkv` are
//! rounded to E once. Messages are Tensors of the rank's accountant (MemTag::comm_buffers): the
//! block in flight, (B, T/c, 2C) of E, and backward its gradients, (B, T/c, 2C) fp32 — so the
//! strict world accepts them as it accepts device buffers. The per-(sequence, head) fp32 copies
//! and the (T/c)² score tile are thread-local scratch, as in the flash kernels.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <optional>
#include <utility>
#include <vector>

#include "fourway/backend/host/backend.hpp"
#include "fourway/backend/host/blockwise_attention.hpp"
#include "fourway/backend/host/flash_attention.hpp"
#include "fourway/backend/host/gemm.hpp"
#include "fourway/backend/host/math.hpp"
#include "fourway/comm/communicator.hpp"
#include "fourway/comm/group.hpp"
#include "fourway/core/dtype.hpp"
#include "fourway/core/error.hpp"
#include "fourway/core/tensor.hpp"
#include "fourway/parallel/cp/ring_schedule.hpp"
#include "fourway/schedule/exchange.hpp"

namespace fourway::cp {

/// Rank `rank` of `ranks`'s share of a sequence of `seq` tokens: chunks `rank` and
/// 2·ranks − 1 − rank of 2·ranks.
struct BalancedSplit {
  std::int64_t seq = 0;
  int ranks = 1;
  int rank = 0;

  [[nodiscard]] std::int64_t chunk() const { return seq / (2 * ranks); }
  /// Local rows: T/c.
  [[nodiscard]] std::int64_t local() const { return 2 * chunk(); }
  /// The position in the whole sequence of local row `row`.
  [[nodiscard]] std::int64_t position(std::int64_t row) const {
    const std::int64_t c = chunk();
    return row < c ? rank * c + row : (2 * ranks - 1 - rank) * c + (row - c);
  }
  /// The same split seen from rank `other`.
  [[nodiscard]] BalancedSplit of(int other) const { return {seq, ranks, other}; }
  /// (query, key) pairs the causal mask leaves this rank to score, over every block: the same
  /// on every rank, T/c · (T + 1)/2.
  [[nodiscard]] std::int64_t visible_pairs() const {
    std::int64_t n = 0;
    for (std::int64_t i = 0; i < local(); ++i) n += position(i) + 1;
    return n;
  }
};

/// The split of a context-parallel group of `ranks`; a sequence that does not cut into 2·ranks
/// chunks is a `ShapeError` naming both numbers.
inline BalancedSplit balanced_split(std::int64_t seq, int ranks, int rank) {
  check<ConfigError>(ranks >= 1 && rank >= 0 && rank < ranks, "fourway: context-parallel rank ",
                     rank, " of ", ranks, " does not exist");
  check<ShapeError>(seq >= 1 && seq % (2 * static_cast<std::int64_t>(ranks)) == 0,
                    "fourway: context parallelism over ", ranks, " ranks cuts each sequence into ",
                    "2 × ", ranks, " = ", 2 * ranks, " chunks (rank r holds chunks r and ",
                    2 * ranks - 1, " − r), but a sequence of ", seq, " tokens does not divide by ",
                    2 * ranks, "; use a sequence length divisible ", "by ", 2 * ranks);
  return {seq, ranks, rank};
}

/// local (B, T/c, W) = this rank's rows of full (B, T, W).
template <class E>
void take_local_rows(E* local, const E* full, std::int64_t B, std::int64_t W,
                     const BalancedSplit& s) {
  for (std::int64_t b = 0; b < B; ++b) {
    for (std::int64_t i = 0; i < s.local(); ++i) {
      const E* src = full + (b * s.seq + s.position(i)) * W;
      std::copy(src, src + W, local + (b * s.local() + i) * W);
    }
  }
}

/// full (B, T, W) rows of this rank = local (B, T/c, W); every rank's call fills the whole.
template <class E>
void put_local_rows(E* full, const E* local, std::int64_t B, std::int64_t W,
                    const BalancedSplit& s) {
  for (std::int64_t b = 0; b < B; ++b) {
    for (std::int64_t i = 0; i < s.local(); ++i) {
      const E* src = local + (b * s.local() + i) * W;
      std::copy(src, src + W, full + (b * s.seq + s.position(i)) * W);
    }
  }
}

namespace detail {

/// A pass around the ring in flight: a send on its way to rank r + 1, rank r − 1's block
/// arriving, posted as one group on the ring's communicator; `wait()` completes both. Neither
/// buffer may be written (nor the recv's read) until then, so a rank computes on the block it
/// sends while it travels.
struct RingPass {
  Work out;
  Work in;
  void wait() {
    in.wait();
    out.wait();
  }
};

/// This rank's row of the ring's exchange (parallel/cp/ring_schedule.hpp), verified for the whole
/// group before the first message and read in order: every pass takes its peers, tag and size
/// from it, every compute step is where the program puts it.
class RingProgram {
 public:
  RingProgram(int ranks, int rank, RingDirection dir, std::int64_t block, std::int64_t gradient) {
    schedule::Exchange x = ring_exchange(ranks, dir, block, gradient);
    schedule::verify(x, schedule::Blocking::rendezvous);
    row_ = std::move(x.moves[static_cast<std::size_t>(rank)]);
  }

  /// Posts the program's next group, a send of `send` and a recv into `recv` of `n` elements.
  template <class T, communicator Comm>
  RingPass post(Comm& comm, const T* send, T* recv, std::int64_t n) {
    const schedule::Transfer out = next();
    const schedule::Transfer in = next();
    follows(out.move == schedule::Move::send && in.move == schedule::Move::recv &&
                out.elements == n && in.elements == n,
            "a pass of ", n, " elements");
    group_start(comm);
    Work o = comm.send_async(send, n, out.peer, out.tag);
    Work i = comm.recv_async(recv, n, in.peer, in.tag);
    group_end(comm);
    return RingPass{std::move(o), std::move(i)};
  }
  /// The program's compute `step` comes next.
  void compute(int step) { follows(next() == schedule::compute_step(step), "compute ", step); }
  /// Every entry ran.
  void finish() const { follows(at_ == row_.size(), "the end of the program"); }

 private:
  schedule::Transfer next() {
    follows(at_ < row_.size(), "an entry past the end of the program");
    return row_[at_++];
  }
  template <class... Args>
  void follows(bool ok, const Args&... what) const {
    check<Error>(ok, "fourway: ring attention ran ", what...,
                 " where its verified exchange has entry ", at_, " of ", row_.size(),
                 " (an internal error: the ring and parallel/cp/ring_schedule.hpp disagree)");
  }
  std::vector<schedule::Transfer> row_;
  std::size_t at_ = 0;
};

/// The K|V columns of qkv (B, T/c, 3C) as one block (B, T/c, 2C).
template <class E>
void kv_block_of(E* kv, const E* qkv, std::int64_t rows, std::int64_t C) {
  for (std::int64_t t = 0; t < rows; ++t) {
    std::copy(qkv + t * 3 * C + C, qkv + t * 3 * C + 3 * C, kv + t * 2 * C);
  }
}

/// A call's sizes, checked against the group, and the key/value block this rank starts with
/// (its own, from qkv) beside the buffer the next block arrives in.
template <class E>
struct RingCall {
  struct Sizes {
    std::int64_t rows;  // T/c
    std::int64_t hs;
    float scale;
    int ranks;
  };
  Sizes shape;
  Tensor<E, Host> held;
  Tensor<E, Host> next;

  template <communicator Comm>
  RingCall(const Context<Host>& ctx, Comm& comm, const BalancedSplit& split, const E* qkv,
           std::int64_t B, std::int64_t C, std::int64_t NH)
      : shape{split.local(), host::detail::head_size(C, NH), 0.0f, comm.size()},
        held(Shape{B, split.local(), 2 * C}, MemTag::comm_buffers, ctx.memory()),
        next(Shape{B, split.local(), 2 * C}, MemTag::comm_buffers, ctx.memory()) {
    check<ConfigError>(split.ranks == comm.size() && split.rank == comm.rank(),
                       "fourway: ring attention's split is rank ", split.rank, " of ", split.ranks,
                       " but the context-parallel group's is rank ", comm.rank(), " of ",
                       comm.size());
    shape.scale = 1.0f / std::sqrt(static_cast<float>(shape.hs));
    const std::int64_t T = shape.rows;
    for (std::int64_t b = 0; b < B; ++b)
      kv_block_of(held.data() + b * T * 2 * C, qkv + b * T * 3 * C, T, C);
  }
};

/// The causal mask between this rank's query rows and a block's key rows: a key is visible when
/// its position in the sequence is at most the query's.
struct Masked {
  const BalancedSplit* queries;
  const BalancedSplit* keys;
  [[nodiscard]] bool visible(std::int64_t i, std::int64_t j) const {
    return keys->position(j) <= queries->position(i);
  }
};

}  // namespace detail

/// out (B, T/c, C) and lse (B, NH, T/c) of this rank's queries against every key of the
/// sequence, causal, from qkv (B, T/c, 3C) of the rank's rows; `comm` is the context-parallel
/// group (c = comm.size(), split.ranks == c, split.rank == comm.rank()).
template <floating_dtype E, communicator Comm>
void ring_attention_forward(const Context<Host>& ctx, Comm& comm, const BalancedSplit& split,
                            E* out, float* lse, const E* qkv, std::int64_t B, std::int64_t C,
                            std::int64_t NH) {
  detail::RingCall<E> call(ctx, comm, split, qkv, B, C, NH);
  const auto [T, hs, scale, c] = call.shape;
  Tensor<E, Host>& held = call.held;
  Tensor<E, Host>& next = call.next;
  detail::RingProgram program(c, split.rank, RingDirection::forward, held.numel(), 0);
  auto& sc = host::detail::flash_scratch();  // the flash kernels' per-thread buffers
  float* q = host::detail::sized(sc.q, T * hs);
  float* k = host::detail::sized(sc.k, T * hs);
  float* v = host::detail::sized(sc.v, T * hs);
  float* s = host::detail::sized(sc.s, T * T);
  // running statistics and accumulators of every (sequence, head, row), across the steps
  std::vector<float> m(static_cast<std::size_t>(B * NH * T),
                       -std::numeric_limits<float>::infinity());
  std::vector<float> l(static_cast<std::size_t>(B * NH * T), 0.0f);
  std::vector<float> acc(static_cast<std::size_t>(B * NH * T * hs), 0.0f);
  for (int step = 0; step < c; ++step) {
    const BalancedSplit keys = split.of((split.rank - step + c) % c);
    const detail::Masked mask{&split, &keys};
    // the block travels on to rank r + 1 while this rank scores its queries against it
    std::optional<detail::RingPass> pass;
    if (step + 1 < c) pass = program.post(comm, held.data(), next.data(), held.numel());
    program.compute(step);
    for (std::int64_t b = 0; b < B; ++b) {
      const E* kv = held.data() + b * T * 2 * C;
      for (std::int64_t h = 0; h < NH; ++h) {
        host::detail::head_rows_to_float(q, qkv + b * T * 3 * C + h * hs, T, hs, 3 * C);
        host::detail::head_rows_to_float(k, kv + h * hs, T, hs, 2 * C);
        host::detail::head_rows_to_float(v, kv + C + h * hs, T, hs, 2 * C);
        host::gemm(ctx, Trans::none, Trans::transpose, T, T, hs, scale, q, hs, k, hs, 0.0f, s, T);
        const std::size_t row0 = static_cast<std::size_t>((b * NH + h) * T);
        float* a = acc.data() + row0 * static_cast<std::size_t>(hs);
        for (std::int64_t i = 0; i < T; ++i) {
          float* sr = s + i * T;
          float& mi = m[row0 + static_cast<std::size_t>(i)];
          float mx = mi;
          for (std::int64_t j = 0; j < T; ++j)
            if (mask.visible(i, j)) mx = std::max(mx, sr[j]);
          if (mx == -std::numeric_limits<float>::infinity()) {  // nothing visible in this block
            std::fill(sr, sr + T, 0.0f);
            continue;
          }
          const float corr = mi == -std::numeric_limits<float>::infinity()
                                 ? 0.0f
                                 : host::detail::exp_poly(mi - mx);
          float sum = 0.0f;
          for (std::int64_t j = 0; j < T; ++j) {
            sr[j] = mask.visible(i, j) ? host::detail::exp_poly(sr[j] - mx) : 0.0f;
            sum += sr[j];
          }
          float& li = l[row0 + static_cast<std::size_t>(i)];
          li = li * corr + sum;
          mi = mx;
          for (std::int64_t d = 0; d < hs; ++d) a[i * hs + d] *= corr;
        }
        host::gemm(ctx, Trans::none, Trans::none, T, hs, T, 1.0f, s, T, v, hs, 1.0f, a, hs);
      }
    }
    if (pass) {
      pass->wait();
      std::swap(held, next);
    }
  }
  program.finish();
  for (std::int64_t b = 0; b < B; ++b) {
    for (std::int64_t h = 0; h < NH; ++h) {
      const std::size_t row0 = static_cast<std::size_t>((b * NH + h) * T);
      for (std::int64_t i = 0; i < T; ++i) {
        const std::size_t r = row0 + static_cast<std::size_t>(i);
        const float inv = 1.0f / l[r];
        E* o = out + (b * T + i) * C + h * hs;
        for (std::int64_t d = 0; d < hs; ++d) {
          o[d] =
              convert<E>(acc[r * static_cast<std::size_t>(hs) + static_cast<std::size_t>(d)] * inv);
        }
        lse[r] = m[r] + std::log(l[r]);
      }
    }
  }
}

/// dqkv (B, T/c, 3C) (`=`) of this rank's rows from dout, qkv, out and lse of
/// `ring_attention_forward` on the same group and split.
template <floating_dtype E, communicator Comm>
void ring_attention_backward(const Context<Host>& ctx, Comm& comm, const BalancedSplit& split,
                             E* dqkv, const E* dout, const E* qkv, const E* out, const float* lse,
                             std::int64_t B, std::int64_t C, std::int64_t NH) {
  detail::RingCall<E> call(ctx, comm, split, qkv, B, C, NH);
  const auto [T, hs, scale, c] = call.shape;
  Tensor<E, Host>& held = call.held;
  Tensor<E, Host>& next = call.next;
  Tensor<float, Host> grad(Shape{B, T, 2 * C}, MemTag::comm_buffers, ctx.memory());
  Tensor<float, Host> grad_next(Shape{B, T, 2 * C}, MemTag::comm_buffers, ctx.memory());
  detail::RingProgram program(c, split.rank, RingDirection::backward, held.numel(), grad.numel());
  std::fill(grad.data(), grad.data() + grad.numel(), 0.0f);
  auto& sc = host::detail::flash_scratch();  // the flash kernels' per-thread buffers
  float* q = host::detail::sized(sc.q, T * hs);
  float* k = host::detail::sized(sc.k, T * hs);
  float* v = host::detail::sized(sc.v, T * hs);
  float* dob = host::detail::sized(sc.dout, T * hs);
  float* p = host::detail::sized(sc.s, T * T);
  float* dp = host::detail::sized(sc.dp, T * T);
  std::vector<float> dk(static_cast<std::size_t>(T * hs)), dv(static_cast<std::size_t>(T * hs));
  std::vector<float> dq(static_cast<std::size_t>(B * T * C), 0.0f);
  std::vector<float> delta(static_cast<std::size_t>(B * NH * T));
  host::detail::HostBlockKernels::row_delta(ctx, delta.data(), dout, out, B, T, C, NH);
  for (int step = 0; step < c; ++step) {
    const BalancedSplit keys = split.of((split.rank - step + c) % c);
    const detail::Masked mask{&split, &keys};
    // the block travels on while this rank computes with it; its gradients, which this step
    // adds to, follow after
    std::optional<detail::RingPass> pass;
    if (step + 1 < c) pass = program.post(comm, held.data(), next.data(), held.numel());
    program.compute(step);
    for (std::int64_t b = 0; b < B; ++b) {
      const E* kv = held.data() + b * T * 2 * C;
      float* g = grad.data() + b * T * 2 * C;
      for (std::int64_t h = 0; h < NH; ++h) {
        host::detail::head_rows_to_float(q, qkv + b * T * 3 * C + h * hs, T, hs, 3 * C);
        host::detail::head_rows_to_float(k, kv + h * hs, T, hs, 2 * C);
        host::detail::head_rows_to_float(v, kv + C + h * hs, T, hs, 2 * C);
        host::detail::head_rows_to_float(dob, dout + b * T * C + h * hs, T, hs, C);
        const float* L = lse + (b * NH + h) * T;
        const float* D = delta.data() + (b * NH + h) * T;
        host::gemm(ctx, Trans::none, Trans::transpose, T, T, hs, scale, q, hs, k, hs, 0.0f, p, T);
        for (std::int64_t i = 0; i < T; ++i) {
          for (std::int64_t j = 0; j < T; ++j) {
            p[i * T + j] = mask.visible(i, j) ? host::detail::exp_poly(p[i * T + j] - L[i]) : 0.0f;
          }
        }
        // dV = Pᵀ dO;  dP = dO Vᵀ;  dS = P ∘ (dP − D), in dp
        host::gemm(ctx, Trans::transpose, Trans::none, T, hs, T, 1.0f, p, T, dob, hs, 0.0f,
                   dv.data(), hs);
        host::gemm(ctx, Trans::none, Trans::transpose, T, T, hs, 1.0f, dob, hs, v, hs, 0.0f, dp, T);
        for (std::int64_t i = 0; i < T; ++i) {
          for (std::int64_t j = 0; j < T; ++j)
            dp[i * T + j] = p[i * T + j] * (dp[i * T + j] - D[i]);
        }
        // dK = scale·dSᵀ Q;  dQ += scale·dS K
        host::gemm(ctx, Trans::transpose, Trans::none, T, hs, T, scale, dp, T, q, hs, 0.0f,
                   dk.data(), hs);
        host::gemm(ctx, Trans::none, Trans::none, T, hs, T, scale, dp, T, k, hs, 1.0f,
                   dq.data() + b * T * C + h * hs, C);
        for (std::int64_t j = 0; j < T; ++j) {
          for (std::int64_t d = 0; d < hs; ++d) {
            g[j * 2 * C + h * hs + d] += dk[static_cast<std::size_t>(j * hs + d)];
            g[j * 2 * C + C + h * hs + d] += dv[static_cast<std::size_t>(j * hs + d)];
          }
        }
      }
    }
    if (pass) {  // the block and its gradients move on together
      pass->wait();
      std::swap(held, next);
    }
    if (c > 1) {  // after the last step, this pass brings each rank its own block's gradients
      program.post(comm, grad.data(), grad_next.data(), grad.numel()).wait();
      std::swap(grad, grad_next);
    }
  }
  program.finish();
  for (std::int64_t b = 0; b < B; ++b) {
    for (std::int64_t i = 0; i < T; ++i) {
      E* dx = dqkv + (b * T + i) * 3 * C;
      const float* g = grad.data() + (b * T + i) * 2 * C;
      for (std::int64_t x = 0; x < C; ++x) {
        dx[x] = convert<E>(dq[static_cast<std::size_t>((b * T + i) * C + x)]);
      }
      for (std::int64_t x = 0; x < 2 * C; ++x) dx[C + x] = convert<E>(g[x]);
    }
  }
}

}  // namespace fourway::cp
