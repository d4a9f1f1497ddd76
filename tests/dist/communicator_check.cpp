// The MPI communicator's collectives, run under `mpirun -np N` (N >= 2) by
// ctest: every rank checks its results and exits non-zero on a mismatch.
//
// The fold's terms are chosen so that any other order of addition gives
// other bits: rank r's terms for element i are {big, tiny, -big} with
// magnitudes that make float rounding depend on what came before.
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "nabla/distributed.h"
#include "nabla/error.h"

namespace {

int failures = 0;

void expect(bool ok, const std::string& what, int rank) {
  if (ok) return;
  std::fprintf(stderr, "rank %d: FAILED: %s\n", rank, what.c_str());
  ++failures;
}

// Rank r's terms for element i, in their order.
std::vector<float> terms(int r, int64_t i) {
  const float big = std::ldexp(1.0f, 20 + int((i + r) % 5));
  return {big, 0.3f + float(r) * 0.011f + float(i % 7) * 0.17f, -big * 0.75f};
}

// What one process adding every rank's terms in rank order would get.
float sequential(int ranks, int64_t i) {
  float s = 0;
  bool first = true;
  for (int r = 0; r < ranks; ++r) {
    for (float t : terms(r, i)) {
      s = first ? t : s + t;
      first = false;
    }
  }
  return s;
}

}  // namespace

