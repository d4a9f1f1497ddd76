// The Llama family, Hugging Face layout.
//
// Dimensions:
//   B  batch            T  tokens per row
//   V  vocab_size       D  hidden_size      L  num_hidden_layers
//   H  query heads      Hkv key/value heads (H a multiple)   hd  head_dim
//   F  intermediate_size
//
// Parameters (Hugging Face names; nn.Linear weights are [out, in]):
//   model.embed_tokens.weight                    [V, D]
//   model.layers.i.input_layernorm.weight        [D]
//   model.layers.i.self_attn.q_proj.weight       [H hd, D]     (.bias [H hd] with attention_bias)
//   model.layers.i.self_attn.k_proj.weight       [Hkv hd, D]   (.bias [Hkv hd])
//   model.layers.i.self_attn.v_proj.weight       [Hkv hd, D]   (.bias [Hkv hd])
//   model.layers.i.self_attn.qkv_proj.weight     [(H + 2 Hkv) hd, D] (Phi-3: q, k, v in one)
//   model.layers.i.self_attn.o_proj.weight       [D, H hd]
//   model.layers.i.self_attn.{q,k}_norm.weight   [hd]          (Qwen3, Gemma 3: each head RMS-normed)
//   model.layers.i.post_attention_layernorm.weight [D]         (Gemma 3: of attention's output)
//   model.layers.i.pre_feedforward_layernorm.weight [D]        (Gemma 3: the MLP's input)
//   model.layers.i.post_feedforward_layernorm.weight [D]       (Gemma 3: of the MLP's output)
//   model.layers.i.mlp.gate_proj.weight          [F, D]
//   model.layers.i.mlp.up_proj.weight            [F, D]
//   model.layers.i.mlp.gate_up_proj.weight       [2 F, D]     (Phi-3: gate, then up)
//   model.layers.i.mlp.down_proj.weight          [D, F]
//   model.norm.weight                            [D]
//   lm_head.weight                               [V, D]        (absent when tied)
#include "nabla/models/llama.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <nlohmann/json.hpp>

#include "nabla/checkpoint.h"
#include "nabla/config.h"
#include "nabla/error.h"
#include "nabla/graph.h"

