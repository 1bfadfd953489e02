//! An asynchronous save of a state directory (checkpoint/state_dir.hpp): the values are copied
//! into host memory this object owns, the files are written in the background, and the commit
//! is the same atomic protocol as a synchronous save.
//!
//!   snapshot(pieces) -> put(...)      the caller copies its values into the host snapshot
//!   start(...)                        collective: the create phase; a thread then writes this
//!                                     rank's file and manifest from the snapshot (no comm)
//!   poll(flags)                       collective: if every rank's write has finished, agrees the
//!                                     outcome and runs index, commit, prune (else returns)
//!   wait(flags)                       collective: joins this rank's write, then as poll
//!
//! Every collective runs on the caller's thread, in the same order on every rank, so the
//! background thread never touches a communicator: no second communicator is needed and MPI's
//! FUNNELED thread level (MpiWorld's) is enough. At most one save is in flight: `start` waits for
//! the previous one first. A failure of the background write on any rank is a `CheckpointError`
//! on every rank, raised by the `poll` or `wait` that finishes that save; nothing is committed.
//! Destroying the object with a save in flight joins the thread and commits nothing (no
//! collective in a destructor): the save stays a hidden temporary directory.
#pragma once

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "fourway/checkpoint/sharded_io.hpp"
#include "fourway/checkpoint/state_dir.hpp"
#include "fourway/core/error.hpp"

namespace fourway {

/// A rank's pieces and their values in host memory it owns (one contiguous buffer, reused from
/// one save to the next while it is large enough; never zero-filled: `put` sets every value).
class StateSnapshot {
 public:
  /// Sizes the buffer for `pieces` (their values are then set with `put`).
  void reset(std::vector<StatePiece> pieces) {
    pieces_ = std::move(pieces);
    begins_.clear();
    std::size_t n = 0;
    for (const auto& p : pieces_) {
      begins_.push_back(n);
      n += static_cast<std::size_t>(p.values());
    }
    if (n > capacity_) {
      values_.reset();
      values_ = std::unique_ptr<float[]>(new float[n]);  // default-initialised: no pass over it
      capacity_ = n;
    }
    size_ = n;
    filled_ = 0;
  }
  /// Copies `v` to elements [offset, offset + v.size()) of piece `piece`.
  void put(std::size_t piece, std::int64_t offset, std::span<const float> v) {
    check<CheckpointError>(
        piece < pieces_.size() && offset >= 0 &&
            offset + static_cast<std::int64_t>(v.size()) <= pieces_[piece].values(),
        "fourway: ", v.size(), " values at ", offset, " do not fit piece ", piece,
        " of the snapshot");
    std::copy(v.begin(), v.end(), values_.get() + begins_[piece] + offset);
    filled_ += v.size();
  }
  /// Throws unless as many values were put as the pieces hold (each is put once).
  void check_complete() const {
    check<CheckpointError>(filled_ == size_, "fourway: the state snapshot got ", filled_,
                           " of its ", size_,
                           " values; the strategy did not hand over all it owns");
  }
  [[nodiscard]] const std::vector<StatePiece>& pieces() const { return pieces_; }
  [[nodiscard]] std::uint64_t bytes() const { return size_ * sizeof(float); }
  /// Pushes every piece to `sink` (what `write_state_file` asks for) in pieces of 2^16 values,
  /// as the synchronous save does: each piece is written and checksummed while in cache.
  void write_to(StateSink& sink) const {
    constexpr std::int64_t chunk = 1 << 16;
    for (std::size_t k = 0; k < pieces_.size(); ++k) {
      const float* at = values_.get() + begins_[k];
      const std::int64_t total = pieces_[k].values();
      for (std::int64_t i = 0; i < total; i += chunk) {
        const std::int64_t n = std::min(chunk, total - i);
        sink.put(k, i, std::span<const float>(at + i, static_cast<std::size_t>(n)));
      }
    }
  }

