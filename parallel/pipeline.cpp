// Pipeline stages and schedules.
//
// Note [Pipeline schedules]
// With p stages and m micro-batches, stage s runs forward F_i and backward B_i of each
// micro-batch i. GPipe (fill-drain): F_0..F_{m-1}, then B_{m-1}..B_0; every stage holds
// all m micro-batches' activations at the peak. 1F1B (PipeDream-Flush, Megatron): stage s
// runs w = min(p - s - 1, m) warm-up forwards, then alternates one forward and one
// backward, then drains the last w backwards; it holds at most w + 1 micro-batches. Both
// idle (p - 1) slots of forward+backward per stage, so the bubble is (p - 1) / (m + p - 1)
// of the step when all stages cost the same; 1F1B's gain is memory, not time.
//
// Messages: a step's first activation is a header (dtype, rank, shape and the step's batch
// size, 9 int64s) then the tensor, later ones the tensor alone (every micro-batch has the
// first one's shape; the last stage checks its target's rows against the batch size, since
// a loss such as mse_loss would broadcast a mismatch; the header costs the receiver a host
// round trip, so it is paid once per step); a gradient comes back with the shape the sender
// already knows. Each pair of adjacent stages must post its sends and receives in the same
// order (NCCL matches them in order and a stream-ordered send waits for its receive). In
// 1F1B's steady state (Megatron's send_forward_recv_backward / send_backward_recv_forward)
// stage s computes F_{w+k}, then sends its activation while receiving B_k's output
// gradient, runs B_k, then sends B_k's input gradient while receiving F_{w+k+1}'s
// activation: each pair is one Communicator::send_recv with one neighbour, which NCCL runs
// as one fused group, so the two transfers overlap instead of queueing one behind the other
// on the communication stream. Stage s+1 (one fewer warm-up forward) posts the mirror pairs
// at the same points of its own schedule.
// Sends are asynchronous; their Works (and the tensors they read) are kept until the end of
// the step.
//
// The loss of micro-batch i is loss_fn(out_i, target_i) / m, so the accumulated .grad equal
// those of the mean loss over the whole batch (micro-batches of equal size). With
// recompute, each micro-batch's stage forward runs under autograd::checkpoint: only the
// stage input is kept, the stage's activations are recomputed in its backward.
//
// Note [Pipeline busy time]
// A stage's bubble is 1 - busy / step: busy sums each forward's and backward's own time.
// The pipeline's bubble is the idle share of all stages' time over the pipeline's span,
// 1 - sum(busy) / (p * longest step). (Each stage's own step ends when its own work does:
// the last stage's ends before the first stage's final backward, so summing the stages' own
// steps would leave that drain out.) The theory's (p - 1) / (m + p - 1) assumes stages of
// equal cost; with unequal ones the cheaper stage idles more and the dearer one less (with
// 2 stages of 6 BERT layers the second also computes its input's gradient, ~2% more work).
// On CUDA that is GPU time between two events recorded on the compute stream around the
// work, read once the step has synchronized, so measuring neither stalls the host nor
// changes the schedule; a stream wait on a received activation or gradient falls outside
// those intervals and counts as bubble, as it should. (Timing with a device synchronize
// around each piece would add a host round trip per micro-batch and serialize the
// stages' queues, and so overstate the bubble it measures.) On the CPU an op has
// finished when it returns, so the host clock measures the same thing.
#include "parallel/pipeline.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <limits>
#include <optional>

#include "autograd/checkpoint.h"
#include "autograd/engine.h"
#include "autograd/grad_mode.h"
#include "autograd/ops/binary.h"
#include "autograd/ops/reduce.h"
#include "core/instrument.h"
#include "core/stream.h"
#include "tensor/factory.h"