namespace nabla::models {

namespace {

// Each model_type read, and the class Hugging Face's config.json names for it.
const char* hf_class(const std::string& model_type) {
  static const std::pair<const char*, const char*> classes[] = {{"llama", "LlamaForCausalLM"},
                                                                {"mistral", "MistralForCausalLM"},
                                                                {"qwen2", "Qwen2ForCausalLM"},
                                                                {"qwen3", "Qwen3ForCausalLM"},
                                                                {"smollm3", "SmolLM3ForCausalLM"},
                                                                {"gemma2", "Gemma2ForCausalLM"},
                                                                {"gemma3_text", "Gemma3ForCausalLM"},
                                                                {"phi3", "Phi3ForCausalLM"}};
  for (const auto& [type, name] : classes) {
    if (model_type == type) return name;
  }
  return nullptr;
}

}  // namespace

void LlamaConfig::validate() const {
  auto fail = [](const std::string& m) { throw UsageError("llama config: " + m); };
  if (!hf_class(model_type)) {
    fail("model_type must be \"llama\", \"mistral\", \"qwen2\", \"qwen3\", \"smollm3\", \"gemma2\", \"gemma3_text\" or "
         "\"phi3\", got \"" + model_type + "\"");
  }
  if (phi3() && attention_bias) fail("phi3 has no q/k/v biases");
  if (!(partial_rotary_factor > 0 && partial_rotary_factor <= 1) || (partial_rotary_factor != 1 && !phi3())) {
    fail("partial_rotary_factor must be in (0, 1], and 1 but for model_type \"phi3\"");
  }
  if (sliding_window < 0 || (sliding_window > 0 && model_type == "llama")) {
    fail("sliding_window must be 0 (none) or, for a model_type other than \"llama\", positive");
  }
  if (sliding_window > 0 && windows_by_layer() && layer_types.empty()) {
    fail("a sliding_window needs layer_types saying which layers slide");
  }
  if (!layer_types.empty() || gemma()) {
    if (!windows_by_layer()) fail("layer_types is read for model_types qwen2, qwen3, smollm3, gemma2 and gemma3_text");
    if (layer_types.size() != size_t(num_hidden_layers)) {
      fail("layer_types must name each of the " + std::to_string(num_hidden_layers) + " layers, got " +
           std::to_string(layer_types.size()));
    }
    for (const std::string& t : layer_types) {
      if (t != "sliding_attention" && t != "full_attention") {
        fail("layer_types holds \"" + t + "\", expected \"sliding_attention\" or \"full_attention\"");
      }
      if (t == "sliding_attention" && sliding_window <= 0) fail("sliding_attention layers need a sliding_window");
    }
  }
  if (gemma()) {
    if (attention_bias) fail(model_type + " has no q/k/v biases");
    if (!(query_pre_attn_scalar >= 0) || !std::isfinite(query_pre_attn_scalar)) {
      fail("query_pre_attn_scalar must be positive");
    }
    if (!(rope_local_base_freq > 0) || !std::isfinite(rope_local_base_freq)) {
      fail("rope_local_base_freq must be positive");
    }
  }
  for (double cap : {attn_logit_softcapping, final_logit_softcapping}) {
    if (!(cap >= 0) || !std::isfinite(cap) || (cap > 0 && model_type != "gemma2")) {
      fail("the soft caps must be 0 (none) or, for model_type \"gemma2\", positive");
    }
  }
  if (model_type == "smollm3") {
    if (no_rope_layers.size() != size_t(num_hidden_layers)) {
      fail("no_rope_layers must hold a 1 (rotary) or 0 (none) for each of the " + std::to_string(num_hidden_layers) +
           " layers, got " + std::to_string(no_rope_layers.size()));
    }
    for (int64_t r : no_rope_layers) {
      if (r != 0 && r != 1) fail("no_rope_layers holds " + std::to_string(r) + ", expected 1 (rotary) or 0 (none)");
    }
  } else if (!no_rope_layers.empty()) {
    fail("no_rope_layers is read for model_type \"smollm3\" only");
  }
  if (vocab_size <= 0 || hidden_size <= 0 || intermediate_size <= 0 || num_hidden_layers < 0 ||
      num_attention_heads <= 0 || num_key_value_heads < 0 || head_dim < 0 || max_position_embeddings <= 0) {
    fail("sizes must be positive");
  }
  // Token ids and positions are i32; the bound also keeps sizes from overflowing.
  constexpr int64_t kMaxSize = std::numeric_limits<int32_t>::max();
  if (vocab_size > kMaxSize || max_position_embeddings > kMaxSize || num_hidden_layers > kMaxSize ||
      hidden_size > kMaxSize / 4 || intermediate_size > kMaxSize || num_attention_heads * head_size() > kMaxSize) {
    fail("sizes must be at most 2^31 - 1");
  }
  if (head_dim == 0 && hidden_size % num_attention_heads != 0) {
    fail("hidden_size " + std::to_string(hidden_size) + " is not divisible by num_attention_heads " +
         std::to_string(num_attention_heads) + " (give head_dim)");
  }
  if (num_attention_heads % kv_heads() != 0) {
    fail("num_attention_heads " + std::to_string(num_attention_heads) + " is not a multiple of num_key_value_heads " +
         std::to_string(kv_heads()));
  }
  if (rotary_dims() % 2 != 0 || rotary_dims() <= 0) {
    fail("the rotated part of each head must be even and positive, got " + std::to_string(rotary_dims()) + " of " +
         std::to_string(head_size()));
  }
  if (!(rms_norm_eps >= 0 && rms_norm_eps < 1)) fail("rms_norm_eps must be in [0, 1)");
  if (!(rope_theta > 0) || !std::isfinite(rope_theta)) fail("rope_theta must be positive");
  if (!(initializer_range > 0 && initializer_range < 1)) fail("initializer_range must be in (0, 1)");
  if (tokenizer != "byte" && tokenizer != "gpt2" && !tokenizer.ends_with(".json") && !tokenizer.ends_with(".gguf")) {
    fail("tokenizer must be \"byte\", \"gpt2\" or the path of a tokenizer.json or .gguf");
  }
  const RopeScaling& s = rope_scaling;
  if (phi3() && !s.type.empty() && s.type != "longrope") fail("phi3's rope_scaling must be longrope or none");
  if (s.type == "longrope") {
    if (!phi3()) fail("rope_scaling longrope is read for model_type \"phi3\"");
    for (const auto* list : {&s.short_factor, &s.long_factor}) {
      if (list->size() != size_t(rotary_dims() / 2)) {
        fail("longrope's short_factor and long_factor need rotary_dims / 2 = " + std::to_string(rotary_dims() / 2) +
             " factors each, got " + std::to_string(list->size()));
      }
      for (double f : *list) {
        if (!(f > 0) || !std::isfinite(f)) fail("longrope's factors must be positive");
      }
    }
    if (s.original_max_position_embeddings <= 0 || !(s.factor > 0) || !std::isfinite(s.factor) ||
        !(s.attention_factor >= 0) || !std::isfinite(s.attention_factor)) {
      fail("longrope needs original_max_position_embeddings > 0, a positive factor and attention_factor >= 0");
    }
  } else if (!s.type.empty()) {
    if (s.type != "linear" && s.type != "llama3") {
      fail("rope_scaling type \"" + s.type + "\" is not supported (linear, llama3, longrope)");
    }
    if (!(s.factor > 0) || !std::isfinite(s.factor)) fail("rope_scaling factor must be positive");
    if (s.type == "llama3" && !(s.low_freq_factor > 0 && s.high_freq_factor > s.low_freq_factor &&
                                std::isfinite(s.high_freq_factor) && s.original_max_position_embeddings > 0)) {
      fail("rope_scaling llama3 needs 0 < low_freq_factor < high_freq_factor and original_max_position_embeddings > 0");
    }
  }
}

std::vector<double> LlamaConfig::rope_freq_factors() const {
  const RopeScaling& s = rope_scaling;
  if (s.type.empty()) return {};
  if (s.type == "longrope") return s.short_factor;
  const int64_t hd = rotary_dims();
  std::vector<double> f(size_t(hd / 2), s.factor);
  if (s.type == "linear") return f;
  // transformers' _compute_llama3_parameters: wavelengths above
  // original / low_freq_factor are divided by factor, those below
  // original / high_freq_factor kept, and the ones between blended.
  const double old = double(s.original_max_position_embeddings);
  const double low_wavelen = old / s.low_freq_factor, high_wavelen = old / s.high_freq_factor;
  for (int64_t i = 0; i < hd / 2; ++i) {
    const double inv_freq = std::pow(rope_theta, -2.0 * double(i) / double(hd));
    const double wavelen = 2 * M_PI / inv_freq;
    if (wavelen < high_wavelen) {
      f[size_t(i)] = 1;
    } else if (wavelen <= low_wavelen) {
      const double smooth = (old / wavelen - s.low_freq_factor) / (s.high_freq_factor - s.low_freq_factor);
      f[size_t(i)] = 1 / ((1 - smooth) / s.factor + smooth);
    }
  }
  return f;
}

// transformers' _compute_longrope_parameters.
double LlamaConfig::rope_attention_factor() const {
  const RopeScaling& s = rope_scaling;
  if (s.type != "longrope") return 1;
  if (s.attention_factor > 0) return s.attention_factor;
  if (s.factor <= 1) return 1;
  return std::sqrt(1 + std::log(s.factor) / std::log(double(s.original_max_position_embeddings)));
}

namespace {

ConfigFields fields_of(LlamaConfig& c) {
  ConfigFields f("llama config");
  f.optional("preset", c.preset)
      .optional("model_type", c.model_type)
      .required("vocab_size", c.vocab_size)
      .required("hidden_size", c.hidden_size)
      .required("intermediate_size", c.intermediate_size)
      .required("num_hidden_layers", c.num_hidden_layers)
      .required("num_attention_heads", c.num_attention_heads)
      .optional("num_key_value_heads", c.num_key_value_heads, 0)
      .optional("head_dim", c.head_dim, 0)
      .optional("max_position_embeddings", c.max_position_embeddings)
      .optional("rms_norm_eps", c.rms_norm_eps)
      .optional("rope_theta", c.rope_theta)
      .optional("initializer_range", c.initializer_range)
      .optional("tie_word_embeddings", c.tie_word_embeddings)
      .optional("attention_bias", c.attention_bias)
      .optional("tokenizer", c.tokenizer);
  return f;
}

ConfigFields rope_scaling_fields(LlamaConfig::RopeScaling& s, const std::string& what = "rope_scaling") {
  ConfigFields f("llama config: " + what);
  if (s.type == "longrope") {  // the factor and original length are config.json's where it has them (read_phi3)
    f.optional("factor", s.factor)
        .optional("attention_factor", s.attention_factor)
        .optional("original_max_position_embeddings", s.original_max_position_embeddings, 1);
    return f;
  }
  f.required("factor", s.factor);
  if (s.type == "llama3") {
    f.required("low_freq_factor", s.low_freq_factor)
        .required("high_freq_factor", s.high_freq_factor)
        .required("original_max_position_embeddings", s.original_max_position_embeddings, 1);
  }
  return f;
}

// The number of layers config.json gives, for the per-layer lists read
// before the sizes are checked (bounded, so that a huge count reads nothing).
int64_t listed_layers(const nlohmann::json& j) {
  const auto layers = j.find("num_hidden_layers");
  return layers != j.end() && layers->is_number_integer() ? std::clamp<int64_t>(layers->get<int64_t>(), 0, 1 << 20) : 0;
}

// config.json's layer_types into c.layer_types (false when it has none).
bool read_layer_types(const nlohmann::json& j, LlamaConfig& c) {
  const auto types = j.find("layer_types");
  if (types == j.end() || types->is_null()) return false;
  if (!types->is_array()) throw IoError("llama config: layer_types must be a list, got " + types->dump());
  for (const auto& t : *types) {
    if (!t.is_string()) throw IoError("llama config: layer_types must hold strings, got " + t.dump());
    c.layer_types.push_back(t.get<std::string>());
  }
  return true;
}

// Which layers of a Qwen2, Qwen3 or SmolLM3 with use_sliding_window slide:
// layer_types, else Qwen's from max_window_layers on (default 28), SmolLM3's
// NoPE layers (read before), as transformers derives them.
void read_window_layers(const nlohmann::json& j, const std::string& type, LlamaConfig& c) {
  if (read_layer_types(j, c)) return;
  const int64_t layers = listed_layers(j);
  int64_t first = 28;
  if (auto it = j.find("max_window_layers"); it != j.end() && !it->is_null()) {
    if (!it->is_number_integer() || it->get<int64_t>() < 0) {
      throw IoError("llama config: max_window_layers must be a non-negative integer, got " + it->dump());
    }
    first = it->get<int64_t>();
  }
  for (int64_t i = 0; i < layers; ++i) {
    const bool slides = type == "smollm3" ? size_t(i) < c.no_rope_layers.size() && c.no_rope_layers[size_t(i)] == 0
                                          : i >= first;
    c.layer_types.push_back(slides ? "sliding_attention" : "full_attention");
  }
}

// Gemma 2's and 3's keys beyond Llama's (j: the config.json of model_type
// `type`). What nabla does not compute (Gemma 3's soft-capping,
// bidirectional attention, another activation) is refused.
void read_gemma(const nlohmann::json& j, const std::string& type, LlamaConfig& c) {
  const auto fail = [&](const std::string& m) { throw IoError("llama config: " + type + "'s " + m); };
  if (auto it = j.find("hidden_activation"); it != j.end() && !it->is_null() && *it != "gelu_pytorch_tanh") {
    fail("hidden_activation " + it->dump() + " is not supported (\"gelu_pytorch_tanh\")");
  }
  if (auto it = j.find("use_bidirectional_attention"); it != j.end() && *it != false) {
    fail("use_bidirectional_attention is not supported");
  }
  const bool gemma2 = type == "gemma2";
  if (gemma2) {  // Gemma2Config's defaults; Gemma 3 has no caps
    c.attn_logit_softcapping = 50;
    c.final_logit_softcapping = 30;
    c.query_pre_attn_scalar = 256;
  }
  for (auto [key, value] : {std::pair{"rope_local_base_freq", &c.rope_local_base_freq},
                            std::pair{"query_pre_attn_scalar", &c.query_pre_attn_scalar},
                            std::pair{"attn_logit_softcapping", &c.attn_logit_softcapping},
                            std::pair{"final_logit_softcapping", &c.final_logit_softcapping}}) {
    const auto it = j.find(key);
    if (it == j.end()) continue;
    const bool cap = std::string_view(key).ends_with("softcapping");
    if (cap && it->is_null()) {
      *value = 0;
    } else if (cap && !gemma2) {
      fail(std::string(key) + " is not supported (null)");
    } else if (!it->is_number()) {
      fail(std::string(key) + " must be a number, got " + it->dump());
    } else {
      *value = it->get<double>();
    }
  }
  if (read_layer_types(j, c)) return;
  const int64_t layers = listed_layers(j);
  if (gemma2) {  // Gemma2Config: the even layers slide
    for (int64_t i = 0; i < layers; ++i) c.layer_types.push_back(i % 2 == 0 ? "sliding_attention" : "full_attention");
    return;
  }
  // Without layer_types (transformers before 4.53): every pattern-th layer is full.
  int64_t pattern = 6;
  if (auto it = j.find("sliding_window_pattern"); it != j.end()) {
    if (!it->is_number_integer() || it->get<int64_t>() < 1) fail("sliding_window_pattern must be a positive integer");
    pattern = it->get<int64_t>();
  }
  for (int64_t i = 0; i < layers; ++i) {
    c.layer_types.push_back((i + 1) % pattern == 0 ? "full_attention" : "sliding_attention");
  }
}

// SmolLM3's NoPE layers: no_rope_layers (1: the layer rotates, 0: it has no
// positions; at least one entry a layer), or every no_rope_layer_interval-th
// layer (default 4) NoPE.
void read_smollm3(const nlohmann::json& j, LlamaConfig& c) {
  const auto fail = [](const std::string& m) { throw IoError("llama config: smollm3's " + m); };
  const int64_t layers = listed_layers(j);
  if (auto list = j.find("no_rope_layers"); list != j.end() && !list->is_null()) {
    if (!list->is_array()) fail("no_rope_layers must be a list, got " + list->dump());
    for (const auto& r : *list) {
      if (!r.is_number_integer()) fail("no_rope_layers must hold integers, got " + r.dump());
      if (int64_t(c.no_rope_layers.size()) < layers) c.no_rope_layers.push_back(r.get<int64_t>());
    }
    return;
  }
  int64_t interval = 4;
  if (auto it = j.find("no_rope_layer_interval"); it != j.end() && !it->is_null()) {
    if (!it->is_number_integer() || it->get<int64_t>() < 1) fail("no_rope_layer_interval must be a positive integer");
    interval = it->get<int64_t>();
  }
  for (int64_t i = 0; i < layers; ++i) c.no_rope_layers.push_back((i + 1) % interval != 0 ? 1 : 0);
}

// Phi-3's keys beyond Llama's, read after the rotations: the rotated share
// of each head, and longrope's original length (config.json's
// original_max_position_embeddings, then factor = max_position_embeddings /
// original, as transformers computes it; else the scaling object's, else
// max_position_embeddings with the object's factor). Dropout, which nabla's
// model does not apply, is refused.
void read_phi3(const nlohmann::json& j, LlamaConfig& c) {
  const auto fail = [](const std::string& m) { throw IoError("llama config: phi3's " + m); };
  for (const char* key : {"resid_pdrop", "embd_pdrop", "attention_dropout"}) {
    if (auto it = j.find(key); it != j.end() && !it->is_null() && (!it->is_number() || it->get<double>() != 0)) {
      fail(std::string(key) + " " + it->dump() + " is not supported (0: nabla's model applies no dropout)");
    }
  }
  if (auto it = j.find("partial_rotary_factor"); it != j.end() && !it->is_null()) {
    if (!it->is_number()) fail("partial_rotary_factor must be a number, got " + it->dump());
    c.partial_rotary_factor = it->get<double>();
  }
  LlamaConfig::RopeScaling& s = c.rope_scaling;
  if (s.type != "longrope") return;
  if (auto it = j.find("original_max_position_embeddings"); it != j.end() && !it->is_null()) {
    if (!it->is_number_integer() || it->get<int64_t>() <= 0) {
      fail("original_max_position_embeddings must be a positive integer, got " + it->dump());
    }
    s.original_max_position_embeddings = it->get<int64_t>();
  }
  if (s.original_max_position_embeddings > 0) {
    s.factor = double(c.max_position_embeddings) / double(s.original_max_position_embeddings);
  } else {
    s.original_max_position_embeddings = c.max_position_embeddings;
  }
}

// A rotary-scaling object: {"rope_type" (or "type"), the type's keys};
// "default" is none. `what` names it in errors.
LlamaConfig::RopeScaling read_scaling(const nlohmann::json& s, const std::string& what, bool type_required) {
  const nlohmann::json none = type_required ? nlohmann::json() : nlohmann::json("default");
  const auto type = s.is_object() ? s.value("rope_type", s.value("type", none)) : nlohmann::json();
  if (!type.is_string()) {
    throw IoError("llama config: " + what + " must be null or an object with a string \"rope_type\", got " + s.dump());
  }
  LlamaConfig::RopeScaling r;
  if (type == "default") return r;
  r.type = type == "su" ? "longrope" : type.get<std::string>();  // Phi3Config's older name
  if (r.type != "linear" && r.type != "llama3" && r.type != "longrope") {
    throw IoError("llama config: " + what + " type \"" + r.type + "\" is not supported (linear, llama3, longrope)");
  }
  if (r.type == "longrope") {
    r.original_max_position_embeddings = 0;  // unless given here or in config.json
    for (auto [key, list] : {std::pair{"short_factor", &r.short_factor}, std::pair{"long_factor", &r.long_factor}}) {
      const auto it = s.find(key);
      if (it == s.end() || !it->is_array()) throw IoError("llama config: " + what + " longrope needs a list " + key);
      for (const auto& f : *it) {
        if (!f.is_number()) throw IoError("llama config: " + what + "'s " + key + " must hold numbers, got " + f.dump());
        list->push_back(f.get<double>());
      }
    }
  }
  rope_scaling_fields(r, what).from_json(s.dump());
  return r;
}

// The rotations' base and scaling. transformers 4 writes rope_theta and
// rope_scaling; 5 writes rope_parameters: {"rope_type", "rope_theta", the
// scaling's keys}, or one such object per layer type where those rotate
// differently (Gemma 3's full and sliding layers). As transformers reads
// them: a non-null rope_scaling before rope_parameters, a rope_theta inside
// the object before the top-level one.
void read_rope(const nlohmann::json& j, LlamaConfig& c) {
  std::string key = "rope_scaling";
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) it = j.find(key = "rope_parameters");
  if (it == j.end() || it->is_null()) return;
  const nlohmann::json& rope = *it;
  if (!rope.is_object()) {
    throw IoError("llama config: " + key + " must be null or an object, got " + rope.dump());
  }
  auto read = [&](const nlohmann::json& r, const std::string& what, double& theta, LlamaConfig::RopeScaling* scaling) {
    if (auto t = r.find("rope_theta"); r.is_object() && t != r.end() && !t->is_null()) {
      if (!t->is_number() || !(t->get<double>() > 0)) {
        throw IoError("llama config: " + what + "'s rope_theta must be a positive number, got " + t->dump());
      }
      theta = t->get<double>();
    }
    const LlamaConfig::RopeScaling s = read_scaling(r, what, key == "rope_scaling");
    if (scaling) {
      *scaling = s;
    } else if (!s.type.empty()) {
      throw IoError("llama config: " + what + " type \"" + s.type + "\" is not supported (nabla scales the full-attention "
                    "layers' rotations only)");
    }
  };
  bool by_layer_type = !rope.empty();
  for (const auto& [k, r] : rope.items()) by_layer_type &= k == "full_attention" || k == "sliding_attention";
  if (!by_layer_type) return read(rope, key, c.rope_theta, &c.rope_scaling);
  for (const auto& [layer_type, r] : rope.items()) {
    if (layer_type == "full_attention") {
      read(r, key + ".full_attention", c.rope_theta, &c.rope_scaling);
    } else if (c.gemma3()) {
      read(r, key + ".sliding_attention", c.rope_local_base_freq, nullptr);
    } else {
      throw IoError("llama config: " + key + " gives sliding_attention layers their own rotations; model_type \"" +
                    c.model_type + "\" has none");
    }
  }
}

}  // namespace

