// The memory profiler (profiler/session.h) on the CPU allocator: every event names
// its op, module and category; the exports agree with the allocator's own stats
// (the independent reference: memory::stats counts the same bytes by another path);
// and without a profiler nothing is recorded and results are unchanged.
#include <doctest/doctest.h>

#include <algorithm>
#include <chrono>
#include <map>
#include <set>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "autograd/ops/binary.h"
#include "autograd/ops/loss.h"
#include "autograd/ops/reduce.h"
#include "core/error.h"
#include "core/instrument.h"
#include "core/json.h"
#include "memory/allocator.h"
#include "memory/caching_allocator.h"
#include "nn/activation.h"
#include "nn/container.h"
#include "nn/conv.h"
#include "nn/linear.h"
#include "optim/adam.h"
#include "profiler/session.h"
#include "tensor/factory.h"
#include "tensor/ops/binary.h"
#include "tensor/random.h"
#include "tests/test_util.h"

using namespace frugal;
using core::Category;
using frugal::testing::check_error;
using memory::TraceAction;

namespace {

// encoder.0 (Linear 8->16), encoder.1 (ReLU), head (Linear 16->4): two levels of names.
struct Net : nn::UnaryModule {
  std::shared_ptr<nn::Sequential> encoder;
  std::shared_ptr<nn::Linear> head;
  Net() {
    encoder = register_module("encoder",
                              std::make_shared<nn::Sequential>(std::initializer_list<std::shared_ptr<nn::UnaryModule>>{
                                  std::make_shared<nn::Linear>(8, 16), std::make_shared<nn::ReLU>()}));
    head = register_module("head", std::make_shared<nn::Linear>(16, 4));
  }
  Tensor forward(const Tensor& x) override { return (*head)((*encoder)(x)); }
  std::string type_name() const override { return "Net"; }
};

int64_t rounded(const Tensor& t) { return static_cast<int64_t>(memory::detail::round_size(t.impl().storage->nbytes)); }

const void* data_of(const Tensor& t) { return t.impl().storage->data.get(); }

// One training step of `net` on fixed data; returns the loss.
double train_step(Net& net, optim::Adam& opt) {
  Tensor x = randn({32, 8});
  Tensor y = randint(0, 4, {32});
  opt.zero_grad();
  Tensor loss = cross_entropy(net(x), y);
  loss.backward();
  opt.step();
  return loss.item<double>();
}

// The recorded OpRecords named `op`.
std::vector<core::OpRecord> records_of(const profiler::Session& s, const std::string& op) {
  std::vector<core::OpRecord> out;
  for (const core::OpRecord& r : s.op_records())
    if (op == r.op) out.push_back(r);
  return out;
}

// A small XML check: every tag opened is closed in order; no text outside the root.
bool balanced_xml(const std::string& svg) {
  std::vector<std::string> stack;
  size_t i = 0;
  while ((i = svg.find('<', i)) != std::string::npos) {
    const size_t end = svg.find('>', i);
    if (end == std::string::npos) return false;
    std::string tag = svg.substr(i + 1, end - i - 1);
    i = end + 1;
    if (tag.empty()) return false;
    if (tag[0] == '/') {
      if (stack.empty() || stack.back() != tag.substr(1)) return false;
      stack.pop_back();
      if (stack.empty()) return svg.find('<', i) == std::string::npos;  // the root closed last
    } else if (tag.back() != '/') {
      stack.push_back(tag.substr(0, tag.find_first_of(" \n")));
    }
  }
  return false;
}

size_t count(const std::string& text, const std::string& what) {
  size_t n = 0;
  for (size_t i = text.find(what); i != std::string::npos; i = text.find(what, i + 1)) ++n;
  return n;
}

}  // namespace