namespace frugal::parallel {

// ---- splitting ---------------------------------------------------------------------------

StageBounds split_by_index(size_t n, int stages) {
  FRUGAL_CHECK(stages > 0 && size_t(stages) <= n, "split_by_index: cannot split ", n, " modules into ", stages,
               " non-empty stages");
  StageBounds out;
  const size_t base = n / size_t(stages), extra = n % size_t(stages);
  size_t begin = 0;
  for (size_t s = 0; s < size_t(stages); ++s) {
    const size_t len = base + (s < extra ? 1 : 0);
    out.emplace_back(begin, begin + len);
    begin += len;
  }
  return out;
}

// Linear partition by dynamic programming: best[s][i] = the smallest possible largest
// stage cost when the first i modules form s stages. O(stages * n^2), n is small.
StageBounds split_by_cost(const std::vector<double>& costs, int stages) {
  const size_t n = costs.size();
  FRUGAL_CHECK(stages > 0 && size_t(stages) <= n, "split_by_cost: cannot split ", n, " modules into ", stages,
               " non-empty stages");
  for (double c : costs) FRUGAL_CHECK(c >= 0 && std::isfinite(c), "split_by_cost: costs must be finite and >= 0");
  std::vector<double> prefix(n + 1, 0.0);
  for (size_t i = 0; i < n; ++i) prefix[i + 1] = prefix[i] + costs[i];
  constexpr double kInf = std::numeric_limits<double>::infinity();
  const size_t S = size_t(stages);
  std::vector<std::vector<double>> best(S + 1, std::vector<double>(n + 1, kInf));
  std::vector<std::vector<size_t>> cut(S + 1, std::vector<size_t>(n + 1, 0));
  best[0][0] = 0.0;
  for (size_t s = 1; s <= S; ++s)
    for (size_t i = s; i <= n; ++i)
      for (size_t j = s - 1; j < i; ++j) {  // the last stage is modules [j, i)
        const double worst = std::max(best[s - 1][j], prefix[i] - prefix[j]);
        if (worst < best[s][i]) best[s][i] = worst, cut[s][i] = j;
      }
  StageBounds out(S);
  size_t end = n;
  for (size_t s = S; s >= 1; --s) {
    out[s - 1] = {cut[s][end], end};
    end = cut[s][end];
  }
  return out;
}

std::vector<double> parameter_costs(const nn::Sequential& model) {
  std::vector<double> out;
  for (size_t i = 0; i < model.size(); ++i) out.push_back(double(model[i]->num_parameters()) + 1.0);
  return out;
}

namespace {
double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}
}  // namespace

std::vector<double> time_costs(const nn::Sequential& model, const Tensor& sample, int reps) {
  FRUGAL_CHECK(reps > 0, "time_costs: reps must be positive, got ", reps);
  std::vector<double> out;
  Tensor h = sample;
  for (size_t i = 0; i < model.size(); ++i) {
    std::vector<double> times;
    Tensor next;
    for (int r = 0; r <= reps; ++r) {  // run 0 is the warm-up
      Tensor x = h.detach();
      if (x.is_floating_point()) x.requires_grad_();
      synchronize(x.device());
      const auto t0 = std::chrono::steady_clock::now();
      next = model[i]->forward(x);
      if (next.requires_grad()) sum(next).backward();
      synchronize(x.device());
      if (r > 0) times.push_back(seconds_since(t0));
    }
    std::nth_element(times.begin(), times.begin() + times.size() / 2, times.end());
    out.push_back(times[times.size() / 2]);
    h = next.detach();
  }
  for (size_t i = 0; i < model.size(); ++i) model[i]->zero_grad();
  return out;
}

std::shared_ptr<nn::Sequential> make_stage(const nn::Sequential& model, std::pair<size_t, size_t> range) {
  FRUGAL_CHECK(range.first < range.second && range.second <= model.size(), "make_stage: range [", range.first, ", ",
               range.second, ") is not a non-empty range of the model's ", model.size(), " modules");
  auto stage = std::make_shared<nn::Sequential>();
  for (size_t i = range.first; i < range.second; ++i) stage->push_back(model[i]);
  return stage;
}

// ---- the stage -----------------------------------------------------------------------------

PipelineStage::PipelineStage(std::shared_ptr<nn::UnaryModule> module, std::shared_ptr<Communicator> comm,
                             PipelineOptions options)
    : module_(std::move(module)), comm_(std::move(comm)), options_(options) {
  FRUGAL_CHECK(module_ && comm_, "PipelineStage: needs a module and a communicator");
  FRUGAL_CHECK(options_.micro_batches > 0, "PipelineStage: micro_batches must be positive, got ",
               options_.micro_batches);
}