std::string LlamaConfig::to_json() const {
  LlamaConfig c = *this;
  if (c.num_key_value_heads == 0) c.num_key_value_heads = kv_heads();
  if (c.head_dim == 0) c.head_dim = head_size();
  std::string fields = fields_of(c).to_json();  // {"preset": ..., ...}
  std::string scaling = "null";
  const RopeScaling& rs = c.rope_scaling;
  if (rs.type == "longrope") {
    // Phi3Config's three keys (transformers before 4.48 takes no others);
    // the original length beside them at the top level.
    nlohmann::json o = {{"type", "longrope"}, {"short_factor", rs.short_factor}, {"long_factor", rs.long_factor}};
    if (rs.attention_factor > 0) o["attention_factor"] = rs.attention_factor;
    scaling = o.dump();
  } else if (!c.rope_scaling.type.empty()) {
    // Hugging Face's key for the type is "rope_type" ("type" in older configs).
    scaling = "{\"rope_type\":\"" + c.rope_scaling.type + "\"," + rope_scaling_fields(c.rope_scaling).to_json().substr(1);
  }
  const char* arch = hf_class(model_type) ? hf_class(model_type) : "LlamaForCausalLM";  // validate() refuses others
  std::string extra;
  if (model_type == "mistral" || phi3() || gemma()) {
    extra += ",\"sliding_window\":" + (sliding_window > 0 ? std::to_string(sliding_window) : "null");
  }
  if (phi3()) {
    extra += ",\"partial_rotary_factor\":" + nlohmann::json(partial_rotary_factor).dump();
    if (rs.type == "longrope") {
      extra += ",\"original_max_position_embeddings\":" + std::to_string(rs.original_max_position_embeddings);
    }
  }
  if (gemma()) {
    const auto cap = [](double v) { return v > 0 ? nlohmann::json(v).dump() : std::string("null"); };
    extra += ",\"layer_types\":" + nlohmann::json(layer_types).dump() +
             ",\"query_pre_attn_scalar\":" + nlohmann::json(query_pre_attn_scalar > 0 ? query_pre_attn_scalar
                                                                                      : double(head_size())).dump() +
             ",\"final_logit_softcapping\":" + cap(final_logit_softcapping) +
             ",\"attn_logit_softcapping\":" + cap(attn_logit_softcapping);
  }
  if (gemma3()) extra += ",\"rope_local_base_freq\":" + nlohmann::json(rope_local_base_freq).dump();
  if (model_type == "smollm3") extra += ",\"no_rope_layers\":" + nlohmann::json(no_rope_layers).dump();
  if (windows_by_layer() && !gemma()) {
    extra += ",\"use_sliding_window\":" + std::string(sliding_window > 0 ? "true" : "false") +
             ",\"sliding_window\":" + (sliding_window > 0 ? std::to_string(sliding_window) : "null");
    if (sliding_window > 0) {
      extra += ",\"layer_types\":" + nlohmann::json(layer_types).dump();
      // transformers before 4.53 reads no layer_types: Qwen's layers from max_window_layers on slide.
      const auto first = std::find(layer_types.begin(), layer_types.end(), "sliding_attention");
      if (model_type != "smollm3" && std::find(first, layer_types.end(), "full_attention") == layer_types.end()) {
        extra += ",\"max_window_layers\":" + std::to_string(first - layer_types.begin());
      }
    }
  }
  const std::string activation = gemma() ? "\"hidden_activation\":\"gelu_pytorch_tanh\"" : "\"hidden_act\":\"silu\"";
  return "{\"architecture\":\"llama\",\"architectures\":[\"" + std::string(arch) + "\"]," + activation + "," +
         fields.substr(1, fields.size() - 2) + ",\"rope_scaling\":" + scaling + extra + "}";
}

