// LoRA on the Llama family: adapters that start as the identity, a frozen
// base that gets no gradient, PEFT's names, scale and folder format, and
// packed documents (segments) that compute as they would alone.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <string>

#include "nabla/models/llama.h"
#include "nabla/models/lora.h"
#include "nabla/nabla.hpp"
#include "nabla/trainer.h"

#include "temp_dir.h"

using namespace nabla;
using models::Llama;
using models::LlamaConfig;

namespace {

LlamaConfig small_config() {
  LlamaConfig c;
  c.vocab_size = 31;
  c.hidden_size = 16;
  c.intermediate_size = 24;
  c.num_hidden_layers = 2;
  c.num_attention_heads = 4;
  c.num_key_value_heads = 2;
  c.max_position_embeddings = 32;
  c.attention_bias = true;
  return c;
}

nn::LoraConfig all_targets(int64_t r = 4) {
  return {.r = r, .alpha = 8, .dropout = 0, .rslora = false};
}

Tensor tokens(int64_t B, int64_t T, int64_t vocab, int64_t seed) {
  std::vector<int32_t> ids(size_t(B * T));
  for (size_t i = 0; i < ids.size(); ++i) ids[i] = int32_t((5 * i + 3 * seed + i * i) % vocab);
  return Tensor::from_vector<int32_t>({B, T}, ids);
}

std::vector<float> run(const Tensor& t) {
  Executor ex(Graph({t}), {.threads = 1});
  ex.run();
  return ex.read<float>(t);
}

// Random values into every adapter B (zero at the start), so the adapters
// change the output.
void randomize_b(Llama& m, uint64_t seed) {
  nn::Init init(seed);
  for (auto& [name, t] : m.adapter().list()) {
    if (name.ends_with("lora_B.weight")) {
      Tensor v = init.normal(t.shape(), 0.5);
      Tensor(t).copy_from(v.data(), size_t(v.numel()) * 4);
    }
  }
}

}  // namespace

TEST(Lora, AdaptersHavePeftsNamesShapesAndStartAsTheIdentity) {
  const LlamaConfig c = small_config();
  Llama base(c, 3), adapted(c, 3);
  adapted.add_lora(all_targets(), 9);
  const auto& a = adapted.adapter();
  EXPECT_EQ(a.list().size(), 2u * 7 * 2);  // A and B, 7 projections, 2 layers
  EXPECT_EQ(a.get("base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight").shape(), (Shape{4, 16}));
  EXPECT_EQ(a.get("base_model.model.model.layers.0.self_attn.q_proj.lora_B.weight").shape(), (Shape{16, 4}));
  EXPECT_EQ(a.get("base_model.model.model.layers.1.self_attn.k_proj.lora_B.weight").shape(), (Shape{8, 4}));
  EXPECT_EQ(a.get("base_model.model.model.layers.1.mlp.down_proj.lora_A.weight").shape(), (Shape{4, 24}));
  EXPECT_EQ(a.get("base_model.model.model.layers.1.mlp.gate_proj.lora_B.weight").shape(), (Shape{24, 4}));
  // A within PEFT's kaiming bound 1/sqrt(in), not all zero; B zero.
  const std::vector<float> A = a.get("base_model.model.model.layers.0.mlp.up_proj.lora_A.weight").to_vector<float>();
  float largest = 0;
  for (float v : A) largest = std::max(largest, std::abs(v));
  EXPECT_GT(largest, 0.5f / 4);
  EXPECT_LE(largest, 1 / 4.0f);
  for (float v : a.get("base_model.model.model.layers.0.mlp.up_proj.lora_B.weight").to_vector<float>()) EXPECT_EQ(v, 0);
  // The base is frozen: no parameter left to it.
  for (const auto& [name, t] : adapted.params().list()) EXPECT_FALSE(t.is_parameter()) << name;
  // B = 0: the same logits bit for bit.
  const Tensor ids = tokens(2, 7, c.vocab_size, 1);
  EXPECT_EQ(run(adapted.forward(ids)), run(base.forward(ids)));
  randomize_b(adapted, 4);
  EXPECT_NE(run(adapted.forward(ids)), run(base.forward(ids)));
}

