// libFuzzer target for the safetensors reader (and the JSON parser under it), through the
// creation of its tensors: any byte string must either parse or throw frugal::Error; a
// crash, a sanitizer report (AddressSanitizer, UndefinedBehaviorSanitizer: signed
// overflow in a size product is one), an out-of-bounds read or any other exception is a bug.
//
// Build and run (from the repository root; clang with libFuzzer, Debian: clang-14):
//   CC=clang CXX=clang++ meson setup buildfuzz -Dfuzz=true -Dcuda=disabled -Dbuildtype=debugoptimized
//   ninja -C buildfuzz fuzz/fuzz_safetensors fuzz/fuzz_readers
//   mkdir -p /tmp/fuzz_corpus
//   buildfuzz/fuzz/fuzz_safetensors -max_total_time=120 -jobs=1 -dict=fuzz/safetensors.dict \
//       /tmp/fuzz_corpus fuzz/corpus
// New inputs go to the first directory (keep the seeds in fuzz/corpus clean); a crash
// is written to ./crash-<sha1>: replay it with `fuzz_safetensors crash-<sha1>`.
// fuzz_readers.cpp covers the config JSON readers and the IDX reader the same way.
#include <cstddef>
#include <cstdint>

#include "core/error.h"
#include "nn/safetensors.h"
#include "tensor/factory.h"

namespace {

// What loading does next with each tensor: reads it, views it, copies it. Each step
// recomputes sizes, strides and byte counts from the parsed shape, where an overflow
// that the reader let through would show (a [2^62, 2^62, 0] once did).
void use(const frugal::Tensor& t) {
  using namespace frugal;
  volatile int64_t sink = t.numel() + int64_t(t.element_size()) + t.dim();
  for (int64_t d = 0; d < t.dim(); ++d) sink = sink + t.size(d) + t.stride(d);
  Tensor flat = t.reshape({-1});
  sink = sink + flat.numel();
  if (t.dim() > 0 && t.size(0) > 0) sink = sink + t.select(0, t.size(0) - 1).numel();
  if (t.numel() <= 4096) {  // copies through the CPU kernels; bounded so each input stays fast
    Tensor copy = empty(t.sizes(), {kFloat64, kCPU});
    copy.copy_(t);
    sink = sink + int64_t(copy.tolist<double>().size());
  }
  (void)sink;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  frugal::nn::SafetensorsFile file;
  try {
    file = frugal::nn::parse_safetensors(data, size);
  } catch (const frugal::Error&) {
    return 0;  // rejected input: the expected outcome for almost every mutation
  }
  // A tensor the reader accepted must be usable: an error from here on is a bug too
  // (uncaught, libFuzzer reports it as a crash).
  for (const auto& [name, t] : file.tensors) use(t);
  return 0;
}
