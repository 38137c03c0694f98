// Compressed saved tensors (Note [Compressed saved tensors] in autograd/compress.h).
#include "autograd/compress.h"

#include <algorithm>
#include <atomic>
#include <map>
#include <numeric>
#include <utility>
#include <vector>

#include "autograd/autocast.h"
#include "core/instrument.h"
#include "tensor/ops/quantize.h"

namespace frugal::autograd {

namespace {

std::atomic<int64_t> stat_tensors{0}, stat_bytes_in{0}, stat_bytes_out{0};

void count(int64_t bytes_in, int64_t bytes_out) {
  stat_tensors.fetch_add(1, std::memory_order_relaxed);
  stat_bytes_in.fetch_add(bytes_in, std::memory_order_relaxed);
  stat_bytes_out.fetch_add(bytes_out, std::memory_order_relaxed);
}

int64_t nbytes(const Tensor& t) { return t.numel() * int64_t(t.element_size()); }

ops::QuantFormat quant_format(CompressFormat f) {
  return f == CompressFormat::Fp8E4M3 ? ops::QuantFormat::Fp8E4M3 : ops::QuantFormat::Int8;
}

/// A saved tensor's codes and scales, and how to give it back its sizes, dtype and layout.
struct Compressed {
  ops::Quantized q;
  ops::QuantFormat format;
  int64_t block;
  DType dtype;
  Shape sizes;                   // of the tensor that was quantized (in memory order)
  std::vector<int64_t> inverse;  // the permutation back to the saved tensor's dims; empty: none
};

/// The dims of t from the largest stride to the smallest (ties in logical order), when t
/// viewed in that order is contiguous and the order is not the logical one (channels-last);
/// else empty.
std::vector<int64_t> memory_order(const Tensor& t) {
  std::vector<int64_t> order(size_t(t.dim()));
  std::iota(order.begin(), order.end(), int64_t(0));
  std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) { return t.stride(a) > t.stride(b); });
  if (std::is_sorted(order.begin(), order.end()) || !t.permute(order).is_contiguous()) return {};
  return order;
}

}  // namespace

// The options and the dedupe table of one scope, shared with its hooks (which outlive the
// scope inside the saved tensors they packed).
struct CompressSavedTensors::State {
  explicit State(CompressOptions o) : options(std::move(o)) {}

  CompressOptions options;
  const SavedTensorHooks::Pair* hooks = nullptr;  // this scope's, to recognise it as the innermost
  State* outer = nullptr;

  // Dedupe: what this scope compressed, by storage (weakly: the table must not keep codes
  // alive after backward frees the saved tensors, nor a storage whose address is reused).
  struct Entry {
    std::weak_ptr<Storage> storage;
    int64_t offset;
    Shape sizes, strides;
    uint64_t version;
    std::weak_ptr<const Compressed> packed;
  };
  std::map<const Storage*, std::vector<Entry>> seen;

  /// Whether t, saved now by `op`, is one to compress (the list of Note [Compressed saved tensors]).
  bool wants(const Tensor& t, std::string_view op) const {
    const DType d = t.dtype();
    if (d != kFloat32 && d != kFloat16 && d != kBFloat16) return false;
    if (nbytes(t) < options.min_bytes || t.numel() == 0) return false;
    for (int64_t dim = 0; dim < t.dim(); ++dim)  // expanded: codes for every element outgrow the storage
      if (t.stride(dim) == 0 && t.size(dim) > 1) return false;
    return !options.select || options.select(op);
  }

