#include "backend/reference/kernel.h"

namespace nabla::reference {

void register_image_kernels() {}

}  // namespace nabla::reference
