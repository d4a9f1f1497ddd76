#include "core/op.h"

namespace nabla {

namespace ops {
#define NABLA_OP(name) extern const OpDef op_##name;
#include "ops/op_list.h"
#undef NABLA_OP
}  // namespace ops

const std::vector<const OpDef*>& all_ops() {
  static const std::vector<const OpDef*> ops = {
#define NABLA_OP(name) &ops::op_##name,
#include "ops/op_list.h"
#undef NABLA_OP
  };
  return ops;
}

const OpDef* find_op(const std::string& name) {
  for (const OpDef* op : all_ops()) {
    if (name == op->name) return op;
  }
  return nullptr;
}

}  // namespace nabla
