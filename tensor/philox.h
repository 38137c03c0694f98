#pragma once
// Philox4x32-10 (Salmon et al., "Parallel random numbers: as easy as 1, 2, 3").
//
// Note [Counter-based RNG]
// A random op asks the Generator for a range of counters and element i of its
// output is a pure function of (seed, first_counter + i / 4, i % 4). No state
// is carried between elements, so the CPU loop and the CUDA kernel produce the
// same stream, any thread can compute any element, and replaying an op with the
// same (seed, offset) - as dropout does under checkpoint recompute - gives the
// same numbers bit for bit.
#include <cmath>
#include <cstdint>

#include "tensor/half.h"

namespace frugal {

struct PhiloxResult {
  uint32_t x[4];
};

FRUGAL_HD uint32_t philox_mulhilo(uint32_t a, uint32_t b, uint32_t* hi) {
  const uint64_t p = uint64_t(a) * uint64_t(b);
  *hi = uint32_t(p >> 32);
  return uint32_t(p);
}

/// The full Philox4x32-10 block function: 128-bit counter c, 64-bit key (k0, k1).
FRUGAL_HD PhiloxResult philox4x32_10(uint32_t c0, uint32_t c1, uint32_t c2, uint32_t c3, uint32_t k0, uint32_t k1) {
  for (int round = 0; round < 10; ++round) {
    uint32_t hi0, hi1;
    const uint32_t lo0 = philox_mulhilo(0xD2511F53u, c0, &hi0);
    const uint32_t lo1 = philox_mulhilo(0xCD9E8D57u, c2, &hi1);
    const uint32_t n0 = hi1 ^ c1 ^ k0, n2 = hi0 ^ c3 ^ k1;
    c0 = n0;
    c1 = lo1;
    c2 = n2;
    c3 = lo0;
    k0 += 0x9E3779B9u;
    k1 += 0xBB67AE85u;
  }
  return {{c0, c1, c2, c3}};
}

/// Four 32-bit random words for a 64-bit `counter` under key `seed`.
FRUGAL_HD PhiloxResult philox4x32(uint64_t seed, uint64_t counter) {
  return philox4x32_10(uint32_t(counter), uint32_t(counter >> 32), 0, 0, uint32_t(seed), uint32_t(seed >> 32));
}

/// The first counter of a Generator::Range: `counter`, plus, inside a CUDA graph, the replay's
/// offset that `base` points to (Note [Graph-safe random numbers] in tensor/random.h).
FRUGAL_HD uint64_t philox_first_counter(uint64_t counter, const uint64_t* base) {
  return base ? counter + *base : counter;
}

/// Uniform in [0, 1) with 24 random bits: exact in float, identical on CPU and GPU.
FRUGAL_HD float philox_uniform(uint32_t x) { return float(x >> 8) * (1.0f / 16777216.0f); }

}  // namespace frugal

namespace frugal {

// Note [Random integers]
// Element i of an integer fill over [low, low + span) (span = high - low, 1 to 2^64 - 1, as an
// unsigned count so the whole int64 range has one) is low + w mod span, w word i % 4 of the
// counter first + i / 4, in exact integer arithmetic: never through a double, which holds
// no odd integer past 2^53 and made a range at the int64 limits draw outside itself. For
// span up to 2^16, w is that 32-bit word (a bias below 2^-16 of a value's probability);
// past it, w is widened to 64 bits by the same word of the counter's second block
// (philox4x32_10 with c2 = 1, which no other draw uses), so the bias stays below
// span / 2^64. A 32-bit w reduced modulo a span near 2^32 (PyTorch's choice below 2^32)
// would draw the values below 2^32 - span twice as often: randint(0, 3e9) would average
// 1.24e9, not 1.5e9.

/// Element i of an integer fill over [low, low + span), span >= 1 (Note [Random integers]).
FRUGAL_HD int64_t philox_int(int64_t low, uint64_t span, uint64_t seed, uint64_t counter, uint64_t i) {
  const uint64_t c = counter + i / 4;
  const int w = int(i % 4);
  uint64_t bits = philox4x32(seed, c).x[w];
  if (span > 65536u)
    bits |= uint64_t(philox4x32_10(uint32_t(c), uint32_t(c >> 32), 1, 0, uint32_t(seed), uint32_t(seed >> 32)).x[w])
            << 32;
  return int64_t(uint64_t(low) + bits % span);  // modulo 2^64: the sum lies in [low, low + span)
}

/// Element i of a random fill (see Note [Counter-based RNG]): kind 0 uniform in [a, b),
/// 1 normal(mean a, std b) by Box-Muller over word pairs, 2 integer in [a, b) (philox_int,
/// exact only for bounds that doubles hold: the integer kernels call philox_int).
/// Computed in float (double only for the affine map), identically on host and device.
FRUGAL_HD double philox_sample(int kind, double a, double b, uint64_t seed, uint64_t counter, uint64_t i) {
  const PhiloxResult r = philox4x32(seed, counter + i / 4);
  const int w = int(i % 4);
  if (kind == 0) return a + (b - a) * double(philox_uniform(r.x[w]));
  if (kind == 2) return double(philox_int(int64_t(a), uint64_t(int64_t(b) - int64_t(a)), seed, counter, i));
  const int pair = w & ~1;
  const float u1 = float((r.x[pair] >> 8) + 1) * (1.0f / 16777216.0f);  // (0, 1]: log is finite
  const float u2 = philox_uniform(r.x[pair + 1]);
  const float radius = sqrtf(-2.0f * logf(u1));
  const float theta = 6.2831853071795864f * u2;
  const float z = (w & 1) ? radius * sinf(theta) : radius * cosf(theta);
  return a + b * double(z);
}

}  // namespace frugal
