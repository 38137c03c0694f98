// Note [GEMM kernels per instruction set]
// The library is built for x86-64-v2 (SSE4.2) so it runs on any x86-64 machine of the last
// fifteen years, but Eigen picks its SIMD width when it is compiled: at v2 its GEMM reached
// 80 GFLOPS on two cores of the development machine's EPYC, 200 at v3 (AVX2 + FMA) and 380 at
// v4 (AVX-512), where PyTorch 1.13 on OpenBLAS reached 200. So gemm_kernel.cpp is built three
// times (tensor/meson.build), once per level with that level's -march, and gemm() calls the
// widest one this CPU runs (__builtin_cpu_supports, which also checks that the OS saves the
// wider registers), as PyTorch's DispatchStub picks a CPU_CAPABILITY. Eigen is header-only,
// so each build instantiates the same templates; were they in namespace Eigen, the linker would
// keep one copy of each for all three levels, and an AVX-512 copy could run on a CPU without
// it. The kernel file renames Eigen's namespace per level (`#define Eigen frugal_eigen_v4`)
// and includes nothing else; tools/check_gemm_objects.py (the cpu suite) fails the build when
// one of those objects defines a weak symbol outside its own namespaces, which is how another
// header's inline code would leak. FRUGAL_CPU_ISA=x86-64-v2|v3|v4 picks a narrower level (to
// compare them or to reproduce another machine's bits: FMA rounds once where v2 rounds twice).
#include "tensor/cpu/gemm.h"

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>

#include "core/error.h"
#include "core/threads.h"
#include "tensor/cpu/gemm_bf16_kernel.h"
#include "tensor/cpu/loops.h"  // in_parallel_region

