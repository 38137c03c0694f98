// The gpu suite's main: runs the CUDA tests when a GPU is present; otherwise it
// reports the suite as skipped (exit 77, meson's SKIP) - or, with
// FRUGAL_REQUIRE_GPU=1, fails, so a GPU run can never pass vacuously.
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "core/device.h"

int main(int argc, char** argv) {
  const char* require = std::getenv("FRUGAL_REQUIRE_GPU");
  const bool required = require && std::strcmp(require, "1") == 0;
  int gpus = 0;
#ifdef FRUGAL_WITH_CUDA
  gpus = frugal::cuda_device_count();
#endif
  if (gpus == 0) {
#ifdef FRUGAL_WITH_CUDA
    const char* why = "no GPU found";
#else
    const char* why = "frugal was built without CUDA";
#endif
    if (required) {
      std::fprintf(stderr, "gpu suite: FAILED: %s and FRUGAL_REQUIRE_GPU=1\n", why);
      return 1;
    }
    std::printf("gpu suite: skipped (%s)\n", why);
    return 77;
  }
  doctest::Context ctx(argc, argv);
  return ctx.run();
}
