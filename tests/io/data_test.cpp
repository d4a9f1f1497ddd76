// Datasets (IDX, Fashion-MNIST, CIFAR-10) and the batch loader.
#include "nabla/data.h"

#include <gtest/gtest.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <array>
#include <set>

#include "nabla/error.h"
#include "nabla/io.h"

#include "temp_dir.h"

using namespace nabla;
namespace fs = std::filesystem;

namespace {

using nabla::testing_support::TempDir;

const char* kSystemFashion = "/usr/share/datasets/fashion-mnist";

// A fresh directory per test, removed afterwards.
std::string idx_bytes(const std::vector<uint32_t>& dims, const std::vector<uint8_t>& data,
                      uint8_t type = 0x08) {
  std::string b = {0, 0, static_cast<char>(type), static_cast<char>(dims.size())};
  for (uint32_t d : dims) {
    for (int s = 24; s >= 0; s -= 8) b.push_back(static_cast<char>((d >> s) & 0xff));
  }
  b.append(data.begin(), data.end());
  return b;
}

void write_raw(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  ASSERT_TRUE(out.good()) << path;
}

void write_gzip(const std::string& path, const std::string& bytes) {
  gzFile f = gzopen(path.c_str(), "wb");
  ASSERT_NE(f, nullptr) << path;
  ASSERT_EQ(gzwrite(f, bytes.data(), static_cast<unsigned>(bytes.size())),
            static_cast<int>(bytes.size()));
  ASSERT_EQ(gzclose(f), Z_OK);
}

std::string read_raw(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

// `f` throws an IoError whose message names `path` and contains `what`.
void expect_io_error(const std::function<void()>& f, const std::string& path,
                     const std::string& what) {
  try {
    f();
    ADD_FAILURE() << "expected an IoError about " << path << " (" << what << ")";
  } catch (const IoError& e) {
    std::string msg = e.what();
    EXPECT_NE(msg.find(path), std::string::npos) << "message does not name the file: " << msg;
    EXPECT_NE(msg.find(what), std::string::npos)
        << "message does not say '" << what << "': " << msg;
  }
}

std::vector<uint8_t> iota_bytes(size_t n, int start = 0) {
  std::vector<uint8_t> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = static_cast<uint8_t>(start + i);
  return v;
}

// Sample i's first pixel is i (so a batch row tells which sample it holds);
// its other pixels are a pattern; its label is i % classes.
ImageDataset make_dataset(int64_t n, int64_t c, int64_t h, int64_t w, int64_t classes = 10) {
  ImageDataset d;
  d.n = n;
  d.channels = c;
  d.height = h;
  d.width = w;
  d.classes = classes;
  d.pixels.resize(n * c * h * w);
  for (int64_t i = 0; i < n; ++i) {
    for (int64_t k = 0; k < c * h * w; ++k)
      d.pixels[i * c * h * w + k] = static_cast<uint8_t>(k == 0 ? i : 7 * k + i);
    d.labels.push_back(static_cast<int32_t>(i % classes));
  }
  return d;
}

struct Batch {
  std::vector<float> images;
  std::vector<int32_t> labels;
  int64_t rows = 0;
  bool operator==(const Batch& o) const {
    return images == o.images && labels == o.labels && rows == o.rows;
  }
};

// The rest of the current epoch.
std::vector<Batch> drain(BatchLoader& loader, const ImageDataset& d) {
  std::vector<Batch> out;
  for (;;) {
    Batch b;
    b.images.resize(loader.batch_size() * d.image_size());
    b.labels.resize(loader.batch_size());
    if (!loader.next(b.images.data(), b.labels.data())) break;
    b.rows = loader.batch_rows();
    out.push_back(std::move(b));
  }
  return out;
}

// Sample indices of an epoch, read back from the first pixel (mean 0, std 1).
std::vector<int64_t> sample_order(const std::vector<Batch>& batches, const ImageDataset& d) {
  std::vector<int64_t> order;
  for (const Batch& b : batches) {
    for (int64_t r = 0; r < b.rows; ++r)
      order.push_back(std::lround(b.images[r * d.image_size()] * 255.0f));
  }
  return order;
}

Normalize identity() { return {}; }

}  // namespace

// ---- IDX

TEST(Idx, ReadsRawAndGzip) {
  TempDir dir;
  std::vector<uint8_t> data = iota_bytes(2 * 3 * 4, 5);
  std::string bytes = idx_bytes({2, 3, 4}, data);
  write_raw(dir.file("a.idx"), bytes);
  write_gzip(dir.file("a.idx.gz"), bytes);
  for (std::string name : {"a.idx", "a.idx.gz"}) {
    IdxArray a = read_idx(dir.file(name));
    EXPECT_EQ(a.shape, (Shape{2, 3, 4})) << name;
    EXPECT_EQ(a.data, data) << name;
  }
  write_raw(dir.file("labels.idx"), idx_bytes({3}, {7, 8, 9}));
  EXPECT_EQ(read_idx(dir.file("labels.idx")).data, (std::vector<uint8_t>{7, 8, 9}));
}

TEST(Idx, BadFilesNameTheFile) {
  TempDir dir;
  std::string good = idx_bytes({2, 3}, iota_bytes(6));
  auto check = [&](const std::string& name, const std::string& bytes, const std::string& what) {
    write_raw(dir.file(name), bytes);
    expect_io_error([&] { read_idx(dir.file(name)); }, dir.file(name), what);
  };
  expect_io_error([&] { read_idx(dir.file("missing.idx")); }, dir.file("missing.idx"),
                  "cannot open");
  check("empty.idx", "", "not an IDX file");
  check("magic.idx", std::string("\x01\x02", 2) + good.substr(2), "bad magic");
  check("type.idx", idx_bytes({2, 3}, iota_bytes(6), 0x0d), "element type 0x0d");
  check("rank0.idx", std::string("\0\0\x08\0", 4), "rank 0");
  check("rank5.idx", idx_bytes({1, 1, 1, 1, 1}, {1}), "rank 5");
  check("header.idx", good.substr(0, 9), "truncated IDX header");
  check("short.idx", good.substr(0, good.size() - 1), "needs 6 bytes of data, the file has 5");
  check("long.idx", good + "x", "the file has 7");
  // Dimensions whose product overflows 64 bits must not wrap to a small size.
  check("huge.idx", idx_bytes({0xffffffffu, 0xffffffffu, 0xffffffffu, 0xffffffffu}, {1, 2}),
        "bytes of data");
}

TEST(Idx, BadGzipNamesTheFile) {
  TempDir dir;
  std::vector<uint8_t> data(5000);
  uint32_t x = 12345;
  for (uint8_t& v : data) v = static_cast<uint8_t>((x = x * 1103515245 + 12345) >> 24);
  write_gzip(dir.file("full.gz"), idx_bytes({5000}, data));
  std::string gz = read_raw(dir.file("full.gz"));
  ASSERT_GT(gz.size(), 100u);

  write_raw(dir.file("cut.gz"), gz.substr(0, gz.size() / 2));
  expect_io_error([&] { read_idx(dir.file("cut.gz")); }, dir.file("cut.gz"),
                  "truncated compressed data");
  // Only the trailer (CRC, length) missing: every data byte is there, yet the
  // file is cut short.
  write_raw(dir.file("notrailer.gz"), gz.substr(0, gz.size() - 4));
  expect_io_error([&] { read_idx(dir.file("notrailer.gz")); }, dir.file("notrailer.gz"),
                  "truncated compressed data");

  std::string corrupt = gz;
  for (size_t i = gz.size() / 2; i < gz.size() / 2 + 16; ++i)
    corrupt[i] = static_cast<char>(corrupt[i] ^ 0x5a);
  write_raw(dir.file("corrupt.gz"), corrupt);
  expect_io_error([&] { read_idx(dir.file("corrupt.gz")); }, dir.file("corrupt.gz"),
                  "corrupt compressed data");
}

TEST(IdxDataset, LoadsAndValidates) {
  TempDir dir;
  std::string images = dir.file("images"), labels = dir.file("labels");
  write_raw(images, idx_bytes({3, 2, 2}, iota_bytes(12)));
  write_gzip(labels, idx_bytes({3}, {0, 2, 1}));
  ImageDataset d = load_idx_dataset(images, labels);
  EXPECT_EQ(d.n, 3);
  EXPECT_EQ(d.channels, 1);
  EXPECT_EQ(d.height, 2);
  EXPECT_EQ(d.width, 2);
  EXPECT_EQ(d.classes, 10) << "MNIST-style files have at least 10 classes";
  EXPECT_EQ(d.pixels, iota_bytes(12));
  EXPECT_EQ(d.labels, (std::vector<int32_t>{0, 2, 1}));
  EXPECT_EQ(load_idx_dataset(images, labels, 3).classes, 3);

  write_raw(dir.file("labels14"), idx_bytes({3}, {0, 14, 1}));
  EXPECT_EQ(load_idx_dataset(images, dir.file("labels14")).classes, 15);
  expect_io_error([&] { load_idx_dataset(images, dir.file("labels14"), 10); }, dir.file("labels14"),
                  "label 14 of sample 1 is outside [0, 10)");

  write_raw(dir.file("rank4"), idx_bytes({3, 2, 1, 2}, iota_bytes(12)));
  ImageDataset d4 = load_idx_dataset(dir.file("rank4"), labels);
  EXPECT_EQ(d4.channels, 2);
  EXPECT_EQ(d4.height, 1);
  EXPECT_EQ(d4.width, 2);

  write_raw(dir.file("rank2"), idx_bytes({3, 4}, iota_bytes(12)));
  expect_io_error([&] { load_idx_dataset(dir.file("rank2"), labels); }, dir.file("rank2"),
                  "rank 3");
  write_raw(dir.file("empty_dim"), idx_bytes({3, 0, 2}, {}));
  expect_io_error([&] { load_idx_dataset(dir.file("empty_dim"), labels); }, dir.file("empty_dim"),
                  "empty");
  write_raw(dir.file("labels2d"), idx_bytes({3, 1}, {0, 1, 2}));
  expect_io_error([&] { load_idx_dataset(images, dir.file("labels2d")); }, dir.file("labels2d"),
                  "rank 1");
  write_raw(dir.file("labels4"), idx_bytes({4}, {0, 1, 2, 3}));
  expect_io_error([&] { load_idx_dataset(images, dir.file("labels4")); }, dir.file("labels4"),
                  "holds 4 labels, but " + images + " holds 3 images");
}

// ---- Fashion-MNIST

TEST(FashionMnist, FindsNablaDataAndUncompressedNames) {
  TempDir dir;
  std::string fm = dir.file("fashion-mnist");
  fs::create_directories(fm);
  const char* old = std::getenv("NABLA_DATA");
  std::string saved = old ? old : "";
  ::setenv("NABLA_DATA", dir.path().c_str(), 1);

  // Incomplete: not chosen.
  write_raw(fm + "/train-images-idx3-ubyte",
            idx_bytes({2, 28, 28}, std::vector<uint8_t>(2 * 784, 9)));
  std::string fallback =
      fs::exists(std::string(kSystemFashion) + "/train-labels-idx1-ubyte.gz") ? kSystemFashion : "";
  EXPECT_EQ(find_fashion_mnist(), fallback);

  write_raw(fm + "/train-labels-idx1-ubyte", idx_bytes({2}, {3, 9}));
  write_gzip(fm + "/t10k-images-idx3-ubyte.gz",
             idx_bytes({1, 28, 28}, std::vector<uint8_t>(784, 1)));
  write_gzip(fm + "/t10k-labels-idx1-ubyte.gz", idx_bytes({1}, {4}));
  EXPECT_EQ(find_fashion_mnist(), fm);
  ImageDataset train = load_fashion_mnist("", true);
  EXPECT_EQ(train.n, 2);
  EXPECT_EQ(train.labels, (std::vector<int32_t>{3, 9}));
  EXPECT_EQ(train.classes, 10);
  EXPECT_EQ(train.class_names, fashion_mnist_class_names());
  ImageDataset test = load_fashion_mnist(fm, false);
  EXPECT_EQ(test.n, 1);
  EXPECT_EQ(test.labels[0], 4);

  // Images that are not 28x28, a label of 10, a directory without the files.
  write_raw(fm + "/train-images-idx3-ubyte", idx_bytes({2, 4, 4}, std::vector<uint8_t>(32, 9)));
  expect_io_error([&] { load_fashion_mnist(fm, true); }, fm + "/train-images-idx3-ubyte", "28x28");
  write_gzip(fm + "/t10k-labels-idx1-ubyte.gz", idx_bytes({1}, {10}));
  expect_io_error([&] { load_fashion_mnist(fm, false); }, fm + "/t10k-labels-idx1-ubyte.gz",
                  "label 10");
  expect_io_error([&] { load_fashion_mnist(dir.file("nowhere"), true); }, dir.file("nowhere"),
                  "train-images-idx3-ubyte.gz");

  if (old)
    ::setenv("NABLA_DATA", saved.c_str(), 1);
  else
    ::unsetenv("NABLA_DATA");
}

TEST(FashionMnist, RealDataset) {
  if (!fs::exists(kSystemFashion)) {
    GTEST_SKIP() << kSystemFashion
                 << " is absent: install Debian's dataset-fashion-mnist (scripts/install-deps)";
  }
  for (bool train : {true, false}) {
    ImageDataset d = load_fashion_mnist(kSystemFashion, train);
    int64_t n = train ? 60000 : 10000;
    EXPECT_EQ(d.n, n);
    EXPECT_EQ(d.channels, 1);
    EXPECT_EQ(d.height, 28);
    EXPECT_EQ(d.width, 28);
    EXPECT_EQ(d.classes, 10);
    ASSERT_EQ(d.pixels.size(), size_t(n * 784));
    ASSERT_EQ(d.labels.size(), size_t(n));
    std::vector<int64_t> count(10, 0);
    for (int32_t l : d.labels) {
      ASSERT_TRUE(l >= 0 && l < 10) << l;
      ++count[l];
    }
    for (int c = 0; c < 10; ++c) EXPECT_EQ(count[c], n / 10) << "class " << c << " (balanced)";
    EXPECT_EQ(d.class_names[0], "T-shirt/top");
    EXPECT_EQ(d.class_names[9], "Ankle boot");
    if (train) {  // the published normalisation constants are the training set's
      double sum = 0, sum2 = 0;
      for (uint8_t p : d.pixels) {
        sum += p / 255.0;
        sum2 += (p / 255.0) * (p / 255.0);
      }
      double mean = sum / d.pixels.size(), std = std::sqrt(sum2 / d.pixels.size() - mean * mean);
      Normalize norm = Normalize::fashion_mnist();
      EXPECT_NEAR(mean, norm.mean[0], 5e-4);
      EXPECT_NEAR(std, norm.std[0], 5e-4);

      BatchLoader loader(d, 256, true, true, {2, true}, norm, 7);
      EXPECT_EQ(loader.batches_per_epoch(), 234);
      std::vector<float> images(256 * 784);
      std::vector<int32_t> labels(256);
      int64_t batches = 0;
      while (loader.next(images.data(), labels.data())) ++batches;
      EXPECT_EQ(batches, 234);
    }
  }
}

// ---- CIFAR-10

TEST(Cifar10, ReadsBinaryBatches) {
  TempDir dir;
  const int64_t kRecord = 3073;
  // data_batch_k holds k records; record r of file f has label (f + r) % 10
  // and pixel j = (f * 31 + r * 7 + j) % 256.
  auto record = [](int f, int r) {
    std::string rec(kRecord, '\0');
    rec[0] = static_cast<char>((f + r) % 10);
    for (int j = 0; j < 3072; ++j) rec[1 + j] = static_cast<char>((f * 31 + r * 7 + j) % 256);
    return rec;
  };
  auto write_batch = [&](const std::string& dir_path, const std::string& name, int f, int records) {
    std::string bytes;
    for (int r = 0; r < records; ++r) bytes += record(f, r);
    write_raw(dir_path + "/" + name, bytes);
  };
  for (int f = 1; f <= 5; ++f)
    write_batch(dir.path(), "data_batch_" + std::to_string(f) + ".bin", f, f);
  write_batch(dir.path(), "test_batch.bin", 0, 2);

  ImageDataset train = load_cifar10(dir.path(), true);
  EXPECT_EQ(train.n, 15);
  EXPECT_EQ(train.channels, 3);
  EXPECT_EQ(train.height, 32);
  EXPECT_EQ(train.width, 32);
  EXPECT_EQ(train.classes, 10);
  EXPECT_EQ(train.class_names, cifar10_class_names());
  ASSERT_EQ(train.pixels.size(), size_t(15 * 3072));
  int64_t i = 0;
  for (int f = 1; f <= 5; ++f) {
    for (int r = 0; r < f; ++r, ++i) {
      std::string rec = record(f, r);
      EXPECT_EQ(train.labels[i], (f + r) % 10);
      // CHW: channel 1, row 2, column 3 is byte 1024 + 64 + 3 of the image.
      EXPECT_EQ(train.pixels[i * 3072 + 1024 + 64 + 3],
                static_cast<uint8_t>(rec[1 + 1024 + 64 + 3]));
      EXPECT_EQ(rec.substr(1), std::string(train.pixels.begin() + i * 3072,
                                           train.pixels.begin() + (i + 1) * 3072));
    }
  }
  ImageDataset test = load_cifar10(dir.path(), false);
  EXPECT_EQ(test.n, 2);
  EXPECT_EQ(test.labels, (std::vector<int32_t>{0, 1}));

  // The archive's own layout: a cifar-10-batches-bin/ folder.
  fs::create_directories(dir.file("cifar-10-batches-bin"));
  fs::copy_file(dir.file("test_batch.bin"), dir.file("cifar-10-batches-bin/test_batch.bin"));
  fs::remove(dir.file("test_batch.bin"));
  EXPECT_EQ(load_cifar10(dir.path(), false).n, 2);
}

TEST(Cifar10, BadFilesNameTheFile) {
  TempDir dir;
  std::string good(3073 * 2, '\x01');
  write_raw(dir.file("test_batch.bin"), good + "abc");
  expect_io_error([&] { load_cifar10(dir.path(), false); }, dir.file("test_batch.bin"),
                  "6149 bytes is not a whole number of 3073-byte CIFAR-10 records");
  write_raw(dir.file("test_batch.bin"), "");
  expect_io_error([&] { load_cifar10(dir.path(), false); }, dir.file("test_batch.bin"), "0 bytes");
  std::string bad_label = good;
  bad_label[3073] = 10;
  write_raw(dir.file("test_batch.bin"), bad_label);
  expect_io_error([&] { load_cifar10(dir.path(), false); }, dir.file("test_batch.bin"),
                  "record 1 has label 10");
  for (int f : {1, 2, 4, 5}) write_raw(dir.file("data_batch_" + std::to_string(f) + ".bin"), good);
  expect_io_error([&] { load_cifar10(dir.path(), true); }, dir.file("data_batch_3.bin"),
                  "cannot open");
}

// ---- BatchLoader

TEST(BatchLoader, EverySampleOncePerEpoch) {
  ImageDataset d = make_dataset(10, 1, 2, 3);
  BatchLoader loader(d, 3, true, false, {}, identity(), 42);
  EXPECT_EQ(loader.batches_per_epoch(), 4);
  for (int64_t epoch = 0; epoch < 5; ++epoch) {
    loader.start_epoch(epoch);
    std::vector<Batch> batches = drain(loader, d);
    ASSERT_EQ(batches.size(), 4u);
    EXPECT_EQ(batches[3].rows, 1) << "the last batch is partial";
    for (int64_t r = 1; r < 3; ++r) {  // padding rows
      EXPECT_EQ(batches[3].labels[r], 0);
      EXPECT_EQ(batches[3].images[r * 6], 0.0f);
    }
    std::vector<int64_t> order = sample_order(batches, d);
    std::vector<int64_t> sorted = order;
    std::sort(sorted.begin(), sorted.end());
    for (int64_t i = 0; i < 10; ++i) EXPECT_EQ(sorted[i], i) << "epoch " << epoch;
    for (size_t k = 0; k < order.size(); ++k) {  // labels travel with their images
      EXPECT_EQ(batches[k / 3].labels[k % 3], d.labels[order[k]]);
    }
    Batch extra;
    extra.images.assign(18, -7.0f);
    extra.labels.assign(3, -7);
    EXPECT_FALSE(loader.next(extra.images.data(), extra.labels.data())) << "the epoch is over";
    EXPECT_EQ(extra.images[0], -7.0f) << "an exhausted loader writes nothing";
  }
}

TEST(BatchLoader, DropLastAndNoShuffle) {
  ImageDataset d = make_dataset(10, 1, 2, 3);
  BatchLoader loader(d, 3, false, true, {}, identity(), 1);
  EXPECT_EQ(loader.batches_per_epoch(), 3);
  std::vector<Batch> batches = drain(loader, d);
  ASSERT_EQ(batches.size(), 3u);
  EXPECT_EQ(sample_order(batches, d), (std::vector<int64_t>{0, 1, 2, 3, 4, 5, 6, 7, 8}));
  loader.start_epoch(9);
  EXPECT_EQ(sample_order(drain(loader, d), d), (std::vector<int64_t>{0, 1, 2, 3, 4, 5, 6, 7, 8}));

  BatchLoader shuffled(d, 3, true, true, {}, identity(), 1);
  std::set<int64_t> seen;
  for (int64_t epoch = 0; epoch < 20; ++epoch) {
    shuffled.start_epoch(epoch);
    std::vector<int64_t> order = sample_order(drain(shuffled, d), d);
    EXPECT_EQ(order.size(), 9u);
    EXPECT_EQ(std::set<int64_t>(order.begin(), order.end()).size(), 9u);
    seen.insert(order.begin(), order.end());
  }
  EXPECT_EQ(seen.size(), 10u) << "the dropped sample changes between epochs";
}

TEST(BatchLoader, OrderDependsOnSeedAndEpochOnly) {
  ImageDataset d = make_dataset(100, 1, 1, 2);
  auto order = [&](uint64_t seed, int64_t epoch, int64_t batch) {
    BatchLoader loader(d, batch, true, false, {}, identity(), seed);
    loader.start_epoch(epoch);
    return sample_order(drain(loader, d), d);
  };
  std::vector<int64_t> base = order(5, 2, 8);
  EXPECT_EQ(order(5, 2, 8), base) << "same seed and epoch";
  EXPECT_EQ(order(5, 2, 7), base) << "the order does not depend on the batch size";
  EXPECT_NE(order(5, 3, 8), base) << "another epoch";
  EXPECT_NE(order(6, 2, 8), base) << "another seed";
  std::vector<int64_t> natural(100);
  for (int64_t i = 0; i < 100; ++i) natural[i] = i;
  EXPECT_NE(base, natural);

  // Going back to an epoch reproduces it.
  BatchLoader loader(d, 8, true, false, {}, identity(), 5);
  loader.start_epoch(2);
  std::vector<Batch> first = drain(loader, d);
  loader.start_epoch(4);
  drain(loader, d);
  loader.start_epoch(2);
  EXPECT_EQ(drain(loader, d), first);
}

TEST(BatchLoader, Normalisation) {
  ImageDataset d;
  d.n = 1;
  d.channels = 3;
  d.height = 1;
  d.width = 2;
  d.classes = 2;
  d.pixels = {0, 255, 51, 128, 1, 254};
  d.labels = {1};
  Normalize norm{{0.1f, 0.2f, 0.3f}, {0.5f, 0.25f, 2.0f}};
  BatchLoader loader(d, 1, false, false, {}, norm, 0);
  std::vector<float> out(6);
  int32_t label = -1;
  ASSERT_TRUE(loader.next(out.data(), &label));
  EXPECT_EQ(label, 1);
  for (int k = 0; k < 6; ++k) {
    int c = k / 2;
    EXPECT_FLOAT_EQ(out[k], (d.pixels[k] / 255.0f - norm.mean[c]) / norm.std[c]) << k;
  }
  EXPECT_NEAR(out[1], (1.0 - 0.1) / 0.5, 1e-6);

  // Fashion-MNIST's constants; one value applies to every channel.
  BatchLoader fashion(d, 1, false, false, {}, Normalize::fashion_mnist(), 0);
  ASSERT_TRUE(fashion.next(out.data(), &label));
  EXPECT_NEAR(out[0], -0.2860 / 0.3530, 1e-6);
  EXPECT_NEAR(out[1], (1 - 0.2860) / 0.3530, 1e-6);
  EXPECT_NEAR(out[4], (1 / 255.0 - 0.2860) / 0.3530, 1e-6);

  // Empty vectors: pixels scaled to [0, 1].
  BatchLoader plain(d, 1, false, false, {}, identity(), 0);
  ASSERT_TRUE(plain.next(out.data(), &label));
  EXPECT_FLOAT_EQ(out[1], 1.0f);
  EXPECT_FLOAT_EQ(out[2], 51 / 255.0f);
}

// Every output is one of the (2 pad + 1)^2 x 2 crops/flips of the input,
// computed here independently, and every one of them occurs.
TEST(BatchLoader, CropAndFlip) {
  const int64_t C = 2, H = 3, W = 4;
  ImageDataset d;
  d.n = 1;
  d.channels = C;
  d.height = H;
  d.width = W;
  d.classes = 1;
  d.labels = {0};
  for (int64_t k = 0; k < C * H * W; ++k)
    d.pixels.push_back(static_cast<uint8_t>(10 + k));  // distinct, non-zero

  // out(c, y, x) = padded image at (y + pad + dy, x' + pad + dx), x' mirrored when flipped.
  auto transform = [&](int dy, int dx, bool flip) {
    std::vector<uint8_t> out(C * H * W, 0);
    for (int64_t c = 0; c < C; ++c) {
      for (int64_t y = 0; y < H; ++y) {
        for (int64_t x = 0; x < W; ++x) {
          int64_t sy = y + dy, sx = (flip ? W - 1 - x : x) + dx;
          if (sy >= 0 && sy < H && sx >= 0 && sx < W)
            out[(c * H + y) * W + x] = d.pixels[(c * H + sy) * W + sx];
        }
      }
    }
    return out;
  };
  // The reference itself on the first row [10 11 12 13].
  auto first_row = [&](const std::vector<uint8_t>& image) {
    return std::vector<uint8_t>(image.begin(), image.begin() + W);
  };
  EXPECT_EQ(first_row(transform(0, 0, true)), (std::vector<uint8_t>{13, 12, 11, 10}));
  EXPECT_EQ(first_row(transform(0, 1, false)), (std::vector<uint8_t>{11, 12, 13, 0}));
  // Row 1 is [14 15 16 17]; a window one pixel left is [0 14 15 16], mirrored [16 15 14 0].
  EXPECT_EQ(first_row(transform(1, -1, true)), (std::vector<uint8_t>{16, 15, 14, 0}));

  // Keyed by the image's bytes as a string.
  auto key = [](const std::vector<uint8_t>& v) { return std::string(v.begin(), v.end()); };
  std::map<std::string, int> candidates;
  for (int dy = -1; dy <= 1; ++dy) {
    for (int dx = -1; dx <= 1; ++dx) {
      for (bool flip : {false, true}) candidates[key(transform(dy, dx, flip))] = 0;
    }
  }
  ASSERT_EQ(candidates.size(), 18u);

  BatchLoader loader(d, 1, true, false, {1, true}, identity(), 3);
  std::vector<float> out(C * H * W);
  int32_t label;
  for (int64_t epoch = 0; epoch < 400; ++epoch) {
    loader.start_epoch(epoch);
    ASSERT_TRUE(loader.next(out.data(), &label));
    std::vector<uint8_t> got(out.size());
    for (size_t k = 0; k < out.size(); ++k)
      got[k] = static_cast<uint8_t>(std::lround(out[k] * 255.0f));
    auto it = candidates.find(key(got));
    ASSERT_NE(it, candidates.end()) << "epoch " << epoch << ": not a crop or flip of the image";
    ++it->second;
  }
  for (const auto& [image, hits] : candidates) EXPECT_GT(hits, 0) << "a crop/flip never drawn";

  // Padding is black before normalisation: (0 - mean) / std.
  BatchLoader normalised(d, 1, false, false, {3, false}, Normalize::fashion_mnist(), 3);
  bool saw_padding = false;
  for (int64_t epoch = 0; epoch < 20; ++epoch) {
    normalised.start_epoch(epoch);
    ASSERT_TRUE(normalised.next(out.data(), &label));
    for (float v : out) saw_padding = saw_padding || std::fabs(v - (-0.2860f / 0.3530f)) < 1e-6f;
  }
  EXPECT_TRUE(saw_padding);

  // Without augmentation the image passes unchanged.
  BatchLoader plain(d, 1, true, false, {}, identity(), 3);
  ASSERT_TRUE(plain.next(out.data(), &label));
  for (size_t k = 0; k < out.size(); ++k) EXPECT_FLOAT_EQ(out[k], d.pixels[k] / 255.0f);
}

TEST(BatchLoader, SamplesOfABatchDrawTheirOwnAugmentation) {
  ImageDataset d = make_dataset(1, 1, 6, 6);
  d.n = 64;
  d.pixels.resize(64 * 36);
  for (int64_t i = 1; i < 64; ++i) std::copy_n(d.pixels.begin(), 36, d.pixels.begin() + i * 36);
  d.labels.assign(64, 0);
  BatchLoader loader(d, 64, false, true, {2, true}, identity(), 11);
  std::vector<float> out(64 * 36);
  std::vector<int32_t> labels(64);
  ASSERT_TRUE(loader.next(out.data(), labels.data()));
  std::set<std::vector<float>> distinct;
  for (int64_t r = 0; r < 64; ++r)
    distinct.insert(std::vector<float>(out.begin() + r * 36, out.begin() + (r + 1) * 36));
  EXPECT_GT(distinct.size(), 20u);
}

TEST(BatchLoader, RandomErasingBlanksOneRectangleOfTheRightSize) {
  // Every pixel 255: after normalisation only erased pixels are 0.
  constexpr int64_t N = 400, C = 2, S = 20;
  ImageDataset d = make_dataset(N, C, S, S);
  std::fill(d.pixels.begin(), d.pixels.end(), uint8_t{255});
  auto erased_boxes = [&](double prob, uint64_t seed) {
    BatchLoader loader(d, N, false, false, Augment{0, false, prob}, identity(), seed);
    std::vector<float> out(N * C * S * S);
    std::vector<int32_t> labels(N);
    EXPECT_TRUE(loader.next(out.data(), labels.data()));
    std::vector<std::array<int64_t, 4>> boxes;  // top, left, bottom, right (exclusive); empty: none
    for (int64_t r = 0; r < N; ++r) {
      int64_t top = S, left = S, bottom = 0, right = 0, zeros = 0;
      for (int64_t y = 0; y < S; ++y)
        for (int64_t x = 0; x < S; ++x)
          if (out[(r * C * S + y) * S + x] == 0.0f) {
            ++zeros;
            top = std::min(top, y), left = std::min(left, x);
            bottom = std::max(bottom, y + 1), right = std::max(right, x + 1);
          }
      // The rectangle is solid and the same in every channel.
      EXPECT_EQ(zeros, zeros ? (bottom - top) * (right - left) : 0) << "sample " << r;
      for (int64_t k = 0; k < S * S; ++k)
        EXPECT_EQ(out[(r * C + 1) * S * S + k], out[r * C * S * S + k]) << "sample " << r;
      if (zeros) boxes.push_back({top, left, bottom, right});
    }
    return boxes;
  };
  EXPECT_TRUE(erased_boxes(0.0, 5).empty());
  std::vector<std::array<int64_t, 4>> all = erased_boxes(1.0, 5);
  EXPECT_GT(all.size(), size_t(N * 95 / 100));  // a few draws may find no fitting rectangle in 10 tries
  std::set<std::array<int64_t, 4>> distinct(all.begin(), all.end());
  EXPECT_GT(distinct.size(), all.size() / 2);
  for (const auto& b : all) {
    double area = double((b[2] - b[0]) * (b[3] - b[1])) / (S * S);
    EXPECT_GE(area, 0.02 * 0.7);  // rounding the sides of a 2% rectangle
    EXPECT_LE(area, 1.0 / 3 * 1.3);
  }
  size_t half = erased_boxes(0.5, 5).size();
  EXPECT_GT(half, size_t(N * 35 / 100));
  EXPECT_LT(half, size_t(N * 65 / 100));
  EXPECT_EQ(erased_boxes(1.0, 5), all);  // counter-based: the same seed erases the same boxes
  EXPECT_NE(erased_boxes(1.0, 6), all);
  EXPECT_THROW(BatchLoader(d, 8, false, false, Augment{0, false, 1.5}, identity(), 1), UsageError);
  EXPECT_THROW(BatchLoader(d, 8, false, false, Augment{0, false, -0.1}, identity(), 1), UsageError);
}

TEST(BatchLoader, SkipReproducesTheBatches) {
  ImageDataset d = make_dataset(50, 2, 4, 4);
  auto make = [&] {
    return std::make_unique<BatchLoader>(d, 8, true, false, Augment{1, true},
                                         Normalize{{0.3f, 0.4f}, {0.2f, 0.5f}}, 99);
  };
  auto reference = make();
  reference->start_epoch(3);
  std::vector<Batch> full = drain(*reference, d);
  ASSERT_EQ(full.size(), 7u);

  for (int64_t k : {0, 1, 2, 6, 7}) {
    auto resumed = make();
    drain(*resumed, d);  // some other epoch first: the loader holds no hidden state
    resumed->start_epoch(3);
    resumed->skip(k);
    EXPECT_EQ(resumed->epoch(), 3);
    EXPECT_EQ(resumed->batch_index(), k);
    std::vector<Batch> rest = drain(*resumed, d);
    ASSERT_EQ(rest.size(), full.size() - k);
    for (size_t i = 0; i < rest.size(); ++i)
      EXPECT_EQ(rest[i], full[k + i]) << "skip " << k << ", batch " << i;
  }
  // Skipping in steps, mid-epoch, after a batch was prefetched.
  auto stepped = make();
  stepped->start_epoch(3);
  Batch b;
  b.images.resize(8 * 32);
  b.labels.resize(8);
  ASSERT_TRUE(stepped->next(b.images.data(), b.labels.data()));
  b.rows = stepped->batch_rows();
  EXPECT_EQ(b, full[0]);
  stepped->skip(2);
  stepped->skip(1);
  std::vector<Batch> rest = drain(*stepped, d);
  ASSERT_EQ(rest.size(), 3u);
  EXPECT_EQ(rest[0], full[4]);
  EXPECT_EQ(rest[2], full[6]);

  EXPECT_THROW(stepped->skip(1), UsageError);
  EXPECT_THROW(stepped->skip(-1), UsageError);
  EXPECT_THROW(stepped->start_epoch(-1), UsageError);
}

TEST(BatchLoader, PrefetchMatchesSynchronous) {
  ImageDataset d = make_dataset(37, 3, 5, 4);
  Normalize norm{{0.5f, 0.4f, 0.3f}, {0.2f, 0.3f, 0.4f}};
  BatchLoader sync(d, 5, true, false, {2, true}, norm, 2024, /*prefetch=*/false);
  BatchLoader async(d, 5, true, false, {2, true}, norm, 2024, /*prefetch=*/true);
  for (int64_t epoch : {0, 1, 2, 7}) {
    sync.start_epoch(epoch);
    async.start_epoch(epoch);
    if (epoch == 7) {
      sync.skip(3);
      async.skip(3);
    }
    std::vector<Batch> a = drain(sync, d), b = drain(async, d);
    ASSERT_EQ(a.size(), b.size());
    EXPECT_EQ(a, b) << "epoch " << epoch;
  }
}

// A process's rows of each batch are those rows of the whole batch, with
// their own augmentation; the last, partial batch counts its real rows.
TEST(BatchLoader, RowsOfEveryBatchAsInTheWholeBatch) {
  ImageDataset d = make_dataset(37, 3, 5, 4);
  Normalize norm{{0.5f, 0.4f, 0.3f}, {0.2f, 0.3f, 0.4f}};
  const int64_t image = d.image_size();
  for (bool prefetch : {false, true}) {
    SCOPED_TRACE(prefetch ? "prefetch" : "synchronous");
    BatchLoader whole(d, 8, true, false, {2, true, 0.5}, norm, 99, prefetch);
    BatchLoader part(d, 8, true, false, {2, true, 0.5}, norm, 99, prefetch);
    part.set_rows(3, 4);
    EXPECT_EQ(part.rows_per_batch(), 4);
    EXPECT_THROW(part.set_rows(6, 3), UsageError);
    for (int64_t epoch : {0, 3}) {
      whole.start_epoch(epoch);
      part.start_epoch(epoch);
      std::vector<float> wi(size_t(8 * image)), pi(size_t(4 * image));
      std::vector<int32_t> wl(8), pl(4);
      int64_t batches = 0;
      while (whole.next(wi.data(), wl.data())) {
        ASSERT_TRUE(part.next(pi.data(), pl.data()));
        const int64_t real = std::clamp<int64_t>(whole.batch_rows() - 3, 0, 4);
        EXPECT_EQ(part.batch_rows(), real) << "batch " << batches;
        for (int64_t r = 0; r < real; ++r) {
          EXPECT_EQ(pl[size_t(r)], wl[size_t(3 + r)]);
          EXPECT_TRUE(std::equal(pi.begin() + r * image, pi.begin() + (r + 1) * image, wi.begin() + (3 + r) * image))
              << "batch " << batches << ", row " << r;
        }
        ++batches;
      }
      EXPECT_FALSE(part.next(pi.data(), pl.data()));
      EXPECT_EQ(batches, 5);  // 37 images: the last batch has 5, of which rows 3 and 4 are this part's
    }
  }
}

TEST(BatchLoader, WorkerErrorsReachTheCaller) {
  ImageDataset d = make_dataset(12, 1, 2, 2);
  d.labels[5] = 200;
  for (bool prefetch : {true, false}) {
    BatchLoader loader(d, 4, false, false, {}, identity(), 0, prefetch);
    std::vector<float> images(16);
    std::vector<int32_t> labels(4);
    ASSERT_TRUE(loader.next(images.data(), labels.data()));
    for (int attempt = 0; attempt < 2; ++attempt) {
      try {
        loader.next(images.data(), labels.data());
        ADD_FAILURE() << "a label outside [0, classes) was served";
      } catch (const UsageError& e) {
        EXPECT_NE(std::string(e.what()).find("sample 5 has label 200"), std::string::npos)
            << e.what();
      }
      EXPECT_EQ(loader.batch_index(), 1) << "a failed batch is not consumed";
    }
    loader.skip(1);  // past the bad batch the loader works again
    ASSERT_TRUE(loader.next(images.data(), labels.data()));
    EXPECT_EQ(labels[0], 8 % 10);
  }
}

TEST(BatchLoader, ShutsDownCleanly) {
  ImageDataset d = make_dataset(200, 3, 32, 32);
  for (int i = 0; i < 20; ++i) {
    BatchLoader loader(d, 64, true, false, {4, true}, Normalize::cifar10(), i);
    if (i % 2) {
      std::vector<float> images(64 * 3 * 32 * 32);
      std::vector<int32_t> labels(64);
      ASSERT_TRUE(loader.next(images.data(), labels.data()));
    }
    if (i % 3 == 0) loader.start_epoch(i);
  }  // destroyed while the worker may be preparing a batch
}

TEST(BatchLoader, RejectsBadArguments) {
  ImageDataset d = make_dataset(10, 3, 2, 2);
  EXPECT_THROW(BatchLoader(d, 0, true, false, {}, identity(), 0), UsageError);
  EXPECT_THROW(BatchLoader(d, 11, true, true, {}, identity(), 0), UsageError);
  EXPECT_EQ(BatchLoader(d, 11, true, false, {}, identity(), 0).batches_per_epoch(), 1);
  EXPECT_THROW(BatchLoader(d, 2, true, false, {}, Normalize{{0.1f, 0.2f}, {}}, 0), UsageError);
  EXPECT_THROW(BatchLoader(d, 2, true, false, {}, Normalize{{}, {0.0f}}, 0), UsageError);
  EXPECT_THROW(BatchLoader(d, 2, true, false, {-1, false}, identity(), 0), UsageError);
  ImageDataset short_pixels = d;
  short_pixels.pixels.pop_back();
  EXPECT_THROW(BatchLoader(short_pixels, 2, true, false, {}, identity(), 0), UsageError);
  ImageDataset empty;
  EXPECT_THROW(BatchLoader(empty, 2, true, false, {}, identity(), 0), UsageError);
}
