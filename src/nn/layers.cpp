#include <algorithm>
#include <cmath>
#include <limits>

#include "nabla/error.h"
#include "nabla/executor.h"
#include "nabla/gguf.h"
#include "nabla/graph.h"
#include "nabla/nn.h"
#include "ops/internal_ops.h"

namespace nabla::nn {

namespace {

template <class T>
const T* find_named(const std::vector<std::pair<std::string, T>>& list, const std::string& name) {
  for (const auto& [n, v] : list) {
    if (n == name) return &v;
  }
  return nullptr;
}

// The source's tensor standing for `initial` (its shape and dtype), or for
// a stored one its rows, columns and byte rows.
Tensor from_source(const WeightSource& source, const std::string& name, const Tensor& initial,
                   const StoredFormat* format) {
  const Tensor* t = find_named(source.tensors, name);
  if (!t) throw IoError(source.origin + ": missing parameter '" + name + "'");
  const Shape& want = initial.shape();
  const bool fits = format ? want.size() == 2 && format->cols == want[1] && t->dtype() == DType::u8 &&
                                 t->rank() == 2 && t->dim(0) == want[0]
                           : t->dtype() == initial.dtype() && t->shape() == want;
  if (!fits) {
    throw IoError(source.origin + ": parameter '" + name + "' is " +
                  to_string(*t) +
                  (format ? std::string(" stored as ") + ggml_type_name(format->type) + " rows of " +
                                std::to_string(format->cols)
                          : "") +
                  ", the model expects " + to_string(initial));
  }
  return *t;
}

}  // namespace

Tensor Params::add(const std::string& name, Tensor t) {
  if (find_named(list_, name)) throw UsageError("params: '" + name + "' is added twice");
  if (!source_.tensors.empty()) {
    const StoredFormat* format = find_named(source_.formats, name);
    t = from_source(source_, name, t, format);
    if (format) formats_.emplace_back(name, *format);
  }
  if (!format(name)) t.requires_grad();  // a stored weight has no gradient: frozen from the start
  t.set_name(name);
  list_.emplace_back(name, t);
  return t;
}

void Params::freeze() {
  for (auto& [_, t] : list_) t.requires_grad(false);
}

const Tensor& Params::get(const std::string& name) const {
  if (const Tensor* t = find_named(list_, name)) return *t;
  throw UsageError("params: no parameter named '" + name + "'");
}

const StoredFormat* Params::format(const std::string& name) const { return find_named(formats_, name); }

int64_t Params::count() const {
  int64_t n = 0;
  for (const auto& [name, t] : list_) {
    const StoredFormat* f = format(name);
    n += f ? t.dim(0) * f->cols : t.numel();
  }
  return n;
}

Tensor Init::trunc_normal(Shape shape, double std) {
  if (!draw_) return placeholder(std::move(shape));
  Tensor t = Tensor::zeros(DType::f32, std::move(shape));
  std::normal_distribution<double> n(0.0, 1.0);
  float* p = t.data_as<float>();
  for (int64_t i = 0; i < t.numel(); ++i) {
    double v;
    do v = n(rng_);
    while (std::abs(v) > 2.0);
    p[i] = static_cast<float>(v * std);
  }
  return t;
}

Tensor Init::normal(Shape shape, double std) {
  if (!draw_) return placeholder(std::move(shape));
  Tensor t = Tensor::zeros(DType::f32, std::move(shape));
  std::normal_distribution<double> n(0.0, std);
  float* p = t.data_as<float>();
  for (int64_t i = 0; i < t.numel(); ++i) p[i] = static_cast<float>(n(rng_));
  return t;
}

Tensor Init::uniform(Shape shape, double lo, double hi) {
  if (!draw_) return placeholder(std::move(shape));
  Tensor t = Tensor::zeros(DType::f32, std::move(shape));
  std::uniform_real_distribution<double> u(lo, hi);
  float* p = t.data_as<float>();
  for (int64_t i = 0; i < t.numel(); ++i) p[i] = static_cast<float>(u(rng_));
  return t;
}

Gelu parse_gelu(const std::string& name) {
  if (name == "gelu" || name == "gelu_tanh") return Gelu::tanh;
  if (name == "gelu_erf") return Gelu::erf;
  if (name == "gelu_quick") return Gelu::quick;
  throw UsageError("gelu: unknown variant '" + name + "' (expected gelu, gelu_erf or gelu_quick)");
}

const char* gelu_name(Gelu g) {
  switch (g) {
    case Gelu::tanh: return "gelu";
    case Gelu::erf: return "gelu_erf";
    case Gelu::quick: return "gelu_quick";
  }
  return "?";
}

Tensor apply_gelu(Gelu g, const Tensor& x) {
  switch (g) {
    case Gelu::tanh: return gelu(x);
    case Gelu::erf: return gelu_erf(x);
    case Gelu::quick: return gelu_quick(x);
  }
  return x;
}

namespace {

std::string join(const std::string& prefix, const std::string& name) {
  return prefix.empty() ? name : prefix + "." + name;
}

}  // namespace

Linear::Linear(Params& p, const std::string& prefix, int64_t in, int64_t out, bool with_bias, Init& init,
               double std, WeightLayout layout_)
    : layout(layout_) {
  name = prefix;
  weight = p.add(prefix + ".weight", init.weight(layout == WeightLayout::out_in ? Shape{out, in} : Shape{in, out}, std));
  if (const StoredFormat* f = p.format(prefix + ".weight")) {
    if (layout != WeightLayout::out_in) throw UsageError("linear: '" + prefix + "' keeps [in, out] weights, not stored ones");
    stored = *f;
  }
  if (with_bias) bias = p.add(prefix + ".bias", init.zeros({out}));
}

// x [..., in] @ W^T: matmul reads the transposed view without a copy.
// The adapter scales its narrow [.., r] product, not the output, and adds
// its second product into the base's output in place (matmul_add).
namespace {

// x W^T, plus the bias when `with_bias` and the layer has one.
Tensor base_product(const Linear& l, const Tensor& x, bool with_bias) {
  if (l.stored) {
    const Tensor y = matmul_quantized(x, l.weight, l.stored->type, l.stored->cols);
    return with_bias && l.bias.defined() ? y + l.bias : y;
  }
  const Tensor w = l.layout == WeightLayout::out_in ? transpose(l.weight) : l.weight;
  return with_bias && l.bias.defined() ? matmul_add(x, w, l.bias) : matmul(x, w);
}

// The weight as [out, in] f32 (a view, or the stored format dequantized).
Tensor weight_out_in(const Linear& l) {
  if (l.stored) return dequantize(l.weight, l.stored->type, l.stored->cols);
  return l.layout == WeightLayout::out_in ? l.weight : transpose(l.weight);
}

}  // namespace

Tensor Linear::dora_norm() const {
  const Tensor merged = matmul_add(scale(lora.b, lora.scale), lora.a, weight_out_in(*this));
  return detach(sqrt(sum(square(merged), {1})));
}

Tensor Linear::operator()(const Tensor& x, bool train) const {
  const bool dora = lora.magnitude.defined();
  const Tensor y = base_product(*this, x, !dora);
  if (!lora.defined()) return y;
  const bool drop = train && lora.dropout > 0;
  const Tensor in = drop ? dropout(x, lora.dropout, lora.dropout_seed, true, lora.salt) : x;
  const Tensor down = scale(matmul(in, transpose(lora.a)), lora.scale);
  if (!dora) return matmul_add(down, transpose(lora.b), y);
  // PEFT's DoRA: m / n scales the base product and the adapter's term.
  const Tensor m = lora.magnitude / dora_norm();
  Tensor out = drop ? y + (m - scalar_like(1.0, m)) * base_product(*this, in, false) + m * matmul(down, transpose(lora.b))
                    : m * matmul_add(down, transpose(lora.b), y);
  return bias.defined() ? out + bias : out;
}

Linear Linear::outputs(int64_t begin, int64_t end) const {
  Linear part;
  part.layout = layout;
  part.name = name;
  part.stored = stored;
  part.weight = slice(weight, layout == WeightLayout::out_in ? 0 : 1, begin, end);
  if (bias.defined()) part.bias = slice(bias, 0, begin, end);
  if (lora.defined()) {
    part.lora = lora;
    part.lora.b = slice(lora.b, 0, begin, end);
    if (lora.magnitude.defined()) part.lora.magnitude = slice(lora.magnitude, 0, begin, end);
  }
  return part;
}

void Linear::merge_adapter() {
  if (!lora.defined()) return;
  if (stored) {
    throw UsageError("linear: '" + name + "' keeps its weight as " + ggml_type_name(stored->type) +
                     "; merge the adapter into the f32 base instead");
  }
  const int64_t out = out_features(), in = in_features(), r = lora.a.dim(0);
  const std::vector<float> A = lora.a.to_vector<float>(), B = lora.b.to_vector<float>();
  const std::vector<float> M = lora.magnitude.defined() ? lora.magnitude.to_vector<float>() : std::vector<float>();
  float* w = weight.data_as<float>();
  std::vector<double> row(static_cast<size_t>(in));
  for (int64_t o = 0; o < out; ++o) {
    std::fill(row.begin(), row.end(), 0.0);
    for (int64_t k = 0; k < r; ++k) {
      const double b = B[size_t(o * r + k)];
      const float* a = A.data() + k * in;
      for (int64_t i = 0; i < in; ++i) row[size_t(i)] += b * a[i];
    }
    const auto at = [&](int64_t i) -> float& { return layout == WeightLayout::out_in ? w[o * in + i] : w[i * out + o]; };
    double norm2 = 0;
    for (int64_t i = 0; i < in; ++i) {
      row[size_t(i)] = double(at(i)) + lora.scale * row[size_t(i)];
      norm2 += row[size_t(i)] * row[size_t(i)];
    }
    const double dora = M.empty() ? 1.0 : double(M[size_t(o)]) / std::sqrt(norm2);
    for (int64_t i = 0; i < in; ++i) at(i) = float(dora * row[size_t(i)]);
  }
  lora = LoraAdapter{};
}

double LoraConfig::scale() const { return rslora ? alpha / std::sqrt(double(r)) : alpha / double(r); }

void LoraConfig::validate() const {
  if (r < 1) throw UsageError("lora: r must be at least 1, got " + std::to_string(r));
  if (!(alpha > 0) || !std::isfinite(alpha)) throw UsageError("lora: alpha must be positive");
  if (!(dropout >= 0 && dropout < 1)) throw UsageError("lora: dropout must be in [0, 1)");
  if (targets.empty()) throw UsageError("lora: no target modules");
}

void add_lora(const std::vector<Linear*>& layers, const LoraConfig& c, Params& adapters, Init& init,
              const Tensor& dropout_seed) {
  c.validate();
  if (c.dropout > 0 && !dropout_seed.defined()) throw UsageError("lora: dropout needs a seed leaf");
  std::vector<bool> used(c.targets.size());
  int64_t salt = 1 << 20;  // apart from the blocks' own dropout salts
  for (Linear* l : layers) {
    const std::string module = l->name.substr(l->name.find_last_of('.') + 1);
    auto t = std::find(c.targets.begin(), c.targets.end(), module);
    if (t == c.targets.end()) continue;
    used[size_t(t - c.targets.begin())] = true;
    if (l->lora.defined()) throw UsageError("lora: " + l->name + " already has an adapter");
    const int64_t in = l->in_features(), out = l->out_features();
    const double bound = 1 / std::sqrt(double(in));
    const std::string peft = "base_model.model." + l->name;
    l->lora.a = adapters.add(peft + ".lora_A.weight", init.uniform({c.r, in}, -bound, bound));
    l->lora.b = adapters.add(peft + ".lora_B.weight", init.zeros({out, c.r}));
    l->lora.scale = c.scale();
    if (c.dora) {  // B is zero: the norms are the weight's own
      l->lora.magnitude = adapters.add(peft + ".lora_magnitude_vector", eval(l->dora_norm()));
    }
    l->lora.dropout = c.dropout;
    l->lora.dropout_seed = dropout_seed;
    l->lora.salt = salt++;
  }
  for (size_t i = 0; i < used.size(); ++i) {
    if (!used[i]) throw UsageError("lora: target module '" + c.targets[i] + "' matches no layer of the model");
  }
}

Norm::Norm(Params& p, const std::string& prefix, int64_t dim, double eps_, Init& init, NormKind kind_)
    : eps(eps_), kind(kind_) {
  weight = p.add(prefix + ".weight", kind == NormKind::rms_unit_offset ? init.zeros({dim}) : init.ones({dim}));
  if (kind == NormKind::layer) bias = p.add(prefix + ".bias", init.zeros({dim}));
}

Tensor Norm::operator()(const Tensor& x) const {
  switch (kind) {
    case NormKind::rms:
      return rms_norm(x, weight, eps);
    case NormKind::rms_unit_offset:
      return rms_norm(x, weight + scalar_like(1.0, weight), eps);
    case NormKind::layer:
      break;
  }
  return layer_norm(x, weight, bias, eps);
}

Embedding::Embedding(Params& p, const std::string& name, int64_t vocab, int64_t dim, Init& init, double std) {
  weight = p.add(name, init.normal({vocab, dim}, std));
  if (const StoredFormat* f = p.format(name)) stored = *f;
}

Tensor Embedding::operator()(const Tensor& indices) const {
  if (!stored) return get_rows(weight, indices);
  Shape shape = indices.shape();
  shape.push_back(stored->cols);
  const Tensor rows = get_rows(weight, reshape(indices, {indices.numel()}));  // u8 [n, row bytes]
  return reshape(dequantize(rows, stored->type, stored->cols), shape);
}

Tensor Dropout::operator()(const Tensor& x, bool train, int64_t salt) const {
  if (!train || p <= 0 || !seed.defined()) return x;
  // Each call site gets its own mask stream: the seed leaf plus its salt.
  return dropout(x, p, seed, true, salt);
}

Attention::Attention(Params& p, const std::string& prefix, const BlockConfig& c, Init& init)
    : heads(c.heads), kv_heads(c.kv_head_count()), head_dim(c.head_size()), rope(c.rope), causal(c.causal),
      window(c.window),
      scale(c.attn_scale > 0 ? c.attn_scale : 1.0 / std::sqrt(double(c.head_size()))), softcap(c.attn_softcap) {
  const std::string what = "attention: ";
  if (!(softcap >= 0) || !std::isfinite(softcap)) {
    throw UsageError(what + "the scores' soft cap must be 0 (none) or positive, got " + std::to_string(softcap));
  }
  if (window < 0 || (window > 0 && !causal)) {
    throw UsageError(what + "a sliding window needs causal attention and a positive size, got " +
                     std::to_string(window));
  }
  if (c.heads <= 0 || (c.head_dim <= 0 && c.dim % c.heads != 0)) {
    throw UsageError(what + "width " + std::to_string(c.dim) + " is not divisible by " + std::to_string(c.heads) +
                     " heads");
  }
  if (kv_heads <= 0 || heads % kv_heads != 0) {
    throw UsageError(what + std::to_string(heads) + " query heads are not a multiple of " + std::to_string(kv_heads) +
                     " key/value heads");
  }
  if (rope.dims == 0) rope.dims = head_dim;
  if (rope.theta < 0 || (rope.on() && (rope.dims % 2 != 0 || rope.dims < 0 || rope.dims > head_dim)) ||
      !(rope.scale > 0)) {
    throw UsageError(what + "rotary positions need a base > 0, a positive scale and an even number of rotated "
                     "dimensions up to the head size " + std::to_string(head_dim) + ", got " +
                     std::to_string(rope.dims));
  }
  const int64_t inner = heads * head_dim;
  if (!c.qkv.empty()) {
    qkv = Linear(p, join(prefix, c.qkv), c.dim, inner + 2 * kv_heads * head_dim, c.qkv_bias, init, c.init_std,
                 c.layout);
  } else {
    q = Linear(p, join(prefix, c.q), c.dim, inner, c.qkv_bias, init, c.init_std, c.layout);
    k = Linear(p, join(prefix, c.k), c.dim, kv_heads * head_dim, c.qkv_bias, init, c.init_std, c.layout);
    v = Linear(p, join(prefix, c.v), c.dim, kv_heads * head_dim, c.qkv_bias, init, c.init_std, c.layout);
  }
  proj = Linear(p, join(prefix, c.proj), inner, c.dim, c.bias, init, c.resid_std, c.layout);
  const NormKind head_norm = c.norm == NormKind::layer ? NormKind::rms : c.norm;
  if (!c.q_norm.empty()) q_norm = Norm(p, join(prefix, c.q_norm), head_dim, c.norm_eps, init, head_norm);
  if (!c.k_norm.empty()) k_norm = Norm(p, join(prefix, c.k_norm), head_dim, c.norm_eps, init, head_norm);
}

// x [N, T, D] -> [N, T, heads, hd] (a reshape, no copy) of projection i (q,
// k, v; kv_heads heads for k and v). A fused projection is read a part of
// the weight at a time: the same maths as slicing the fused output, but the
// backward adds into the small weight instead of zero-filling and summing
// three activation-sized gradients.
Tensor Attention::project(int64_t i, const Tensor& x, bool train) const {
  const int64_t h = i == 0 ? heads : kv_heads;
  const int64_t begin = i == 0 ? 0 : (heads + (i - 1) * kv_heads) * head_dim;
  const Linear& l = i == 0 ? q : i == 1 ? k : v;
  const Tensor t = reshape(qkv.weight.defined() ? qkv.outputs(begin, begin + h * head_dim)(x, train) : l(x, train),
                           {x.dim(0), x.dim(1), h, head_dim});
  const Norm& norm = i == 0 ? q_norm : k_norm;
  return i < 2 && norm.weight.defined() ? norm(t) : t;
}

std::vector<Linear*> Attention::linears() {
  if (qkv.weight.defined()) return {&qkv, &proj};
  return {&q, &k, &v, &proj};
}

std::vector<Linear*> Mlp::linears() {
  if (gate_up.weight.defined()) return {&gate_up, &fc2};
  if (gate.weight.defined()) return {&gate, &fc1, &fc2};
  return {&fc1, &fc2};
}

// A fused gate_up is read half of the weight at a time (as Attention::project).
Tensor Mlp::operator()(const Tensor& x, bool train) const {
  const int64_t F = gate_up.weight.defined() ? gate_up.out_features() / 2 : 0;
  const Linear& g = F > 0 ? gate_up.outputs(0, F) : gate;
  const Linear& up = F > 0 ? gate_up.outputs(F, 2 * F) : fc1;
  if (!g.weight.defined()) return fc2(apply_gelu(gelu, up(x, train)), train);
  const Tensor a = g(x, train);
  return fc2((gate_gelu ? apply_gelu(gelu, a) : silu(a)) * up(x, train), train);
}

std::vector<Linear*> TransformerBlock::linears() {
  std::vector<Linear*> out = attn.linears();
  for (Linear* l : mlp.linears()) out.push_back(l);
  return out;
}

Tensor Rotary::operator()(const Tensor& t, const Tensor& positions, int64_t length) const {
  return on() ? rope(t, positions, theta, RopeMode::neox, factors_for(length), dims, scale) : t;
}

Tensor Rotary::operator()(const Tensor& t, int64_t offset, int64_t length) const {
  return on() ? rope(t, offset, theta, RopeMode::neox, factors_for(length), dims, scale) : t;
}

// Rotary positions on t [N, T, h, hd] from position 0, through a heads-first view.
Tensor Attention::rotary(const Tensor& t, int64_t length) const {
  if (!rope.on()) return t;
  const std::vector<int64_t> swap{0, 2, 1, 3};
  return permute(rope(permute(t, swap), int64_t{0}, length), swap);
}

// Each key/value head of t [N, T, kv_heads, hd] repeated for its group of
// query heads: [N, T, heads, hd].
Tensor Attention::per_query_head(const Tensor& t) const {
  if (kv_heads == heads) return t;
  const int64_t N = t.dim(0), T = t.dim(1), g = heads / kv_heads;
  return reshape(expand(reshape(t, {N, T, kv_heads, 1, head_dim}), {N, T, kv_heads, g, head_dim}),
                 {N, T, heads, head_dim});
}

// With queries, only the first `queries` tokens ask (q and the output
// [N, queries, D] are theirs); every token is a key and a value. Causal,
// long, segmented or soft-capped attention runs fused (whole key blocks
// skipped, no T x T probabilities kept); shorter bidirectional attention keeps its
// probabilities for the backward instead of recomputing the scores, from
// attention_probs past 64 tokens and composed below (docs/performance.md).
Tensor Attention::operator()(const Tensor& x, int64_t queries, KvCache* record, bool train,
                             const Tensor& segments) const {
  const int64_t N = x.dim(0), T = x.dim(1), inner = heads * head_dim;
  if (queries < 0 || queries > T) {
    throw UsageError("attention: queries must be in [0, " + std::to_string(T) + "] (0: every token), got " +
                     std::to_string(queries));
  }
  const int64_t Tq = queries > 0 ? queries : T;
  if (causal && Tq != T) throw UsageError("attention: causal attention takes every token as a query");
  const int64_t length = record && record->positions > 0 ? record->positions : T;
  const Tensor q = rotary(project(0, Tq == T ? x : slice(x, 1, 0, Tq), train), length);
  Tensor k = rotary(project(1, x, train), length), v = project(2, x, train);
  if (record) {
    record->new_keys = k;
    record->new_values = v;
  }
  auto heads_first = [](const Tensor& t) { return permute(t, {0, 2, 1, 3}); };
  // The fused op reads a group's key/value head in place.
  if (causal || T > 256 || segments.defined() || softcap > 0) {
    return proj(reshape(attention(q, k, v, causal, scale, segments, window, softcap), {N, Tq, inner}), train);
  }
  k = per_query_head(k);
  v = per_query_head(v);
  // Composed on heads-first views of the token-major projections; the
  // values' product writes its output token-major (matmul_heads), and the
  // backward products write dq, dk and dv so too: no head copies either way.
  Tensor p = T > 64 ? attention_probs(q, k, false, scale)
                    : softmax(matmul(heads_first(q), transpose(heads_first(k))), scale);
  return proj(reshape(matmul_heads(p, heads_first(v)), {N, Tq, inner}), train);
}

// Gemma 2: softmax(cap tanh(scale s / cap) + mask), as Gemma2Attention computes it.
Tensor Attention::capped_probs(const Tensor& scores, const Tensor& mask) const {
  const Tensor capped = nabla::scale(tanh(nabla::scale(scores, scale / softcap)), softcap);
  return softmax(capped, 1.0, mask);
}

// The cache's mask with the positions before a sliding window closed too:
// cached position j stays open where j > position - window (the new token,
// last, always sees itself).
Tensor Attention::window_mask(const KvCache& cache, int64_t Tm) const {
  if (!cache.position.defined()) throw ShapeError("attention: a sliding window needs the new token's position");
  std::vector<float> ends(static_cast<size_t>(Tm));  // j + window: past the position while j is in the window
  for (int64_t j = 0; j < Tm; ++j) ends[size_t(j)] = float(j + window);
  const Tensor in_window = step(Tensor::from_vector<float>({Tm}, ends) - cast(cache.position, DType::f32));
  const Tensor closed = where(in_window, Tensor::scalar(0.0, DType::f32),
                              Tensor::scalar(-std::numeric_limits<double>::infinity(), DType::f32));
  return cache.mask + concat({closed, Tensor::zeros(DType::f32, {1})}, 0);
}

// Scores against the Tmax cached keys and the new key side by side, one
// softmax under the cache's mask, then the probabilities' two parts
// against the cached values and the new value.
// Query heads in groups per key/value head, q as [N, kv_heads, g, hd]: the
// cached keys and values are read once per group, never repeated.
Tensor Attention::decode(const Tensor& x, KvCache& cache) const {
  const int64_t N = x.dim(0), hd = head_dim, g = heads / kv_heads;
  if (x.rank() != 3 || x.dim(1) != 1) throw ShapeError("attention: decode takes one token per row, got " + to_string(x));
  const Shape cache_shape = {N, kv_heads, cache.keys.defined() ? cache.keys.dim(2) : 0, hd};
  if (!cache.keys.defined() || cache.keys.shape() != cache_shape || !cache.values.defined() ||
      cache.values.shape() != cache_shape) {
    throw ShapeError("attention: the key/value cache must be two [N, kv heads, Tmax, hd] = " + to_string(cache_shape) +
                     " tensors");
  }
  if (rope.on() && (!cache.position.defined() || cache.position.dtype() != DType::i32 ||
                         cache.position.shape() != Shape{1})) {
    throw ShapeError("attention: rotary positions need the new token's position, an i32 [1] in the cache");
  }
  const int64_t Tm = cache_shape[2];
  auto heads_first = [](const Tensor& t) { return permute(t, {0, 2, 1, 3}); };
  auto at_position = [&](const Tensor& t) { return rope(t, cache.position, Tm); };
  const Tensor q_heads = at_position(heads_first(project(0, x)));  // [N, heads, 1, hd]
  const Tensor q = g == 1 ? q_heads : reshape(q_heads, {N, kv_heads, g, hd});
  const Tensor k = at_position(heads_first(project(1, x))), v = heads_first(project(2, x));
  cache.new_keys = k;  // [N, kv_heads, 1, hd]
  cache.new_values = v;
  Tensor scores = concat({matmul(q, transpose(cache.keys)), sum(q * k, {-1}, true)}, -1);  // [N, kvh, g, Tm + 1]
  const Tensor mask = window > 0 ? window_mask(cache, Tm) : cache.mask;
  Tensor p = softcap > 0 ? capped_probs(scores, mask) : softmax(scores, scale, mask);
  Tensor o = matmul(slice(p, -1, 0, Tm), cache.values) + slice(p, -1, Tm, Tm + 1) * v;  // [N, kvh, g, hd]
  return proj(reshape(o, {N, 1, heads * hd}));
}

DecodeStep::DecodeStep(int64_t max_tokens)
    : token(Tensor::zeros(DType::i32, {1})),
      position(Tensor::zeros(DType::i32, {1})),
      mask(Tensor::full(DType::f32, {1, max_tokens + 1}, -std::numeric_limits<double>::infinity())) {
  mask.data_as<float>()[max_tokens] = 0;  // the new token always sees itself
}

Tensor DecodeStep::through(const std::vector<TransformerBlock>& blocks, Tensor x, int64_t kv_heads, int64_t head_dim) {
  const int64_t Tm = mask.dim(1) - 1;
  for (const TransformerBlock& b : blocks) {
    KvCache cache{.keys = Tensor::zeros(DType::f32, {1, kv_heads, Tm, head_dim}),
                  .values = Tensor::zeros(DType::f32, {1, kv_heads, Tm, head_dim}),
                  .mask = mask,
                  .position = position};
    x = b.decode(x, cache);
    k_cache.push_back(cache.keys);
    v_cache.push_back(cache.values);
    k_new.push_back(cache.new_keys);
    v_new.push_back(cache.new_values);
  }
  return x;
}

std::vector<Tensor> DecodeStep::outputs() const {
  std::vector<Tensor> out{logits};
  for (size_t l = 0; l < k_new.size(); ++l) {
    out.push_back(k_new[l]);
    out.push_back(v_new[l]);
  }
  return out;
}

Tensor DecodeStep::prompt_through(const std::vector<TransformerBlock>& blocks, Tensor x, Prompt& p) {
  for (const TransformerBlock& b : blocks) {
    KvCache record{.positions = p.positions};
    x = b.prompt(x, record);
    p.keys.push_back(record.new_keys);
    p.values.push_back(record.new_values);
  }
  return x;
}

std::vector<Tensor> DecodeStep::Prompt::outputs() const {
  std::vector<Tensor> out{logits};
  for (size_t l = 0; l < keys.size(); ++l) {
    out.push_back(keys[l]);
    out.push_back(values[l]);
  }
  return out;
}

void DecodeStep::remember_prompt(const Executor& ex, const Prompt& p) {
  if (p.keys.size() != k_cache.size()) {
    throw UsageError("decode step: the prompt's pass has " + std::to_string(p.keys.size()) + " blocks, the step " +
                     std::to_string(k_cache.size()));
  }
  for (size_t l = 0; l < k_cache.size(); ++l) {
    for (auto [fresh, cache] : {std::pair{p.keys[l], k_cache[l]}, std::pair{p.values[l], v_cache[l]}}) {
      const int64_t heads = cache.dim(1), Tm = cache.dim(2), hd = cache.dim(3), P = fresh.dim(1);
      if (fresh.shape() != Shape{1, P, heads, hd} || P > Tm) {
        throw UsageError("decode step: the prompt's keys and values " + to_string(fresh.shape()) +
                         " do not fit the cache " + to_string(cache.shape()));
      }
      const std::vector<float> kv = ex.read<float>(fresh);  // [P, heads, hd]
      float* c = cache.data_as<float>();
      for (int64_t t = 0; t < P; ++t)
        for (int64_t h = 0; h < heads; ++h) std::copy_n(kv.data() + (t * heads + h) * hd, hd, c + (h * Tm + t) * hd);
    }
  }
  const int64_t P = p.tokens.dim(1);
  std::fill_n(mask.data_as<float>(), P, 0.0f);
}

void DecodeStep::remember(const Executor& ex, int64_t position) {
  for (size_t l = 0; l < k_new.size(); ++l) {
    for (auto [fresh, cache] : {std::pair{k_new[l], k_cache[l]}, std::pair{v_new[l], v_cache[l]}}) {
      const int64_t heads = cache.dim(1), Tm = cache.dim(2), hd = cache.dim(3);
      if (position < 0 || position >= Tm) {
        throw UsageError("decode step: position " + std::to_string(position) + " is outside the cache of " +
                         std::to_string(Tm));
      }
      const std::vector<float> kv = ex.read<float>(fresh);
      float* c = cache.data_as<float>();
      for (int64_t h = 0; h < heads; ++h) std::copy_n(kv.data() + h * hd, hd, c + (h * Tm + position) * hd);
    }
  }
  mask.data_as<float>()[position] = 0;  // later positions may attend to this one
}

Mlp::Mlp(Params& p, const std::string& prefix, const BlockConfig& c, Init& init) : gelu(c.gelu), gate_gelu(c.gate_gelu) {
  if (!c.gate_up.empty()) {
    gate_up = Linear(p, join(prefix, c.gate_up), c.dim, 2 * c.mlp_hidden, c.bias, init, c.init_std, c.layout);
  } else {
    if (!c.gate.empty()) gate = Linear(p, join(prefix, c.gate), c.dim, c.mlp_hidden, c.bias, init, c.init_std, c.layout);
    fc1 = Linear(p, join(prefix, c.fc1), c.dim, c.mlp_hidden, c.bias, init, c.init_std, c.layout);
  }
  fc2 = Linear(p, join(prefix, c.fc2), c.mlp_hidden, c.dim, c.bias, init, c.resid_std, c.layout);
}

TransformerBlock::TransformerBlock(Params& p, const std::string& prefix, const BlockConfig& c, Init& init) {
  norm1 = Norm(p, join(prefix, c.norm1), c.dim, c.norm_eps, init, c.norm);
  attn = Attention(p, prefix, c, init);
  norm2 = Norm(p, join(prefix, c.norm2), c.dim, c.norm_eps, init, c.norm);
  mlp = Mlp(p, prefix, c, init);
  if (!c.post_norm1.empty()) post_norm1 = Norm(p, join(prefix, c.post_norm1), c.dim, c.norm_eps, init, c.norm);
  if (!c.post_norm2.empty()) post_norm2 = Norm(p, join(prefix, c.post_norm2), c.dim, c.norm_eps, init, c.norm);
  drop = Dropout{c.dropout, c.dropout_seed};
}

Tensor TransformerBlock::residuals(const Tensor& x, const Tensor& a, bool train, int64_t salt) const {
  const auto post = [](const Norm& n, const Tensor& t) { return n.weight.defined() ? n(t) : t; };
  Tensor h = x + drop(post(post_norm1, a), train, salt);
  return h + drop(post(post_norm2, mlp(norm2(h), train)), train, salt + 1);
}

Tensor TransformerBlock::operator()(const Tensor& x, bool train, int64_t salt, int64_t keep,
                                    const Tensor& segments) const {
  const auto block = [&] {
    const Tensor a = attn(norm1(x), keep, nullptr, train, segments);  // checks keep
    return residuals(keep > 0 && keep < x.dim(1) ? slice(x, 1, 0, keep) : x, a, train, salt);
  };
  return checkpointed ? recompute(block) : block();
}

Tensor chunked_cross_entropy(const Tensor& h, const Tensor& targets, const std::function<Tensor(const Tensor&)>& logits,
                             int64_t chunk_rows, int64_t ignore_index) {
  if (h.rank() < 1 || targets.shape() != Shape(h.shape().begin(), h.shape().end() - 1)) {
    throw ShapeError("chunked_cross_entropy: h [..., D] and targets [...] must agree, got " + to_string(h) + " and " +
                     to_string(targets));
  }
  if (chunk_rows < 1) throw UsageError("chunked_cross_entropy: chunk_rows must be at least 1");
  // Each chunk's mean, weighted by its counted rows, over all counted rows.
  const int64_t D = h.dim(-1), rows = h.numel() / std::max<int64_t>(D, 1);
  const Tensor flat = reshape(h, {rows, D}), labels = reshape(targets, {rows});
  Tensor weighted, counted;
  for (int64_t r = 0; r < rows; r += chunk_rows) {
    const int64_t e = std::min(rows, r + chunk_rows);
    const Tensor l = slice(labels, 0, r, e);
    const Tensor n = scalar_like(double(e - r), h) - sum(eq(cast(l, h.dtype()), scalar_like(double(ignore_index), h)));
    const Tensor ce = recompute([&] { return cross_entropy(logits(slice(flat, 0, r, e)), l, ignore_index); });
    weighted = weighted.defined() ? weighted + ce * n : ce * n;
    counted = counted.defined() ? counted + n : n;
  }
  return weighted / clamp(counted, 1.0, std::numeric_limits<double>::infinity());
}

Tensor TransformerBlock::decode(const Tensor& x, KvCache& cache) const {
  return residuals(x, attn.decode(norm1(x), cache), /*train=*/false, 0);
}

Tensor TransformerBlock::prompt(const Tensor& x, KvCache& record) const {
  return residuals(x, attn(norm1(x), 0, &record), /*train=*/false, 0);
}

PatchEmbed::PatchEmbed(Params& p, const std::string& prefix, int64_t in_chans, int64_t dim, int64_t patch_,
                       Init& init)
    : patch(patch_) {
  weight = p.add(prefix + ".weight", init.trunc_normal({dim, in_chans, patch, patch}, 0.02));
  bias = p.add(prefix + ".bias", init.zeros({dim}));
}

// conv [N, D, H/P, W/P] -> [N, D, T] -> tokens [N, T, D] (a transposed view).
Tensor PatchEmbed::operator()(const Tensor& images) const {
  Tensor y = conv_2d(images, weight, bias, patch);
  return transpose(reshape(y, {y.dim(0), y.dim(1), y.dim(2) * y.dim(3)}));
}

}  // namespace nabla::nn
