//! Tensor<T, Backend>: a typed, contiguous, row-major block of memory, owning or a view.
//!
//! An owning tensor allocates through its backend and reports the bytes, under its tag, to the
//! rank's `MemoryAccountant`; destroying it gives them back. A view points into memory it does
//! not own and allocates (and counts) nothing. Tensors move, they never copy implicitly; a
//! default-constructed, moved-from or reset tensor is empty: no data, shape `(0)`, not owning.
//! (Shape `()` is a scalar with one element.)
#pragma once

#include <concepts>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <string_view>
#include <utility>

#include "fourway/core/dtype.hpp"
#include "fourway/core/error.hpp"
#include "fourway/core/memory.hpp"
#include "fourway/core/shape.hpp"

namespace fourway {

/// A memory backend: `Host` or `Cuda`. Allocation is raw; the accountant is the tensor's job.
/// A device backend may also offer `allocate(bytes, device)`, which the tensor calls with the
/// device its accountant is bound to (`MemoryAccountant::device()`).
template <class B>
concept backend = requires(std::size_t n, void* p) {
  { B::allocate(n) } -> std::same_as<void*>;
  B::deallocate(p);
  { B::name } -> std::convertible_to<std::string_view>;
  { B::on_device } -> std::convertible_to<bool>;
};

/// Per-rank execution context of a backend (the rank's accountant; a stream for Cuda).
template <class B>
struct Context;

template <class T, class B>
class Tensor {
  static_assert(element_type<T>,
                "fourway: Tensor<T, B> needs an element type with a fourway::dtype_of: float, "
                "fp16, bf16, double, int32_t, int64_t, uint8_t or uint16_t");
  static_assert(backend<B>,
                "fourway: Tensor<T, B> needs a backend B such as fourway::Host or fourway::Cuda "
                "(static allocate, deallocate, name, on_device); include its backend header");

 public:
  using value_type = T;
  using backend_type = B;
  static constexpr Dtype dtype = dtype_v<T>;

  Tensor() = default;

  /// Allocates an uninitialised tensor of `shape`, counted under `tag` in `memory`. The bytes
  /// are counted first, so a rank's memory cap refuses them (`OutOfMemory`) before the backend
  /// is asked.
  Tensor(Shape shape, MemTag tag, MemoryAccountant& memory) : shape_(shape), tag_(tag) {
    const std::size_t n = bytes();
    memory.on_alloc(tag, n);
    try {
      if (n > 0) data_ = static_cast<T*>(acquire(n, memory));
    } catch (...) {
      memory.on_free(tag, n);
      throw;
    }
    memory_ = &memory;
    owning_ = true;
    if (data_ != nullptr) memory.note_block(data_, n);
  }

  /// A non-owning view of `shape` at `data`.
  static Tensor view_of(T* data, Shape shape) {
    Tensor t;
    t.data_ = data;
    t.shape_ = shape;
    return t;
  }

  Tensor(const Tensor&) = delete;
  Tensor& operator=(const Tensor&) = delete;
  Tensor(Tensor&& o) noexcept { swap(o); }
  Tensor& operator=(Tensor&& o) noexcept {
    if (this != &o) {
      release();
      swap(o);
    }
    return *this;
  }
  ~Tensor() { release(); }

  /// A view of the whole tensor (same data, same shape).
  [[nodiscard]] Tensor view() const { return view_of(data_, shape_); }
  /// A view with another shape of the same number of elements.
  [[nodiscard]] Tensor view(Shape shape) const {
    check<ShapeError>(shape.numel() == numel(), "fourway: cannot view ", shape_.str(), " (",
                      numel(), " elements) as ", shape.str(), " (", shape.numel(), " elements)");
    return view_of(data_, shape);
  }
  /// A view of `shape.numel()` contiguous elements starting at element `offset`.
  [[nodiscard]] Tensor slice(std::int64_t offset, Shape shape) const {
    check<ShapeError>(offset >= 0 && offset + shape.numel() <= numel(), "fourway: slice of ",
                      shape.numel(), " elements at offset ", offset, " exceeds tensor ",
                      shape_.str(), " of ", numel(), " elements");
    return view_of(data_ + offset, shape);
  }

  [[nodiscard]] T* data() const { return data_; }
  [[nodiscard]] const Shape& shape() const { return shape_; }
  [[nodiscard]] std::int64_t numel() const { return shape_.numel(); }
  [[nodiscard]] std::size_t bytes() const { return static_cast<std::size_t>(numel()) * sizeof(T); }
  [[nodiscard]] bool owning() const { return owning_; }
  [[nodiscard]] MemTag tag() const { return tag_; }
  [[nodiscard]] bool empty() const { return numel() == 0; }

  /// Element access, host tensors only.
  T& operator[](std::int64_t i) const requires(!B::on_device) { return data_[i]; }

  /// Frees the memory now (an owning tensor) or forgets the view.
  void reset() { release(); }

 private:
  static constexpr BlockCache::Release release_fn = &B::deallocate;
  /// A cached block of `n` bytes, else a new one from the backend (after giving the idle blocks
  /// back to it once, if it is out of memory).
  static void* acquire(std::size_t n, MemoryAccountant& memory) {
    if (void* p = memory.reuse_block(release_fn, n, !B::on_device)) return p;
    memory.refuse_allocation_in_capture(n);
    void* p = nullptr;
    try {
      p = allocate(n, memory.device());
    } catch (const OutOfMemory&) {
      if (memory.release_cached_blocks(release_fn) == 0) throw;
      p = allocate(n, memory.device());
    }
    memory.note_backend_allocation();
    return p;
  }
  static void* allocate(std::size_t n, int device) {
    if constexpr (requires { B::allocate(n, device); }) {
      return B::allocate(n, device);
    } else {
      (void)device;
      return B::allocate(n);
    }
  }
  /// Gives owned memory back and leaves the tensor empty.
  void release() noexcept {
    if (owning_) {
      if (data_ != nullptr) memory_->forget_block(data_);
      if (data_ != nullptr &&
          !memory_->keep_block(release_fn, bytes(), data_, !B::on_device, tag_)) {
        B::deallocate(data_);
      }
      try {
        memory_->on_free(tag_, bytes());
      } catch (const std::exception& e) {
        detail::fatal(e.what());  // the accountant lost track: a library bug, never a user error
      }
    }
    data_ = nullptr;
    shape_ = Shape{0};
    memory_ = nullptr;
    tag_ = MemTag::workspace;
    owning_ = false;
  }
  void swap(Tensor& o) noexcept {
    std::swap(data_, o.data_);
    std::swap(shape_, o.shape_);
    std::swap(memory_, o.memory_);
    std::swap(tag_, o.tag_);
    std::swap(owning_, o.owning_);
  }

  T* data_ = nullptr;
  Shape shape_{0};
  MemoryAccountant* memory_ = nullptr;
  MemTag tag_ = MemTag::workspace;
  bool owning_ = false;
};

}  // namespace fourway
