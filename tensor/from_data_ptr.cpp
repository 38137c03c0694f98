#include "tensor/from_data_ptr.h"

#include <memory>
#include <utility>

namespace frugal {

Tensor from_data_ptr(DataPtr data, const Shape& sizes, DType dtype) {
  const size_t nbytes = checked_nbytes(numel_of(sizes, "from_data_ptr"), dtype, "from_data_ptr", sizes);
  FRUGAL_CHECK(data.size() >= nbytes, "from_data_ptr: ", data.size(), " bytes cannot hold ", dtype_name(dtype),
               shape_str(sizes), " (", nbytes, " bytes)");
  auto storage = std::make_shared<Storage>();
  storage->nbytes = nbytes;
  storage->data = std::move(data);
  auto impl = std::make_shared<TensorImpl>();
  impl->storage = std::move(storage);
  impl->sizes = sizes;
  impl->strides = contiguous_strides(sizes, "from_data_ptr");
  impl->dtype = dtype;
  return Tensor(std::move(impl));
}

}  // namespace frugal
