#pragma once
// Scopes the CPU kernel tests set for a block and put back: the x86-64 level of the per-level
// kernels (Note [GEMM kernels per instruction set] in tensor/cpu/gemm.cpp) and the thread count.
#include "core/threads.h"
#include "tensor/cpu/gemm.h"

namespace frugal::testing {

/// Every level the kernels are built for (the tests skip those the CPU cannot run).
inline constexpr ops::cpu::GemmIsa kLevels[] = {ops::cpu::GemmIsa::X86_64_V2, ops::cpu::GemmIsa::X86_64_V3,
                                                ops::cpu::GemmIsa::X86_64_V4};

/// Uses a level's kernels for its lifetime, restoring the one before.
struct LevelScope {
  ops::cpu::GemmIsa before = ops::cpu::gemm_isa();
  explicit LevelScope(ops::cpu::GemmIsa isa) { ops::cpu::set_gemm_isa(isa); }
  ~LevelScope() { ops::cpu::set_gemm_isa(before); }
  LevelScope(const LevelScope&) = delete;
  LevelScope& operator=(const LevelScope&) = delete;
};

/// Sets the op thread count for its lifetime, restoring the one before.
struct ThreadScope {
  int before = get_num_threads();
  explicit ThreadScope(int n) { set_num_threads(n); }
  ~ThreadScope() { set_num_threads(before); }
  ThreadScope(const ThreadScope&) = delete;
  ThreadScope& operator=(const ThreadScope&) = delete;
};

}  // namespace frugal::testing
