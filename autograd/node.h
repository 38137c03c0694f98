#pragma once
// The backward graph: Nodes joined by Edges (as PyTorch's function.h / edge.h).
//
// Note [Backward graph]
// A differentiable op that sees an input requiring grad creates one Node: the
// backward of that call. The Node's `next_edges` point at the Nodes that
// produced its inputs (the input's grad_fn, or an AccumulateGrad for a leaf),
// one edge per input, empty where the input needs no grad. Each output records
// (grad_fn = node, output_nr = k). backward() walks edges from the loss to the
// leaves. Nodes are owned through shared_ptr by the tensors that came out of
// them and by the nodes downstream, so a graph lives exactly as long as some
// output does; teardown is iterative (see ~Node) so a 100k-long chain cannot
// overflow the stack.
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include "tensor/tensor.h"

namespace frugal::autograd {

class Node;
class SavedSlot;
class SavedValue;

/// A tensor hook (register_hook in autograd/meta.h): takes the gradient with respect to its
/// tensor; a defined result replaces it.
using TensorHook = std::function<Tensor(const Tensor&)>;

struct Edge {
  std::shared_ptr<Node> fn;  // null: this input needs no gradient
  uint32_t input_nr = 0;     // which input of fn the gradient feeds
  bool valid() const { return fn != nullptr; }
};

/// What a gradient for one output must look like (to make zeros for unused outputs
/// and to check shapes of incoming gradients).
struct OutputMeta {
  Shape sizes;
  DType dtype = kFloat32;
  Device device = kCPU;
};

using TensorList = std::vector<Tensor>;

class Node : public std::enable_shared_from_this<Node> {
 public:
  Node();
  virtual ~Node();
  // Never copied or moved: it lives in a shared_ptr, and its saved slots link to each
  // other by address (Note [Saved tensor registry]).
  Node(const Node&) = delete;
  Node& operator=(const Node&) = delete;
  Node(Node&&) = delete;
  Node& operator=(Node&&) = delete;

  /// Gradients w.r.t. this node's outputs in, gradients w.r.t. its inputs out (one per
  /// next edge; an undefined Tensor where the input needs none).
  virtual TensorList apply(TensorList&& grad_outputs) = 0;
  /// The forward op's name, e.g. "MatmulBackward".
  virtual std::string name() const = 0;
  /// Frees every saved tensor (and SavedState) the node registered, after a backward
  /// without retain_graph (Note [Saved tensor registry]).
  void release_saved();
  /// Calls f on each tensor the node saved (freed ones included: then !defined()).
  void for_each_saved(const std::function<void(const SavedValue&)>& f) const;
  /// Something release_saved() would free is held: a node whose slots hold nothing (sum's,
  /// add's, a mul by a constant's that saved none) may run again after a backward without
  /// retain_graph, as in PyTorch, since nothing it needs is freed.
  bool holds_saved() const;
  /// False for nodes whose backward needs no saved tensor (views, casts, AccumulateGrad):
  /// those may run again after a backward without retain_graph, as in PyTorch. Autocast's
  /// cached weight casts rely on it: one cast serves every backward in its scope.
  virtual bool saves_tensors() const { return true; }
  /// The dtype this node turns an incoming gradient into before passing it on, if it only
  /// converts (a cast's backward: its source's dtype). A producer may then compute the
  /// gradient in that dtype directly (Note [Weight gradients in the master dtype]).
  virtual std::optional<DType> converts_gradient_to() const { return std::nullopt; }
  /// True when apply_graph is written (Note [Double backward] in autograd/graph_backward.h):
  /// grad(..., {.create_graph = true}) refuses a graph with a node that has none.
  virtual bool has_graph_backward() const { return false; }
  /// apply() in differentiable ops, run with grad mode on under create_graph: the gradients
  /// it returns have history (through the saved tensors' own: graph_backward.h's
  /// saved_input and saved_output), so they can be differentiated again.
  virtual TensorList apply_graph(TensorList&& grad_outputs);
  /// True when apply runs a nested backward over a graph the edges do not show (a
  /// checkpoint's replay reaches the leaves its region captured): a grad() run cannot
  /// tell whether it leads to a requested input, so it always runs it.
  virtual bool runs_nested_backward() const { return false; }

  std::vector<Edge> next_edges;
  std::vector<OutputMeta> outputs;
  uint64_t sequence_nr;  // creation order: later nodes run first in backward
  /// Non-leaf outputs whose .grad the user asked to keep (Tensor::retain_grad).
  std::vector<std::pair<uint32_t, std::weak_ptr<TensorImpl>>> retained_outputs;
  bool released = false;  // saved tensors freed: a second backward must throw (see holds_saved)
  /// Hooks on this node's outputs (output_nr, id, hook), run on their gradients before apply.
  std::vector<std::tuple<uint32_t, uint64_t, TensorHook>> tensor_hooks;
  /// Runs the tensor hooks of this node's outputs on `grads` (one per output; undefined ones
  /// skipped), in registration order; AccumulateGrad runs its leaf's.
  virtual void run_tensor_hooks(TensorList& grads);

 private:
  friend class SavedSlot;
  SavedSlot* saved_ = nullptr;  // the last-constructed slot; each links to the one before
};

/// Accumulates the incoming gradient into a leaf tensor's .grad (the leaf is held weakly:
/// a graph does not keep the parameters it was built from alive).
class AccumulateGrad final : public Node {
 public:
  explicit AccumulateGrad(const Tensor& leaf);
  TensorList apply(TensorList&& grads) override;
  std::string name() const override { return "AccumulateGrad"; }
  bool saves_tensors() const override { return false; }
  void run_tensor_hooks(TensorList& grads) override;
  /// backward() with create_graph: .grad becomes the gradient with its history (a sum out of
  /// place with an earlier .grad), as PyTorch's.
  bool has_graph_backward() const override { return true; }
  TensorList apply_graph(TensorList&& grads) override;

 private:
  std::weak_ptr<TensorImpl> leaf_;
  // Backward runs on separate graphs that share this leaf may run on several threads at once
  // (PyTorch's multithreaded autograd): their sums into .grad are serialized here.
  std::mutex mutex_;
};

}  // namespace frugal::autograd
