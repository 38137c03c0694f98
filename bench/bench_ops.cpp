// bench_ops: how fast frugal's raw ops are, next to the peers they are built on.
//
//   build/bench/bench_ops [--device cpu|cuda] [--quick]
//
// Prints tables, then key figures as "name: value" lines. On the CPU: matmul
// against a hand-written Eigen product on the same sizes and threads, bfloat16 matmul on
// AVX512-BF16 against its float32-copy path, float16 casts at each level, and the fixed
// cost of a tiny op and of an allocation. With --device cuda also: elementwise
// bandwidth as a fraction of cudaMemcpy's, matmul against raw cublasGemmEx, and the
// caching allocator against cudaMalloc (bench_ops_cuda.cpp). Every figure is the
// median of repeated runs after warm-up.
#include <Eigen/Core>

#include <cstdio>
#include <cstring>
#include <exception>

#include "bench/bench_ops.h"
#include "core/threads.h"
#include "examples/flags.h"
#include "tensor/cpu/gemm.h"
#include "tensor/factory.h"
#include "tensor/ops/binary.h"
#include "tensor/ops/matmul.h"

namespace frugal::bench {

namespace {

// Note [Matmul against raw Eigen]
// The peer is what a user would write without frugal: Eigen::MatrixXf operands and
// C.noalias() = A * B into a preallocated C. It is compiled with the library's baseline
// flags (x86-64-v2, bench/meson.build) and runs on the same OpenMP threads, so frugal at
// the same level over the peer measures only frugal's overhead: dispatch, the output
// allocation and the operand mapping. frugal's other levels (Note [GEMM kernels per
// instruction set] in tensor/cpu/gemm.cpp) show what the wider vectors buy. Runs alternate,
// so drift on a shared machine hits all of them. frugal keeps Eigen single-threaded and
// threads blocks of the product itself (Note [Eigen runs single-threaded]), so the peer sets
// Eigen's threads around its own product. tools/bench_matmul_torch.py times PyTorch on the
// same sizes.
void cpu_matmul(const Options& o, KeyFigures& keys) {
  using ops::cpu::GemmIsa;
  const int threads = get_num_threads();
  std::vector<GemmIsa> levels;
  for (GemmIsa isa : {GemmIsa::X86_64_V2, GemmIsa::X86_64_V3, GemmIsa::X86_64_V4})
    if (ops::cpu::cpu_supports(isa)) levels.push_back(isa);
  std::vector<std::string> columns = {"n", "runs"};
  for (GemmIsa isa : levels) columns.push_back(fmt("frugal %s", ops::cpu::gemm_isa_name(isa)));
  columns.push_back("Eigen x86-64-v2");
  columns.push_back("frugal v2 / Eigen");
  Table table(fmt("CPU matmul, float32, square n x n, GFLOP/s (median; %d threads, Eigen %d.%d.%d)", threads,
                  EIGEN_WORLD_VERSION, EIGEN_MAJOR_VERSION, EIGEN_MINOR_VERSION),
              columns);
  const std::vector<int64_t> sizes =
      o.quick ? std::vector<int64_t>{256, 512, 1024} : std::vector<int64_t>{256, 512, 1024, 2048};
  const GemmIsa in_use = ops::cpu::gemm_isa();
  double checksum = 0;
  for (int64_t n : sizes) {
    int reps = n <= 256 ? 60 : n <= 512 ? 25 : n <= 1024 ? 11 : 5;
    if (o.quick) reps = std::max(3, reps / 3);
    const Tensor a = randn({n, n}), b = randn({n, n});
    const Eigen::MatrixXf A = Eigen::MatrixXf::Random(n, n), B = Eigen::MatrixXf::Random(n, n);
    Eigen::MatrixXf C(n, n);
    auto run_frugal = [&] { checksum += ops::matmul(a, b).data_ptr<float>()[0]; };
    auto run_eigen = [&] {
      Eigen::setNbThreads(threads);  // what a user's own Eigen build does: all OpenMP threads
      C.noalias() = A * B;
      Eigen::setNbThreads(1);
      checksum += C(0, 0);
    };
    std::vector<std::vector<double>> tf(levels.size());
    std::vector<double> te;
    for (int i = -1; i < reps; ++i) {  // i = -1: warm-up (threads, caches, the output block)
      for (size_t l = 0; l < levels.size(); ++l) {
        ops::cpu::set_gemm_isa(levels[l]);
        const double t = time_median(run_frugal, 0, 1);
        if (i >= 0) tf[l].push_back(t);
      }
      const double t = time_median(run_eigen, 0, 1);
      if (i >= 0) te.push_back(t);
    }
    ops::cpu::set_gemm_isa(in_use);
    const double flops = 2.0 * double(n) * double(n) * double(n);
    std::vector<std::string> row = {std::to_string(n), std::to_string(reps)};
    for (size_t l = 0; l < levels.size(); ++l) row.push_back(fmt("%.1f", flops / median(tf[l]) * 1e-9));
    const double ge = flops / median(te) * 1e-9, g2 = flops / median(tf[0]) * 1e-9;
    row.push_back(fmt("%.1f", ge));
    row.push_back(fmt("%.3f", g2 / ge));
    table.add(row);
    if (n == 1024) {
      keys.add("cpu_matmul_vs_eigen", g2 / ge);
      keys.add("cpu_matmul_gflops_1024", flops / median(tf.back()) * 1e-9, "%.1f");
    }
  }
  table.print();
  if (checksum == 0.123456789) std::printf("%g\n", checksum);  // keeps the results observable
}

// bfloat16 products: on AVX512-BF16 (Note [bfloat16 GEMM] in tensor/cpu/gemm_bf16_kernel.cpp),
// against the float32-copy path the other levels take, and float32 at the widest level;
// tools/bench_matmul_torch.py --dtype bfloat16 times PyTorch (oneDNN) on the same sizes.
void cpu_matmul_bf16(const Options& o, KeyFigures& keys) {
  using ops::cpu::GemmIsa;
  if (!ops::cpu::cpu_supports(GemmIsa::X86_64_V4)) return;
  const GemmIsa in_use = ops::cpu::gemm_isa();
  ops::cpu::set_gemm_isa(GemmIsa::X86_64_V4);
  const bool native = ops::cpu::gemm_bf16_native();
  ops::cpu::set_gemm_isa(in_use);
  if (!native) {
    std::printf("CPU matmul, bfloat16: this CPU has no AVX512-BF16 (products run on float32 copies)\n");
    return;
  }
  Table table(fmt("CPU matmul, bfloat16, square n x n, GFLOP/s (median; %d threads)", get_num_threads()),
              {"n", "runs", "bf16 AVX512-BF16", "bf16 via float32 (v3)", "float32 (v4)", "native / via float32"});
  const std::vector<int64_t> sizes =
      o.quick ? std::vector<int64_t>{256, 512, 1024} : std::vector<int64_t>{256, 512, 1024, 2048};
  double checksum = 0;
  for (int64_t n : sizes) {
    int reps = n <= 256 ? 60 : n <= 512 ? 25 : n <= 1024 ? 11 : 5;
    if (o.quick) reps = std::max(3, reps / 3);
    const Tensor a = randn({n, n}), b = randn({n, n});
    const Tensor a16 = a.to(kBFloat16), b16 = b.to(kBFloat16);
    struct Column {
      GemmIsa isa;
      const Tensor *a, *b;
      std::vector<double> times;
    };
    std::vector<Column> columns = {
        {GemmIsa::X86_64_V4, &a16, &b16, {}}, {GemmIsa::X86_64_V3, &a16, &b16, {}}, {GemmIsa::X86_64_V4, &a, &b, {}}};
    for (int i = -1; i < reps; ++i)  // alternating, so drift on a shared machine hits every column
      for (Column& c : columns) {
        ops::cpu::set_gemm_isa(c.isa);
        const double t =
            time_median([&] { checksum += ops::matmul(*c.a, *c.b).select(0, 0).select(0, 0).item<double>(); }, 0, 1);
        if (i >= 0) c.times.push_back(t);
      }
    ops::cpu::set_gemm_isa(in_use);
    const double flops = 2.0 * double(n) * double(n) * double(n);
    std::vector<std::string> row = {std::to_string(n), std::to_string(reps)};
    for (const Column& c : columns) row.push_back(fmt("%.1f", flops / median(c.times) * 1e-9));
    row.push_back(fmt("%.2f", median(columns[1].times) / median(columns[0].times)));
    table.add(row);
    if (n == 1024) keys.add("cpu_matmul_bf16_gflops_1024", flops / median(columns[0].times) * 1e-9, "%.1f");
  }
  table.print();
  if (checksum == 0.123456789) std::printf("%g\n", checksum);
}

// float16 <-> float32 casts (Tensor::to), at each level: x86-64-v2 converts with half.h one
// element at a time, v3 and v4 with F16C (Note [Bulk float16 conversion] in
// tensor/cpu/half_convert_kernel.cpp); a transposed source has no contiguous run and converts
// element by element at every level. Runs alternate between the levels.
void cpu_cast_float16(const Options& o, KeyFigures& keys) {
  using ops::cpu::GemmIsa;
  std::vector<GemmIsa> levels;
  for (GemmIsa isa : {GemmIsa::X86_64_V2, GemmIsa::X86_64_V3, GemmIsa::X86_64_V4})
    if (ops::cpu::cpu_supports(isa)) levels.push_back(isa);
  std::vector<std::string> columns = {"cast", "elements"};
  for (GemmIsa isa : levels) columns.push_back(ops::cpu::gemm_isa_name(isa));
  columns.push_back("widest / v2");
  Table table(fmt("CPU cast float16 <-> float32, M elements/s (median; %d threads)", get_num_threads()), columns);
  const GemmIsa in_use = ops::cpu::gemm_isa();
  const int reps = o.quick ? 7 : 25;
  double checksum = 0;
  for (int64_t n : {int64_t(1) << 16, int64_t(1) << 22}) {
    const Tensor f = randn({n / 1024, 1024}), h = f.to(kFloat16);
    struct Row {
      const char* name;
      const Tensor* x;
      DType to;
      bool transposed;
    };
    for (const Row& r : {Row{"float32 -> float16", &f, kFloat16, false}, Row{"float16 -> float32", &h, kFloat32, false},
                         Row{"float16 -> float32, transposed", &h, kFloat32, true}}) {
      const Tensor x = r.transposed ? r.x->t() : *r.x;
      std::vector<std::vector<double>> t(levels.size());
      for (int i = -1; i < reps; ++i)
        for (size_t l = 0; l < levels.size(); ++l) {
          ops::cpu::set_gemm_isa(levels[l]);
          const double s = time_median([&] { checksum += double(x.to(r.to).numel()); }, 0, 1);
          if (i >= 0) t[l].push_back(s);
        }
      std::vector<std::string> row = {r.name, std::to_string(n)};
      for (size_t l = 0; l < levels.size(); ++l) row.push_back(fmt("%.0f", double(n) / median(t[l]) * 1e-6));
      const double ratio = median(t[0]) / median(t.back());
      row.push_back(fmt("%.1f", ratio));
      table.add(row);
      if (n == (int64_t(1) << 22) && !r.transposed)
        keys.add(r.to == kFloat16 ? "cpu_cast_to_float16_speedup" : "cpu_cast_from_float16_speedup", ratio, "%.1f");
    }
  }
  ops::cpu::set_gemm_isa(in_use);
  table.print();
  if (checksum == 0.123456789) std::printf("%g\n", checksum);
}

void cpu_overheads(const Options& o, KeyFigures& keys) {
  const int blocks = o.quick ? 20 : 100, per_block = 1000;  // 100k calls (20k quick)
  const Tensor x = ones({1}), y = ones({1});
  const double add_ns = ns_per_call([&] { Tensor z = ops::add(x, y); }, blocks, per_block);
  const double empty_ns = ns_per_call([&] { Tensor z = empty({1}); }, blocks, per_block);
  const Tensor p = ones({2, 2}), q = ones({2, 2});
  const double mm_ns = ns_per_call([&] { Tensor z = ops::matmul(p, q); }, blocks, per_block);
  Table table(fmt("CPU fixed costs (median over %d blocks of %d calls)", blocks, per_block), {"call", "ns/call"});
  table.add({"ops::add of two 1-element float32 tensors", fmt("%.0f", add_ns)});
  table.add({"frugal::empty({1}) alloc + free", fmt("%.0f", empty_ns)});
  table.add({"ops::matmul of two 2x2 float32 tensors", fmt("%.0f", mm_ns)});
  table.print();
  keys.add("tiny_op_overhead_ns", add_ns, "%.0f");
  keys.add("cpu_empty_alloc_free_ns", empty_ns, "%.0f");
}

const char* kUsage = "usage: bench_ops [--device cpu|cuda] [--quick]\n";

}  // namespace

void run_cpu_benchmarks(const Options& o, KeyFigures& keys) {
  cpu_matmul(o, keys);
  cpu_matmul_bf16(o, keys);
  cpu_cast_float16(o, keys);
  cpu_overheads(o, keys);
}

}  // namespace frugal::bench

int main(int argc, char** argv) {
  using namespace frugal::bench;
  const Options o = frugal::cli::parse_or_exit("bench_ops", kUsage, [&] {
    Options parsed;
    frugal::cli::Flags flags(argc, argv);
    while (flags.next()) {
      if (flags.is("--quick")) parsed.quick = true;
      else if (flags.is("--device")) parsed.cuda = flags.choice({"cpu", "cuda"}) == "cuda";
      else flags.unknown();
    }
    return parsed;
  });
  std::printf("frugal bench_ops (device: %s%s)\n", o.cuda ? "cuda" : "cpu", o.quick ? ", quick" : "");
  KeyFigures keys;
  try {
    if (o.cuda) require_cuda();  // fail before the CPU half, not after it
    run_cpu_benchmarks(o, keys);
    if (o.cuda) run_cuda_benchmarks(o, keys);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 1;
  }
  keys.print();
  return 0;
}