namespace {

// A multimodal Gemma 3's text model: text_config holds the keys that differ
// from Gemma3TextConfig's defaults (transformers writes the difference).
LlamaConfig gemma3_text_config(const std::string& text) {
  const nlohmann::json outer = nlohmann::json::parse(text);
  const auto given = outer.find("text_config");
  if (given == outer.end() || !given->is_object()) {
    throw IoError("llama config: model_type \"gemma3\" (a multimodal Gemma 3) needs a \"text_config\" object");
  }
  nlohmann::json j = {{"vocab_size", 262208},
                      {"hidden_size", 2304},
                      {"intermediate_size", 9216},
                      {"num_hidden_layers", 26},
                      {"num_attention_heads", 8},
                      {"num_key_value_heads", 4},
                      {"head_dim", 256},
                      {"max_position_embeddings", 131072},
                      {"rms_norm_eps", 1e-6},
                      {"rope_theta", 1000000.0},
                      {"rope_local_base_freq", 10000.0},
                      {"query_pre_attn_scalar", 256},
                      {"sliding_window", 4096},
                      {"initializer_range", 0.02},
                      {"tie_word_embeddings", true}};
  for (const auto& [key, value] : given->items()) j[key] = value;
  j["model_type"] = "gemma3_text";
  LlamaConfig c = LlamaConfig::from_json(j.dump());
  c.multimodal = true;
  return c;
}

}  // namespace

