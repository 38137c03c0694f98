// libFuzzer target for the safetensors reader (and the JSON parser under it): any
// byte string must either parse or throw frugal::Error; a crash, a sanitizer report,
// an out-of-bounds read or any other exception is a bug.
//
// Build and run (from the repository root; clang with libFuzzer, Debian: clang-14):
//   CC=clang CXX=clang++ meson setup /tmp/b_fuzz -Dfuzz=true -Dcuda=disabled -Dbuildtype=debugoptimized
//   ninja -C /tmp/b_fuzz fuzz/fuzz_safetensors
//   mkdir -p /tmp/fuzz_corpus
//   /tmp/b_fuzz/fuzz/fuzz_safetensors -max_total_time=120 -dict=fuzz/safetensors.dict \
//       /tmp/fuzz_corpus fuzz/corpus
// New inputs go to the first directory (keep the seeds in fuzz/corpus clean); a crash
// is written to ./crash-<sha1>: replay it with `fuzz_safetensors crash-<sha1>`.
#include <cstddef>
#include <cstdint>

#include "memory/error.h"
#include "nn/safetensors.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  try {
    const frugal::nn::SafetensorsFile file = frugal::nn::parse_safetensors(data, size);
    // Touch what was parsed, so a tensor with a wrong byte count would show up here.
    size_t bytes = 0;
    for (const auto& [name, t] : file.tensors) bytes += size_t(t.numel()) * t.element_size() + name.size();
    for (const auto& [key, value] : file.metadata) bytes += key.size() + value.size();
    (void)bytes;
  } catch (const frugal::Error&) {
    // Rejected input: the expected outcome for almost every mutation.
  }
  return 0;
}
