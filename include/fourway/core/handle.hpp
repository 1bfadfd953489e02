//! `Handle<Traits>`: a native handle (a CUDA stream, ...) that is either *owned* — destroyed
//! exactly once, by whoever holds it last — or *borrowed* — someone else's, never destroyed here.
//!
//! Ownership is part of the value, not a flag kept beside it: assigning a borrowed handle to a
//! variable that owns one destroys the owned object first and leaves the borrowed one alone, and
//! a copy can only be made as a borrowed handle (`borrow()`). So a communicator that is told to
//! run on its caller's stream, or a child that shares its parent's, can never destroy a stream it
//! did not create (the double destroy `NcclComm::set_stream` and `split` had before).
//!
//! `Traits` provides `native_type` (default-constructible, the default being "none") and
//! `static void destroy(native_type) noexcept`.
#pragma once

#include <utility>

namespace fourway {

template <class Traits>
class Handle {
 public:
  using native_type = typename Traits::native_type;

  Handle() = default;
  /// Takes ownership of `h`: destroyed when the last holder lets go.
  static Handle owning(native_type h) { return Handle(h, true); }
  /// Refers to `h` without owning it: its owner must keep it alive while this is used.
  static Handle borrowed(native_type h) { return Handle(h, false); }

  Handle(const Handle&) = delete;
  Handle& operator=(const Handle&) = delete;
  Handle(Handle&& o) noexcept
      : h_(std::exchange(o.h_, native_type{})), owns_(std::exchange(o.owns_, false)) {}
  Handle& operator=(Handle&& o) noexcept {
    if (this != &o) {
      reset();
      h_ = std::exchange(o.h_, native_type{});
      owns_ = std::exchange(o.owns_, false);
    }
    return *this;
  }
  ~Handle() { reset(); }

  [[nodiscard]] native_type get() const { return h_; }
  [[nodiscard]] bool owns() const { return owns_; }
  [[nodiscard]] bool empty() const { return h_ == native_type{}; }
  /// A borrowed handle on the same object (valid while this one, or its owner, keeps it).
  [[nodiscard]] Handle borrow() const { return borrowed(h_); }

  /// Destroys the object if owned, and leaves the handle empty.
  void reset() noexcept {
    if (owns_ && h_ != native_type{}) Traits::destroy(h_);
    h_ = native_type{};
    owns_ = false;
  }

 private:
  Handle(native_type h, bool owns) : h_(h), owns_(owns && h != native_type{}) {}
  native_type h_{};
  bool owns_ = false;
};

}  // namespace fourway
