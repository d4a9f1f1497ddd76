// The registry's own rules: every op has gradient cases, a case that takes a
// strided layout, and a backward for every input it differentiates.
#include <gtest/gtest.h>

#include <set>

#include "core/op_check.h"

TEST(Registry, EveryOpIsChecked) {
  std::vector<std::string> problems = nabla::registry_problems();
  std::string all;
  for (const std::string& p : problems) all += p + "\n";
  EXPECT_TRUE(problems.empty()) << all;
}

TEST(Registry, NamesAreUnique) {
  std::set<std::string> names;
  for (const nabla::OpDef* op : nabla::all_ops()) EXPECT_TRUE(names.insert(op->name).second) << op->name;
}

TEST(Registry, EveryTransposedAndBroadcastLayoutIsReachable) {
  // Across the registry, both strided-gradient routes are exercised.
  int transposed = 0, broadcast = 0;
  for (const nabla::OpDef* op : nabla::all_ops()) {
    if (!op->cases) continue;  // an update op
    for (const nabla::GradCase& c : op->cases()) {
      transposed += nabla::layout_applies(c, nabla::Layout::transposed);
      broadcast += nabla::layout_applies(c, nabla::Layout::broadcast);
    }
  }
  EXPECT_GT(transposed, 20);
  EXPECT_GT(broadcast, 20);
}
