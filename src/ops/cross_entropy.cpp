// cross_entropy: mean over rows of -log softmax(logits)[label], the
// classification loss. logits [..., C], labels i32 [...] -> scalar.
// Rows labelled ignore_index are left out of the sum and of the count; when
// every row is ignored the loss is 0 with gradient 0 (PyTorch gives NaN:
// here a fully padded batch must not poison a training run).
// attrs: ints {ignore_index}.
#include "backend/cpu/kernel.h"
#include "ops/cross_entropy.h"

#include <cmath>
#include <limits>
#include <type_traits>

#include "ops/internal_ops.h"
#include "ops/last_axis.h"

namespace nabla {
namespace ops {
namespace {

Meta cross_entropy_infer(const std::vector<Tensor>& in, const Attrs&) {
  const Tensor &x = in[0], &labels = in[1];
  require_floating("cross_entropy", x, "logits");
  if (labels.dtype() != DType::i32) {
    throw DTypeError(std::string("cross_entropy: labels must be i32, got ") +
                     dtype_name(labels.dtype()));
  }
  if (x.rank() < 1 || Shape(x.shape().begin(), x.shape().end() - 1) != labels.shape()) {
    throw ShapeError("cross_entropy: logits must be [..., C] with labels [...], got logits " +
                     to_string(x.shape()) + " and labels " + to_string(labels.shape()));
  }
  return {x.dtype(), {}};
}

template <class T>
void cross_entropy_kernel(const KernelArgs& a) {
  const TensorView& x = a.in[0];
  int64_t ignore = a.attrs->ints[0];
  RowWalker<1> rows(x.shape, {x.strides});
  int64_t len = rows.len(), xs = rows.inner(0);
  std::vector<int32_t> labels = read_labels("cross_entropy", a.in[1], len, ignore);
  const T* xp = x.ptr<T>();
  // Per-row losses in parallel, then one sum in row order: deterministic.
  std::vector<double> loss(static_cast<size_t>(rows.rows()), 0.0);
  a.parallel_for(rows.rows(), row_grain(len), [&](int64_t b, int64_t e) {
    std::vector<float> scratch;  // a strided f32 row, copied
    rows.run(b, e, [&](int64_t r, const std::array<int64_t, 1>& o) {
      if (labels[r] == ignore) return;
      const T* xr = xp + o[0];
      if constexpr (std::is_same_v<T, float>) {
        const float* x = cpu::gather(xr, xs, len, scratch);
        const ExpSum s = exp_sum_f32(x, len);
        loss[r] = std::log(s.total) - (double(x[labels[r]]) - s.max);
        return;
      }
      double mx = -std::numeric_limits<double>::infinity();
      for (int64_t j = 0; j < len; ++j) {
        double v = xr[j * xs];
        mx = (v > mx || v != v) ? v : mx;
      }
      double total = 0;
      for (int64_t j = 0; j < len; ++j) total += std::exp(double(xr[j * xs]) - mx);
      // -log softmax = log(sum exp(x - max)) - (x[label] - max)
      loss[r] = std::log(total) - (double(xr[labels[r] * xs]) - mx);
    });
  });
  double sum = 0;
  int64_t count = 0;
  for (size_t r = 0; r < loss.size(); ++r) {
    sum += loss[r];
    count += labels[r] != ignore;
  }
  a.out.ptr<T>()[0] = static_cast<T>(count ? sum / double(count) : 0.0);
}

void cross_entropy_forward(const KernelArgs& a) {
  dispatch_floating(a.out.dtype, "cross_entropy", [&]<class T>() { cross_entropy_kernel<T>(a); });
}

// dlogits = (softmax(logits) - onehot(label)) * dloss / count on counted rows.
Grads cross_entropy_backward(const BackwardArgs& g) {
  return {cross_entropy_back(g.inputs[0], g.inputs[1], g.dout, g.attrs.ints[0]), Tensor()};
}

Tensor cross_entropy_composite(const std::vector<Tensor>& in, const Attrs& attrs) {
  const Tensor& x = in[0];
  Tensor target = target_one_hot(in[1], x.dim(-1), attrs.ints[0], x.dtype());
  Tensor z = x - max(x, {-1}, true);
  Tensor logp = z - log(sum(exp(z), {-1}, true));
  return -sum(target * logp) / valid_count(target);
}

std::vector<GradCase> cross_entropy_cases() {
  using X = const std::vector<Tensor>&;
  return {
      {"basic",
       {normal({5, 4}), integers({5}, 0, 4)},
       [](X x) { return cross_entropy(x[0], x[1]); }},
      {"ignored_rows",
       {normal({6, 3}), integers({6}, -1, 3)},
       [](X x) { return cross_entropy(x[0], x[1], -1); }},
      {"ignore_a_class",
       {normal({6, 4}), integers({6}, 0, 4)},
       [](X x) { return cross_entropy(x[0], x[1], 2); }},
      {"all_ignored",
       {normal({3, 4}), integers({3}, -100, -99)},
       [](X x) { return cross_entropy(x[0], x[1]); }},
      {"leading_dims",
       {normal({2, 3, 4}), integers({2, 3}, 0, 4)},
       [](X x) { return cross_entropy(x[0], x[1]); }},
      // exp(logits) alone would overflow f32 here.
      {"large_logits",
       {uniform({4, 5}, 30, 120), integers({4}, 0, 5)},
       [](X x) { return cross_entropy(x[0], x[1]); }},
  };
}

}  // namespace

extern const OpDef op_cross_entropy{
    .name = "cross_entropy",
    .summary = "mean over rows of -log softmax(logits)[label]; i32 labels, ignore_index",
    .inputs = {{"logits", Diff::yes}, {"labels", Diff::no}},
    .fused = true,
    .infer = cross_entropy_infer,
    .backward = cross_entropy_backward,
    .composite = cross_entropy_composite,
    .cases = cross_entropy_cases,
};
NABLA_CPU_KERNEL(op_cross_entropy, cross_entropy_forward);

}  // namespace ops

Tensor cross_entropy(const Tensor& logits, const Tensor& labels, int64_t ignore_index) {
  return apply(ops::op_cross_entropy, {logits, labels}, Attrs{{ignore_index}, {}});
}

}  // namespace nabla
