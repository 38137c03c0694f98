#pragma once
// Sequential and ModuleList.
#include <initializer_list>
#include <string>

#include "nn/module.h"

namespace frugal::nn {

/// Runs its modules in order; children are named "0", "1", ... as in PyTorch.
class Sequential : public UnaryModule {
 public:
  Sequential() = default;
  Sequential(std::initializer_list<std::shared_ptr<UnaryModule>> modules);
  void push_back(std::shared_ptr<UnaryModule> module);
  Tensor forward(const Tensor& x) override;
  /// forward() for an input the caller hands over (a temporary, or std::move(x)): each
  /// intermediate, the input included, is let go as soon as the next module has run,
  /// where forward(const Tensor&) leaves the caller's input alive until the call returns.
  /// For inputs computed just for this call, e.g. mlp.consume(ln(x)) in a transformer block.
  /// It runs the modules as Sequential::forward does; a subclass's own forward is not called.
  Tensor consume(Tensor x);
  std::string type_name() const override { return "Sequential"; }
  size_t size() const { return modules_.size(); }
  const std::shared_ptr<UnaryModule>& operator[](size_t i) const { return modules_.at(i); }

 protected:
  void on_replace_module(const std::string& name, const std::shared_ptr<Module>& module) override;

 private:
  Tensor run(Tensor h);
  std::vector<std::shared_ptr<UnaryModule>> modules_;
};

/// Holds modules (named "0", "1", ...) for a forward the owner writes itself.
template <typename M = Module>
class ModuleList : public Module {
 public:
  void push_back(std::shared_ptr<M> module) {
    register_module(std::to_string(modules_.size()), module);
    modules_.push_back(std::move(module));
  }
  std::string type_name() const override { return "ModuleList"; }
  size_t size() const { return modules_.size(); }
  const std::shared_ptr<M>& operator[](size_t i) const { return modules_.at(i); }
  auto begin() const { return modules_.begin(); }
  auto end() const { return modules_.end(); }

 protected:
  void on_replace_module(const std::string& name, const std::shared_ptr<Module>& module) override {
    auto typed = std::dynamic_pointer_cast<M>(module);
    FRUGAL_CHECK(typed != nullptr, "ModuleList: replacement for '", name, "' (", module->type_name(),
                 ") is not of the list's element type");
    modules_.at(std::stoul(name)) = std::move(typed);
  }

 private:
  std::vector<std::shared_ptr<M>> modules_;
};

}  // namespace frugal::nn
