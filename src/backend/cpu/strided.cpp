#include "backend/cpu/strided.h"

#include <cstring>

namespace nabla::cpu {

void copy_strided(const void* src, const Shape& shape, const Strides& strides, size_t elem, void* dst) {
  Strides out = contiguous_strides(shape);
  Walker<2> w(shape, {&strides, &out});
  auto* s = static_cast<const char*>(src);
  auto* d = static_cast<char*>(dst);
  w.run(0, numel(shape), [&](const std::array<int64_t, 2>& o, int64_t n, const std::array<int64_t, 2>& in) {
    copy_run(d + o[1] * elem, s + o[0] * elem, n, in[0], elem);
  });
}

}  // namespace nabla::cpu
