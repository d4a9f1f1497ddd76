#include "ops/factored.h"

#include <string>

#include "nabla/error.h"

namespace nabla::ops {

std::vector<Tensor> factor_operands(const train::FactoredGradient& f, int64_t cols) {
  std::vector<Tensor> in{f.left};
  if (f.values.defined()) {
    in.push_back(f.values);
    in.push_back(f.indices);
  } else {
    in.push_back(Tensor::zeros(DType::f32, {0, cols}));
    in.push_back(Tensor::zeros(DType::i32, {0}));
  }
  for (const auto& b : f.blocks) in.push_back(b.right);
  return in;
}

std::vector<int64_t> factor_attrs(const train::FactoredGradient& f, int64_t rows, int64_t cols, bool bf16) {
  std::vector<int64_t> ints{rows, cols, bf16 ? 1 : 0};
  for (const auto& b : f.blocks) ints.push_back(b.col);
  return ints;
}

void check_factors(const char* op, const std::vector<Tensor>& in, size_t first, const Attrs& attrs) {
  const std::string name = op;
  const auto f32 = [&](const Tensor& t, const std::string& what) {
    if (t.dtype() != DType::f32) throw DTypeError(name + ": " + what + " must be f32, got " + dtype_name(t.dtype()));
  };
  if (in.size() < first + 4) {
    throw ShapeError(name + ": needs left, values, indices and at least one right factor, got " +
                     std::to_string(in.size() - first) + " factor operands");
  }
  const size_t blocks = in.size() - first - 3;
  if (attrs.ints.size() != 3 + blocks) {
    throw ShapeError(name + ": attrs must be {rows, cols, bf16} and one col per block (" + std::to_string(3 + blocks) +
                     "), got " + std::to_string(attrs.ints.size()));
  }
  const int64_t rows = attrs.ints[0], cols = attrs.ints[1];
  const Tensor &left = in[first], &values = in[first + 1], &indices = in[first + 2];
  f32(left, "left");
  if (left.rank() != 2 || left.dim(1) != rows) {
    throw ShapeError(name + ": left must be [T, " + std::to_string(rows) + "], got " + to_string(left.shape()));
  }
  f32(values, "values");
  if (indices.dtype() != DType::i32) {
    throw DTypeError(name + ": indices must be i32, got " + dtype_name(indices.dtype()));
  }
  Shape rows_shape = indices.shape();
  rows_shape.push_back(cols);
  if (values.shape() != rows_shape) {
    throw ShapeError(name + ": values must be " + to_string(rows_shape) + " (the indices' shape, then cols), got " +
                     to_string(values.shape()));
  }
  int64_t end = 0;  // the blocks' columns: ascending, disjoint, within cols
  for (size_t i = 0; i < blocks; ++i) {
    const Tensor& right = in[first + 3 + i];
    const std::string what = "right " + std::to_string(i);
    f32(right, what);
    const int64_t col = attrs.ints[3 + i];
    if (right.rank() != 2 || right.dim(0) != left.dim(0)) {
      throw ShapeError(name + ": " + what + " must be [" + std::to_string(left.dim(0)) + ", width] (left's T), got " +
                       to_string(right.shape()));
    }
    if (col < end || col + right.dim(1) > cols) {
      throw ShapeError(name + ": " + what + " must fill columns in [" + std::to_string(end) + ", " +
                       std::to_string(cols) + "), got [" + std::to_string(col) + ", " +
                       std::to_string(col + right.dim(1)) + ")");
    }
    end = col + right.dim(1);
  }
}

const float* CpuFactors::floats(const KernelArgs& a, const TensorView& x) {
  if (x.contiguous) return x.ptr<float>();
  gathered_.emplace_back(size_t(x.numel()));
  copy_to_contiguous(a, x, gathered_.back().data());
  return gathered_.back().data();
}

CpuFactors::CpuFactors(const KernelArgs& a, size_t first) {
  const TensorView &left = a.in[first], &values = a.in[first + 1], &indices = a.in[first + 2];
  const std::vector<int64_t>& ints = a.attrs->ints;
  std::vector<train::GradientRows::Block> blocks;
  for (size_t i = first + 3; i < a.in.size(); ++i) {
    blocks.push_back({floats(a, a.in[i]), ints[i - first], a.in[i].shape[1]});
  }
  const int64_t n = indices.numel();
  const int32_t* idx = indices.ptr<int32_t>();
  if (n > 0 && !indices.contiguous) {
    indices_.resize(size_t(n));
    copy_to_contiguous(a, indices, indices_.data());
    idx = indices_.data();
  }
  rows_.emplace(floats(a, left), left.shape[0], ints[0], ints[1], std::move(blocks),
                n > 0 ? floats(a, values) : nullptr, n > 0 ? idx : nullptr, n, ints[2] != 0);
}

}  // namespace nabla::ops
