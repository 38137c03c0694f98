#include "train/checks.h"

#include <unistd.h>

#include <cerrno>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <sstream>
#include <vector>

#include "nn/file.h"  // save_target
#include "tensor/factory.h"
#include "tensor/ops/binary.h"
#include "tensor/ops/join.h"
#include "tensor/ops/reduce.h"

namespace frugal::train {

namespace {

// "nan" whatever its sign bit (printf and iostreams may write "-nan"), else as %g.
std::string number(double v) {
  if (std::isnan(v)) return "nan";
  std::ostringstream s;
  s << v;
  return s.str();
}

}  // namespace

void LossWatch::add(const Tensor& loss, int64_t epoch, int64_t step) {
  const Tensor l = loss.detach();
  if (count_++ == 0) epoch_ = epoch, first_step_ = step;
  last_step_ = step;
  if (l.device().is_cpu()) {
    const double v = l.item<double>();
    if (!std::isfinite(v) && !scaler_skips()) {
      first_step_ = step;  // the exact step: every earlier one was checked as it came
      diverged("the loss is " + number(v));
    }
    if (std::isfinite(v)) host_.sum += v, ++host_.count;
    else ++host_.nonfinite;
  } else if (!scaler_skips()) {  // a non-finite loss makes the sum non-finite: check() throws
    device_sum_ = device_sum_.defined() ? ops::add(device_sum_, l) : l.to(kFloat64);
  } else {  // the finite losses summed, and counted: l - l is 0 exactly where l is finite
    const Tensor l64 = l.to(kFloat64);
    const Tensor finite = ops::eq(ops::sub(l64, l64), 0.0);
    const Tensor kept = ops::where(finite, l64, zeros_like(l64)), one = finite.to(kFloat64);
    device_sum_ = device_sum_.defined() ? ops::add(device_sum_, kept) : kept;
    device_count_ = device_count_.defined() ? ops::add(device_count_, one) : one;
  }
  // The scale is free to read while the host holds it; once the device does (Note
  // [GradScaler host state]) check() reads it, with the sync it makes anyway.
  if (scaler_skips() && !scaler_->scale_on_device() && scaler_->get_scale() < min_scale()) {
    first_step_ = step;
    scale_collapsed();
  }
}

void LossWatch::scale_collapsed() const {
  diverged("the GradScaler has skipped so many steps for inf/NaN gradients that its scale fell to " +
           number(scaler_->get_scale()) + " (below " + number(min_scale()) + ")");
}

LossSum LossWatch::check() {
  LossSum out = host_;
  if (device_sum_.defined()) {
    const int64_t on_device = count_ - host_.count - host_.nonfinite;
    if (device_count_.defined()) {  // one read of both: [sum, count]
      const std::vector<double> both = ops::stack({device_sum_, device_count_}).tolist<double>();
      const auto finite = int64_t(both[1]);
      out.sum += both[0], out.count += finite, out.nonfinite += on_device - finite;
    } else {
      out.sum += device_sum_.item<double>(), out.count += on_device;
    }
  }
  if (!std::isfinite(out.sum) && !scaler_skips() && !device_sum_.defined() && out.nonfinite == 0)
    diverged("the losses, each finite, summed past the largest double (" + number(out.sum) + "): losses this large " +
             "are the divergence");  // every one was checked as it came (add)
  if (!std::isfinite(out.sum) && !scaler_skips()) {
    const std::string summed = device_sum_.defined() ? " (summed on " + device_sum_.device().str() + ")" : "";
    diverged("a loss was not finite: the sum of these steps' losses" + summed + " is " + number(out.sum));
  }
  if (count_ > 0 && scaler_skips() && scaler_->scale_on_device() && scaler_->get_scale() < min_scale())
    scale_collapsed();
  host_ = LossSum{}, device_sum_ = Tensor(), device_count_ = Tensor(), count_ = 0;
  return out;
}

void LossWatch::diverged(const std::string& what) const {
  std::ostringstream where;
  if (epoch_ > 0) where << "epoch " << epoch_ << ", ";
  if (first_step_ == last_step_) where << "step " << last_step_;
  else where << "steps " << first_step_ << "-" << last_step_;
  // The lr before any schedule (which may have decayed it to 0 by now): what the user set.
  const auto& groups = opt_.param_groups();
  const std::string lr =
      groups.empty() ? "" : "the base learning rate is " + number(groups[0].initial_lr.value_or(groups[0].lr)) + ": ";
  FRUGAL_FAIL("training diverged at ", where.str(), ": ", what, "; ", lr, "try a lower learning rate");
}

void require_finite(const std::vector<std::pair<std::string, Tensor>>& tensors, const std::string& path) {
  for (const auto& [name, t] : tensors) {
    if (!t.defined() || !is_floating(t.dtype()) || t.numel() == 0) continue;
    // t - t is 0 where t is finite and NaN where it is inf or NaN; its sum cannot overflow.
    const double probe = ops::sum(ops::sub(t, t)).item<double>();
    FRUGAL_CHECK(std::isfinite(probe), "not saving ", path, ": '", name,
                 "' holds inf or NaN (the run diverged; the file is left as it was)");
  }
}

void require_writable(const std::string& path, const std::string& flag) {
  namespace fs = std::filesystem;
  FRUGAL_CHECK(!path.empty(), flag, ": the path is empty");
  std::error_code ec;
  FRUGAL_CHECK(!fs::is_directory(path, ec), flag, ": '", path, "' is a directory, not a file");
  const fs::path parent = fs::path(path).parent_path();
  const std::string dir = parent.empty() ? "." : parent.string();
  FRUGAL_CHECK(fs::is_directory(dir, ec), flag, ": cannot write '", path, "': directory '", dir,
               fs::exists(dir, ec) ? "' is not a directory" : "' does not exist");
  FRUGAL_CHECK(::access(dir.c_str(), W_OK | X_OK) == 0, flag, ": cannot write '", path, "': directory '", dir,
               "' is not writable (", std::strerror(errno), ")");
  nn::save_target(path, flag.c_str());  // not a FIFO or a device: Note [Saving over what is there]
}

void require_writable_dir(const std::string& dir, const std::string& flag) {
  namespace fs = std::filesystem;
  FRUGAL_CHECK(!dir.empty(), flag, ": the path is empty");
  std::error_code ec;
  fs::create_directories(dir, ec);
  FRUGAL_CHECK(!ec, flag, ": cannot create directory '", dir, "' (", ec.message(), ")");
  FRUGAL_CHECK(fs::is_directory(dir, ec), flag, ": '", dir, "' is not a directory");
  FRUGAL_CHECK(::access(dir.c_str(), W_OK | X_OK) == 0, flag, ": directory '", dir, "' is not writable (",
               std::strerror(errno), ")");
}

int64_t require_batches(const data::DataLoader& loader, int64_t samples) {
  const int64_t batches = loader.size();
  const data::DataLoaderOptions& o = loader.options();
  FRUGAL_CHECK(batches > 0, "the training set yields no batch: ", samples, " samples, batch size ", o.batch_size,
               o.drop_last && samples > 0 ? " (a last partial batch is dropped)" : "");
  return batches;
}

}  // namespace frugal::train
