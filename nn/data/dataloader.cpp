#include "nn/data/dataloader.h"

#include <algorithm>
#include <condition_variable>
#include <cstring>
#include <exception>
#include <map>
#include <mutex>
#include <numeric>
#include <optional>
#include <system_error>
#include <thread>

#include "autograd/offload_stream.h"
#include "core/stream.h"
#include "memory/allocator.h"
#include "memory/pinned.h"
#include "tensor/factory.h"
#include "tensor/philox.h"

namespace frugal::data {

// Note [DataLoader pipeline]
// One pass runs a producer/consumer pipeline of depth `prefetch`:
//   workers : each claims the next batch index not yet claimed, prepares that batch into
//             a fresh block of the pinned host pool, and files it under its index. For a
//             TensorDataset it gathers the rows (one memcpy per sample and tensor); for any
//             other Dataset it reads each sample with get_at_epoch(i, epoch) and collates.
//             A worker claims batch i only while i < consumed + max(prefetch, workers), so
//             at most that many batches are in flight or waiting.
//   next()  : wait for the batch at index `consumed` (batches are delivered in index
//             order, whichever worker finished first) and hand it over; for a CUDA
//             loader, on the device (below).
// The copy to a CUDA device is issued by the consumer, not the worker: the device memory
// is allocated on the stream the training step runs on (the current stream is per thread;
// the worker's would be the wrong one). The first batch of a pass is copied with
// Tensor::to(device), a cudaMemcpyAsync on that stream. Each later batch is staged: when
// next() hands over batch i and batch i + 1 is already prepared (never waiting for it),
// next() starts i + 1's copy on the side stream of autograd/offload_stream.h, after what
// the step's stream has queued so far (the block may have been that stream's), so it
// runs during step i instead of after it; the next next() makes the step's stream wait
// for the copy's event (no host wait) and hands the batch over. A batch not prepared in
// time is copied on the step's stream as the first one is. Either way the pinned block
// dies with the host batch while the copy may still be in flight:
// memory::record_stream(block, stream) makes the pinned pool hold the block back until
// the copy has completed (see Note [Stream-aware reuse]), so nothing overwrites it early.
// A staged batch that is never handed over (a pass abandoned) is still waited for by the
// step's stream before its device memory is freed, so the block is not reused while
// the copy writes it.
// Determinism: which samples batch i holds is fixed by (seed, epoch) before any thread
// starts, and a sample's content by (epoch, i) (Note [Per-sample randomness] in
// transforms.cpp), so 1 and N workers deliver identical batches.
// Errors: a worker catches whatever preparing a batch throws and files it in that batch's
// place, then leaves; next() rethrows it in order and ends the pass. Stopping (a new pass,
// an abandoned loop, the destructor) sets `stop` and joins; workers waiting for room wake
// up and leave, so an early `break` never deadlocks.

namespace {

// 64-bit random words of one epoch: Philox4x32-10 keyed by the seed, with the 128-bit
// counter (k, epoch). A pure function of (seed, epoch, k), independent of the
// standard library's distributions, so orders are identical on every platform.
class EpochRandom {
 public:
  EpochRandom(uint64_t seed, uint64_t epoch) : seed_(seed), epoch_(epoch) {}
  // Uniform in [0, bound), bound >= 1, by rejection (no modulo bias).
  uint64_t below(uint64_t bound) {
    const uint64_t threshold = (0 - bound) % bound;  // 2^64 mod bound
    while (true) {
      const uint64_t r = word();
      if (r >= threshold) return r % bound;
    }
  }

