// The CUDA transport of deferred checks: an asynchronous copy of the record into a
// pinned slot, then an event (Note [Deferred index checks] in deferred_checks.h).
// Compiled only in CUDA builds; cuda_absent.cpp stands in for it otherwise.
#include <cuda_runtime.h>

#include "memory/cuda_check.h"
#include "memory/deferred_checks.h"

namespace frugal::memory::detail {

namespace {

// Events belong to a device, and a null stream handle means the current device's
// legacy stream: both calls run with the check's device current.
class CurrentDevice {
 public:
  explicit CurrentDevice(int index) : target_(index) {
    FRUGAL_CUDA_CHECK(cudaGetDevice(&previous_));
    if (previous_ != target_) FRUGAL_CUDA_CHECK(cudaSetDevice(target_));
  }
  ~CurrentDevice() {
    if (previous_ != target_) (void)cudaSetDevice(previous_);
  }
  CurrentDevice(const CurrentDevice&) = delete;
  CurrentDevice& operator=(const CurrentDevice&) = delete;

 private:
  int previous_ = 0;
  int target_;
};

class CudaCheckTransport final : public CheckTransport {
 public:
  explicit CudaCheckTransport(int index) : index_(index) {}

  void* create_event() override {
    CurrentDevice guard(index_);
    cudaEvent_t e = nullptr;
    FRUGAL_CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
    return e;
  }

  void copy_record(Stream stream, const void* record, int64_t* slot, void* event) override {
    CurrentDevice guard(index_);
    auto s = static_cast<cudaStream_t>(stream.handle);
    FRUGAL_CUDA_CHECK(cudaMemcpyAsync(slot, record, 3 * sizeof(int64_t), cudaMemcpyDeviceToHost, s));
    FRUGAL_CUDA_CHECK(cudaEventRecord(static_cast<cudaEvent_t>(event), s));
  }

  bool completed(void* event) override {
    const cudaError_t err = cudaEventQuery(static_cast<cudaEvent_t>(event));
    if (err == cudaErrorNotReady) {
      (void)cudaGetLastError();
      return false;
    }
    FRUGAL_CUDA_CHECK(err);
    return true;
  }

 private:
  int index_;
};

}  // namespace

std::unique_ptr<CheckTransport> make_cuda_check_transport(int index) {
  return std::make_unique<CudaCheckTransport>(index);
}

}  // namespace frugal::memory::detail
