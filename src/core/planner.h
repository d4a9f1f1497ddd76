// Memory planner: assigns every computed node's output a place in one arena.
#pragma once

#include <cstddef>
#include <unordered_map>
#include <vector>

#include "nabla/executor.h"
#include "nabla/tensor.h"

namespace nabla {

struct MemoryPlan {
  // Byte offset in the arena of each computed (non-leaf, non-view) node, by
  // position in the order; -1 for leaves and views.
  std::vector<int64_t> offset;
  MemoryReport report;
};

// A buffer is reused only after the last node that reads it (directly or
// through a view) has run, counting forward and backward nodes alike; outputs
// are never reused. With `inplace`, an elementwise node (or an op's
// `inplace_input`) may write over an input whose last reader it is, when that
// input is its root's whole memory in the root's layout and no other operand
// aliases it.
MemoryPlan plan_memory(const std::vector<Tensor>& order, const std::vector<Tensor>& outputs, bool reuse,
                       bool inplace);

}  // namespace nabla
