#pragma once
// DataPtr: the one owner of a block of bytes. Move-only (docs/design.md, "Ownership"):
// when it dies the block goes back to whatever allocator produced it.
#include <cstddef>
#include <utility>

#include "core/device.h"

namespace frugal {

class DataPtr {
 public:
  using Deleter = void (*)(void* ctx, void* ptr);

  DataPtr() = default;
  DataPtr(void* ptr, size_t size, Device device, Deleter deleter, void* ctx)
      : ptr_(ptr), size_(size), device_(device), deleter_(deleter), ctx_(ctx) {}
  DataPtr(const DataPtr&) = delete;
  DataPtr& operator=(const DataPtr&) = delete;
  DataPtr(DataPtr&& o) noexcept { swap(o); }
  DataPtr& operator=(DataPtr&& o) noexcept {
    DataPtr(std::move(o)).swap(*this);
    return *this;
  }
  ~DataPtr() {
    if (ptr_ && deleter_) deleter_(ctx_, ptr_);
  }

  void* get() const { return ptr_; }
  size_t size() const { return size_; }  // bytes usable by the caller (as requested)
  Device device() const { return device_; }
  void* context() const { return ctx_; }
  explicit operator bool() const { return ptr_ != nullptr; }

  void swap(DataPtr& o) noexcept {
    std::swap(ptr_, o.ptr_);
    std::swap(size_, o.size_);
    std::swap(device_, o.device_);
    std::swap(deleter_, o.deleter_);
    std::swap(ctx_, o.ctx_);
  }

 private:
  void* ptr_ = nullptr;
  size_t size_ = 0;
  Device device_ = kCPU;
  Deleter deleter_ = nullptr;
  void* ctx_ = nullptr;
};

}  // namespace frugal
