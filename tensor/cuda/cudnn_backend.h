#pragma once
// cuDNN backend (graph) API pieces shared by the graph-API ops (conv_graph.cu,
// attention_cudnn.cu): an owning descriptor handle, the engine configurations heuristics
// suggest, and the per-problem plan cache. Include only from CUDA translation units.
#include <cudnn.h>

#include <algorithm>
#include <map>
#include <memory>
#include <mutex>
#include <utility>
#include <vector>

#include "tensor/cuda/cudnn_handle.h"

namespace frugal::ops::cuda {

/// One cuDNN backend descriptor, destroyed with its owner.
class Descriptor {
 public:
  Descriptor() = default;
  explicit Descriptor(cudnnBackendDescriptorType_t type) {
    FRUGAL_CUDNN_CHECK(cudnnBackendCreateDescriptor(type, &d_));
  }
  ~Descriptor() {
    if (d_ != nullptr) cudnnBackendDestroyDescriptor(d_);
  }
  Descriptor(Descriptor&& o) noexcept : d_(std::exchange(o.d_, nullptr)) {}
  Descriptor(const Descriptor&) = delete;
  Descriptor& operator=(const Descriptor&) = delete;
  Descriptor& operator=(Descriptor&& o) noexcept {
    std::swap(d_, o.d_);
    return *this;
  }

  template <typename T>
  Descriptor& set(cudnnBackendAttributeName_t name, cudnnBackendAttributeType_t type, int64_t count, const T* values) {
    FRUGAL_CUDNN_CHECK(cudnnBackendSetAttribute(d_, name, type, count, values));
    return *this;
  }
  Descriptor& set(cudnnBackendAttributeName_t name, cudnnBackendDescriptor_t value) {
    return set(name, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &value);
  }
  Descriptor& set(cudnnBackendAttributeName_t name, const Descriptor& value) { return set(name, value.d_); }
  Descriptor& set_handle(cudnnBackendAttributeName_t name, cudnnHandle_t h) {
    return set(name, CUDNN_TYPE_HANDLE, 1, &h);
  }
  void finalize() { FRUGAL_CUDNN_CHECK(cudnnBackendFinalize(d_)); }
  /// Finalize for descriptors cuDNN may reject (an engine that does not take the problem).
  bool try_finalize() { return cudnnBackendFinalize(d_) == CUDNN_STATUS_SUCCESS; }
  cudnnBackendDescriptor_t get() const { return d_; }
  cudnnBackendDescriptor_t* out() { return &d_; }

 private:
  cudnnBackendDescriptor_t d_ = nullptr;
};

/// The engine configurations cuDNN's heuristics of `mode` suggest for `graph`, best first.
inline std::vector<Descriptor> suggested_configs(const Descriptor& graph, cudnnBackendHeurMode_t mode) {
  Descriptor heuristics(CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR);
  heuristics.set(CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH, graph)
      .set(CUDNN_ATTR_ENGINEHEUR_MODE, CUDNN_TYPE_HEUR_MODE, 1, &mode);
  if (!heuristics.try_finalize()) return {};
  int64_t count = 0;
  if (cudnnBackendGetAttribute(heuristics.get(), CUDNN_ATTR_ENGINEHEUR_RESULTS, CUDNN_TYPE_BACKEND_DESCRIPTOR, 0,
                               &count, nullptr) != CUDNN_STATUS_SUCCESS ||
      count <= 0)
    return {};
  std::vector<Descriptor> configs;
  std::vector<cudnnBackendDescriptor_t> raw;
  for (int64_t i = 0; i < count; ++i) {
    configs.emplace_back(CUDNN_BACKEND_ENGINECFG_DESCRIPTOR);
    raw.push_back(configs.back().get());
  }
  int64_t returned = 0;
  if (cudnnBackendGetAttribute(heuristics.get(), CUDNN_ATTR_ENGINEHEUR_RESULTS, CUDNN_TYPE_BACKEND_DESCRIPTOR, count,
                               &returned, raw.data()) != CUDNN_STATUS_SUCCESS)
    return {};
  configs.erase(configs.begin() + std::max<int64_t>(0, std::min(returned, count)), configs.end());
  return configs;
}

/// What an op built for each problem key (its execution plans), shared by every thread.
template <typename Key, typename Plans>
class PlanCache {
 public:
  std::shared_ptr<const Plans> lookup(const Key& key) {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = map_.find(key);
    return it == map_.end() ? nullptr : it->second;
  }
  void insert(const Key& key, std::shared_ptr<const Plans> value) {
    std::lock_guard<std::mutex> lock(mu_);
    map_.emplace(key, std::move(value));
  }

 private:
  std::mutex mu_;
  std::map<Key, std::shared_ptr<const Plans>> map_;
};

/// The one cache for (Key, Plans), never destroyed: plans are used until the process exits.
template <typename Key, typename Plans>
PlanCache<Key, Plans>& plan_cache() {
  static auto* cache = new PlanCache<Key, Plans>();
  return *cache;
}

}  // namespace frugal::ops::cuda