namespace frugal::ops::cpu {

// The kernels of each level (tensor/cpu/gemm_kernel.cpp), serial.
#define FRUGAL_DECLARE_GEMM_LEVEL(level)                                                                     \
  namespace level {                                                                                          \
  void gemm(const GemmOperand<float>& a, const GemmOperand<float>& b, float* out, int64_t ldc, bool acc);    \
  void gemm(const GemmOperand<double>& a, const GemmOperand<double>& b, double* out, int64_t ldc, bool acc); \
  }
FRUGAL_DECLARE_GEMM_LEVEL(v2)
FRUGAL_DECLARE_GEMM_LEVEL(v3)
FRUGAL_DECLARE_GEMM_LEVEL(v4)
#undef FRUGAL_DECLARE_GEMM_LEVEL

namespace {

constexpr GemmIsa kLevels[] = {GemmIsa::X86_64_V2, GemmIsa::X86_64_V3, GemmIsa::X86_64_V4};

GemmIsa widest_supported() {
  GemmIsa best = GemmIsa::X86_64_V2;
  for (GemmIsa isa : kLevels)
    if (cpu_supports(isa)) best = isa;
  return best;
}

/// The level FRUGAL_CPU_ISA names (checked), else the widest the CPU runs.
GemmIsa initial_isa() {
  const char* env = std::getenv("FRUGAL_CPU_ISA");
  if (!env || !*env) return widest_supported();
  for (GemmIsa isa : kLevels)
    if (std::strcmp(env, gemm_isa_name(isa)) == 0) {
      FRUGAL_CHECK(cpu_supports(isa), "FRUGAL_CPU_ISA=", env, ": this CPU does not run ", env,
                   " code; the widest it runs is ", gemm_isa_name(widest_supported()));
      return isa;
    }
  FRUGAL_CHECK(false, "FRUGAL_CPU_ISA=", env, " is not a level; use x86-64-v2, x86-64-v3 or x86-64-v4");
  return GemmIsa::X86_64_V2;
}

std::atomic<GemmIsa>& current_isa() {
  static std::atomic<GemmIsa> isa{initial_isa()};
  return isa;
}

template <typename T>
void run_level(const GemmOperand<T>& a, const GemmOperand<T>& b, T* out, int64_t ldc, bool accumulate) {
  switch (current_isa().load(std::memory_order_relaxed)) {
    case GemmIsa::X86_64_V4: return v4::gemm(a, b, out, ldc, accumulate);
    case GemmIsa::X86_64_V3: return v3::gemm(a, b, out, ldc, accumulate);
    case GemmIsa::X86_64_V2: return v2::gemm(a, b, out, ldc, accumulate);
  }
}


v4::Bf16Matrix bf16_matrix(const GemmOperand<BFloat16>& m) {
  return {reinterpret_cast<const uint16_t*>(m.data), m.rows, m.cols, m.row_major ? m.ld : 1, m.row_major ? 1 : m.ld};
}

/// The bfloat16 kernel on this thread's workspace, allocated at its first product and kept
/// for the thread's life (1.2 MB; the OpenMP team's threads live as long as the process).
void run_level(const GemmOperand<BFloat16>& a, const GemmOperand<BFloat16>& b, float* out, int64_t ldc,
               bool accumulate) {
  constexpr size_t kAlign = 64;
  thread_local std::unique_ptr<std::byte[]> workspace;
  if (!workspace) workspace = std::make_unique<std::byte[]>(size_t(v4::gemm_bf16_workspace_bytes()) + kAlign);
  void* aligned = workspace.get() + (kAlign - reinterpret_cast<uintptr_t>(workspace.get()) % kAlign) % kAlign;
  v4::gemm_bf16(bf16_matrix(a), bf16_matrix(b), out, ldc, accumulate, aligned);
}

// Blocks of whole rows (M >= N) or whole columns of out, in parallel when there are several
// (Note [Eigen runs single-threaded]); the blocks depend on the shapes alone.
template <typename T, typename Out>
void blocked(const GemmOperand<T>& a, const GemmOperand<T>& b, Out* out, int64_t ldc, bool accumulate) {
  const int64_t M = a.rows, N = b.cols, K = a.cols;
  if (M == 0 || N == 0) return;
  const bool by_rows = M >= N;
  const int64_t dim = by_rows ? M : N;
  const int64_t blocks = std::clamp<int64_t>(std::min(dim / 16, M * N * K / kGemmBlockMacs), 1, 8);
  auto block = [&](int64_t i) {
    const int64_t lo = i * dim / blocks, len = (i + 1) * dim / blocks - lo;
    if (by_rows) run_level(a.row_block(lo, len), b, out + lo * ldc, ldc, accumulate);
    else run_level(a, b.col_block(lo, len), out + lo, ldc, accumulate);
  };
  const int64_t threads = in_parallel_region() ? 1 : get_num_threads();
  if (blocks > 1 && threads > 1) {
#pragma omp parallel for schedule(dynamic, 1) num_threads(int(std::min(threads, blocks)))
    for (int64_t i = 0; i < blocks; ++i) block(i);
  } else {
    for (int64_t i = 0; i < blocks; ++i) block(i);
  }
}

}  // namespace

const char* gemm_isa_name(GemmIsa isa) {
  switch (isa) {
    case GemmIsa::X86_64_V4: return "x86-64-v4";
    case GemmIsa::X86_64_V3: return "x86-64-v3";
    case GemmIsa::X86_64_V2: return "x86-64-v2";
  }
  return "?";
}

bool cpu_supports(GemmIsa isa) {
  __builtin_cpu_init();
  switch (isa) {
    case GemmIsa::X86_64_V4: return __builtin_cpu_supports("x86-64-v4");
    case GemmIsa::X86_64_V3: return __builtin_cpu_supports("x86-64-v3");
    case GemmIsa::X86_64_V2: return __builtin_cpu_supports("x86-64-v2");
  }
  return false;
}

GemmIsa gemm_isa() { return current_isa().load(std::memory_order_relaxed); }

void set_gemm_isa(GemmIsa isa) {
  FRUGAL_CHECK(cpu_supports(isa), "set_gemm_isa: this CPU does not run ", gemm_isa_name(isa),
               " code; the widest it runs is ", gemm_isa_name(widest_supported()));
  current_isa().store(isa, std::memory_order_relaxed);
}

void gemm(const GemmOperand<float>& a, const GemmOperand<float>& b, float* out, int64_t ldc, bool accumulate) {
  blocked(a, b, out, ldc, accumulate);
}
void gemm(const GemmOperand<double>& a, const GemmOperand<double>& b, double* out, int64_t ldc, bool accumulate) {
  blocked(a, b, out, ldc, accumulate);
}
void gemm_serial(const GemmOperand<float>& a, const GemmOperand<float>& b, float* out, int64_t ldc, bool accumulate) {
  run_level(a, b, out, ldc, accumulate);
}
void gemm_serial(const GemmOperand<double>& a, const GemmOperand<double>& b, double* out, int64_t ldc,
                 bool accumulate) {
  run_level(a, b, out, ldc, accumulate);
}

bool gemm_bf16_native() {
  static const bool has = cpu_supports(GemmIsa::X86_64_V4) && __builtin_cpu_supports("avx512bf16");
  return has && gemm_isa() == GemmIsa::X86_64_V4;
}

void gemm(const GemmOperand<BFloat16>& a, const GemmOperand<BFloat16>& b, float* out, int64_t ldc, bool accumulate) {
  FRUGAL_CHECK(gemm_bf16_native(), "gemm: the bfloat16 kernel needs AVX512-BF16 at x86-64-v4");
  blocked(a, b, out, ldc, accumulate);
}
void gemm_serial(const GemmOperand<BFloat16>& a, const GemmOperand<BFloat16>& b, float* out, int64_t ldc,
                 bool accumulate) {
  FRUGAL_CHECK(gemm_bf16_native(), "gemm: the bfloat16 kernel needs AVX512-BF16 at x86-64-v4");
  run_level(a, b, out, ldc, accumulate);
}

}  // namespace frugal::ops::cpu
