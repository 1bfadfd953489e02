//! A strategy's optimizer state seen as runs of global tensor elements, so a checkpoint can be
//! written by one mesh and read by another.
//!
//! Two levels. What a strategy holds is a list of `OwnedRun`s in its model's own (local)
//! parameters: elements [first, first + n) of parameter `p` live at element `at` of optimizer
//! segment `segment` (fp32 master, Adam's m and v) and at `weights` in the working weights. The
//! model says where each local parameter lies in its global tensor (`StateView`: blocks of
//! strided runs; an unsplit model maps a parameter onto itself, a tensor-parallel one onto its
//! column, row or vocabulary slice, with padding that has no global counterpart) and whether
//! this rank writes it (`counts_in_norm`: a replicated parameter is written by tp rank 0 only,
//! the LM head's tied copy of `wte` not at all). `state_runs` turns owned runs into `StateRun`s:
//! `rows` runs of `count` elements of a global tensor, run i from element first + i·stride,
//! locally at `at + i·local_stride`.
//!
//! `save_state_runs` hands those values to a writer as host fp32 per part; `load_state_runs`
//! fills them from a reader (padding is set to zero) and sets the working weights from the
//! masters (`convert<T>(master)`: what AdamW leaves after every update, so a resumed run
//! continues bit for bit). Three parts per parameter, named after PyTorch's optimizer state: the
//! value (the fp32 master; the weight itself in fp32), `exp_avg`, `exp_avg_sq`.
#pragma once

#include <algorithm>
#include <array>
#include <cstdint>
#include <set>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "fourway/backend/ops.hpp"
#include "fourway/checkpoint/state_dir.hpp"
#include "fourway/core/dtype.hpp"
#include "fourway/layers/parameter.hpp"
#include "fourway/layers/state_view.hpp"
#include "fourway/optim/precision.hpp"

