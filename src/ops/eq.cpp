// eq: 1 where a == b, else 0. A mask for other ops' backward rules (max).
#include "backend/cpu/kernel.h"
#include "ops/elementwise.h"

namespace nabla {
namespace ops {
namespace {

struct Eq {
  template <class T>
  T operator()(T a, T b) const { return a == b ? T(1) : T(0); }
};

}  // namespace

extern const OpDef op_eq{
    .name = "eq",
    .summary = "1 where a == b else 0, broadcasting; piecewise constant, so not differentiated",
    .inputs = {{"a", Diff::no}, {"b", Diff::no}},
    .elementwise = true,
    .infer = [](const std::vector<Tensor>& in, const Attrs&) { return infer_binary("eq", in); },
    // Equal entries: b is a with every other row replaced, so both values occur.
    .cases =
        [] {
          return std::vector<GradCase>{
              {"half_equal", {constant(normal({4, 3})), constant(normal({4, 3}))},
               [](const std::vector<Tensor>& x) {
                 return eq(x[0], concat({slice(x[0], 0, 0, 2), slice(x[1], 0, 2, 4)}, 0));
               }},
              {"broadcast", {constant(normal({3, 4})), constant(normal({4}))},
               [](const std::vector<Tensor>& x) { return eq(x[0], x[1]); }},
          };
        },
};
NABLA_CPU_KERNEL(op_eq, binary_forward<Eq>);

}  // namespace ops

Tensor eq(const Tensor& a, const Tensor& b) { return apply(ops::op_eq, {a, b}); }

}  // namespace nabla
