// PyTorch-style printout:
//   tensor([[ 0.1234, -1.0000],
//           [ 2.0000,  3.0000]], dtype=float16, device='cuda:0')
#include <cmath>
#include <cstdio>
#include <sstream>

#include "tensor/tensor.h"

namespace frugal {

namespace {
constexpr int64_t kSummarizeAbove = 1000;  // elements; beyond this, show edges only
constexpr int64_t kEdgeItems = 3;

struct Formatter {
  bool integral = false;     // integer dtype: "3"
  bool whole_float = false;  // floating dtype holding only whole numbers: "3." as PyTorch prints
  bool scientific = false;
  int width = 1;

  std::string format(double v) const {
    char buf[64];
    if (integral) std::snprintf(buf, sizeof buf, "%.0f", v);
    else if (std::isnan(v)) std::snprintf(buf, sizeof buf, "nan");
    else if (std::isinf(v)) std::snprintf(buf, sizeof buf, v > 0 ? "inf" : "-inf");
    else if (whole_float) std::snprintf(buf, sizeof buf, "%.0f.", v);
    else if (scientific) std::snprintf(buf, sizeof buf, "%.4e", v);
    else std::snprintf(buf, sizeof buf, "%.4f", v);
    return buf;
  }
};

void print_dim(std::ostream& os, const std::vector<double>& v, const Shape& sizes, size_t d, int64_t offset,
               const Formatter& f, bool summarize, int indent) {
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
      const std::string s = f.format(v[offset + i]);
      os << std::string(std::max<int>(0, f.width - int(s.size())), ' ') << s;
      if (i + 1 < n) os << ", ";
    } else {
      print_dim(os, v, sizes, d + 1, offset + i * inner, f, summarize, indent);
      if (i + 1 < n) os << ',' << std::string(sizes.size() - d - 1, '\n') << std::string(indent + d + 1, ' ');
    }
  }
  os << ']';
}
}  // namespace

std::string Tensor::str() const {
  if (!defined()) return "tensor(undefined)";
  const std::vector<double> v = tolist<double>();
  Formatter f;
  f.integral = !is_floating(dtype());
  if (!f.integral) {
    double lo = INFINITY, hi = 0;
    bool all_int = true;
    for (double x : v)
      if (std::isfinite(x)) {
        lo = std::min(lo, std::fabs(x));
        hi = std::max(hi, std::fabs(x));
        all_int = all_int && x == std::round(x);
      }
    f.scientific = hi >= 1e8 || (lo > 0 && lo < 1e-4) || (lo > 0 && hi / lo > 1e5);
    f.whole_float = all_int && !v.empty() && !f.scientific;
  }
  for (double x : v) f.width = std::max<int>(f.width, int(f.format(x).size()));

  std::ostringstream os;
  const std::string head = "tensor(";
  os << head;
  if (dim() == 0) os << f.format(v[0]);
  else print_dim(os, v, sizes(), 0, 0, f, numel() > kSummarizeAbove, int(head.size()));
  if (dtype() != kFloat32 && dtype() != kInt64) os << ", dtype=" << dtype_name(dtype());
  if (!device().is_cpu()) os << ", device='" << device().str() << "'";
  if (numel() == 0) os << ", size=" << shape_str(sizes());
  os << ')';
  return os.str();
}

std::ostream& operator<<(std::ostream& os, const Tensor& t) { return os << t.str(); }

}  // namespace frugal