TEST_CASE("profiler: ops, backward nodes and modules are attributed") {
  manual_seed(1);
  Net net;
  profiler::Session session;
  session.attach(net);
  session.start();
  Tensor out;
  {
    core::OpScope op("custom_op");  // as every public op opens one
    out = ops::add(randn({4, 4}), 1.0);
  }
  Tensor loss = cross_entropy(net(randn({32, 8})), randint(0, 4, {32}));
  loss.backward();
  session.stop();

  bool custom_alloc = false;
  std::set<std::string> modules;
  std::set<std::string> backward_ops;
  for (const memory::TraceEvent& e : session.events()) {
    if (e.action != TraceAction::Alloc) continue;
    if (std::string(e.op) == "custom_op" && e.ptr == data_of(out)) {
      custom_alloc = true;
      CHECK(e.category == Category::Activations);
      CHECK(e.module == nullptr);
    }
    if (e.module) modules.insert(session.module_name(e.module));
    if (std::string(e.op).find("Backward") != std::string::npos) backward_ops.insert(e.op);
  }
  CHECK(custom_alloc);
  // Forward allocations inside the modules (the layers' outputs), and backward ones
  // attributed to the module whose forward made the node.
  CHECK(modules.count("encoder.0"));
  CHECK(modules.count("head"));
  CHECK(backward_ops.count("LinearBackward"));

  const auto linear_backward = records_of(session, "LinearBackward");
  REQUIRE(linear_backward.size() == 2);
  std::set<std::string> backward_modules;
  for (const auto& r : linear_backward) backward_modules.insert(session.module_name(r.module));
  CHECK(backward_modules == std::set<std::string>{"encoder.0", "head"});
  CHECK(records_of(session, "CrossEntropyBackward").size() == 1);
  CHECK(records_of(session, "AccumulateGrad").size() == 4);  // 2 weights, 2 biases
  for (const core::OpRecord& r : session.op_records()) {
    CHECK(r.end_ns >= r.start_ns);
    CHECK(r.device_ms == -1.0);  // no CUDA events on the CPU
  }
  CHECK(session.module_name(&net) == "(Net)");
}

TEST_CASE("profiler: parameters, gradients and optimizer state get their categories") {
  manual_seed(2);
  profiler::Session session;
  session.start();
  Net net;  // made under the profiler: its tensors become parameters at register_parameter
  optim::Adam opt(net.parameters(), {.lr = 1e-3});
  train_step(net, opt);
  session.stop();

  const std::vector<Tensor> params = net.parameters();
  int64_t param_bytes = 0, grad_bytes = 0;
  std::set<const void*> param_ptrs, grad_ptrs;
  for (const Tensor& p : params) {
    param_bytes += rounded(p);
    grad_bytes += rounded(p.grad());
    param_ptrs.insert(data_of(p));
    grad_ptrs.insert(data_of(p.grad()));
  }
  // Every parameter and gradient block's last word in the trace names its category.
  std::map<const void*, Category> last;
  int64_t adam_state_bytes = 0;
  for (const memory::TraceEvent& e : session.events()) {
    if (e.action == TraceAction::Alloc || e.action == TraceAction::Relabel) last[e.ptr] = e.category;
    if (e.action == TraceAction::Alloc && e.category == Category::OptimizerState) adam_state_bytes += int64_t(e.size);
  }
  for (const void* p : param_ptrs) CHECK(last.at(p) == Category::Parameters);
  for (const void* g : grad_ptrs) CHECK(last.at(g) == Category::Gradients);
  CHECK(adam_state_bytes == 2 * param_bytes);  // exp_avg and exp_avg_sq, nothing else on the CPU

  // The replay agrees: the bytes live at the end, per category.
  const profiler::TimelinePoint& end = session.timeline().back();
  CHECK(end.by_category[size_t(Category::Parameters)] == param_bytes);
  CHECK(end.by_category[size_t(Category::Gradients)] == grad_bytes);
  CHECK(end.by_category[size_t(Category::OptimizerState)] == 2 * param_bytes);
  CHECK(records_of(session, "Adam").size() == 1);
}

