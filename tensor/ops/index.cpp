#include "tensor/ops/index.h"

#include <algorithm>
#include <string>
#include <vector>

#include "tensor/device_dispatch.h"
#include "tensor/elementwise.h"
#include "tensor/factory.h"
#include "tensor/ops/copy.h"

namespace frugal::ops {

// Note [Index kernels as strided views]
// Every op here is one of two kernels over an ElementwiseLayout (Note [Elementwise
// layout]): a gather, out[p] = table[p + index[p] * stride], or a scatter-add,
// table[p + index[p] * stride] += src[p]. The front-end expresses each op in one
// "iteration shape" with plain strided views, no copies:
//   gather(x, d, index)         iterate over index's shape; table = x with stride 0 at d.
//   index_select(x, d, index)   iterate over the output's shape; index (K,) is seen with
//                               stride 0 everywhere but d; table = x with stride 0 at d.
//   scatter_add_(self, d, ...)  iterate over index's shape; table = self, stride 0 at d.
//   index_add / embedding_backward: iterate over src's shape, index as in index_select.
//   embedding                   index_select of the flattened indices on dim 0 of weight.
//   one_hot                     scatter-add of an expanded 1 into zeros (*shape, C).
// So coalescing, non-contiguous inputs and both index widths come for free, and a
// reader has two loops to check.
//
// Note [Index validation]
// Each index value is checked against [0, dim_size) where it is read, before it is used
// to address memory; an out-of-range one is never dereferenced. The CPU kernels record
// the first bad index of each thread (throwing inside an OpenMP region would terminate)
// and the lowest position wins; the front-end then throws a frugal::Error naming the op,
// the value, its position in the user's index tensor and the valid range. The CUDA
// kernels record a bad index in a small device buffer (atomicCAS on a flag, then value
// and position) and hand it back in IndexError::record; the front-end passes it, with a
// closure that formats the same error, to finish_index_check, which files a deferred
// check read at the next host-device synchronization (Note [Deferred index checks] in
// memory/deferred_checks.h) - an error instead of a device-side assert that poisons the
// CUDA context, without a sync per call. Which bad index CUDA reports, if there are
// several, is unspecified. Negative indices are errors, as in PyTorch's versions of these ops.
//
// Note [Scatter accumulation]
// Duplicate indices accumulate. Sums of 16-bit tensors are accumulated in a float32
// copy and rounded once at the end (Note [Half types compute in f32]); the same holds for
// embedding_backward of a float16 gradient. On CUDA the adds are atomicAdd on float,
// double, int32 or int64, so the order of a sum with duplicates (and its last bits) can vary
// from run to run; no 16-bit atomics are needed. On the CPU the scatter loop is serial,
// which makes it deterministic and free of races between duplicate indices.

namespace {

using detail::str_cat;

Shape unravel_index(int64_t i, const Shape& sizes) {
  Shape idx(sizes.size());
  for (size_t d = sizes.size(); d-- > 0;) {
    idx[d] = sizes[d] > 0 ? i % sizes[d] : 0;
    i = sizes[d] > 0 ? i / sizes[d] : 0;
  }
  return idx;
}

// Sums of 16-bit types are accumulated in float32 (see Note [Scatter accumulation]).

void check_index_tensor(const char* op, const char* what, const Tensor& index, const Tensor& x) {
  FRUGAL_CHECK(index.defined(), op, ": ", what, " is undefined");
  FRUGAL_CHECK(index.dtype() == kInt32 || index.dtype() == kInt64, op, ": ", what, " must be int32 or int64, got ",
               index.describe());
  FRUGAL_CHECK(index.device() == x.device(), op, ": expected all tensors on one device, got ", x.describe(), " and ",
               what, " ", index.describe());
}

// The error for index value v at linear position p of the user's index tensor: a closure
// over values only, so a deferred check holds no tensor (Note [Deferred index checks]).
memory::CheckMessage bad_index_message(const char* op, std::string range_of, int64_t dim_size, const char* what,
                                       const Tensor& index) {
  return [op, range_of = std::move(range_of), dim_size, what, desc = index.describe(), sizes = index.sizes()](
             int64_t value, int64_t position) {
    return str_cat(op, ": index ", value, " is out of range for ", range_of, " (valid range [0, ", dim_size,
                   ")) at position ", shape_str(unravel_index(position, sizes)), " of ", what, " ", desc);
  };
}

// `message` for a kernel that iterates over `shape` with the index's position at `dim`.
memory::CheckMessage along_dim(memory::CheckMessage message, Shape shape, int64_t dim) {
  return [message = std::move(message), shape = std::move(shape), dim](int64_t value, int64_t position) {
    return message(value, unravel_index(position, shape)[size_t(dim)]);
  };
}

// The first index outside [0, dim_size) read on the host, position = linear position in
// `index`. For the cases where no kernel runs (nothing to write, or an empty dim).
IndexError check_on_host(const Tensor& index, int64_t dim_size) {
  const std::vector<int64_t> v = index.tolist<int64_t>();
  for (size_t i = 0; i < v.size(); ++i)
    if (v[i] < 0 || v[i] >= dim_size) return {true, v[i], int64_t(i), {}};
  return {};
}

// t seen in `shape` with stride 0 at `dim`: the kernels add index * t.stride(dim).
Tensor table_view(const Tensor& t, const Shape& shape, int64_t dim) {
  Shape st = t.strides();
  st[size_t(dim)] = 0;
  return t.detach().as_strided(shape, st, t.storage_offset());  // a raw op's view: unseen by autograd
}

// A 1-D index (K,) seen in `shape` (shape[dim] == K): stride 0 except at `dim`.
Tensor index_along(const Tensor& index1d, const Shape& shape, int64_t dim) {
  Shape st(shape.size(), 0);
  st[size_t(dim)] = index1d.stride(0);
  return index1d.detach().as_strided(shape, st, index1d.storage_offset());
}

Tensor at_least_1d(const Tensor& t) { return t.dim() == 0 ? t.reshape({1}) : t; }

// A contiguous copy through copy_into (never Tensor::clone: nothing here is seen by autograd).
Tensor dense_copy(const Tensor& t) {
  Tensor out = empty(t.sizes(), t.options());
  copy_into(out, t);
  return out;
}

// Slices of x (>= 1-D) along dim at index1d = user_index.reshape(-1): index_select and embedding.
Tensor select_along(const char* op, const Tensor& x, int64_t dim, const Tensor& index1d, const std::string& range_of,
                    const char* what, const Tensor& user_index) {
  Shape shape = x.sizes();
  shape[size_t(dim)] = index1d.numel();
  Tensor out = empty(shape, x.options());
  const int64_t n = x.size(dim);
  memory::CheckMessage message = bad_index_message(op, range_of, n, what, user_index);
  if (out.numel() == 0 || n == 0) {
    if (index1d.numel() > 0) finish_index_check(check_on_host(index1d, n), std::move(message));
  } else {
    IndexError e;
    FRUGAL_DEVICE_DISPATCH(op, x.device(), index_gather_kernel, out, index_along(index1d, shape, dim),
                           table_view(x, shape, dim), n, x.stride(dim), e);
    finish_index_check(e, along_dim(std::move(message), shape, dim));
  }
  return out;
}

// acc (>= 1-D) += src's slice k at acc's slice index1d[k] along dim, skipping index `skip`:
// index_add and embedding_backward. index1d = user_index.reshape(-1).
void add_along(const char* op, const Tensor& acc, int64_t dim, const Tensor& index1d, const Tensor& src, int64_t skip,
               const std::string& range_of, const char* what, const Tensor& user_index) {
  const Shape& shape = src.sizes();
  const int64_t n = acc.size(dim);
  memory::CheckMessage message = bad_index_message(op, range_of, n, what, user_index);
  if (src.numel() == 0 || n == 0) {
    if (index1d.numel() > 0) finish_index_check(check_on_host(index1d, n), std::move(message));
  } else {
    IndexError e;
    FRUGAL_DEVICE_DISPATCH(op, acc.device(), index_scatter_add_kernel, table_view(acc, shape, dim),
                           index_along(index1d, shape, dim), src, n, acc.stride(dim), skip, e);
    finish_index_check(e, along_dim(std::move(message), shape, dim));
  }
}

// Checks scatter_add's operands (PyTorch's rules); returns the wrapped dim.
int64_t check_scatter(const char* op, const Tensor& self, int64_t dim, const Tensor& index, const Tensor& src) {
  FRUGAL_CHECK(self.defined() && src.defined(), op, ": undefined self or src");
  check_index_tensor(op, "index", index, self);
  check_same_device(op, self, src);
  FRUGAL_CHECK(self.dtype() == src.dtype(), op, ": expected self and src of one dtype, got self ", self.describe(),
               " and src ", src.describe());
  FRUGAL_CHECK(self.dtype() != kBool, op, ": not implemented for bool (self ", self.describe(), ")");
  // A 0-d operand counts as 1-d, as in PyTorch (scatter_add of a 0-d self with a 1-d index).
  const Tensor self1 = at_least_1d(self), index1 = at_least_1d(index), src1 = at_least_1d(src);
  FRUGAL_CHECK(index1.dim() == self1.dim() && src1.dim() == self1.dim(), op,
               ": index, self and src must have the same number of dims, got index ", index.describe(), ", self ",
               self.describe(), " and src ", src.describe());
  dim = wrap_dim(dim, self1.dim(), op);
  for (int64_t d = 0; d < index1.dim(); ++d) {
    FRUGAL_CHECK(index1.size(d) <= src1.size(d) && (d == dim || index1.size(d) <= self1.size(d)), op, ": index ",
                 index.describe(), " is larger than src ", src.describe(), " or (apart from dim ", dim, ") self ",
                 self.describe(), " at dim ", d);
  }
  return dim;
}

// acc (self's shape, dtype opmath_dtype(src)) += src scattered along dim by index.
void scatter_into(const char* op, const Tensor& acc, int64_t dim, const Tensor& index, const Tensor& src,
                  const Tensor& self) {
  if (index.numel() == 0) return;
  const Tensor a1 = at_least_1d(acc), i1 = at_least_1d(index), s1 = at_least_1d(src);
  const int64_t n = a1.size(dim);
  memory::CheckMessage message =
      bad_index_message(op, str_cat("dim ", dim, " of self ", self.describe()), n, "index", index);
  IndexError e;
  if (n == 0) {
    e = check_on_host(index, 0);
  } else {
    const Tensor src_view = s1.detach().as_strided(i1.sizes(), s1.strides(), s1.storage_offset());
    FRUGAL_DEVICE_DISPATCH(op, acc.device(), index_scatter_add_kernel, table_view(a1, i1.sizes(), dim), i1, src_view, n,
                           a1.stride(dim), int64_t(-1), e);
  }
  finish_index_check(e, std::move(message));  // the iteration shape is index's: positions agree
}

}  // namespace

void set_sync_index_checks(bool on) { memory::set_sync_checks(on); }
bool sync_index_checks() { return memory::sync_checks(); }

void finish_index_check(const IndexError& e, memory::CheckMessage message) {
  if (e.found) FRUGAL_FAIL(message(e.value, e.position));
  if (!e.record.defined()) return;
  if (memory::sync_checks()) {
    const std::vector<int64_t> h = e.record.tolist<int64_t>();  // waits for the kernel
    if (h[0] != 0) FRUGAL_FAIL(message(h[1], h[2]));
    return;
  }
  memory::defer_check(current_stream(e.record.device()), e.record.data(), std::move(message));
}

void check_index_range(const Tensor& index, int64_t dim_size, memory::CheckMessage message) {
  FRUGAL_CHECK(index.defined() && (index.dtype() == kInt32 || index.dtype() == kInt64),
               "check_index_range: index must be int32 or int64, got ", index.describe());
  if (index.numel() == 0) return;
  if (dim_size == 0) return finish_index_check(check_on_host(index, 0), std::move(message));
  // The gather kernel's own check, on a table of one byte that every index reads (stride 0):
  // no host read, and a deferred check on CUDA, for one byte written per index.
  const TensorOptions bytes{kBool, index.device()};
  const Tensor table = zeros({1}, bytes).as_strided(index.sizes(), Shape(size_t(index.dim()), 0), 0);
  IndexError e;
  FRUGAL_DEVICE_DISPATCH("check_index_range", index.device(), index_gather_kernel, empty(index.sizes(), bytes), index,
                         table, dim_size, int64_t(0), e);
  finish_index_check(e, std::move(message));
}

Tensor index_select(const Tensor& x, int64_t dim, const Tensor& index) {
  constexpr const char* op = "index_select";
  FRUGAL_CHECK(x.defined(), op, ": undefined input");
  check_index_tensor(op, "index", index, x);
  FRUGAL_CHECK(index.dim() <= 1, op, ": index must be 1-D or 0-d, got ", index.describe());
  dim = wrap_dim(dim, x.dim(), op);
  if (x.dim() == 0) {
    FRUGAL_CHECK(index.numel() == 1, op, ": the index into a 0-d input must hold one value, got ", index.describe());
    return select_along(op, x.reshape({1}), 0, index.reshape({-1}), str_cat("0-d input ", x.describe()), "index", index)
        .reshape({});
  }
  return select_along(op, x, dim, index.reshape({-1}), str_cat("dim ", dim, " of input ", x.describe()), "index",
                      index);
}

Tensor gather(const Tensor& x, int64_t dim, const Tensor& index) {
  constexpr const char* op = "gather";
  FRUGAL_CHECK(x.defined(), op, ": undefined input");
  check_index_tensor(op, "index", index, x);
  const Tensor x1 = at_least_1d(x), i1 = at_least_1d(index);  // 0-d counts as 1-d, as in PyTorch
  FRUGAL_CHECK(i1.dim() == x1.dim(), op, ": index ", index.describe(), " must have as many dims as input ",
               x.describe());
  dim = wrap_dim(dim, x1.dim(), op);
  for (int64_t d = 0; d < x1.dim(); ++d) {
    FRUGAL_CHECK(d == dim || i1.size(d) <= x1.size(d), op, ": index ", index.describe(), " is larger than input ",
                 x.describe(), " at dim ", d, " (", i1.size(d), " > ", x1.size(d), ")");
  }
  Tensor out = empty(index.sizes(), x.options());
  if (out.numel() == 0) return out;
  const int64_t n = x1.size(dim);
  memory::CheckMessage message =
      bad_index_message(op, str_cat("dim ", dim, " of input ", x.describe()), n, "index", index);
  IndexError e;
  if (n == 0) {
    e = check_on_host(index, 0);
  } else {
    FRUGAL_DEVICE_DISPATCH(op, x.device(), index_gather_kernel, at_least_1d(out), i1, table_view(x1, i1.sizes(), dim),
                           n, x1.stride(dim), e);
  }
  finish_index_check(e, std::move(message));  // the iteration shape is index's: positions agree
  return out;
}

void scatter_add_(const Tensor& self, int64_t dim, const Tensor& index, const Tensor& src) {
  constexpr const char* op = "scatter_add_";
  dim = check_scatter(op, self, dim, index, src);
  for (int64_t d = 0; d < self.dim(); ++d) {
    FRUGAL_CHECK(self.size(d) <= 1 || self.stride(d) != 0, op, ": self ", self.describe(),
                 " has overlapping memory (an expanded view); write into a contiguous copy");
  }
  self.bump_version();  // before the kernel: on a bad index self may already hold part of the update
  if (opmath_dtype(self.dtype()) != self.dtype()) {
    const Tensor acc = self.to(opmath_dtype(self.dtype()));
    scatter_into(op, acc, dim, index, src, self);
    copy_into(self, acc);
  } else {
    // An operand that overlaps self would be read after the kernel added into it
    // (scatter_add_(x, 0, i, x)): read a copy, as the in-place binary ops do.
    const auto unaliased = [&](const Tensor& t) { return may_overlap(self, t) ? dense_copy(t) : t; };
    scatter_into(op, self, dim, unaliased(index), unaliased(src), self);
  }
}

Tensor scatter_add(const Tensor& self, int64_t dim, const Tensor& index, const Tensor& src) {
  constexpr const char* op = "scatter_add";
  dim = check_scatter(op, self, dim, index, src);
  const DType acc = opmath_dtype(self.dtype());
  Tensor out = acc != self.dtype() ? self.to(acc) : self.clone();
  scatter_into(op, out, dim, index, src, self);
  return out.dtype() == self.dtype() ? out : out.to(self.dtype());
}

Tensor index_add(const Tensor& self, int64_t dim, const Tensor& index, const Tensor& src) {
  constexpr const char* op = "index_add";
  FRUGAL_CHECK(self.defined() && src.defined(), op, ": undefined self or src");
  check_index_tensor(op, "index", index, self);
  check_same_device(op, self, src);
  FRUGAL_CHECK(index.dim() <= 1, op, ": index must be 1-D or 0-d, got ", index.describe());
  FRUGAL_CHECK(self.dtype() == src.dtype(), op, ": expected self and src of one dtype, got self ", self.describe(),
               " and src ", src.describe());
  FRUGAL_CHECK(self.dtype() != kBool, op, ": not implemented for bool (self ", self.describe(), ")");
  dim = wrap_dim(dim, self.dim(), op);
  const Tensor src1 = at_least_1d(src);
  Shape expected = at_least_1d(self).sizes();
  expected[size_t(dim)] = index.numel();
  FRUGAL_CHECK(src1.sizes() == expected, op, ": src ", src.describe(), " must have the shape of self ", self.describe(),
               " except at dim ", dim, ", where it must have index.numel() = ", index.numel(), " entries (index ",
               index.describe(), ")");
  const DType acc = opmath_dtype(self.dtype());
  Tensor out = acc != self.dtype() ? self.to(acc) : self.clone();
  add_along(op, at_least_1d(out), dim, index.reshape({-1}), src1, -1,
            str_cat("dim ", dim, " of self ", self.describe()), "index", index);
  return out.dtype() == self.dtype() ? out : out.to(self.dtype());
}

Tensor one_hot(const Tensor& index, int64_t num_classes) {
  constexpr const char* op = "one_hot";
  FRUGAL_CHECK(index.defined(), op, ": undefined index");
  FRUGAL_CHECK(index.dtype() == kInt32 || index.dtype() == kInt64, op, ": index must be int32 or int64, got ",
               index.describe());
  FRUGAL_CHECK(num_classes >= -1, op, ": num_classes must be -1 (infer) or >= 0, got ", num_classes);
  if (num_classes == -1) {
    FRUGAL_CHECK(index.numel() > 0, op, ": cannot infer num_classes from an empty index ", index.describe(),
                 "; pass num_classes");
    // max(index) + 1, read on the host (one sync on CUDA, as PyTorch's .max().item()).
    const std::vector<int64_t> v = index.tolist<int64_t>();
    int64_t hi = v[0];
    for (size_t i = 0; i < v.size(); ++i) {
      FRUGAL_CHECK(v[i] >= 0, op, ": class values must be non-negative, got ", v[i], " at position ",
                   shape_str(unravel_index(int64_t(i), index.sizes())), " of index ", index.describe());
      hi = std::max(hi, v[i]);
    }
    FRUGAL_CHECK(hi < INT64_MAX, op, ": the largest class value ", hi,
                 " leaves no room for num_classes = ", "max + 1 in int64 (index ", index.describe(), ")");
    num_classes = hi + 1;
  }
  Shape shape = index.sizes();
  shape.push_back(num_classes);
  Tensor out = zeros(shape, {kInt64, index.device()});
  if (index.numel() == 0) return out;
  // Iterate over (*index.shape, 1): out[..., index[...]] += 1 (see Note [Index kernels as strided views]).
  Shape iter = index.sizes();
  iter.push_back(1);
  memory::CheckMessage message = bad_index_message(op, str_cat(num_classes, " classes"), num_classes, "index", index);
  IndexError e;
  if (num_classes == 0) {
    e = check_on_host(index, 0);
  } else {
    const Tensor ones = scalar_tensor(1.0, {kInt64, index.device()}).expand(iter);
    FRUGAL_DEVICE_DISPATCH(op, index.device(), index_scatter_add_kernel, table_view(out, iter, out.dim() - 1),
                           index.unsqueeze(-1), ones, num_classes, int64_t(1), int64_t(-1), e);
  }
  finish_index_check(e, std::move(message));  // iterating over (*index.shape, 1): positions agree
  return out;
}

Tensor embedding(const Tensor& weight, const Tensor& indices) {
  constexpr const char* op = "embedding";
  FRUGAL_CHECK(weight.defined() && weight.dim() == 2, op, ": weight must be 2-D (num_embeddings, embedding_dim), got ",
               weight.describe());
  check_index_tensor(op, "indices", indices, weight);
  Shape shape = indices.sizes();
  shape.push_back(weight.size(1));
  return select_along(op, weight, 0, indices.reshape({-1}), str_cat("weight ", weight.describe()), "indices", indices)
      .view(shape);
}

Tensor embedding_backward(const Tensor& grad_out, const Tensor& indices, int64_t num_weights, int64_t padding_idx) {
  constexpr const char* op = "embedding_backward";
  FRUGAL_CHECK(grad_out.defined(), op, ": undefined grad_out");
  check_index_tensor(op, "indices", indices, grad_out);
  FRUGAL_CHECK(grad_out.dtype() != kBool, op, ": not implemented for bool (grad_out ", grad_out.describe(), ")");
  const bool shape_ok = grad_out.dim() == indices.dim() + 1 &&
                        Shape(grad_out.sizes().begin(), grad_out.sizes().end() - 1) == indices.sizes();
  FRUGAL_CHECK(shape_ok, op, ": grad_out ", grad_out.describe(), " must have shape indices.shape + [embedding_dim]",
               " for indices ", indices.describe());
  FRUGAL_CHECK(num_weights >= 0, op, ": num_weights must be >= 0, got ", num_weights);
  FRUGAL_CHECK(padding_idx == -1 || (padding_idx >= 0 && padding_idx < num_weights), op, ": padding_idx ", padding_idx,
               " must be -1 (none) or in [0, ", num_weights, ")");
  const int64_t d = grad_out.size(-1);
  Tensor acc = zeros({num_weights, d}, {opmath_dtype(grad_out.dtype()), grad_out.device()});
  add_along(op, acc, 0, indices.reshape({-1}), grad_out.reshape({indices.numel(), d}), padding_idx,
            str_cat(num_weights, " embeddings"), "indices", indices);
  return acc.dtype() == grad_out.dtype() ? acc : acc.to(grad_out.dtype());
}

Tensor pad_source_indices(int64_t out_size, int64_t n, int64_t left, PadIndexMode mode, Device device) {
  FRUGAL_CHECK(out_size >= 0 && n > 0, "pad: ", out_size, " output entries from a dim of size ", n);
  Tensor out = empty({out_size}, {kInt64, device});
  if (out_size > 0) FRUGAL_DEVICE_DISPATCH("pad", device, pad_source_indices_kernel, out, n, left, mode);
  return out;
}

}  // namespace frugal::ops
