// The C API's tensor-creation entry points (include/nabla.h):
// nabla_tensor_from_data, nabla_parameter, nabla_tensor_write/read, the shape
// queries, and the ops that take a shape from the caller (reshape, expand,
// scatter_slice). Every call must return a status with a message, never
// crash; a call that succeeds must report back the shape it was given.
//
// Input: dtype (i8), rank (i8), flags (u8), rank x i64 dims, a second rank
// (i8) and dims for the shape ops, then data bytes.
#include <cstring>
#include <string_view>
#include <vector>

#include "nabla.h"

namespace {

struct Input {
  std::string_view rest;
  bool take(void* out, size_t n) {
    if (rest.size() < n) return false;
    std::memcpy(out, rest.data(), n);
    rest.remove_prefix(n);
    return true;
  }
  bool shape(int rank, std::vector<int64_t>& dims) {
    dims.assign(rank > 0 ? size_t(rank) : 0, 0);
    return dims.empty() || take(dims.data(), dims.size() * sizeof(int64_t));
  }
};

// Bytes a tensor of `dims` takes, or -1 when a dim is negative or the size
// does not fit in 63 bits.
int64_t bytes_of(const std::vector<int64_t>& dims, int64_t elem) {
  __int128 n = elem;
  for (int64_t d : dims) {
    if (d < 0) return -1;
    n *= d;
    if (n > INT64_MAX) return -1;
  }
  return int64_t(n);
}

void check(nabla_status s) {
  // A failed call leaves a message; a status outside the enum is a bug.
  if (s != NABLA_OK && (nabla_last_error()[0] == '\0' ||
                        std::strcmp(nabla_status_string(s), "NABLA_UNKNOWN_STATUS") == 0)) {
    __builtin_trap();
  }
}

// A request for a large but valid tensor is the caller's right; the harness
// checks validation, not the allocator.
constexpr int64_t kMaxBytes = 1 << 20;

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  Input in{{reinterpret_cast<const char*>(data), size}};
  int8_t dtype_raw = 0, rank = 0, rank2 = 0;
  uint8_t flags = 0;
  std::vector<int64_t> dims, dims2;
  if (!in.take(&dtype_raw, 1) || !in.take(&rank, 1) || !in.take(&flags, 1) || !in.shape(rank, dims) ||
      !in.take(&rank2, 1) || !in.shape(rank2, dims2)) {
    return 0;
  }
  const auto dtype = static_cast<nabla_dtype>(dtype_raw);
  const int64_t elem = dtype == NABLA_F64 ? 8 : 4;
  const int64_t bytes = bytes_of(dims, elem);
  // Negative dims, an overflowing size and bad dtypes must be refused cleanly;
  // a valid shape is only tried when it is small.
  if (bytes > kMaxBytes) return 0;
  const bool with_data = (flags & 2) && bytes >= 0 && int64_t(in.rest.size()) >= bytes;

  nabla_context* ctx = nullptr;
  check(nabla_context_create(&ctx));
  if (!ctx) __builtin_trap();
  nabla_tensor* t = nullptr;
  const int64_t* shape = dims.empty() ? (flags & 32 ? nullptr : dims.data()) : dims.data();
  nabla_status s = (flags & 1) ? nabla_parameter(ctx, dtype, rank, shape, with_data ? in.rest.data() : nullptr, &t)
                               : nabla_tensor_from_data(ctx, dtype, rank, shape, with_data ? in.rest.data() : nullptr, &t);
  check(s);
  if (s == NABLA_OK) {
    if (bytes < 0 || rank < 0) __builtin_trap();  // accepted a shape it should have refused
    int r = -1;
    int64_t numel = -1;
    std::vector<int64_t> got(dims.size() + 1, -7);
    check(nabla_tensor_rank(t, &r));
    check(nabla_tensor_numel(t, &numel));
    check(nabla_tensor_shape(t, got.data(), int(got.size())));
    if (r != rank || numel * elem != bytes || !std::equal(dims.begin(), dims.end(), got.begin())) __builtin_trap();
    // Writes and reads of the wrong size are refused; of the right size, round-trip.
    check(nabla_tensor_write(ctx, t, in.rest.data(), in.rest.size()));
    std::vector<char> back(size_t(bytes) + 1);
    check(nabla_tensor_read(ctx, t, back.data(), size_t(bytes)));
    check(nabla_tensor_read(ctx, t, back.data(), back.size()));
    if (bytes >= 0 && int64_t(in.rest.size()) == bytes && bytes > 0 &&
        nabla_tensor_read(ctx, t, back.data(), size_t(bytes)) == NABLA_OK &&
        std::memcmp(back.data(), in.rest.data(), size_t(bytes)) != 0) {
      __builtin_trap();
    }
    // Ops that take a shape: views record the shape, nothing is allocated.
    nabla_tensor* v = nullptr;
    const int64_t* shape2 = dims2.empty() ? nullptr : dims2.data();
    if (flags & 4) check(nabla_reshape(ctx, t, rank2, shape2, &v));
    if (flags & 8) check(nabla_expand(ctx, t, rank2, shape2, &v));
    if ((flags & 16) && rank2 >= 0 && bytes_of(dims2, elem) >= 0 && bytes_of(dims2, elem) <= kMaxBytes) {
      int64_t axis = int8_t(flags) >> 5;
      check(nabla_scatter_slice(ctx, t, rank2, shape2, axis, 0, rank2 > 0 ? dims2[0] : 0, 1 + (flags >> 6), &v));
    }
  }
  nabla_context_free(ctx);
  return 0;
}