TEST_CASE("profiler: attach marks blocks made before start, and the peak table adds up to the peak") {
  manual_seed(3);
  Net net;
  optim::Adam opt(net.parameters(), {.lr = 1e-3});
  train_step(net, opt);  // state and gradients exist before the session
  profiler::Session session;
  session.attach(net);
  session.attach(opt);
  memory::reset_peak(kCPU);
  session.start();
  train_step(net, opt);
  session.stop();
  const memory::MemoryStats stats = memory::stats(kCPU);

  CHECK(session.peak_allocated() == stats.allocated_bytes.peak);
  int64_t sum = 0;
  for (const profiler::AllocationGroup& g : session.live_at_peak()) {
    sum += g.bytes;
    CHECK(g.op != "(trace overflow)");
  }
  CHECK(sum == session.peak_allocated());
  CHECK(session.lost_events() == 0);
  for (size_t i = 1; i < session.live_at_peak().size(); ++i)
    CHECK(session.live_at_peak()[i - 1].bytes >= session.live_at_peak()[i].bytes);

  int64_t param_bytes = 0;
  for (const Tensor& p : net.parameters()) param_bytes += rounded(p);
  const auto by_category = session.category_bytes_at_peak();
  CHECK(by_category[size_t(Category::Parameters)] == param_bytes);
  CHECK(by_category[size_t(Category::OptimizerState)] == 2 * param_bytes);
  // The parameters were made before start: attach named their modules.
  bool head_params = false;
  for (const profiler::AllocationGroup& g : session.live_at_peak())
    if (g.module == "head" && g.category == Category::Parameters && g.op == "(before start)") {
      head_params = true;
      CHECK(g.bytes == rounded(net.head->weight) + rounded(net.head->bias));
    }
  CHECK(head_params);

  const std::string table = session.top_allocations_table(3);
  CHECK(table.find("total at peak") != std::string::npos);
  CHECK(table.find(memory::format_bytes(session.peak_allocated())) != std::string::npos);
  CHECK(table.find("more groups") != std::string::npos);
  const std::string snapshot = session.snapshot_text();
  CHECK(snapshot.find("parameters") != std::string::npos);
  CHECK(snapshot.find("segment") != std::string::npos);
}

TEST_CASE("profiler: the Chrome trace parses and its counters match the allocator's stats") {
  manual_seed(4);
  Net net;
  optim::Adam opt(net.parameters(), {.lr = 1e-3});
  profiler::Session session;
  session.attach(net, "net");
  memory::reset_peak(kCPU);
  session.start();
  train_step(net, opt);
  session.stop();
  const memory::MemoryStats stats = memory::stats(kCPU);

  const json::Value doc = json::parse(session.chrome_trace());
  const json::Value* events = doc.find("traceEvents");
  REQUIRE(events);
  REQUIRE(events->is_array());
  int64_t last_allocated = -1, max_allocated = -1, last_reserved = -1;
  size_t counters = 0;
  bool backward_with_module = false, optimizer_span = false;
  for (const json::Value& e : events->items) {
    const std::string name = e.find("name")->text, ph = e.find("ph")->text;
    if (ph == "C" && name == "allocated bytes") {
      const int64_t v = int64_t(*e.find("args")->find("allocated")->as_uint64());
      last_allocated = v;
      max_allocated = std::max(max_allocated, v);
      ++counters;
    }
    if (ph == "C" && name == "reserved bytes") last_reserved = int64_t(*e.find("args")->find("reserved")->as_uint64());
    if (ph == "X") {
      CHECK(e.find("dur"));
      if (name == "LinearBackward" && e.find("args")->find("module")->text == "net.head")
        backward_with_module = e.find("cat")->text == "backward";
      if (name == "Adam") optimizer_span = e.find("cat")->text == "optimizer";
    }
  }
  CHECK(counters == session.events().size() + 1);                // one per event, after the start point
  for (const profiler::TimelinePoint& p : session.timeline()) {  // the replay accounts for every byte
    int64_t sum = 0;
    for (int64_t b : p.by_category) sum += b;
    CHECK(sum == p.allocated);
  }
  CHECK(last_allocated == stats.allocated_bytes.current);
  CHECK(last_reserved == stats.reserved_bytes.current);
  CHECK(max_allocated == stats.allocated_bytes.peak);
  CHECK(backward_with_module);
  CHECK(optimizer_span);
}

TEST_CASE("profiler: out of memory shows as an instant event") {
  memory::empty_cache(kCPU);  // no cached segment left that could hold the request
  profiler::Session session;
  session.start();
  const size_t reserved = size_t(memory::stats(kCPU).reserved_bytes.current);
  memory::set_memory_limit(reserved + (1 << 20), kCPU);
  CHECK_THROWS_AS(empty({256 << 20}, {kBool}), OutOfMemoryError);
  memory::set_memory_limit(0, kCPU);
  session.stop();
  const json::Value doc = json::parse(session.chrome_trace());
  size_t ooms = 0;
  for (const json::Value& e : doc.find("traceEvents")->items)
    if (e.find("ph")->text == "i" && e.find("name")->text == "out of memory") {
      ++ooms;
      CHECK(*e.find("args")->find("requested")->as_uint64() == uint64_t(256) << 20);
    }
  CHECK(ooms == 1);
}

