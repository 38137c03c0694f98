// Tensor parallelism (parallel/tensor_parallel.h) on the in-process threads backend, 2 and
// 4 ranks: every layer's output, input gradient and parameter gradients equal the
// single-process model's (nn::Linear, nn::Embedding, cross_entropy, and an encoder layer
// written here from functional ops), f32 to 1e-5 relative; the init equals nn::Linear's.
#include <doctest/doctest.h>

#include <map>
#include <string>

#include "autograd/ops/all.h"
#include "nn/init.h"
#include "nn/layers.h"
#include "nn/linear.h"
#include "parallel/pipeline.h"
#include "parallel/tensor_parallel.h"
#include "parallel/thread_communicator.h"
#include "tensor/factory.h"
#include "tests/cpu/parallel_test_util.h"

using namespace frugal;
using namespace frugal::testing;
using parallel::CommPtr;
using parallel::run_ranks;

namespace {

/// A replicated input leaf for one rank (its own handle, so each rank has its own .grad).
Tensor rank_input(const Tensor& x) {
  Tensor t = x.detach().clone();
  t.requires_grad_();
  return t;
}

/// Rows (dim 0) or columns (dim 1) [r * n / p, (r + 1) * n / p) of a full tensor.
Tensor shard_of(const Tensor& full, int64_t dim, int r, int p) {
  const int64_t n = full.size(dim) / p;
  return full.narrow(dim, r * n, n);
}

}  // namespace

TEST_CASE("tensor parallel: conjugate operators forward and backward") {
  for (int p : {2, 4}) {
    CAPTURE(p);
    const Tensor x = random_tensor({3, 2, 4 * p}, kFloat32, 11);
    const Tensor c = random_tensor({3, 2, 4 * p}, kFloat32, 12);
    PerRank<Results> got(static_cast<size_t>(p));
    run_ranks(p, [&](const CommPtr& comm) {
      const int r = comm->rank();
      Results& out = got[size_t(r)];
      // scatter then gather is the identity; its gradient reaches every rank whole.
      Tensor xi = rank_input(x);
      Tensor y = parallel::gather_from_region(parallel::scatter_to_region(xi, comm), comm);
      sum(mul(y, c)).backward();
      out["roundtrip"] = y.detach();
      out["roundtrip.grad"] = xi.grad();
      // reduce_from_region sums rank-scaled copies; copy_to_region sums the ranks' gradients.
      Tensor xr = rank_input(x);
      Tensor z = parallel::reduce_from_region(mul(parallel::copy_to_region(xr, comm), double(r + 1)), comm);
      sum(mul(z, c)).backward();
      out["reduce"] = z.detach();
      out["copy.grad"] = xr.grad();
    });
    const double ranks_sum = p * (p + 1) / 2.0;
    for (int r = 0; r < p; ++r) {
      const Results& out = got[size_t(r)];
      check_equiv(out.at("roundtrip"), x, "gather(scatter(x))");
      check_equiv(out.at("roundtrip.grad"), c, "its gradient");
      check_equiv(out.at("reduce"), mul(x, ranks_sum), "reduce_from_region");
      // each rank's z = sum_r (r+1) x, so dL/dx on rank r is (r+1) c, summed by copy_to_region's backward
      check_equiv(out.at("copy.grad"), mul(c, ranks_sum), "copy_to_region backward");
    }
  }
}

TEST_CASE("tensor parallel: column and row parallel init equals nn::Linear from the same seed") {
  const int p = 4;
  manual_seed(21);
  nn::Linear col_ref(6, 8);
  manual_seed(22);
  nn::Linear row_ref(8, 6);
  PerRank<Results> got(static_cast<size_t>(p));
  run_ranks(p, [&](const CommPtr& comm) {
    Generator g1(21), g2(22);
    parallel::ColumnParallelLinear col(6, 8, comm, {.generator = &g1});
    parallel::RowParallelLinear row(8, 6, comm, {.generator = &g2});
    got[size_t(comm->rank())] = {
        {"col.w", col.weight}, {"col.b", col.bias}, {"row.w", row.weight}, {"row.b", row.bias}};
  });
  for (int r = 0; r < p; ++r) {
    const Results& out = got[size_t(r)];
    CHECK(values_of(out.at("col.w")) == values_of(shard_of(col_ref.weight, 0, r, p)));
    CHECK(values_of(out.at("col.b")) == values_of(shard_of(col_ref.bias, 0, r, p)));
    CHECK(values_of(out.at("row.w")) == values_of(shard_of(row_ref.weight, 1, r, p)));
    CHECK(values_of(out.at("row.b")) == values_of(row_ref.bias));
  }
}

