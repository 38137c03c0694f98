#pragma once
// Group: a module that only names what it holds, for the levels of a checkpoint's key
// hierarchy that have no forward of their own: "attention" in
// "encoder.layer.0.attention.self.query.weight", "heads" in ViT's "heads.head.weight".
// The owner keeps typed pointers to the children and writes the forward itself.
#include <memory>
#include <string>
#include <utility>

#include "nn/module.h"

namespace frugal::models {

class Group : public nn::Module {
 public:
  /// `type` is what printouts call it ("BertAttention").
  explicit Group(std::string type) : type_(std::move(type)) {}
  std::string type_name() const override { return type_; }

  template <typename M>
  std::shared_ptr<M> add(const std::string& name, std::shared_ptr<M> module) {
    return register_module(name, std::move(module));
  }
  Tensor add_parameter(const std::string& name, Tensor value) { return register_parameter(name, std::move(value)); }
  /// Registers `value` itself (not a copy): see Note [Tied weights] in models/bert.h.
  Tensor add_buffer(const std::string& name, Tensor value) { return register_buffer(name, std::move(value)); }

 private:
  std::string type_;
};

}  // namespace frugal::models
