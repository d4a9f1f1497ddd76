#include <algorithm>

#include "core/op.h"

namespace nabla {

namespace ops {
#define NABLA_OP(name) extern const OpDef op_##name;
#define NABLA_INTERNAL_OP(name) NABLA_OP(name)
#include "ops/op_list.h"
#undef NABLA_INTERNAL_OP
#undef NABLA_OP
}  // namespace ops

const std::vector<const OpDef*>& all_ops() {
  static const std::vector<const OpDef*> ops = {
#define NABLA_OP(name) &ops::op_##name,
#define NABLA_INTERNAL_OP(name) NABLA_OP(name)
#include "ops/op_list.h"
#undef NABLA_INTERNAL_OP
#undef NABLA_OP
  };
  return ops;
}

bool is_internal(const OpDef& op) {
  static const std::vector<const OpDef*> internal = {
#define NABLA_OP(name)
#define NABLA_INTERNAL_OP(name) &ops::op_##name,
#include "ops/op_list.h"
#undef NABLA_INTERNAL_OP
#undef NABLA_OP
  };
  return std::find(internal.begin(), internal.end(), &op) != internal.end();
}

const OpDef* find_op(const std::string& name) {
  for (const OpDef* op : all_ops()) {
    if (name == op->name) return op;
  }
  return nullptr;
}

}  // namespace nabla