  PackedTensor pack(const Tensor& t) {
    if (SavedTensorHooks::packing_parameter() || autocast::is_cached_cast(t) || !wants(t, core::OpScope::current()))
      return t;
    const std::shared_ptr<Storage>& storage = t.impl().storage;
    std::vector<Entry>& entries = seen[storage.get()];
    for (auto it = entries.begin(); it != entries.end();) {
      if (it->storage.lock() != storage) {  // a dead storage whose address came back
        it = entries.erase(it);
        continue;
      }
      if (it->offset == t.storage_offset() && it->sizes == t.sizes() && it->strides == t.strides() &&
          it->version == t.version())
        if (std::shared_ptr<const Compressed> p = it->packed.lock()) return p;
      ++it;
    }
    auto c = std::make_shared<Compressed>();
    c->format = quant_format(options.format);
    c->block = options.block;
    c->dtype = t.dtype();
    const std::vector<int64_t> order = memory_order(t);
    const Tensor dense = order.empty() ? t : t.permute(order);
    if (!order.empty()) {
      c->inverse.resize(order.size());
      for (size_t i = 0; i < order.size(); ++i) c->inverse[size_t(order[i])] = int64_t(i);
    }
    c->sizes = dense.sizes();
    c->q = ops::quantize_blockwise(dense, c->format, c->block);
    count(nbytes(t), nbytes(c->q.codes) + nbytes(c->q.scales));
    entries.push_back({storage, t.storage_offset(), t.sizes(), t.strides(), t.version(), c});
    return std::shared_ptr<const Compressed>(std::move(c));
  }

  static Tensor unpack(const PackedTensor& packed) {
    if (const Tensor* t = std::any_cast<Tensor>(&packed)) return *t;
    const auto& c = std::any_cast<const std::shared_ptr<const Compressed>&>(packed);
    Tensor t = ops::dequantize_blockwise(c->q.codes, c->q.scales, c->format, c->block, c->dtype, c->sizes);
    return c->inverse.empty() ? t : t.permute(c->inverse);
  }
};

namespace {
thread_local CompressSavedTensors::State* innermost_state = nullptr;

CompressOptions checked(CompressOptions o) {
  FRUGAL_CHECK(o.block >= 1, "CompressSavedTensors: block must be at least 1 element, got ", o.block);
  FRUGAL_CHECK(o.min_bytes >= 0, "CompressSavedTensors: min_bytes must not be negative, got ", o.min_bytes);
  FRUGAL_CHECK(o.format == CompressFormat::Fp8E4M3 || o.format == CompressFormat::Int8,
               "CompressSavedTensors: unknown format ", int(o.format));
  return o;
}
}  // namespace

const char* to_string(CompressFormat format) { return format == CompressFormat::Fp8E4M3 ? "fp8" : "int8"; }

CompressStats compress_stats() {
  return {stat_tensors.load(std::memory_order_relaxed), stat_bytes_in.load(std::memory_order_relaxed),
          stat_bytes_out.load(std::memory_order_relaxed)};
}

void reset_compress_stats() {
  stat_tensors.store(0, std::memory_order_relaxed);
  stat_bytes_in.store(0, std::memory_order_relaxed);
  stat_bytes_out.store(0, std::memory_order_relaxed);
}

CompressSavedTensors::CompressSavedTensors(CompressOptions options)
    : state_(std::make_shared<State>(checked(std::move(options)))),
      hooks_([s = state_](const Tensor& t) { return s->pack(t); }, &State::unpack) {
  state_->hooks = SavedTensorHooks::current()->get();
  state_->outer = innermost_state;
  innermost_state = state_.get();
}

CompressSavedTensors::~CompressSavedTensors() {
  innermost_state = state_->outer;
  state_->seen.clear();  // later saves through these hooks (none: the guard is gone) would start afresh
}

Tensor compress(const std::function<Tensor(const Tensor&)>& fn, const Tensor& x, CompressOptions options) {
  CompressSavedTensors scope(std::move(options));
  return fn(x);
}

namespace detail {

bool relu_saves_mask(const Tensor& y) {
  const std::shared_ptr<const SavedTensorHooks::Pair>* hooks = SavedTensorHooks::current();
  return hooks && innermost_state && innermost_state->hooks == hooks->get() && innermost_state->wants(y, "relu");
}

void count_relu_mask(const Tensor& y, const Tensor& mask) { count(nbytes(y), nbytes(mask)); }

}  // namespace detail

}  // namespace frugal::autograd