TEST_CASE("tensor parallel: column-parallel, row-parallel and the TP MLP equal the single-process layers") {
  for (int p : {2, 4}) {
    CAPTURE(p);
    manual_seed(5);
    nn::Linear fc1(6, 8), fc2(8, 6);
    const Tensor x = random_tensor({2, 3, 6}, kFloat32, 31);
    const Tensor c1 = random_tensor({2, 3, 8}, kFloat32, 32);
    const Tensor c2 = random_tensor({2, 3, 6}, kFloat32, 33);
    // references: column alone (loss sum(fc1(x) c1)), row alone (sum(fc2(h) c2)), MLP
    Tensor x1 = rank_input(x);
    sum(mul(fc1.forward(x1), c1)).backward();
    const Tensor ref_col_y = fc1.forward(x).detach(), ref_col_xg = x1.grad();
    const Tensor ref_col_wg = fc1.weight.grad().clone(), ref_col_bg = fc1.bias.grad().clone();
    fc1.zero_grad();
    const Tensor h = random_tensor({2, 3, 8}, kFloat32, 34);
    Tensor h1 = rank_input(h);
    sum(mul(fc2.forward(h1), c2)).backward();
    const Tensor ref_row_y = fc2.forward(h).detach(), ref_row_hg = h1.grad();
    const Tensor ref_row_wg = fc2.weight.grad().clone(), ref_row_bg = fc2.bias.grad().clone();
    fc2.zero_grad();
    Tensor x2 = rank_input(x);
    const Tensor ref_mlp_y = fc2.forward(gelu(fc1.forward(x2)));
    sum(mul(ref_mlp_y, c2)).backward();

    PerRank<Results> got(static_cast<size_t>(p));
    run_ranks(p, [&](const CommPtr& comm) {
      Results& out = got[size_t(comm->rank())];
      parallel::ColumnParallelLinear col(6, 8, comm);
      parallel::RowParallelLinear row(8, 6, comm);
      col.load_full(fc1.weight, fc1.bias);
      row.load_full(fc2.weight, fc2.bias);
      Tensor xi = rank_input(x);
      const Tensor y = col.forward(xi);
      sum(mul(y, c1)).backward();
      out = {{"col.y", y.detach()}, {"col.xg", xi.grad()}, {"col.wg", col.weight.grad()}, {"col.bg", col.bias.grad()}};
      Tensor hi = rank_input(h);
      const Tensor z = row.forward(hi);
      sum(mul(z, c2)).backward();
      out["row.y"] = z.detach(), out["row.hg"] = hi.grad();
      out["row.wg"] = row.weight.grad(), out["row.bg"] = row.bias.grad();
      // the MLP: column without gather, row with input_is_parallel: one all-reduce each way
      parallel::ColumnParallelLinear a(6, 8, comm, {.gather_output = false});
      parallel::RowParallelLinear b(8, 6, comm, {.input_is_parallel = true});
      a.load_full(fc1.weight, fc1.bias);
      b.load_full(fc2.weight, fc2.bias);
      Tensor xm = rank_input(x);
      const Tensor ym = b.forward(gelu(a.forward(xm)));
      sum(mul(ym, c2)).backward();
      out["mlp.y"] = ym.detach(), out["mlp.xg"] = xm.grad();
      out["mlp.aw"] = a.weight.grad(), out["mlp.ab"] = a.bias.grad();
      out["mlp.bw"] = b.weight.grad(), out["mlp.bb"] = b.bias.grad();
    });
    for (int r = 0; r < p; ++r) {
      CAPTURE(r);
      const Results& out = got[size_t(r)];
      check_equiv(out.at("col.y"), ref_col_y, "column output");
      check_equiv(out.at("col.xg"), ref_col_xg, "column input grad");
      check_equiv(out.at("col.wg"), shard_of(ref_col_wg, 0, r, p), "column weight grad");
      check_equiv(out.at("col.bg"), shard_of(ref_col_bg, 0, r, p), "column bias grad");
      check_equiv(out.at("row.y"), ref_row_y, "row output");
      check_equiv(out.at("row.hg"), ref_row_hg, "row input grad");
      check_equiv(out.at("row.wg"), shard_of(ref_row_wg, 1, r, p), "row weight grad");
      check_equiv(out.at("row.bg"), ref_row_bg, "row bias grad");
      check_equiv(out.at("mlp.y"), ref_mlp_y.detach(), "MLP output");
      check_equiv(out.at("mlp.xg"), x2.grad(), "MLP input grad");
      check_equiv(out.at("mlp.aw"), shard_of(fc1.weight.grad(), 0, r, p), "MLP fc1 weight grad");
      check_equiv(out.at("mlp.ab"), shard_of(fc1.bias.grad(), 0, r, p), "MLP fc1 bias grad");
      check_equiv(out.at("mlp.bw"), shard_of(fc2.weight.grad(), 1, r, p), "MLP fc2 weight grad");
      check_equiv(out.at("mlp.bb"), fc2.bias.grad(), "MLP fc2 bias grad");
    }
  }
}

