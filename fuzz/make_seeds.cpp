// Writes the seed corpora of the fuzz targets with nabla's own writers, so
// the fuzzers start from valid files and mutate them into damaged ones.
// Usage: nabla_fuzz_seeds OUT_DIR; writes OUT_DIR/<target>/<seed>.
#include <zlib.h>

#include <cstdio>
#include <exception>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "nabla/models/gguf.h"
#include "nabla/models/gpt2.h"
#include "nabla/models/llama.h"
#include "nabla/models/vit.h"
#include "nabla.h"
#include "nabla/checkpoint.h"
#include "nabla/error.h"
#include "nabla/gguf.h"
#include "nabla/io.h"
#include "nabla/optim.h"
#include "nabla/tokenizer.h"

using namespace nabla;
namespace fs = std::filesystem;

namespace {

std::string out_dir;

std::string seed_path(const std::string& target, const std::string& name) {
  fs::create_directories(out_dir + "/" + target);
  return out_dir + "/" + target + "/" + name;
}

void write_bytes(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  if (!out) throw IoError(path + ": cannot write");
}

Tensor ramp(DType dtype, Shape shape) {
  Tensor t = Tensor::zeros(dtype, std::move(shape));
  for (int64_t k = 0; k < t.numel(); ++k) {
    if (dtype == DType::f32) t.data_as<float>()[k] = float(k) * 0.5f - 1;
    if (dtype == DType::f64) t.data_as<double>()[k] = double(k) * 0.25 - 1;
    if (dtype == DType::i32) t.data_as<int32_t>()[k] = int32_t(k) - 2;
  }
  return t;
}

void safetensors_seeds() {
  save_safetensors(seed_path("safetensors", "three_dtypes"),
                   {{"a", ramp(DType::f32, {2, 3})}, {"b", ramp(DType::f64, {4})}, {"c", ramp(DType::i32, {1, 2, 2})}},
                   {{"format", "pt"}, {"note", "seed"}});
  save_safetensors(seed_path("safetensors", "scalar_and_empty"),
                   {{"s", ramp(DType::f32, {})}, {"e", ramp(DType::f32, {0, 3})}});
  // F16, BF16, I64 and U8 entries, written by hand: nabla writes only its own dtypes.
  std::string header =
      R"({"h":{"dtype":"F16","shape":[2],"data_offsets":[0,4]},"b":{"dtype":"BF16","shape":[2],"data_offsets":[4,8]},)"
      R"("l":{"dtype":"I64","shape":[1],"data_offsets":[8,16]},"u":{"dtype":"U8","shape":[2],"data_offsets":[16,18]}})";
  std::string file;
  for (int i = 0; i < 8; ++i) file += char((header.size() >> (8 * i)) & 0xff);
  file += header;
  file += std::string("\x00\x3c\x00\xc0\x80\x3f\x00\x40", 8);
  file += std::string("\x05\x00\x00\x00\x00\x00\x00\x00", 8);
  file += "\x07\xff";
  write_bytes(seed_path("safetensors", "widened_dtypes"), file);
}

void gguf_seeds() {
  GgufWriter w;
  w.set("general.architecture", "gpt2");
  w.set("general.alignment", uint32_t{32});
  w.set("nabla.flag", true);
  w.set("nabla.i8", int8_t{-5});
  w.set("nabla.u16", uint16_t{7});
  w.set("nabla.i64", -(int64_t{1} << 40));
  w.set("nabla.f32", 0.5f);
  w.set("nabla.f64", 0.1);
  w.set("nabla.tags", std::vector<std::string>{"vit", "test"});
  w.set("nabla.ints", std::vector<int32_t>{1, -2, 3});
  GgufArray nested{GgufType::array, {GgufValue(std::vector<uint8_t>{1, 2}), GgufValue(std::vector<uint8_t>{3})}};
  w.set("nabla.nested", GgufValue(nested));
  w.add_tensor("f32", ramp(DType::f32, {2, 3}));
  w.add_tensor("f64", ramp(DType::f64, {3}));
  w.add_tensor("i32", ramp(DType::i32, {1, 2, 1, 2}));
  w.write(seed_path("gguf", "mixed"));
  GgufWriter empty;
  empty.set("general.name", "no tensors");
  empty.write(seed_path("gguf", "metadata_only"));
  // A SentencePiece-style vocabulary (tokenizer.ggml.model "llama") alone.
  const std::string m = "\u2581";
  GgufWriter spm;
  spm.set("tokenizer.ggml.model", "llama");
  spm.set("tokenizer.ggml.tokens", std::vector<std::string>{"<unk>", "<s>", "</s>", m, "f", "u", "z", m + "f", "fu",
                                                           "zz", m + "fu", "<0x0A>", "<0xF0>", "[pad]"});
  spm.set("tokenizer.ggml.token_type", std::vector<int32_t>{2, 3, 3, 1, 1, 1, 1, 1, 1, 1, 1, 6, 6, 5});
  spm.set("tokenizer.ggml.scores", std::vector<float>{0, 0, 0, -9, -9, -9, -9, -1, -2, -3, -4, 0, 0, 0});
  spm.set("tokenizer.ggml.bos_token_id", uint32_t{1});
  spm.set("tokenizer.ggml.eos_token_id", uint32_t{2});
  spm.set("tokenizer.ggml.unknown_token_id", uint32_t{0});
  spm.set("tokenizer.ggml.add_bos_token", true);
  spm.set("tokenizer.ggml.add_space_prefix", true);
  spm.write(seed_path("gguf", "spm_vocabulary"));
  GgufWriter quants;
  for (GgmlType t : {GgmlType::f16, GgmlType::bf16, GgmlType::q8_0, GgmlType::q4_0, GgmlType::q4_k, GgmlType::q6_k}) {
    quants.add_tensor(std::string("w.") + ggml_type_name(t), ramp(DType::f32, {1, 256}), t);
  }
  quants.write(seed_path("gguf", "block_formats"));

  // Llama-family files as `nabla export gguf` writes them, small enough to
  // mutate quickly: llama with Llama 3 rope scaling and Q4_0 matrices, qwen2
  // with biases and qwen3 with q/k head norms, in Q8_0.
  for (const char* type : {"llama", "qwen2", "qwen3"}) {
    models::LlamaConfig c = models::llama_preset("llama-tiny-byte");
    c.model_type = type;
    c.attention_bias = c.model_type == "qwen2";
    c.hidden_size = 32;
    c.intermediate_size = 64;
    c.num_hidden_layers = 1;
    c.num_attention_heads = 4;
    c.num_key_value_heads = 2;
    c.max_position_embeddings = 16;
    if (c.model_type == "llama") {
      c.rope_scaling = {.type = "llama3", .factor = 8, .low_freq_factor = 1, .high_freq_factor = 4,
                        .original_max_position_embeddings = 64};
    }
    models::Llama m(c, 1);
    const std::string ckpt = seed_path("gguf", std::string(type) + ".safetensors");
    save_checkpoint(ckpt, c.to_json(), m.params());
    models::gguf_from_checkpoint(load_checkpoint(ckpt), {.matrix_type = c.model_type == "llama" ? GgmlType::q4_0 : GgmlType::q8_0})
        .write(seed_path("gguf", type));
    fs::remove(ckpt);
  }
}

std::string idx_bytes(const std::vector<uint32_t>& dims, int64_t count) {
  std::string b = {0, 0, 8, char(dims.size())};
  for (uint32_t d : dims) b += {char(d >> 24), char(d >> 16), char(d >> 8), char(d)};
  for (int64_t i = 0; i < count; ++i) b += char(i * 37 % 256);
  return b;
}

void idx_seeds() {
  write_bytes(seed_path("idx", "images_rank3"), idx_bytes({3, 4, 4}, 48));
  write_bytes(seed_path("idx", "images_rank4"), idx_bytes({2, 3, 2, 2}, 24));
  write_bytes(seed_path("idx", "labels"), idx_bytes({5}, 5));
  const std::string gz = seed_path("idx", "images_gzip");
  const std::string plain = idx_bytes({2, 5, 5}, 50);
  gzFile f = gzopen(gz.c_str(), "wb");
  if (!f || gzwrite(f, plain.data(), unsigned(plain.size())) != int(plain.size()) || gzclose(f) != Z_OK) {
    throw IoError(gz + ": cannot write");
  }
}

void cifar10_seeds() {
  for (int records : {1, 3}) {
    std::string b;
    for (int r = 0; r < records; ++r) {
      b += char(r % 10);
      for (int i = 0; i < 3 * 32 * 32; ++i) b += char((i + r) % 251);
    }
    write_bytes(seed_path("cifar10", "records_" + std::to_string(records)), b);
  }
}

// GPT-2's byte alphabet: printable bytes stand for themselves, the others map
// to U+0100 onwards in order.
std::string byte_char(int b) {
  uint32_t next = 256, cp = 0;
  for (int c = 0; c <= b; ++c) {
    bool printable = (c >= 33 && c <= 126) || (c >= 161 && c <= 172) || c >= 174;
    cp = printable ? uint32_t(c) : next++;
  }
  if (cp < 0x80) return std::string(1, char(cp));
  return {char(0xC0 | (cp >> 6)), char(0x80 | (cp & 0x3F))};
}

void gpt2_vocab_seeds() {
  // The 256 bytes, then merges, each adding its concatenation as the next id.
  const std::vector<std::pair<std::string, std::string>> merges = {
      {"t", "h"}, {"th", "e"}, {" ", "the"}, {"a", "n"}, {"an", "d"}, {"\n", "\n"}};
  nlohmann::ordered_json enc = nlohmann::ordered_json::object();
  int id = 0;
  for (int b = 0; b < 256; ++b) enc[byte_char(b)] = id++;
  auto spell = [](const std::string& bytes) {
    std::string s;
    for (char c : bytes) s += byte_char(uint8_t(c));
    return s;
  };
  std::string bpe = "#version: 0.2\n";
  for (const auto& [a, b] : merges) {
    enc[spell(a + b)] = id++;
    bpe += spell(a) + " " + spell(b) + "\n";
  }
  enc["<|endoftext|>"] = id++;
  write_bytes(seed_path("gpt2_vocab", "small"), enc.dump() + std::string(1, '\0') + bpe);

  // tokenizer.json as nabla writes it, one per pre-tokenizer.
  const std::string text = "the cat sat on the mat; THE CAT'S 1234 mats!\n\n  \t東京 🙂 <|endoftext|>";
  for (PreTokenizer p : {PreTokenizer::gpt2, PreTokenizer::llama3, PreTokenizer::qwen2, PreTokenizer::digits}) {
    BpeTokenizer::train(text + text, 280, p)->save_json(seed_path("tokenizer_json", pre_tokenizer_name(p)));
  }
  // SentencePiece-style BPE (Llama 2's form): U+2581 pieces, <0xXX> bytes,
  // the legacy normalizer, then a Metaspace pre-tokenizer instead.
  const std::string m = "\u2581";
  nlohmann::json vocab = {{"<unk>", 0}, {"<s>", 1}, {"</s>", 2}};
  for (int b = 0; b < 256; ++b) {
    char name[8];
    std::snprintf(name, sizeof name, "<0x%02X>", b);
    vocab[name] = 3 + b;
  }
  int piece_id = 259;
  for (const std::string& piece : {m, std::string("t"), std::string("h"), std::string("e"), m + "t", std::string("he"), m + "the"}) {
    vocab[piece] = piece_id++;
  }
  nlohmann::json spm = {
      {"added_tokens",
       {{{"id", 0}, {"content", "<unk>"}, {"special", true}},
        {{"id", 1}, {"content", "<s>"}, {"special", true}},
        {{"id", 2}, {"content", "</s>"}, {"special", true}}}},
      {"normalizer",
       {{"type", "Sequence"},
        {"normalizers",
         {{{"type", "Prepend"}, {"prepend", m}}, {{"type", "Replace"}, {"pattern", {{"String", " "}}}, {"content", m}}}}}},
      {"pre_tokenizer", nullptr},
      {"model",
       {{"type", "BPE"}, {"unk_token", "<unk>"}, {"fuse_unk", true}, {"byte_fallback", true}, {"vocab", vocab},
        {"merges", {m + " t", "h e", m + "t he"}}}}};
  write_bytes(seed_path("tokenizer_json", "spm_legacy"), spm.dump());
  spm["normalizer"] = nullptr;
  spm["pre_tokenizer"] = {{"type", "Metaspace"}, {"replacement", m}, {"prepend_scheme", "first"}, {"split", true}};
  write_bytes(seed_path("tokenizer_json", "spm_metaspace"), spm.dump());
}

void checkpoint_seeds() {
  models::VitConfig vc = models::vit_preset("fmnist");
  vc.img_size = 8;
  vc.patch_size = 4;
  vc.embed_dim = 8;
  vc.depth = 1;
  vc.num_heads = 2;
  vc.num_classes = 3;
  models::Vit vit(vc, 1);
  save_checkpoint(seed_path("checkpoint", "vit_weights"), vc.to_json(), vit.params());
  std::vector<optim::Slot> slots;
  for (const auto& [name, t] : vit.params().list()) slots.push_back({name, t});
  optim::AdamW adamw(slots, {}, 1);
  TrainPosition pos{.step = 3, .epoch = 1, .batch = 2, .seed = 9};
  save_checkpoint(seed_path("checkpoint", "vit_training"), vc.to_json(), vit.params(), &adamw, &pos);

  models::Gpt2Config gc = models::gpt2_preset("gpt2-small-byte");
  gc.vocab_size = 16;
  gc.n_positions = 8;
  gc.n_layer = 1;
  gc.n_head = 2;
  gc.n_embd = 8;
  models::Gpt2 gpt2(gc, 1);
  save_checkpoint(seed_path("checkpoint", "gpt2_weights"), gc.to_json(), gpt2.params());

  models::LlamaConfig lc = models::llama_preset("llama-tiny-byte");
  lc.hidden_size = 8;
  lc.intermediate_size = 8;
  lc.num_hidden_layers = 1;
  lc.num_attention_heads = 2;
  lc.num_key_value_heads = 1;
  lc.attention_bias = true;
  models::Llama llama(lc, 1);
  save_checkpoint(seed_path("checkpoint", "llama_weights"), lc.to_json(), llama.params());
  write_bytes(seed_path("config", "smollm2_135m"), models::llama_preset("smollm2-135m").to_json());
  // What the other Llama-family readers take: SmolLM3's NoPE layers,
  // transformers 5's rope_parameters, a multimodal Gemma 3's text_config.
  lc.model_type = "smollm3";
  lc.attention_bias = false;
  lc.no_rope_layers = {0};
  write_bytes(seed_path("config", "smollm3"), lc.to_json());
  write_bytes(seed_path("config", "rope_parameters"), R"({"model_type": "llama", "vocab_size": 8, "hidden_size": 8,
    "intermediate_size": 8, "num_hidden_layers": 1, "num_attention_heads": 2, "rope_parameters": {"rope_type": "llama3",
    "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 16,
    "rope_theta": 500000.0}})");
  write_bytes(seed_path("config", "gemma3_multimodal"), R"({"model_type": "gemma3", "text_config": {"vocab_size": 8,
    "hidden_size": 8, "intermediate_size": 8, "num_hidden_layers": 2, "head_dim": 4, "sliding_window": 2,
    "rope_parameters": {"full_attention": {"rope_type": "linear", "factor": 2.0, "rope_theta": 1e6},
    "sliding_attention": {"rope_theta": 1e4}}}, "vision_config": {}})");

  // fuzz_hf_folder's index over its two shards (a.safetensors holds the first 3 tensors).
  lc = models::llama_preset("llama-tiny-byte");
  lc.vocab_size = 8;
  lc.hidden_size = 8;
  lc.intermediate_size = 8;
  lc.num_hidden_layers = 1;
  lc.num_attention_heads = 2;
  lc.num_key_value_heads = 1;
  models::Llama hf(lc, 1);
  nlohmann::json map = nlohmann::json::object();
  int i = 0;
  for (const auto& [name, t] : hf.params().list()) map[name] = i++ < 3 ? "a.safetensors" : "b.safetensors";
  write_bytes(seed_path("hf_folder", "two_shards"), nlohmann::json{{"metadata", {{"total_size", 1}}}, {"weight_map", map}}.dump());

  write_bytes(seed_path("config", "vit_fmnist"), models::vit_preset("fmnist").to_json());
  write_bytes(seed_path("config", "vit_tiny"), models::vit_preset("vit-tiny").to_json());
  write_bytes(seed_path("config", "gpt2"), models::gpt2_preset("gpt2").to_json());
  write_bytes(seed_path("config", "gpt2_small_byte"), models::gpt2_preset("gpt2-small-byte").to_json());
  write_bytes(seed_path("config", "position"), pos.to_json());
}