namespace {

constexpr int64_t kMaxDims = 6;
constexpr int64_t kHeaderLen = 3 + kMaxDims;  // ndim, dtype, the step's batch size, up to 6 sizes

// A step's traffic with the neighbouring stages: activations down, gradients up. The
// first activation of a step carries a header; the others must match it (one
// host-blocking header round trip per step instead of per micro-batch).
struct StageLink {
  Communicator& comm;
  int rank;
  Device device;
  std::vector<std::pair<std::shared_ptr<Work>, Tensor>> sends;  // kept alive until waited on
  std::optional<std::pair<Shape, DType>> sent_meta = std::nullopt, received_meta = std::nullopt;
  /// The step's batch size: the first stage's input rows, passed down in the headers so that
  /// the last stage can check its target against it (mse_loss would broadcast a mismatch).
  int64_t batch = -1;

  void send(const Tensor& t, int peer) { sends.emplace_back(comm.send(t, peer), t); }
  /// Sends `t` to `peer` while receiving `into` from it (one fused exchange); returns `into`.
  Tensor send_recv(const Tensor& t, const Tensor& into, int peer) {
    auto [sent, received] = comm.send_recv(t, peer, into, peer);
    sends.emplace_back(std::move(sent), t);
    received->wait();
    return into;
  }
  Tensor recv(const Tensor& into, int peer) {
    comm.recv(into, peer)->wait();
    return into;
  }
  void wait_sends() {
    for (auto& [work, tensor] : sends) work->wait();
  }

  /// The activation as sent: checked against the step's first, whose header goes out first.
  Tensor activation_payload(const Tensor& t) {
    FRUGAL_CHECK(t.dim() <= kMaxDims, "PipelineStage: activations of more than ", kMaxDims,
                 " dims are not supported, got ", t.describe());
    if (sent_meta) {
      FRUGAL_CHECK(sent_meta->first == t.sizes() && sent_meta->second == t.dtype(), "PipelineStage: stage ", rank,
                   " produced ", t.describe(), " for a later micro-batch, but its first micro-batch's activation was ",
                   dtype_name(sent_meta->second), shape_str(sent_meta->first),
                   ": every micro-batch of a step must give the same shape");
      return t.detach().contiguous();
    }
    sent_meta = std::pair{t.sizes(), t.dtype()};
    std::vector<int64_t> header(kHeaderLen, 0);
    header[0] = t.dim();
    header[1] = int64_t(t.dtype());
    header[2] = batch;
    for (int64_t d = 0; d < t.dim(); ++d) header[size_t(3 + d)] = t.size(d);
    send(from_vector(header, {kHeaderLen}).to(device), rank + 1);
    return t.detach().contiguous();
  }
  void send_activation(const Tensor& t) { send(activation_payload(t), rank + 1); }

  /// An empty tensor for the next activation (its header is read on the step's first).
  Tensor activation_buffer() {
    if (!received_meta) {
      Tensor header = empty({kHeaderLen}, {kInt64, device});
      comm.recv(header, rank - 1)->wait();
      const Tensor h = header.cpu();
      const int64_t* v = static_cast<const int64_t*>(h.data());
      // A header is read from another process: check each field before it makes a tensor
      // (its sizes are checked by empty() below, Note [Size overflow]).
      FRUGAL_CHECK(v[0] >= 0 && v[0] <= kMaxDims, "PipelineStage: bad activation header from stage ", rank - 1, ": ",
                   v[0], " dims (at most ", kMaxDims, ")");
      FRUGAL_CHECK(v[1] >= 0 && v[1] < kNumDTypes, "PipelineStage: bad activation header from stage ", rank - 1,
                   ": dtype code ", v[1], " names no dtype");
      received_meta = std::pair{Shape(v + 3, v + 3 + v[0]), DType(v[1])};
      batch = v[2];
    }
    return empty(received_meta->first, {received_meta->second, device});
  }
  static Tensor as_stage_input(Tensor t) {
    if (t.is_floating_point()) t.requires_grad_();
    return t;
  }
  Tensor recv_activation() { return as_stage_input(recv(activation_buffer(), rank - 1)); }
};

// Busy time (Note [Pipeline busy time]): CUDA events around each compute on the
// stream, read after the step's final synchronize; host clock on the CPU, whose ops
// finish before they return.
struct BusyClock {
  bool enabled;
  Device device;
  double busy = 0.0;  // seconds
  std::vector<std::pair<void*, void*>> events;

