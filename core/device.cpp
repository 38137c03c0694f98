#include "core/device.h"

#include "core/error.h"

namespace frugal {

Device::Device(const std::string& spec) {
  if (spec == "cpu") {
    *this = kCPU;
    return;
  }
  if (spec.rfind("cuda", 0) == 0) {
    type = DeviceType::CUDA;
    index = 0;
    if (spec.size() == 4) return;
    FRUGAL_CHECK(spec[4] == ':' && spec.size() > 5, "Device: cannot parse '", spec, "' (expected cpu, cuda or cuda:N)");
    size_t used = 0;
    int n = -1;
    try {
      n = std::stoi(spec.substr(5), &used);
    } catch (const std::exception&) {}
    FRUGAL_CHECK(n >= 0 && used == spec.size() - 5, "Device: cannot parse '", spec, "' (expected cpu, cuda or cuda:N)");
    index = n;
    return;
  }
  FRUGAL_FAIL("Device: cannot parse '", spec, "' (expected cpu, cuda or cuda:N)");
}

std::string Device::str() const { return is_cpu() ? "cpu" : "cuda:" + std::to_string(index); }

}  // namespace frugal
