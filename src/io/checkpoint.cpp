#include "nabla/checkpoint.h"

#include "nabla/config.h"
#include "nabla/error.h"

namespace nabla {

namespace {

ConfigFields position_fields(TrainPosition& p, const std::string& what) {
  ConfigFields f(what);
  f.required("step", p.step, 0).required("epoch", p.epoch, 0).required("batch", p.batch, 0).required("seed", p.seed);
  return f;
}

}  // namespace

std::string TrainPosition::to_json() const {
  TrainPosition p = *this;
  return position_fields(p, "nabla.train").to_json();
}

TrainPosition TrainPosition::from_json(const std::string& text, const std::string& file) {
  TrainPosition p;
  position_fields(p, file + ": bad nabla.train metadata").from_json(text);
  return p;
}

void save_checkpoint(const std::string& path, const std::string& config_json, const nn::Params& params,
                     const optim::AdamW* optimizer, const TrainPosition* position) {
  std::vector<std::pair<std::string, Tensor>> tensors = params.list();
  // "format": "pt" is what Hugging Face's loaders look for.
  std::map<std::string, std::string> meta{{"format", "pt"}, {"nabla.config", config_json}};
  if (optimizer) {
    for (auto& kv : optimizer->state()) tensors.push_back(kv);
    meta["nabla.optimizer"] = "adamw:" + std::to_string(optimizer->steps());
  }
  if (position) meta["nabla.train"] = position->to_json();
  save_safetensors(path, tensors, meta);
}

Checkpoint load_checkpoint(const std::string& path) {
  Checkpoint c;
  c.path = path;
  c.file = load_safetensors(path);
  auto it = c.file.metadata.find("nabla.config");
  if (it == c.file.metadata.end()) {
    throw IoError(path + ": not a nabla checkpoint: no \"nabla.config\" in the safetensors metadata");
  }
  c.config_json = it->second;
  auto pos = c.file.metadata.find("nabla.train");
  if (pos != c.file.metadata.end()) {
    c.has_position = true;
    c.position = TrainPosition::from_json(pos->second, path);
  }
  return c;
}

void load_params(const Checkpoint& ckpt, nn::Params& params) {
  // Every parameter is checked before any is written: a mismatch leaves the
  // model as it was, not half loaded.
  const std::vector<std::pair<std::string, Tensor>> list = params.list();
  std::vector<const Tensor*> found;
  found.reserve(list.size());
  for (const auto& [name, p] : list) {
    const Tensor* t = ckpt.file.find(name);
    if (!t) throw IoError(ckpt.path + ": missing parameter '" + name + "'");
    if (t->shape() != p.shape()) {
      throw IoError(ckpt.path + ": parameter '" + name + "' is " + to_string(t->shape()) + ", the model expects " +
                    to_string(p.shape()));
    }
    if (t->dtype() != p.dtype()) {
      throw IoError(ckpt.path + ": parameter '" + name + "' is " + dtype_name(t->dtype()) + ", expected " +
                    dtype_name(p.dtype()));
    }
    found.push_back(t);
  }
  for (size_t i = 0; i < list.size(); ++i) {
    Tensor dst = list[i].second;
    dst.copy_from(found[i]->data(), size_t(found[i]->numel()) * dtype_size(found[i]->dtype()));
  }
}

void load_optimizer_state(const Checkpoint& ckpt, optim::AdamW& optimizer) {
  try {
    optimizer.load_state(ckpt.file.tensors, ckpt.position.step);
  } catch (const IoError& e) {
    throw IoError(ckpt.path + ": " + e.what());
  }
}

void check_holds_parameters(const Checkpoint& ckpt, int64_t parameters) {
  int64_t values = 0;
  for (const auto& [name, t] : ckpt.file.tensors) values += t.numel();
  if (parameters > values) {
    throw IoError(ckpt.path + ": its config describes a model of " + std::to_string(parameters) +
                  " parameters, but the file holds only " + std::to_string(values) + " values");
  }
}

}  // namespace nabla
