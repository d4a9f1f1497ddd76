// `nabla grad`: the loss and every parameter's gradient for one given batch,
// written as safetensors (grad.<name>, loss): for debugging and for checking
// nabla against other frameworks on identical weights and data. The model is
// the checkpoint's architecture (a nabla checkpoint, a Hugging Face folder or a
// llama.cpp GGUF): a ViT reads `images` and `labels`, GPT-2
// reads `tokens` [B, T + 1] (next-token loss), Llama reads `input_ids` and
// `labels` [B, T] in Hugging Face's convention (position t predicts
// labels[t + 1], -100 ignored) or `tokens` as GPT-2; with --adapter (a PEFT
// folder) the gradients are the adapter's, under its PEFT names. With --adamw-steps N it then
// trains N AdamW steps on that same batch through the fused optimizer and
// writes the loss before each step as `losses` [N] (llm.c's test_gpt2 check).
#include <fmt/format.h>

#include <memory>
#include <nlohmann/json.hpp>

#include "commands.h"
#include "nabla/models/gguf.h"
#include "nabla/models/gpt2.h"
#include "nabla/models/llama.h"
#include "nabla/models/lora.h"
#include "nabla/models/vit.h"
#include "nabla/checkpoint.h"
#include "nabla/error.h"
#include "nabla/ops.h"
#include "nabla/trainer.h"