namespace {

// The single-process encoder layer, from functional ops and full nn::Linear weights.
struct RefEncoder {
  int64_t hidden, heads;
  bool pre_norm;
  nn::Linear q, k, v, ao, fi, fo;
  nn::LayerNorm ln1, ln2;
  RefEncoder(int64_t e, int64_t h, int64_t f, bool pre)
      : hidden(e),
        heads(h),
        pre_norm(pre),
        q(e, e),
        k(e, e),
        v(e, e),
        ao(e, e),
        fi(e, f),
        fo(f, e),
        ln1(Shape{e}, {.eps = 1e-12}),
        ln2(Shape{e}, {.eps = 1e-12}) {
    // non-trivial norm parameters, so their gradients and effects are tested
    nn::init::uniform_(ln1.weight, 0.5, 1.5), nn::init::uniform_(ln1.bias, -0.5, 0.5);
    nn::init::uniform_(ln2.weight, 0.5, 1.5), nn::init::uniform_(ln2.bias, -0.5, 0.5);
  }
  Tensor attention(const Tensor& x, const Tensor& mask) {
    const int64_t B = x.size(0), T = x.size(1), D = hidden / heads;
    auto split = [&](const Tensor& y) { return y.unflatten(-1, {heads, D}).transpose(1, 2); };
    const Tensor ctx =
        scaled_dot_product_attention(split(q.forward(x)), split(k.forward(x)), split(v.forward(x)), mask);
    return ao.forward(ctx.transpose(1, 2).reshape({B, T, hidden}));
  }
  Tensor mlp(const Tensor& x) { return fo.forward(gelu(fi.forward(x))); }
  Tensor forward(const Tensor& x, const Tensor& mask) {
    if (pre_norm) {
      const Tensor h = add(x, attention(ln1.forward(x), mask));
      return add(h, mlp(ln2.forward(h)));
    }
    const Tensor h = ln1.forward(add(x, attention(x, mask)));
    return ln2.forward(add(h, mlp(h)));
  }
};

/// Copies `ref`'s weights into `layer` (each rank takes its shard).
void load_from(parallel::TensorParallelEncoderLayer& layer, RefEncoder& ref) {
  layer.query->load_full(ref.q.weight, ref.q.bias);
  layer.key->load_full(ref.k.weight, ref.k.bias);
  layer.value->load_full(ref.v.weight, ref.v.bias);
  layer.attention_output->load_full(ref.ao.weight, ref.ao.bias);
  layer.intermediate->load_full(ref.fi.weight, ref.fi.bias);
  layer.output->load_full(ref.fo.weight, ref.fo.bias);
  layer.attention_norm->weight.detach().copy_(ref.ln1.weight);
  layer.attention_norm->bias.detach().copy_(ref.ln1.bias);
  layer.output_norm->weight.detach().copy_(ref.ln2.weight);
  layer.output_norm->bias.detach().copy_(ref.ln2.bias);
}

}  // namespace

