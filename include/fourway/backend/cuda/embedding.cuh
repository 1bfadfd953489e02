//! CUDA token + position embedding, twin of `host/embedding.hpp`. The checked forward
//! (`TokenGuard`) bounds-checks the ids on the device and records the first bad position in a
//! device flag, which `Embedding` reads once per backward.
//!
//! Backward is deterministic with no atomics: `dwpe[t]` sums its B rows in order; for `dwte`
//! the positions are grouped by token on the device — CUB's stable radix sort of (token,
//! position) pairs, so a token's positions stay in ascending order, the host's
//! `detail::bucket_tokens` order — and the one thread per (position, channel) that starts a
//! token's run sums the run's rows in order and adds the sum once: the same fp32 order as the
//! host, so fp32 results match the host bitwise. Nothing is read back or uploaded (the ids never
//! leave the device), so a step's backward can be captured in a CUDA graph (backend/capture.hpp);
//! llm.c groups the ids on the host instead, which costs a synchronisation per step.
#pragma once

#include <bit>
#include <cstdint>
#include <cub/device/device_radix_sort.cuh>
#include <limits>

#include "fourway/backend/cuda/common.cuh"
#include "fourway/backend/host/embedding.hpp"
#include "fourway/core/tensor.hpp"

namespace fourway::cuda {

/// out (B, T, C) = wte[tokens[b, t]] + wpe[t], with the ids checked on the device (TokenGuard,
/// host/embedding.hpp): a bad id reads nothing, its row is zero, and the smallest bad position is
/// recorded with atomicMin (when `guard.first_bad` is set).
template <floating_dtype E>
void embedding_forward(const Context<Cuda>& ctx, E* out, const std::int32_t* tokens, const E* wte,
                       const E* wpe, std::int64_t B, std::int64_t T, std::int64_t C,
                       TokenGuard guard) {
  const std::int64_t V = guard.vocab;
  auto* first_bad = reinterpret_cast<long long*>(guard.first_bad);
  detail::for_each(
      ctx, B * T * C,
      [=] __device__(std::int64_t i) {
        const std::int64_t bt = i / C;
        const std::int64_t c = i % C;
        const std::int64_t t = bt % T;
        const std::int64_t id = tokens[bt];
        if (id < 0 || id >= V) {
          detail::store(out + i, 0.0f);
          if (c == 0 && first_bad != nullptr) atomicMin(first_bad, static_cast<long long>(bt));
          return;
        }
        detail::store(out + i, detail::load(wte + id * C + c) + detail::load(wpe + t * C + c));
      },
      "embedding_forward");
}

/// out (B, T, C) = wte[tokens[b, t]] + wpe[t]; an id outside [0, 2^63) (a negative one) reads
/// nothing and gives a zero row.
template <floating_dtype E>
void embedding_forward(const Context<Cuda>& ctx, E* out, const std::int32_t* tokens, const E* wte,
                       const E* wpe, std::int64_t B, std::int64_t T, std::int64_t C) {
  embedding_forward(ctx, out, tokens, wte, wpe, B, T, C, TokenGuard{TokenGuard::none, nullptr});
}

namespace detail {
/// dw[k] += the fp32 sum, in position order, of dout's rows whose token t has k = t - start in
/// [0, count), once per k and channel (the other positions are skipped): the positions sorted by
/// k on the device (CUB's radix sort over the bits of `count`, stable), then one thread per
/// (sorted position, channel) that begins a run of equal k adds the run. No synchronisation.
template <floating_dtype E>
void add_token_runs(const Context<Cuda>& ctx, E* dw, const E* dout, const std::int32_t* tokens,
                    std::int64_t n, std::int64_t C, std::int64_t start, std::int64_t count,
                    const char* what) {
  if (n <= 0 || C <= 0 || count <= 0) return;  // count 0: a shard past the vocabulary's end
  check<ShapeError>(n < (std::int64_t{1} << 31) && count < (std::int64_t{1} << 31),
                    "fourway: ", what, ": ", n, " positions over ", count,
                    " token ids exceed the sort's 32-bit range; split the batch");
  const auto skip = static_cast<std::uint32_t>(count);  // the key of a position not in range
  const int end_bit = std::bit_width(skip);
  // int32 storage sorted as uint32 keys (every key is below 2^31)
  Tensor<std::int32_t, Cuda> keys(Shape{2 * n}, MemTag::workspace, ctx.memory());
  Tensor<std::int32_t, Cuda> positions(Shape{2 * n}, MemTag::workspace, ctx.memory());
  auto* key_in = reinterpret_cast<std::uint32_t*>(keys.data());
  std::uint32_t* key = key_in + n;
  std::int32_t* pos_in = positions.data();
  std::int32_t* pos = pos_in + n;
  for_each(
      ctx, n,
      [=] __device__(std::int64_t i) {
        const std::int64_t t = static_cast<std::int64_t>(tokens[i]) - start;
        key_in[i] = (t >= 0 && t < count) ? static_cast<std::uint32_t>(t) : skip;
        pos_in[i] = static_cast<std::int32_t>(i);
      },
      what);
  std::size_t temp_bytes = 0;
  check_cuda(cub::DeviceRadixSort::SortPairs(nullptr, temp_bytes, key_in, key, pos_in, pos,
                                             static_cast<int>(n), 0, end_bit, ctx.stream()),
             "cub::DeviceRadixSort::SortPairs (size query)");
  Tensor<std::uint8_t, Cuda> temp({static_cast<std::int64_t>(temp_bytes) + 1}, MemTag::workspace,
                                  ctx.memory());
  check_cuda(cub::DeviceRadixSort::SortPairs(temp.data(), temp_bytes, key_in, key, pos_in, pos,
                                             static_cast<int>(n), 0, end_bit, ctx.stream()),
             "cub::DeviceRadixSort::SortPairs");
  for_each(
      ctx, n * C,
      [=] __device__(std::int64_t i) {
        const std::int64_t j = i / C;
        const std::int64_t c = i % C;
        const std::uint32_t k = key[j];
        if (k == skip || (j > 0 && key[j - 1] == k)) return;  // not the start of a run
        float s = 0.0f;
        for (std::int64_t m = j; m < n && key[m] == k; ++m) {
          s += load(dout + static_cast<std::int64_t>(pos[m]) * C + c);
        }
        E* w = dw + static_cast<std::int64_t>(k) * C + c;
        store(w, load(w) + s);
      },
      what);
}
}  // namespace detail

/// dwte[tokens[b, t]] += dout[b, t]; dwpe[t] += sum_b dout[b, t].
template <floating_dtype E>
void embedding_backward(const Context<Cuda>& ctx, E* dwte, E* dwpe, const E* dout,
                        const std::int32_t* tokens, std::int64_t B, std::int64_t T,
                        std::int64_t C) {
  const std::int64_t n = B * T;
  if (n <= 0 || C <= 0) return;
  detail::for_each(
      ctx, T * C,
      [=] __device__(std::int64_t i) {
        const std::int64_t t = i / C;
        const std::int64_t c = i % C;
        float s = 0.0f;
        for (std::int64_t b = 0; b < B; ++b) s += detail::load(dout + (b * T + t) * C + c);
        detail::store(dwpe + i, detail::load(dwpe + i) + s);
      },
      "embedding_backward (wpe)");

  // every id is a row: [0, 2^31 - 1) covers int32's non-negative ids
  detail::add_token_runs(ctx, dwte, dout, tokens, n, C, 0, std::numeric_limits<std::int32_t>::max(),
                         "embedding_backward (wte)");
}

/// Vocabulary-parallel lookup, twin of `host::vocab_embed_forward`.
template <floating_dtype E>
void vocab_embed_forward(const Context<Cuda>& ctx, E* out, const std::int32_t* tokens,
                         const E* wte_shard, std::int64_t rows, std::int64_t C,
                         std::int64_t vocab_start, std::int64_t Vlocal) {
  detail::for_each(
      ctx, rows * C,
      [=] __device__(std::int64_t i) {
        const std::int64_t t = tokens[i / C] - vocab_start;
        detail::store(out + i,
                      (t >= 0 && t < Vlocal) ? detail::load(wte_shard + t * C + i % C) : 0.0f);
      },
      "vocab_embed_forward");
}

/// Vocabulary-parallel scatter-add, twin of `host::vocab_embed_backward` (same buckets, same
/// fp32 order; the ids are grouped on the device as in `embedding_backward`).
template <floating_dtype E>
void vocab_embed_backward(const Context<Cuda>& ctx, E* dwte_shard, const E* dout,
                          const std::int32_t* tokens, std::int64_t rows, std::int64_t C,
                          std::int64_t vocab_start, std::int64_t Vlocal) {
  detail::add_token_runs(ctx, dwte_shard, dout, tokens, rows, C, vocab_start, Vlocal,
                         "vocab_embed_backward");
}

}  // namespace fourway::cuda