  template <typename F>
  void timed(F&& f) {
    if (!enabled) return f();
    if (device.is_cuda()) {
      void* start = core::record_timing_event(device);
      f();
      events.emplace_back(start, core::record_timing_event(device));
      return;
    }
    const auto t0 = std::chrono::steady_clock::now();
    f();
    busy += seconds_since(t0);
  }
  /// Adds the device's busy time to `busy` and returns the events (the stream has finished).
  void collect() {
    for (auto& [start, end] : events) {
      busy += core::timing_event_elapsed_ms(start, end) * 1e-3;
      core::release_timing_event(start);
      core::release_timing_event(end);
    }
    events.clear();
  }
};

// One train_step's state and its schedules (Note [Pipeline schedules]).
struct StepRun {
  nn::UnaryModule& module;
  const PipelineOptions& options;
  const PipelineLoss& loss_fn;
  Tensor input, target;
  int rank, size, m;
  bool first, last;
  StageLink link;
  BusyClock clock;

  std::vector<Tensor> inputs, outputs;  // per micro-batch, until its backward
  Tensor loss_sum;                      // (1) on the last stage
  int64_t in_flight = 0, peak_in_flight = 0;

  /// F_i on `x` (the received activation; the first stage slices its input); the
  /// activation is sent by the caller.
  void forward(int i, Tensor x = Tensor()) {
    if (first) x = input.narrow(0, int64_t(i) * (input.size(0) / m), input.size(0) / m);
    else if (!x.defined()) x = link.recv_activation();
    clock.timed([&] {
      if (options.recompute)
        outputs[size_t(i)] = autograd::checkpoint([this](const Tensor& h) { return module.forward(h); }, x);
      else outputs[size_t(i)] = module.forward(x);
    });
    inputs[size_t(i)] = x;
    peak_in_flight = std::max(peak_in_flight, ++in_flight);
  }

  /// B_i: the loss (last stage) or the received output gradient, backward. Returns the
  /// input gradient to send upstream (undefined on the first stage or for a non-float input).
  Tensor backward(int i, Tensor grad_out = Tensor()) {
    Tensor& out = outputs[size_t(i)];
    clock.timed([&] {
      if (last) {
        FRUGAL_CHECK(target.size(0) == link.batch, "PipelineStage.train_step: the last stage's target ",
                     target.describe(), " has ", target.size(0), " rows but the first stage's input has ", link.batch,
                     ": micro-batch ", i, "'s target would not be its output's rows");
        const int64_t mb = target.size(0) / m;
        const Tensor loss = div(loss_fn(out, target.narrow(0, int64_t(i) * mb, mb)), double(m));
        FRUGAL_CHECK(loss.numel() == 1, "PipelineStage: the loss function must return one value, got ",
                     loss.describe());
        loss.backward();
        const Tensor value = loss.detach().reshape({1});
        loss_sum = loss_sum.defined() ? add(loss_sum, value) : value.clone();
      } else if (out.requires_grad()) {
        out.backward(grad_out);
      }
    });
    Tensor upstream;
    if (!first && inputs[size_t(i)].is_floating_point()) {
      const Tensor g = inputs[size_t(i)].grad();
      upstream = g.defined() ? g : zeros_like(inputs[size_t(i)]);
    }
    out = Tensor();
    inputs[size_t(i)] = Tensor();
    --in_flight;
    return upstream;
  }
  void send_upstream(const Tensor& g) {
    if (g.defined()) link.send(g, rank - 1);
  }

  Tensor grad_buffer(int i) const { return empty(outputs[size_t(i)].sizes(), outputs[size_t(i)].options()); }
  Tensor recv_grad(int i) { return link.recv(grad_buffer(i), rank + 1); }

  bool has_grad_downstream(int i) const { return !last && outputs[size_t(i)].is_floating_point(); }

  void run_gpipe() {
    for (int i = 0; i < m; ++i) {
      forward(i);
      if (!last) link.send_activation(outputs[size_t(i)]);
    }
    for (int i = m - 1; i >= 0; --i) send_upstream(backward(i, has_grad_downstream(i) ? recv_grad(i) : Tensor()));
  }

