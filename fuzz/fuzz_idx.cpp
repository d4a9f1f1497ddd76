// read_idx and load_idx_dataset (include/nabla/io.h, data.h) on arbitrary
// bytes, plain or gzip-compressed (the reader detects gzip itself). When the
// input parses as images, labels derived from its bytes (some out of range)
// go through the dataset checks too.
#include "fuzz_util.h"
#include "nabla/data.h"
#include "nabla/io.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace nabla;
  const std::string path = fuzz::write_input("images-idx3-ubyte", {reinterpret_cast<const char*>(data), size});
  IdxArray a;
  bool ok = false;
  fuzz::expect_clean(path, [&] {
    a = read_idx(path);
    ok = true;
  });
  if (!ok || a.shape.size() < 3 || a.shape[0] > 4096) return 0;
  // An IDX labels file for the images: u8, rank 1, N labels.
  const auto n = static_cast<uint32_t>(a.shape[0]);
  std::string labels = {0, 0, 8, 1, char(n >> 24), char(n >> 16), char(n >> 8), char(n)};
  for (uint32_t i = 0; i < n; ++i) labels += char(a.data.empty() ? 0 : a.data[i % a.data.size()] % 12);
  const std::string labels_path = fuzz::write_input("labels-idx1-ubyte", labels);
  for (int64_t classes : {0, 10}) {
    fuzz::expect_clean("", [&] { load_idx_dataset(path, labels_path, classes); });
  }
  return 0;
}