TEST_CASE("profiler: the timeline SVG is well formed, one area per category, peak labelled") {
  manual_seed(5);
  Net net;
  optim::Adam opt(net.parameters(), {.lr = 1e-3});
  profiler::Session session;
  session.attach(net);
  session.start();
  train_step(net, opt);
  session.stop();
  const std::string svg = session.timeline_svg();
  CHECK(svg.rfind("<svg", 0) == 0);
  CHECK(svg.find("</svg>") == svg.size() - 7);
  CHECK(balanced_xml(svg));
  CHECK(count(svg, "<path") == 6);
  for (const char* c : {"parameters", "gradients", "optimizer_state", "activations", "workspace", "other"})
    CHECK(count(svg, std::string("data-category=\"") + c + "\"") == 1);
  CHECK(svg.find("class=\"reserved\"") != std::string::npos);
  CHECK(svg.find("time (ms)") != std::string::npos);
  CHECK(svg.find("memory (MiB)") != std::string::npos);
  char peak[64];
  std::snprintf(peak, sizeof peak, "peak %.2f MiB", double(session.peak_allocated()) / (1024.0 * 1024.0));
  CHECK(svg.find(peak) != std::string::npos);
}

TEST_CASE("profiler: op times nest; self time excludes nested ops") {
  profiler::Session session;
  session.start();
  {
    core::OpScope outer("outer_op");
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
    for (int i = 0; i < 2; ++i) {
      core::OpScope inner("inner_op");
      std::this_thread::sleep_for(std::chrono::milliseconds(3));
    }
  }
  session.stop();
  const auto times = session.op_times();
  auto find = [&](const std::string& op) {
    return *std::find_if(times.begin(), times.end(), [&](const profiler::OpTime& t) { return t.op == op; });
  };
  const profiler::OpTime outer = find("outer_op"), inner = find("inner_op");
  CHECK(outer.calls == 1);
  CHECK(inner.calls == 2);
  CHECK(inner.total_ms >= 6.0);
  CHECK(inner.self_ms == doctest::Approx(inner.total_ms));
  CHECK(outer.total_ms >= inner.total_ms + 2.0);
  CHECK(outer.self_ms == doctest::Approx(outer.total_ms - inner.total_ms).epsilon(1e-9));
  CHECK(records_of(session, "inner_op")[0].depth == 1);
  const std::string table = session.op_time_table();
  CHECK(table.find("inner_op") != std::string::npos);
  CHECK(table.find("share") != std::string::npos);
}

TEST_CASE("profiler: a small trace ring loses events but the peak still adds up") {
  manual_seed(6);
  Net net;
  optim::Adam opt(net.parameters(), {.lr = 1e-3});
  profiler::Session session({.device = kCPU, .trace_capacity = 16});
  session.start();
  train_step(net, opt);
  session.stop();
  CHECK(session.lost_events() > 0);
  CHECK(session.events().size() == 16);
  int64_t sum = 0;
  for (const auto& g : session.live_at_peak()) sum += g.bytes;
  CHECK(sum == session.peak_allocated());
}

TEST_CASE("profiler: without a session nothing is recorded and results are the same") {
  auto run = [](bool profile) {
    manual_seed(7);
    Net net;
    optim::Adam opt(net.parameters(), {.lr = 1e-3});
    profiler::Session session;
    if (profile) session.start();
    std::vector<double> losses;
    for (int i = 0; i < 2; ++i) losses.push_back(train_step(net, opt));
    if (profile) session.stop();
    std::vector<float> weights = net.head->weight.tolist<float>();
    return std::make_pair(losses, weights);
  };
  const auto plain = run(false);
  CHECK_FALSE(core::profiling());
  CHECK(memory::trace_events(kCPU).empty());
  const auto profiled = run(true);
  CHECK(plain.first == profiled.first);  // bit for bit: profiling changes no numerics
  CHECK(plain.second == profiled.second);
  CHECK_FALSE(core::profiling());
  CHECK(memory::trace_events(kCPU).empty());  // stop() turned the trace off

  // Two sessions at once are refused, and a stopped one can start again.
  profiler::Session a, b;
  a.start();
  CHECK_THROWS_AS(b.start(), Error);
  a.stop();
  b.start();
  b.stop();
}

