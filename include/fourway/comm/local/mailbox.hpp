//! LocalWorld's point-to-point mailbox: `send` is eager (the message is copied into the group's
//! (src, dst, tag) mailbox, from a pool of reused buffers, and the call returns); `recv` waits for
//! the oldest message of its mailbox, checks dtype, count and memory kind, and copies it out.
//! In the strict world a send is a rendezvous, as on NCCL: after posting its message it waits
//! until a recv has taken it (`send_taken`); inside a group the sends are posted first and
//! waited for after the group's recvs (comm/local/comm.hpp).
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <mutex>
#include <sstream>
#include <string>
#include <string_view>
#include <tuple>
#include <utility>
#include <vector>

#include "fourway/comm/local/device.hpp"

// In the mode's inline namespace (config.hpp) like every part of LocalWorld: host and CUDA
// units of one program link distinct symbols, never two bodies under one name.
namespace fourway::detail {
FOURWAY_BEGIN_MODE_NAMESPACE

/// The point-to-point part of LocalComm (see the file comment).
class LocalMailbox : protected LocalDevice {
 protected:
  using LocalDevice::LocalDevice;

  /// Where a posted message sits: its mailbox and its place in the mailbox's FIFO (1-based).
  struct Posted {
    std::tuple<int, int, int> box;
    std::uint64_t place = 0;
    std::string what;  // the send, for messages
  };

  /// The mailbox of messages from `src` to `dst` under `tag`; in the strict world one per pair,
  /// whatever the tag: NCCL matches point-to-point by posting order only.
  [[nodiscard]] std::tuple<int, int, int> mailbox(int src, int dst, int tag) const {
    return {src, dst, g().world->strict ? 0 : tag};
  }

  /// Eager in a lenient world; in the strict world waits until the recv took the message.
  template <class T>
  void send_now(const T* buf, std::int64_t count, int peer, int tag) {
    const Posted p = send_post(buf, count, peer, tag);
    if (g().world->strict) send_taken(p);
  }

  /// Waits until the message `p` was taken by its recv (the strict world's rendezvous).
  void send_taken(const Posted& p) {
    auto& group = g();
    wait_until(
        false, [&] { return group.taken[p.box] >= p.place; },
        [&] { return std::vector<int>{std::get<1>(p.box)}; },
        [&] { return p.what + " (waiting for the matching recv: NCCL's sends are rendezvous)"; });
  }

  /// Copies the message into its mailbox and returns where it sits.
  template <class T>
  Posted send_post(const T* buf, std::int64_t count, int peer, int tag) {
    check_count(count, CommOp::send);
    check_rank(peer, "peer", CommOp::send);
    check<ConfigError>(tag >= 0, "fourway: send in ", g().header(), " got tag ", tag,
                       "; tags are >= 0");
    auto& group = g();
    if (group.world->aborted.load()) {
      throw_aborted(detail::cat(group.header(), ", send (", dtype_name(dtype_v<T>), ", count ",
                                count, ") on ", group.who(s_->rank), " to ", group.who(peer),
                                " with tag ", tag));
    }
    detail::LocalMessage m{dtype_v<T>, count, tag, ++s_->sends, {}};
#if defined(FOURWAY_CUDA_COMPILATION)
    if (detail::is_device_pointer(buf)) {
      device_stage(m, buf, count);
    } else
#endif
    {
      const auto bytes = static_cast<std::size_t>(count) * sizeof(T);
      if (bytes > 0) {
        {
          std::lock_guard lock(group.world->mu);
          for (auto& [p, cap] : group.pool) {
            if (cap >= bytes && cap <= 2 * bytes + 4096) {
              m.data = std::move(p);
              m.capacity = cap;
              std::swap(p, group.pool.back().first);
              std::swap(cap, group.pool.back().second);
              group.pool.pop_back();
              break;
            }
          }
        }
        if (!m.data) {
          m.data.reset(new std::byte[bytes]);
          m.capacity = bytes;
        }
        std::memcpy(m.data.get(), buf, bytes);
      }
    }
    Posted posted{mailbox(s_->rank, peer, tag), 0, {}};
    if (group.world->strict) {
      posted.what = detail::cat(group.header(), ", send #", m.number, " (", dtype_name(dtype_v<T>),
                                ", count ", count, ") on ", group.who(s_->rank), " to ",
                                group.who(peer), " with tag ", tag);
    }
    {
      std::lock_guard lock(group.world->mu);
      group.mail[posted.box].push_back(std::move(m));
      posted.place = ++group.posted[posted.box];
      group.world->notify_changed();
    }
    if (peer != s_->rank)
      add_traffic(CommOp::send, 0, count * static_cast<std::int64_t>(sizeof(T)));
    return posted;
  }

