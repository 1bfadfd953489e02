//! One rank's view of a collective call (`detail::CallDesc`), the way messages show it, and the
//! cross-rank comparison that turns calls which disagree into a CommMismatch report.
#pragma once

#include <cstdint>
#include <sstream>
#include <string>
#include <vector>

#include "fourway/comm/types.hpp"
#include "fourway/core/dtype.hpp"
#include "fourway/core/error.hpp"

namespace fourway::detail {

/// One rank's view of a collective call, as compared across ranks and shown in messages.
struct CallDesc {
  CommOp op = CommOp::barrier;
  Dtype dtype = Dtype::u8;
  std::int64_t count = 0;
  ReduceOp reduce = ReduceOp::sum;
  int root = 0;
  bool device = false;  // device memory (LocalWorld on a GPU)
};

/// "all_reduce(fp32, count 12, sum)", the way messages show a call.
inline std::string describe_call(const CallDesc& c) {
  std::ostringstream os;
  os << comm_op_name(c.op);
  if (c.op == CommOp::barrier || c.op == CommOp::split) return os.str();
  os << "(" << dtype_name(c.dtype) << ", count " << c.count;
  if (c.op == CommOp::all_reduce || c.op == CommOp::reduce_scatter)
    os << ", " << reduce_op_name(c.reduce);
  if (c.op == CommOp::broadcast) os << ", root " << c.root;
  if (c.device) os << ", device memory";
  os << ")";
  return os.str();
}

/// The fields in which call `s` differs from `ref` ("op", "count", ...); empty when they agree
/// (no allocation then: the collectives' fast path checks every call with it).
inline std::vector<std::string> differing_fields(const CallDesc& s, const CallDesc& ref) {
  std::vector<std::string> fields;
  if (s.op != ref.op) fields.emplace_back("op");
  if (s.op == ref.op && s.op != CommOp::barrier && s.op != CommOp::split) {
    if (s.dtype != ref.dtype) fields.emplace_back("dtype");
    if (s.count != ref.count) fields.emplace_back("count");
    if ((s.op == CommOp::all_reduce || s.op == CommOp::reduce_scatter) && s.reduce != ref.reduce) {
      fields.emplace_back("reduce op");
    }
    if (s.op == CommOp::broadcast && s.root != ref.root) fields.emplace_back("root");
    if (s.device != ref.device && s.count > 0 && ref.count > 0) fields.emplace_back("memory kind");
  }
  return fields;
}

/// Compares every rank's call with rank 0's; empty when all agree, else "rank 0 called ...;
/// rank 2 called ... (count differ)". `who(q)` names rank q.
template <class Who>
std::string mismatch_report(const std::vector<CallDesc>& calls, Who who) {
  const auto& ref = calls.at(0);
  std::ostringstream diff;
  bool bad = false;
  for (std::size_t q = 1; q < calls.size(); ++q) {
    const auto& s = calls[q];
    const std::vector<std::string> fields = differing_fields(s, ref);
    if (fields.empty()) continue;
    bad = true;
    diff << "; " << who(static_cast<int>(q)) << " called " << describe_call(s) << " (";
    for (std::size_t i = 0; i < fields.size(); ++i) diff << (i ? ", " : "") << fields[i];
    diff << " differ)";
  }
  if (!bad) return {};
  return cat(who(0), " called ", describe_call(ref), diff.str(),
             ". Every rank of a group must make the same collective calls in the same order");
}
}  // namespace fourway::detail
