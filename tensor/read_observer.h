#pragma once
// A hook on the tensors whose data is read on this thread (Tensor::data()).
namespace frugal {
class Tensor;
}

namespace frugal::detail {

/// While set on this thread, called with every tensor whose data() is taken there: a
/// checkpoint's forward notes which older tensors its region reads, whatever op reads them
/// (Note [What a replay must find unchanged] in autograd/checkpoint.cpp).
using ReadObserver = void (*)(const Tensor&);
/// Sets the observer (nullptr: none); returns the one it replaces.
ReadObserver set_read_observer(ReadObserver observer);

}  // namespace frugal::detail
