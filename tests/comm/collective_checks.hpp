// Checks every operation of a communicator against a reference computed independently: each
// rank's data comes from a generator seeded by (seed, rank), so every rank can regenerate every
// peer's data and compute the expected result in double precision with one loop over ranks.
// Used by the LocalWorld and the MPI tests (same checks, different backends).
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <type_traits>
#include <vector>

#include "fourway/comm/communicator.hpp"

namespace comm_test {
namespace fw = fourway;

template <class T>
std::string type_name() {
  if constexpr (std::is_same_v<T, float>) return "fp32";
  if constexpr (std::is_same_v<T, fw::bf16>) return "bf16";
  if constexpr (std::is_same_v<T, fw::fp16>) return "fp16";
  if constexpr (std::is_same_v<T, double>) return "fp64";
  if constexpr (std::is_same_v<T, std::int32_t>) return "int32";
  if constexpr (std::is_same_v<T, std::int64_t>) return "int64";
  return "?";
}

template <class T>
double to_double(T v) {
  if constexpr (std::is_integral_v<T> || std::is_same_v<T, double>) {
    return static_cast<double>(v);
  } else {
    return static_cast<double>(static_cast<float>(v));
  }
}

/// Rank `rank`'s data: floats uniform in [-2, 2) rounded to T, integers in [-1000, 1000].
template <class T>
std::vector<T> rank_data(std::uint64_t seed, int rank, std::int64_t n) {
  std::mt19937_64 gen(seed * 1000003u + static_cast<std::uint64_t>(rank) * 7919u + 17u);
  std::vector<T> v(static_cast<std::size_t>(n));
  if constexpr (std::is_integral_v<T>) {
    std::uniform_int_distribution<int> d(-1000, 1000);
    for (auto& x : v) x = static_cast<T>(d(gen));
  } else {
    std::uniform_real_distribution<double> d(-2.0, 2.0);
    for (auto& x : v) {
      if constexpr (std::is_same_v<T, double>) {
        x = d(gen);
      } else {
        x = T(static_cast<float>(d(gen)));
      }
    }
  }
  return v;
}

/// Relative rounding of one result element: one unit in the last place of T (the result is the
/// fp32 (fp64 for double) accumulation rounded once to T, so half an ulp plus accumulation
/// error; a full ulp leaves the margin).
template <class T>
double ulp_rel() {
  if constexpr (std::is_same_v<T, fw::bf16>) return 1.0 / 128.0;
  if constexpr (std::is_same_v<T, fw::fp16>) return 1.0 / 1024.0;
  if constexpr (std::is_same_v<T, double>) return 1e-15;
  return 1.0 / (1 << 23);
}

/// Expected reduction of element i over all ranks' data, in double; `abs_sum` gets sum |x|.
template <class T>
double reference(const std::vector<std::vector<T>>& data, std::size_t i, fw::ReduceOp op,
                 double* abs_sum) {
  const int n = static_cast<int>(data.size());
  double acc = to_double(data[0][i]);
  double a = std::fabs(acc);
  for (int q = 1; q < n; ++q) {
    const double v = to_double(data[static_cast<std::size_t>(q)][i]);
    a += std::fabs(v);
    switch (op) {
      case fw::ReduceOp::sum:
      case fw::ReduceOp::avg: acc += v; break;
      case fw::ReduceOp::max: acc = std::max(acc, v); break;
      case fw::ReduceOp::min: acc = std::min(acc, v); break;
    }
  }
  if (op == fw::ReduceOp::avg) {
    if constexpr (std::is_integral_v<T>) {
      acc = static_cast<double>(static_cast<std::int64_t>(acc) / n);
    } else {
      acc /= n;
    }
  }
  *abs_sum = a;
  return acc;
}

/// Asserts got == expected within the rounding of T (exact for integers, max and min).
template <class T>
void expect_close(T got, double expected, double abs_sum, fw::ReduceOp op,
                  const std::string& where) {
  const double g = to_double(got);
  if (std::is_integral_v<T> || op == fw::ReduceOp::max || op == fw::ReduceOp::min) {
    ASSERT_EQ(g, expected) << where;
  } else {
    // fp32 accumulation over at most 8 ranks adds <= 8 * 2^-24 * sum|x| (2^-53 for double).
    const double acc_err = (std::is_same_v<T, double> ? 1e-15 : 1e-6) * abs_sum;
    const double tol = ulp_rel<T>() * std::fabs(expected) + acc_err + 1e-12;
    ASSERT_NEAR(g, expected, tol) << where;
  }
}

inline const fw::ReduceOp all_reduce_ops[] = {fw::ReduceOp::sum, fw::ReduceOp::avg,
                                              fw::ReduceOp::max, fw::ReduceOp::min};

/// Runs every operation of `comm` on data of type T and checks each against the reference.
/// Counts are odd and include counts smaller than the group (empty slices).
template <class T, class C>
void check_every_op(C& comm, std::uint64_t seed, bool point_to_point = true) {
  const int n = comm.size();
  const int me = comm.rank();
  const std::string tag =
      comm_test::type_name<T>() + " on " + std::to_string(n) + " ranks, rank " + std::to_string(me);
  for (std::int64_t count : {std::int64_t{0}, std::int64_t{3}, std::int64_t{1031}}) {
    // all_reduce, out of place and in place
    for (fw::ReduceOp op : all_reduce_ops) {
      std::vector<std::vector<T>> all;
      for (int q = 0; q < n; ++q)
        all.push_back(rank_data<T>(seed + static_cast<int>(op), q, count));
      std::vector<T> out(static_cast<std::size_t>(count));
      comm.all_reduce(all[static_cast<std::size_t>(me)].data(), out.data(), count, op);
      std::vector<T> inplace = all[static_cast<std::size_t>(me)];
      comm.all_reduce(inplace.data(), inplace.data(), count, op);
      for (std::size_t i = 0; i < out.size(); ++i) {
        double abs_sum = 0;
        const double e = reference(all, i, op, &abs_sum);
        const std::string where = "all_reduce " + std::string(fw::reduce_op_name(op)) + " " + tag +
                                  " count " + std::to_string(count) + " i " + std::to_string(i);
        expect_close(out[i], e, abs_sum, op, where);
        ASSERT_EQ(to_double(inplace[i]), to_double(out[i])) << "in place " << where;
      }
    }
    // reduce_scatter: send holds count * n, rank me receives block me
    for (fw::ReduceOp op : all_reduce_ops) {
      std::vector<std::vector<T>> all;
      for (int q = 0; q < n; ++q)
        all.push_back(rank_data<T>(seed + 10 + static_cast<int>(op), q, count * n));
      std::vector<T> out(static_cast<std::size_t>(count));
      comm.reduce_scatter(all[static_cast<std::size_t>(me)].data(), out.data(), count, op);
      for (std::int64_t i = 0; i < count; ++i) {
        double abs_sum = 0;
        const double e = reference(all, static_cast<std::size_t>(me * count + i), op, &abs_sum);
        expect_close(out[static_cast<std::size_t>(i)], e, abs_sum, op,
                     "reduce_scatter " + std::string(fw::reduce_op_name(op)) + " " + tag);
      }
    }
    // all_gather
    {
      std::vector<std::vector<T>> all;
      for (int q = 0; q < n; ++q) all.push_back(rank_data<T>(seed + 20, q, count));
      std::vector<T> out(static_cast<std::size_t>(count * n));
      comm.all_gather(all[static_cast<std::size_t>(me)].data(), out.data(), count);
      for (int q = 0; q < n; ++q) {
        for (std::int64_t i = 0; i < count; ++i) {
          ASSERT_EQ(to_double(out[static_cast<std::size_t>(q * count + i)]),
                    to_double(all[static_cast<std::size_t>(q)][static_cast<std::size_t>(i)]))
              << "all_gather " << tag;
        }
      }
    }
    // broadcast from every root
    for (int root = 0; root < n; ++root) {
      auto expect = rank_data<T>(seed + 30, root, count);
      auto buf = rank_data<T>(seed + 30, me, count);
      comm.broadcast(buf.data(), count, root);
      for (std::int64_t i = 0; i < count; ++i) {
        ASSERT_EQ(to_double(buf[static_cast<std::size_t>(i)]),
                  to_double(expect[static_cast<std::size_t>(i)]))
            << "broadcast root " << root << " " << tag;
      }
    }
    // send/recv around the ring, with two tags in flight, received in the opposite order
    if (point_to_point) {
      const int next = (me + 1) % n;
      const int prev = (me + n - 1) % n;
      auto a = rank_data<T>(seed + 40, me, count);
      auto b = rank_data<T>(seed + 41, me, count);
      // async sends: a blocking send may wait for its matching recv (MPI above the eager limit)
      fw::Work sa = comm.send_async(a.data(), count, next, 1);
      fw::Work sb = comm.send_async(b.data(), count, next, 2);
      std::vector<T> rb(static_cast<std::size_t>(count)), ra(static_cast<std::size_t>(count));
      comm.recv(rb.data(), count, prev, 2);
      comm.recv(ra.data(), count, prev, 1);
      sa.wait();
      sb.wait();
      auto ea = rank_data<T>(seed + 40, prev, count);
      auto eb = rank_data<T>(seed + 41, prev, count);
      for (std::int64_t i = 0; i < count; ++i) {
        const auto k = static_cast<std::size_t>(i);
        ASSERT_EQ(to_double(ra[k]), to_double(ea[k])) << "send/recv tag 1 " << tag;
        ASSERT_EQ(to_double(rb[k]), to_double(eb[k])) << "send/recv tag 2 " << tag;
      }
    }
    comm.barrier();
  }
}

}  // namespace comm_test
