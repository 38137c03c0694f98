#pragma once
// The op table behind the differential op tests (docs/design.md, "Tests"; after ggml's
// test-backend-ops and PyTorch's OpInfo). Each entry samples random inputs for one raw
// op (tensor/ops/*.h) - shapes of 0 to 8 dims with size-0 and size-1 dims, random
// layouts (tests/op_table/sample.h), every dtype the op takes - runs it, and compares
// every output with a naive float64 reference computed from the inputs' values by
// plain loops over logical indices. The cpu suite, the gpu suite (the same cases on
// CUDA) and build/tests/op_fuzz all run this one table.
//
// A case is reproducible from (seed, op name, case index) and the dtypes allowed (the gpu
// suite and `op_fuzz --device cuda` allow float32, float16, bfloat16): run_case derives
// its generator from them, and a failure message names them, with every input's shape,
// strides, offset and dtype (values too when small), the worst element of the output that
// failed, and the op_fuzz command that runs the case again.
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "tests/op_table/sample.h"

namespace frugal::optest {

/// How close an output must be: |got - want| <= atol + rtol |want| (rtol = atol = 0: exact).
struct Tol {
  double rtol = 0.0, atol = 0.0;
};
/// One rounding to `dtype` of a value computed in its opmath type, plus that type's
/// error on a few operations; exact for integer and bool results.
Tol tol_for(DType dtype);
/// A sum of n terms each of magnitude <= `scale`, accumulated in the opmath type and
/// stored in `dtype`.
Tol tol_sum(DType dtype, int64_t n, double scale = 2.0);

/// What one output of an op must be.
struct Expected {
  Host value;  // value.defined == false: the output must be an undefined Tensor
  DType dtype = kFloat32;
  Tol tol;
  bool contiguous = false;  // the output must also be contiguous (contiguous(), clone())
};
/// An undefined output.
inline Expected expect_undefined() { return {host_undefined(), kFloat32, {}}; }

/// Thrown by a reference for inputs the op must reject with frugal::Error.
struct MustThrow {
  std::string why;
};

/// One sampled case of an op.
struct Sample {
  std::vector<Tensor> inputs;  // CPU tensors in random layouts; undefined for an absent optional
  std::string params;          // the op's other arguments, for the failure message
  /// The frugal call, given `inputs` or copies of them on another device in the same layouts.
  std::function<std::vector<Tensor>(const std::vector<Tensor>& in)> run;
  /// The float64 reference from the inputs' values (read before the run).
  std::function<std::vector<Expected>(const std::vector<Host>& in)> reference;
  /// Inputs the op writes in place: storage elements outside their views must stay as
  /// they were (every other storage must stay untouched entirely).
  std::vector<int> mutates;
};

struct OpEntry {
  std::string name;
  std::vector<DType> dtypes;  // a case draws one of these
  std::function<Sample(Rng& rng, DType dtype)> sample;
  bool on_cuda = true;                  // the CUDA backend implements it (the gpu suite skips the others)
  std::vector<DType> cuda_dtypes = {};  // the dtypes CUDA takes, when fewer than `dtypes`
};

/// Every entry, in a fixed order.
const std::vector<OpEntry>& op_table();
/// The entry named `name`, or nullptr.
const OpEntry* find_op(const std::string& name);

struct RunOptions {
  Device device = kCPU;       // a CUDA device: run there too and check both results
  std::vector<DType> dtypes;  // only these (empty: the entry's own)
  double device_tol_scale = 4.0;
  bool trace = false;  // print each case to stderr before running it (to find a case that crashes)
};
struct CaseResult {
  bool ran = false;  // false: no dtype of the entry is allowed by RunOptions::dtypes
  bool ok = true;
  std::string message;  // why it failed, with everything needed to reproduce it
};
/// Samples, runs and checks case `index` of `op` for `seed`. Never throws.
CaseResult run_case(const OpEntry& op, uint64_t seed, int64_t index, const RunOptions& options = {});

// ---- helpers for the entries (tests/op_table/ops_*.cpp) ------------------------
inline const std::vector<DType> kFloats = {kFloat32, kFloat64, kFloat16, kBFloat16};
inline const std::vector<DType> kNumeric = {kFloat32, kFloat64, kFloat16, kBFloat16, kInt32, kInt64};
inline const std::vector<DType> kAll = {kFloat32, kFloat64, kFloat16, kBFloat16, kInt32, kInt64, kBool};
/// The value `v` as stored in `dtype` (what a kernel writing dtype must produce).
double round_to(DType dtype, double v);
/// `dims` wrapped into [0, ndim) (negative dims count from the end).
std::vector<int64_t> wrap_dims(const std::vector<int64_t>& dims, int64_t ndim);

// The groups of entries, one file each.
void add_unary_ops(std::vector<OpEntry>& t);
void add_binary_ops(std::vector<OpEntry>& t);
void add_reduce_ops(std::vector<OpEntry>& t);
void add_copy_ops(std::vector<OpEntry>& t);  // copy, fill, reshape, join
void add_index_ops(std::vector<OpEntry>& t);
void add_linalg_ops(std::vector<OpEntry>& t);     // matmul, mm, bmm, linear
void add_norm_loss_ops(std::vector<OpEntry>& t);  // softmax, masked_softmax, layer norm, losses
void add_nn_ops(std::vector<OpEntry>& t);         // pool, conv, batch norm
void add_attention_ops(std::vector<OpEntry>& t);  // flash attention, dropout
void add_random_ops(std::vector<OpEntry>& t);     // uniform_, normal_, random_int_

}  // namespace frugal::optest
