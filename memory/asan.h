#pragma once
// Internal: AddressSanitizer's manual poisoning, compiled out unless ASan is on.
// The caching allocator marks what it caches as unaddressable so that ASan sees
// tensor memory; see Note [Poisoning host blocks] in memory/caching_allocator.h.
#include <cstddef>

#if defined(__SANITIZE_ADDRESS__)  // g++
#define FRUGAL_ASAN 1
#elif defined(__has_feature)  // clang
#if __has_feature(address_sanitizer)
#define FRUGAL_ASAN 1
#endif
#endif
#ifndef FRUGAL_ASAN
#define FRUGAL_ASAN 0
#endif

#if FRUGAL_ASAN
#include <sanitizer/asan_interface.h>
#endif

namespace frugal::memory::detail {

/// Whether this build runs under AddressSanitizer.
inline constexpr bool kAsan = FRUGAL_ASAN;

/// Marks [p, p + n) unaddressable: ASan reports any access to it (no-op without ASan).
inline void asan_poison([[maybe_unused]] const void* p, [[maybe_unused]] size_t n) {
#if FRUGAL_ASAN
  ASAN_POISON_MEMORY_REGION(p, n);
#endif
}

/// Marks [p, p + n) addressable again (no-op without ASan).
inline void asan_unpoison([[maybe_unused]] const void* p, [[maybe_unused]] size_t n) {
#if FRUGAL_ASAN
  ASAN_UNPOISON_MEMORY_REGION(p, n);
#endif
}

}  // namespace frugal::memory::detail
