// Random fills (tensor/ops/random.h) into tensors of any layout: element i in row-major
// order is philox_sample(..., i) (Note [Counter-based RNG]; philox.h is the spec here).
#include "tensor/factory.h"
#include "tensor/ops/random.h"
#include "tensor/philox.h"
#include "tests/op_table/entry_util.h"

namespace frugal::optest {

void add_random_ops(std::vector<OpEntry>& t) {
  using Kind = ops::RandomKind;
  for (Kind kind : {Kind::Uniform, Kind::Normal, Kind::Integer}) {
    const char* name = kind == Kind::Uniform ? "uniform_" : kind == Kind::Normal ? "normal_" : "random_int_";
    t.push_back({name, kind == Kind::Integer ? kNumeric : kFloats, [kind](Rng& rng, DType dt) {
                   Sample s;
                   s.inputs = {random_input(rng, random_shape(rng, {.max_dims = 6, .max_numel = 900}), dt, {},
                                            {.expand = false})};
                   s.mutates = {0};
                   const double a = kind == Kind::Integer ? double(rng.range(-5, 3)) : rng.uniform(-2, 2);
                   const double b = kind == Kind::Integer  ? a + double(rng.range(1, 9))  // high
                                    : kind == Kind::Normal ? rng.uniform(0, 3)            // std
                                                           : a + rng.uniform(0, 3);       // high
                   const Generator::Range start{rng.next(), uint64_t(rng.range(0, 1 << 20))};
                   s.params = cat_str("a=", a, " b=", b, " seed=", start.seed, " counter=", start.counter);
                   s.run = [kind, a, b, start](const std::vector<Tensor>& in) {
                     Generator gen(start.seed);
                     gen.set_state(start.seed, start.counter);
                     if (kind == Kind::Uniform) ops::uniform_(in[0], a, b, &gen);
                     if (kind == Kind::Normal) ops::normal_(in[0], a, b, &gen);
                     if (kind == Kind::Integer) ops::random_int_(in[0], int64_t(a), int64_t(b), &gen);
                     return std::vector<Tensor>{in[0], from_vector<int64_t>({int64_t(gen.offset())}, {1}, {kInt64})};
                   };
                   s.reference = [kind, a, b, start, dt](const std::vector<Host>& in) {
                     const int64_t n = in[0].numel();
                     Host out = in[0];
                     for (int64_t i = 0; i < n; ++i)
                       out.v[size_t(i)] =
                           round_to(dt, philox_sample(int(kind), a, b, start.seed, start.counter, uint64_t(i)));
                     const double offset = double(start.counter + (n > 0 ? uint64_t(n + 3) / 4 : 0));
                     return std::vector<Expected>{{out, dt, tol_for(dt)}, {Host{true, {1}, {offset}}, kInt64, {}}};
                   };
                   return s;
                 }});
  }
}

}  // namespace frugal::optest