  template <class T>
  void recv_now(T* buf, std::int64_t count, int peer, int tag) {
    check_count(count, CommOp::recv);
    check_rank(peer, "peer", CommOp::recv);
    auto& group = g();
    const auto number = ++s_->recvs;
    const std::tuple<int, int, int> box = mailbox(peer, s_->rank, tag);
    auto ready = [&] {
      auto it = group.mail.find(box);
      return it != group.mail.end() && !it->second.empty();
    };
    auto what = [&] {
      std::ostringstream os;
      os << group.header() << ", recv #" << number << " (" << dtype_name(dtype_v<T>) << ", count "
         << count << ") on " << group.who(s_->rank) << " from " << group.who(peer) << " with tag "
         << tag;
      std::vector<int> other_tags;
      for (const auto& [k, q] : group.mail) {
        if (std::get<0>(k) == peer && std::get<1>(k) == s_->rank && !q.empty()) {
          other_tags.push_back(std::get<2>(k));
        }
      }
      if (!other_tags.empty()) {
        os << " (messages from that rank are waiting under tags";
        for (int t : other_tags) os << " " << t;
        os << ")";
      }
      return os.str();
    };
    wait_until(
        false, ready, [&] { return std::vector<int>{peer}; }, what);
    detail::LocalMessage m;
    std::string context;
    int tag_mismatch = -1;  // the strict world: the next message of the pair has another tag
    {
      std::lock_guard lock(group.world->mu);  // wait_until returned with the lock released
      auto& q = group.mail[box];
      m = std::move(q.front());
      q.pop_front();
      ++group.taken[box];
      if (group.world->strict) group.world->notify_changed();
      if (m.tag != tag && context.empty()) {
        context = what();
        tag_mismatch = m.tag;
      }
      if (m.dtype != dtype_v<T> || m.count != count) context = what();
    }
#if defined(FOURWAY_CUDA_COMPILATION)
    const bool device = detail::is_device_pointer(buf) || (count == 0 && m.event != nullptr);
    if (m.event != nullptr && (!device || !context.empty())) drop_device_message(m);
    if (context.empty() && device != (m.event != nullptr)) {
      std::lock_guard lock(group.world->mu);
      throw CommMismatch(detail::cat("fourway: CommMismatch in ", what(), ": the matching send #",
                                     m.number, " carries ", m.event ? "device" : "host",
                                     " memory but this recv writes ", device ? "device" : "host",
                                     " memory"));
    }
#endif
    if (tag_mismatch >= 0) {
      throw CommMismatch(detail::cat(
          "fourway: CommMismatch in ", context, ": the next message from that rank is send #",
          m.number, " under tag ", tag_mismatch,
          "; NCCL matches point-to-point by posting order, not tag, so it would land here. Post "
          "the sends and the recvs between two ranks in the same order on both"));
    }
    if (m.dtype != dtype_v<T> || m.count != count) {
      throw CommMismatch(detail::cat("fourway: CommMismatch in ", context, ": the matching send #",
                                     m.number, " carries ", dtype_name(m.dtype), " count ", m.count,
                                     " but this recv expects ", dtype_name(dtype_v<T>), " count ",
                                     count));
    }
    if (peer != s_->rank)
      add_traffic(CommOp::recv, count * static_cast<std::int64_t>(sizeof(T)), 0);
#if defined(FOURWAY_CUDA_COMPILATION)
    if (device) return device_unstage(m, buf, count);
#endif
    if (count > 0) std::memcpy(buf, m.data.get(), static_cast<std::size_t>(count) * sizeof(T));
    if (m.data) {
      std::lock_guard lock(group.world->mu);
      if (group.pool.size() < detail::LocalGroup::pool_max) {
        group.pool.emplace_back(std::move(m.data), m.capacity);
      }
    }
  }
};

FOURWAY_END_MODE_NAMESPACE
}  // namespace fourway::detail
