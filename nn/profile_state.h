#pragma once
// What the memory planners put back after the steps they run to measure a model
// (Note [Profiling side effects] in nn/profile_state.cpp).
#include <utility>
#include <vector>

#include "nn/module.h"
#include "tensor/random.h"

namespace frugal::nn {

/// While alive, notes the state of the default generator and of every generator drawn from
/// on this thread, and of `model`'s buffers (batch norm's running statistics and counts)
/// when a model is given; puts them all back when it goes out of scope. Parameters,
/// gradients and optimizer state are not its business.
class ProfileStateGuard {
 public:
  explicit ProfileStateGuard(const Module* model = nullptr);
  ~ProfileStateGuard();
  ProfileStateGuard(const ProfileStateGuard&) = delete;
  ProfileStateGuard& operator=(const ProfileStateGuard&) = delete;

 private:
  GeneratorState default_generator_;
  DrawRecord draws_;                              // the other generators, at their first draw
  std::vector<std::pair<Tensor, Tensor>> saved_;  // (buffer, its value before)
};

}  // namespace frugal::nn