 private:
  uint64_t word() {
    const PhiloxResult r = philox4x32_10(uint32_t(k_), uint32_t(k_ >> 32), uint32_t(epoch_), uint32_t(epoch_ >> 32),
                                         uint32_t(seed_), uint32_t(seed_ >> 32));
    ++k_;
    return (uint64_t(r.x[0]) << 32) | r.x[1];
  }
  uint64_t seed_, epoch_, k_ = 0;
};

// Rows `rows[0..count)` of `src` (N, ...), contiguous on the host, into pinned memory: (count, ...).
Tensor gather_rows(const Tensor& src, const int64_t* rows, int64_t count) {
  Shape sizes = src.sizes();
  sizes[0] = count;
  const size_t row_bytes = size_t(numel_of(Shape(sizes.begin() + 1, sizes.end()))) * src.element_size();
  DataPtr block = memory::allocate_pinned(size_t(count) * row_bytes);
  if (row_bytes > 0) {
    const auto* from = static_cast<const uint8_t*>(src.data());
    auto* to = static_cast<uint8_t*>(block.get());
    for (int64_t i = 0; i < count; ++i)
      std::memcpy(to + size_t(i) * row_bytes, from + size_t(rows[i]) * row_bytes, row_bytes);
  }
  return from_data_ptr(std::move(block), sizes, src.dtype());
}

// examples[k].<part> (all of one shape and dtype) stacked into pinned memory: (B, ...).
Tensor stack_part(const std::vector<Example>& examples, Tensor Example::*part, const char* name) {
  const Tensor& first = examples[0].*part;
  for (size_t k = 0; k < examples.size(); ++k) {
    const Tensor& t = examples[k].*part;
    FRUGAL_CHECK(t.defined() && t.device().is_cpu(), "collate: example ", k, "'s ", name,
                 " must be a defined host tensor, got ", t.defined() ? t.describe() : "undefined");
    FRUGAL_CHECK(t.sizes() == first.sizes() && t.dtype() == first.dtype(), "collate: example ", k, "'s ", name, " ",
                 t.describe(), " differs from example 0's ", first.describe());
  }
  Shape sizes = first.sizes();
  sizes.insert(sizes.begin(), int64_t(examples.size()));
  const size_t bytes = size_t(first.numel()) * first.element_size();
  DataPtr block = memory::allocate_pinned(examples.size() * bytes);
  auto* to = static_cast<uint8_t*>(block.get());
  for (size_t k = 0; k < examples.size() && bytes > 0; ++k)
    std::memcpy(to + k * bytes, (examples[k].*part).contiguous().data(), bytes);
  return from_data_ptr(std::move(block), sizes, first.dtype());
}

// `host` (pinned) on `device`, copied asynchronously; see Note [DataLoader pipeline].
Tensor deliver(const Tensor& host, Device device) {
  if (device.is_cpu()) return host;
  Tensor out = host.to(device);
  memory::record_stream(host.impl().storage->data, current_stream(device));
  return out;
}

#if FRUGAL_WITH_CUDA
// `host` (pinned) into fresh memory of `device`, copied on the side stream; `event`
// completes with the copy.
Tensor stage(const Tensor& host, Device device, void*& event) {
  Tensor out = empty(host.sizes(), {host.dtype(), device});
  event = autograd::detail::copy_on_offload_stream(out.data(), host.data(), size_t(host.numel()) * host.element_size(),
                                                   device);
  memory::record_stream(host.impl().storage->data, autograd::detail::offload_stream(device));
  return out;
}
#endif

}  // namespace

Batch collate(const std::vector<Example>& examples) {
  FRUGAL_CHECK(!examples.empty(), "collate: no examples to stack");
  return {stack_part(examples, &Example::input, "input"), stack_part(examples, &Example::target, "target")};
}

struct DataLoader::Pass {
  struct Slot {
    Batch batch;               // host (pinned) tensors
    std::exception_ptr error;  // set instead when preparing the batch failed
  };
  // A batch whose copy to the device runs on the side stream (Note [DataLoader pipeline]).
  struct Staged {
    Batch batch;           // on the device, written by the copies
    void* events[2] = {};  // the inputs' and targets' copies
    Device device = kCPU;
    Staged() = default;
    Staged(const Staged&) = delete;
    Staged& operator=(const Staged&) = delete;
    /// The step's stream waits for the copies (no host wait); returns the batch.
    Batch take() {
#if FRUGAL_WITH_CUDA
      for (void*& e : events) {
        if (!e) continue;
        autograd::detail::wait_on_current_stream_untimed(e, device);
        autograd::detail::release_event(e);
        e = nullptr;
      }
#endif
      return std::move(batch);
    }
    ~Staged() { take(); }  // an abandoned copy: its device memory is freed only after it
  };
  std::unique_ptr<Staged> staged;  // batch `delivered` when set
  std::optional<Batch> unstaged;   // or the host batch `delivered`, when staging it failed
  std::vector<int64_t> order;
  int64_t epoch = 0;
  int64_t num_batches = 0;
  int64_t consumed = 0;   // batches taken from `ready` (or made) by next()
  int64_t delivered = 0;  // batches handed to the caller: consumed, or consumed - 1 with one staged
  int64_t claimed = 0;    // batches claimed by the workers (guarded by mu)
  std::mutex mu;
  std::condition_variable cv;
  std::map<int64_t, Slot> ready;  // prepared batches by index
  bool stop = false;
  std::vector<std::thread> workers;

