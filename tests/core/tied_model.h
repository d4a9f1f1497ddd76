// Test models shared by the training-step tests (trainer_test,
// factored_update_test): deterministic values, no files.
#pragma once

#include <cmath>
#include <cstdint>

#include "nabla/nabla.hpp"

namespace nabla::testing_models {

// sin(scale * (i + 1)) at element i: varied, repeatable values.
inline Tensor ramp(Shape shape, double scale) {
  Tensor t = Tensor::zeros(DType::f32, shape);
  for (int64_t i = 0; i < t.numel(); ++i) t.data_as<float>()[i] = float(std::sin(scale * double(i + 1)));
  return t;
}

// A token model with a tied embedding: wte [V, D] looks the tokens up and is
// the output head; w_in [H, D] is a linear layer's weight (x w_in^T), w_out
// [H, D] a Conv1D-style one (h w_out) and w_qkv [D, 3D] a fused one read a
// column block at a time (GPT-2's c_attn). Every weight's gradient is a
// product over the tokens, with factors smaller than it.
struct TiedModel {
  nn::Params params;
  Tensor tokens, targets, loss;
  TiedModel(int64_t batch, int64_t seq, int64_t vocab, int64_t dim, int64_t hidden) {
    Tensor wte = params.add("wte.weight", ramp({vocab, dim}, 0.37));
    Tensor w_in = params.add("fc.weight", ramp({hidden, dim}, 0.23));
    Tensor w_out = params.add("proj.weight", ramp({hidden, dim}, 0.71));
    Tensor bias = params.add("fc.bias", ramp({hidden}, 0.13));
    Tensor w_qkv = params.add("qkv.weight", ramp({dim, 3 * dim}, 0.19));
    tokens = Tensor::zeros(DType::i32, {batch, seq});
    targets = Tensor::zeros(DType::i32, {batch, seq});
    for (int64_t i = 0; i < batch * seq; ++i) {
      tokens.data_as<int32_t>()[i] = int32_t((7 * i + 3) % vocab);  // repeats: rows that add up
      targets.data_as<int32_t>()[i] = int32_t((5 * i + 1) % vocab);
    }
    Tensor x = get_rows(wte, tokens);                                         // [B, T, D]
    Tensor h = gelu(matmul_add(x, transpose(w_in), bias));                    // [B, T, H]
    auto block = [&](int64_t i) { return matmul(x, slice(w_qkv, 1, i * dim, (i + 1) * dim)); };
    Tensor y = x + matmul(h, w_out) + block(0) * sigmoid(block(1)) + block(2);  // [B, T, D]
    loss = cross_entropy(matmul(y, transpose(wte)), targets);                 // tied head
  }
};

}  // namespace nabla::testing_models
