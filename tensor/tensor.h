#pragma once
// Tensor: a cheap, shared handle to a strided view of a Storage.
//
// Note [Tensor handle]
// A Tensor is a shared_ptr to a TensorImpl; copying a Tensor shares it (as in
// PyTorch's C++ API). A TensorImpl is a view: storage + offset + sizes + strides
// + dtype. Views made by view/permute/slice/... share the Storage *and* its
// version counter, so an in-place write through any view bumps the version every
// saved copy is checked against (see autograd, Note [Saved tensor versions]).
// The tensor layer knows nothing of autograd: it carries `autograd_meta` as an
// opaque pointer that the autograd layer owns.
//
// Note [Derived tensors]
// Views, clone(), contiguous() and to() are Tensor methods, so a user's
// x.view(...) must stay differentiable. Each such method reports what it did
// (a DerivedInfo) to a hook that the autograd layer installs; the hook records
// the backward when `in` requires grad. Without autograd metadata on `in` the
// hook is never called, so raw tensor code pays one pointer test.
#include <atomic>
#include <cstdint>
#include <memory>
#include <ostream>
#include <string>
#include <vector>

#include "core/data_ptr.h"
#include "core/device.h"
#include "core/error.h"
#include "tensor/dtype.h"
#include "tensor/shape.h"

namespace frugal {

/// The bytes behind one or more tensors.
struct Storage {
  DataPtr data;
  size_t nbytes = 0;
  std::atomic<uint64_t> version{0};  // shared by every view of this storage
  /// Recorded in-place writes (history rebases) of tensors over this storage: a view taken
  /// before one, without a view node of its own, no longer describes its values (Note
  /// [Views without history] in autograd/ops/view_history.h).
  std::atomic<uint64_t> history_rewrites{0};
  /// Storages are numbered in the order they are made, on every thread: a checkpoint's
  /// recompute tells the tensors it made from those it found (Note [Checkpoint recompute]).
  const uint64_t serial = next_serial();
  Device device() const { return data.device(); }
  /// The serial the next storage made will have.
  static uint64_t serial_now();

  /// Where this storage's last `version` is published when it is freed, for a reader
  /// that holds it only weakly (a saved tensor a hook packed, Note [Saved tensor hooks]);
  /// kLive until then. Made on the first call, one per storage.
  std::shared_ptr<const std::atomic<uint64_t>> final_version();
  static constexpr uint64_t kLive = UINT64_MAX;

  Storage() = default;
  Storage(const Storage&) = delete;
  Storage& operator=(const Storage&) = delete;
  ~Storage();

 private:
  std::shared_ptr<std::atomic<uint64_t>> final_version_;
  static uint64_t next_serial();
};

/// The bytes of `elements` elements of `dtype` (a tensor of `sizes`), checked: throws
/// naming `op`, the shape and the dtype when they exceed 2^63 - 1 (Note [Size overflow]).
size_t checked_nbytes(int64_t elements, DType dtype, const char* op, const Shape& sizes);

/// dtype + device for factories: zeros({2, 3}, {.dtype = kFloat16, .device = cuda()}).
struct TensorOptions {
  DType dtype = kFloat32;
  Device device = kCPU;
  TensorOptions() = default;
  TensorOptions(DType t, Device d = kCPU) : dtype(t), device(d) {}
  TensorOptions(Device d) : device(d) {}
};

struct TensorImpl {
  std::shared_ptr<Storage> storage;
  int64_t offset = 0;  // in elements
  Shape sizes;
  Shape strides;  // in elements
  DType dtype = kFloat32;
  bool is_view = false;  // made by a view op (make_view) over another tensor's storage
  // A view's stamps (Note [Views without history] in autograd/ops/view_history.h): the
  // storage's history_rewrites when the first view of the chain was taken, and whether it
  // views a tensor that required grad from under NoGradGuard.
  uint64_t rewrites_at_view = 0;
  bool no_grad_view_of_grad = false;
  std::shared_ptr<void> autograd_meta;  // owned by the autograd layer
};

class Tensor;

/// How a Tensor method derived `out` from `in` (a view, or a converting copy), for the
/// autograd layer to record (see Note [Derived tensors]).
struct DerivedInfo {
  enum class Kind { Reshape, Permute, Slice, Select, Expand, Convert, AsStrided } kind;
  int64_t dim = 0, start = 0, end = 0, step = 1;  // Slice: dim/start/end/step; Select: dim/start
  std::vector<int64_t> dims;                      // Permute: the permutation
};
using DerivedHook = void (*)(const Tensor& in, const Tensor& out, const DerivedInfo& info);
/// Installed by the autograd layer; called when `in` carries autograd metadata or is a view.
void set_derived_hook(DerivedHook hook);

class Tensor {
 public:
  Tensor() = default;
  explicit Tensor(std::shared_ptr<TensorImpl> impl) : impl_(std::move(impl)) {}

