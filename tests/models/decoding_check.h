// The check that a model's key/value-cache decoding step gives the logits of
// its full forward pass, position by position.
#pragma once

#include <gtest/gtest.h>

#include <vector>

#include "nabla/executor.h"
#include "nabla/nn.h"

namespace nabla {

// `full`: the forward pass's logits [1, T, V] for `ids`.
inline void expect_decoding_matches(nn::DecodeStep s, const std::vector<int32_t>& ids, const std::vector<float>& full,
                                    int64_t V, double tolerance = 1e-5) {
  Executor ex(Graph(s.outputs()), {.threads = 2});
  for (int64_t p = 0; p < int64_t(ids.size()); ++p) {
    s.token.data_as<int32_t>()[0] = ids[size_t(p)];
    s.position.data_as<int32_t>()[0] = int32_t(p);
    ex.run();
    const std::vector<float> logits = ex.read<float>(s.logits);
    for (int64_t v = 0; v < V; ++v) {
      ASSERT_NEAR(logits[size_t(v)], full[size_t(p * V + v)], tolerance) << "position " << p << " token " << v;
    }
    s.remember(ex, p);
  }
}

}  // namespace nabla