  // Steady state (Note [Pipeline schedules]): after F_i, F_i's activation goes down while
  // B_k's output gradient comes up; after B_k, its input gradient goes up while F_{i+1}'s
  // activation comes down. Each pair is one fused exchange with one neighbour.
  void run_1f1b() {
    const int warmup = std::min(size - rank - 1, m);
    for (int i = 0; i < warmup; ++i) {
      forward(i);
      if (!last) link.send_activation(outputs[size_t(i)]);
    }
    const int steady = m - warmup;
    Tensor next = steady > 0 && !first ? link.recv_activation() : Tensor();
    for (int k = 0; k < steady; ++k) {
      const int i = warmup + k;
      forward(i, next);
      Tensor g;
      if (!last) {
        const Tensor a = link.activation_payload(outputs[size_t(i)]);
        if (has_grad_downstream(k)) g = link.send_recv(a, grad_buffer(k), rank + 1);
        else link.send(a, rank + 1);
      }
      const Tensor upstream = backward(k, g);
      next = Tensor();
      if (k + 1 < steady && !first) {
        if (upstream.defined())
          next = link.as_stage_input(link.send_recv(upstream, link.activation_buffer(), rank - 1));
        else next = link.recv_activation();
      } else {
        send_upstream(upstream);
      }
    }
    for (int k = steady; k < m; ++k) send_upstream(backward(k, has_grad_downstream(k) ? recv_grad(k) : Tensor()));
  }
};

}  // namespace

PipelineStats PipelineStage::train_step(const Tensor& input, const Tensor& target, const PipelineLoss& loss_fn) {
  const int m = options_.micro_batches;
  if (is_first())
    FRUGAL_CHECK(input.defined() && input.dim() >= 1 && input.size(0) % m == 0, "PipelineStage.train_step: the first ",
                 "stage needs an input whose batch dim divides into ", m, " micro-batches, got ",
                 input.defined() ? input.describe() : std::string("none"));
  if (is_last())
    FRUGAL_CHECK(target.defined() && target.dim() >= 1 && target.size(0) % m == 0 && loss_fn,
                 "PipelineStage.train_step: the last stage needs a loss function and a target whose batch dim divides ",
                 "into ", m, " micro-batches, got ", target.defined() ? target.describe() : std::string("none"));
  const auto t0 = std::chrono::steady_clock::now();
  StepRun run{.module = *module_,
              .options = options_,
              .loss_fn = loss_fn,
              .input = input,
              .target = target,
              .rank = comm_->rank(),
              .size = comm_->size(),
              .m = m,
              .first = is_first(),
              .last = is_last(),
              .link = {.comm = *comm_,
                       .rank = comm_->rank(),
                       .device = comm_->device(),
                       .sends = {},
                       .batch = is_first() ? input.size(0) : -1},
              .clock = {.enabled = options_.measure_busy, .device = comm_->device(), .events = {}},
              .inputs = std::vector<Tensor>(size_t(m)),
              .outputs = std::vector<Tensor>(size_t(m)),
              .loss_sum = {}};
  if (options_.schedule == Schedule::GPipe) run.run_gpipe();
  else run.run_1f1b();
  run.link.wait_sends();
  synchronize(comm_->device());
  run.clock.collect();

  PipelineStats stats;
  stats.step_seconds = seconds_since(t0);
  // Every stage learns the loss (one tiny broadcast from the last stage).
  Tensor loss = run.last ? run.loss_sum : empty({1}, {kFloat32, comm_->device()});
  if (run.last && loss.dtype() != kFloat32) loss = loss.to(kFloat32);
  comm_->broadcast(loss, comm_->size() - 1)->wait();
  stats.loss = double(loss.cpu().item<float>());
  stats.busy_seconds = stats.bubble_measured = stats.stage_bubble = -1.0;
  const int p = comm_->size();
  if (options_.measure_busy) {  // Note [Pipeline busy time]: this stage's, and the pipeline's
    stats.busy_seconds = run.clock.busy;
    const auto idle_share = [](double span, double busy) { return span > 0 ? 1.0 - busy / span : 0.0; };
    stats.stage_bubble = idle_share(stats.step_seconds, run.clock.busy);
    // One max-reduction gives the longest step (slot 0) and every stage's busy time (its slot).
    std::vector<double> slots(size_t(p) + 1, 0.0);
    slots[0] = stats.step_seconds;
    slots[size_t(comm_->rank()) + 1] = run.clock.busy;
    Tensor all = from_vector(slots, {p + 1}).to(comm_->device());
    comm_->all_reduce(all, ReduceOp::Max)->wait();
    const std::vector<double> got = all.tolist<double>();
    double busy_sum = 0.0;
    for (int r = 1; r <= p; ++r) busy_sum += got[size_t(r)];
    stats.bubble_measured = idle_share(double(p) * got[0], busy_sum);
  }
  stats.bubble_theoretical = double(p - 1) / double(m + p - 1);
  stats.peak_in_flight = run.peak_in_flight;
  return stats;
}

}  // namespace frugal::parallel