LlamaConfig LlamaConfig::from_json(const std::string& text) {
  LlamaConfig c;
  std::string type, architecture, hidden_act = "silu";
  bool mlp_bias = false, use_sliding_window = false;
  ConfigFields probe("llama config");
  probe.optional("model_type", type)
      .optional("architecture", architecture)
      .optional("hidden_act", hidden_act)
      .optional("mlp_bias", mlp_bias)
      .optional("use_sliding_window", use_sliding_window);
  probe.from_json(text);  // IoError for text that is no JSON object
  if (type == "gemma3") return gemma3_text_config(text);
  // Qwen2's config has no attention_bias: its q, k and v always have biases.
  if (type == "qwen2") c.attention_bias = true;
  const bool gemma = type == "gemma3_text" || type == "gemma2";
  if (gemma || type == "smollm3") c.tie_word_embeddings = true;  // their configs' defaults
  // nabla's checkpoints name their architecture; Hugging Face's config.json does not.
  if (!architecture.empty() && architecture != "llama") {
    throw IoError("llama config: architecture is \"" + architecture + "\", expected \"llama\"");
  }
  // Variants this model does not compute are refused, not approximated.
  // (Gemma names its activation hidden_activation and ignores hidden_act.)
  if (!gemma && hidden_act != "silu") {
    throw IoError("llama config: hidden_act \"" + hidden_act + "\" is not supported (silu)");
  }
  if (mlp_bias) throw IoError("llama config: mlp_bias is not supported");
  const bool qwen_windows = type == "qwen2" || type == "qwen3" || type == "smollm3";
  if (use_sliding_window && !qwen_windows) {
    throw IoError("llama config: use_sliding_window is read for model_types qwen2, qwen3 and smollm3");
  }
  const nlohmann::json j = nlohmann::json::parse(text);
  // Qwen's and SmolLM3's configs carry a sliding_window that use_sliding_window leaves off.
  if (auto window = j.find("sliding_window"); (type == "mistral" || type == "phi3" || gemma || use_sliding_window) &&
                                              window != j.end() && !window->is_null()) {
    if (!window->is_number_integer() || window->get<int64_t>() <= 0) {
      throw IoError("llama config: sliding_window must be null or a positive integer, got " + window->dump());
    }
    c.sliding_window = window->get<int64_t>();
  }
  if (type == "smollm3") read_smollm3(j, c);
  if (gemma) {
    read_gemma(j, type, c);
  } else if (qwen_windows && c.sliding_window > 0) {
    read_window_layers(j, type, c);
  } else if (auto types = j.find("layer_types"); !qwen_windows && types != j.end() && types->is_array()) {
    // transformers 5 lists layer types; without a window Qwen's sliding ones compute as full ones.
    for (const auto& t : *types) {
      if (t != "full_attention") throw IoError("llama config: layer_types holds " + t.dump() + ", expected \"full_attention\"");
    }
  }
  fields_of(c).from_json(text);
  read_rope(j, c);
  if (type == "phi3") {
    read_phi3(j, c);
  } else if (auto it = j.find("partial_rotary_factor"); it != j.end() && !it->is_null() && *it != 1) {
    throw IoError("llama config: partial_rotary_factor " + it->dump() + " is read for model_type \"phi3\" only");
  }
  c.validate();
  return c;
}

