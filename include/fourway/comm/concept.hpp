//! The communicator concept every backend models (`LocalComm`, `MpiComm`, `NcclComm`,
//! `Counting<C>`), and `call_options_communicator`, the same with a trailing `CallOptions` on
//! every operation (the library's backends model both; a user's wrapper written against the
//! first keeps compiling).
#pragma once

#include <concepts>
#include <cstdint>
#include <string_view>

#include "fourway/comm/types.hpp"
#include "fourway/comm/work.hpp"

namespace fourway {

/// The communicator concept (checked with float; each model is templated on the element type).
template <class C>
concept communicator = std::movable<C> &&
    requires(C& c, const float* s, float* r, std::int64_t n, int i) {
  { c.rank() } -> std::convertible_to<int>;
  { c.size() } -> std::convertible_to<int>;
  { c.name() } -> std::convertible_to<std::string_view>;
  c.all_reduce(s, r, n, ReduceOp::sum);
  c.reduce_scatter(s, r, n, ReduceOp::sum);
  c.all_gather(s, r, n);
  c.broadcast(r, n, i);
  c.send(s, n, i, i);
  c.recv(r, n, i, i);
  c.barrier();
  { c.split(i, i) } -> std::same_as<C>;
  { c.all_reduce_async(s, r, n, ReduceOp::sum) } -> std::same_as<Work>;
  { c.reduce_scatter_async(s, r, n, ReduceOp::sum) } -> std::same_as<Work>;
  { c.all_gather_async(s, r, n) } -> std::same_as<Work>;
  { c.broadcast_async(r, n, i) } -> std::same_as<Work>;
  { c.send_async(s, n, i, i) } -> std::same_as<Work>;
  { c.recv_async(r, n, i, i) } -> std::same_as<Work>;
};

/// A communicator whose every operation also takes a trailing `CallOptions`.
template <class C>
concept call_options_communicator = communicator<C> &&
    requires(C& c, const float* s, float* r, std::int64_t n, int i, CallOptions o) {
  c.all_reduce(s, r, n, ReduceOp::sum, o);
  c.reduce_scatter(s, r, n, ReduceOp::sum, o);
  c.all_gather(s, r, n, o);
  c.broadcast(r, n, i, o);
  c.send(s, n, i, i, o);
  c.recv(r, n, i, i, o);
  { c.all_reduce_async(s, r, n, ReduceOp::sum, o) } -> std::same_as<Work>;
  { c.reduce_scatter_async(s, r, n, ReduceOp::sum, o) } -> std::same_as<Work>;
  { c.all_gather_async(s, r, n, o) } -> std::same_as<Work>;
  { c.broadcast_async(r, n, i, o) } -> std::same_as<Work>;
  { c.send_async(s, n, i, i, o) } -> std::same_as<Work>;
  { c.recv_async(r, n, i, i, o) } -> std::same_as<Work>;
};

}  // namespace fourway