namespace fourway {

/// The parts saved per parameter: its fp32 value and Adam's two moments.
enum class StatePart : std::uint8_t { value, exp_avg, exp_avg_sq };
inline constexpr std::array<StatePart, 3> state_parts{StatePart::value, StatePart::exp_avg,
                                                      StatePart::exp_avg_sq};

/// The global tensor name of a part of parameter `param` ("h.0.mlp.c_fc.weight.exp_avg").
inline std::string state_tensor_name(std::string_view param, StatePart part) {
  switch (part) {
    case StatePart::value: return std::string(param);
    case StatePart::exp_avg: return std::string(param) + ".exp_avg";
    case StatePart::exp_avg_sq: return std::string(param) + ".exp_avg_sq";
  }
  return std::string(param);
}

/// One run of what a strategy holds, in its model's local parameters (see the file comment).
template <class T, class B>
struct OwnedRun {
  const Parameter<T, B>* param = nullptr;
  std::int64_t first = 0;  // element of the flattened (local) parameter
  std::int64_t count = 0;
  std::size_t segment = 0;  // of the MasterState
  std::int64_t at = 0;      // element offset inside that segment
  T* weights = nullptr;     // working weights of element `first`
  int index = 0;            // the parameter's index in the model's `visit_parameters` order
};

/// One run of a rank's state in global terms (see the file comment); `padding`: local elements
/// with no global counterpart (rows = 1), zeroed on load, never written.
template <class T, class B>
struct StateRun {
  std::string tensor;               // the parameter's global name
  std::vector<std::int64_t> shape;  // its global shape
  std::int64_t first = 0;           // global element of run 0
  std::int64_t count = 0;           // elements per run
  std::int64_t stride = 0;          // global, between runs
  std::int64_t rows = 1;
  std::size_t segment = 0;        // of the MasterState
  std::int64_t at = 0;            // segment offset of run 0
  std::int64_t local_stride = 0;  // between runs, locally
  T* weights = nullptr;           // working weights of run 0
  bool padding = false;
};

/// The global runs of `owned` (the `OwnedRun`s of a strategy over `model`): with `saving`, only
/// what this rank writes; otherwise everything it holds, padding included (first, per run).
template <class Model, class T, class B>
std::vector<StateRun<T, B>> state_runs(const Model& model, const std::vector<OwnedRun<T, B>>& owned,
                                       bool saving) {
  std::vector<StateRun<T, B>> out;
  for (const auto& o : owned) {
    const StateView view = state_view_of(model, o.index, *o.param);
    if (saving && !view.writes) continue;
    const std::int64_t lo = o.first, hi = o.first + o.count;
    const auto local_run = [&](std::int64_t from, std::int64_t n) {
      StateRun<T, B> r;
      r.tensor = o.param->name;
      r.shape = view.shape;
      r.segment = o.segment;
      r.at = o.at + (from - lo);
      r.weights = o.weights + (from - lo);
      r.count = n;
      return r;
    };
    std::int64_t covered = 0;
    for (const auto& b : view.blocks) covered += b.count * b.rows;
    if (!saving && covered < o.param->numel()) {  // zero the run first; the blocks then fill it
      StateRun<T, B> pad = local_run(lo, hi - lo);
      pad.padding = true;
      out.push_back(std::move(pad));
    }
    for (const auto& b : view.blocks) {
      // rows of the block that meet [lo, hi); full rows in a row group, partial ones alone
      std::int64_t group = -1, group_rows = 0;
      const auto flush = [&] {
        if (group_rows == 0) return;
        StateRun<T, B> r = local_run(b.local + group * b.local_stride, b.count);
        r.first = b.global + group * b.global_stride;
        r.stride = b.global_stride;
        r.rows = group_rows;
        r.local_stride = b.local_stride;
        out.push_back(std::move(r));
        group_rows = 0;
      };
      for (std::int64_t i = 0; i < b.rows; ++i) {
        const std::int64_t l = b.local + i * b.local_stride;
        const std::int64_t a = std::max(l, lo), e = std::min(l + b.count, hi);
        if (a >= e) continue;
        if (a == l && e == l + b.count) {
          if (group_rows == 0) group = i;
          ++group_rows;
          continue;
        }
        flush();
        StateRun<T, B> r = local_run(a, e - a);
        r.first = b.global + i * b.global_stride + (a - l);
        out.push_back(std::move(r));
      }
      flush();
    }
  }
  return out;
}

/// The global tensors of `runs`' parameters, three per parameter (name, shape), once each.
template <class T, class B>
std::vector<StateTensor> state_tensors(const std::vector<StateRun<T, B>>& runs) {
  std::vector<StateTensor> out;
  std::set<std::string> seen;
  for (const auto& r : runs) {
    if (r.padding || !seen.insert(r.tensor).second) continue;
    for (StatePart part : state_parts) out.push_back({state_tensor_name(r.tensor, part), r.shape});
  }
  return out;
}

/// The pieces a rank writes for `runs` (none padding): run i's parts are pieces 3i, 3i + 1,
/// 3i + 2 (in `state_parts` order).
template <class T, class B>
std::vector<StatePiece> state_pieces(const std::vector<StateRun<T, B>>& runs) {
  std::vector<StatePiece> out;
  for (const auto& r : runs) {
    for (StatePart part : state_parts) {
      out.push_back({state_tensor_name(r.tensor, part), r.first, r.count, r.stride, r.rows});
    }
  }
  return out;
}

/// The local pieces of run `r` to copy, in order: `f(i, rows, c, n, len)` for rows [i, i + rows)
/// of the run and elements [c, c + n) of each, whose local memory is the span of `len` values
/// from row i's element c. Rows are taken a few at a time, so that one span holds at most
/// `chunk` values (a row at least), and a longer row is cut into pieces of `chunk`.
template <class Run, class F>
void for_each_run_piece(const Run& r, std::int64_t chunk, F&& f) {
  const std::int64_t k = r.rows == 1 || r.count >= chunk
                             ? 1
                             : std::max<std::int64_t>(1, (chunk - r.count) / r.local_stride + 1);
  for (std::int64_t i = 0; i < r.rows; i += k) {
    const std::int64_t rows = std::min(k, r.rows - i);
    for (std::int64_t c = 0; c < r.count; c += chunk) {
      const std::int64_t n = std::min(chunk, r.count - c);
      f(i, rows, c, n, (rows - 1) * r.local_stride + n);
    }
  }
}

/// Calls `put(piece, offset, values)` (piece as in `state_pieces`, offset into it) for every run
/// and part, in pieces of at most 2^16 values (host fp32), offsets increasing per piece. The
/// runs of a strided run are copied a few at a time, as one span of local memory.
template <class T, class B, class Put>
void save_state_runs(const Context<B>& ctx, const MasterState<T, B>& state,
                     const std::vector<StateRun<T, B>>& runs, Put&& put) {
  constexpr std::int64_t chunk = 1 << 16;
  std::vector<float> span, host;
  std::vector<T> working;
  std::size_t piece = 0;
  for (const auto& r : runs) {
    for (StatePart part : state_parts) {
      std::int64_t written = 0;
      for_each_run_piece(
          r, chunk,
          [&](std::int64_t i, std::int64_t rows, std::int64_t c, std::int64_t n, std::int64_t len) {
            span.resize(static_cast<std::size_t>(len));
            const std::int64_t off = r.at + i * r.local_stride + c;
            if (part == StatePart::value && !MasterState<T, B>::keeps_master) {
              working.resize(span.size());
              Ops<B>::to_host(ctx, working.data(), r.weights + (off - r.at), len);
              for (std::size_t j = 0; j < span.size(); ++j) span[j] = convert<float>(working[j]);
            } else {
              const float* src = part == StatePart::value     ? state.master(r.segment) + off
                                 : part == StatePart::exp_avg ? state.m(r.segment) + off
                                                              : state.v(r.segment) + off;
              Ops<B>::to_host(ctx, span.data(), src, len);
            }
            if (rows == 1) {
              put(piece, written, std::span<const float>(span.data(), static_cast<std::size_t>(n)));
            } else {
              host.clear();
              for (std::int64_t j = 0; j < rows; ++j) {
                const float* row = span.data() + j * r.local_stride;
                host.insert(host.end(), row, row + n);
              }
              put(piece, written, std::span<const float>(host));
            }
            written += rows * n;
          });
      ++piece;
    }
  }
}
/// Fills every run's master, moments and working weights from `read(tensor_name, first, n,
/// float* host)` (padding runs: zeros); `state.step()` is left to the caller (`restore_step`).
/// No communication.
template <class T, class B, class Read>
void load_state_runs(const Context<B>& ctx, MasterState<T, B>& state,
                     const std::vector<StateRun<T, B>>& runs, Read&& read) {
  constexpr std::int64_t chunk = 1 << 16;
  std::vector<float> host;
  std::vector<T> working;
  for (const auto& r : runs) {
    for (StatePart part : state_parts) {
      const std::string name = state_tensor_name(r.tensor, part);
      for (std::int64_t i = 0; i < r.rows; ++i) {
        for (std::int64_t k = 0; k < r.count; k += chunk) {
          const std::int64_t n = std::min(chunk, r.count - k);
          host.resize(static_cast<std::size_t>(n));
          if (r.padding) {
            std::fill(host.begin(), host.end(), 0.0f);
          } else {
            read(name, r.first + i * r.stride + k, n, host.data());
          }
          const std::int64_t local = i * r.local_stride + k;  // from run 0's first element
          const std::int64_t off = r.at + local;
          if (part == StatePart::value) {
            if constexpr (MasterState<T, B>::keeps_master) {
              Ops<B>::from_host(ctx, state.master(r.segment) + off, host.data(), n);
            }
            working.resize(host.size());
            for (std::size_t j = 0; j < host.size(); ++j) working[j] = convert<T>(host[j]);
            Ops<B>::from_host(ctx, r.weights + local, working.data(), n);
          } else {
            float* dst = part == StatePart::exp_avg ? state.m(r.segment) : state.v(r.segment);
            Ops<B>::from_host(ctx, dst + off, host.data(), n);
          }
        }
      }
    }
  }
}

}  // namespace fourway