// The C API target's input: dtype, rank, flags, dims, rank2, dims2, data.
void c_api_seeds() {
  auto input = [](int8_t dtype, uint8_t flags, const std::vector<int64_t>& dims, const std::vector<int64_t>& dims2,
                  size_t data_bytes) {
    std::string b = {char(dtype), char(dims.size()), char(flags)};
    b.append(reinterpret_cast<const char*>(dims.data()), dims.size() * 8);
    b += char(dims2.size());
    b.append(reinterpret_cast<const char*>(dims2.data()), dims2.size() * 8);
    for (size_t i = 0; i < data_bytes; ++i) b += char(i * 13);
    return b;
  };
  write_bytes(seed_path("c_api", "f32_matrix_data"), input(NABLA_F32, 2 | 4, {2, 3}, {3, 2}, 24));
  write_bytes(seed_path("c_api", "f64_param_expand"), input(NABLA_F64, 1 | 2 | 8, {1, 4}, {3, 4}, 32));
  write_bytes(seed_path("c_api", "i32_scalar_zeros"), input(NABLA_I32, 16, {}, {2}, 0));
  write_bytes(seed_path("c_api", "f32_scatter"), input(NABLA_F32, 2 | 16, {2}, {6}, 8));
}

// The C API graph target's input: a leaf count, leaves (dtype, parameter,
// rank, dims), then op records (fuzz/fuzz_c_api_graph.cpp has the opcodes).
void c_api_graph_seeds() {
  const auto bytes = [](std::initializer_list<int> b) {
    std::string s;
    for (int v : b) s += char(v);
    return s;
  };
  // Two f32 parameters [2, 3] and [3, 4]; matmul (opcode 5), gelu (24), sum (30) over axis 1.
  write_bytes(seed_path("c_api_graph", "matmul_gelu_sum"),
              bytes({1, 0, 1, 2, 2, 3, 0, 1, 2, 3, 4, 5, 0, 1, 24, 2, 30, 3, 1, 3, 0, 0}));
  // x [2, 4, 4]; layer norm (42) without affine, then a causal softmax (43).
  write_bytes(seed_path("c_api_graph", "layer_norm_softmax"),
              bytes({0, 0, 1, 3, 2, 4, 4, 42, 0, 0, 0, 1, 0, 43, 1, 0, 16, 1, 1}));
  // x [1, 1, 4, 4] and w [2, 1, 3, 3]: conv_2d (48; stride 1, padding 1), a 2 x 2 max pool (49).
  write_bytes(seed_path("c_api_graph", "conv_pool"),
              bytes({1, 0, 1, 4, 1, 1, 4, 4, 0, 1, 4, 2, 1, 3, 3, 48, 0, 1, 0, 3, 3, 3, 3, 2, 2, 3, 3, 3, 1, 49, 2, 4,
                     4, 4, 4, 2, 2, 0, 1}));
  // Labels i32 [4] and logits f32 [4, 3]: cross-entropy (44), ignore index -1.
  write_bytes(seed_path("c_api_graph", "cross_entropy"), bytes({1, 2, 0, 1, 4, 0, 1, 2, 4, 3, 44, 1, 0, 1, 1, 0}));
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s OUT_DIR\n", argv[0]);
    return 2;
  }
  out_dir = argv[1];
  try {
    safetensors_seeds();
    gguf_seeds();
    idx_seeds();
    cifar10_seeds();
    gpt2_vocab_seeds();
    checkpoint_seeds();
    c_api_seeds();
    c_api_graph_seeds();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "nabla_fuzz_seeds: %s\n", e.what());
    return 1;
  }
  return 0;
}