namespace nabla::cli {

namespace {

// A checkpoint's model and its loss on one batch, dropout off.
struct ModelLoss {
  std::unique_ptr<models::Vit> vit;
  std::unique_ptr<models::Gpt2> gpt2;
  std::unique_ptr<models::Llama> llama;
  Tensor loss;
  // An adapted Llama's gradients are its adapter's alone.
  const nn::Params& params() const {
    if (llama) return llama->lora().r > 0 ? llama->adapter() : llama->params();
    return vit ? vit->params() : gpt2->params();
  }
};

const Tensor& batch_tensor(const Safetensors& batch, const std::string& path,
                           const std::string& name, const std::string& expected) {
  const Tensor* t = batch.find(name);
  if (!t) throw IoError(path + ": no tensor '" + name + "' (expected " + expected + ")");
  return *t;
}

// Every id in [0, n): out-of-range ids would index past the embedding or be
// skipped as cross-entropy's ignore_index. `ids`: i32 [N] or [B, T].
void check_ids(const Tensor& ids, int64_t n, const std::string& what) {
  const int32_t* v = static_cast<const int32_t*>(ids.data());
  const int64_t cols = ids.rank() == 2 ? ids.dim(1) : ids.numel();
  for (int64_t i = 0; i < ids.numel(); ++i) {
    if (v[i] < 0 || v[i] >= n) {
      std::string at =
          ids.rank() == 2 ? fmt::format("[{}, {}]", i / cols, i % cols) : fmt::format("[{}]", i);
      throw ShapeError(fmt::format("{}{} is {}, expected ids in [0, {})", what, at, v[i], n));
    }
  }
}

ModelLoss vit_loss(const Checkpoint& ckpt, const Safetensors& batch, const std::string& path) {
  models::VitConfig cfg = models::vit_config_from_checkpoint(ckpt);
  ModelLoss m;
  m.vit = std::make_unique<models::Vit>(cfg, 0);
  load_params(ckpt, m.vit->params());
  const Tensor& images = batch_tensor(batch, path, "images", "f32 images [N, C, H, W]");
  const Tensor& labels = batch_tensor(batch, path, "labels", "integer labels [N]");
  if (images.dtype() != DType::f32) {
    throw DTypeError(path + ": images must be f32, got " + dtype_name(images.dtype()));
  }
  if (labels.dtype() != DType::i32) {
    throw DTypeError(path + ": labels must be integers (I64 or I32), got " +
                     dtype_name(labels.dtype()));
  }
  Shape want{images.rank() > 0 ? images.dim(0) : 0, cfg.in_chans, cfg.img_size, cfg.img_size};
  if (images.rank() != 4 || images.shape() != want || labels.rank() != 1 ||
      labels.dim(0) != images.dim(0)) {
    throw ShapeError(path + ": expected images [N, " + std::to_string(cfg.in_chans) + ", " +
                     std::to_string(cfg.img_size) + ", " + std::to_string(cfg.img_size) +
                     "] and labels [N], got images " + to_string(images.shape()) + " and labels " +
                     to_string(labels.shape()));
  }
  check_ids(labels, cfg.num_classes, path + ": labels");
  m.loss = cross_entropy(m.vit->forward(images, /*train=*/false), labels);
  return m;
}

ModelLoss gpt2_loss(const Checkpoint& ckpt, const Safetensors& batch, const std::string& path) {
  models::Gpt2Config cfg = models::gpt2_config_from_checkpoint(ckpt);
  ModelLoss m;
  m.gpt2 = std::make_unique<models::Gpt2>(cfg, 0);
  load_params(ckpt, m.gpt2->params());
  const Tensor& tokens = batch_tensor(batch, path, "tokens", "integer tokens [B, T + 1]");
  if (tokens.dtype() != DType::i32) {
    throw DTypeError(path + ": tokens must be integers (I64 or I32), got " +
                     dtype_name(tokens.dtype()));
  }
  if (tokens.rank() != 2 || tokens.dim(0) < 1 || tokens.dim(1) < 2) {
    throw ShapeError(path + ": expected tokens [B, T + 1] with B >= 1 and T >= 1, got " +
                     to_string(tokens.shape()));
  }
  if (tokens.dim(1) - 1 > cfg.n_positions) {
    throw ShapeError(
        fmt::format("{}: tokens [B, T + 1] with T = {} exceed the model's {} positions", path,
                    tokens.dim(1) - 1, cfg.n_positions));
  }
  check_ids(tokens, cfg.vocab_size, path + ": tokens");
  m.loss = m.gpt2->next_token_loss(tokens, /*train=*/false);
  return m;
}

// Hugging Face's causal-LM batch (input_ids, labels [B, T]), or GPT-2's
// tokens [B, T + 1].
ModelLoss llama_loss(const Checkpoint& ckpt, const Safetensors& batch, const std::string& path,
                     const std::string& adapter_dir) {
  models::LlamaConfig cfg = models::llama_config_from_checkpoint(ckpt);
  ModelLoss m;
  m.llama = std::make_unique<models::Llama>(cfg, 0);
  load_params(ckpt, m.llama->params());
  if (!adapter_dir.empty()) {
    // Dropout off, as for every model here: the adapter as it computes at inference.
    models::attach_peft_adapter(*m.llama, adapter_dir);
  }
  auto integers = [&](const Tensor& t, const std::string& name) {
    if (t.dtype() != DType::i32) {
      throw DTypeError(path + ": " + name + " must be integers (I64 or I32), got " + dtype_name(t.dtype()));
    }
  };
  if (!batch.find("input_ids") && batch.find("tokens")) {
    const Tensor& tokens = *batch.find("tokens");
    integers(tokens, "tokens");
    if (tokens.rank() != 2 || tokens.dim(0) < 1 || tokens.dim(1) < 2) {
      throw ShapeError(path + ": expected tokens [B, T + 1] with B >= 1 and T >= 1, got " + to_string(tokens.shape()));
    }
    if (tokens.dim(1) - 1 > cfg.max_position_embeddings) {
      throw ShapeError(fmt::format("{}: tokens [B, T + 1] with T = {} exceed the model's {} positions", path,
                                   tokens.dim(1) - 1, cfg.max_position_embeddings));
    }
    check_ids(tokens, cfg.vocab_size, path + ": tokens");
    m.loss = m.llama->next_token_loss(tokens, /*train=*/false);
    return m;
  }
  const Tensor& ids = batch_tensor(batch, path, "input_ids", "integer input_ids [B, T] (or tokens [B, T + 1])");
  const Tensor& labels = batch_tensor(batch, path, "labels", "integer labels [B, T], -100 where not counted");
  integers(ids, "input_ids");
  integers(labels, "labels");
  if (ids.rank() != 2 || ids.dim(0) < 1 || ids.dim(1) < 2 || labels.shape() != ids.shape()) {
    throw ShapeError(path + ": expected input_ids and labels [B, T] with B >= 1 and T >= 2, got " +
                     to_string(ids.shape()) + " and " + to_string(labels.shape()));
  }
  if (ids.dim(1) > cfg.max_position_embeddings) {
    throw ShapeError(fmt::format("{}: {} tokens exceed the model's {} positions", path, ids.dim(1),
                                 cfg.max_position_embeddings));
  }
  check_ids(ids, cfg.vocab_size, path + ": input_ids");
  const int32_t* l = static_cast<const int32_t*>(labels.data());
  for (int64_t i = 0; i < labels.numel(); ++i) {
    if (l[i] != -100 && (l[i] < 0 || l[i] >= cfg.vocab_size)) {
      throw ShapeError(fmt::format("{}: labels[{}, {}] is {}, expected ids in [0, {}) or -100", path,
                                   i / labels.dim(1), i % labels.dim(1), l[i], cfg.vocab_size));
    }
  }
  m.loss = m.llama->loss(ids, labels);
  return m;
}

}  // namespace

int run_grad(const GradArgs& a) {
  Checkpoint ckpt = models::load_any_checkpoint(a.weights);
  Safetensors batch = load_safetensors(a.batch);
  const std::string& arch = ckpt.architecture;
  ModelLoss m;
  if (!a.adapter.empty() && arch != "llama") {
    throw UsageError("grad: --adapter takes a Llama-family model; " + a.weights + " is " +
                     (arch.empty() ? "of no known architecture" : "a " + arch));
  }
  if (arch == "vit") {
    m = vit_loss(ckpt, batch, a.batch);
  } else if (arch == "gpt2") {
    m = gpt2_loss(ckpt, batch, a.batch);
  } else if (arch == "llama") {
    m = llama_loss(ckpt, batch, a.batch, a.adapter);
  } else {
    throw IoError(a.weights + ": " + (arch.empty() ? "its config names no architecture" : "architecture \"" + arch + "\" is not supported") +
                  " (expected \"vit\", \"gpt2\" or \"llama\")");
  }

  // One compiled step: the first run gives the gradients; each further run
  // the loss before the next optimizer update.
  TrainStep step(m.loss, m.params(), {}, a.adamw, ExecOptions{.threads = a.threads, .backend = a.backend});
  step.run();
  const auto& names = m.params().list();
  std::vector<std::pair<std::string, Tensor>> out{{"loss", step.executor().fetch(m.loss)}};
  for (size_t i = 0; i < names.size(); ++i) {
    out.emplace_back("grad." + names[i].first, step.executor().fetch(step.gradients()[i]));
  }
  if (a.adamw_steps > 0) {
    Tensor losses = Tensor::zeros(DType::f32, {a.adamw_steps});
    for (int i = 0; i < a.adamw_steps; ++i) {
      if (i > 0) step.run();
      losses.data_as<float>()[i] = step.loss();
      step.update(a.lr, a.clip);
    }
    out.emplace_back("losses", losses);
  }
  save_safetensors(a.out, out, {{"nabla.config", ckpt.config_json}});
  fmt::print("loss {:.6f}; {} gradients written to {}\n", out[0].second.item(), names.size(),
             a.out);
  if (a.adamw_steps > 0) {
    const float* l = out.back().second.data_as<float>();
    fmt::print(
        "{} AdamW steps (lr {}, weight decay {}): loss {:.6f} before the first, {:.6f} before the "
        "last\n",
        a.adamw_steps, a.lr, a.adamw.weight_decay, l[0], l[a.adamw_steps - 1]);
  }
  return kExitOk;
}

}  // namespace nabla::cli
