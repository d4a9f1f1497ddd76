// `nabla gradcheck`: every registered op x gradient case x applicable layout x
// thread count through check_op_case, the same checks as the Grad_ tests. On
// another backend (--backend), the gradient checks run there, and each case's
// values and gradients are compared with the CPU's (the Reference_ tests).
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <exception>
#include <string>
#include <vector>

#include "commands.h"
#include "core/op.h"
#include "core/op_check.h"

namespace nabla::cli {
namespace {

template <class T>
bool contains(const std::vector<T>& v, const T& x) {
  return std::find(v.begin(), v.end(), x) != v.end();
}

bool any_input_checked(const GradCase& c) {
  for (const CaseInput& in : c.inputs) {
    if (in.checked) return true;
  }
  return false;
}

// Runs one check; a case that throws (a shape rule rejecting its own inputs,
// say) fails like any other instead of ending the run.
template <class Check>
GradcheckResult run_check(Check check) {
  try {
    return check();
  } catch (const std::exception& e) {
    GradcheckResult r;
    r.ok = false;
    r.message = std::string("threw: ") + e.what();
    return r;
  }
}

// Counts results and prints failures (and, verbose, every check).
struct Tally {
  bool verbose = false;
  int passed = 0, failed = 0;

  void fail(const std::string& id, const std::string& message) {
    ++failed;
    fmt::print("FAIL {}: {}\n", id, message);
  }
  // `with_f32`: whether r compares an f32 run (a composite check is f64 only).
  void record(const std::string& id, const GradcheckResult& r, bool with_f32 = true) {
    if (r.ok) {
      ++passed;
    } else {
      fail(id, r.message);
    }
    if (verbose) {
      std::string f32 = with_f32 ? fmt::format("  f32 {:.3g}", r.f32_max_error) : "";
      fmt::print("{} {:<48} f64 {:.3g}{}  ({} entries)\n", r.ok ? "ok  " : "FAIL", id,
                 r.f64_max_error, f32, r.checked);
    }
  }
};

// Every check of one case in one layout: the gradient check per thread count
// and, for a fused op, the comparison with its composite.
void check_layout(const OpDef& op, const GradCase& c, Layout layout, const std::vector<int>& threads,
                  const std::string& backend, Tally& tally) {
  std::string id = fmt::format("{}/{}/{}", op.name, c.name, layout_name(layout));
  for (int t : threads) {
    GradcheckResult r = run_check([&] { return check_op_case(op, c, layout, t, 1, backend); });
    // As in the Grad_ tests: a case with a checked input must compare something.
    if (r.ok && r.checked == 0 && any_input_checked(c)) {
      r.ok = false;
      r.message = "no gradient entry was compared";
    }
    tally.record(fmt::format("{}/t{}", id, t), r);
  }
  if (backend != "cpu") {
    GradcheckResult r = run_check([&] { return check_backend(op, c, layout, backend); });
    tally.record(id + "/vs-cpu", r);
    return;  // fused ops run their composites there
  }
  if (op.fused) {
    GradcheckResult r = run_check([&] { return check_composite(op, c, layout, threads.front()); });
    if (r.ok && r.checked == 0) {
      r.ok = false;
      r.message = "nothing was compared with the composite";
    }
    tally.record(id + "/composite", r, false);
  }
}

}  // namespace

int run_gradcheck(const GradcheckArgs& args) {
  auto start = std::chrono::steady_clock::now();
  // A backend other than the CPU's has no thread count of ours to vary.
  const std::vector<int> default_threads = args.backend == "cpu" ? std::vector<int>{1, 2, 4} : std::vector<int>{1};
  std::vector<int> threads = args.threads.empty() ? default_threads : args.threads;
  Tally tally{args.verbose};

  for (const std::string& problem : registry_problems()) tally.fail("registry", problem);
  for (const OpDef* op : all_ops()) {
    if (!args.ops.empty() && !contains(args.ops, std::string(op->name))) continue;
    if (!op->cases) continue;  // reported by registry_problems()
    for (const GradCase& c : op->cases()) {
      for (Layout layout : kAllLayouts) {
        bool selected =
            args.layouts.empty() || contains(args.layouts, std::string(layout_name(layout)));
        if (selected && layout_applies(c, layout)) check_layout(*op, c, layout, threads, args.backend, tally);
      }
    }
  }
  double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  if (args.verbose) fmt::print("errors are relative to the tolerance: <= 1 passes\n");
  fmt::print("checked in {:.1f} s\n", seconds);
  fmt::print("{} passed, {} failed\n", tally.passed, tally.failed);
  return tally.failed == 0 ? kExitOk : kExitFailed;
}

}  // namespace nabla::cli
