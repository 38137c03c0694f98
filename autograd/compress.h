#pragma once
// Compressed saved tensors: the activations a forward saves for backward kept as 8-bit codes
// with per-block scales (FP8 e4m3 or int8) and expanded when backward needs them, by a
// policy over the op that saves them (ActNN, Chen et al. 2021; COAT, 2024). Lossy and off by
// default: gradients carry the quantization error of Note [Blockwise quantization] in
// tensor/ops/quantize.h.
//
//   // One block's activations in FP8 (about a quarter of their float32 bytes):
//   Tensor y = autograd::compress([&](const Tensor& h) { return block->forward(h); }, x);
//
//   // A whole training forward, int8, only what convolutions and matmuls save:
//   {
//     autograd::CompressSavedTensors scope({.format = autograd::CompressFormat::Int8,
//                                           .select = [](std::string_view op) { return op == "conv2d"; }});
//     loss = model->forward(x, labels);
//   }
//   loss.backward();
//
// Note [Compressed saved tensors]
// A CompressSavedTensors scope is a SavedTensorHooks guard (Note [Saved tensor hooks]) whose
// pack quantizes and whose unpack dequantizes, so a saved tensor's full-precision storage goes
// when the forward's other handles do, and the version check of Note [Saved tensor versions]
// still catches an in-place write after the save. Pack leaves a tensor as it is (the hook
// keeps a plain alias) when it is
//   - not float32, float16 or bfloat16: integer and bool tensors (indices, cuDNN's reserve
//     space), float64 (asked for its precision);
//   - smaller than min_bytes: a batch norm's per-channel statistics, a loss's scalars;
//   - expanded (a stride 0 over a dim of size > 1, a broadcast row): one code per element
//     would hold more bytes than the storage it repeats, and the stats would claim a saving;
//   - a parameter, a leaf that requires grad (SavedTensorHooks::packing_parameter): its storage
//     lives on with the module, so a compressed copy would add memory and error;
//   - an autocast cast of a parameter still in autocast's cast cache (autocast::is_cached_cast):
//     the cache keeps it alive until the outermost AutocastGuard exits, and it is a weight;
//   - saved by an op that `select` declines (op: core::OpScope::current(), the innermost
//     differentiable op, e.g. "conv2d", "linear", "matmul", "layer_norm", "gelu").
// A tensor saved twice in one scope (the same storage, offset, sizes, strides and version: a
// conv's input that is also a relu's output, q and k saved by one attention) is compressed
// once; later saves share the first one's codes. A dense tensor in another memory order
// (channels-last) is quantized in its memory order and comes back in it, so the backward sees
// the strides the forward saved; other layouts come back contiguous.
//
// Memory. Per float32 element, 1 byte of code plus 4 bytes of scale per `block` elements:
// bytes_out = bytes_in / 4 * (1 + 4 / block) (about 0.254 at block 256); half as good from
// float16/bfloat16. The saving is real only when every saver of a tensor compresses it: a
// tensor also saved by an op that `select` declines stays alive in full next to its codes.
//
// ReLU. relu's backward needs of its output only whether each element passed, so inside a
// scope that selects "relu" it saves a 1-bit mask (ops::relu_mask, Note [ReLU masks]) instead
// of its output, and its gradient is bit for bit that of the plain path. Outside a scope it
// saves the output as PyTorch does: that output is usually saved by the next op as well (a
// conv's or linear's input), where the mask would be n / 8 bytes on top of a tensor kept
// anyway. Inside a scope the next op keeps only codes (n bytes from float32), so the mask
// costs n / 8 more than sharing those codes, and buys exact relu gradients: a dequantized
// output could turn a small positive into 0 and drop its gradient. The mask holds no
// reference to the output, so an in-place write to it after relu is harmless and not reported.
#include <cstdint>
#include <functional>
#include <memory>
#include <string_view>

#include "autograd/saved_tensor.h"
#include "tensor/tensor.h"

namespace frugal::autograd {

/// The 8-bit formats of Note [Blockwise quantization] in tensor/ops/quantize.h.
enum class CompressFormat : uint8_t { Fp8E4M3, Int8 };
/// "fp8" or "int8".
const char* to_string(CompressFormat format);

struct CompressOptions {
  CompressFormat format = CompressFormat::Fp8E4M3;
  int64_t block = 256;           ///< elements per scale
  int64_t min_bytes = 64 << 10;  ///< smaller saved tensors stay as they are
  /// Which saved tensors to compress, by the op (OpScope name) that saves them; empty = every
  /// floating activation. Parameters (leaf tensors requiring grad) are never compressed.
  std::function<bool(std::string_view op)> select = {};
};

/// What the scopes compressed on every thread since the last reset: tensors (each counted
/// once however often it was saved), their bytes and the bytes of their codes and scales
/// (or masks: relu's count here too).
struct CompressStats {
  int64_t tensors = 0, bytes_in = 0, bytes_out = 0;
};
CompressStats compress_stats();
void reset_compress_stats();

/// fn(x) with the tensors its forward saves for backward kept compressed.
Tensor compress(const std::function<Tensor(const Tensor&)>& fn, const Tensor& x, CompressOptions options = {});

/// The guard form, for code that is not one function of one tensor: tensors saved for
/// backward on this thread while it lives are compressed (Note [Compressed saved tensors]).
/// Nests with other saved-tensor hooks: the innermost guard applies.
class CompressSavedTensors {
 public:
  explicit CompressSavedTensors(CompressOptions options = {});
  ~CompressSavedTensors();
  CompressSavedTensors(const CompressSavedTensors&) = delete;
  CompressSavedTensors& operator=(const CompressSavedTensors&) = delete;

  struct State;

 private:
  std::shared_ptr<State> state_;
  SavedTensorHooks hooks_;
};

namespace detail {
/// Whether relu, saving its output `y`, should save a 1-bit mask instead: the innermost
/// saved-tensor hooks are a CompressSavedTensors scope's that would compress y (see "ReLU" in
/// Note [Compressed saved tensors]).
bool relu_saves_mask(const Tensor& y);
/// Counts a relu mask in compress_stats().
void count_relu_mask(const Tensor& y, const Tensor& mask);
}  // namespace detail

}  // namespace frugal::autograd

namespace frugal {
using autograd::CompressFormat;
using autograd::CompressOptions;
using autograd::CompressSavedTensors;
}  // namespace frugal
