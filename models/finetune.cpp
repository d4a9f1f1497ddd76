#include "nabla/models/finetune.h"

#include <algorithm>
#include <filesystem>

#include "nabla/error.h"
#include "nabla/models/gguf.h"
#include "nabla/ops.h"

namespace nabla::models {

namespace {

namespace fs = std::filesystem;
const char* kStateFile = "training_state.safetensors";

}  // namespace

FinetuneSession::FinetuneSession(const std::string& base, FinetuneConfig settings, const std::string& adapter_dir)
    : base_(base), config_(std::move(settings)) {
  if (config_.batch < 1 || config_.context < 0 || config_.context == 1 || config_.micro_batches < 1) {
    throw UsageError("finetune: batch and micro-batches must be at least 1 and the context at least 2");
  }
  {
    const Checkpoint ckpt = load_any_checkpoint(base, !full() && config_.keep_stored);
    if (ckpt.architecture != "llama") {
      throw UsageError("finetune: " + ckpt.path + " is a" +
                       (ckpt.architecture.empty() ? "n unknown" : " " + ckpt.architecture) +
                       " model; fine-tuning takes the Llama family");
    }
    model_ = std::make_unique<Llama>(ckpt);
  }
  if (config_.context == 0) config_.context = std::min<int64_t>(config().max_position_embeddings, 512);
  if (config_.context > config().max_position_embeddings) {
    throw UsageError("finetune: a context of " + std::to_string(config_.context) + " exceeds the model's " +
                     std::to_string(config().max_position_embeddings) + " positions");
  }
  if (!adapter_dir.empty()) {
    if (full()) throw UsageError("finetune: an adapter to start from, but full fine-tuning (LoRA r 0)");
    config_.lora = attach_peft_adapter(*model_, adapter_dir).config;
  } else if (!full()) {
    model_->add_lora(config_.lora, config_.seed);
    config_.lora = model_->lora();  // the targets filled in where none were given
  }
  model_->set_gradient_checkpointing(config_.gradient_checkpointing);
  const int64_t T = config_.context, parts = int64_t(std::max(1, config_.replicas)) * (config_.comm ? config_.comm->size() : 1);
  if (config_.batch % parts != 0) {
    throw UsageError("finetune: " + std::to_string(parts) + " replicas (over every process) do not divide the batch of " +
                     std::to_string(config_.batch));
  }
  const int64_t B = config_.batch / parts;
  input_ids = Tensor::zeros(DType::i32, {B, T}).set_name("input_ids");
  labels = Tensor::full(DType::i32, {B, T}, -100).set_name("labels");
  segments = Tensor::zeros(DType::i32, {B, T}).set_name("segments");
  loss_weight = Tensor::full(DType::f32, {}, 1.0).set_name("loss_weight");
  const Tensor loss = model_->loss(input_ids, labels, /*train=*/true, segments) * loss_weight;
  step_ = std::make_unique<TrainStep>(loss, trained(), std::vector<Tensor>{}, config_.adamw, config_.exec,
                                      StepOptions{.micro_batches = config_.micro_batches,
                                                  .replicas = std::max(1, config_.replicas),
                                                  .comm = config_.comm,
                                                  .shard_optimizer = config_.shard_optimizer});
}

FinetuneSession::Inputs FinetuneSession::replica(int r) const {
  const Tensor seed = model_->lora_dropout_seed();
  return {step_->in_replica(r, input_ids), step_->in_replica(r, labels), step_->in_replica(r, segments),
          step_->in_replica(r, loss_weight), seed.defined() ? step_->in_replica(r, seed) : Tensor()};
}

FinetuneSession::~FinetuneSession() = default;

float FinetuneSession::run() {
  step_->run();
  return step_->loss();
}

double FinetuneSession::update(double lr, double clip) { return step_->update(lr, clip); }

void FinetuneSession::save(const std::string& dir, const std::string& config_json, const TrainPosition* position,
                           const optim::AdamW* optimizer) const {
  if (full()) {
    // A folder that stands alone: the base's tokenizer and chat template with the weights.
    save_llama_folder(dir, config(), model_->params(), checkpoint_tokenizer(base_, config().tokenizer),
                      checkpoint_chat_template(base_));
  } else {
    save_peft_adapter(dir, config_.lora, model_->adapter(), base_, config().multimodal);
  }
  // The moments and position alone: the weights are the folder's own.
  if (position) {
    save_checkpoint((fs::path(dir) / kStateFile).string(), config_json, nn::Params(),
                    optimizer ? optimizer : &step_->optimizer(), position);
  }
}

bool FinetuneSession::has_state(const std::string& dir) {
  std::error_code ec;
  return fs::exists(fs::path(dir) / kStateFile, ec);
}

Checkpoint FinetuneSession::load_state(const std::string& dir) {
  Checkpoint state = load_checkpoint((fs::path(dir) / kStateFile).string());
  if (!state.has_position) throw IoError(state.path + ": has no training position (\"nabla.train\")");
  return state;
}

void FinetuneSession::save_gguf_adapter(const std::string& path) const {
  if (full()) throw UsageError("finetune: full fine-tuning has no adapter to write (save the model instead)");
  PeftAdapter adapter;
  adapter.path = base_;
  adapter.config = config_.lora;
  adapter.weights.tensors = model_->adapter().list();
  gguf_lora_adapter(config(), adapter).write(path);
}

}  // namespace nabla::models
