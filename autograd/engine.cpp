// Note [Engine order]
// backward() first counts, for every node reachable from the roots, how many
// edges point at it. A node runs once all its producers' gradients have arrived
// (count reaches zero); among ready nodes the most recently created runs first,
// which is a valid reverse topological order and frees activations early. Each
// node's incoming gradients are summed in its input buffer, into the first one in place
// when nothing else holds it (as PyTorch's InputBuffer::accumulate): an out-of-place sum
// kept both contributions and the sum alive at once, a third buffer of the tied word
// embedding's size at BERT's peak.
//
// Note [Backward callbacks]
// queue_callback() lets code running inside backward (DDP's post-accumulate-grad hook)
// schedule work for when the whole run is done. Each run_backward pushes a CallbackQueue
// onto a thread-local stack (a linked list through `outer`): a checkpoint recompute runs
// a nested backward inside CheckpointBackward::apply, and callbacks queued there belong to
// that inner run (CallbackRun::Current) unless the caller asks for the outermost run, the
// one the user called (CallbackRun::Outermost: DDP, whose sync must wait for every
// parameter, also those reached after the recompute). Thread-local because every rank of
// the threads backend runs its own backward on its own thread. After the last node the
// callbacks run in FIFO order, still inside the run (a callback may queue more; they run
// too). The queue is an RAII scope: if a node or a callback throws, the exception leaves
// backward, the remaining callbacks are destroyed unrun and the stack pops back to the
// outer run.
//
// Note [Gradients without .grad]
// autograd::grad(outputs, inputs) runs only the nodes with a requested input below
// them (PyTorch's exec_info): after discovery, a post-order walk marks a node `runs`
// when one of its next nodes is requested or runs, or when it stands for a graph the
// walk cannot see (Node::runs_nested_backward: a checkpoint replays its region there).
// Other nodes are skipped like nodes no gradient reached, so no AccumulateGrad runs, no
// leaf's .grad and no retained .grad changes, and no hook fires. A requested node's
// incoming gradients are captured (summed), and the node runs on only if it `runs`
// (another requested input lies below it). A node that runs a nested backward inside
// a grad() run asks nested_gradients(), which captures the nested run's gradients for
// the node's own inputs and adds those for the outer run's requested inputs to the
// outer capture (a parameter used only inside a checkpoint). An input that no gradient
// reached is an error unless allow_unused (then its result is undefined, PyTorch's None).
#include "autograd/engine.h"

#include <algorithm>
#include <cmath>
#include <mutex>
#include <optional>
#include <queue>
#include <string>
#include <unordered_map>
#include <utility>

#include "autograd/autocast.h"
#include "autograd/function.h"
#include "autograd/grad_mode.h"
#include "autograd/meta.h"
#include "autograd/ops/binary.h"
#include "core/instrument.h"
#include "tensor/factory.h"
#include "tensor/ops/binary.h"
#include "tensor/ops/reduce.h"

namespace frugal::autograd {

namespace {

struct ByNewest {
  bool operator()(const Node* a, const Node* b) const { return a->sequence_nr < b->sequence_nr; }
};

// Anomaly mode: x * 0 is NaN exactly where x is NaN or +-Inf.
void check_finite(const Node& node, const TensorList& grads) {
  for (size_t i = 0; i < grads.size(); ++i) {
    const Tensor& g = grads[i];
    if (!g.defined() || !g.is_floating_point() || g.numel() == 0) continue;
    const double probe = ops::sum(ops::mul(g, 0.0)).to(kFloat64).item<double>();
    FRUGAL_CHECK(!std::isnan(probe), "anomaly: ", node.name(), " returned NaN or Inf in its gradient for input ", i,
                 " (", g.describe(), "); the forward op that created it is ",
                 node.name().substr(0, node.name().rfind("Backward")));
  }
}

void check_grad_shape(const Node& node, size_t slot, const Tensor& g) {
  const OutputMeta& m = node.outputs.at(slot);
  FRUGAL_CHECK(g.sizes() == m.sizes, "backward: gradient for output ", slot, " of ", node.name(), " has shape ",
               shape_str(g.sizes()), ", expected ", shape_str(m.sizes));
  FRUGAL_CHECK(g.device() == m.device, "backward: gradient for output ", slot, " of ", node.name(), " is on ",
               g.device().str(), ", expected ", m.device.str());
}

// The OpScope name of a node's apply. Computed only while a profiler records (a
// virtual call and a string per node otherwise), then interned so it outlives the
// node (see Note [Zero-cost attribution] in core/instrument.h).
const char* op_name(const Node& node, bool profiling) { return profiling ? core::intern(node.name()) : "backward"; }

struct CallbackQueue {
  std::vector<std::function<void()>> callbacks;
  CallbackQueue* outer;
};
thread_local CallbackQueue* running_queue = nullptr;  // innermost run on this thread

/// Makes a run's callback queue the innermost for its lifetime (Note [Backward callbacks]).
class CallbackScope {
 public:
  CallbackScope() { running_queue = &queue_; }
  ~CallbackScope() { running_queue = queue_.outer; }
  CallbackScope(const CallbackScope&) = delete;
  CallbackScope& operator=(const CallbackScope&) = delete;

