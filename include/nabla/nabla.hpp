// The whole public C++ API.
#pragma once

#include "nabla/dtype.h"
#include "nabla/error.h"
#include "nabla/executor.h"
#include "nabla/gradcheck.h"
#include "nabla/graph.h"
#include "nabla/ops.h"
#include "nabla/shape.h"
#include "nabla/tensor.h"