TEST(Lora, ScaleIsAlphaOverRankOrItsSquareRoot) {
  nn::LoraConfig c = all_targets(16);
  c.alpha = 32;
  EXPECT_DOUBLE_EQ(c.scale(), 2.0);
  c.rslora = true;
  EXPECT_DOUBLE_EQ(c.scale(), 8.0);
  // The scale multiplies the adapter's term: doubling alpha doubles the
  // change the adapters make.
  const LlamaConfig cfg = small_config();
  const Tensor ids = tokens(1, 5, cfg.vocab_size, 2);
  auto change = [&](double alpha) {
    Llama base(cfg, 1), m(cfg, 1);
    nn::LoraConfig l = all_targets();
    l.targets = {"v_proj"};
    l.alpha = alpha;
    m.add_lora(l, 5);
    randomize_b(m, 6);
    // Logits are not linear in the adapter; one layer's v projection at a
    // small scale nearly is.
    const std::vector<float> y = run(m.forward(ids)), y0 = run(base.forward(ids));
    double n = 0;
    for (size_t i = 0; i < y.size(); ++i) n += std::abs(double(y[i]) - y0[i]);
    return n;
  };
  EXPECT_NEAR(change(2e-3) / change(1e-3), 2.0, 1e-2);
}

TEST(Lora, OnlyTheAdaptersGetGradients) {
  const LlamaConfig c = small_config();
  Llama m(c, 3);
  nn::LoraConfig l = all_targets();
  l.targets = {"q_proj", "down_proj"};
  m.add_lora(l, 2);
  randomize_b(m, 8);
  const Tensor ids = tokens(2, 6, c.vocab_size, 3);
  const Tensor loss = m.loss(ids, ids);
  // The graph's parameters are the adapters alone.
  const std::vector<Tensor> found = find_parameters({loss});
  EXPECT_EQ(found.size(), m.adapter().list().size());
  for (const Tensor& t : found) EXPECT_NE(t.name().find("lora_"), std::string::npos) << t.name();
  // A training step moves the adapters and leaves every base weight as it was.
  const std::vector<float> before = m.params().get("model.layers.0.self_attn.q_proj.weight").to_vector<float>();
  const std::vector<float> a_before =
      m.adapter().get("base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight").to_vector<float>();
  TrainStep step(loss, m.adapter(), {}, optim::AdamWConfig{}, ExecOptions{.threads = 1});
  step.run();
  step.update(1e-2, 0);
  EXPECT_EQ(m.params().get("model.layers.0.self_attn.q_proj.weight").to_vector<float>(), before);
  EXPECT_NE(m.adapter().get("base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight").to_vector<float>(),
            a_before);
}

TEST(Lora, RefusesBadSettings) {
  const LlamaConfig c = small_config();
  Llama m(c, 1);
  nn::LoraConfig l = all_targets();
  l.r = 0;
  EXPECT_THROW(m.add_lora(l, 1), UsageError);
  l = all_targets();
  l.targets = {"qkv_proj"};
  EXPECT_THROW(m.add_lora(l, 1), UsageError);
  l = all_targets();
  l.dropout = 1;
  EXPECT_THROW(m.add_lora(l, 1), UsageError);
  m.add_lora(all_targets(), 1);
  EXPECT_THROW(m.add_lora(all_targets(), 1), UsageError);
}

TEST(Lora, DropoutActsOnlyWhileTraining) {
  const LlamaConfig c = small_config();
  Llama m(c, 3);
  nn::LoraConfig l = all_targets();
  l.dropout = 0.5;
  m.add_lora(l, 2);
  randomize_b(m, 8);
  ASSERT_TRUE(m.lora_dropout_seed().defined());
  const Tensor ids = tokens(1, 6, c.vocab_size, 3);
  const std::vector<float> eval = run(m.forward(ids)), train = run(m.forward(ids, /*train=*/true));
  EXPECT_NE(eval, train);
  EXPECT_EQ(run(m.forward(ids)), eval);
}

