// Tensor-parallel operators and layers (Megatron-LM).
//
// Note [Tensor-parallel regions]
// Inside a tensor-parallel region each rank holds a slice of the activations; outside it,
// every rank holds the same full tensor. Two conjugate operators cross the border:
//   f = copy_to_region:     forward identity,   backward all-reduce(sum)
//   g = reduce_from_region: forward all-reduce, backward identity
// An MLP  Y = gelu(X A) B  with A split by columns and B by rows becomes
//   Y = g( gelu( f(X) A_r ) B_r ):
// f's backward sums the ranks' partial dL/dX (each rank saw only its columns of A), g's
// forward sums the ranks' partial products. Attention is the same with heads in place of
// A's columns: query/key/value are column-parallel (heads / size heads per rank, each
// rank attends with its own heads), the output projection row-parallel. Each half of an
// encoder layer therefore costs one all-reduce forward (g) and one backward (f). Why the
// backwards are right: the loss is computed identically on every rank, so each rank's
// gradient of a replicated tensor is already the full gradient (g's backward is the
// identity), while a rank's gradient with respect to the replicated input of f is only
// its own slice's contribution (f's backward sums them).
// gather_from_region / scatter_to_region are the other pair: split along the last dim.
//
// Note [Tensor-parallel dropout]
// Dropout masks come from a counter-based Philox stream (Note [Dropout mask from counters]):
// a generator's (seed, offset) alone fixes the mask. Outside a region every rank holds the
// same activation and must keep holding the same one, so its dropout draws from
// TensorParallelRng::replicated, seeded alike on every rank and advanced alike because every
// rank runs the same replicated dropouts in the same order: the masks are equal, the
// outputs stay bitwise replicated, and the replicated parameters' gradients stay equal.
// Inside a region each rank holds different data (its own heads' attention probabilities,
// its columns of an MLP activation); one stream there would give head h on rank 0 the
// mask of head h on rank 1, so each rank draws from its own stream, seeded
// seed + 2718 + tp_rank as Megatron-LM's model_parallel_cuda_manual_seed does. The
// process-wide default generator is no substitute: thread ranks share it, and the order
// in which they would draw from it is a race. Eval mode and p = 0 draw nothing.
#include "parallel/tensor_parallel.h"

#include <cmath>
#include <limits>

#include "autograd/function.h"
#include "autograd/ops/attention.h"
#include "autograd/ops/binary.h"
#include "autograd/ops/dropout.h"
#include "autograd/ops/index.h"
#include "autograd/ops/join.h"
#include "autograd/ops/matmul.h"
#include "autograd/ops/unary.h"
#include "nn/attention.h"
#include "nn/init.h"
#include "tensor/factory.h"
#include "tensor/ops/binary.h"
#include "tensor/ops/index.h"
#include "tensor/ops/join.h"
#include "tensor/ops/reduce.h"
#include "tensor/ops/unary.h"

