// load_cifar10 (include/nabla/data.h) with arbitrary bytes as test_batch.bin.
#include <filesystem>

#include "fuzz_util.h"
#include "nabla/data.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace nabla;
  static const std::string dir = [] {
    std::string d = fuzz::scratch_dir() + "/cifar-10-batches-bin";
    std::filesystem::create_directories(d);
    return d;
  }();
  const std::string path =
      fuzz::write_input("cifar-10-batches-bin/test_batch.bin", {reinterpret_cast<const char*>(data), size});
  fuzz::expect_clean(path, [&] {
    ImageDataset d = load_cifar10(fuzz::scratch_dir(), /*train=*/false);
    if (d.pixels.size() != size_t(d.n * d.image_size()) || d.labels.size() != size_t(d.n)) std::abort();
    for (int32_t label : d.labels) {
      if (label < 0 || label >= d.classes) std::abort();
    }
  });
  (void)dir;
  return 0;
}
