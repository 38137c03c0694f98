#include "tensor/dispatch.h"
#include "tensor/device_dispatch.h"

namespace frugal {

void throw_unsupported_dtype(const char* op, DType t, Device d) {
  FRUGAL_FAIL(op, ": not implemented for ", dtype_name(t), " on ", d.str());
}

void throw_no_cuda(const char* op, Device d) {
  FRUGAL_FAIL(op, ": frugal was built without CUDA, cannot run on ", d.str(),
              " (reconfigure with meson setup -Dcuda=enabled on a machine with the CUDA toolkit)");
}

}  // namespace frugal