int64_t LlamaConfig::parameter_count() const {
  // Mirrors Llama::Llama (a test compares it with the built model), in double
  // so that no config can overflow it.
  const double D = double(hidden_size), F = double(intermediate_size), q = double(num_attention_heads * head_size()),
               kv = double(kv_heads() * head_size()), b = attention_bias ? 1 : 0;
  const double qk_norms = qk_norm() ? 2 * double(head_size()) : 0, norms = gemma() ? 4 : 2;
  const double block = norms * D + D * q + 2 * D * kv + b * (q + 2 * kv) + q * D + 3 * D * F + qk_norms;
  const double head = tie_word_embeddings ? 0 : double(vocab_size) * D;
  const double n = double(vocab_size) * D + double(num_hidden_layers) * block + D + head;
  return n >= 9.2e18 ? INT64_MAX : int64_t(n);
}

LlamaConfig llama_config_from_checkpoint(const Checkpoint& ckpt) { return config_from_checkpoint<LlamaConfig>(ckpt); }

LlamaConfig llama_preset(const std::string& name) {
  LlamaConfig c;
  c.preset = name;
  if (name == "smollm2-135m") {
    // HuggingFaceTB/SmolLM2-135M's config.json.
    c.vocab_size = 49152;
    c.hidden_size = 576;
    c.intermediate_size = 1536;
    c.num_hidden_layers = 30;
    c.num_attention_heads = 9;
    c.num_key_value_heads = 3;
    c.max_position_embeddings = 8192;
    c.rms_norm_eps = 1e-5;
    c.rope_theta = 100000.0;
    c.initializer_range = 0.041666666666666664;
    c.tie_word_embeddings = true;
    c.tokenizer = "gpt2";  // until tokenizer.json: the shape, not SmolLM2's vocabulary
    return c;
  }
  if (name == "llama-tiny-byte") {
    // Bytes as tokens, 4 layers of width 256 with 8 query and 2 key/value
    // heads: SmolLM2's proportions, small enough to learn words from the
    // fortunes in minutes on two cores.
    c.vocab_size = 256;
    c.hidden_size = 256;
    c.intermediate_size = 768;
    c.num_hidden_layers = 4;
    c.num_attention_heads = 8;
    c.num_key_value_heads = 2;
    c.max_position_embeddings = 256;
    c.rms_norm_eps = 1e-5;
    c.rope_theta = 10000.0;
    c.tie_word_embeddings = true;
    c.tokenizer = "byte";
    return c;
  }
  throw UsageError("llama: unknown preset '" + name + "' (presets: smollm2-135m, llama-tiny-byte)");
}

