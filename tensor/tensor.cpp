// Tensor metadata and views: everything here is O(ndim) and copies no data.
#include "tensor/tensor.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <limits>
#include <mutex>

#include "tensor/factory.h"
#include "tensor/memory_format.h"
#include "tensor/ops/copy.h"
#include "tensor/read_observer.h"

namespace frugal {

namespace {
// Read by every view on every thread (the threads backend's ranks included), so it is
// atomic; the autograd layer sets it once (Note [Derived tensors]).
std::atomic<DerivedHook> derived_hook{nullptr};

// A DerivedInfo of `kind` with every other field at its default (a braced {kind} would
// leave `dims` to -Wmissing-field-initializers).
DerivedInfo info_of(DerivedInfo::Kind kind) {
  DerivedInfo info;
  info.kind = kind;
  return info;
}

// The tensor methods that are ops name themselves when called on an undefined tensor
// (impl()'s own check cannot know the op).
void check_defined(const Tensor& t, const char* op) { FRUGAL_CHECK(t.defined(), op, ": undefined tensor"); }

// Note [Dims of a 0-d tensor]
// wrap_dim accepts dim 0 and -1 for a 0-d tensor, as PyTorch's maybe_wrap_dim does, so that
// sum(s, 0), squeeze(s, 0), unsqueeze(s, 0) and transpose(s, 0, -1) work on a scalar. But
// such a dim names no entry of sizes(): a method that reads sizes()[dim] after wrap_dim
// (size, stride, narrow, slice, unflatten) must refuse a 0-d tensor first, as PyTorch
// does ("dimension specified as 0 but tensor has no dimensions", "narrow() cannot be
// applied to a 0-dim tensor"); reading it was out of bounds of an empty vector, and
// slice wrote there. transpose of a 0-d tensor is the tensor itself (an empty permute).
void check_has_dims(const Tensor& t, int64_t d, const char* op) {
  FRUGAL_CHECK(t.dim() > 0, op, ": dim ", d, " of a 0-d tensor ", t.describe(),
               ", which has no dims (see Note [Dims of a 0-d tensor])");
}
}  // namespace

void set_derived_hook(DerivedHook hook) { derived_hook.store(hook, std::memory_order_release); }

namespace {
std::mutex final_version_mutex;  // two threads may save the same storage under hooks at once
std::atomic<uint64_t> storages_made{0};
}  // namespace

uint64_t Storage::next_serial() { return storages_made.fetch_add(1, std::memory_order_relaxed); }
uint64_t Storage::serial_now() { return storages_made.load(std::memory_order_relaxed); }

std::shared_ptr<const std::atomic<uint64_t>> Storage::final_version() {
  std::lock_guard<std::mutex> lock(final_version_mutex);
  if (!final_version_) final_version_ = std::make_shared<std::atomic<uint64_t>>(kLive);
  return final_version_;
}

// No lock: nothing else can reach a storage that is being destroyed.
Storage::~Storage() {
  if (final_version_) final_version_->store(version.load(std::memory_order_relaxed), std::memory_order_release);
}

Tensor Tensor::derived(Tensor out, DerivedInfo info) const {
  // A view without autograd metadata goes to the hook only when its storage had a recorded
  // write since it was taken, for the hook to refuse (Note [Views without history] in
  // autograd/ops/view_history.h); every other such view (raw ops view their inputs on every
  // call) returns here, as before.
  const bool stale_view =
      impl().is_view && impl().rewrites_at_view != impl().storage->history_rewrites.load(std::memory_order_relaxed);
  if (!impl().autograd_meta && !stale_view) return out;
  if (const DerivedHook hook = derived_hook.load(std::memory_order_acquire)) hook(*this, out, info);
  return out;
}

size_t checked_nbytes(int64_t elements, DType dtype, const char* op, const Shape& sizes) {
  int64_t nbytes;
  FRUGAL_CHECK(elements >= 0 && !__builtin_mul_overflow(elements, int64_t(element_size(dtype)), &nbytes), op, ": ",
               dtype_name(dtype), shape_str(sizes), " needs more than 2^63 - 1 bytes (", elements, " elements of ",
               element_size(dtype), " bytes)");
  return size_t(nbytes);
}

void check_same_device(const char* op, const Tensor& a, const Tensor& b) {
  FRUGAL_CHECK(a.device() == b.device(), op, ": expected all tensors on one device, got ", a.describe(), " and ",
               b.describe());
}

std::string Tensor::describe() const {
  if (!defined()) return "undefined";
  return std::string(dtype_name(dtype())) + shape_str(sizes()) + " " + device().str();
}

int64_t Tensor::size(int64_t d) const {
  if (dim() == 0) [[unlikely]]
    check_has_dims(*this, d, "size");  // Note [Dims of a 0-d tensor]
  return sizes()[size_t(wrap_dim(d, dim(), "size"))];
}
int64_t Tensor::stride(int64_t d) const {
  if (dim() == 0) [[unlikely]]
    check_has_dims(*this, d, "stride");
  return strides()[size_t(wrap_dim(d, dim(), "stride"))];
}

bool Tensor::is_contiguous() const {
  if (numel() == 0) return true;  // as in PyTorch: no element is out of place (and contiguous() of it must be)
  int64_t expected = 1;
  for (int64_t d = dim() - 1; d >= 0; --d) {
    if (sizes()[d] == 1) continue;
    if (strides()[d] != expected) return false;
    expected *= sizes()[d];
  }
  return true;
}

namespace {
thread_local detail::ReadObserver read_observer = nullptr;
}  // namespace

detail::ReadObserver detail::set_read_observer(ReadObserver observer) {
  const ReadObserver old = read_observer;
  read_observer = observer;
  return old;
}

void* Tensor::data() const {
  if (read_observer != nullptr) [[unlikely]]
    read_observer(*this);
  return static_cast<char*>(impl().storage->data.get()) + impl().offset * int64_t(element_size());
}

template <typename T>
T* Tensor::data_ptr() const {
  FRUGAL_CHECK(dtype_of<T>() == dtype(), "data_ptr: requested ", dtype_name(dtype_of<T>()), " from a ", describe(),
               " tensor");
  return static_cast<T*>(data());
}

// ---- views ---------------------------------------------------------------------

Tensor Tensor::as_strided(const Shape& sizes, const Shape& strides, int64_t offset) const {
  return derived(make_view(sizes, strides, offset, "as_strided"), info_of(DerivedInfo::Kind::AsStrided));
}

Tensor Tensor::make_view(const Shape& sizes, const Shape& strides, int64_t offset, const char* op) const {
  // sizes >= 0 and their product fits; numel * element_size fits even for an expanded
  // view, so every size_t(numel()) * element_size() in frugal is exact (Note [Size overflow]).
  checked_nbytes(numel_of(sizes, op), dtype(), op, sizes);
  const int64_t span = strided_span(sizes, strides, op);
  const int64_t capacity = int64_t(impl().storage->nbytes / element_size());
  // The elements touched, [offset, offset + span), must lie inside the storage; an empty
  // view touches none, but its offset must still make a valid pointer (data()).
  int64_t end;
  FRUGAL_CHECK(offset >= 0 && !__builtin_add_overflow(offset, span, &end) &&
                   (span == 0 ? offset <= INT64_MAX / int64_t(element_size()) : end <= capacity),
               op, ": view ", shape_str(sizes), " strides ", shape_str(strides), " offset ", offset,
               " runs past a storage of ", capacity, " elements");
  auto v = std::make_shared<TensorImpl>();
  v->storage = impl().storage;
  v->offset = offset;
  v->sizes = sizes;
  v->strides = strides;
  v->dtype = dtype();
  v->is_view = true;
  // A view of a view keeps its stamps: they describe the first view of the chain.
  v->rewrites_at_view =
      impl().is_view ? impl().rewrites_at_view : impl().storage->history_rewrites.load(std::memory_order_relaxed);
  v->no_grad_view_of_grad = impl().no_grad_view_of_grad;
  return Tensor(std::move(v));
}

namespace {
// Resolves one -1 entry so the element count matches; checks the rest.
Shape infer_size(Shape sizes, int64_t numel, const char* op, const Shape& from) {
  int64_t infer = -1;
  for (size_t i = 0; i < sizes.size(); ++i) {
    if (sizes[i] == -1) {
      FRUGAL_CHECK(infer < 0, op, ": only one dimension can be -1, got ", shape_str(sizes));
      infer = int64_t(i);
    } else {
      FRUGAL_CHECK(sizes[i] >= 0, op, ": invalid size ", sizes[i], " in ", shape_str(sizes));
    }
  }
  if (infer >= 0) {
    Shape known_sizes = sizes;
    known_sizes[size_t(infer)] = 1;
    const int64_t known = numel_of(known_sizes, op);  // checked: the known sizes may overflow
    FRUGAL_CHECK(known != 0 && numel % known == 0, op, ": shape ", shape_str(sizes), " is invalid for input of shape ",
                 shape_str(from));
    sizes[infer] = numel / known;
  }
  FRUGAL_CHECK(numel_of(sizes, op) == numel, op, ": shape ", shape_str(sizes), " is invalid for input of shape ",
               shape_str(from), " (", numel, " elements)");
  return sizes;
}

// Strides for viewing (sizes, strides) as `target` without a copy, or empty when
// impossible. Walks groups of old dims that are contiguous among themselves and
// maps each onto a run of new dims with the same element count (PyTorch computeStride).
bool view_strides(const Shape& sizes, const Shape& strides, const Shape& target, Shape& out) {
  out.assign(target.size(), 0);
  if (numel_of(sizes) == 0 || sizes.empty()) {
    out = contiguous_strides(target);
    return true;
  }
  int64_t view_d = int64_t(target.size()) - 1;
  int64_t chunk_base_stride = strides.back();
  int64_t tensor_numel = 1, view_numel = 1;
  for (int64_t d = int64_t(sizes.size()) - 1; d >= 0; --d) {
    tensor_numel *= sizes[d];
    if (d == 0 || (sizes[d - 1] != 1 && strides[d - 1] != tensor_numel * chunk_base_stride)) {
      while (view_d >= 0 && (view_numel < tensor_numel || target[view_d] == 1)) {
        out[view_d] = view_numel * chunk_base_stride;
        view_numel *= target[view_d];
        --view_d;
      }
      if (view_numel != tensor_numel) return false;
      if (d > 0) {
        chunk_base_stride = strides[d - 1];
        tensor_numel = 1;
        view_numel = 1;
      }
    }
  }
  return view_d == -1;
}
}  // namespace

Tensor Tensor::view(Shape target) const {
  check_defined(*this, "view");
  target = infer_size(std::move(target), numel(), "view", sizes());
  Shape st;
  FRUGAL_CHECK(view_strides(sizes(), strides(), target, st), "view: size ", shape_str(target),
               " is not compatible with the strides ", shape_str(strides()), " of a ", describe(),
               " tensor (use reshape, which copies when needed)");
  return derived(make_view(target, st, storage_offset(), "view"), info_of(DerivedInfo::Kind::Reshape));
}

Tensor Tensor::reshape(Shape target) const {
  check_defined(*this, "reshape");
  target = infer_size(std::move(target), numel(), "reshape", sizes());
  Shape st;
  if (view_strides(sizes(), strides(), target, st))
    return derived(make_view(target, st, storage_offset(), "reshape"), info_of(DerivedInfo::Kind::Reshape));
  return contiguous().view(target);
}

Tensor Tensor::permute(const std::vector<int64_t>& dims) const {
  check_defined(*this, "permute");
  FRUGAL_CHECK(int64_t(dims.size()) == dim(), "permute: got ", dims.size(), " dims for a tensor of ", dim(), " dims");
  Shape s(dims.size()), st(dims.size());
  std::vector<bool> seen(dims.size(), false);
  for (size_t i = 0; i < dims.size(); ++i) {
    const int64_t d = wrap_dim(dims[i], dim(), "permute");
    FRUGAL_CHECK(!seen[d], "permute: dim ", d, " repeated in ", shape_str(dims));
    seen[d] = true;
    s[i] = sizes()[d];
    st[i] = strides()[d];
  }
  DerivedInfo info = info_of(DerivedInfo::Kind::Permute);
  for (int64_t d : dims) info.dims.push_back(wrap_dim(d, dim(), "permute"));
  return derived(make_view(s, st, storage_offset(), "permute"), std::move(info));
}

Tensor Tensor::transpose(int64_t a, int64_t b) const {
  check_defined(*this, "transpose");
  a = wrap_dim(a, dim(), "transpose");
  b = wrap_dim(b, dim(), "transpose");
  if (dim() == 0) return permute({});  // Note [Dims of a 0-d tensor]
  std::vector<int64_t> perm(static_cast<size_t>(dim()));
  for (int64_t d = 0; d < dim(); ++d) perm[d] = d;
  std::swap(perm[a], perm[b]);
  return permute(perm);
}

Tensor Tensor::t() const {
  check_defined(*this, "t");
  FRUGAL_CHECK(dim() <= 2, "t: expects a tensor of <= 2 dims, got ", describe());
  return dim() < 2 ? *this : transpose(0, 1);
}

Tensor Tensor::narrow(int64_t d, int64_t start, int64_t length) const {
  check_defined(*this, "narrow");
  check_has_dims(*this, d, "narrow");  // Note [Dims of a 0-d tensor]
  d = wrap_dim(d, dim(), "narrow");
  if (start < 0) start += sizes()[d];
  FRUGAL_CHECK(start >= 0 && length >= 0 && start <= sizes()[d] && length <= sizes()[d] - start, "narrow: start ",
               start, " length ", length, " out of range for dim ", d, " of size ", sizes()[d], " (", describe(), ")");
  return slice(d, start, start + length);
}

Tensor Tensor::slice(int64_t d, int64_t start, int64_t end, int64_t step) const {
  check_defined(*this, "slice");
  check_has_dims(*this, d, "slice");
  d = wrap_dim(d, dim(), "slice");
  FRUGAL_CHECK(step > 0, "slice: step must be positive, got ", step);
  const int64_t n = sizes()[d];
  auto clamp = [n](int64_t i) { return std::clamp<int64_t>(i < 0 ? i + n : i, 0, n); };
  start = clamp(start);
  end = std::max(clamp(end), start);
  Shape s = sizes(), st = strides();
  s[d] = end > start ? (end - start - 1) / step + 1 : 0;  // not (end - start + step - 1) / step: a huge step overflows
  // step * stride fits whenever s[d] >= 2 (then step < n); for s[d] <= 1 the stride is
  // never used, and is left as it was when the product would overflow.
  if (__builtin_mul_overflow(st[d], step, &st[d])) st[d] = strides()[d];
  int64_t offset;
  FRUGAL_CHECK(!__builtin_mul_overflow(start, strides()[d], &offset) &&
                   !__builtin_add_overflow(offset, storage_offset(), &offset),
               "slice: the offset of start ", start, " at dim ", d, " of ", describe(), " overflows int64");
  DerivedInfo info = info_of(DerivedInfo::Kind::Slice);
  info.dim = d, info.start = start, info.end = end, info.step = step;
  return derived(make_view(s, st, offset, "slice"), std::move(info));
}

Tensor Tensor::select(int64_t d, int64_t index) const {
  check_defined(*this, "select");
  FRUGAL_CHECK(dim() > 0, "select: cannot select on a 0-d tensor");
  d = wrap_dim(d, dim(), "select");
  const int64_t n = sizes()[d];
  FRUGAL_CHECK(index >= -n && index < n, "select: index ", index, " out of range for dim ", d, " of size ", n, " (",
               describe(), ")");
  if (index < 0) index += n;
  Shape s = sizes(), st = strides();
  s.erase(s.begin() + d);
  st.erase(st.begin() + d);
  DerivedInfo info = info_of(DerivedInfo::Kind::Select);
  info.dim = d, info.start = index;
  return derived(make_view(s, st, storage_offset() + index * strides()[d], "select"), std::move(info));
}

Tensor Tensor::expand(const Shape& target) const {
  check_defined(*this, "expand");
  FRUGAL_CHECK(int64_t(target.size()) >= dim(), "expand: cannot expand ", describe(), " to fewer dims ",
               shape_str(target));
  const int64_t lead = int64_t(target.size()) - dim();
  Shape s(target.size()), st(target.size());
  for (int64_t i = 0; i < int64_t(target.size()); ++i) {
    if (i < lead) {
      FRUGAL_CHECK(target[i] >= 0, "expand: new leading dim ", i, " must have a size >= 0, got ", target[i]);
      s[i] = target[i];
      st[i] = 0;
      continue;
    }
    const int64_t have = sizes()[i - lead];
    const int64_t want = target[i] == -1 ? have : target[i];
    FRUGAL_CHECK(want == have || have == 1, "expand: the size of ", describe(), " at dim ", i - lead, " (", have,
                 ") must match ", shape_str(target), " or be 1");
    s[i] = want;
    st[i] = want == have ? strides()[i - lead] : 0;
  }
  return derived(make_view(s, st, storage_offset(), "expand"), info_of(DerivedInfo::Kind::Expand));
}

Tensor Tensor::squeeze() const {
  check_defined(*this, "squeeze");
  Shape s, st;
  for (int64_t d = 0; d < dim(); ++d)
    if (sizes()[d] != 1) {
      s.push_back(sizes()[d]);
      st.push_back(strides()[d]);
    }
  return derived(make_view(s, st, storage_offset(), "squeeze"), info_of(DerivedInfo::Kind::Reshape));
}

Tensor Tensor::squeeze(int64_t d) const {
  check_defined(*this, "squeeze");
  d = wrap_dim(d, dim(), "squeeze");  // 0 and -1 for a 0-d tensor, as PyTorch
  if (dim() == 0) return *this;
  if (sizes()[d] != 1) return *this;
  Shape s = sizes(), st = strides();
  s.erase(s.begin() + d);
  st.erase(st.begin() + d);
  return derived(make_view(s, st, storage_offset(), "squeeze"), info_of(DerivedInfo::Kind::Reshape));
}

Tensor Tensor::unsqueeze(int64_t d) const {
  check_defined(*this, "unsqueeze");
  d = wrap_dim(d, dim() + 1, "unsqueeze");
  Shape s = sizes(), st = strides();
  const int64_t stride = d < dim() ? sizes()[d] * strides()[d] : 1;
  s.insert(s.begin() + d, 1);
  st.insert(st.begin() + d, stride);
  return derived(make_view(s, st, storage_offset(), "unsqueeze"), info_of(DerivedInfo::Kind::Reshape));
}

Tensor Tensor::flatten(int64_t start, int64_t end) const {
  check_defined(*this, "flatten");
  // The dims are checked first, a 0-d tensor's as one of 1 dim (-1..0), as ATen's flatten:
  // nn::Flatten() (start_dim 1) refuses a 0-d input instead of making it [1].
  start = wrap_dim(start, dim(), "flatten");
  end = wrap_dim(end, dim(), "flatten");
  FRUGAL_CHECK(start <= end, "flatten: start_dim ", start, " > end_dim ", end);
  if (dim() == 0) return reshape({1});
  Shape s(sizes().begin(), sizes().begin() + start);
  int64_t n = 1;
  for (int64_t d = start; d <= end; ++d) n *= sizes()[d];
  s.push_back(n);
  s.insert(s.end(), sizes().begin() + end + 1, sizes().end());
  return reshape(s);
}

Tensor Tensor::unflatten(int64_t d, const Shape& parts) const {
  check_defined(*this, "unflatten");
  check_has_dims(*this, d, "unflatten");
  d = wrap_dim(d, dim(), "unflatten");
  // At most one -1, as in PyTorch; checked here so the error names unflatten, not view (a
  // product that overflows is left to view's check, Note [Size overflow]).
  int64_t known = 1, inferred = 0;
  bool overflow = false;
  for (int64_t p : parts) p == -1 ? void(++inferred) : void(overflow |= __builtin_mul_overflow(known, p, &known));
  const int64_t n = sizes()[size_t(d)];
  FRUGAL_CHECK(overflow || (std::all_of(parts.begin(), parts.end(), [](int64_t p) { return p >= -1; }) &&
                            inferred <= 1 && (inferred ? known > 0 && n % known == 0 : known == n)),
               "unflatten: sizes ", shape_str(parts), " do not multiply to dim ", d, " of size ", n, " of ",
               describe());
  Shape s(sizes().begin(), sizes().begin() + d);
  s.insert(s.end(), parts.begin(), parts.end());
  s.insert(s.end(), sizes().begin() + d + 1, sizes().end());
  return view(s);
}

// ---- copies ------------------------------------------------------------------

Tensor Tensor::contiguous() const {
  check_defined(*this, "contiguous");
  return is_contiguous() ? *this : clone();
}

Tensor Tensor::clone() const {
  check_defined(*this, "clone");
  Tensor out = empty(sizes(), options());
  ops::copy_into(out, *this);
  return derived(std::move(out), info_of(DerivedInfo::Kind::Convert));
}

Tensor Tensor::to(Device d) const {
  check_defined(*this, "to");
  return to(d, dtype());
}
Tensor Tensor::to(DType t) const {
  check_defined(*this, "to");
  return to(device(), t);
}

Tensor Tensor::to(Device d, DType t) const {
  check_defined(*this, "to");
  if (d == device() && t == dtype()) return *this;
  // A conversion keeps a channels-last layout (Note [Channels-last layout]).
  Tensor out = suggests_channels_last(*this) ? empty_channels_last(sizes(), {t, d}) : empty(sizes(), {t, d});
  ops::copy_into(out, *this);
  return derived(std::move(out), info_of(DerivedInfo::Kind::Convert));
}

namespace {
/// The largest finite value of T, as a double.
template <typename T>
double max_finite() {
  if constexpr (std::is_same_v<T, Half>) return 65504.0;
  else if constexpr (std::is_same_v<T, BFloat16>) return 0x1.fep127;
  else return double(std::numeric_limits<T>::max());
}
}  // namespace

// As libtorch's item<T>() (c10::checked_convert): a value T cannot hold is refused, not wrapped
// or rounded to inf (an int64 of 2^32 + 5 read as int32 would be 5). A fraction read as an
// integer is truncated; NaN and inf read as a floating T pass. The element is read from its
// device once (one sync on CUDA, where loss.item<double>() runs every step); the checks and
// the conversion then run on the host copy.
template <typename T>
T Tensor::item() const {
  FRUGAL_CHECK(numel() == 1, "item: expected a tensor with one element, got ", describe());
  if (dtype() == dtype_of<T>() || std::is_same_v<T, bool> || std::is_same_v<T, double>) return tolist<T>()[0];
  Tensor host = *this;
  if (!device().is_cpu()) {  // a raw copy, as tolist's: reading never records autograd history
    host = empty(sizes(), {dtype(), kCPU});
    ops::copy_into(host, *this);
  }
  if (dtype() != kBool) {
    const char* name = dtype_name(dtype_of<T>());
    if constexpr (std::is_integral_v<T>) {
      if (is_floating(dtype())) {
        const double v = host.tolist<double>()[0];
        FRUGAL_CHECK(std::isfinite(v) && v >= double(std::numeric_limits<T>::min()) &&
                         v < -double(std::numeric_limits<T>::min()),
                     "item: the value ", v, " of ", describe(), " cannot be converted to ", name, " without overflow");
      } else {
        const int64_t v = host.tolist<int64_t>()[0];
        FRUGAL_CHECK(v >= int64_t(std::numeric_limits<T>::min()) && v <= int64_t(std::numeric_limits<T>::max()),
                     "item: the value ", v, " of ", describe(), " cannot be converted to ", name, " without overflow");
      }
    } else {
      const double v = host.tolist<double>()[0];
      FRUGAL_CHECK(!std::isfinite(v) || std::abs(v) <= max_finite<T>(), "item: the value ", v, " of ", describe(),
                   " cannot be converted to ", name, " without overflow");
    }
  }
  return host.tolist<T>()[0];
}

template <typename T>
std::vector<T> Tensor::tolist() const {
  // A raw copy, not to(): reading values must never record autograd history.
  Tensor host = empty(sizes(), {dtype_of<T>(), kCPU});
  ops::copy_into(host, *this);
  const T* p = host.data_ptr<T>();
  return std::vector<T>(p, p + host.numel());
}

#define FRUGAL_INSTANTIATE(T)              \
  template T* Tensor::data_ptr<T>() const; \
  template T Tensor::item<T>() const;      \
  template std::vector<T> Tensor::tolist<T>() const;
FRUGAL_INSTANTIATE(float)
FRUGAL_INSTANTIATE(double)
FRUGAL_INSTANTIATE(Half)
FRUGAL_INSTANTIATE(BFloat16)
FRUGAL_INSTANTIATE(int32_t)
FRUGAL_INSTANTIATE(int64_t)
FRUGAL_INSTANTIATE(bool)
#undef FRUGAL_INSTANTIATE
template uint8_t* Tensor::data_ptr<uint8_t>() const;  // storage only: Note [Storage-only uint8]

}  // namespace frugal