namespace frugal::parallel {

using autograd::make_node;
using autograd::Node;
using autograd::SavedTensor;
using autograd::TensorList;
using autograd::wants_grad;

int tp_rank(const CommPtr& comm) { return comm ? comm->rank() : 0; }
int tp_size(const CommPtr& comm) { return comm ? comm->size() : 1; }

namespace {

bool trivial(const CommPtr& comm) { return tp_size(comm) == 1; }

/// A fresh contiguous copy of x, all-reduced (sum) across the ranks.
Tensor all_reduced(const Tensor& x, const CommPtr& comm) {
  Tensor r = x.clone();
  comm->all_reduce(r, ReduceOp::Sum)->wait();
  return r;
}

/// x (..., n) on every rank -> (..., size * n), rank r's values at [r * n, (r + 1) * n).
Tensor all_gather_last_dim(const Tensor& x, const CommPtr& comm) {
  const int64_t p = comm->size(), n = x.size(-1);
  const Tensor in = x.contiguous();
  Tensor buf = empty({p, in.numel() / n, n}, in.options());  // (p, rows, n)
  comm->all_gather(in, buf)->wait();
  Shape out_shape = x.sizes();
  out_shape.back() = p * n;
  return buf.permute({1, 0, 2}).reshape(out_shape);
}

/// This rank's slice [rank * n, (rank + 1) * n) of x's last dim (size * n), contiguous.
Tensor local_slice_last_dim(const Tensor& x, const CommPtr& comm, const char* op) {
  const int64_t p = comm->size();
  FRUGAL_CHECK(x.dim() >= 1 && x.size(-1) % p == 0, op, ": last dim of ", x.describe(),
               " must be divisible by the tensor-parallel size ", p);
  const int64_t n = x.size(-1) / p;
  return x.narrow(-1, comm->rank() * n, n).clone();
}

// out = x;  grad_x = all_reduce(g)
struct CopyToRegionBackward final : Node {
  CommPtr comm;
  std::string name() const override { return "CopyToRegionBackward"; }
  TensorList apply(TensorList&& grads) override { return {all_reduced(grads[0], comm)}; }
};

// out = all_reduce(x);  grad_x = g
struct ReduceFromRegionBackward final : Node {
  std::string name() const override { return "ReduceFromRegionBackward"; }
  TensorList apply(TensorList&& grads) override { return {std::move(grads[0])}; }
};

// out = all_gather(x) along the last dim;  grad_x = this rank's slice of g
struct GatherFromRegionBackward final : Node {
  CommPtr comm;
  std::string name() const override { return "GatherFromRegionBackward"; }
  TensorList apply(TensorList&& grads) override { return {local_slice_last_dim(grads[0], comm, name().c_str())}; }
};

// out = this rank's slice of x along the last dim;  grad_x = all_gather(g)
struct ScatterToRegionBackward final : Node {
  CommPtr comm;
  std::string name() const override { return "ScatterToRegionBackward"; }
  TensorList apply(TensorList&& grads) override { return {all_gather_last_dim(grads[0], comm)}; }
};

}  // namespace

Tensor copy_to_region(const Tensor& x, const CommPtr& comm) {
  if (trivial(comm)) return x;
  // A fresh handle on the same data, so the node can be recorded as its producer.
  Tensor out = autograd::raw([&] { return x.detach(); });
  if (auto node = make_node<CopyToRegionBackward>({x})) {
    node->comm = comm;
    autograd::record(node, {out});
  }
  return out;
}

Tensor reduce_from_region(const Tensor& x, const CommPtr& comm) {
  if (trivial(comm)) return x;
  Tensor out = autograd::raw([&] { return all_reduced(x, comm); });
  if (auto node = make_node<ReduceFromRegionBackward>({x})) autograd::record(node, {out});
  return out;
}

Tensor gather_from_region(const Tensor& x, const CommPtr& comm) {
  if (trivial(comm)) return x;
  FRUGAL_CHECK(x.dim() >= 1, "gather_from_region: needs at least 1 dim, got ", x.describe());
  Tensor out = autograd::raw([&] { return all_gather_last_dim(x, comm); });
  if (auto node = make_node<GatherFromRegionBackward>({x})) {
    node->comm = comm;
    autograd::record(node, {out});
  }
  return out;
}

Tensor scatter_to_region(const Tensor& x, const CommPtr& comm) {
  if (trivial(comm)) return x;
  Tensor out = autograd::raw([&] { return local_slice_last_dim(x, comm, "scatter_to_region"); });
  if (auto node = make_node<ScatterToRegionBackward>({x})) {
    node->comm = comm;
    autograd::record(node, {out});
  }
  return out;
}

// ---- layers -----------------------------------------------------------------------------

namespace {

Device device_of(const CommPtr& comm) { return comm ? comm->device() : kCPU; }

/// nn::Linear's initialisation of the full (out, in) weight and (out) bias, drawn in
/// the same order from `gen`, so every rank sees the same full tensors.
std::pair<Tensor, Tensor> linear_init(int64_t in, int64_t out, bool bias, Generator* gen) {
  Tensor w = empty({out, in}), b;
  nn::init::kaiming_uniform_(w, std::sqrt(5.0), nn::init::FanMode::FanIn, gen);
  if (bias) {
    b = empty({out});
    const double bound = 1.0 / std::sqrt(double(in));
    nn::init::uniform_(b, -bound, bound, gen);
  }
  return {w, b};
}

int64_t split_size(int64_t n, const CommPtr& comm, const char* op, const char* what) {
  FRUGAL_CHECK(n > 0 && n % tp_size(comm) == 0, op, ": ", what, " (", n, ") must be positive and divisible by the ",
               "tensor-parallel size ", tp_size(comm));
  return n / tp_size(comm);
}

/// A compact copy of full.narrow(dim, rank * n, n) on `device`.
Tensor shard(const Tensor& full, int64_t dim, int64_t n, const CommPtr& comm) {
  return full.narrow(dim, tp_rank(comm) * n, n).clone().to(device_of(comm));
}

void copy_shard(const Tensor& dst, const Tensor& full, int64_t dim, int64_t n, const CommPtr& comm, const char* op,
                const Shape& want) {
  FRUGAL_CHECK(full.sizes() == want, op, ".load_full: expected a full tensor ", shape_str(want), ", got ",
               full.describe());
  autograd::NoGradGuard no_grad;
  dst.detach().copy_(full.narrow(dim, tp_rank(comm) * n, n));
}

}  // namespace

ColumnParallelLinear::ColumnParallelLinear(int64_t in, int64_t out, CommPtr comm, ColumnParallelOptions options)
    : in_features(in),
      out_features(out),
      out_per_rank(split_size(out, comm, "ColumnParallelLinear", "out_features")),
      gather_output(options.gather_output),
      comm_(std::move(comm)) {
  FRUGAL_CHECK(in > 0, "ColumnParallelLinear: in_features must be positive, got ", in);
  auto [w, b] = linear_init(in, out, options.bias, options.generator);
  weight = register_parameter("weight", shard(w, 0, out_per_rank, comm_));
  if (options.bias) bias = register_parameter("bias", shard(b, 0, out_per_rank, comm_));
}

Tensor ColumnParallelLinear::forward_local(const Tensor& x) const {
  FRUGAL_CHECK(x.dim() >= 1 && x.size(-1) == in_features, "ColumnParallelLinear: expected input (..., ", in_features,
               "), got ", x.describe());
  return linear(x, weight, bias);
}

Tensor ColumnParallelLinear::forward(const Tensor& x) {
  core::ModuleScope scope(this);  // Note [Module attribution]
  Tensor y = forward_local(copy_to_region(x, comm_));
  return gather_output ? gather_from_region(y, comm_) : y;
}

void ColumnParallelLinear::load_full(const Tensor& w, const Tensor& b) {
  copy_shard(weight, w, 0, out_per_rank, comm_, "ColumnParallelLinear", {out_features, in_features});
  if (bias.defined()) {
    FRUGAL_CHECK(b.defined(), "ColumnParallelLinear.load_full: the layer has a bias but none was given");
    copy_shard(bias, b, 0, out_per_rank, comm_, "ColumnParallelLinear", {out_features});
  }
}

std::string ColumnParallelLinear::extra_repr() const {
  return "in_features=" + std::to_string(in_features) + ", out_features=" + std::to_string(out_features) +
         ", tp_size=" + std::to_string(tp_size(comm_)) + ", gather_output=" + (gather_output ? "true" : "false");
}

RowParallelLinear::RowParallelLinear(int64_t in, int64_t out, CommPtr comm, RowParallelOptions options)
    : in_features(in),
      out_features(out),
      in_per_rank(split_size(in, comm, "RowParallelLinear", "in_features")),
      input_is_parallel(options.input_is_parallel),
      comm_(std::move(comm)) {
  FRUGAL_CHECK(out > 0, "RowParallelLinear: out_features must be positive, got ", out);
  auto [w, b] = linear_init(in, out, options.bias, options.generator);
  weight = register_parameter("weight", shard(w, 1, in_per_rank, comm_));
  if (options.bias) bias = register_parameter("bias", b.to(device_of(comm_)));
}

Tensor RowParallelLinear::forward(const Tensor& x) {
  core::ModuleScope scope(this);  // Note [Module attribution]
  // Checked before the scatter, so that a replicated input of the wrong width is named here.
  const int64_t want = input_is_parallel ? in_per_rank : in_features;
  FRUGAL_CHECK(x.dim() >= 1 && x.size(-1) == want, "RowParallelLinear: expected input (..., ", want, "), got ",
               x.describe(), " (in_features ", in_features, " over tensor-parallel size ", tp_size(comm_),
               input_is_parallel ? ", input_is_parallel" : "", ")");
  const Tensor xp = input_is_parallel ? x : scatter_to_region(x, comm_);
  Tensor y = reduce_from_region(linear(xp, weight), comm_);
  return bias.defined() ? add(y, bias) : y;  // after the reduce: added once, not size times
}

void RowParallelLinear::load_full(const Tensor& w, const Tensor& b) {
  copy_shard(weight, w, 1, in_per_rank, comm_, "RowParallelLinear", {out_features, in_features});
  if (bias.defined()) {
    FRUGAL_CHECK(b.defined(), "RowParallelLinear.load_full: the layer has a bias but none was given");
    copy_shard(bias, b, 0, out_features, nullptr, "RowParallelLinear", {out_features});
  }
}

std::string RowParallelLinear::extra_repr() const {
  return "in_features=" + std::to_string(in_features) + ", out_features=" + std::to_string(out_features) +
         ", tp_size=" + std::to_string(tp_size(comm_)) +
         ", input_is_parallel=" + (input_is_parallel ? "true" : "false");
}

VocabParallelEmbedding::VocabParallelEmbedding(int64_t num, int64_t dim, CommPtr comm, Generator* gen)
    : num_embeddings(num),
      embedding_dim(dim),
      vocab_start(tp_rank(comm) * split_size(num, comm, "VocabParallelEmbedding", "num_embeddings")),
      vocab_end(vocab_start + num / tp_size(comm)),
      comm_(std::move(comm)) {
  FRUGAL_CHECK(dim > 0, "VocabParallelEmbedding: embedding_dim must be positive, got ", dim);
  Tensor full = empty({num, dim});
  nn::init::normal_(full, 0.0, 1.0, gen);
  weight = register_parameter("weight", shard(full, 0, vocab_end - vocab_start, comm_));
}

Tensor VocabParallelEmbedding::forward(const Tensor& indices) {
  core::ModuleScope scope(this);  // Note [Module attribution]
  FRUGAL_CHECK(indices.dtype() == kInt64 || indices.dtype() == kInt32,
               "VocabParallelEmbedding: indices must be int64 or int32, got ", indices.describe());
  // An index no rank owns would embed as zeros on every rank: refuse it, as nn::Embedding
  // does (checked on the device; CUDA reports it at the next synchronization).
  ops::check_index_range(indices, num_embeddings,
                         [n = num_embeddings, desc = indices.describe()](int64_t value, int64_t position) {
                           return detail::str_cat("VocabParallelEmbedding: index ", value, " is out of range [0, ", n,
                                                  ") at linear position ", position, " of indices ", desc);
                         });
  // Indices this rank does not own look up row 0 and are zeroed before the all-reduce.
  Tensor not_mine, local;
  autograd::raw([&] {
    not_mine = ops::logical_or(ops::lt(indices, double(vocab_start)), ops::ge(indices, double(vocab_end)));
    local = ops::where(not_mine, zeros_like(indices), ops::sub(indices, double(vocab_start)));
    return 0;
  });
  const bool pad_is_mine = padding_idx >= vocab_start && padding_idx < vocab_end;
  Tensor out = embedding(weight, local, pad_is_mine ? std::optional<int64_t>(padding_idx - vocab_start) : std::nullopt);
  if (!trivial(comm_)) out = masked_fill(out, not_mine.unsqueeze(-1), 0.0);
  return reduce_from_region(out, comm_);
}

void VocabParallelEmbedding::load_full(const Tensor& w) {
  copy_shard(weight, w, 0, vocab_end - vocab_start, comm_, "VocabParallelEmbedding", {num_embeddings, embedding_dim});
}

std::string VocabParallelEmbedding::extra_repr() const {
  return std::to_string(num_embeddings) + ", " + std::to_string(embedding_dim) +
         ", tp_size=" + std::to_string(tp_size(comm_));
}

// ---- vocabulary-parallel cross entropy ------------------------------------------------

namespace {

// loss = sum_i valid_i * (log sum_j exp(z_ij - m_i) - (z_{i,t_i} - m_i)) / count, the sum
// over j and the target logit gathered from all ranks' slices.
// grad_z (this rank's slice) = (softmax(z) - onehot(t)) * valid / count * g.
struct VocabParallelCrossEntropyBackward final : Node {
  SavedTensor softmax{this}, local_target{this}, hit{this}, weight{this};  // (N, Vl), (N, 1) int64, (N, 1), (N, 1)
  Shape logits_sizes;
  std::string name() const override { return "VocabParallelCrossEntropyBackward"; }
  TensorList apply(TensorList&& grads) override {
    const Tensor w = ops::mul(weight.unpack(name()), grads[0]);  // (N, 1): valid / count * g
    Tensor g = ops::mul(softmax.unpack(name()), w);
    g = ops::scatter_add(g, 1, local_target.unpack(name()), ops::neg(ops::mul(hit.unpack(name()), w)));
    return {g.reshape(logits_sizes)};
  }
};

}  // namespace

Tensor vocab_parallel_cross_entropy(const Tensor& local_logits, const Tensor& target, const CommPtr& comm,
                                    int64_t ignore_index) {
  constexpr const char* kOp = "vocab_parallel_cross_entropy";
  FRUGAL_CHECK(local_logits.dim() >= 1 && local_logits.is_floating_point(), kOp,
               ": logits must be floating with a vocabulary dim, got ", local_logits.describe());
  FRUGAL_CHECK(target.dtype() == kInt64, kOp, ": target must be int64, got ", target.describe());
  Shape lead = local_logits.sizes();
  const int64_t vl = lead.back();
  lead.pop_back();
  FRUGAL_CHECK(target.sizes() == lead, kOp, ": target ", target.describe(), " must have the logits' leading shape ",
               shape_str(lead), " (logits ", local_logits.describe(), ")");
  check_same_device(kOp, local_logits, target);
  const DType dt = local_logits.dtype();
  const int64_t start = tp_rank(comm) * vl;
  // A target no rank owns would add nothing to the target logit anywhere: a finite, wrong
  // loss. Refuse it, as cross_entropy does (checked on the device, deferred on CUDA; the
  // target is replicated, so every rank checks the same values and all throw together).
  const int64_t vocab = vl * tp_size(comm);
  const Tensor checked_target =
      autograd::raw([&] { return ops::where(ops::eq(target, double(ignore_index)), zeros_like(target), target); });
  ops::check_index_range(
      checked_target, vocab, [vocab, ignore_index, desc = target.describe()](int64_t value, int64_t position) {
        return detail::str_cat("vocab_parallel_cross_entropy: target ", value, " is out of range for ", vocab,
                               " classes (valid range [0, ", vocab, ") or ignore_index ", ignore_index,
                               ") at linear position ", position, " of target ", desc);
      });
  auto reduce = [&](const Tensor& t, ReduceOp op) {
    if (!trivial(comm)) comm->all_reduce(t, op)->wait();
  };
  Tensor softmax, local_target, hit, weight;
  Tensor loss = autograd::raw([&] {
    const Tensor z = local_logits.reshape({-1, vl});  // (N, Vl)
    const Tensor t = target.reshape({-1, 1});         // (N, 1)
    Tensor m = ops::amax(z, {1}, true);               // (N, 1): the global max, for stability only
    reduce(m, ReduceOp::Max);
    const Tensor shifted = ops::sub(z, m);
    const Tensor e = ops::exp(shifted);
    Tensor sum_exp = ops::sum(e, {1}, true);
    reduce(sum_exp, ReduceOp::Sum);
    const Tensor mine = ops::logical_and(ops::ge(t, double(start)), ops::lt(t, double(start + vl)));
    local_target = ops::where(mine, ops::sub(t, double(start)), zeros_like(t));
    hit = mine.to(dt);
    Tensor target_logit = ops::mul(ops::gather(shifted, 1, local_target), hit);  // (N, 1), zero off this rank
    reduce(target_logit, ReduceOp::Sum);
    const Tensor valid = ops::ne(t, double(ignore_index)).to(dt);
    const Tensor count = ops::sum(valid);
    // Every target ignored: the loss is 0 / 0 (NaN, as cross_entropy's) but the gradient is
    // zero, as cross_entropy's, not NaN (which would poison every gradient behind it).
    weight = ops::div(valid, ops::clamp(count, 1.0, std::numeric_limits<double>::infinity()));
    softmax = ops::div(e, sum_exp);
    const Tensor per_row = ops::mul(ops::sub(ops::log(sum_exp), target_logit), valid);
    return ops::div(ops::sum(per_row), count);
  });
  if (auto node = make_node<VocabParallelCrossEntropyBackward>({local_logits})) {
    node->softmax = softmax;
    node->local_target = local_target;
    node->hit = hit;
    node->weight = weight;
    node->logits_sizes = local_logits.sizes();
    autograd::record(node, {loss});
  }
  return loss;
}

// ---- dropout and the encoder layer ------------------------------------------------------------

TensorParallelRng::TensorParallelRng(uint64_t seed, const CommPtr& comm)
    : replicated(seed), split(seed + 2718 + uint64_t(tp_rank(comm))) {}

Tensor TensorParallelDropout::replicated(const Tensor& x, bool training) const {
  return frugal::dropout(x, hidden, training, &rng->replicated);
}

Tensor TensorParallelDropout::split(const Tensor& x, bool training) const {
  return frugal::dropout(x, hidden, training, &rng->split);
}

Tensor TensorParallelDropout::attention_over_heads(const Tensor& q, const Tensor& k, const Tensor& v,
                                                   const Tensor& attn_mask, std::optional<double> scale,
                                                   bool training) const {
  return scaled_dot_product_attention(q, k, v, attn_mask, false, training ? attention : 0.0, scale, &rng->split);
}

TensorParallelEncoderLayer::TensorParallelEncoderLayer(int64_t hidden_, int64_t heads_, int64_t inter, CommPtr comm,
                                                       TensorParallelEncoderOptions o)
    : hidden(hidden_),
      heads(heads_),
      heads_per_rank(split_size(heads_, comm, "TensorParallelEncoderLayer", "heads")),
      pre_norm(o.pre_norm),
      gelu_tanh(o.gelu_tanh),
      dropout{o.hidden_dropout, o.attention_dropout,
              o.rng ? o.rng : std::make_shared<TensorParallelRng>(o.dropout_seed, comm)},
      comm_(std::move(comm)) {
  FRUGAL_CHECK(hidden > 0 && hidden % heads == 0, "TensorParallelEncoderLayer: hidden (", hidden,
               ") must be a positive multiple of heads (", heads, ")");
  for (double p : {o.hidden_dropout, o.attention_dropout})
    FRUGAL_CHECK(p >= 0.0 && p < 1.0, "TensorParallelEncoderLayer: dropout probabilities must be in [0, 1), got ",
                 "hidden_dropout = ", o.hidden_dropout, " and attention_dropout = ", o.attention_dropout);
  const ColumnParallelOptions column{.bias = true, .gather_output = false, .generator = o.generator};
  const RowParallelOptions row{.bias = true, .input_is_parallel = true, .generator = o.generator};
  const nn::LayerNormOptions norm{.eps = o.layer_norm_eps};
  const Device device = device_of(comm_);
  query = register_module("query", std::make_shared<ColumnParallelLinear>(hidden, hidden, comm_, column));
  key = register_module("key", std::make_shared<ColumnParallelLinear>(hidden, hidden, comm_, column));
  value = register_module("value", std::make_shared<ColumnParallelLinear>(hidden, hidden, comm_, column));
  attention_output =
      register_module("attention_output", std::make_shared<RowParallelLinear>(hidden, hidden, comm_, row));
  attention_norm = register_module("attention_norm", std::make_shared<nn::LayerNorm>(Shape{hidden}, norm));
  intermediate = register_module("intermediate", std::make_shared<ColumnParallelLinear>(hidden, inter, comm_, column));
  output = register_module("output", std::make_shared<RowParallelLinear>(inter, hidden, comm_, row));
  output_norm = register_module("output_norm", std::make_shared<nn::LayerNorm>(Shape{hidden}, norm));
  attention_norm->to(device);
  output_norm->to(device);
}

Tensor TensorParallelEncoderLayer::attention(const Tensor& h, const Tensor& attn_mask) {
  const Tensor hp = copy_to_region(h, comm_);  // one backward all-reduce for q, k and v together
  const Tensor q = nn::split_heads(query->forward_local(hp), heads_per_rank);  // (B, H / size, T, D)
  const Tensor k = nn::split_heads(key->forward_local(hp), heads_per_rank);
  const Tensor v = nn::split_heads(value->forward_local(hp), heads_per_rank);
  const Tensor ctx = dropout.attention_over_heads(q, k, v, attn_mask, {}, is_training());
  const Tensor out = attention_output->forward(nn::merge_heads(ctx));
  return dropout.replicated(out, is_training());
}

Tensor TensorParallelEncoderLayer::mlp(const Tensor& h) {
  const Tensor u = intermediate->forward_local(copy_to_region(h, comm_));
  Tensor a = gelu_tanh ? frugal::gelu_tanh(u) : frugal::gelu(u);
  if (pre_norm) a = dropout.split(a, is_training());  // torchvision's mlp.2, on this rank's columns
  return dropout.replicated(output->forward(a), is_training());
}

Tensor TensorParallelEncoderLayer::forward(const Tensor& x, const Tensor& attn_mask) {
  FRUGAL_CHECK(x.dim() == 3 && x.size(2) == hidden, "TensorParallelEncoderLayer: expected input (B, T, ", hidden,
               "), got ", x.describe());
  if (pre_norm) {
    const Tensor h = add(x, attention(attention_norm->forward(x), attn_mask));
    return add(h, mlp(output_norm->forward(h)));
  }
  const Tensor h = attention_norm->forward(add(x, attention(x, attn_mask)));
  return output_norm->forward(add(h, mlp(h)));
}

std::string TensorParallelEncoderLayer::extra_repr() const {
  return "hidden=" + std::to_string(hidden) + ", heads=" + std::to_string(heads) +
         ", tp_size=" + std::to_string(tp_size(comm_)) + ", pre_norm=" + (pre_norm ? "true" : "false");
}

}  // namespace frugal::parallel
