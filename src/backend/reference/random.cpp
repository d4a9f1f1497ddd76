#include "backend/reference/kernel.h"

namespace nabla::reference {

void register_random_kernels() {}

}  // namespace nabla::reference