int main() {
  using namespace nabla;
  std::unique_ptr<dist::Communicator> comm = dist::mpi_communicator();
  const int rank = comm->rank(), n = comm->size();
  if (n < 2) {
    std::fprintf(stderr, "communicator_check: run under mpirun with at least 2 processes, got %d\n", n);
    return 1;
  }
  const dist::Fold fold = [&](float* acc, int64_t begin, int64_t end, bool first) {
    for (int64_t i = begin; i < end; ++i) {
      float s = first ? 0 : acc[i - begin];
      bool empty = first;
      for (float t : terms(rank, i)) {
        s = empty ? t : s + t;
        empty = false;
      }
      acc[i - begin] = s;
    }
  };
  // Longer than one chunk of the chain, and not a multiple of it.
  const int64_t len = (int64_t{1} << 17) + 12345;
  std::vector<float> expected(static_cast<size_t>(len));
  for (int64_t i = 0; i < len; ++i) expected[size_t(i)] = sequential(n, i);
  // The check has teeth: adding the ranks' partial sums instead differs.
  int64_t differs = 0;
  for (int64_t i = 0; i < 1000; ++i) {
    float partials = 0;
    for (int r = 0; r < n; ++r) {
      float p = 0;
      bool e = true;
      for (float t : terms(r, i)) {
        p = e ? t : p + t;
        e = false;
      }
      partials += p;
    }
    differs += partials != expected[size_t(i)];
  }
  expect(differs > 100, "the terms do not make the order matter (" + std::to_string(differs) + " of 1000)", rank);

  std::vector<float> buf(static_cast<size_t>(len), -1.0f);
  comm->allreduce(buf.data(), len, fold);
  int64_t wrong = 0;
  for (int64_t i = 0; i < len; ++i) wrong += buf[size_t(i)] != expected[size_t(i)];
  expect(wrong == 0, "allreduce: " + std::to_string(wrong) + " elements differ from the sum in rank order", rank);

  // Buckets, the last first, each folded only once "ready": as a training
  // step hands over its gradients.
  const std::vector<dist::Communicator::Range> buckets{{100000, len}, {4096, 100000}, {0, 4096}};
  std::vector<size_t> readied;
  std::fill(buf.begin(), buf.end(), -1.0f);
  comm->allreduce_buckets(buf.data(), buckets, fold, [&](size_t k) { readied.push_back(k); });
  wrong = 0;
  for (int64_t i = 0; i < len; ++i) wrong += buf[size_t(i)] != expected[size_t(i)];
  expect(wrong == 0, "allreduce_buckets: " + std::to_string(wrong) + " elements differ", rank);
  expect(readied == std::vector<size_t>{0, 1, 2}, "allreduce_buckets: ready() once per bucket, in order", rank);

  const std::vector<int64_t> bounds = dist::even_bounds(len, n);
  std::fill(buf.begin(), buf.end(), -1.0f);
  comm->allreduce_buckets(buf.data(), buckets, fold, [](size_t) {}, bounds);
  wrong = 0;
  for (int64_t i = bounds[size_t(rank)]; i < bounds[size_t(rank) + 1]; ++i) wrong += buf[size_t(i)] != expected[size_t(i)];
  expect(wrong == 0, "allreduce_buckets with bounds: " + std::to_string(wrong) + " of this rank's elements differ", rank);

  std::fill(buf.begin(), buf.end(), -1.0f);
  comm->reduce_scatter(buf.data(), len, fold, bounds);
  wrong = 0;
  for (int64_t i = bounds[size_t(rank)]; i < bounds[size_t(rank) + 1]; ++i) wrong += buf[size_t(i)] != expected[size_t(i)];
  expect(wrong == 0, "reduce_scatter: " + std::to_string(wrong) + " of this rank's elements differ", rank);

  // all_gather: each rank's part holds values it alone knows.
  for (int64_t i = 0; i < len; ++i) {
    const bool mine = i >= bounds[size_t(rank)] && i < bounds[size_t(rank) + 1];
    buf[size_t(i)] = mine ? float(i) * 0.5f + float(rank) : -1.0f;
  }
  comm->all_gather(buf.data(), bounds);
  wrong = 0;
  for (int r = 0; r < n; ++r) {
    for (int64_t i = bounds[size_t(r)]; i < bounds[size_t(r) + 1]; ++i) wrong += buf[size_t(i)] != float(i) * 0.5f + float(r);
  }
  expect(wrong == 0, "all_gather: " + std::to_string(wrong) + " elements differ", rank);

  // gather: to the last rank alone.
  for (int64_t i = 0; i < len; ++i) {
    const bool mine = i >= bounds[size_t(rank)] && i < bounds[size_t(rank) + 1];
    buf[size_t(i)] = mine ? float(i) * 0.25f - float(rank) : -1.0f;
  }
  comm->gather(buf.data(), bounds, n - 1);
  if (rank == n - 1) {
    wrong = 0;
    for (int r = 0; r < n; ++r) {
      for (int64_t i = bounds[size_t(r)]; i < bounds[size_t(r) + 1]; ++i) wrong += buf[size_t(i)] != float(i) * 0.25f - float(r);
    }
    expect(wrong == 0, "gather: " + std::to_string(wrong) + " elements differ at the root", rank);
  }

  std::vector<int> all(static_cast<size_t>(n));
  const int mine = 1000 + rank * 7;
  comm->all_gather_bytes(&mine, all.data(), sizeof mine);
  for (int r = 0; r < n; ++r) expect(all[size_t(r)] == 1000 + r * 7, "all_gather_bytes: rank " + std::to_string(r), rank);

  double value = rank == n - 1 ? 3.25 : 0.0;
  comm->broadcast(&value, sizeof value, n - 1);
  expect(value == 3.25, "broadcast from the last rank", rank);
  comm->barrier();

  dist::check_same(*comm, "a shared value", "same everywhere");
  bool threw = false;
  try {
    dist::check_same(*comm, "a rank's value", rank == 1 ? "one" : "other");
  } catch (const DistributedError& e) {
    threw = std::string(e.what()).find("rank 1 has one") != std::string::npos;
    if (!threw) std::fprintf(stderr, "rank %d: unexpected message: %s\n", rank, e.what());
  }
  expect(threw, "check_same on different values throws on every rank, naming the rank", rank);

  if (rank == 0) std::printf("communicator_check: %d processes, %s\n", n, failures ? "FAILED" : "all passed");
  return failures ? 1 : 0;
}
