// The `nabla` tool's subcommands. nabla.cpp parses the command line into these
// argument structs; each cmd_*.cpp runs one subcommand and returns its exit status.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace nabla::cli {

// Exit statuses shared by all subcommands.
inline constexpr int kExitOk = 0;
inline constexpr int kExitFailed = 1;  // the command ran and found a problem
inline constexpr int kExitUsage = 2;   // bad command line

struct OpsArgs {
  bool markdown = false;  // print docs/ops.md instead of a terminal table
};
int run_ops(const OpsArgs& opt);

struct GradcheckArgs {
  std::vector<std::string> ops;      // empty: every registered op
  std::vector<int> threads;          // empty: 1, 2 and 4
  std::vector<std::string> layouts;  // empty: every layout
  bool verbose = false;
};
int run_gradcheck(const GradcheckArgs& opt);

struct TrainMlpArgs {
  int steps = 2000;
  int batch = 128;
  int hidden = 64;
  double lr = 0.1;
  int threads = 1;
  uint64_t seed = 1;
};
int run_train_mlp(const TrainMlpArgs& opt);

}  // namespace nabla::cli
