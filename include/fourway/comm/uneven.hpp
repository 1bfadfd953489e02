//! Totals that do not divide by the group size: `shard_count` (the even share, or a ShapeError
//! naming both fixes), `padded_count`, and `all_gather_v` / `reduce_scatter_v`, which move a
//! different count per rank through one padded collective (host memory).
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <string_view>
#include <vector>

#include "fourway/comm/concept.hpp"
#include "fourway/core/error.hpp"

namespace fourway {

/// `total / size`, or a ShapeError naming the numbers and the fixes when it does not divide.
inline std::int64_t shard_count(std::int64_t total, int size, std::string_view what = "count") {
  check<ShapeError>(size > 0 && total >= 0, "fourway: cannot shard ", what, " ", total, " over ",
                    size, " ranks");
  check<ShapeError>(total % size == 0, "fourway: ", what, " ", total,
                    " does not divide by the group size ", size, " (remainder ", total % size,
                    "); pad it to ", (total + size - 1) / size * size,
                    " with fw::padded_count, or use fw::all_gather_v / fw::reduce_scatter_v");
  return total / size;
}

/// The smallest multiple of `size` that is >= `total`.
constexpr std::int64_t padded_count(std::int64_t total, int size) {
  return (total + size - 1) / size * size;
}

namespace detail {
/// The largest of one count per rank of `comm` (the padded block of a v-form), or a ShapeError
/// when there is not one count per rank or a count is negative.
template <communicator C>
std::int64_t checked_max_count(C& comm, const std::vector<std::int64_t>& counts,
                               std::string_view op) {
  const int n = comm.size();
  check<ShapeError>(static_cast<int>(counts.size()) == n, "fourway: ", op, " in group '",
                    comm.name(), "' got ", counts.size(), " counts for ", n, " ranks");
  std::int64_t max_count = 0;
  for (auto c : counts) {
    check<ShapeError>(c >= 0, "fourway: ", op, " count ", c, " is negative");
    max_count = std::max(max_count, c);
  }
  return max_count;
}
}  // namespace detail

/// all_gather with a different count per rank (host memory): `recv` receives the ranks' blocks
/// back to back, `counts[q]` elements from rank q. Runs as one padded all_gather.
template <communicator C, comm_element T>
void all_gather_v(C& comm, const T* send, T* recv, const std::vector<std::int64_t>& counts) {
  const int n = comm.size();
  const std::int64_t max_count = detail::checked_max_count(comm, counts, "all_gather_v");
  std::vector<T> padded_send(static_cast<std::size_t>(max_count));
  std::vector<T> gathered(static_cast<std::size_t>(max_count * n));
  const auto mine = counts[static_cast<std::size_t>(comm.rank())];
  if (mine > 0) std::memcpy(padded_send.data(), send, static_cast<std::size_t>(mine) * sizeof(T));
  comm.all_gather(padded_send.data(), gathered.data(), max_count);
  std::int64_t at = 0;
  for (int q = 0; q < n; ++q) {
    const auto c = counts[static_cast<std::size_t>(q)];
    if (c > 0) {
      std::memcpy(recv + at, gathered.data() + q * max_count,
                  static_cast<std::size_t>(c) * sizeof(T));
    }
    at += c;
  }
}

/// reduce_scatter with a different count per rank (host memory): `send` holds sum(counts)
/// elements, rank r receives the reduction of its block of `counts[r]` elements.
template <communicator C, comm_element T>
void reduce_scatter_v(C& comm, const T* send, T* recv, const std::vector<std::int64_t>& counts,
                      ReduceOp op) {
  const int n = comm.size();
  const std::int64_t max_count = detail::checked_max_count(comm, counts, "reduce_scatter_v");
  std::vector<T> padded(static_cast<std::size_t>(max_count * n), T{});
  std::int64_t at = 0;
  for (int q = 0; q < n; ++q) {
    const auto c = counts[static_cast<std::size_t>(q)];
    if (c > 0) {
      std::memcpy(padded.data() + q * max_count, send + at,
                  static_cast<std::size_t>(c) * sizeof(T));
    }
    at += c;
  }
  std::vector<T> mine(static_cast<std::size_t>(max_count));
  comm.reduce_scatter(padded.data(), mine.data(), max_count, op);
  const auto c = counts[static_cast<std::size_t>(comm.rank())];
  if (c > 0) std::memcpy(recv, mine.data(), static_cast<std::size_t>(c) * sizeof(T));
}

}  // namespace fourway
