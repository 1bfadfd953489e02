//! A strategy's optimizer state seen as runs of global parameter elements, so a checkpoint can be
//! written by one mesh and read by another.
//!
//! Whatever a strategy shards, what a rank holds is a list of runs: elements [first, first + n)
//! of parameter `p` live at element `at` of optimizer segment `segment` (fp32 master, Adam's m
//! and v) and at `weights` in the working weights. `save_state_runs` hands those values to a
//! writer as host fp32 per part; `load_state_runs` fills them from a reader and sets the working
//! weights from the masters (`convert<T>(master)`: what AdamW leaves after every update, so a
//! resumed run continues bit for bit). Three parts per parameter, named after PyTorch's
//! optimizer state: the value (the fp32 master; the weight itself in fp32), `exp_avg`,
//! `exp_avg_sq`.
#pragma once

#include <algorithm>
#include <array>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "fourway/backend/ops.hpp"
#include "fourway/checkpoint/state_dir.hpp"
#include "fourway/core/dtype.hpp"
#include "fourway/layers/parameter.hpp"
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

/// One run of a rank's state (see the file comment).
template <class T, class B>
struct StateRun {
  const Parameter<T, B>* param = nullptr;
  std::int64_t first = 0;  // element of the flattened parameter
  std::int64_t count = 0;
  std::size_t segment = 0;  // of the MasterState
  std::int64_t at = 0;      // element offset inside that segment
  T* weights = nullptr;     // working weights of element `first`
};

/// The pieces a rank writes for `runs`: run i's parts are pieces 3i, 3i + 1, 3i + 2 (in
/// `state_parts` order), each (global tensor, first element, count).
template <class T, class B>
std::vector<StatePiece> state_pieces(std::span<const StateRun<T, B>> runs) {
  std::vector<StatePiece> out;
  for (const auto& r : runs) {
    for (StatePart part : state_parts) {
      out.push_back({state_tensor_name(r.param->name, part), r.first, r.count});
    }
  }
  return out;
}

/// Calls `put(piece, offset, values)` (piece as in `state_pieces`, offset into it) for every run
/// and part, in pieces of at most 2^16 values (host fp32), offsets increasing per piece.
template <class T, class B, class Put>
void save_state_runs(const Context<B>& ctx, const MasterState<T, B>& state,
                     std::span<const StateRun<T, B>> runs, Put&& put) {
  constexpr std::int64_t chunk = 1 << 16;
  std::vector<float> host;
  std::vector<T> working;
  std::size_t piece = 0;
  for (const auto& r : runs) {
    for (StatePart part : state_parts) {
      for (std::int64_t k = 0; k < r.count; k += chunk) {
        const std::int64_t n = std::min(chunk, r.count - k);
        host.resize(static_cast<std::size_t>(n));
        const std::int64_t off = r.at + k;
        if (part == StatePart::value && !MasterState<T, B>::keeps_master) {
          working.resize(host.size());
          Ops<B>::to_host(ctx, working.data(), r.weights + k, n);
          for (std::size_t i = 0; i < host.size(); ++i) host[i] = convert<float>(working[i]);
        } else {
          const float* src = part == StatePart::value     ? state.master(r.segment) + off
                             : part == StatePart::exp_avg ? state.m(r.segment) + off
                                                          : state.v(r.segment) + off;
          Ops<B>::to_host(ctx, host.data(), src, n);
        }
        put(piece, k, std::span<const float>(host));
      }
      ++piece;
    }
  }
}

/// Fills every run's master, moments and working weights from `read(tensor_name, first, n,
/// float* host)`; `state.step()` is left to the caller (`restore_step`). No communication.
template <class T, class B, class Read>
void load_state_runs(const Context<B>& ctx, MasterState<T, B>& state,
                     std::span<const StateRun<T, B>> runs, Read&& read) {
  constexpr std::int64_t chunk = 1 << 16;
  std::vector<float> host;
  std::vector<T> working;
  for (const auto& r : runs) {
    for (StatePart part : state_parts) {
      const std::string name = state_tensor_name(r.param->name, part);
      for (std::int64_t k = 0; k < r.count; k += chunk) {
        const std::int64_t n = std::min(chunk, r.count - k);
        host.resize(static_cast<std::size_t>(n));
        read(name, r.first + k, n, host.data());
        const std::int64_t off = r.at + k;
        if (part == StatePart::value) {
          if constexpr (MasterState<T, B>::keeps_master) {
            Ops<B>::from_host(ctx, state.master(r.segment) + off, host.data(), n);
          }
          working.resize(host.size());
          for (std::size_t i = 0; i < host.size(); ++i) working[i] = convert<T>(host[i]);
          Ops<B>::from_host(ctx, r.weights + k, working.data(), n);
        } else {
          float* dst = part == StatePart::exp_avg ? state.m(r.segment) : state.v(r.segment);
          Ops<B>::from_host(ctx, dst + off, host.data(), n);
        }
      }
    }
  }
}

}  // namespace fourway