TEST_CASE("profiler: convolution workspace and Module::to() get their categories") {
  manual_seed(8);
  auto conv = std::make_shared<nn::Conv2d>(3, 8, 3, nn::Conv2dModuleOptions{.padding = 1});
  profiler::Session session;
  session.attach(*conv, "conv");
  session.start();
  Tensor out = (*conv)(randn({2, 3, 16, 16}));  // im2col buffer: (3 * 3 * 3) x (16 * 16) floats per slot
  conv->to(kFloat64);                           // new parameter storage
  session.stop();

  int64_t workspace = 0;
  std::set<const void*> parameter_allocs;
  for (const memory::TraceEvent& e : session.events()) {
    if (e.action != TraceAction::Alloc) continue;
    if (e.category == Category::Workspace) {
      workspace += int64_t(e.size);
      CHECK(session.module_name(e.module) == "conv");
    }
    if (e.category == Category::Parameters) parameter_allocs.insert(e.ptr);
  }
  CHECK(workspace >= int64_t(memory::detail::round_size(27 * 256 * sizeof(float))));
  CHECK(parameter_allocs.count(data_of(conv->weight)));
  CHECK(parameter_allocs.count(data_of(conv->bias)));
}

namespace {
// Net's layers, called through forward() instead of operator() (as the README's model does).
struct ForwardNet : nn::UnaryModule {
  std::shared_ptr<nn::Sequential> encoder;
  std::shared_ptr<nn::Linear> head;
  ForwardNet() {
    encoder = register_module("encoder",
                              std::make_shared<nn::Sequential>(std::initializer_list<std::shared_ptr<nn::UnaryModule>>{
                                  std::make_shared<nn::Linear>(8, 16), std::make_shared<nn::ReLU>()}));
    head = register_module("head", std::make_shared<nn::Linear>(16, 4));
  }
  Tensor forward(const Tensor& x) override { return head->forward(encoder->forward(x)); }
};

// (module name, op, category, bytes) of every allocation of a forward and backward of `net`
// called as `call` (m(x) or m.forward(x)), on fixed data.
template <typename Model, typename Call>
std::multiset<std::tuple<std::string, std::string, int, size_t>> attributed(Model& net, Call call) {
  manual_seed(2);
  const Tensor x = randn({32, 8}), y = randint(0, 4, {32});
  profiler::Session session;
  session.attach(net);
  session.start();
  cross_entropy(call(net, x), y).backward();
  session.stop();
  std::multiset<std::tuple<std::string, std::string, int, size_t>> out;
  for (const memory::TraceEvent& e : session.events())
    if (e.action == TraceAction::Alloc)
      out.emplace(e.module ? session.module_name(e.module) : "", e.op, int(e.category), e.size);
  return out;
}
}  // namespace

TEST_CASE("profiler: m(x) and m.forward(x) attribute memory to the modules alike (Note [Module attribution])") {
  // Net calls its layers as m(x), ForwardNet as m.forward(x); each is itself called both
  // ways. The four profiles must be one: the same bytes, ops, categories and module names.
  manual_seed(1);
  Net net;
  ForwardNet fnet;
  const auto reference = attributed(net, [](Net& m, const Tensor& x) { return m(x); });
  std::set<std::string> names;
  for (const auto& [module, op, category, bytes] : reference) names.insert(module);
  for (const char* layer : {"encoder.0", "encoder.1", "head"}) CHECK(names.count(layer));
  CHECK(attributed(net, [](Net& m, const Tensor& x) { return m.forward(x); }) == reference);
  CHECK(attributed(fnet, [](ForwardNet& m, const Tensor& x) { return m(x); }) == reference);
  CHECK(attributed(fnet, [](ForwardNet& m, const Tensor& x) { return m.forward(x); }) == reference);
}