  // ---- metadata --------------------------------------------------------------
  bool defined() const { return impl_ != nullptr; }
  int64_t dim() const { return int64_t(impl().sizes.size()); }
  const Shape& sizes() const { return impl().sizes; }
  const Shape& shape() const { return impl().sizes; }
  const Shape& strides() const { return impl().strides; }
  int64_t size(int64_t d) const;  // negative d counts from the end
  int64_t stride(int64_t d) const;
  int64_t numel() const { return numel_of(impl().sizes); }
  DType dtype() const { return impl().dtype; }
  Device device() const { return impl().storage->device(); }
  TensorOptions options() const { return {dtype(), device()}; }
  size_t element_size() const { return frugal::element_size(dtype()); }
  int64_t storage_offset() const { return impl().offset; }
  bool is_contiguous() const;
  bool is_cuda() const { return device().is_cuda(); }
  bool is_floating_point() const { return is_floating(dtype()); }
  /// True when both tensors view the same storage.
  bool shares_storage(const Tensor& o) const { return impl().storage == o.impl().storage; }

  /// Pointer to the first element (storage base + offset). Host-dereferenceable on CPU only.
  void* data() const;
  template <typename T>
  T* data_ptr() const;  // checks T matches dtype()

  // ---- version counter (shared by views) -------------------------------------
  uint64_t version() const { return impl().storage->version.load(std::memory_order_relaxed); }
  void bump_version() const { impl().storage->version.fetch_add(1, std::memory_order_relaxed); }

  // ---- views: no copies ------------------------------------------------------
  Tensor as_strided(const Shape& sizes, const Shape& strides, int64_t offset) const;
  Tensor view(Shape sizes) const;     // one -1 is inferred; needs compatible strides
  Tensor reshape(Shape sizes) const;  // a view when possible, else a contiguous copy
  Tensor permute(const std::vector<int64_t>& dims) const;
  Tensor transpose(int64_t a, int64_t b) const;
  Tensor t() const;  // 2-D transpose
  Tensor narrow(int64_t dim, int64_t start, int64_t length) const;
  Tensor slice(int64_t dim, int64_t start, int64_t end, int64_t step = 1) const;  // python-like bounds
  Tensor select(int64_t dim, int64_t index) const;
  Tensor operator[](int64_t index) const { return select(0, index); }
  Tensor expand(const Shape& sizes) const;  // -1 keeps a size; new leading dims allowed
  Tensor expand_as(const Tensor& other) const { return expand(other.sizes()); }
  Tensor squeeze() const;
  Tensor squeeze(int64_t dim) const;
  Tensor unsqueeze(int64_t dim) const;
  Tensor flatten(int64_t start_dim = 0, int64_t end_dim = -1) const;
  Tensor unflatten(int64_t dim, const Shape& sizes) const;

  // ---- copies and conversions ------------------------------------------------
  Tensor contiguous() const;       // self when already contiguous
  Tensor clone() const;            // always a fresh contiguous copy
  Tensor to(Device device) const;  // self when already there
  Tensor to(DType dtype) const;
  Tensor to(Device device, DType dtype) const;
  Tensor cpu() const { return to(kCPU); }
  /// Copies src into self (broadcasting src, converting dtype, across devices). Bumps the version.
  /// Differentiable (defined in autograd/ops/copy.cpp): src gets the gradient, self's old
  /// history none; tensor-layer code uses ops::copy_into instead.
  const Tensor& copy_(const Tensor& src) const;

  template <typename T>
  T item() const;  // one-element tensor to a C++ value
  template <typename T>
  std::vector<T> tolist() const;  // all elements, row-major, converted to T

  std::string str() const;  // PyTorch-style printout

  // ---- autograd: declared here for the user's convenience, defined in autograd/ ----
  // (the tensor layer never calls these; see Note [Tensor handle])
  bool requires_grad() const;
  /// Marks a leaf as needing .grad; returns *this.
  const Tensor& requires_grad_(bool on = true) const;
  /// The accumulated gradient (undefined until a backward reaches this tensor). Backward runs
  /// on several threads may sum into one leaf's .grad at once (serialized), but reading it
  /// while one runs is a race, as in PyTorch: join them first.
  Tensor grad() const;
  void set_grad(const Tensor& g) const;
  /// Backward from this tensor (a one-element tensor unless `gradient` is given), as
  /// torch.Tensor.backward. create_graph records the backward itself, so the .grad it leaves
  /// has history and can be differentiated again (it implies retain_graph); see
  /// autograd::backward for several roots.
  void backward(const Tensor& gradient = Tensor(), bool retain_graph = false, bool create_graph = false) const;
  /// The same data, cut from the graph.
  Tensor detach() const;
  bool is_leaf() const;
  /// Keep .grad for this non-leaf after backward.
  void retain_grad() const;
  /// "MatmulBackward", or "" for a leaf.
  std::string grad_fn_name() const;
  /// "float32[2, 3] cpu" for error messages.
  std::string describe() const;

  TensorImpl& impl() const {
    FRUGAL_CHECK(impl_ != nullptr, "Tensor: use of an undefined tensor");
    return *impl_;
  }
  const std::shared_ptr<TensorImpl>& impl_ptr() const { return impl_; }

 private:
  // A view of this storage; `op` names the view in errors.
  Tensor make_view(const Shape& sizes, const Shape& strides, int64_t offset, const char* op) const;
  Tensor derived(Tensor out, DerivedInfo info) const;

  std::shared_ptr<TensorImpl> impl_;
};

std::ostream& operator<<(std::ostream& os, const Tensor& t);

using TensorList = std::vector<Tensor>;

/// Throws frugal::Error naming `op` unless both tensors are on the same device.
void check_same_device(const char* op, const Tensor& a, const Tensor& b);

}  // namespace frugal