TEST(Lora, PeftFolderRoundTrips) {
  testing_support::TempDir dir;
  const LlamaConfig c = small_config();
  Llama m(c, 3);
  nn::LoraConfig l = all_targets(3);
  l.alpha = 6;
  l.dropout = 0.1;
  l.rslora = true;
  l.targets = {"q_proj", "v_proj", "up_proj"};
  m.add_lora(l, 2);
  randomize_b(m, 5);
  models::save_peft_adapter(dir.path(), l, m.adapter(), "HuggingFaceTB/SmolLM2-135M");
  EXPECT_EQ(dir.listing(), (std::vector<std::string>{"adapter_config.json", "adapter_model.safetensors"}));

  const models::PeftAdapter back = models::load_peft_adapter(dir.path());
  EXPECT_EQ(back.config.r, 3);
  EXPECT_EQ(back.config.alpha, 6);
  EXPECT_EQ(back.config.dropout, 0.1);
  EXPECT_TRUE(back.config.rslora);
  EXPECT_EQ(back.config.targets, l.targets);
  EXPECT_EQ(back.base_model, "HuggingFaceTB/SmolLM2-135M");
  Llama other(c, 3);
  other.add_lora(back.config, 99);
  models::load_adapter_weights(back, other);
  for (const auto& [name, t] : m.adapter().list()) {
    EXPECT_EQ(other.adapter().get(name).to_vector<float>(), t.to_vector<float>()) << name;
  }
  const Tensor ids = tokens(1, 6, c.vocab_size, 3);
  EXPECT_EQ(run(other.forward(ids)), run(m.forward(ids)));

  // An adapter for other modules does not load into this model.
  Llama narrow(c, 3);
  nn::LoraConfig q_only = l;
  q_only.targets = {"q_proj"};
  narrow.add_lora(q_only, 1);
  EXPECT_THROW(models::load_adapter_weights(back, narrow), IoError);
}

TEST(Lora, PeftConfigsNablaWouldNotComputeAsPeftAreRefused) {
  testing_support::TempDir dir;
  const LlamaConfig c = small_config();
  Llama m(c, 3);
  m.add_lora(all_targets(), 2);
  models::save_peft_adapter(dir.path(), m.lora(), m.adapter(), "");
  const std::string config = dir.file("adapter_config.json");
  const std::string good = read_file(config);
  auto with = [&](const std::string& from, const std::string& to) {
    std::string s = good;
    const size_t at = s.find(from);
    EXPECT_NE(at, std::string::npos) << from;
    s.replace(at, from.size(), to);
    std::ofstream(config) << s;
  };
  auto expect_refused = [&](const std::string& what) {
    try {
      models::load_peft_adapter(dir.path());
      ADD_FAILURE() << "accepted: " << what;
    } catch (const IoError& e) {
      EXPECT_NE(std::string(e.what()).find("adapter_config.json"), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find(what), std::string::npos) << e.what();
    }
  };
  with("\"use_dora\": false", "\"use_dora\": \"yes\"");
  expect_refused("use_dora");
  with("\"bias\": \"none\"", "\"bias\": \"all\"");
  expect_refused("bias");
  with("\"peft_type\": \"LORA\"", "\"peft_type\": \"IA3\"");
  expect_refused("peft_type");
  with("\"rank_pattern\": {}", "\"rank_pattern\": {\"q_proj\": 4}");
  expect_refused("rank_pattern");
  with("\"r\": 4", "\"r\": 2.5");
  expect_refused("r must be");
  std::ofstream(config) << "{";
  expect_refused("not a JSON object");
  std::filesystem::remove(config);
  EXPECT_THROW(models::load_peft_adapter(dir.path()), IoError);
}

