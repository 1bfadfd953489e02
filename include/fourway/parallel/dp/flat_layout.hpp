//! Flat buffers, shards and padding: where every parameter element lives under DataParallel and
//! Sharded<1|2|3>.
//!
//! Parameters are laid end to end, segment by segment, in one flat buffer. A *segment* is the unit
//! of communication: a gradient bucket (DataParallel, Sharded<1>, Sharded<2>) or an FSDP unit
//! (Sharded<3>). Each segment is padded on its own to a multiple of the group size N, so that the
//! reduce-scatter and all-gather of one segment have equal parts:
//!
//!   padded(s) = ceil(numel(s) / N) * N        shard(s) = padded(s) / N
//!
//! and rank r owns elements [offset(s) + r*shard(s), offset(s) + (r+1)*shard(s)) of the flat
//! buffer. The padding (at most N-1 elements per segment) sits at the end of its segment, so it
//! always falls in the shard of the last rank(s); it is allocated, counted by the accountant like
//! any other element, kept at zero, and never visited by the optimizer (see `owned_pieces`).
//!
//!   flat:  | seg 0: p0 p1 ..... pad | seg 1: p2 p3 ...... pad | ...
//!   rank:  |  r0   |  r1   |  r2    |  r0    |  r1   |  r2    |
//!   shard buffer of rank 1 = [seg 0 part 1][seg 1 part 1]...   (shard_offset(s) + 0..shard(s))
//!
//! A parameter may straddle two ranks' shards; `owned_pieces(r)` lists the parts a rank owns.
#pragma once

#include <algorithm>
#include <cstdint>
#include <span>
#include <utility>
#include <vector>

#include "fourway/core/error.hpp"

namespace fourway {

/// `numel` rounded up to a multiple of `parts`.
constexpr std::int64_t padded_numel(std::int64_t numel, int parts) {
  return (numel + parts - 1) / parts * parts;
}
/// The elements of one part when `numel` is split into `parts` equal, padded parts.
constexpr std::int64_t shard_numel(std::int64_t numel, int parts) {
  return (numel + parts - 1) / parts;
}

/// One parameter's place in the flat buffer.
struct FlatSlot {
  int param = 0;            // the caller's index of the parameter
  std::int64_t offset = 0;  // first element in the flat buffer
  std::int64_t numel = 0;
  int segment = 0;
};

/// One segment: parameters laid contiguously, then padding up to a multiple of the group.
struct FlatSegment {
  std::int64_t offset = 0;        // first element in the flat buffer
  std::int64_t numel = 0;         // parameter elements, without padding
  std::int64_t padded = 0;        // numel rounded up to a multiple of the group size
  std::int64_t shard = 0;         // padded / group size
  std::int64_t shard_offset = 0;  // first element of this segment's part in a shard buffer
  int first_slot = 0;
  int slot_count = 0;
  [[nodiscard]] std::int64_t padding() const { return padded - numel; }
};

/// The part of one parameter held by one rank: `count` elements starting at element
/// `param_offset` of the parameter, at element `shard_offset` of the rank's shard buffer.
struct ShardPiece {
  int slot = 0;
  std::int64_t param_offset = 0;
  std::int64_t shard_offset = 0;
  std::int64_t count = 0;
};

class FlatLayout {
 public:
  /// One entry per segment in layout order; each entry lists (parameter index, numel) in layout
  /// order. `parts` is the group size N the segments are padded for (1: no padding).
  FlatLayout(const std::vector<std::vector<std::pair<int, std::int64_t>>>& segments, int parts)
      : parts_(parts) {
    check<ConfigError>(parts >= 1, "fourway: a flat layout needs a group size >= 1, got ", parts);
    std::int64_t offset = 0;
    std::int64_t shard_offset = 0;
    for (const auto& seg : segments) {
      FlatSegment s;
      s.offset = offset;
      s.first_slot = static_cast<int>(slots_.size());
      for (const auto& [param, numel] : seg) {
        check<ConfigError>(numel >= 0, "fourway: parameter ", param, " has ", numel, " elements");
        slots_.push_back(
            FlatSlot{param, offset + s.numel, numel, static_cast<int>(segments_.size())});
        s.numel += numel;
      }
      s.slot_count = static_cast<int>(slots_.size()) - s.first_slot;
      s.padded = padded_numel(s.numel, parts);
      s.shard = s.padded / parts;
      s.shard_offset = shard_offset;
      offset += s.padded;
      shard_offset += s.shard;
      numel_ += s.numel;
      segments_.push_back(s);
    }
    padded_ = offset;
    shard_ = shard_offset;
  }

