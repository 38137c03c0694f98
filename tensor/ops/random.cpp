#include "tensor/ops/random.h"

#include "tensor/device_dispatch.h"
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
void random_fill(const char* op, const Tensor& t, RandomKind kind, double a, double b, Generator* gen) {
  if (t.numel() == 0) return;
  Generator& g = gen ? *gen : default_generator();
  // Four values per Philox counter; a dense temporary keeps "element i" well defined
  // for any strides of t (see Note [Counter-based RNG]).
  const RandomFill fill{kind, a, b, g.reserve(uint64_t(t.numel() + 3) / 4)};
  Tensor dense = t.is_contiguous() ? t : empty(t.sizes(), t.options());
  FRUGAL_DEVICE_DISPATCH(op, t.device(), random_kernel, dense, fill);
  if (!dense.shares_storage(t)) ops::copy_into(t, dense);
  t.bump_version();
}
}  // namespace

void uniform_(const Tensor& t, double low, double high, Generator* gen) {
  FRUGAL_CHECK(is_floating(t.dtype()), "uniform_: expects a floating tensor, got ", t.describe());
  FRUGAL_CHECK(low <= high, "uniform_: low ", low, " > high ", high);
  random_fill("uniform_", t, RandomKind::Uniform, low, high, gen);
}

void normal_(const Tensor& t, double mean, double std, Generator* gen) {
  FRUGAL_CHECK(is_floating(t.dtype()), "normal_: expects a floating tensor, got ", t.describe());
  FRUGAL_CHECK(std >= 0.0, "normal_: std must be >= 0, got ", std);
  random_fill("normal_", t, RandomKind::Normal, mean, std, gen);
}

void random_int_(const Tensor& t, int64_t low, int64_t high, Generator* gen) {
  FRUGAL_CHECK(low < high, "randint: low ", low, " must be < high ", high);
  FRUGAL_CHECK(high - low <= (int64_t(1) << 32) - 1, "randint: range [", low, ", ", high, ") wider than 2^32 - 1");
  FRUGAL_CHECK(t.dtype() != kBool, "randint: not supported for bool, got ", t.describe());
  random_fill("randint", t, RandomKind::Integer, double(low), double(high), gen);
}

}  // namespace ops
}  // namespace frugal
