// Graphs built through the C API (include/nabla.h) from fuzzed op sequences:
// every op's checks of its operands (ranks, shapes, dtypes, mismatched
// pairs) and of its arguments (axes, ranges, strides, paddings, eps, ...),
// then the backward of the last result's sum and a run of the lot. Every
// call must return a status with a message, never crash; a run that
// succeeds must let its output and every gradient be read back.
//
// Input: a leaf count, then per leaf a dtype, a parameter flag, a rank and
// dims of one byte each (small, zero allowed); then op records, each an
// opcode byte, operand picks (modulo the tensors so far) and argument bytes
// (signed, so negative and out-of-range values come up). Leaf values are a
// fixed ramp, so every input is a program, not data.
#include <array>
#include <iterator>
#include <cstdint>
#include <cstring>
#include <string_view>
#include <vector>

#include "nabla.h"

namespace {

struct Input {
  std::string_view rest;
  uint8_t u8() {
    if (rest.empty()) return 0;
    const uint8_t v = uint8_t(rest[0]);
    rest.remove_prefix(1);
    return v;
  }
  int64_t i8() { return int8_t(u8()); }
  // Mostly small values: sizes, axes and counts a real call would pass.
  int64_t small() { return int64_t(u8() % 9) - 2; }
  nabla_dtype dtype() { return std::array{NABLA_F32, NABLA_F64, NABLA_I32}[u8() % 3]; }
};

void check(nabla_status s) {
  // A failed call leaves a message; a status outside the enum is a bug.
  if (s != NABLA_OK && (nabla_last_error()[0] == '\0' ||
                        std::strcmp(nabla_status_string(s), "NABLA_UNKNOWN_STATUS") == 0)) {
    __builtin_trap();
  }
}

int64_t numel(nabla_tensor* t) {
  int64_t n = -1;
  check(nabla_tensor_numel(t, &n));
  return n;
}

size_t element_size(nabla_tensor* t) {
  nabla_dtype d = NABLA_F32;
  check(nabla_tensor_dtype(t, &d));
  return d == NABLA_F64 ? 8 : 4;
}

bool floating(nabla_tensor* t) {
  nabla_dtype d = NABLA_I32;
  check(nabla_tensor_dtype(t, &d));
  return d == NABLA_F32 || d == NABLA_F64;
}

// Results kept as operands for later ops: small enough that a graph of them
// runs in well under a second.
constexpr int64_t kMaxElements = 1 << 14;
constexpr int kMaxOps = 24;

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  Input in{{reinterpret_cast<const char*>(data), size}};
  nabla_context* ctx = nullptr;
  check(nabla_context_create(&ctx));
  if (!ctx) __builtin_trap();

  std::vector<nabla_tensor*> ts, params;
  const int leaves = 1 + in.u8() % 3;
  for (int i = 0; i < leaves; ++i) {
    const nabla_dtype dtype = in.dtype();
    const bool parameter = in.u8() & 1;
    const int rank = in.u8() % 5;
    std::vector<int64_t> dims(size_t(rank), 0);
    int64_t n = 1;
    for (int64_t& d : dims) n *= (d = in.u8() % 5);
    std::vector<char> values(size_t(n) * (dtype == NABLA_F64 ? 8 : 4));
    for (int64_t k = 0; k < n; ++k) {
      if (dtype == NABLA_F64) {
        const double v = 0.37 * double(k % 11) - 1.5;
        std::memcpy(values.data() + k * 8, &v, 8);
      } else if (dtype == NABLA_F32) {
        const float v = 0.37f * float(k % 11) - 1.5f;
        std::memcpy(values.data() + k * 4, &v, 4);
      } else {
        const int32_t v = int32_t(k % 3);
        std::memcpy(values.data() + k * 4, &v, 4);
      }
    }
    nabla_tensor* t = nullptr;
    const nabla_status s = parameter ? nabla_parameter(ctx, dtype, rank, dims.data(), values.data(), &t)
                                     : nabla_tensor_from_data(ctx, dtype, rank, dims.data(), values.data(), &t);
    check(s);
    if (s == NABLA_OK) {
      ts.push_back(t);
      if (parameter) params.push_back(t);
    }
  }
  if (ts.empty()) {
    nabla_context_free(ctx);
    return 0;
  }

