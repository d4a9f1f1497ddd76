// QLoRA: a GGUF base read keeping its weight matrices in their storage type
// (F16, BF16, Q8_0, Q4_0, Q4_K, Q6_K) computes what the same file read as
// f32 computes, adapters and their gradients included, in a fraction of the
// memory; the model takes the file's tensors without copying them.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

#include "nabla/models/gguf.h"
#include "nabla/models/llama.h"
#include "nabla/nabla.hpp"
#include "nabla/trainer.h"

#include "temp_dir.h"

using namespace nabla;
using models::Llama;
using models::LlamaConfig;

namespace {

// Rows of whole Q4_K / Q6_K blocks (256) in every projection.
LlamaConfig block_config() {
  LlamaConfig c;
  c.preset = "qlora-test";
  c.vocab_size = 256;  // the byte tokenizer's, which the GGUF carries
  c.hidden_size = 256;
  c.intermediate_size = 512;
  c.num_hidden_layers = 2;
  c.num_attention_heads = 4;
  c.num_key_value_heads = 2;
  c.max_position_embeddings = 32;
  return c;
}

// A random model of `c` written as GGUF with its matrices in `type`.
std::string write_base(const testing_support::TempDir& dir, const LlamaConfig& c, GgmlType type) {
  const std::string ckpt = dir.file("base.safetensors"), gguf = dir.file(std::string(ggml_type_name(type)) + ".gguf");
  Llama m(c, 5);
  save_checkpoint(ckpt, c.to_json(), m.params());
  models::gguf_from_checkpoint(load_checkpoint(ckpt), {.matrix_type = type}).write(gguf);
  return gguf;
}

// The same model as a Hugging Face folder with every tensor in BF16 (as
// SmolLM2's are published): config.json and a hand-written safetensors file.
std::string write_bf16_folder(const testing_support::TempDir& dir, const LlamaConfig& c) {
  const std::string folder = dir.file("bf16");
  std::filesystem::create_directories(folder);
  Llama m(c, 5);
  nlohmann::json header;
  std::string data;
  for (const auto& [name, t] : m.params().list()) {
    const std::vector<float> v = t.to_vector<float>();
    const size_t begin = data.size();
    for (float x : v) {
      uint32_t bits;
      std::memcpy(&bits, &x, 4);
      const uint16_t bf = uint16_t((bits + 0x7fff + ((bits >> 16) & 1)) >> 16);  // round to nearest even
      data.append(reinterpret_cast<const char*>(&bf), 2);
    }
    header[name] = {{"dtype", "BF16"}, {"shape", t.shape()}, {"data_offsets", {begin, data.size()}}};
  }
  const std::string text = header.dump();
  const uint64_t n = text.size();
  std::ofstream out(folder + "/model.safetensors", std::ios::binary);
  out.write(reinterpret_cast<const char*>(&n), 8);
  out << text << data;
  std::ofstream(folder + "/config.json") << c.to_json();
  return folder;
}

bool is_matrix(const std::string& name) {
  return name.ends_with("_proj.weight") || name == "model.embed_tokens.weight" || name == "lm_head.weight";
}

Tensor tokens(int64_t B, int64_t T, int64_t vocab) {
  std::vector<int32_t> ids(size_t(B * T));
  for (size_t i = 0; i < ids.size(); ++i) ids[i] = int32_t((7 * i + i * i) % vocab);
  return Tensor::from_vector<int32_t>({B, T}, ids);
}

// Adapters on all seven projections with random B (zero at the start), so
// that the adapters' gradients depend on the base's every product.
void adapt(Llama& m) {
  m.add_lora({.r = 4, .alpha = 8}, 2);
  nn::Init init(9);
  for (auto& [name, t] : m.adapter().list()) {
    if (name.ends_with("lora_B.weight")) {
      Tensor v = init.normal(t.shape(), 0.1);
      Tensor(t).copy_from(v.data(), size_t(v.numel()) * 4);
    }
  }
}

// The loss and each adapter gradient of one step.
std::vector<std::vector<float>> loss_and_gradients(Llama& m) {
  const Tensor ids = tokens(2, 16, m.config().vocab_size);
  const Tensor loss = m.loss(ids, ids);
  std::vector<Tensor> wrt;
  for (const auto& [_, t] : m.adapter().list()) wrt.push_back(t);
  std::vector<Tensor> outputs{loss};
  for (const Tensor& g : grad(loss, wrt)) outputs.push_back(g);
  Executor ex(Graph(outputs), {.threads = 2});
  ex.run();
  std::vector<std::vector<float>> got;
  for (const Tensor& t : outputs) got.push_back(ex.read<float>(t));
  return got;
}

// The loss within 1e-5 and each adapter gradient within 1e-5 of its
// largest element (the PyTorch oracles' tolerance): the products differ in
// blocking, not in the weights' values.
void expect_same_step(Llama& dense, Llama& stored) {
  const auto want = loss_and_gradients(dense), got = loss_and_gradients(stored);
  ASSERT_EQ(want.size(), got.size());
  EXPECT_NEAR(got[0][0], want[0][0], 1e-5 * std::abs(want[0][0]));
  for (size_t i = 1; i < want.size(); ++i) {
    float scale = 0, diff = 0;
    for (size_t k = 0; k < want[i].size(); ++k) {
      scale = std::max(scale, std::abs(want[i][k]));
      diff = std::max(diff, std::abs(got[i][k] - want[i][k]));
    }
    EXPECT_GT(scale, 0) << dense.adapter().list()[i - 1].first;
    EXPECT_LE(diff, 1e-5 * scale) << dense.adapter().list()[i - 1].first;
  }
}

std::vector<uint8_t> bytes(const Tensor& t) {
  const auto* p = static_cast<const uint8_t*>(t.data());
  return {p, p + t.numel() * int64_t(dtype_size(t.dtype()))};
}

int64_t bytes_of(const nn::Params& p) {
  int64_t n = 0;
  for (const auto& [_, t] : p.list()) n += t.numel() * int64_t(dtype_size(t.dtype()));
  return n;
}

}  // namespace

