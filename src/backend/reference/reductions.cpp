// Reference kernels of the reductions: every element of x is folded, in
// row-major order and in double, into the output element it reduces to.
#include <cmath>
#include <limits>

#include "backend/cpu/gemm.h"
#include "backend/reference/kernel.h"
#include "nabla/error.h"

namespace nabla {
namespace ops {
extern const OpDef op_argmax, op_factored_squared_norm, op_max, op_mean, op_squared_norm, op_sum;
}  // namespace ops

namespace reference {
namespace {

// sum, mean, max: attrs.ints = {keepdim, axis...}. Returns the folds of
// step over each output element's reduced elements, and their count.
template <class Step>
std::vector<double> fold(const Operands& a, double init, Step step, int64_t* count) {
  const TensorView& x = a.in[0];
  const bool keepdim = a.attrs->ints[0] != 0;
  std::vector<bool> reduced(x.shape.size(), false);
  for (size_t k = 1; k < a.attrs->ints.size(); ++k) reduced[size_t(a.attrs->ints[k])] = true;
  // Each x axis's stride in the output: 0 on the reduced axes, which the
  // output drops (or keeps as size 1 with keepdim).
  const Strides os = contiguous_strides(a.out.shape);
  Strides to_out(x.shape.size(), 0);
  *count = 1;
  for (size_t d = 0, o = 0; d < x.shape.size(); ++d) {
    if (reduced[d]) *count *= x.shape[d];
    else to_out[d] = os[o];
    if (!reduced[d] || keepdim) ++o;
  }
  std::vector<double> acc(size_t(a.out.numel()), init);
  for_each_index(x.shape, [&](const Index& i) {
    int64_t j = 0;
    for (size_t d = 0; d < i.size(); ++d) j += i[d] * to_out[d];
    acc[size_t(j)] = step(acc[size_t(j)], get(x, i));
  });
  return acc;
}

void sum_kernel(const Operands& a) {
  int64_t n;
  const std::vector<double> s = fold(a, 0.0, [](double acc, double v) { return acc + v; }, &n);
  for (size_t j = 0; j < s.size(); ++j) set_at(a.out, int64_t(j), s[j]);
}

// An empty reduction's mean is 0 (the empty sum), as on the CPU.
void mean_kernel(const Operands& a) {
  int64_t n;
  const std::vector<double> s = fold(a, 0.0, [](double acc, double v) { return acc + v; }, &n);
  for (size_t j = 0; j < s.size(); ++j) set_at(a.out, int64_t(j), n ? s[j] / double(n) : s[j]);
}

// -inf for an empty reduction; a NaN, once met, stays (NumPy's rule).
void max_kernel(const Operands& a) {
  int64_t n;
  const std::vector<double> m = fold(
      a, -std::numeric_limits<double>::infinity(),
      [](double acc, double v) { return v > acc || std::isnan(v) ? v : acc; }, &n);
  for (size_t j = 0; j < m.size(); ++j) set_at(a.out, int64_t(j), m[j]);
}

// attrs.ints = {axis, keepdim}. The first maximum, or the first NaN if any.
void argmax_kernel(const Operands& a) {
  const TensorView& x = a.in[0];
  const size_t axis = size_t(a.attrs->ints[0]);
  const bool keepdim = a.attrs->ints[1] != 0;
  int64_t j = 0;
  for_each_index(a.out.shape, [&](const Index& o) {
    Index i = o;  // x's index: the output's, with the axis put back
    if (keepdim) i[axis] = 0;
    else i.insert(i.begin() + int64_t(axis), 0);
    int64_t best = 0;
    double v = get(x, i);
    for (int64_t k = 1; k < x.shape[axis] && !std::isnan(v); ++k) {
      i[axis] = k;
      const double c = get(x, i);
      if (c > v || std::isnan(c)) {
        v = c;
        best = k;
      }
    }
    set_at(a.out, j++, double(best));
  });
}

// Every element of every input squared and summed in double, in order.
void squared_norm_kernel(const Operands& a) {
  double acc = 0;
  for (const TensorView& x : a.in) {
    for_each_index(x.shape, [&](const Index& i) {
      const double v = get(x, i);
      acc += v * v;
    });
  }
  set_at(a.out, 0, acc);
}

// dW's squares summed in double, row-major.
void factored_squared_norm_kernel(const Operands& a) {
  double acc = 0;
  for (double x : factored_gradient(a, 0)) acc += x * x;
  set_at(a.out, 0, acc);
}

}  // namespace

std::vector<double> factored_gradient(const Operands& a, size_t first) {
  const std::vector<int64_t>& ints = a.attrs->ints;
  const int64_t rows = ints[0], cols = ints[1];
  const bool bf16 = ints[2] != 0;
  const TensorView &left = a.in[first], &values = a.in[first + 1], &indices = a.in[first + 2];
  // The bf16 rounding is the CPU's definition of it (round to nearest even).
  const auto factor = [&](const TensorView& x, int64_t i, int64_t j) {
    const double v = get(x, {i, j});
    return bf16 ? double(cpu::round_to_bf16(float(v))) : v;
  };
  std::vector<double> dw(size_t(rows * cols), 0.0);
  for (size_t b = first + 3; b < a.in.size(); ++b) {
    const TensorView& right = a.in[b];
    const int64_t col = ints[b - first];
    for (int64_t r = 0; r < rows; ++r) {
      for (int64_t c = 0; c < right.shape[1]; ++c) {
        double s = 0;
        for (int64_t t = 0; t < left.shape[0]; ++t) s += factor(left, t, r) * factor(right, t, c);
        dw[size_t(r * cols + col + c)] = s;
      }
    }
  }
  int64_t q = 0;  // the values' row: the indices in row-major order
  for_each_index(indices.shape, [&](const Index& i) {
    const double r = get(indices, i);
    if (r < 0 || r >= double(rows)) {
      throw ShapeError("add_rows: index " + std::to_string(int64_t(r)) + " at position " + std::to_string(q) +
                       " is out of range for " + std::to_string(rows) + " rows");
    }
    Index vi = i;
    vi.push_back(0);
    for (int64_t c = 0; c < cols; ++c) {
      vi.back() = c;
      dw[size_t(int64_t(r) * cols + c)] += get(values, vi);
    }
    ++q;
  });
  return dw;
}

void register_reduction_kernels() {
  register_kernel(ops::op_sum, sum_kernel);
  register_kernel(ops::op_mean, mean_kernel);
  register_kernel(ops::op_max, max_kernel);
  register_kernel(ops::op_argmax, argmax_kernel);
  register_kernel(ops::op_squared_norm, squared_norm_kernel);
  register_kernel(ops::op_factored_squared_norm, factored_squared_norm_kernel);
}

}  // namespace reference
}  // namespace nabla
