#include "nn/data/dataset.h"

namespace frugal::data {

ImageDataset::ImageDataset(Tensor images, Tensor labels) {
  FRUGAL_CHECK(images.defined() && labels.defined(), "ImageDataset: images and labels must be defined tensors");
  FRUGAL_CHECK(images.dtype() == kUInt8 && (images.dim() == 3 || images.dim() == 4), "ImageDataset: images ",
               images.describe(), " must be uint8 (N, C, H, W) or (N, H, W)");
  FRUGAL_CHECK(labels.dtype() == kInt64 && labels.dim() == 1, "ImageDataset: labels ", labels.describe(),
               " must be int64 (N)");
  FRUGAL_CHECK(images.size(0) == labels.size(0), "ImageDataset: images ", images.describe(), " and labels ",
               labels.describe(), " differ in their number of samples");
  FRUGAL_CHECK(images.device().is_cpu() && labels.device().is_cpu(), "ImageDataset: images ", images.describe(),
               " and labels ", labels.describe(), " must live on the host");
  images = images.detach().contiguous();
  // (N, H, W) -> (N, 1, H, W): one channel, as torchvision's ToTensor reads a grey image.
  if (images.dim() == 3) images = images.view({images.size(0), 1, images.size(1), images.size(2)});
  images_ = images;
  labels_ = labels.detach().contiguous();
}

Example ImageDataset::get(int64_t i) const {
  check_index("ImageDataset::get", i, size());
  return {images_.select(0, i), labels_.select(0, i)};
}

}  // namespace frugal::data
