// einsum (autograd/ops/einsum.h).
//
// Note [einsum as matmuls]
// The equation is parsed into one label per dim (letters, and one label per dim the ellipsis
// stands for, right-aligned across operands). A label that only one operand has and the output
// lacks is summed out of that operand first. The operands are then contracted left to right, two
// at a time, as PyTorch's einsum does: of the pair's labels, those needed later (by the output or
// a later operand) and shared are batch dims, those shared and not needed are contracted, and the
// others are kept from their side; each side is permuted to (batch, kept, contracted) and
// reshaped to 3-D, one batched matmul multiplies them, and the result is reshaped back to the
// labels (batch, kept from the left, kept from the right). A label repeated within an operand
// ("ii->i", "ii") first takes that operand's diagonal. A size-1 dim broadcasts against its
// label's size in the other operand (expand). Last, labels the output lacks are summed and the
// rest permuted into the output's order. Everything is a differentiable op, so the gradients are
// theirs.
#include "autograd/ops/einsum.h"

#include <algorithm>
#include <cctype>
#include <cstdint>
#include <string>
#include <vector>

#include "autograd/autocast.h"
#include "autograd/ops/matmul.h"
#include "autograd/ops/reduce.h"
#include "core/instrument.h"

namespace frugal {

namespace {

constexpr int kLetters = 52;  // 'A'-'Z' are labels 0-25, 'a'-'z' 26-51; the ellipsis's dims follow

int letter_label(char c) { return std::isupper(static_cast<unsigned char>(c)) ? c - 'A' : 26 + (c - 'a'); }
/// "b" for a letter's label, "..." for the ellipsis's.
std::string label_name(int l) {
  return l < 26 ? std::string(1, char('A' + l)) : l < kLetters ? std::string(1, char('a' + l - 26)) : "...";
}

/// One term of the equation ("b...d") as labels, `ellipsis` labels standing for "...".
struct Term {
  std::vector<char> letters;  // in order, '.' where the ellipsis stands
  bool has_ellipsis = false;
};

Term parse_term(const std::string& text, const std::string& equation) {
  Term t;
  for (size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (c == '.') {
      FRUGAL_CHECK(!t.has_ellipsis && text.compare(i, 3, "...") == 0, "einsum: a malformed ellipsis in \"", equation,
                   "\" (one \"...\" a term)");
      t.has_ellipsis = true;
      t.letters.push_back('.');
      i += 2;
    } else {
      FRUGAL_CHECK(std::isalpha(static_cast<unsigned char>(c)), "einsum: invalid subscript '", c, "' in \"", equation,
                   "\" (letters a-z, A-Z and \"...\")");
      t.letters.push_back(c);
    }
  }
  return t;
}

/// A term's labels, its ellipsis standing for the last `count` of the `width` ellipsis labels.
std::vector<int> term_labels(const Term& t, int64_t count, int64_t width) {
  std::vector<int> labels;
  for (char c : t.letters) {
    if (c != '.') {
      labels.push_back(letter_label(c));
      continue;
    }
    for (int64_t j = width - count; j < width; ++j) labels.push_back(kLetters + int(j));
  }
  return labels;
}

bool contains(const std::vector<int>& v, int x) { return std::find(v.begin(), v.end(), x) != v.end(); }

/// An operand with one label per dim.
struct Labelled {
  Tensor t;
  std::vector<int> labels;
};

/// x with each label that repeats within it taken once, along the diagonal of its dims (as
/// torch.einsum("ii->i")): the two dims moved last, merged, and every (n + 1)-th entry kept, all
/// differentiable views and copies.
Labelled diagonals(Labelled x, size_t operand, const std::string& equation) {
  for (;;) {
    size_t d1 = 0, d2 = 0;
    for (size_t i = 0; i < x.labels.size() && d2 == 0; ++i)
      for (size_t j = i + 1; j < x.labels.size() && d2 == 0; ++j)
        if (x.labels[i] == x.labels[j]) d1 = i, d2 = j;
    if (d2 == 0) return x;
    const int64_t n = x.t.size(int64_t(d1));
    FRUGAL_CHECK(x.t.size(int64_t(d2)) == n, "einsum: the dims of operand ", operand, " labelled '",
                 label_name(x.labels[d1]), "' in \"", equation, "\" have sizes ", n, " and ", x.t.size(int64_t(d2)),
                 "; a diagonal needs equal sizes");
    std::vector<int64_t> order;
    std::vector<int> labels;
    for (size_t d = 0; d < x.labels.size(); ++d)
      if (d != d1 && d != d2) order.push_back(int64_t(d)), labels.push_back(x.labels[d]);
    Shape merged;
    for (int64_t d : order) merged.push_back(x.t.size(d));
    merged.push_back(n * n);
    order.insert(order.end(), {int64_t(d1), int64_t(d2)});
    labels.push_back(x.labels[d1]);
    x = {x.t.permute(order).reshape(merged).slice(-1, 0, n * n, n + 1), labels};
  }
}

/// x summed over its labels not in `keep` (no dims summed: x itself).
Labelled sum_out(const Labelled& x, const std::vector<int>& keep) {
  std::vector<int64_t> dims;
  Labelled out;
  for (size_t d = 0; d < x.labels.size(); ++d) {
    if (contains(keep, x.labels[d])) out.labels.push_back(x.labels[d]);
    else dims.push_back(int64_t(d));
  }
  out.t = dims.empty() ? x.t : sum(x.t, dims);
  return out;
}

/// x's dims in the order of `labels` (each of x's labels once).
Tensor permuted(const Labelled& x, const std::vector<int>& labels) {
  std::vector<int64_t> order;
  for (int l : labels) order.push_back(int64_t(std::find(x.labels.begin(), x.labels.end(), l) - x.labels.begin()));
  return x.t.permute(order);
}

/// The size of label `l` in x (1 when x lacks it).
int64_t size_of(const Labelled& x, int l) {
  const auto it = std::find(x.labels.begin(), x.labels.end(), l);
  return it == x.labels.end() ? 1 : x.t.size(int64_t(it - x.labels.begin()));
}

/// a and b contracted over their shared labels that `keep` lacks (Note [einsum as matmuls]).
Labelled contract(Labelled a, Labelled b, const std::vector<int>& keep) {
  std::vector<int> a_keep_all = keep;  // a's and b's own labels the result needs, or that pair in b
  for (int l : b.labels) a_keep_all.push_back(l);
  a = sum_out(a, a_keep_all);
  std::vector<int> b_keep_all = keep;
  for (int l : a.labels) b_keep_all.push_back(l);
  b = sum_out(b, b_keep_all);
  std::vector<int> batch, contracted, a_only, b_only;
  for (int l : a.labels) {
    if (!contains(b.labels, l)) a_only.push_back(l);
    else if (contains(keep, l)) batch.push_back(l);
    else contracted.push_back(l);
  }
  for (int l : b.labels)
    if (!contains(a.labels, l)) b_only.push_back(l);
  // Shared labels broadcast: a size-1 side is expanded to the other's size.
  Shape a_sizes, b_sizes;
  const auto size_pair = [&](int l) {
    const int64_t sa = size_of(a, l), sb = size_of(b, l);
    FRUGAL_CHECK(sa == sb || sa == 1 || sb == 1, "einsum: the dims labelled '", label_name(l), "' have sizes ", sa,
                 " and ", sb, ", which do not broadcast");
    return std::max(sa, sb);
  };
  int64_t nb = 1, nc = 1, na = 1, nbo = 1;
  Shape out_shape;
  std::vector<int> a_order = batch, b_order = batch;
  for (int l : batch) {
    const int64_t s = size_pair(l);
    nb *= s;
    out_shape.push_back(s);
    a_sizes.push_back(s), b_sizes.push_back(s);
  }
  for (int l : a_only) {
    na *= size_of(a, l);
    out_shape.push_back(size_of(a, l));
    a_order.push_back(l), a_sizes.push_back(size_of(a, l));
  }
  for (int l : contracted) {
    const int64_t s = size_pair(l);
    nc *= s;
    a_order.push_back(l), a_sizes.push_back(s);
    b_order.push_back(l), b_sizes.push_back(s);  // b's contracted dims follow its batch dims too
  }
  for (int l : b_only) {
    nbo *= size_of(b, l);
    out_shape.push_back(size_of(b, l));
    b_order.push_back(l), b_sizes.push_back(size_of(b, l));
  }
  const Tensor a3 = permuted(a, a_order).expand(a_sizes).reshape({nb, na, nc});
  const Tensor b3 = permuted(b, b_order).expand(b_sizes).reshape({nb, nc, nbo});
  Labelled out{matmul(a3, b3).reshape(out_shape), batch};
  out.labels.insert(out.labels.end(), a_only.begin(), a_only.end());
  out.labels.insert(out.labels.end(), b_only.begin(), b_only.end());
  return out;
}

}  // namespace

Tensor einsum(const std::string& equation, const std::vector<Tensor>& operands) {
  core::OpScope scope("einsum");
  std::string eq;
  for (char c : equation)
    if (!std::isspace(static_cast<unsigned char>(c))) eq.push_back(c);
  const size_t arrow = eq.find("->");
  const std::string lhs = eq.substr(0, arrow);
  std::vector<Term> terms;
  for (size_t start = 0;;) {
    const size_t comma = lhs.find(',', start);
    terms.push_back(parse_term(lhs.substr(start, comma - start), equation));
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  FRUGAL_CHECK(terms.size() == operands.size(), "einsum: \"", equation, "\" has ", terms.size(), " operand terms, but ",
               operands.size(), " operands were given");
  // The ellipsis's width: the most dims it stands for in any operand.
  int64_t width = 0;
  std::vector<int64_t> ellipsis_dims(terms.size(), 0);
  for (size_t i = 0; i < terms.size(); ++i) {
    const Tensor& x = operands[i];
    FRUGAL_CHECK(x.defined(), "einsum: operand ", i, " is undefined");
    // matmul's rules, checked here to name einsum: floating, one device, one dtype (autocast
    // casts the matmuls' operands to its dtype instead).
    FRUGAL_CHECK(is_floating(x.dtype()), "einsum: expects floating operands, got operand ", i, " ", x.describe());
    FRUGAL_CHECK(x.device() == operands[0].device(), "einsum: operand ", i, " ", x.describe(),
                 " is not on the device of operand 0 ", operands[0].describe());
    FRUGAL_CHECK(x.dtype() == operands[0].dtype() || autocast::is_enabled(x.device().type), "einsum: operand ", i, " ",
                 x.describe(), " and operand 0 ", operands[0].describe(),
                 " differ in dtype (like matmul, einsum does not promote: convert one with .to(dtype))");
    const int64_t named = int64_t(terms[i].letters.size()) - (terms[i].has_ellipsis ? 1 : 0);
    FRUGAL_CHECK(terms[i].has_ellipsis ? x.dim() >= named : x.dim() == named, "einsum: operand ", i, " ", x.describe(),
                 " has ", x.dim(), " dims, but its subscripts in \"", equation, "\" name ", named);
    ellipsis_dims[i] = x.dim() - named;
    width = std::max(width, ellipsis_dims[i]);
  }
  std::vector<Labelled> ops;
  std::vector<int> count(size_t(kLetters + width), 0);
  for (size_t i = 0; i < terms.size(); ++i) {
    Labelled x{operands[i], term_labels(terms[i], ellipsis_dims[i], width)};
    for (int l : x.labels) ++count[size_t(l)];  // a repeat counts twice, as torch's implicit output
    ops.push_back(diagonals(std::move(x), i, equation));
  }
  std::vector<int> output;
  if (arrow != std::string::npos) {
    const Term out = parse_term(eq.substr(arrow + 2), equation);
    output = term_labels(out, width, width);
    for (size_t d = 0; d < output.size(); ++d) {
      FRUGAL_CHECK(count[size_t(output[d])] > 0, "einsum: the output label '", label_name(output[d]), "' of \"",
                   equation, "\" is in no operand");
      FRUGAL_CHECK(std::count(output.begin(), output.end(), output[d]) == 1, "einsum: a repeated output label in \"",
                   equation, "\"");
    }
  } else {  // the ellipsis's dims, then the labels used once, sorted
    for (int64_t j = 0; j < width; ++j) output.push_back(kLetters + int(j));
    for (int l = 0; l < kLetters; ++l)
      if (count[size_t(l)] == 1) output.push_back(l);
  }
  // Left to right, each step keeping the labels the output or a later operand needs.
  Labelled cur = ops[0];
  for (size_t i = 1; i < ops.size(); ++i) {
    std::vector<int> keep = output;
    for (size_t j = i + 1; j < ops.size(); ++j) keep.insert(keep.end(), ops[j].labels.begin(), ops[j].labels.end());
    cur = contract(cur, ops[i], keep);
  }
  return permuted(sum_out(cur, output), output);  // every output label is some operand's, so cur's
}

}  // namespace frugal
