// The backends with memory of their own that tests hold against the CPU:
// the reference kernels, the CUDA kernels under the emulator, and the CUDA
// kernels on the GPU where this machine has one.
#pragma once

#include <random>
#include <string>
#include <vector>

#include "nabla/executor.h"
#include "nabla/tensor.h"

namespace nabla::testing_backends {

// The CUDA kernels: under the emulator, and on the GPU where there is one.
inline std::vector<std::string> cuda_backends() {
  std::vector<std::string> b{"cuda-emulated"};
  if (backend_unavailable("cuda").empty()) b.push_back("cuda");
  return b;
}

inline std::vector<std::string> device_backends() {
  std::vector<std::string> b{"reference"};
  for (const std::string& c : cuda_backends()) b.push_back(c);
  return b;
}

// "cpu" and then the device backends.
inline std::vector<std::string> all_backends() {
  std::vector<std::string> b{"cpu"};
  for (const std::string& d : device_backends()) b.push_back(d);
  return b;
}

// Standard normal values of `dtype` (f32 or f64), the same for a seed.
inline Tensor random_tensor(DType dtype, const Shape& shape, unsigned seed) {
  std::mt19937 gen(seed);
  std::normal_distribution<double> normal(0.0, 1.0);
  std::vector<double> v(static_cast<size_t>(numel(shape)));
  for (double& x : v) x = normal(gen);
  if (dtype == DType::f64) return Tensor::from_vector<double>(shape, v);
  return Tensor::from_vector<float>(shape, std::vector<float>(v.begin(), v.end()));
}

// For INSTANTIATE_TEST_SUITE_P's names: "cuda-emulated" -> "cuda_emulated".
inline std::string test_name(const std::string& backend) {
  std::string s = backend;
  for (char& c : s) c = c == '-' ? '_' : c;
  return s;
}

}  // namespace nabla::testing_backends
