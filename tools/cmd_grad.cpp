// `nabla grad`: the loss and every parameter's gradient for one given batch,
// written as safetensors (grad.<name>, loss): for debugging and for checking
// nabla against other frameworks on identical weights and data.
#include <fmt/format.h>

#include "commands.h"
#include "models/vit.h"
#include "nabla/checkpoint.h"
#include "nabla/error.h"
#include "nabla/executor.h"
#include "nabla/graph.h"
#include "nabla/ops.h"

namespace nabla::cli {

int run_grad(const GradArgs& a) {
  Checkpoint ckpt = load_checkpoint(a.weights);
  models::VitConfig cfg = models::VitConfig::from_json(ckpt.config_json);
  models::Vit model(cfg, 0);
  load_params(ckpt, model.params());

  Safetensors batch = load_safetensors(a.batch);
  const Tensor& images = batch.at("images");
  const Tensor& labels = batch.at("labels");
  if (images.dtype() != DType::f32) {
    throw DTypeError(a.batch + ": images must be f32, got " + dtype_name(images.dtype()));
  }
  if (labels.dtype() != DType::i32 || labels.rank() != 1 || images.rank() != 4 || labels.dim(0) != images.dim(0)) {
    throw ShapeError(a.batch + ": expected images [N, C, H, W] and integer labels [N], got images " +
                     to_string(images.shape()) + " and labels " + to_string(labels.shape()));
  }
  // Dropout off: the gradient of the deterministic model.
  Tensor loss = cross_entropy(model.forward(images, /*train=*/false), labels);
  std::vector<Tensor> wrt;
  for (const auto& [name, p] : model.params().list()) wrt.push_back(p);
  std::vector<Tensor> grads = grad(loss, wrt);
  Graph g({loss});
  for (const Tensor& t : grads) g.add_output(t);
  Executor ex(g, {.threads = a.threads});
  ex.run();

  std::vector<std::pair<std::string, Tensor>> out{{"loss", ex.fetch(loss)}};
  for (size_t i = 0; i < grads.size(); ++i) out.emplace_back("grad." + model.params().list()[i].first, ex.fetch(grads[i]));
  save_safetensors(a.out, out, {{"nabla.config", ckpt.config_json}});
  fmt::print("loss {:.6f}; {} gradients written to {}\n", out[0].second.item(), grads.size(), a.out);
  return kExitOk;
}

}  // namespace nabla::cli
