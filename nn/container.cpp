#include "nn/container.h"

namespace frugal::nn {

Sequential::Sequential(std::initializer_list<std::shared_ptr<UnaryModule>> modules) {
  for (const auto& m : modules) push_back(m);
}

void Sequential::push_back(std::shared_ptr<UnaryModule> module) {
  register_module(std::to_string(modules_.size()), module);
  modules_.push_back(std::move(module));
}

Tensor Sequential::forward(const Tensor& x) {
  core::ModuleScope scope(this);  // Note [Module attribution]
  return run(x);
}

Tensor Sequential::consume(Tensor x) {
  core::ModuleScope scope(this);  // what operator() would have done
  return run(std::move(x));
}

Tensor Sequential::run(Tensor h) {
  for (const auto& m : modules_) h = (*m)(h);  // through operator(): the profiler sees each module
  return h;
}

void Sequential::on_replace_module(const std::string& name, const std::shared_ptr<Module>& module) {
  auto unary = std::dynamic_pointer_cast<UnaryModule>(module);
  FRUGAL_CHECK(unary != nullptr, "Sequential: replacement for '", name, "' (", module->type_name(),
               ") must be a UnaryModule");
  modules_.at(std::stoul(name)) = std::move(unary);
}

}  // namespace frugal::nn