Llama::Llama(const LlamaConfig& config, uint64_t seed) : config_(config) {
  config_.validate();
  nn::Init init(seed, nn::Init::Weights::normal);
  build(init);
}

Llama::Llama(const Checkpoint& ckpt) : config_(llama_config_from_checkpoint(ckpt)) {
  params_.take_from(weight_source(ckpt));
  nn::Init init = nn::Init::placeholders();
  build(init);
  params_.take_from({});  // holds none of the file's other tensors
}

void Llama::build(nn::Init& init) {
  const LlamaConfig& c = config_;
  const int64_t D = c.hidden_size;
  embed_ = nn::Embedding(params_, "model.embed_tokens.weight", c.vocab_size, D, init, c.initializer_range);
  nn::BlockConfig block;
  block.dim = D;
  const nn::NormKind norm = c.gemma() ? nn::NormKind::rms_unit_offset : nn::NormKind::rms;
  block.heads = c.num_attention_heads;
  block.kv_heads = c.kv_heads();
  block.head_dim = c.head_size();
  block.mlp_hidden = c.intermediate_size;
  block.norm = norm;
  block.norm_eps = c.rms_norm_eps;
  block.rope.theta = c.rope_theta;
  block.rope.dims = c.rotary_dims();
  block.rope.freq_factors = c.rope_freq_factors();
  block.rope.scale = c.rope_attention_factor();
  if (c.rope_scaling.type == "longrope") {
    block.rope.long_factors = c.rope_scaling.long_factor;
    block.rope.long_after = c.rope_scaling.original_max_position_embeddings;
  }
  block.causal = true;
  block.window = c.sliding_window;
  block.qkv_bias = c.attention_bias;
  block.bias = false;
  block.init_std = block.resid_std = c.initializer_range;  // Hugging Face's _init_weights
  block.norm1 = "input_layernorm";
  block.qkv = "";
  block.q = "self_attn.q_proj";
  block.k = "self_attn.k_proj";
  block.v = "self_attn.v_proj";
  block.proj = "self_attn.o_proj";
  if (c.qk_norm()) {
    block.q_norm = "self_attn.q_norm";
    block.k_norm = "self_attn.k_norm";
  }
  block.norm2 = "post_attention_layernorm";
  block.gate = "mlp.gate_proj";
  block.fc1 = "mlp.up_proj";
  block.fc2 = "mlp.down_proj";
  if (c.phi3()) {  // q, k, v in one projection, gate and up in one
    block.qkv = "self_attn.qkv_proj";
    block.gate = "";
    block.gate_up = "mlp.gate_up_proj";
  }
  if (c.gemma()) {
    block.post_norm1 = "post_attention_layernorm";
    block.norm2 = "pre_feedforward_layernorm";
    block.post_norm2 = "post_feedforward_layernorm";
    block.gate_gelu = true;
    block.gelu = nn::Gelu::tanh;
    block.attn_scale = 1 / std::sqrt(c.query_pre_attn_scalar > 0 ? c.query_pre_attn_scalar : double(c.head_size()));
    block.attn_softcap = c.attn_logit_softcapping;
  }
  for (int64_t i = 0; i < c.num_hidden_layers; ++i) {
    nn::BlockConfig layer = block;
    layer.window = c.layer_window(i);
    if (c.gemma3() && layer.window > 0) {  // Gemma 3's sliding layers: their own base, unscaled
      layer.rope.theta = c.rope_local_base_freq;
      layer.rope.freq_factors = {};
    }
    if (!c.layer_rotates(i)) layer.rope = nn::Rotary{};  // SmolLM3's NoPE layers
    layers_.emplace_back(params_, "model.layers." + std::to_string(i), layer, init);
  }
  norm_ = nn::Norm(params_, "model.norm", D, c.rms_norm_eps, init, norm);
  lm_head_ = c.tie_word_embeddings ? embed_
                                   : nn::Embedding(params_, "lm_head.weight", c.vocab_size, D, init, c.initializer_range);
}

const std::vector<std::string>& llama_lora_modules(const LlamaConfig& c) {
  static const std::vector<std::string> names{"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj",
                                              "down_proj"};
  static const std::vector<std::string> phi3{"qkv_proj", "o_proj", "gate_up_proj", "down_proj"};
  return c.phi3() ? phi3 : names;
}

