// The whole public C++ API.
#pragma once

#include "nabla/checkpoint.h"
#include "nabla/data.h"
#include "nabla/dtype.h"
#include "nabla/error.h"
#include "nabla/executor.h"
#include "nabla/gguf.h"
#include "nabla/gradcheck.h"
#include "nabla/graph.h"
#include "nabla/io.h"
#include "nabla/nn.h"
#include "nabla/optim.h"
#include "nabla/ops.h"
#include "nabla/shape.h"
#include "nabla/tensor.h"
#include "nabla/train_log.h"
#include "nabla/trainer.h"