TEST_CASE("tensor parallel: encoder layer (attention heads split) equals the single-process layer") {
  const int64_t E = 16, H = 4, F = 32, B = 2, T = 5;
  for (bool pre_norm : {false, true}) {
    for (int p : {2, 4}) {
      CAPTURE(pre_norm);
      CAPTURE(p);
      manual_seed(40 + p);
      RefEncoder ref(E, H, F, pre_norm);
      const Tensor x = random_tensor({B, T, E}, kFloat32, 41);
      const Tensor c = random_tensor({B, T, E}, kFloat32, 42);
      // key padding: batch 1 ignores its last two keys (bool, true = attend)
      Tensor mask = ones({B, 1, 1, T}, kBool);
      mask.narrow(0, 1, 1).narrow(3, T - 2, 2).copy_(zeros({1, 1, 1, 2}, kBool));
      Tensor xr = rank_input(x);
      const Tensor ref_y = ref.forward(xr, mask);
      sum(mul(ref_y, c)).backward();

      PerRank<Results> got(static_cast<size_t>(p));
      run_ranks(p, [&](const CommPtr& comm) {
        Results& out = got[size_t(comm->rank())];
        parallel::TensorParallelEncoderLayer layer(E, H, F, comm, {.pre_norm = pre_norm});
        load_from(layer, ref);
        Tensor xi = rank_input(x);
        const Tensor y = layer.forward(xi, mask);
        sum(mul(y, c)).backward();
        out["y"] = y.detach(), out["xg"] = xi.grad();
        for (const auto& [name, t] : layer.named_parameters()) out[name] = t.grad();
      });
      for (int r = 0; r < p; ++r) {
        CAPTURE(r);
        const Results& out = got[size_t(r)];
        check_equiv(out.at("y"), ref_y.detach(), "output");
        check_equiv(out.at("xg"), xr.grad(), "input grad");
        const std::pair<const char*, nn::Linear*> columns[] = {
            {"query", &ref.q}, {"key", &ref.k}, {"value", &ref.v}, {"intermediate", &ref.fi}};
        for (const auto& [name, lin] : columns) {
          check_equiv(out.at(std::string(name) + ".weight"), shard_of(lin->weight.grad(), 0, r, p), name);
          if (lin == &ref.k) {
            // softmax is invariant to the key bias: its gradient is 0 up to rounding on both sides
            for (double g : values_of(out.at("key.bias"))) CHECK(std::fabs(g) < 1e-6);
          } else {
            check_equiv(out.at(std::string(name) + ".bias"), shard_of(lin->bias.grad(), 0, r, p), name);
          }
        }
        check_equiv(out.at("attention_output.weight"), shard_of(ref.ao.weight.grad(), 1, r, p), "attention_output");
        check_equiv(out.at("attention_output.bias"), ref.ao.bias.grad(), "attention_output bias");
        check_equiv(out.at("output.weight"), shard_of(ref.fo.weight.grad(), 1, r, p), "output");
        check_equiv(out.at("output.bias"), ref.fo.bias.grad(), "output bias");
        check_equiv(out.at("attention_norm.weight"), ref.ln1.weight.grad(), "attention_norm weight");
        check_equiv(out.at("attention_norm.bias"), ref.ln1.bias.grad(), "attention_norm bias");
        check_equiv(out.at("output_norm.weight"), ref.ln2.weight.grad(), "output_norm weight");
        check_equiv(out.at("output_norm.bias"), ref.ln2.bias.grad(), "output_norm bias");
      }
    }
  }
}

TEST_CASE("tensor parallel: vocab-parallel embedding and cross entropy equal embedding + linear + cross_entropy") {
  const int64_t V = 12, D = 6, N = 7;
  for (int p : {2, 4}) {
    CAPTURE(p);
    manual_seed(50);
    nn::Embedding emb(V, D);
    nn::Linear head(D, V, {.bias = false});
    const Tensor tokens = from_vector(std::vector<int64_t>{0, 11, 5, 6, 3, 9, 2}, {N});
    // one ignored target; the others spread over every rank's vocabulary slice
    const Tensor target = from_vector(std::vector<int64_t>{1, 11, -100, 6, 0, 8, 4}, {N});
    const Tensor ref_loss = cross_entropy(head.forward(emb.forward(tokens)), target);
    ref_loss.backward();

    PerRank<Results> got(static_cast<size_t>(p));
    run_ranks(p, [&](const CommPtr& comm) {
      Results& out = got[size_t(comm->rank())];
      parallel::VocabParallelEmbedding pemb(V, D, comm);
      parallel::ColumnParallelLinear phead(D, V, comm, {.bias = false, .gather_output = false});
      pemb.load_full(emb.weight);
      phead.load_full(head.weight);
      const Tensor h = pemb.forward(tokens);
      // An index no rank owns is an error on every rank, not a silent zero row.
      check_error(
          [&] {
            pemb.forward(from_vector(std::vector<int64_t>{2, V}, {2}));
          },
          {"VocabParallelEmbedding", "out of range", std::to_string(V)});
      const Tensor loss = parallel::vocab_parallel_cross_entropy(phead.forward(h), target, comm);
      loss.backward();
      out = {{"h", h.detach()}, {"loss", loss.detach()}, {"emb", pemb.weight.grad()}, {"head", phead.weight.grad()}};
    });
    for (int r = 0; r < p; ++r) {
      CAPTURE(r);
      const Results& out = got[size_t(r)];
      check_equiv(out.at("h"), emb.forward(tokens).detach(), "embedding output");
      check_equiv(out.at("loss"), ref_loss.detach(), "loss");
      check_equiv(out.at("emb"), shard_of(emb.weight.grad(), 0, r, p), "embedding grad");
      check_equiv(out.at("head"), shard_of(head.weight.grad(), 0, r, p), "head grad");
    }
  }
}