// Two documents packed in one row under segments compute as each alone:
// rotary attention depends on position differences only, so the second
// document's offset changes nothing beyond rounding.
TEST(Lora, PackedDocumentsComputeAsTheyWouldAlone) {
  const LlamaConfig c = small_config();
  Llama m(c, 3);
  m.add_lora(all_targets(), 2);
  randomize_b(m, 7);
  const Tensor a = tokens(1, 5, c.vocab_size, 1), b = tokens(1, 6, c.vocab_size, 2);
  std::vector<int32_t> row = a.to_vector<int32_t>(), seg(11, 0);
  for (int32_t id : b.to_vector<int32_t>()) row.push_back(id);
  for (int i = 5; i < 11; ++i) seg[size_t(i)] = 1;
  const Tensor packed = Tensor::from_vector<int32_t>({1, 11}, row);
  const std::vector<float> y = run(m.forward(packed, false, Tensor::from_vector<int32_t>({1, 11}, seg)));
  const std::vector<float> ya = run(m.forward(a)), yb = run(m.forward(b));
  const size_t V = size_t(c.vocab_size);
  for (size_t i = 0; i < ya.size(); ++i) EXPECT_NEAR(y[i], ya[i], 1e-5) << i;
  for (size_t i = 0; i < yb.size(); ++i) EXPECT_NEAR(y[5 * V + i], yb[i], 1e-5) << i;
  // Without segments the second document sees the first.
  const std::vector<float> mixed = run(m.forward(packed));
  double differ = 0;
  for (size_t i = 0; i < yb.size(); ++i) differ = std::max(differ, double(std::abs(mixed[5 * V + i] - yb[i])));
  EXPECT_GT(differ, 1e-3);
}

TEST(Lora, GradientCheckpointingGivesTheSameLossAndGradientsInLessMemory) {
  LlamaConfig c = small_config();
  c.num_hidden_layers = 6;
  // Labels with uncounted positions, a whole chunk of them among them.
  const Tensor ids = tokens(3, 12, c.vocab_size, 4);
  std::vector<int32_t> l = ids.to_vector<int32_t>();
  for (size_t i = 0; i < l.size(); ++i) {
    if (i % 5 == 0 || (i >= 14 && i < 22)) l[i] = -100;
  }
  const Tensor labels = Tensor::from_vector<int32_t>(ids.shape(), l);
  for (bool lora : {true, false}) {
    SCOPED_TRACE(lora ? "LoRA" : "every weight");
    Llama m(c, 3);
    if (lora) {
      m.add_lora(all_targets(), 2);
      randomize_b(m, 8);
    }
    const nn::Params& trained = lora ? m.adapter() : m.params();
    std::vector<std::vector<float>> got[2];
    size_t arena[2] = {};
    for (bool checkpoint : {false, true}) {
      m.set_gradient_checkpointing(checkpoint, /*chunk_logits=*/4 * c.vocab_size);  // 4-row chunks
      Graph g;
      const Tensor loss = m.loss(ids, labels);
      g.backward(loss);
      Executor ex(g, {.threads = 2});
      ex.run();
      arena[checkpoint] = ex.memory().arena_bytes;
      got[checkpoint].push_back(ex.read<float>(loss));
      for (const auto& [_, p] : trained.list()) got[checkpoint].push_back(ex.read<float>(g.grad(p)));
    }
    EXPECT_NEAR(got[1][0][0], got[0][0][0], 1e-6 * std::abs(got[0][0][0]));
    for (size_t i = 1; i < got[0].size(); ++i) {
      float scale = 0, diff = 0;
      for (size_t k = 0; k < got[0][i].size(); ++k) {
        scale = std::max(scale, std::abs(got[0][i][k]));
        diff = std::max(diff, std::abs(got[1][i][k] - got[0][i][k]));
      }
      EXPECT_LE(diff, 1e-5 * scale) << trained.list()[i - 1].first;
    }
    EXPECT_LT(arena[1], arena[0] * 0.7) << "checkpointed " << arena[1] << " bytes, kept " << arena[0];
  }
}
