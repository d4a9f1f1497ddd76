// `nabla eval`: test accuracy of a ViT checkpoint.
#include <fmt/format.h>

#include "commands.h"
#include "nabla/checkpoint.h"
#include "vit_common.h"

namespace nabla::cli {

int run_eval(const EvalArgs& a) {
  Checkpoint ckpt = load_checkpoint(a.checkpoint);
  models::VitConfig cfg = models::vit_config_from_checkpoint(ckpt);
  models::Vit model(cfg, 0);
  load_params(ckpt, model.params());
  VitData data = load_vit_data(a.dataset, a.data, cfg);
  check_fits(data, a.dataset, cfg);
  VitEvaluator evaluator(model, data.test, data.normalize, a.batch, a.threads);
  EvalResult r = evaluator.run();
  fmt::print("{}: test accuracy {:.2f}% ({} images), test loss {:.4f}\n", a.checkpoint, 100 * r.accuracy, r.count,
             r.loss);
  return kExitOk;
}

}  // namespace nabla::cli