TEST_CASE("profiler: a free reports its block's category, a shared module its first path, the seed is backward's") {
  manual_seed(4);
  auto relu = std::make_shared<nn::ReLU>();
  auto inner = std::make_shared<nn::Sequential>(
      std::initializer_list<std::shared_ptr<nn::UnaryModule>>{std::make_shared<nn::Linear>(6, 9), relu});
  auto net = std::make_shared<nn::Sequential>(std::initializer_list<std::shared_ptr<nn::UnaryModule>>{
      std::make_shared<nn::Linear>(5, 6), inner, std::make_shared<nn::Linear>(9, 3), relu});
  profiler::Session session;
  session.attach(*net, "net");
  // The one ReLU object is net.1.1 and net.3: it keeps its first path, as torch's named_modules().
  CHECK(session.module_name(relu.get()) == "net.1.1");
  session.start();
  Tensor y = (*net)(randn({4, 5}));
  mean(y).backward();  // backward() makes the seed, ones({})
  net->zero_grad();    // frees every .grad from the user's scope
  session.stop();
  std::map<const void*, Category> live;
  int grad_frees = 0, seeds = 0;
  for (const memory::TraceEvent& e : session.events()) {
    if (e.action == TraceAction::Alloc || e.action == TraceAction::Relabel) live[e.ptr] = e.category;
    if (e.action == TraceAction::Alloc && e.op && std::string(e.op) == "backward") ++seeds;
    if (e.action != TraceAction::Free || !live.count(e.ptr)) continue;
    CHECK(e.category == live[e.ptr]);  // the block's own category, not the freeing scope's
    grad_frees += e.category == Category::Gradients;
    live.erase(e.ptr);
  }
  CHECK(grad_frees == 6);  // three Linear layers' weight and bias .grad, freed by zero_grad
  CHECK(seeds >= 1);

  // A tensor used twice: the engine sums its gradients in place (Note [Engine order]), and
  // nothing the backward allocates is "outside ops".
  profiler::Session twice;
  const Tensor input = randn({4, 5});  // the user's: made before the session
  twice.start();
  const Tensor h = (*net)(input);
  sum(add(mul(h, h.detach()), mul(h, 2.0))).backward();
  twice.stop();
  for (const memory::TraceEvent& e : twice.events())
    if (e.action == TraceAction::Alloc) CHECK_MESSAGE((e.op && *e.op), "an allocation outside ops, ", e.size, " bytes");
}

TEST_CASE("profiler: a dead model's blocks are not its name, capacity 0 is refused, files are valid UTF-8") {
  // attach() remembered block addresses for good: the allocator handed a dead model's block
  // to the next tensor of its size, which was then reported as that model's parameters.
  profiler::Session session;
  {
    auto old = std::make_shared<nn::Linear>(256, 256);
    session.attach(*old, "old");
  }
  const Tensor other = randn({256, 256}), other2 = randn({256});
  session.start();
  session.stop();
  for (const profiler::AllocationGroup& g : session.live_at_peak()) {
    CHECK(g.module != "old");
    CHECK(g.category != Category::Parameters);
  }
  // A ring of no events silently recorded nothing.
  profiler::Session empty({.trace_capacity = 0});
  check_error([&] { empty.start(); }, {"profiler", "trace_capacity", "got 0"});
  // JSON text must be UTF-8: a name with stray bytes is written with U+FFFD in their place.
  CHECK(json::quote("bad\xff\xfe"
                    "utf8 \xc3\xa9 \xed\xa0\x80 \xf0\x9f\x98\x80") ==
        "\"bad\\ufffd\\ufffdutf8 \xc3\xa9 \\ufffd\\ufffd\\ufffd \xf0\x9f\x98\x80\"");
  check_error([&] { session.write_files("/proc/frugal_profiler_test/x"); }, {"profiler", "cannot make the folder"});
  // The text tables: a newline in a name broke its row; a long name was cut inside a UTF-8
  // character (one the JSON quote then shows as U+FFFD).
  profiler::Session named;
  auto lin = std::make_shared<nn::Linear>(64, 64);
  std::string long_name;  // 44 bytes, kept from byte 19 on: the second byte of an e-acute
  for (int i = 0; i < 20; ++i) long_name += "\xc3\xa9";
  long_name += "a\nbc";
  named.attach(*lin, long_name);
  named.start();
  (void)lin->forward(randn({8, 64}));
  named.stop();
  const std::string table = named.top_allocations_table(20);
  CHECK(table.find("a\nb") == std::string::npos);
  CHECK(json::quote(table).find("\\ufffd") == std::string::npos);
}