 private:
  std::vector<StatePiece> pieces_;
  std::vector<std::size_t> begins_;
  std::unique_ptr<float[]> values_;
  std::size_t size_ = 0, capacity_ = 0, filled_ = 0;
};

/// See the file comment.
class AsyncStateSave {
 public:
  AsyncStateSave() = default;
  AsyncStateSave(const AsyncStateSave&) = delete;
  AsyncStateSave& operator=(const AsyncStateSave&) = delete;
  ~AsyncStateSave() { join(); }

  [[nodiscard]] bool in_flight() const { return in_flight_; }
  /// The step of the save in flight or last finished.
  [[nodiscard]] std::int64_t step() const { return save_.step; }
  /// Bytes of this rank's snapshot.
  [[nodiscard]] std::uint64_t snapshot_bytes() const { return snapshot_.bytes(); }
  /// Seconds the last finished background write took on this rank (measured in the thread).
  [[nodiscard]] double write_seconds() const { return write_seconds_; }
  /// Seconds since the last `start` began its background write.
  [[nodiscard]] double seconds_since_start() const {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - started_).count();
  }

  /// The snapshot to fill for the next save; refused while a save is in flight (its values are
  /// still being written: `wait` first).
  StateSnapshot& snapshot(std::vector<StatePiece> pieces) {
    check<CheckpointError>(!in_flight_, "fourway: the snapshot of step ", save_.step,
                           " is still being written; wait() for it before the next save");
    snapshot_.reset(std::move(pieces));
    return snapshot_;
  }

  /// Starts saving the snapshot as `s` (a collective of `world` ranks agreeing through `flags`):
  /// finishes a previous save first, runs the create phase here, then writes in the background.
  void start(int rank, int world, const FlagGather& flags, StateSave s) {
    (void)wait(flags);
    rank_ = rank;
    world_ = world;
    save_ = std::move(s);
    begin_state_save(rank_, flags, save_);
    error_.clear();
    written_.store(false, std::memory_order_relaxed);
    in_flight_ = true;
    started_ = std::chrono::steady_clock::now();
    writer_ = std::thread([this] {
      detail::guarded(error_, [&] {
        write_state_file(rank_, save_, snapshot_.pieces(),
                         [&](StateSink& sink) { snapshot_.write_to(sink); });
      });
      write_seconds_ =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - started_).count();
      written_.store(true, std::memory_order_release);
    });
  }

  /// A collective: when every rank's background write has finished, agrees the outcome and
  /// commits (returns the committed directory) or throws `CheckpointError` on every rank; else
  /// returns nothing and the save stays in flight. No communication when nothing is in flight.
  std::optional<std::filesystem::path> poll(const FlagGather& flags) {
    if (!in_flight_) return std::nullopt;
    const auto done = flags(written_.load(std::memory_order_acquire) ? 1 : 0);
    if (std::ranges::any_of(done, [](auto d) { return d == 0; })) return std::nullopt;
    return finish(flags);
  }

  /// A collective: waits for this rank's background write, then agrees and commits as `poll`
  /// (returns the committed directory; nothing when no save was in flight).
  std::optional<std::filesystem::path> wait(const FlagGather& flags) {
    if (!in_flight_) return std::nullopt;
    join();
    return finish(flags);
  }

 private:
  std::filesystem::path finish(const FlagGather& flags) {
    join();  // written: the thread is ending or gone
    in_flight_ = false;
    return finish_state_save(rank_, world_, flags, save_, error_);
  }
  void join() {
    if (writer_.joinable()) writer_.join();
  }

  StateSnapshot snapshot_;
  StateSave save_;
  int rank_ = 0, world_ = 1;
  bool in_flight_ = false;
  std::string error_;  // the background write's failure and duration, read after `written_`
  double write_seconds_ = 0;
  std::chrono::steady_clock::time_point started_{};
  std::atomic<bool> written_{false};
  std::thread writer_;
};

}  // namespace fourway