  /// Runs the queued callbacks in order, including any queued by a callback.
  void run_callbacks() {
    for (size_t i = 0; i < queue_.callbacks.size(); ++i) {
      std::function<void()> callback = std::move(queue_.callbacks[i]);  // the vector may grow under it
      callback();
    }
    queue_.callbacks.clear();
  }

 private:
  CallbackQueue queue_{{}, running_queue};
};

// One entry per node the run reaches. A single map (not one each for the counts, the
// input buffers and the keep-alive references) is a third of the hash-node allocations
// per node: backward runs once per step over every node of the graph.
struct NodeTask {
  std::shared_ptr<Node> keep_alive;  // the node stays alive while the run needs it
  int dependencies = 0;              // edges still to deliver a gradient to it
  TensorList buffer;                 // its incoming gradients, summed per output
  bool runs = true;                  // grad() runs: has a requested input below it
  bool visited = false;              // mark_needed's walk has been here
};

/// A grad() run's requested nodes and, per node, its incoming gradients summed per output.
using Capture = std::unordered_map<Node*, TensorList>;
thread_local Capture* running_capture = nullptr;  // the innermost grad() run on this thread

/// a + b, recorded when a create_graph run's formulas are (Note [Double backward]).
Tensor gradient_sum(const Tensor& a, const Tensor& b) {
  core::OpScope scope("GradientSum");
  return is_grad_enabled() ? frugal::add(a, b) : ops::add(a, b);
}

/// Adds `grads` (per output of a node) into `into` (Note [Gradients without .grad]).
void add_into(TensorList& into, TensorList&& grads) {
  if (into.size() < grads.size()) into.resize(grads.size());
  for (size_t k = 0; k < grads.size(); ++k) {
    if (!grads[k].defined()) continue;
    if (!into[k].defined()) {
      into[k] = std::move(grads[k]);
    } else {
      into[k] = gradient_sum(into[k], grads[k]);
    }
  }
}

struct GraphRun {
  std::unordered_map<Node*, NodeTask> tasks;

  void discover(const std::vector<Edge>& roots) {
    std::vector<Node*> stack;
    for (const Edge& e : roots) {
      if (!e.fn) continue;
      NodeTask& t = tasks[e.fn.get()];
      if (!t.keep_alive) {
        t.keep_alive = e.fn;
        stack.push_back(e.fn.get());
      }
    }
    while (!stack.empty()) {
      Node* n = stack.back();
      stack.pop_back();
      for (const Edge& e : n->next_edges) {
        if (!e.fn) continue;
        NodeTask& t = tasks[e.fn.get()];
        ++t.dependencies;
        if (!t.keep_alive) {
          t.keep_alive = e.fn;
          stack.push_back(e.fn.get());
        }
      }
    }
  }