  [[nodiscard]] int parts() const { return parts_; }
  /// Parameter elements, without padding (Ψ).
  [[nodiscard]] std::int64_t numel() const { return numel_; }
  /// Elements of the whole flat buffer, padding included.
  [[nodiscard]] std::int64_t padded() const { return padded_; }
  [[nodiscard]] std::int64_t padding() const { return padded_ - numel_; }
  /// Elements of one rank's shard buffer (the same on every rank): padded() / parts().
  [[nodiscard]] std::int64_t shard() const { return shard_; }
  [[nodiscard]] int segment_count() const { return static_cast<int>(segments_.size()); }
  [[nodiscard]] const FlatSegment& segment(int s) const { return segments_.at(s); }
  [[nodiscard]] std::span<const FlatSegment> segments() const { return segments_; }
  [[nodiscard]] std::span<const FlatSlot> slots() const { return slots_; }
  [[nodiscard]] std::span<const FlatSlot> slots_of(int s) const {
    const auto& seg = segments_.at(s);
    return std::span<const FlatSlot>(slots_).subspan(seg.first_slot, seg.slot_count);
  }
  /// The flat-buffer element where rank `r`'s part of segment `s` begins.
  [[nodiscard]] std::int64_t owned_begin(int s, int r) const {
    return segments_.at(s).offset + r * segments_.at(s).shard;
  }

  /// Every piece of every parameter that rank `r` owns, in flat order. Padding is in no piece.
  [[nodiscard]] std::vector<ShardPiece> owned_pieces(int r) const {
    check<ConfigError>(r >= 0 && r < parts_, "fourway: rank ", r, " outside a group of ", parts_);
    std::vector<ShardPiece> out;
    for (const auto& seg : segments_) {
      const std::int64_t lo = seg.offset + r * seg.shard;
      const std::int64_t hi = lo + seg.shard;
      for (int i = seg.first_slot; i < seg.first_slot + seg.slot_count; ++i) {
        const auto& slot = slots_[i];
        const std::int64_t a = std::max(lo, slot.offset);
        const std::int64_t b = std::min(hi, slot.offset + slot.numel);
        if (a < b) {
          out.push_back(ShardPiece{i, a - slot.offset, seg.shard_offset + (a - lo), b - a});
        }
      }
    }
    return out;
  }

 private:
  int parts_;
  std::vector<FlatSegment> segments_;
  std::vector<FlatSlot> slots_;
  std::int64_t numel_ = 0;
  std::int64_t padded_ = 0;
  std::int64_t shard_ = 0;
};

/// Gradient buckets, DDP-style: parameters in the order their gradients become final (the order
/// of backward) are packed greedily; a bucket closes before the parameter that would take it past
/// `bucket_bytes`. A parameter larger than a bucket gets a bucket of its own. `bucket_bytes` <= 0
/// means one bucket for everything (no overlap). Returns positions into `numels`.
inline std::vector<std::vector<int>> plan_buckets(std::span<const std::int64_t> numels,
                                                  std::int64_t bucket_bytes,
                                                  std::int64_t element_bytes) {
  check<ConfigError>(element_bytes > 0, "fourway: element size must be positive, got ",
                     element_bytes);
  std::vector<std::vector<int>> buckets;
  std::int64_t filled = 0;
  for (int i = 0; i < static_cast<int>(numels.size()); ++i) {
    const std::int64_t bytes = numels[i] * element_bytes;
    if (buckets.empty() || (bucket_bytes > 0 && filled > 0 && filled + bytes > bucket_bytes)) {
      buckets.emplace_back();
      filled = 0;
    }
    buckets.back().push_back(i);
    filled += bytes;
  }
  return buckets;
}

}  // namespace fourway
