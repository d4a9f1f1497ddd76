// Dataset readers: IDX (MNIST, Fashion-MNIST) and CIFAR-10's binary version.
// Each validates what it reads and throws IoError naming the file.
#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "nabla/data.h"
#include "nabla/error.h"
#include "nabla/io.h"

namespace nabla {

namespace {

namespace fs = std::filesystem;

constexpr const char* kFashionFiles[2][2] = {
    {"t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte"},
    {"train-images-idx3-ubyte", "train-labels-idx1-ubyte"},
};

// `dir/name` when it exists, else `dir/name.gz`, else "".
std::string existing(const std::string& dir, const std::string& name) {
  std::error_code ec;
  for (const std::string& candidate : {dir + "/" + name, dir + "/" + name + ".gz"}) {
    if (fs::is_regular_file(candidate, ec)) return candidate;
  }
  return "";
}

bool holds_fashion_mnist(const std::string& dir) {
  for (const auto& split : kFashionFiles) {
    for (const char* name : split) {
      if (existing(dir, name).empty()) return false;
    }
  }
  return true;
}

std::string read_whole_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw IoError(path + ": cannot open for reading");
  std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (in.bad()) throw IoError(path + ": read failed");
  return bytes;
}

}  // namespace

ImageDataset load_idx_dataset(const std::string& images_path, const std::string& labels_path,
                              int64_t classes) {
  IdxArray images = read_idx(images_path);
  IdxArray labels = read_idx(labels_path);
  const Shape& s = images.shape;
  if (s.size() != 3 && s.size() != 4) {
    throw IoError(images_path +
                  ": images must have rank 3 [N, H, W] or 4 [N, C, H, W], got shape " +
                  to_string(s));
  }
  for (int64_t d : s) {
    if (d == 0)
      throw IoError(images_path + ": images have an empty dimension: shape " + to_string(s));
  }
  if (labels.shape.size() != 1) {
    throw IoError(labels_path + ": labels must have rank 1 [N], got shape " +
                  to_string(labels.shape));
  }
  if (labels.shape[0] != s[0]) {
    throw IoError(labels_path + ": holds " + std::to_string(labels.shape[0]) + " labels, but " +
                  images_path + " holds " + std::to_string(s[0]) + " images");
  }
  if (classes < 0)
    throw UsageError("load_idx_dataset: classes must be >= 0, got " + std::to_string(classes));

  ImageDataset d;
  d.n = s[0];
  d.channels = s.size() == 4 ? s[1] : 1;
  d.height = s[s.size() - 2];
  d.width = s[s.size() - 1];
  d.pixels = std::move(images.data);
  d.labels.assign(labels.data.begin(), labels.data.end());
  int64_t max_label = *std::max_element(d.labels.begin(), d.labels.end());
  if (classes == 0) {
    d.classes = std::max<int64_t>(max_label + 1, 10);
  } else {
    for (int64_t i = 0; i < d.n; ++i) {
      if (d.labels[i] >= classes) {
        throw IoError(labels_path + ": label " + std::to_string(d.labels[i]) + " of sample " +
                      std::to_string(i) + " is outside [0, " + std::to_string(classes) + ")");
      }
    }
    d.classes = classes;
  }
  return d;
}

const std::vector<std::string>& fashion_mnist_class_names() {
  static const std::vector<std::string> names = {"T-shirt/top", "Trouser",   "Pullover", "Dress",
                                                 "Coat",        "Sandal",    "Shirt",    "Sneaker",
                                                 "Bag",         "Ankle boot"};
  return names;
}

const std::vector<std::string>& cifar10_class_names() {
  static const std::vector<std::string> names = {
      "airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck"};
  return names;
}

std::string find_fashion_mnist() {
  if (const char* root = std::getenv("NABLA_DATA"); root && *root) {
    std::string dir = std::string(root) + "/fashion-mnist";
    if (holds_fashion_mnist(dir)) return dir;
  }
  const std::string system_dir = "/usr/share/datasets/fashion-mnist";
  if (holds_fashion_mnist(system_dir)) return system_dir;
  return "";
}

ImageDataset load_fashion_mnist(const std::string& dir_in, bool train) {
  std::string dir = dir_in.empty() ? find_fashion_mnist() : dir_in;
  if (dir.empty()) {
    throw IoError(
        "Fashion-MNIST not found in $NABLA_DATA/fashion-mnist or "
        "/usr/share/datasets/fashion-mnist: install "
        "Debian's dataset-fashion-mnist package or set NABLA_DATA");
  }
  std::string paths[2];
  for (int i = 0; i < 2; ++i) {
    const char* name = kFashionFiles[train][i];
    paths[i] = existing(dir, name);
    if (paths[i].empty()) {
      throw IoError(dir + ": has neither " + name + " nor " + name +
                    ".gz (not a Fashion-MNIST directory)");
    }
  }
  ImageDataset d = load_idx_dataset(paths[0], paths[1], 10);
  if (d.channels != 1 || d.height != 28 || d.width != 28) {
    throw IoError(paths[0] + ": Fashion-MNIST images are 28x28 grey, got " +
                  std::to_string(d.channels) + "x" + std::to_string(d.height) + "x" +
                  std::to_string(d.width));
  }
  d.class_names = fashion_mnist_class_names();
  return d;
}

ImageDataset load_cifar10(const std::string& dir_in, bool train) {
  constexpr int64_t kChannels = 3, kSide = 32, kImage = kChannels * kSide * kSide,
                    kRecord = 1 + kImage;
  std::string dir = dir_in;
  std::error_code ec;
  if (!fs::exists(dir + "/test_batch.bin", ec) &&
      fs::is_directory(dir + "/cifar-10-batches-bin", ec)) {
    dir += "/cifar-10-batches-bin";
  }
  std::vector<std::string> files;
  if (train) {
    for (int i = 1; i <= 5; ++i) files.push_back(dir + "/data_batch_" + std::to_string(i) + ".bin");
  } else {
    files.push_back(dir + "/test_batch.bin");
  }

  ImageDataset d;
  d.channels = kChannels;
  d.height = d.width = kSide;
  d.classes = 10;
  d.class_names = cifar10_class_names();
  for (const std::string& path : files) {
    std::string bytes = read_whole_file(path);
    int64_t size = static_cast<int64_t>(bytes.size());
    if (size == 0 || size % kRecord != 0) {
      throw IoError(path + ": " + std::to_string(size) + " bytes is not a whole number of " +
                    std::to_string(kRecord) + "-byte CIFAR-10 records");
    }
    int64_t records = size / kRecord;
    d.pixels.reserve(d.pixels.size() + records * kImage);
    for (int64_t r = 0; r < records; ++r) {
      const auto* rec = reinterpret_cast<const uint8_t*>(bytes.data()) + r * kRecord;
      if (rec[0] >= 10) {
        throw IoError(path + ": record " + std::to_string(r) + " has label " +
                      std::to_string(rec[0]) + ", expected 0 to 9");
      }
      d.labels.push_back(rec[0]);
      d.pixels.insert(d.pixels.end(), rec + 1, rec + kRecord);
    }
    d.n += records;
  }
  return d;
}

}  // namespace nabla
