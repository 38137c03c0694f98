#pragma once
// IDX files: the format of MNIST and Fashion-MNIST (LeCun et al.), raw or gzipped.
// Layout, all integers big-endian: 0x00 0x00, a type byte (0x08 = unsigned byte, the
// only one these datasets use), a byte with the number of dimensions d, d u32 sizes,
// then the elements row-major. Images are magic 0x00000803 (N, rows, cols), labels
// 0x00000801 (N).
#include <cstdint>
#include <string>
#include <vector>

#include "tensor/tensor.h"

namespace frugal::data {

/// The contents of one IDX file of unsigned bytes.
struct IdxData {
  std::string path;            // where it was read from, for error messages
  std::vector<int64_t> shape;  // the d sizes of the header
  std::vector<uint8_t> bytes;  // numel_of(shape) elements, row-major
};

/// Reads an IDX file of unsigned bytes, gzip-compressed or not (detected from the
/// content). Validates the magic number, the type byte and that the file holds exactly
/// the bytes its dimensions promise. Throws frugal::Error naming the file.
IdxData read_idx(const std::string& path);

/// An image file (magic 0x00000803, (N, H, W)) as float32 (N, 1, H, W) scaled to [0, 1].
Tensor idx_images_to_tensor(const IdxData& idx);
/// A label file (magic 0x00000801, (N)) as int64 (N).
Tensor idx_labels_to_tensor(const IdxData& idx);

/// Fashion-MNIST (or MNIST: same files): images float32 (N, 1, 28, 28) in [0, 1],
/// labels int64 (N) in [0, 10).
struct FashionMnist {
  Tensor train_images, train_labels, test_images, test_labels;
};

/// Loads train-images-idx3-ubyte, train-labels-idx1-ubyte, t10k-images-idx3-ubyte and
/// t10k-labels-idx1-ubyte from `dir`, each with or without a ".gz" suffix (Debian's
/// dataset-fashion-mnist installs them gzipped in /usr/share/datasets/fashion-mnist).
/// Checks that images and labels agree in count and that labels lie in [0, 10).
FashionMnist load_fashion_mnist(const std::string& dir);

}  // namespace frugal::data