TEST_CASE("tensor parallel: a null communicator gives the plain layers; bad shapes throw naming the layer") {
  manual_seed(60);
  nn::Linear ref(4, 6);
  parallel::ColumnParallelLinear col(4, 6, nullptr);
  col.load_full(ref.weight, ref.bias);
  const Tensor x = random_tensor({3, 4}, kFloat32, 61);
  check_equiv(col.forward(x), ref.forward(x), "unsplit column");
  run_ranks(2, [&](const CommPtr& comm) {
    check_error([&] { parallel::ColumnParallelLinear(4, 5, comm); }, {"ColumnParallelLinear", "out_features", "5"});
    check_error([&] { parallel::RowParallelLinear(3, 5, comm); }, {"RowParallelLinear", "in_features", "3"});
    parallel::ColumnParallelLinear ok(4, 6, comm);
    check_error([&] { ok.forward(ones({2, 3})); }, {"ColumnParallelLinear", "(..., 4)"});
    check_error(
        [&] {
          parallel::vocab_parallel_cross_entropy(ones({2, 3}), ones({2}), comm);
        },
        {"vocab_parallel_cross_entropy", "int64"});
  });
}

namespace {

// An encoder layer as a Sequential element (a pipeline stage is a Sequential).
struct EncoderBlock : nn::UnaryModule {
  std::shared_ptr<parallel::TensorParallelEncoderLayer> layer;
  explicit EncoderBlock(std::shared_ptr<parallel::TensorParallelEncoderLayer> l)
      : layer(register_module("layer", std::move(l))) {}
  Tensor forward(const Tensor& x) override { return layer->forward(x); }
  std::string type_name() const override { return "EncoderBlock"; }
};

}  // namespace

TEST_CASE("tensor x pipeline grid (2 x 2, make_groups): two TP encoder layers on two 1F1B stages") {
  const int64_t E = 8, H = 2, F = 16, B = 4, T = 3;
  manual_seed(70);
  RefEncoder ref0(E, H, F, false), ref1(E, H, F, false);
  const Tensor x = random_tensor({B, T, E}, kFloat32, 71), y = random_tensor({B, T, E}, kFloat32, 72);
  const Tensor ref_loss = mse_loss(ref1.forward(ref0.forward(x, Tensor()), Tensor()), y);
  ref_loss.backward();
  PerRank<Results> got(4);
  PerRank<double> losses(4);
  run_ranks(4, [&](const CommPtr& world) {
    const parallel::ParallelGroups g = parallel::make_groups(world, /*tp=*/2, /*pp=*/2, /*dp=*/1);
    auto layer = std::make_shared<parallel::TensorParallelEncoderLayer>(E, H, F, g.tensor);
    load_from(*layer, g.pp_rank == 0 ? ref0 : ref1);
    auto stage = std::make_shared<nn::Sequential>();
    stage->push_back(std::make_shared<EncoderBlock>(layer));
    parallel::PipelineStage pipe(stage, g.pipeline, {.schedule = parallel::Schedule::OneFOneB, .micro_batches = 2});
    const parallel::PipelineStats s = pipe.train_step(pipe.is_first() ? x : Tensor(), pipe.is_last() ? y : Tensor(),
                                                      [](const Tensor& o, const Tensor& t) { return mse_loss(o, t); });
    losses[size_t(world->rank())] = s.loss;
    for (const auto& [name, t] : layer->named_parameters()) got[size_t(world->rank())][name] = t.grad();
  });
  for (int r = 0; r < 4; ++r) {
    CAPTURE(r);
    const int tp = r % 2, pp = r / 2;
    RefEncoder& ref = pp == 0 ? ref0 : ref1;
    const Results& out = got[size_t(r)];
    CHECK(losses[size_t(r)] == doctest::Approx(ref_loss.item<float>()).epsilon(1e-5));
    check_equiv(out.at("query.weight"), shard_of(ref.q.weight.grad(), 0, tp, 2), "query");
    check_equiv(out.at("value.bias"), shard_of(ref.v.bias.grad(), 0, tp, 2), "value bias");
    check_equiv(out.at("attention_output.weight"), shard_of(ref.ao.weight.grad(), 1, tp, 2), "attention_output");
    check_equiv(out.at("intermediate.weight"), shard_of(ref.fi.weight.grad(), 0, tp, 2), "intermediate");
    check_equiv(out.at("output.weight"), shard_of(ref.fo.weight.grad(), 1, tp, 2), "output");
    check_equiv(out.at("output.bias"), ref.fo.bias.grad(), "output bias");
    check_equiv(out.at("output_norm.weight"), ref.ln2.weight.grad(), "output_norm");
  }
}