  for (int op = 0; op < kMaxOps && !in.rest.empty(); ++op) {
    const auto pick = [&] { return ts[in.u8() % ts.size()]; };
    const auto maybe = [&]() -> nabla_tensor* { return in.u8() & 1 ? pick() : nullptr; };
    const auto list = [&](int n) {
      std::vector<int64_t> v(size_t(n > 0 ? n : 0));
      for (int64_t& x : v) x = in.small();
      return v;
    };
    nabla_tensor* out = nullptr;
    nabla_status s = NABLA_OK;
    // Ops of one, two or three tensors and nothing else go by table; the
    // others take arguments too.
    using Binary = nabla_status (*)(nabla_context*, nabla_tensor*, nabla_tensor*, nabla_tensor**);
    using Ternary = nabla_status (*)(nabla_context*, nabla_tensor*, nabla_tensor*, nabla_tensor*, nabla_tensor**);
    using Unary = nabla_status (*)(nabla_context*, nabla_tensor*, nabla_tensor**);
    constexpr Binary kBinary[] = {nabla_add, nabla_sub, nabla_mul, nabla_div, nabla_eq, nabla_matmul, nabla_get_rows};
    constexpr Ternary kTernary[] = {nabla_where, nabla_matmul_add, nabla_set_rows};
    constexpr Unary kUnary[] = {nabla_neg,   nabla_exp,     nabla_log,      nabla_sqrt,      nabla_rsqrt,
                                nabla_square, nabla_abs,    nabla_tanh,     nabla_sigmoid,   nabla_relu,
                                nabla_silu,  nabla_step,    nabla_sign,     nabla_contiguous, nabla_gelu,
                                nabla_gelu_erf, nabla_gelu_quick, nabla_erf, nabla_hardswish, nabla_log_softmax};
    constexpr int kB = int(std::size(kBinary)), kT = int(std::size(kTernary)), kU = int(std::size(kUnary));
    constexpr int kWithArguments = 22;  // the switch's cases below
    int code = in.u8() % (kB + kT + kU + kWithArguments);
    if (code < kB) {
      nabla_tensor *a = pick(), *b = pick();
      s = kBinary[code](ctx, a, b, &out);
    } else if ((code -= kB) < kT) {
      nabla_tensor *a = pick(), *b = pick(), *c = pick();
      s = kTernary[code](ctx, a, b, c, &out);
    } else if ((code -= kT) < kU) {
      s = kUnary[code](ctx, pick(), &out);
    } else {
      switch (code -= kU) {
        case 0:
        case 1:
        case 2: {
          nabla_tensor* x = pick();
          const int naxes = int(in.u8() % 4);
          const std::vector<int64_t> axes = list(naxes);
          const int keep = in.u8() & 1;
          s = std::array{nabla_sum, nabla_mean, nabla_max}[code](ctx, x, axes.data(), naxes, keep, &out);
          break;
        }
        case 3:
        case 4:
        case 5: {  // ops that take a list of the rank's length
          nabla_tensor* x = pick();
          const int rank = int(in.u8() % 5);
          const std::vector<int64_t> v = list(rank);
          s = code == 3   ? nabla_reshape(ctx, x, rank, v.data(), &out)
              : code == 4 ? nabla_permute(ctx, x, rank, v.data(), &out)
                          : nabla_expand(ctx, x, rank, v.data(), &out);
          break;
        }
        case 6: {
          nabla_tensor* x = pick();
          const int64_t a0 = in.small(), a1 = in.small();
          s = nabla_transpose(ctx, x, a0, a1, &out);
          break;
        }
        case 7: {
          nabla_tensor* x = pick();
          const int64_t axis = in.small(), start = in.i8(), stop = in.i8(), step = in.small();
          s = nabla_slice(ctx, x, axis, start, stop, step, &out);
          break;
        }
        case 8: {
          const size_t n = in.u8() % 4;
          std::vector<nabla_tensor*> xs;
          for (size_t i = 0; i < n; ++i) xs.push_back(pick());
          s = nabla_concat(ctx, xs.data(), n, in.small(), &out);
          break;
        }
        case 9: {
          nabla_tensor* x = pick();
          const int rank = int(in.u8() % 5);
          const std::vector<int64_t> full = list(rank);
          const int64_t axis = in.small(), start = in.small(), stop = in.small(), step = in.small();
          s = nabla_scatter_slice(ctx, x, rank, full.data(), axis, start, stop, step, &out);
          break;
        }
        case 10: {
          nabla_tensor *values = pick(), *idx = pick();
          s = nabla_scatter_add_rows(ctx, values, idx, in.small(), &out);
          break;
        }
        case 11: {
          nabla_tensor* x = pick();
          const double a = double(in.i8()) / 8, b = double(in.i8()) / 8;
          switch (in.u8() % 5) {
            case 0: s = nabla_softplus(ctx, x, a, b, &out); break;
            case 1: s = nabla_elu(ctx, x, a, &out); break;
            case 2: s = nabla_leaky_relu(ctx, x, a, &out); break;
            case 3: s = nabla_clamp(ctx, x, a, b, &out); break;
            default: s = nabla_scale(ctx, x, a, &out); break;
          }
          break;
        }
        case 12: {
          nabla_tensor *x = pick(), *g = maybe(), *b = maybe();
          const double eps = double(in.i8()) * 1e-3;
          s = in.u8() & 1 ? nabla_rms_norm(ctx, x, g, eps, &out) : nabla_layer_norm(ctx, x, g, b, eps, &out);
          break;
        }
        case 13: {
          nabla_tensor *x = pick(), *mask = maybe();
          const double scale = double(in.i8()) / 16;
          s = nabla_softmax(ctx, x, scale, mask, in.u8() & 1, &out);
          break;
        }
        case 14: {
          nabla_tensor *logits = pick(), *labels = pick();
          s = in.u8() & 1 ? nabla_cross_entropy(ctx, logits, labels, in.small(), &out)
                          : nabla_cross_entropy_soft(ctx, logits, labels, &out);
          break;
        }
        case 15: {
          nabla_tensor *q = pick(), *k = pick(), *v = pick(), *mask = maybe();
          const int causal = in.u8() & 1;
          const double scale = double(in.i8()) / 16;
          s = in.u8() & 1 ? nabla_attention(ctx, q, k, v, causal, scale, &out)
                          : nabla_scaled_dot_product_attention(ctx, q, k, v, mask, causal, scale, &out);
          break;
        }
        case 16: {
          nabla_tensor* x = pick();
          const int64_t offset = in.small();
          const double base = double(in.i8()) * 100;
          if (in.u8() & 1) {
            s = nabla_rope(ctx, x, offset, base, int(in.small()), &out);
            break;
          }
          nabla_tensor* positions = maybe();
          double factors[4];
          const int64_t n_factors = in.small() % 5;
          for (int64_t i = 0; i < n_factors; ++i) factors[i] = double(in.i8()) / 8;
          s = nabla_rope_at(ctx, x, positions, offset, base, int(in.small()), factors, n_factors, in.small(),
                            double(in.i8()) / 32, &out);
          break;
        }
        case 17: {
          nabla_tensor *x = pick(), *seed = pick();
          const double p = double(in.i8()) / 64;
          s = nabla_dropout(ctx, x, p, seed, in.u8() & 1, in.small(), &out);
          break;
        }
        case 18: {
          nabla_tensor *x = pick(), *w = pick(), *bias = maybe();
          const std::vector<int64_t> stride = list(2), padding = list(2), extra = list(2), dilation = list(2);
          const int64_t groups = in.small();
          s = in.u8() & 1 ? nabla_conv_2d(ctx, x, w, bias, stride.data(), padding.data(), dilation.data(), groups,
                                          &out)
                          : nabla_conv_transpose_2d(ctx, x, w, bias, stride.data(), padding.data(), extra.data(),
                                                    dilation.data(), groups, &out);
          break;
        }
        case 19: {
          nabla_tensor* x = pick();
          const std::vector<int64_t> kernel = list(2), stride = list(2), padding = list(2);
          s = in.u8() & 1 ? nabla_avg_pool_2d(ctx, x, kernel.data(), stride.data(), padding.data(), &out)
                          : nabla_max_pool_2d(ctx, x, kernel.data(), stride.data(), padding.data(), &out);
          break;
        }
        case 20: {
          nabla_tensor* x = pick();
          const int rank = int(in.u8() % 5);
          const std::vector<int64_t> v = list(2 * rank);
          s = in.u8() & 1 ? nabla_pad(ctx, x, rank, v.data(), double(in.i8()), &out)
                          : nabla_repeat(ctx, x, rank, v.data(), &out);
          break;
        }
        default: {
          nabla_tensor* x = pick();
          if (in.u8() & 1) {
            s = nabla_argmax(ctx, x, in.small(), in.u8() & 1, &out);
          } else {
            s = nabla_one_hot(ctx, x, in.small(), in.dtype(), &out);
          }
          break;
        }
      }
    }
    check(s);
    if (s == NABLA_OK) {
      if (!out) __builtin_trap();
      if (numel(out) <= kMaxElements) ts.push_back(out);
    }
  }

  // The backward of the last result's sum, when it is floating, then one
  // run: its output, and every gradient, must then read back.
  nabla_tensor* last = ts.back();
  std::vector<nabla_tensor*> reads{last};
  if (floating(last)) {
    nabla_tensor* loss = nullptr;
    check(nabla_sum(ctx, last, nullptr, 0, 0, &loss));
    if (loss && nabla_backward(ctx, loss) == NABLA_OK) {
      for (nabla_tensor* p : params) {
        nabla_tensor* g = nullptr;
        check(nabla_grad(ctx, p, &g));
        if (g) reads.push_back(g);
      }
    }
  }
  const nabla_status run = nabla_compute(ctx, &last, 1, 1 + in.u8() % 2);
  check(run);
  if (run == NABLA_OK) {
    for (nabla_tensor* t : reads) {
      std::vector<char> value(size_t(numel(t)) * element_size(t));
      if (nabla_tensor_read(ctx, t, value.data(), value.size()) != NABLA_OK) __builtin_trap();
    }
  }
  nabla_context_free(ctx);
  return 0;
}