void Llama::add_lora(const nn::LoraConfig& given, uint64_t seed) {
  if (lora_.r > 0) throw UsageError("llama: the model has adapters already");
  const std::vector<std::string>& known = llama_lora_modules(config_);
  nn::LoraConfig config = given;
  if (config.targets.empty()) config.targets = known;
  config.validate();
  for (const std::string& t : config.targets) {
    if (std::find(known.begin(), known.end(), t) == known.end()) {
      std::string list;
      for (const std::string& k : known) list += (list.empty() ? "" : ", ") + k;
      throw UsageError("llama: LoRA target '" + t + "' is not one of " + config_.model_type + "'s " + list);
    }
  }
  std::vector<nn::Linear*> layers;
  for (nn::TransformerBlock& b : layers_) {
    for (nn::Linear* l : b.linears()) layers.push_back(l);
  }
  if (config.dropout > 0) lora_seed_ = Tensor::zeros(DType::i32, {1}).set_name("lora_dropout_seed");
  nn::Init init(seed);
  nn::add_lora(layers, config, adapter_, init, lora_seed_);
  params_.freeze();
  lora_ = config;
}

void Llama::merge_lora() {
  for (nn::TransformerBlock& b : layers_) {
    for (nn::Linear* l : b.linears()) l->merge_adapter();
  }
  adapter_ = nn::Params();
  lora_ = nn::LoraConfig{.r = 0};
  lora_seed_ = Tensor();
}

Tensor Llama::forward(const Tensor& input_ids, bool train, const Tensor& segments) const {
  return logits(hidden(input_ids, train, segments));  // [B, T, V]
}

Tensor Llama::logits(const Tensor& h) const {
  const Tensor z = lm_head_.logits(h);
  const double cap = config_.final_logit_softcapping;
  return cap > 0 ? scale(tanh(scale(z, 1 / cap)), cap) : z;  // Gemma2ForCausalLM's final soft cap
}

Tensor Llama::embed(const Tensor& ids) const {
  const Tensor x = embed_(ids);
  // Gemma3TextScaledWordEmbedding: sqrt(hidden_size) in the weights' dtype.
  return config_.gemma() ? x * scalar_like(std::sqrt(double(config_.hidden_size)), x) : x;
}

Tensor Llama::hidden(const Tensor& input_ids, bool train, const Tensor& segments) const {
  const LlamaConfig& c = config_;
  if (input_ids.rank() != 2 || input_ids.dtype() != DType::i32) {
    throw ShapeError("llama: input_ids must be i32 [B, T], got " + to_string(input_ids));
  }
  if (input_ids.dim(1) > c.max_position_embeddings) {
    throw ShapeError("llama: " + std::to_string(input_ids.dim(1)) + " tokens exceed max_position_embeddings " +
                     std::to_string(c.max_position_embeddings));
  }
  Tensor x = embed(input_ids);  // [B, T, D]
  for (size_t i = 0; i < layers_.size(); ++i) x = layers_[i](x, train, int64_t(2 * i), 0, segments);
  return norm_(x);
}

Tensor Llama::head_loss(const Tensor& h, const Tensor& targets) const {
  if (!checkpointing_) return cross_entropy(logits(h), targets, -100);
  // Chunks of chunk_logits_ logits (by default 8M, 32 MiB: SmolLM2's
  // 49,152-token vocabulary in 170-row chunks).
  return nn::chunked_cross_entropy(h, targets, [&](const Tensor& rows) { return logits(rows); },
                                   std::max<int64_t>(1, chunk_logits_ / config_.vocab_size));
}

Tensor Llama::loss(const Tensor& input_ids, const Tensor& labels, bool train, const Tensor& segments) const {
  if (labels.dtype() != DType::i32 || labels.shape() != input_ids.shape() || input_ids.rank() != 2 ||
      input_ids.dim(1) < 2) {
    throw ShapeError("llama: loss needs input_ids and labels i32 [B, T] with T >= 2, got " + to_string(input_ids) +
                     " and " + to_string(labels));
  }
  const int64_t T = input_ids.dim(1);
  return head_loss(slice(hidden(input_ids, train, segments), 1, 0, T - 1), slice(labels, 1, 1, T));
}

nn::DecodeStep Llama::decode_step(int64_t max_tokens) const {
  const LlamaConfig& c = config_;
  nn::DecodeStep s(std::min(max_tokens, c.max_position_embeddings));
  const Tensor x = s.through(layers_, reshape(embed(s.token), {1, 1, c.hidden_size}), c.kv_heads(), c.head_size());
  s.logits = reshape(logits(norm_(x)), {1, c.vocab_size});
  return s;
}

nn::DecodeStep::Prompt Llama::prompt(int64_t tokens, int64_t max_tokens) const {
  const LlamaConfig& c = config_;
  if (tokens < 1 || tokens > c.max_position_embeddings) {
    throw UsageError("llama: a prompt of " + std::to_string(tokens) + " tokens (1 to max_position_embeddings " +
                     std::to_string(c.max_position_embeddings) + ")");
  }
  nn::DecodeStep::Prompt p;
  p.positions = std::min(std::max(max_tokens, tokens), c.max_position_embeddings);  // decode_step's cache
  p.tokens = Tensor::zeros(DType::i32, {1, tokens});
  const Tensor x = nn::DecodeStep::prompt_through(layers_, embed(p.tokens), p);
  p.logits = reshape(logits(norm_(slice(x, 1, tokens - 1, tokens))), {1, c.vocab_size});
  return p;
}

Tensor Llama::next_token_loss(const Tensor& tokens, bool) const {
  if (tokens.rank() != 2 || tokens.dim(1) < 2) {
    throw ShapeError("llama: next-token loss needs tokens [B, T + 1] with T >= 1, got " + to_string(tokens));
  }
  const int64_t T = tokens.dim(1) - 1;
  return head_loss(hidden(slice(tokens, 1, 0, T), false, Tensor()), slice(tokens, 1, 1, T + 1));
}

}  // namespace nabla::models
