#include "tensor/ops/random.h"

#include <cmath>
#include <limits>
#include <type_traits>

#include "tensor/device_dispatch.h"
#include "tensor/dispatch.h"
#include "tensor/elementwise.h"
#include "tensor/factory.h"
#include "tensor/ops/copy.h"

namespace frugal {

Generator& default_generator() {
  static Generator gen(0);
  return gen;
}

void manual_seed(uint64_t seed) { default_generator().manual_seed(seed); }

// ---- Note [Draws under a record] ---------------------------------------------------------

namespace {
thread_local DrawRecord* innermost_record = nullptr;
}  // namespace

DrawRecord::DrawRecord() : outer_(innermost_record) { innermost_record = this; }

DrawRecord::~DrawRecord() { innermost_record = outer_; }

void DrawRecord::note(const std::shared_ptr<Generator* const>& generator, uint64_t seed, uint64_t offset) {
  for (DrawRecord* r = innermost_record; r; r = r->outer_) {
    bool seen = false;
    for (const GeneratorState& s : r->first_)
      seen = seen || (!s.handle.owner_before(generator) && !generator.owner_before(s.handle));
    if (!seen) r->first_.push_back({generator, seed, offset});
  }
}

namespace ops {
namespace {
void random_fill(const char* op, const Tensor& t, RandomFill fill, Generator* gen) {
  if (t.numel() == 0) return;
  check_no_internal_overlap(op, t);  // before the generator moves
  Generator& g = gen ? *gen : default_generator();
  // Four values per Philox counter; a dense temporary keeps "element i" well defined
  // for any strides of t (see Note [Counter-based RNG]).
  fill.range = g.reserve(uint64_t(t.numel() + 3) / 4);
  Tensor dense = t.is_contiguous() ? t : empty(t.sizes(), t.options());
  FRUGAL_DEVICE_DISPATCH(op, t.device(), random_kernel, dense, fill);
  if (!dense.shares_storage(t)) ops::copy_into(t, dense);
  t.bump_version();
}

/// The largest finite value of a floating dtype, and the integers it holds exactly (2^digits).
struct FloatLimits {
  double max, exact;
};
FloatLimits float_limits(DType dt) {
  switch (dt) {
    case kFloat16: return {65504.0, 2048.0};
    case kBFloat16: return {3.3895313892515355e38, 256.0};
    case kFloat32: return {double(std::numeric_limits<float>::max()), 16777216.0};
    default: return {std::numeric_limits<double>::max(), 9007199254740992.0};
  }
}

/// x (finite, within T's range) rounded as random_element stores it, and the neighbours of
/// a value of T (Note [Random bounds in the dtype]).
template <typename T>
double stored(double x) {
  return double(static_cast<opmath_t<T>>(T(static_cast<opmath_t<T>>(x))));
}
template <typename T>
double neighbour(double x, bool up) {
  if constexpr (std::is_same_v<T, float> || std::is_same_v<T, double>) {
    return double(std::nextafter(T(x), up ? std::numeric_limits<T>::infinity() : -std::numeric_limits<T>::infinity()));
  } else {  // Half, BFloat16: sign and magnitude bits
    uint16_t bits = T(float(x)).bits;
    if ((bits & 0x7fffu) == 0) bits = up ? 0x0001u : 0x8001u;  // +-0: the smallest subnormal
    else if (((bits & 0x8000u) != 0) == up) --bits;            // toward zero
    else ++bits;                                               // away from zero
    return double(float(T::from_bits(bits)));
  }
}
}  // namespace

void uniform_(const Tensor& t, double low, double high, Generator* gen) {
  FRUGAL_CHECK(is_floating(t.dtype()), "uniform_: expects a floating tensor, got ", t.describe());
  const double max = float_limits(t.dtype()).max;
  FRUGAL_CHECK(std::isfinite(low) && std::isfinite(high) && std::fabs(low) <= max && std::fabs(high) <= max &&
                   std::isfinite(high - low),
               "uniform_: bounds [", low, ", ", high, ") must be finite, within +-", max, " for ", t.describe(),
               ", and their difference finite (Note [Random bounds in the dtype])");
  FRUGAL_CHECK(low <= high, "uniform_: low ", low, " > high ", high);
  RandomFill fill{RandomKind::Uniform, low, high, {}};
  dispatch_floating(t.dtype(), "uniform_", t.device(), [&]<typename T>() {
    double lo = stored<T>(low), hi = stored<T>(high);
    if (lo < low) lo = neighbour<T>(lo, true);
    if (hi >= high) hi = neighbour<T>(hi, false);
    if (lo <= hi) fill.lo_in_dtype = lo, fill.hi_in_dtype = hi;  // else the dtype holds nothing in [low, high)
  });
  random_fill("uniform_", t, fill, gen);
}

void normal_(const Tensor& t, double mean, double std, Generator* gen) {
  FRUGAL_CHECK(is_floating(t.dtype()), "normal_: expects a floating tensor, got ", t.describe());
  FRUGAL_CHECK(std >= 0.0, "normal_: std must be >= 0, got ", std);
  random_fill("normal_", t, {RandomKind::Normal, mean, std, {}}, gen);
}

void random_int_(const Tensor& t, int64_t low, int64_t high, Generator* gen) {
  FRUGAL_CHECK(low < high, "randint: low ", low, " must be < high ", high);
  FRUGAL_CHECK(t.dtype() != kBool, "randint: not supported for bool, got ", t.describe());
  // The integers t's dtype holds exactly (Note [Random bounds in the dtype]).
  int64_t min = 0, max = 0;
  switch (t.dtype()) {
    case kInt32: min = std::numeric_limits<int32_t>::min(), max = std::numeric_limits<int32_t>::max(); break;
    case kInt64: min = std::numeric_limits<int64_t>::min(), max = std::numeric_limits<int64_t>::max(); break;
    case kUInt8: min = 0, max = 255; break;
    default: max = int64_t(float_limits(t.dtype()).exact), min = -max;
  }
  FRUGAL_CHECK(low >= min && high - 1 <= max, "randint: [", low, ", ", high, ") does not fit ", t.describe(),
               ", which holds the integers [", min, ", ", max, "] exactly (Note [Random bounds in the dtype])");
  RandomFill fill{RandomKind::Integer, double(low), double(high), {}};
  fill.low = low;
  fill.span = uint64_t(high) - uint64_t(low);  // 1 to 2^64 - 1, without signed overflow
  random_fill("randint", t, fill, gen);
}

}  // namespace ops
}  // namespace frugal
