#include "nn/low_rank_budget.h"

#include <algorithm>
#include <cmath>
#include <string>

#include "core/error.h"

namespace frugal::nn {

int64_t dense_weight_params(const std::vector<LayerSpectrum>& layers) {
  int64_t n = 0;
  for (const auto& l : layers) n += l.in * l.out;
  return n;
}

namespace {

/// One layer during the allocation: its rank so far and the energy that keeps.
/// Energies are in units of s_0^2 (Note [Energy in units of the largest singular value] in
/// nn/low_rank.cpp): only their ratios count, and no square under- or overflows.
struct LayerState {
  const LayerSpectrum* layer;
  double unit = 1;   // s_0 (1 for an all-zero spectrum)
  double total = 0;  // sum of (s / unit)^2
  int64_t rank = 1;
  double kept = 0;  // sum_{i<rank} (s / unit)^2
  bool dense = false;

  double energy(size_t i) const { return (layer->s[i] / unit) * (layer->s[i] / unit); }

  int64_t in_out() const { return layer->in + layer->out; }
  int64_t full() const { return layer->in * layer->out; }
  int64_t params() const { return dense ? full() : rank * in_out(); }
  /// The first rank that saves nothing: reaching it means keeping the layer dense.
  int64_t dense_rank() const { return (full() + in_out() - 1) / in_out(); }
};

/// The best move of one layer that fits in `room` parameters: to the rank (or to dense)
/// with the most energy restored per parameter spent.
struct Move {
  double ratio = -1;
  int64_t rank = 0;  // the target rank; dense when it reaches LayerState::dense_rank()
  int64_t cost = 0;
  double gain = 0;
};

Move best_move(const LayerState& st, int64_t room) {
  Move best;
  if (st.dense || st.total == 0) return best;
  double gain = 0;
  for (int64_t target = st.rank + 1; target <= st.dense_rank(); ++target) {
    const bool to_dense = target == st.dense_rank();
    gain = to_dense ? st.total - st.kept : gain + st.energy(size_t(target - 1));
    const int64_t cost = to_dense ? st.full() - st.params() : (target - st.rank) * st.in_out();
    if (cost > room) break;  // costs grow with the target
    const double ratio = gain / st.total / double(cost);
    if (ratio > best.ratio) best = {ratio, target, cost, gain};
  }
  return best;
}

void check_spectrum(const LayerSpectrum& l, size_t index) {
  FRUGAL_CHECK(l.in > 0 && l.out > 0, "ranks_for_budget: layer ", index, " has shape (out=", l.out, ", in=", l.in, ")");
  FRUGAL_CHECK(int64_t(l.s.size()) == std::min(l.in, l.out), "ranks_for_budget: layer ", index, " (out=", l.out,
               ", in=", l.in, ") has ", l.s.size(),
               " singular values, expected min(in, out) = ", std::min(l.in, l.out));
  for (size_t i = 0; i < l.s.size(); ++i) {
    FRUGAL_CHECK(l.s[i] >= 0 && std::isfinite(l.s[i]), "ranks_for_budget: layer ", index, " singular value ", i, " is ",
                 l.s[i]);
    FRUGAL_CHECK(i == 0 || l.s[i] <= l.s[i - 1], "ranks_for_budget: layer ", index,
                 " singular values are not in decreasing order at ", i, " (", l.s[i - 1], ", ", l.s[i], ")");
  }
}

}  // namespace

std::vector<RankChoice> ranks_for_budget(const std::vector<LayerSpectrum>& layers, ParamBudget budget) {
  FRUGAL_CHECK(budget.fraction > 0 && budget.fraction <= 1, "ranks_for_budget: fraction must be in (0, 1], got ",
               budget.fraction);
  FRUGAL_CHECK(!layers.empty(), "ranks_for_budget: no layers");
  std::vector<LayerState> state;
  for (size_t i = 0; i < layers.size(); ++i) {
    check_spectrum(layers[i], i);
    LayerState st{.layer = &layers[i], .unit = layers[i].s[0] > 0 ? layers[i].s[0] : 1.0};
    for (size_t j = 0; j < layers[i].s.size(); ++j) st.total += st.energy(j);
    st.kept = st.energy(0);
    // Rank 1 that saves nothing (a layer of one row or column): dense from the start.
    if (layers[i].in + layers[i].out >= layers[i].in * layers[i].out)
      st.dense = true, st.rank = std::min(layers[i].in, layers[i].out), st.kept = st.total;
    state.push_back(st);
  }
  const int64_t dense = dense_weight_params(layers);
  const int64_t limit = int64_t(std::floor(budget.fraction * double(dense)));
  int64_t spent = 0;
  for (const auto& st : state) spent += st.params();
  FRUGAL_CHECK(spent <= limit, "ranks_for_budget: a budget of ", budget.fraction, " (", limit, " of ", dense,
               " weight parameters) is below rank 1 in every layer (", spent, " parameters); the smallest budget is ",
               double(spent) / double(dense));
  for (;;) {
    LayerState* best = nullptr;
    Move move;
    for (auto& st : state) {
      const Move m = best_move(st, limit - spent);
      if (m.ratio > move.ratio) best = &st, move = m;  // ties: the earlier layer
    }
    if (!best) break;
    spent += move.cost;
    best->kept += move.gain;
    best->rank = move.rank;
    if (move.rank == best->dense_rank()) best->dense = true, best->rank = std::min(best->layer->in, best->layer->out);
  }
  std::vector<RankChoice> out;
  for (const auto& st : state)
    out.push_back({.rank = st.rank,
                   .dense = st.dense,
                   .energy_kept = st.total == 0 ? 1.0 : st.kept / st.total,
                   .params = st.params()});
  return out;
}

}  // namespace frugal::nn
