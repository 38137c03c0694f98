// PyTorch-style printout:
//   tensor([[ 0.1234, -1.0000],
//           [ 2.0000,  3.0000]], dtype=float16, device='cuda:0')
//
// Note [Printing like PyTorch]
// str() follows torch/_tensor_str.py, so a printout reads as PyTorch's does and every
// number in it is the element to the printed precision:
// - Integer tensors print every digit (int64 beyond 2^53 too: never through a double);
//   bool prints True/False.
// - A floating tensor picks one mode from its nonzero finite elements (zeros, NaN and inf do
//   not vote): scientific ("1.0000e-06") when max/min > 1000 or max > 1e8, or, unless all
//   are whole, min < 1e-4; else whole ("3.") when all are whole, else fixed ("0.1234").
//   A zero beside 1e-6 thus cannot make 1e-6 print as 0.0000.
// - The column width is the widest nonzero finite element's (1 when there is none).
// - Beyond 1000 elements, each dim longer than 6 shows its first and last 3, and the mode
//   and width come from the shown elements only.
// - A tensor with no elements prints "[]", with its size unless it is 1-D, and its dtype
//   unless float32.
#include <cmath>
#include <cstdio>
#include <sstream>

#include "tensor/tensor.h"

namespace frugal {

namespace {
constexpr int64_t kSummarizeAbove = 1000;  // elements; beyond this, show edges only
constexpr int64_t kEdgeItems = 3;

// The row-major indices of the elements shown: all, or when summarizing, the first and last
// kEdgeItems of every dim longer than 2 * kEdgeItems.
void shown_indices(const Shape& sizes, size_t d, int64_t offset, bool summarize, std::vector<int64_t>& out) {
  if (d == sizes.size()) {
    out.push_back(offset);
    return;
  }
  int64_t inner = 1;
  for (size_t k = d + 1; k < sizes.size(); ++k) inner *= sizes[k];
  for (int64_t i = 0; i < sizes[d]; ++i) {
    if (summarize && sizes[d] > 2 * kEdgeItems && i == kEdgeItems) i = sizes[d] - kEdgeItems;
    shown_indices(sizes, d + 1, offset + i * inner, summarize, out);
  }
}

// torch/_tensor_str.py's _Formatter (Note [Printing like PyTorch]).
struct Formatter {
  DType dtype;
  const std::vector<double>& fv;   // floating dtypes: the elements
  const std::vector<int64_t>& iv;  // integer and bool dtypes: the elements, exact
  bool int_mode = true;            // floating: every nonzero finite element is whole
  bool sci = false;
  int width = 1;

  Formatter(DType t, const std::vector<double>& f, const std::vector<int64_t>& i, const std::vector<int64_t>& shown)
      : dtype(t), fv(f), iv(i) {
    if (!is_floating(dtype)) {
      for (int64_t k : shown) width = std::max<int>(width, int(raw(k).size()));
      return;
    }
    double lo = INFINITY, hi = 0;
    bool any = false;
    for (int64_t k : shown) {
      const double x = fv[size_t(k)];
      if (!std::isfinite(x) || x == 0.0) continue;
      any = true;
      lo = std::min(lo, std::fabs(x));
      hi = std::max(hi, std::fabs(x));
      int_mode = int_mode && x == std::ceil(x);
    }
    if (!any) return;  // only zeros, NaN and inf: whole mode, no padding
    sci = hi / lo > 1000.0 || hi > 1.0e8 || (!int_mode && lo < 1.0e-4);
    for (int64_t k : shown) {
      const double x = fv[size_t(k)];
      if (std::isfinite(x) && x != 0.0) width = std::max<int>(width, int(raw(k).size()) + (int_mode && !sci ? 1 : 0));
    }
  }

  // Element k without padding; a whole number without its trailing '.'.
  std::string raw(int64_t k) const {
    if (dtype == kBool) return iv[size_t(k)] ? "True" : "False";
    if (!is_floating(dtype)) return std::to_string(iv[size_t(k)]);
    const double v = fv[size_t(k)];
    char buf[64];
    if (std::isnan(v)) return "nan";
    if (std::isinf(v)) return v > 0 ? "inf" : "-inf";
    if (sci) std::snprintf(buf, sizeof buf, "%.4e", v);
    else if (int_mode) std::snprintf(buf, sizeof buf, "%.0f", v);
    else std::snprintf(buf, sizeof buf, "%.4f", v);
    return buf;
  }

  std::string format(int64_t k) const {
    std::string s = raw(k);
    if (is_floating(dtype) && int_mode && !sci && std::isfinite(fv[size_t(k)])) s += '.';
    return std::string(std::max<int>(0, width - int(s.size())), ' ') + s;
  }
};

void print_dim(std::ostream& os, const Shape& sizes, size_t d, int64_t offset, const Formatter& f, bool summarize,
               int indent) {
  const int64_t n = sizes[d];
  int64_t inner = 1;
  for (size_t k = d + 1; k < sizes.size(); ++k) inner *= sizes[k];
  os << '[';
  for (int64_t i = 0; i < n; ++i) {
    if (summarize && n > 2 * kEdgeItems && i == kEdgeItems) {
      os << (d + 1 == sizes.size() ? "..., " : "...,\n" + std::string(indent + d + 1, ' '));
      i = n - kEdgeItems;
    }
    if (d + 1 == sizes.size()) {
      os << f.format(offset + i);
      if (i + 1 < n) os << ", ";
    } else {
      print_dim(os, sizes, d + 1, offset + i * inner, f, summarize, indent);
      if (i + 1 < n) os << ',' << std::string(sizes.size() - d - 1, '\n') << std::string(indent + d + 1, ' ');
    }
  }
  os << ']';
}
}  // namespace

std::string Tensor::str() const {
  if (!defined()) return "tensor(undefined)";
  std::vector<double> fv;
  std::vector<int64_t> iv;
  if (is_floating(dtype())) fv = tolist<double>();
  else iv = tolist<int64_t>();  // exact for every integer dtype, bool and uint8
  const bool summarize = numel() > kSummarizeAbove;
  std::vector<int64_t> shown;
  if (numel() > 0) shown_indices(sizes(), 0, 0, summarize, shown);
  const Formatter f(dtype(), fv, iv, shown);

  std::ostringstream os;
  const std::string head = "tensor(";
  os << head;
  if (numel() == 0) os << "[]";
  else if (dim() == 0) os << f.format(0);
  else print_dim(os, sizes(), 0, 0, f, summarize, int(head.size()));
  // PyTorch leaves out the dtypes a printout implies: float32, and int64 and bool when
  // there are elements to show it.
  const bool implied = dtype() == kFloat32 || (numel() > 0 && (dtype() == kInt64 || dtype() == kBool));
  if (!implied) os << ", dtype=" << dtype_name(dtype());
  if (!device().is_cpu()) os << ", device='" << device().str() << "'";
  if (numel() == 0 && dim() != 1) os << ", size=" << shape_str(sizes());
  os << ')';
  return os.str();
}

std::ostream& operator<<(std::ostream& os, const Tensor& t) { return os << t.str(); }

}  // namespace frugal
