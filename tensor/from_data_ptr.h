#pragma once
// A tensor over memory someone else allocated (a pinned block from memory::allocate_pinned,
// a batch the data loader staged): the one way to wrap a DataPtr, shared by nn/data and optim/.
#include "core/data_ptr.h"
#include "tensor/tensor.h"

namespace frugal {

/// A contiguous tensor of `sizes` and `dtype` over `data` (which must hold at least numel *
/// element_size bytes), on data's device; the tensor owns `data` from then on.
Tensor from_data_ptr(DataPtr data, const Shape& sizes, DType dtype);

}  // namespace frugal