  /// Marks the nodes with a captured node below them (Note [Gradients without .grad]),
  /// by an iterative post-order walk: graphs are deep.
  void mark_needed(const std::vector<Edge>& roots, const Capture& capture) {
    std::vector<std::pair<Node*, size_t>> stack;  // a node and its next edge to visit
    auto visit = [&](Node* n) {
      NodeTask& t = tasks[n];
      if (t.visited) return;
      t.visited = true;
      stack.emplace_back(n, 0);
    };
    for (const Edge& e : roots)
      if (e.fn) visit(e.fn.get());
    while (!stack.empty()) {
      const auto [n, i] = stack.back();
      if (i < n->next_edges.size()) {
        ++stack.back().second;
        if (Node* child = n->next_edges[i].fn.get()) visit(child);
        continue;
      }
      stack.pop_back();
      bool runs = n->runs_nested_backward();
      for (const Edge& e : n->next_edges)
        runs = runs || (e.fn && (tasks[e.fn.get()].runs || capture.count(e.fn.get())));
      tasks[n].runs = runs;
    }
  }

  /// Under create_graph, before any node runs: throws, naming them, if a node that will run
  /// (every one in a backward() run, those mark_needed marked in a grad() run) has no
  /// apply_graph (Note [Double backward]).
  void check_graph_backward() const {
    std::vector<std::string> missing;
    for (const auto& [node, task] : tasks) {
      if (!task.runs || node->has_graph_backward()) continue;
      const std::string name = node->name();
      if (std::find(missing.begin(), missing.end(), name) == missing.end()) missing.push_back(name);
    }
    if (missing.empty()) return;
    std::sort(missing.begin(), missing.end());
    std::string names;
    for (const std::string& m : missing) names += (names.empty() ? "" : ", ") + m;
    FRUGAL_FAIL("create_graph: ", names,
                " on the way from the outputs to the inputs cannot be differentiated twice in frugal (Note "
                "[Double backward] in autograd/graph_backward.h lists what can); compute the inner gradient "
                "through other ops, or take the second derivative by finite differences of grad()");
  }

  void add_gradient(Node* n, size_t slot, Tensor g) {
    check_grad_shape(*n, slot, g);
    TensorList& buf = tasks[n].buffer;
    if (buf.empty()) buf.resize(n->outputs.size());
    if (!buf[slot].defined()) {
      buf[slot] = std::move(g);
      return;
    }
    // A tensor used twice (a tied embedding): the sum is the backward's, not "outside ops", and
    // is made in place when nothing else holds the first gradient (Note [Engine order]), unless
    // the sum is recorded (Note [Double backward]).
    Tensor& b = buf[slot];
    if (is_grad_enabled()) {
      b = gradient_sum(b, g);
      return;
    }
    core::OpScope scope("GradientSum");
    const bool sole = b.impl_ptr().use_count() == 1 && b.impl().storage.use_count() == 1;
    // (numel > 0: an empty expanded gradient counts as contiguous, and add_ refuses its stride-0 dims)
    if (sole && b.numel() > 0 && b.dtype() == g.dtype() && b.device() == g.device() && b.sizes() == g.sizes() &&
        b.is_contiguous())
      ops::add_(b, g);
    else b = ops::add(b, g);
  }
};

}  // namespace

namespace {
/// Makes a grad() run's capture the innermost for its lifetime.
class CaptureScope {
 public:
  explicit CaptureScope(Capture* capture) : outer_(running_capture) { running_capture = capture; }
  ~CaptureScope() { running_capture = outer_; }
  CaptureScope(const CaptureScope&) = delete;
  CaptureScope& operator=(const CaptureScope&) = delete;

