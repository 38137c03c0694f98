#pragma once
// Device identity: where a tensor's bytes live. In the base layer (core/): the
// allocator above it is the first thing that must know about devices.
#include <cstdint>
#include <string>

namespace frugal {

enum class DeviceType : uint8_t { CPU, CUDA };

struct Device {
  DeviceType type = DeviceType::CPU;
  int index = 0;  // always 0 for the CPU

  constexpr Device() = default;
  constexpr Device(DeviceType t, int i = 0) : type(t), index(t == DeviceType::CPU ? 0 : i) {}
  /// Parses "cpu", "cuda", "cuda:1"; throws frugal::Error on anything else.
  explicit Device(const std::string& spec);

  constexpr bool is_cpu() const { return type == DeviceType::CPU; }
  constexpr bool is_cuda() const { return type == DeviceType::CUDA; }
  std::string str() const;  // "cpu", "cuda:0"

  friend constexpr bool operator==(Device a, Device b) { return a.type == b.type && a.index == b.index; }
};

inline constexpr Device kCPU{DeviceType::CPU, 0};
constexpr Device cuda(int index = 0) { return Device{DeviceType::CUDA, index}; }

/// Number of CUDA devices visible to this process (0 in a CPU-only build or without a GPU).
int cuda_device_count();

namespace core {
/// Throws frugal::Error naming `op` unless `device` is a CUDA device this process can use.
void check_cuda_device(Device device, const char* op);
}  // namespace core

}  // namespace frugal
