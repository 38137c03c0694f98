// bench/svd_compress_run.h: the compression table at --quick sizes (a 2-block PatchViT,
// a few steps) and the choice of its "best" row. The budget rows are checked against
// the parameter count the budget allows, computed here from the model's shapes.
#include <doctest/doctest.h>

#include <cmath>
#include <sstream>

#include "bench/svd_compress_run.h"
#include "tests/test_util.h"

using namespace frugal;
using namespace frugal::bench::svd;
using frugal::testing::check_error;

namespace {

/// The value after "key: " in `text`, or NaN when the line is missing.
double figure(const std::string& text, const std::string& key) {
  const size_t at = text.find("\n" + key + ": ");
  if (at == std::string::npos && text.rfind(key + ": ", 0) != 0) return NAN;
  return std::stod(text.substr(at == std::string::npos ? key.size() + 2 : at + key.size() + 3));
}

Row row(const std::string& name, int64_t params, int64_t infer, double acc) {
  return {.name = name, .params = params, .infer_peak_1 = infer, .infer_peak_32 = 2 * infer, .acc_after = acc};
}

}  // namespace

TEST_CASE("svd_compress: the quick table's budget rows hold the budget and shrink inference memory") {
  Options o = defaults("small", kCPU, /*quick=*/true);
  o.energies = {0.8};
  o.budgets = {0.7, 0.5};
  std::ostringstream log;
  const std::vector<Row> rows = run_table(o, log);
  REQUIRE(rows.size() == 4);
  CHECK(rows[0].name == "dense");
  CHECK(rows[1].name == "e0.80");
  CHECK(rows[2].name == "p0.70");
  CHECK(rows[3].name == "p0.50");
  // The matched weights: per block query, key, value, out (dim x dim) and the MLP pair.
  const bench::PatchViTConfig c = model_config(o);
  const int64_t matched = c.depth * (4 * c.dim * c.dim + 2 * c.dim * c.mlp);
  const Row& d = rows[0];
  for (size_t i = 2; i < 4; ++i) {
    CAPTURE(rows[i].name);
    const double budget = o.budgets[i - 2];
    CHECK(rows[i].params <= d.params - matched + int64_t(std::floor(budget * double(matched))));
    CHECK(rows[i].params < d.params);
    CHECK(rows[i].replaced > 0);
    CHECK(rows[i].infer_peak_1 < d.infer_peak_1);  // fewer weights, batch 1: weights dominate
    CHECK(rows[i].train_peak > 0);
    CHECK(rows[i].step_ms > 0);
    CHECK(rows[i].images_per_s > 0);
    CHECK(rows[i].acc_after >= 0);
    CHECK(rows[i].acc_after <= 1);
  }
  CHECK(rows[3].params < rows[2].params);
  CHECK(d.infer_peak_32 > d.infer_peak_1);
  CHECK(d.train_peak > d.infer_peak_1);  // grads and AdamW state on top of the weights
  // With any accuracy allowed, the best row is the smallest at batch 1: p0.50.
  const std::string s = summary(rows, 1.0);
  CHECK(s.find("best_row: p0.50") != std::string::npos);
  CHECK(figure(s, "param_ratio") == doctest::Approx(double(rows[3].params) / double(d.params)).epsilon(1e-3));
  CHECK(figure(s, "inference_memory_ratio") < 1);
  CHECK(figure(s, "inference_memory_ratio") > 0);
  CHECK(figure(s, "inference_memory_ratio_b32") < 1);
  // At 1 point the lines are there whatever the accuracies.
  CHECK(figure(summary(rows, 0.01), "param_ratio") < 1);
  CHECK(figure(summary(rows, 0.01), "inference_memory_ratio") < 1);
}

TEST_CASE("svd_compress: PatchViT cuts patches as a naive loop does") {
  const bench::PatchViTConfig c{.image = 6, .channels = 2, .patch = 3, .dim = 4, .depth = 1, .heads = 2, .mlp = 8};
  bench::PatchViT vit(c);
  const Tensor x = testing::random_tensor({2, 2, 6, 6}, kFloat32, 5);
  const std::vector<double> xv = testing::values_of(x);
  std::vector<double> expected;  // (B, T = 4, C * P * P = 18)
  for (int64_t b = 0; b < 2; ++b)
    for (int64_t pr = 0; pr < 2; ++pr)
      for (int64_t pc = 0; pc < 2; ++pc)
        for (int64_t ch = 0; ch < 2; ++ch)
          for (int64_t i = 0; i < 3; ++i)
            for (int64_t j = 0; j < 3; ++j)
              expected.push_back(xv[size_t(((b * 2 + ch) * 6 + pr * 3 + i) * 6 + pc * 3 + j)]);
  const Tensor p = vit.patches(x);
  CHECK(p.sizes() == Shape{2, 4, 18});
  testing::check_close(p, expected, 0, 0, "patches");
  CHECK(vit.forward(x).sizes() == Shape{2, 10});
  check_error(
      [&] {
        vit.forward(testing::random_tensor({2, 1, 6, 6}, kFloat32, 6));
      },
      {"PatchViT", "expected input (B, 2, 6, 6)"});
}

TEST_CASE("svd_compress: best_row is the smallest inference memory within the accuracy tolerance") {
  const std::vector<Row> rows = {row("dense", 100, 80, 0.90), row("a", 70, 60, 0.895), row("b", 50, 40, 0.85),
                                 row("c", 90, 70, 0.90), row("same", 100, 50, 0.95)};
  CHECK(best_row(rows, 0.01) == 1);  // b is 5 points down; "same" saves no parameters
  CHECK(best_row(rows, 0.10) == 2);
  CHECK(best_row(rows, 0.001) == 3);  // only c is within 0.1 point
  CHECK(summary(rows, 0.01) ==
        "best_row: a\nparam_ratio: 0.7000\ninference_memory_ratio: 0.7500\ninference_memory_ratio_b32: 0.7500\n");
  const std::vector<Row> worse = {row("dense", 100, 80, 0.90), row("a", 70, 60, 0.80)};
  CHECK(best_row(worse, 0.01) == -1);
  CHECK(summary(worse, 0.01) ==
        "best_row: a (none within 1 points of the dense accuracy: the most accurate compressed row)\n"
        "param_ratio: 0.7000\ninference_memory_ratio: 0.7500\ninference_memory_ratio_b32: 0.7500\n");
  CHECK(summary({row("dense", 100, 80, 0.9), row("same", 100, 60, 0.9)}, 0.01).find("best_row: none") == 0);
  // Untrained rows (vitb16): accuracy is not asked.
  const std::vector<Row> untrained = {row("dense", 100, 80, NAN), row("a", 70, 60, NAN), row("b", 50, 40, NAN)};
  CHECK(best_row(untrained, 0.01) == 2);
  check_error([] { defaults("vit99", kCPU, false); }, {"svd_compress", "unknown model 'vit99'"});
}
