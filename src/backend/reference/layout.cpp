#include "backend/reference/kernel.h"

namespace nabla::reference {

void register_layout_kernels() {}

}  // namespace nabla::reference