TEST(QLora, StoredBaseComputesAsTheSameFileReadAsF32) {
  testing_support::TempDir dir;
  const LlamaConfig c = block_config();
  for (GgmlType type : {GgmlType::q8_0, GgmlType::q4_0, GgmlType::q4_k, GgmlType::q6_k, GgmlType::bf16,
                        GgmlType::f16}) {
    SCOPED_TRACE(ggml_type_name(type));
    const std::string gguf = write_base(dir, c, type);
    Llama dense(models::checkpoint_from_gguf(gguf));
    const Checkpoint kept = models::checkpoint_from_gguf(gguf, /*keep_stored=*/true);
    Llama stored(kept);
    // Every weight matrix stored (projections, embedding, untied head),
    // nothing else; the model holds the file's tensors themselves.
    EXPECT_EQ(kept.formats.size(), size_t(7 * c.num_hidden_layers + 2));
    for (const auto& [name, t] : stored.params().list()) {
      EXPECT_EQ(t.dtype(), is_matrix(name) ? DType::u8 : DType::f32) << name;
      EXPECT_EQ(stored.params().format(name) != nullptr, is_matrix(name)) << name;
      EXPECT_EQ(t.data(), kept.file.find(name)->data()) << name;
    }
    const int64_t dense_bytes = bytes_of(dense.params()), stored_bytes = bytes_of(stored.params());
    EXPECT_LT(stored_bytes, dense_bytes * (type == GgmlType::f16 || type == GgmlType::bf16 ? 0.6 : 0.4));

    adapt(dense);
    adapt(stored);
    expect_same_step(dense, stored);
  }
}

TEST(QLora, TiedStoredEmbeddingIsTheHead) {
  testing_support::TempDir dir;
  LlamaConfig c = block_config();
  c.tie_word_embeddings = true;
  const std::string gguf = write_base(dir, c, GgmlType::q4_0);
  Llama dense(models::checkpoint_from_gguf(gguf));
  Llama stored(models::checkpoint_from_gguf(gguf, /*keep_stored=*/true));
  ASSERT_NE(stored.params().format("model.embed_tokens.weight"), nullptr);
  adapt(dense);
  adapt(stored);
  expect_same_step(dense, stored);
}

TEST(QLora, Bf16HuggingFaceFolderStaysBf16) {
  testing_support::TempDir dir;
  const LlamaConfig c = block_config();
  const std::string folder = write_bf16_folder(dir, c);
  Llama dense(models::load_any_checkpoint(folder));
  const Checkpoint kept = models::load_any_checkpoint(folder, /*keep_stored=*/true);
  Llama stored(kept);
  EXPECT_EQ(kept.formats.size(), size_t(7 * c.num_hidden_layers + 2));
  for (const auto& [name, t] : stored.params().list()) {
    const nn::StoredFormat* f = stored.params().format(name);
    EXPECT_EQ(f != nullptr, is_matrix(name)) << name;
    if (f) {
      EXPECT_EQ(f->type, GgmlType::bf16) << name;
    }
  }
  EXPECT_LT(bytes_of(stored.params()), bytes_of(dense.params()) * 0.6);
  adapt(dense);
  adapt(stored);
  expect_same_step(dense, stored);
}

TEST(QLora, TrainingLeavesTheStoredBaseByteForByte) {
  testing_support::TempDir dir;
  const LlamaConfig c = block_config();
  Llama m(models::checkpoint_from_gguf(write_base(dir, c, GgmlType::q4_k), true));
  adapt(m);
  const std::string w = "model.layers.1.mlp.down_proj.weight";
  const std::vector<uint8_t> before = bytes(m.params().get(w));
  const Tensor ids = tokens(2, 16, c.vocab_size);
  TrainStep step(m.loss(ids, ids), m.adapter(), {}, optim::AdamWConfig{}, ExecOptions{.threads = 2});
  step.run();
  const float first = step.loss();
  for (int i = 0; i < 5; ++i) {
    step.update(1e-2, 1.0);
    step.run();
  }
  EXPECT_LT(step.loss(), first);
  EXPECT_EQ(bytes(m.params().get(w)), before);
}

TEST(QLora, MergingIntoAStoredWeightIsRefused) {
  testing_support::TempDir dir;
  Llama m(models::checkpoint_from_gguf(write_base(dir, block_config(), GgmlType::q8_0), true));
  adapt(m);
  try {
    m.merge_lora();
    ADD_FAILURE() << "merged into a Q8_0 weight";
  } catch (const UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("keeps its weight as Q8_0"), std::string::npos) << e.what();
  }
}

TEST(QLora, AStoredTensorOfTheWrongShapeNamesTheFile) {
  testing_support::TempDir dir;
  Checkpoint kept = models::checkpoint_from_gguf(write_base(dir, block_config(), GgmlType::q8_0), true);
  kept.formats[0].second.cols = 512;  // rows of 256 elements claimed to be 512
  try {
    Llama m(kept);
    ADD_FAILURE() << "no error";
  } catch (const IoError& e) {
    EXPECT_NE(std::string(e.what()).find(kept.path + ": parameter '" + kept.formats[0].first + "'"), std::string::npos)
        << e.what();
    EXPECT_NE(std::string(e.what()).find("the model expects"), std::string::npos) << e.what();
  }
}
