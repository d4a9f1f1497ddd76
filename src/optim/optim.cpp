#include <algorithm>
#include <cmath>
#include <sstream>

#include "backend/cpu/simd.h"
#include "backend/cpu/thread_pool.h"
#include "nabla/error.h"
#include "nabla/optim.h"
#include "optim/update.h"

namespace nabla::optim {

namespace {

// Elements per chunk of the fused update: fixed, so every element is updated
// by the same arithmetic whatever the thread count.
constexpr int64_t kGrain = 1 << 15;

// 1e-08 rather than std::to_string's 0.000000.
std::string shortest(double value) {
  std::ostringstream out;
  out << value;
  return out.str();
}

std::vector<int64_t> slot_offsets(const std::vector<Slot>& slots) {
  std::vector<int64_t> off{0};
  for (const Slot& s : slots) {
    if (!s.param.defined() || !s.param.is_leaf() || s.param.dtype() != DType::f32) {
      throw DTypeError("optimizer: parameter '" + s.name + "' must be an f32 leaf");
    }
    off.push_back(off.back() + s.param.numel());
  }
  return off;
}

// Runs fn(slot, begin, end) over [begin, end) element ranges of each slot,
// for the concatenation of all slots split into fixed chunks.
template <class F>
void for_each_range(const std::vector<int64_t>& off, int threads, F&& fn) {
  int64_t total = off.back();
  cpu::parallel_for(threads, total, kGrain, [&](int64_t b, int64_t e) {
    size_t s = std::upper_bound(off.begin(), off.end(), b) - off.begin() - 1;
    while (b < e) {
      int64_t end = std::min(e, off[s + 1]);
      if (end > b) fn(s, b - off[s], end - off[s]);
      b = end;
      ++s;
    }
  });
}

void check_grads(const std::vector<const float*>& grads, size_t n, bool has_range = false) {
  if (grads.size() != n) {
    throw UsageError("optimizer: " + std::to_string(grads.size()) + " gradients for " + std::to_string(n) +
                     " parameters");
  }
  for (size_t i = 0; i < n; ++i) {
    if (!grads[i] && !has_range) throw UsageError("optimizer: no gradient for parameter " + std::to_string(i));
  }
}

}  // namespace

bool default_decay(const std::string& name, const Tensor& param) {
  if (param.rank() <= 1) return false;
  return name != "pos_embed" && name != "cls_token" && name.find("wpe") == std::string::npos;
}

namespace {

double sum_squares(const float* x, int64_t n) { return cpu::sum_squares_f64(x, n); }
double sum_squares(const double* x, int64_t n) {
  double s = 0;
  for (int64_t i = 0; i < n; ++i) s += x[i] * x[i];
  return s;
}

template <class T>
double chunk_squares(const std::vector<const T*>& xs, const std::vector<int64_t>& offsets, int64_t chunk) {
  const int64_t b = chunk * kNormChunk, e = std::min(offsets.back(), b + kNormChunk);
  double acc = 0;
  size_t s = std::upper_bound(offsets.begin(), offsets.end(), b) - offsets.begin() - 1;
  for (int64_t i = b; i < e;) {
    const int64_t end = std::min(e, offsets[s + 1]);
    acc += sum_squares(xs[s] + (i - offsets[s]), end - i);
    i = end;
    ++s;
  }
  return acc;
}

}  // namespace

double squared_norm_chunk(const std::vector<const float*>& grads, const std::vector<int64_t>& offsets,
                          int64_t chunk) {
  return chunk_squares(grads, offsets, chunk);
}

double squared_norm_chunk(const std::vector<const double*>& xs, const std::vector<int64_t>& offsets,
                          int64_t chunk) {
  return chunk_squares(xs, offsets, chunk);
}

double global_norm(const std::vector<const float*>& grads, const std::vector<int64_t>& sizes, int threads) {
  check_grads(grads, sizes.size());
  std::vector<int64_t> off{0};
  for (int64_t n : sizes) off.push_back(off.back() + n);
  const int64_t chunks = (off.back() + kNormChunk - 1) / kNormChunk;
  // One partial sum per fixed chunk, added in chunk order: deterministic.
  std::vector<double> partial(static_cast<size_t>(chunks), 0.0);
  cpu::parallel_for(threads, chunks, 1, [&](int64_t b, int64_t e) {
    for (int64_t c = b; c < e; ++c) partial[size_t(c)] = squared_norm_chunk(grads, off, c);
  });
  double total = 0;
  for (double p : partial) total += p;
  return std::sqrt(total);
}

AdamWConstants adamw_constants(const AdamWConfig& c, int64_t t, double lr, double grad_scale, bool decay) {
  AdamWConstants k;
  k.b1 = float(c.beta1);
  k.b2 = float(c.beta2);
  k.eps = float(c.eps);
  // 1 - beta in double, then rounded: 1 - float(0.999) is 1.3e-5 off 0.001,
  // a bias in v that the bias correction (in double) would not cancel.
  k.c1 = float(1 - c.beta1);
  k.c2 = float(1 - c.beta2);
  const double bc1 = 1 - std::pow(c.beta1, double(t)), bc2 = 1 - std::pow(c.beta2, double(t));
  k.step_size = float(lr / bc1);
  k.inv_sqrt_bc2 = float(1 / std::sqrt(bc2));
  k.grad_scale = float(grad_scale);
  k.decay = decay ? float(1 - lr * c.weight_decay) : 1.0f;
  return k;
}

void adamw_update(float* p, float* m, float* v, const float* g, int64_t n, const AdamWConstants& k) {
  // On cpu::VecF: a scalar loop would not vectorise (std::sqrt sets errno).
  // The same lane-wise arithmetic for every element, tail included, so an
  // element's result does not depend on where a chunk starts.
  using cpu::VecF;
  for (int64_t i = 0; i < n; i += VecF::kWidth) {
    const int64_t w = std::min<int64_t>(VecF::kWidth, n - i);
    const VecF gi = VecF::load(g + i, 1, w) * k.grad_scale;
    const VecF mi = VecF(k.b1) * VecF::load(m + i, 1, w) + VecF(k.c1) * gi;
    const VecF vi = VecF(k.b2) * VecF::load(v + i, 1, w) + VecF(k.c2) * gi * gi;
    const VecF pi =
        VecF::load(p + i, 1, w) * k.decay - VecF(k.step_size) * mi / (cpu::sqrt(vi) * k.inv_sqrt_bc2 + k.eps);
    mi.store(m + i, w);
    vi.store(v + i, w);
    pi.store(p + i, w);
  }
}

SgdConstants sgd_constants(double lr, double momentum, double weight_decay, double grad_scale) {
  return {.lr = float(lr), .momentum = float(momentum), .weight_decay = float(weight_decay),
          .grad_scale = float(grad_scale)};
}

void sgd_update(float* p, float* buf, const float* g, int64_t n, const SgdConstants& k) {
  // Locals: the stores to p and buf (floats) could alias k's fields.
  const float gs = k.grad_scale, wd = k.weight_decay, mu = k.momentum, rate = k.lr;
  for (int64_t i = 0; i < n; ++i) {
    const float gi = g[i] * gs + wd * p[i];
    buf[i] = mu * buf[i] + gi;
    p[i] -= rate * buf[i];
  }
}

ClipScale clip_scale(double squared_norm, double average, double clip) {
  const double norm = std::sqrt(squared_norm) * average;
  double scale = average;
  if (clip > 0 && norm > clip) scale *= clip / norm;
  return {norm, scale};
}

AdamW::AdamW(std::vector<Slot> slots, AdamWConfig config, int threads, bool hold_moments)
    : slots_(std::move(slots)), config_(config), threads_(threads), hold_moments_(hold_moments) {
  // As PyTorch's: callers through the C API pass these unchecked.
  auto require = [](bool ok, const std::string& what, double value) {
    if (!ok) throw UsageError("adamw: " + what + ", got " + shortest(value));
  };
  require(config.beta1 >= 0 && config.beta1 < 1, "beta1 must be in [0, 1)", config.beta1);
  require(config.beta2 >= 0 && config.beta2 < 1, "beta2 must be in [0, 1)", config.beta2);
  require(config.eps >= 0 && std::isfinite(config.eps), "eps must be finite and >= 0", config.eps);
  require(config.weight_decay >= 0 && std::isfinite(config.weight_decay), "weight decay must be finite and >= 0",
          config.weight_decay);
  offsets_ = slot_offsets(slots_);
  for (const Slot& s : slots_) {
    m_.push_back(hold_moments ? Tensor::zeros(DType::f32, s.param.shape()) : Tensor());
    v_.push_back(hold_moments ? Tensor::zeros(DType::f32, s.param.shape()) : Tensor());
  }
}

namespace {

void require_moments(bool held, const char* what) {
  if (!held) {
    throw UsageError(std::string("adamw: ") + what + " needs the moments, which this optimizer does not hold (a "
                     "training step shards them across processes)");
  }
}

}  // namespace

void AdamW::set_decay(size_t slot, bool decay) {
  if (slot >= slots_.size()) {
    throw UsageError("adamw: no slot " + std::to_string(slot) + " among " + std::to_string(slots_.size()));
  }
  slots_[slot].decay = decay;
}

void AdamW::step(const std::vector<const float*>& grads, double lr, double grad_scale, const GradientRange& range) {
  require_moments(hold_moments_, "step");
  check_grads(grads, slots_.size(), bool(range));
  if (!(lr >= 0) || !std::isfinite(lr)) {
    throw UsageError("adamw: learning rate must be finite and >= 0, got " + shortest(lr));
  }
  ++t_;
  for_each_range(offsets_, threads_, [&](size_t s, int64_t b, int64_t e) {
    // Elements [b, e) of the gradient: read in place, or computed now.
    const float* g = grads[s] ? grads[s] + b : range(s, b, e);
    const AdamWConstants k = adamw_constants(config_, t_, lr, grad_scale, slots_[s].decay);
    adamw_update(slots_[s].param.data_as<float>() + b, m_[s].data_as<float>() + b, v_[s].data_as<float>() + b, g,
                 e - b, k);
  });
}

std::vector<std::pair<std::string, Tensor>> AdamW::state() const {
  require_moments(hold_moments_, "state");
  std::vector<std::pair<std::string, Tensor>> out;
  for (size_t i = 0; i < slots_.size(); ++i) {
    out.emplace_back("optimizer.exp_avg." + slots_[i].name, m_[i]);
    out.emplace_back("optimizer.exp_avg_sq." + slots_[i].name, v_[i]);
  }
  return out;
}

void AdamW::load_state(const std::vector<std::pair<std::string, Tensor>>& tensors, int64_t steps) {
  auto find = [&](const std::string& name) -> const Tensor& {
    for (const auto& [n, t] : tensors) {
      if (n == name) return t;
    }
    throw IoError("optimizer state: missing '" + name + "'");
  };
  // Every moment is checked before any is written: a bad file leaves the
  // optimizer as it was.
  std::vector<std::pair<const Tensor*, const Tensor*>> moments;
  for (size_t i = 0; i < slots_.size(); ++i) {
    const Tensor& m = find("optimizer.exp_avg." + slots_[i].name);
    const Tensor& v = find("optimizer.exp_avg_sq." + slots_[i].name);
    if (m.shape() != slots_[i].param.shape() || v.shape() != slots_[i].param.shape() || m.dtype() != DType::f32 ||
        v.dtype() != DType::f32) {
      throw IoError("optimizer state: moments of '" + slots_[i].name + "' do not match its shape " +
                    to_string(slots_[i].param.shape()));
    }
    moments.emplace_back(&m, &v);
  }
  for (size_t i = 0; hold_moments_ && i < slots_.size(); ++i) {
    m_[i].copy_from(moments[i].first->data(), size_t(moments[i].first->numel()) * 4);
    v_[i].copy_from(moments[i].second->data(), size_t(moments[i].second->numel()) * 4);
  }
  t_ = steps;
}

Sgd::Sgd(std::vector<Slot> slots, double momentum, double weight_decay, int threads)
    : slots_(std::move(slots)), momentum_(momentum), weight_decay_(weight_decay), threads_(threads) {
  offsets_ = slot_offsets(slots_);
  for (const Slot& s : slots_) buf_.push_back(Tensor::zeros(DType::f32, s.param.shape()));
}

void Sgd::step(const std::vector<const float*>& grads, double lr, double grad_scale) {
  check_grads(grads, slots_.size());
  for_each_range(offsets_, threads_, [&](size_t s, int64_t b, int64_t e) {
    const SgdConstants k = sgd_constants(lr, momentum_, slots_[s].decay ? weight_decay_ : 0.0, grad_scale);
    sgd_update(slots_[s].param.data_as<float>() + b, buf_[s].data_as<float>() + b, grads[s] + b, e - b, k);
  });
}

double warmup_cosine(int64_t step, int64_t warmup, int64_t total, double base, double min_lr) {
  if (warmup > 0 && step < warmup) return base * double(step + 1) / double(warmup);
  if (step >= total) return min_lr;
  double progress = double(step - warmup) / double(std::max<int64_t>(1, total - warmup));
  return min_lr + 0.5 * (base - min_lr) * (1 + std::cos(M_PI * progress));
}

}  // namespace nabla::optim