 private:
  Capture* outer_;
};

// Runs the graph; `capture` (optional) holds nodes whose incoming gradients are
// returned instead of passed on (autograd::grad's inputs), and then only the nodes
// that lead to them run (Note [Gradients without .grad]).
void run_backward(const std::vector<Edge>& roots, const TensorList& root_grads, bool retain_graph, Capture* capture,
                  bool create_graph = false) {
  // Backward formulas are not themselves recorded, unless under create_graph, whose formulas
  // run in their gradients' dtypes with autocast off (Note [Double backward]).
  std::optional<NoGradGuard> no_grad;
  std::optional<EnableGradGuard> with_grad;
  std::optional<AutocastGuard> no_autocast_cpu, no_autocast_cuda;
  if (create_graph) {
    with_grad.emplace();
    no_autocast_cpu.emplace(kCPU, kFloat16, /*enabled=*/false);
    no_autocast_cuda.emplace(Device{DeviceType::CUDA, 0}, kFloat16, /*enabled=*/false);
  } else {
    no_grad.emplace();
  }
  CallbackScope callbacks;
  CaptureScope capture_scope(capture);
  GraphRun run;
  run.discover(roots);
  if (capture) run.mark_needed(roots, *capture);
  if (create_graph) run.check_graph_backward();
  std::priority_queue<Node*, std::vector<Node*>, ByNewest> ready;
  for (size_t i = 0; i < roots.size(); ++i) {
    if (!roots[i].fn) continue;
    run.add_gradient(roots[i].fn.get(), roots[i].input_nr, root_grads[i]);
  }
  for (auto& [node, task] : run.tasks)
    if (task.dependencies == 0) ready.push(node);

  const bool anomaly = is_anomaly_enabled();
  while (!ready.empty()) {
    Node* node = ready.top();
    ready.pop();
    NodeTask& task = run.tasks[node];
    TensorList grads = std::exchange(task.buffer, {});
    grads.resize(node->outputs.size());
    // A gradient may arrive in a wider dtype than its tensor's when a cast consumes it
    // (Note [Weight gradients in the master dtype]); what the user sees has the tensor's.
    auto in_output_dtype = [node](const Tensor& g, size_t k) { return g.to(node->outputs[k].dtype); };
    node->run_tensor_hooks(grads);  // register_hook: before grad() captures or .grad takes them
    if (capture && capture->count(node)) {
      TensorList got(grads.size());
      for (size_t k = 0; k < grads.size(); ++k)
        if (grads[k].defined()) got[k] = in_output_dtype(grads[k], k);
      add_into((*capture)[node], std::move(got));
    }
    // A node no gradient reached contributes nothing: skip it (its inputs then get no
    // gradient from it, and a leaf's .grad stays undefined, as in PyTorch). In a grad()
    // run, so is a node with no requested input below it (one that was captured above).
    const bool reached = std::any_of(grads.begin(), grads.end(), [](const Tensor& g) { return g.defined(); });
    if (!reached || !task.runs) {
      for (const Edge& e : node->next_edges)
        if (e.fn && --run.tasks[e.fn.get()].dependencies == 0) ready.push(e.fn.get());
      continue;
    }
    FRUGAL_CHECK(!node->released, node->name(),
                 ": its saved tensors were freed by an earlier backward; call backward(..., retain_graph=true) the "
                 "first time to backward through the graph twice");
    // Retained .grad first: an output no gradient reached keeps an undefined one (PyTorch's
    // None), not the zeros it is given below.
    if (!capture)  // grad() touches no .grad, retained ones included
      for (const auto& [nr, weak] : node->retained_outputs)
        if (auto impl = weak.lock(); impl && grads[nr].defined()) {
          core::CategoryScope category(core::Category::Gradients);
          AutogradMeta& m = ensure_meta(Tensor(impl));
          const Tensor g =
              grads[nr].dtype() == node->outputs[nr].dtype ? grads[nr].clone() : in_output_dtype(grads[nr], nr);
          static std::mutex retained_mutex;  // two threads' backward through one retained graph
          std::lock_guard<std::mutex> lock(retained_mutex);
          m.grad = m.grad.defined() ? gradient_sum(m.grad, g) : g;
        }
    // Outputs that received no gradient get zeros, so every node sees a full list.
    for (size_t k = 0; k < grads.size(); ++k)
      if (!grads[k].defined())
        grads[k] = zeros(node->outputs[k].sizes, {node->outputs[k].dtype, node->outputs[k].device});
    TensorList input_grads;
    {  // attribute the node's allocations and time to it and to the module that made it
      const bool profiling = core::profiling();
      core::ModuleScope module(profiling ? core::node_module(node->sequence_nr) : nullptr);
      core::OpScope op(op_name(*node, profiling));
      input_grads = create_graph ? node->apply_graph(std::move(grads)) : node->apply(std::move(grads));
    }
    if (anomaly) check_finite(*node, input_grads);
    if (!retain_graph) {
      // Written only when it changes: a node shared with another thread's graph (a leaf's
      // AccumulateGrad) must not see a racing store.
      if (!node->released && node->saves_tensors() && node->holds_saved()) node->released = true;
      node->release_saved();
    }
    for (size_t i = 0; i < node->next_edges.size(); ++i) {
      const Edge& e = node->next_edges[i];
      if (!e.fn) continue;
      if (i < input_grads.size() && input_grads[i].defined())
        run.add_gradient(e.fn.get(), e.input_nr, std::move(input_grads[i]));
      if (--run.tasks[e.fn.get()].dependencies == 0) ready.push(e.fn.get());
    }
  }
  callbacks.run_callbacks();
}

std::vector<Edge> root_edges(const TensorList& roots) {
  std::vector<Edge> edges;
  for (const Tensor& r : roots) {
    FRUGAL_CHECK(requires_grad(r), "backward: tensor ", r.describe(),
                 " does not require grad and has no grad_fn (did you call requires_grad_() on the inputs, or run "
                 "under NoGradGuard?)");
    edges.push_back(gradient_edge(r));
  }
  return edges;
}

/// The gradients the roots start from: the given ones (checked against their roots' shapes),
/// ones for one-element roots given none. A user's gradient of another dtype (an int64 or
/// bool tensor, float32 for a float64 loss) is converted to its root's dtype, as PyTorch's
/// validate_outputs does: nodes expect gradients in their outputs' floating dtype (an int64
/// one reaching matmul would throw, and a retained .grad would not have the root's dtype).
/// A nested run (a checkpoint's replay) passes the gradients its node received as they are:
/// one may be wider on purpose (Note [Weight gradients in the master dtype]).
TensorList root_gradients(const TensorList& roots, const TensorList& grads, bool to_root_dtype) {
  FRUGAL_CHECK(grads.empty() || grads.size() == roots.size(), "backward: ", roots.size(), " roots but ", grads.size(),
               " gradients");
  TensorList out;
  for (size_t i = 0; i < roots.size(); ++i) {
    if (!grads.empty() && grads[i].defined()) {
      FRUGAL_CHECK(grads[i].sizes() == roots[i].sizes(), "backward: gradient of shape ", shape_str(grads[i].sizes()),
                   " for a root of shape ", shape_str(roots[i].sizes()));
      const bool convert = to_root_dtype && grads[i].dtype() != roots[i].dtype();
      out.push_back(convert ? raw([&] { return grads[i].to(roots[i].dtype()); }) : grads[i]);
    } else {
      FRUGAL_CHECK(roots[i].numel() == 1, "backward: grad can be implicitly created only for scalar outputs, got ",
                   roots[i].describe(), "; pass a gradient");
      core::OpScope scope("backward");  // the seed is the backward's, not a user tensor, in the profiler
      out.push_back(ones(roots[i].sizes(), roots[i].options()));
    }
  }
  return out;
}
}  // namespace

void queue_callback(std::function<void()> callback, CallbackRun run) {
  FRUGAL_CHECK(running_queue,
               "queue_callback: called outside a backward pass; queue callbacks from a hook or a "
               "node's apply while backward() or grad() runs");
  FRUGAL_CHECK(callback, "queue_callback: the callback is empty");
  CallbackQueue* queue = running_queue;
  if (run == CallbackRun::Outermost)
    while (queue->outer) queue = queue->outer;
  queue->callbacks.push_back(std::move(callback));
}

bool in_backward() { return running_queue != nullptr; }

void backward(const TensorList& roots, const TensorList& grad_roots, bool retain_graph) {
  backward(roots, grad_roots, BackwardOptions{retain_graph, /*create_graph=*/false});
}

void backward(const TensorList& roots, const TensorList& grad_roots, const BackwardOptions& options) {
  const std::vector<Edge> edges = root_edges(roots);  // first: its errors are the more telling
  run_backward(edges, root_gradients(roots, grad_roots, /*to_root_dtype=*/true),
               options.retain_graph || options.create_graph, nullptr, options.create_graph);
}

namespace {
/// backward() that lets the roots' data go before the graph runs: the engine needs only
/// their edges, so a checkpoint's recomputed outputs are not held through its backward
/// (Note [Checkpoint recompute]). `roots` is emptied.
void backward_releasing_roots(TensorList&& roots, const TensorList& grad_roots) {
  const std::vector<Edge> edges = root_edges(roots);
  const TensorList grads = root_gradients(roots, grad_roots, /*to_root_dtype=*/false);
  roots.clear();  // the edges keep the graph; the outputs' storage is free for the backward
  run_backward(edges, grads, /*retain_graph=*/false, nullptr);
}
}  // namespace

TensorList grad(const TensorList& outputs, const TensorList& inputs, const TensorList& grad_outputs, bool retain_graph,
                bool allow_unused) {
  return grad(outputs, inputs, grad_outputs, GradOptions{retain_graph, /*create_graph=*/false, allow_unused});
}

TensorList grad(const TensorList& outputs, const TensorList& inputs, const TensorList& grad_outputs,
                const GradOptions& options) {
  Capture capture;
  std::vector<Edge> input_edges;
  for (const Tensor& x : inputs) {
    FRUGAL_CHECK(requires_grad(x), "grad: input ", x.describe(), " does not require grad");
    input_edges.push_back(gradient_edge(x));
    capture[input_edges.back().fn.get()] = {};
  }
  const std::vector<Edge> edges = root_edges(outputs);
  run_backward(edges, root_gradients(outputs, grad_outputs, /*to_root_dtype=*/true),
               options.retain_graph || options.create_graph, &capture, options.create_graph);
  TensorList result;
  for (size_t i = 0; i < inputs.size(); ++i) {
    const TensorList& got = capture[input_edges[i].fn.get()];
    const uint32_t nr = input_edges[i].input_nr;
    Tensor g = nr < got.size() ? got[nr] : Tensor();
    FRUGAL_CHECK(g.defined() || options.allow_unused, "grad: input ", i, " (", inputs[i].describe(),
                 ") was not used to compute the outputs (no gradient reaches it); pass allow_unused = true to get an "
                 "undefined tensor for it instead");
    result.push_back(std::move(g));
  }
  return result;
}

TensorList nested_gradients(TensorList&& roots, const TensorList& grad_roots, const TensorList& leaves) {
  if (!running_capture) {  // a backward() run: accumulate into .grad, as it does
    backward_releasing_roots(std::move(roots), grad_roots);
    TensorList grads;
    for (const Tensor& x : leaves) grads.push_back(x.defined() ? x.grad() : Tensor());
    return grads;
  }
  // A grad() run: capture the leaves' gradients and the outer run's requested inputs.
  Capture* outer = running_capture;
  Capture capture;
  for (const auto& [node, grads] : *outer) capture[node] = {};
  std::vector<Edge> leaf_edges;
  for (const Tensor& x : leaves) {
    leaf_edges.push_back(x.defined() ? gradient_edge(x) : Edge{});
    if (leaf_edges.back().fn) capture[leaf_edges.back().fn.get()] = {};
  }
  const std::vector<Edge> edges = root_edges(roots);
  const TensorList grads = root_gradients(roots, grad_roots, /*to_root_dtype=*/false);
  roots.clear();
  run_backward(edges, grads, /*retain_graph=*/false, &capture);
  for (auto& [node, requested] : *outer) add_into(requested, std::move(capture[node]));
  TensorList result;
  for (const Edge& e : leaf_edges) {
    const TensorList* got = e.fn && !outer->count(e.fn.get()) ? &capture[e.fn.get()] : nullptr;
    result.push_back(got && e.input_nr < got->size() ? (*got)[e.input_nr] : Tensor());
  }
  return result;
}

}  // namespace frugal::autograd
