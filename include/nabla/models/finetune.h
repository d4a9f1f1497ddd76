// A fine-tuning session: a pretrained Llama-family model (Hugging Face
// folder, GGUF or nabla checkpoint) with LoRA adapters on its frozen weights
// (or every weight trainable), the compiled training step over batches of
// token ids, and the result written as other tools read it. `nabla
// finetune` and the C API's nabla_finetune_* run this.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "nabla/checkpoint.h"
#include "nabla/models/llama.h"
#include "nabla/models/lora.h"
#include "nabla/trainer.h"

namespace nabla::models {

struct FinetuneConfig {
  nn::LoraConfig lora;  // r 0: full fine-tuning
  int64_t batch = 4;    // each micro-batch: batch rows of context tokens
  int64_t context = 0;  // 0: the model's positions, at most 512
  int micro_batches = 1;             // summed into each update (gradient accumulation)
  optim::AdamWConfig adamw;
  ExecOptions exec;
  uint64_t seed = 1;  // the adapters' initialisation
  // Under LoRA, a GGUF base's projections stored as F16, BF16 or a block
  // format stay so and are computed in it (QLoRA); false: read as f32.
  bool keep_stored = true;
  bool gradient_checkpointing = false;  // Llama::set_gradient_checkpointing
  // Data parallelism (TrainStep's): replicas in this process, times the
  // processes of a job (comm, which must outlive the session), split each
  // batch's rows; shard_optimizer: ZeRO-1 across the processes.
  int replicas = 1;
  dist::Communicator* comm = nullptr;
  bool shard_optimizer = false;
};

class FinetuneSession {
 public:
  // Reads the base (load_any_checkpoint). `adapter_dir`: a PEFT folder to
  // start from, whose LoRA settings replace config.lora's ("" = fresh
  // adapters). IoError / UsageError naming the file or setting at fault.
  FinetuneSession(const std::string& base, FinetuneConfig config, const std::string& adapter_dir = "");
  ~FinetuneSession();

  // The step's inputs, [rows, context] i32 with rows = batch / (replicas x
  // processes): token ids, labels (Hugging Face's: -100 not counted, shifted
  // inside the loss), segment ids (documents packed into a row attend within
  // their own id); and the loss weight, an f32 scalar (the rows' share of
  // the update's counted tokens times micro_batches x replicas x processes;
  // 1 with one of each). Replica 0's; replica(r) gives each one's.
  Tensor input_ids, labels, segments, loss_weight;
  struct Inputs {
    Tensor input_ids, labels, segments, loss_weight, dropout_seed;  // dropout_seed: undefined without LoRA dropout
  };
  Inputs replica(int r) const;

  // Forward and backward for the inputs now in the leaves; returns the
  // weighted loss. With micro-batches, gradients sum until update().
  float run();
  // Clips to global norm `clip` (0: none) and takes one AdamW step at lr.
  double update(double lr, double clip);

  const std::string& base_path() const { return base_; }
  const LlamaConfig& config() const { return model_->config(); }
  const FinetuneConfig& settings() const { return config_; }
  bool full() const { return config_.lora.r == 0; }
  Llama& model() { return *model_; }
  const Llama& model() const { return *model_; }
  nn::Params& trained() { return full() ? model_->params() : model_->adapter(); }
  TrainStep& step() { return *step_; }

  // The adapter as a PEFT folder (the whole model as a Hugging Face folder
  // when full), and with `position` nabla's training state beside it
  // (training_state.safetensors: the AdamW moments and the position), from
  // which a session continues bit for bit (load_state).
  // `optimizer`: the moments to write (a sharded step's, gathered); null:
  // the step's own.
  void save(const std::string& dir, const std::string& config_json = "{}", const TrainPosition* position = nullptr,
            const optim::AdamW* optimizer = nullptr) const;
  // The training state a save() wrote into `dir`, when there is one.
  static bool has_state(const std::string& dir);
  static Checkpoint load_state(const std::string& dir);
  // The adapter as llama.cpp's adapter GGUF (gguf_lora_adapter).
  void save_gguf_adapter(const std::string& path) const;

 private:
  std::string base_;
  FinetuneConfig config_;
  std::unique_ptr<Llama> model_;
  std::unique_ptr<TrainStep> step_;
};

}  // namespace nabla::models
