#pragma once
// The rules every recorded in-place op follows: who may be written, and how the
// written tensor's history is rebased onto the op's node.
//
// Note [In-place ops and autograd]
// An in-place op on a tensor that takes part in autograd is recorded as in PyTorch:
// - A leaf that requires grad may not be written in place while grad mode is on (its
//   .grad would describe values it no longer holds): the op throws. Under NoGradGuard
//   (optimizer steps, initialization) it is allowed and records nothing.
// - Any other tensor `self` gets its history rebased: a new node, whose first input
//   edge is self's previous grad_fn (or nothing), takes the gradient of the new value,
//   and self becomes that node's output (set_history on the same TensorImpl, so every
//   handle to it sees the new history). The raw op bumps the version, so a node that
//   saved self's old value throws in backward instead of using the new one (Note
//   [Saved tensor versions]). A retained .grad (retain_grad) moves to the new node.
// - frugal does not track views (PyTorch's CopySlices): a write through a view would
//   change its base behind the base's history. So a recorded in-place op throws when
//   self is the output of a view node (view, permute, slice, select, expand, split), does
//   not span its storage (a slice or piece of something larger), or was made by a view op
//   over a storage another tensor still holds - a view with no view node, because its
//   base needed no grad or it was taken under NoGradGuard (buf.t().copy_(src) would give
//   src no gradient through buf; a no-grad view of a leaf would overwrite the leaf); clone()
//   first. (An op's result that is a view of a temporary nobody else holds is fine.)
//   A view taken of self before the op keeps its old history, so its next use throws (Note
//   [Views of a tensor written in place] in autograd/ops/view_history.h); so does a view
//   without a view node (taken while self needed no grad, or under NoGradGuard) when used
//   with grad mode on (Note [Views without history]). A detach()ed handle has no history
//   and stays a constant, as in PyTorch.
// - copy_ is recorded by the same rules (autograd/ops/copy.cpp): the new value is src's,
//   so self's old history gets zeros and src gets the gradient (PyTorch's CopyBackwards).
// - Backward of mul_ and div_ needs self's old value for other's gradient, so they save
//   a copy of it, and only when other requires grad. An `other` that shares self's
//   storage is copied before the write too, since the write changes it.
//
// Note [Aliases of transform outputs]
// checkpoint, offload and run_block's probe marks record one node over a tensor they did not
// make, on a detach()ed handle (the tensor itself may be an input whose history must stay).
// Where that handle may alias another tensor with a history of its own, a write through it
// would change the other's values behind that history (checkpoint(fn) returning {h, h} or
// {h, h.t()}: the plain run writes one tensor and its view; fn returning its input or a
// captured parameter: the plain run writes, and rebases or refuses, that tensor itself). So
// autograd::alias_for_history marks such a handle as a view, and the rule above refuses the
// write while the storage has another holder: a clear error, never a gradient that misses
// the write. checkpoint marks an output that shares its storage with an input or another
// output, or that already took part in autograd when it was returned (made outside the
// region: its forward records nothing, so it was not made there). offload and run_block's
// marks cannot tell: the region recorded its own ops, so a tensor it captured (a non-leaf
// made before it, or one it wrote in place and so gave a new history) looks like its own
// result. They mark every output, and the write is refused exactly while something else
// holds the storage: the captured tensor, an input, or a node that saved the output on the
// device (whose backward would refuse the write anyway, Note [Saved tensor versions]). A
// fresh output alone in its storage is written as in the plain run.

#include <memory>

#include "autograd/node.h"

namespace frugal::autograd {

/// Checks that `self` may be written in place while autograd is on (a leaf that
/// requires grad may not; neither may a view); true when the op must be recorded
/// because grad mode is on and self or `other` (may be null) requires grad.
bool must_record_inplace(const char* op, const Tensor& self, const Tensor* other);

/// Makes `node` the new grad_fn of self, moving a retained .grad along.
void rebase_history(const Tensor& self, const std::shared_ptr<Node>& node);

/// A new handle on `t` for a transform that records a node of its own over a tensor it did
/// not make (checkpoint's and offload's outputs, run_block's marks): detached, and treated as
/// a view when `aliased` (it may alias a tensor whose history would miss a write through it),
/// so that such a write is refused while the other tensor lives (Note [Aliases of transform
/// outputs]).
Tensor alias_for_history(const Tensor& t, bool aliased);

}  // namespace frugal::autograd