  void stop_workers() {
    {
      std::lock_guard<std::mutex> lock(mu);
      stop = true;
    }
    cv.notify_all();
    for (std::thread& t : workers) t.join();
    workers.clear();
  }
};

DataLoader::DataLoader(const TensorDataset& dataset, DataLoaderOptions options)
    : DataLoader(std::make_shared<const TensorDataset>(dataset), options) {}

DataLoader::DataLoader(std::shared_ptr<const Dataset> dataset, DataLoaderOptions options)
    : dataset_(std::move(dataset)), options_(options) {
  FRUGAL_CHECK(dataset_ != nullptr, "DataLoader: the dataset is null");
  tensors_ = dynamic_cast<const TensorDataset*>(dataset_.get());
  check_options();
}

void DataLoader::check_options() const {
  FRUGAL_CHECK(options_.batch_size >= 1, "DataLoader: batch_size must be >= 1, got ", options_.batch_size);
  FRUGAL_CHECK(options_.prefetch >= 0, "DataLoader: prefetch must be >= 0, got ", options_.prefetch);
  FRUGAL_CHECK(options_.workers >= 1, "DataLoader: workers must be >= 1, got ", options_.workers);
  FRUGAL_CHECK(options_.device.is_cpu() || options_.device.index < cuda_device_count(), "DataLoader: device ",
               options_.device.str(), " is not available (", cuda_device_count(), " CUDA devices visible)");
}

DataLoader::~DataLoader() { end_pass(); }

int64_t DataLoader::size() const {
  const int64_t n = dataset_->size(), b = options_.batch_size;
  return options_.drop_last ? n / b : n == 0 ? 0 : 1 + (n - 1) / b;  // (n + b - 1 could overflow)
}

// Note [set_epoch after set_position]
// The usual loop sets each epoch before its pass (README, fashion_mnist):
//   for (int64_t epoch = loader.epoch(); epoch < epochs; ++epoch) {
//     loader.set_epoch(epoch);
//     for (data::Batch& b : loader) ...
// A run resumed mid-epoch (CheckpointManager::load -> set_position({e, b})) enters that loop
// with epoch e, and its set_epoch(e) must not send the loader back to batch 0: the resumed
// run would train on batches 0..b-1 of epoch e twice, silently. So set_epoch keeps a
// position set for the same epoch while no pass has started since; any other epoch, or a
// pass under way (set_epoch then restarts it), starts at batch 0.
void DataLoader::set_epoch(int64_t epoch) {
  FRUGAL_CHECK(epoch >= 0, "DataLoader::set_epoch: epoch must be >= 0, got ", epoch);
  const bool keeps_position = !pass_ && epoch == next_epoch_;  // Note [set_epoch after set_position]
  // A pass left early (a loop's break) ends here, not at the next begin(): in between,
  // position() would report it, and a checkpoint saved there would resume the old epoch.
  end_pass();
  next_epoch_ = epoch;
  if (!keeps_position) next_first_batch_ = 0;
}

DataLoader::Position DataLoader::position() const {
  if (!pass_) return {next_epoch_, next_first_batch_};
  if (pass_->delivered == pass_->num_batches) return {pass_->epoch + 1, 0};  // the pass is done
  return {pass_->epoch, pass_->delivered};
}

void DataLoader::set_position(Position position) {
  FRUGAL_CHECK(position.epoch >= 0, "DataLoader::set_position: epoch must be >= 0, got ", position.epoch);
  FRUGAL_CHECK(position.batch >= 0 && position.batch <= size(), "DataLoader::set_position: batch ", position.batch,
               " is outside [0, ", size(), "] (the batches of an epoch)");
  end_pass();
  next_epoch_ = position.epoch;
  next_first_batch_ = position.batch;
}

std::vector<int64_t> DataLoader::order(int64_t epoch) const {
  std::vector<int64_t> order(size_t(dataset_->size()));
  std::iota(order.begin(), order.end(), int64_t(0));
  if (options_.shuffle) {  // Fisher-Yates
    EpochRandom rng(options_.seed, uint64_t(epoch));
    for (size_t i = order.size(); i > 1; --i) std::swap(order[i - 1], order[rng.below(i)]);
  }
  return order;
}

Batch DataLoader::make_batch(const std::vector<int64_t>& order, int64_t index, int64_t epoch) const {
  const int64_t first = index * options_.batch_size;
  const int64_t count = std::min<int64_t>(options_.batch_size, dataset_->size() - first);
  const int64_t* rows = order.data() + first;
  if (tensors_) return {gather_rows(tensors_->inputs(), rows, count), gather_rows(tensors_->targets(), rows, count)};
  std::vector<Example> examples;
  examples.reserve(size_t(count));
  for (int64_t k = 0; k < count; ++k) examples.push_back(dataset_->get_at_epoch(rows[k], epoch));
  return collate(examples);
}

void DataLoader::start_pass() {
  end_pass();
  auto pass = std::make_unique<Pass>();
  pass->epoch = next_epoch_++;
  pass->order = order(pass->epoch);
  pass->num_batches = size();
  pass->consumed = pass->claimed = pass->delivered = next_first_batch_;  // set_position: resume mid-epoch
  next_first_batch_ = 0;
  if (options_.prefetch > 0 && pass->num_batches > 0) {
    Pass* p = pass.get();
    const int64_t window = std::max(options_.prefetch, options_.workers);
    const int64_t threads = std::min(options_.workers, p->num_batches);
    const auto work = [this, p, window] {
      while (true) {
        int64_t i;
        {
          std::unique_lock<std::mutex> lock(p->mu);
          // (claimed >= consumed always; consumed + window could overflow for a huge prefetch)
          p->cv.wait(lock, [&] { return p->stop || p->claimed - p->consumed < window; });
          if (p->stop || p->claimed == p->num_batches) return;
          i = p->claimed++;
        }
        Pass::Slot slot;
        try {
          slot.batch = make_batch(p->order, i, p->epoch);
        } catch (...) { slot.error = std::current_exception(); }
        const bool failed = slot.error != nullptr;
        {
          std::lock_guard<std::mutex> lock(p->mu);
          p->ready.emplace(i, std::move(slot));
        }
        p->cv.notify_all();
        if (failed) return;
      }
    };
    for (int64_t w = 0; w < threads; ++w) {
      try {
        p->workers.emplace_back(work);
      } catch (const std::system_error& e) {
        // A thread the system refuses (a pids or memory limit) must not unwind past the ones
        // started: a joinable std::thread's destructor terminates the process.
        p->stop_workers();
        FRUGAL_FAIL("DataLoader: could not start worker thread ", w + 1, " of ", threads,
                    " (workers = ", options_.workers, "): ", e.what(), "; use fewer workers");
      }
    }
  }
  pass_ = std::move(pass);
}

void DataLoader::end_pass() {
  if (!pass_) return;
  pass_->stop_workers();
  pass_.reset();
}

std::optional<Batch> DataLoader::take_prepared(bool wait) {
  Pass& p = *pass_;
  if (options_.prefetch == 0) {
    if (!wait) return std::nullopt;
    try {
      return make_batch(p.order, p.consumed++, p.epoch);
    } catch (...) {
      end_pass();
      throw;
    }
  }
  Pass::Slot slot;
  {
    std::unique_lock<std::mutex> lock(p.mu);
    if (wait) p.cv.wait(lock, [&] { return p.ready.count(p.consumed) > 0; });
    auto it = p.ready.find(p.consumed);
    if (it == p.ready.end() || (!wait && it->second.error)) return std::nullopt;  // errors rethrow in order
    slot = std::move(it->second);
    p.ready.erase(it);
    ++p.consumed;  // under the lock: the workers' window moves with it
  }
  p.cv.notify_all();
  if (slot.error) {
    end_pass();
    std::rethrow_exception(slot.error);
  }
  return std::move(slot.batch);
}

bool DataLoader::next(Batch& batch) {
  if (!pass_) start_pass();
  Pass& p = *pass_;
  if (p.delivered == p.num_batches) {
    end_pass();
    return false;
  }
  if (p.staged) {
    batch = p.staged->take();
    p.staged.reset();
  } else {
    Batch host = p.unstaged ? std::move(*p.unstaged) : *take_prepared(/*wait=*/true);
    p.unstaged.reset();
    batch.inputs = deliver(host.inputs, options_.device);
    batch.targets = deliver(host.targets, options_.device);
  }
  ++p.delivered;
#if FRUGAL_WITH_CUDA
  if (options_.device.is_cuda() && p.consumed < p.num_batches) {
    if (std::optional<Batch> host = take_prepared(/*wait=*/false)) {
      // A copy that cannot start (out of device memory) must not lose the batch: it is then
      // delivered by the next call as an unstaged one, and any error surfaces there, in order.
      try {
        auto staged = std::make_unique<Pass::Staged>();
        staged->device = options_.device;
        staged->batch.inputs = stage(host->inputs, options_.device, staged->events[0]);
        staged->batch.targets = stage(host->targets, options_.device, staged->events[1]);
        p.staged = std::move(staged);
        ++side_stream_copies_;
      } catch (const std::exception&) { p.unstaged = std::move(host); }
    }
  }
#endif
  return true;
}

DataLoader::Iterator DataLoader::begin() {
  start_pass();
  return Iterator(this);
}

}  // namespace frugal::data
