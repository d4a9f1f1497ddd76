#include "backend/reference/kernel.h"

namespace nabla::reference {

void register_indexing_kernels() {}

}  // namespace nabla::reference
