#pragma once
// A tensor saved for backward, with the version it had when saved.
//
// Note [Saved tensor versions]
// Views share their storage's version counter and every in-place op bumps it
// (Note [Tensor handle]). A SavedTensor remembers the version at save time;
// unpacking it in backward after an in-place write throws, naming the node,
// instead of silently computing a wrong gradient. Saved tensors are stored
// detached (no autograd meta): keeping an output's meta would make the output's
// grad_fn own itself through the node (a reference cycle), and backward needs
// only the values.
#include <string>

#include "tensor/tensor.h"

namespace frugal::autograd {

class SavedTensor {
 public:
  SavedTensor() = default;
  SavedTensor(const Tensor& t);  // NOLINT: implicit, so nodes can write `saved = x;`

  /// The saved values; throws if they were modified in place since saving, or freed
  /// by an earlier backward (run backward with retain_graph=true to call it twice).
  Tensor unpack(const std::string& node_name) const;
  bool defined() const { return data_.defined(); }
  void reset();

 private:
  Tensor data_;
  uint64_t version_ = 0;
  bool was_defined_ = false;
};

}  // namespace frugal::autograd
