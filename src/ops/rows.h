// Shared by get_rows and scatter_add_rows: the row indices, read once.
#pragma once

#include "backend/cpu/strided.h"
#include "core/op.h"

namespace nabla::ops {

// The i32 index tensor as a flat vector, each checked against [0, rows).
std::vector<int32_t> read_row_indices(const char* op, const TensorView& idx, int64_t rows);

}  // namespace nabla::ops
