// cross_entropy_back: the gradient of cross_entropy with respect to the
// logits, (softmax(logits) - onehot(label)) * dloss / count on counted rows
// and 0 on rows labelled ignore_index. logits [..., C], labels i32 [...],
// dloss scalar -> [..., C]. attrs: ints {ignore_index}.
#include <cmath>
#include <limits>
#include <type_traits>

#include "backend/cpu/kernel.h"
#include "ops/cross_entropy.h"
#include "ops/internal_ops.h"
#include "ops/last_axis.h"

namespace nabla {
namespace ops {
namespace {

Meta cross_entropy_back_infer(const std::vector<Tensor>& in, const Attrs&) {
  const Tensor &x = in[0], &labels = in[1], &dloss = in[2];
  require_floating("cross_entropy_back", x, "logits");
  require_same_dtype("cross_entropy_back", x, dloss);
  if (labels.dtype() != DType::i32) {
    throw DTypeError(std::string("cross_entropy_back: labels must be i32, got ") +
                     dtype_name(labels.dtype()));
  }
  if (x.rank() < 1 || Shape(x.shape().begin(), x.shape().end() - 1) != labels.shape()) {
    throw ShapeError("cross_entropy_back: logits must be [..., C] with labels [...], got logits " +
                     to_string(x.shape()) + " and labels " + to_string(labels.shape()));
  }
  if (dloss.numel() != 1) {
    throw ShapeError("cross_entropy_back: dloss must have one element, got " +
                     to_string(dloss.shape()));
  }
  return {x.dtype(), x.shape()};
}

template <class T>
void cross_entropy_back_kernel(const KernelArgs& a) {
  const TensorView& x = a.in[0];
  int64_t ignore = a.attrs->ints[0];
  RowWalker<1> rows(x.shape, {x.strides});
  int64_t len = rows.len(), xs = rows.inner(0);
  std::vector<int32_t> labels = read_labels("cross_entropy_back", a.in[1], len, ignore);
  int64_t count = 0;
  for (int32_t l : labels) count += l != ignore;
  double factor = double(a.in[2].ptr<T>()[0]) / double(std::max<int64_t>(count, 1));
  const T* xp = x.ptr<T>();
  T* out = a.out.ptr<T>();
  a.parallel_for(rows.rows(), row_grain(len), [&](int64_t b, int64_t e) {
    std::vector<float> scratch;  // a strided f32 row, copied
    rows.run(b, e, [&](int64_t r, const std::array<int64_t, 1>& o) {
      T* dx = out + r * len;
      if (labels[r] == ignore) {
        std::fill(dx, dx + len, T(0));
        return;
      }
      const T* xr = xp + o[0];
      if constexpr (std::is_same_v<T, float>) {
        using cpu::VecF;
        const float* x = cpu::gather(xr, xs, len, scratch);
        const ExpSum s = exp_sum_f32(x, len);
        const float inv = float(1.0 / s.total), f = float(factor);
        const auto p = [&](VecF v) { return cpu::exp_nonpositive(v - s.max) * inv; };
        cpu::map(dx, x, 1, len, [&](VecF v) { return p(v) * f; });
        dx[labels[r]] = (p(x[labels[r]])[0] - 1.0f) * f;
        return;
      }
      double mx = -std::numeric_limits<double>::infinity();
      for (int64_t j = 0; j < len; ++j) {
        double v = xr[j * xs];
        mx = (v > mx || v != v) ? v : mx;
      }
      double total = 0;
      for (int64_t j = 0; j < len; ++j) total += std::exp(double(xr[j * xs]) - mx);
      for (int64_t j = 0; j < len; ++j) {
        double p = std::exp(double(xr[j * xs]) - mx) / total;
        dx[j] = static_cast<T>((p - (j == labels[r] ? 1.0 : 0.0)) * factor);
      }
    });
  });
}

void cross_entropy_back_forward(const KernelArgs& a) {
  dispatch_floating(a.out.dtype, "cross_entropy_back",
                    [&]<class T>() { cross_entropy_back_kernel<T>(a); });
}

Tensor cross_entropy_back_composite(const std::vector<Tensor>& in, const Attrs& attrs) {
  const Tensor &x = in[0], &dloss = in[2];
  Tensor target = target_one_hot(in[1], x.dim(-1), attrs.ints[0], x.dtype());
  Tensor counted = sum(target, {-1}, true);  // 1 on counted rows, 0 on ignored ones
  Tensor e = exp(x - max(x, {-1}, true));
  Tensor p = e / sum(e, {-1}, true);
  return (p * counted - target) * (reshape(dloss, {}) / valid_count(target));
}

std::vector<GradCase> cross_entropy_back_cases() {
  using X = const std::vector<Tensor>&;
  return {
      {"basic",
       {normal({5, 4}), integers({5}, 0, 4), normal({})},
       [](X x) { return cross_entropy_back(x[0], x[1], x[2]); }},
      {"ignored_rows",
       {normal({2, 3, 3}), integers({2, 3}, -1, 3), normal({1})},
       [](X x) { return cross_entropy_back(x[0], x[1], x[2], -1); }},
      {"all_ignored",
       {normal({3, 4}), integers({3}, 7, 8), normal({})},
       [](X x) { return cross_entropy_back(x[0], x[1], x[2], 7); }},
  };
}

}  // namespace

// Backward: through the composite (second derivatives of the loss).
extern const OpDef op_cross_entropy_back{
    .name = "cross_entropy_back",
    .summary = "cross_entropy's gradient: (softmax(logits) - onehot) * dloss / count",
    .inputs = {{"logits", Diff::yes}, {"labels", Diff::no}, {"dloss", Diff::yes}},
    .fused = true,
    .infer = cross_entropy_back_infer,
    .composite = cross_entropy_back_composite,
    .cases = cross_entropy_back_cases,
};
NABLA_CPU_KERNEL(op_cross_entropy_back, cross_entropy_back_forward);

}  // namespace ops

Tensor cross_entropy_back(const Tensor& logits, const Tensor& labels, const Tensor& dloss,
                          int64_t ignore_index) {
  return apply(ops::op_cross_entropy_back, {logits, labels, dloss}, Attrs{{ignore_index}, {}});
}

}  // namespace nabla
