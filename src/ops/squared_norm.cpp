// squared_norm: the sum of the squares of every element of every input, in
// f64: the global gradient norm's square, as a node of a training graph.
//
//   inputs: xs (f32 or f64, all one dtype, any shapes and layouts)
//   output: f64 []
//   the sum: the inputs seen as one concatenation, summed in fixed chunks of
//   optim::kNormChunk elements (optim::squared_norm_chunk), the chunks' sums
//   added in order: for f32 inputs the bits of optim::global_norm's square.
#include <vector>

#include "backend/cpu/kernel.h"
#include "core/op.h"
#include "ops/internal_ops.h"
#include "optim/update.h"

namespace nabla {
namespace ops {
namespace {

Meta squared_norm_infer(const std::vector<Tensor>& in, const Attrs&) {
  if (in.empty()) throw ShapeError("squared_norm: needs at least one tensor");
  for (size_t i = 0; i < in.size(); ++i) {
    if (!is_floating(in[i].dtype())) {
      throw DTypeError("squared_norm: input " + std::to_string(i) + " must be f32 or f64, got " +
                       dtype_name(in[i].dtype()));
    }
    if (in[i].dtype() != in[0].dtype()) {
      throw DTypeError("squared_norm: input " + std::to_string(i) + " is " + dtype_name(in[i].dtype()) +
                       ", input 0 is " + dtype_name(in[0].dtype()) + "; all must have one dtype");
    }
  }
  return {DType::f64, {}};
}

template <class T>
void squared_norm_kernel(const KernelArgs& a) {
  // Strided inputs are gathered first, so every chunk reads contiguous runs.
  std::vector<std::vector<T>> gathered(a.in.size());
  std::vector<const T*> xs;
  std::vector<int64_t> offsets{0};
  for (size_t i = 0; i < a.in.size(); ++i) {
    const TensorView& x = a.in[i];
    if (x.contiguous) {
      xs.push_back(x.ptr<T>());
    } else {
      gathered[i].resize(size_t(x.numel()));
      copy_to_contiguous(a, x, gathered[i].data());
      xs.push_back(gathered[i].data());
    }
    offsets.push_back(offsets.back() + x.numel());
  }
  const int64_t chunks = (offsets.back() + optim::kNormChunk - 1) / optim::kNormChunk;
  std::vector<double> partial(size_t(chunks), 0.0);
  a.parallel_for(chunks, 1, [&](int64_t b, int64_t e) {
    for (int64_t c = b; c < e; ++c) partial[size_t(c)] = optim::squared_norm_chunk(xs, offsets, c);
  });
  double total = 0;
  for (double p : partial) total += p;
  a.out.ptr<double>()[0] = total;
}

void squared_norm_forward(const KernelArgs& a) {
  dispatch_floating(a.in[0].dtype, "squared_norm", [&]<class T>() { squared_norm_kernel<T>(a); });
}

// d/dx_i sum(x^2) = 2 x_i, times the scalar dout in x_i's dtype.
Grads squared_norm_backward(const BackwardArgs& g) {
  Grads d(g.inputs.size());
  const Tensor dout = cast(g.dout, g.inputs[0].dtype());
  for (size_t i = 0; i < g.inputs.size(); ++i) {
    if (g.needs(i)) d[i] = scale(g.inputs[i] * dout, 2.0);
  }
  return d;
}

// The output is cast to the inputs' dtype, as the f32 gradient check reads it.
std::vector<GradCase> squared_norm_cases() {
  return {
      {"two", {normal({3, 4}), normal({5})},
       [](const std::vector<Tensor>& x) { return cast(squared_norm({x[0], x[1]}), x[0].dtype()); }},
      {"three", {normal({2, 3, 2}), normal({}), normal({4, 1})},
       [](const std::vector<Tensor>& x) { return cast(squared_norm({x[0], x[1], x[2]}), x[0].dtype()); }},
  };
}

}  // namespace

extern const OpDef op_squared_norm{
    .name = "squared_norm",
    .summary = "sum of the squares of all elements of all inputs, in f64 (the global norm's square)",
    .inputs = {{"xs", Diff::yes}},
    .variadic = true,
    .infer = squared_norm_infer,
    .backward = squared_norm_backward,
    .cases = squared_norm_cases,
};
NABLA_CPU_KERNEL(op_squared_norm, squared_norm_forward);

}  // namespace ops

Tensor squared_norm(const std::vector<Tensor>& xs) { return apply(ops::op_squared_norm, xs); }

}  // namespace nabla
