// Data parallelism across processes: a communicator among the processes of
// one job (its ranks), with the collectives a training step needs.
//
// Sums are folds in rank order. allreduce() does not add the ranks' partial
// sums in whatever order the network delivers them: rank 0 writes its terms,
// rank 1 adds its own to that running sum, then rank 2, and so on, element by
// element, over a pipeline of chunks. So N processes of R replicas each add
// the replicas' gradients in exactly the order one process of N x R replicas
// does (TrainStep), and the results are the same bit for bit, for any N.
//
// A job is started by a launcher (mpirun): dist::launched() says whether
// this process is part of one, and join_launched_job() joins it through
// mpi_communicator() (nabla_mpi, built where MPI is found).
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace nabla::dist {

// Adds this rank's terms for elements [begin, end) of the reduced buffer to
// the running sum `acc` (acc[0] is element begin), in the order the terms
// would be added in one process; `first` (rank 0): acc holds nothing yet,
// write the terms' sum.
using Fold = std::function<void(float* acc, int64_t begin, int64_t end, bool first)>;

class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  // "MPI (Open MPI v4.1.4), 2 processes on 1 host".
  virtual std::string describe() const = 0;

  // buf[0, n) on every rank = fold of rank 0's terms, then rank 1's, ...
  void allreduce(float* buf, int64_t n, const Fold& fold) { allreduce_buckets(buf, {{0, n}}, fold, [](size_t) {}); }
  // allreduce() of a buffer whose parts become ready at different times (a
  // backward pass's gradients): `buckets`, disjoint ranges [begin, end) of
  // buf, in the order they are reduced; each is folded once ready(i) returns
  // for it, and travels while later ones are still being computed. With
  // `bounds` (size() + 1 entries from 0 rising to buf's length), rank r ends
  // with the sum's elements [bounds[r], bounds[r + 1]) alone, as
  // reduce_scatter(). The ranks must pass the same buckets and bounds; ready
  // is called on the calling thread.
  struct Range {
    int64_t begin, end;
  };
  virtual void allreduce_buckets(float* buf, const std::vector<Range>& buckets, const Fold& fold,
                                 const std::function<void(size_t)>& ready,
                                 const std::vector<int64_t>& bounds = {}) = 0;
  // The same fold, each rank keeping its own part: rank r ends with elements
  // [bounds[r], bounds[r + 1]) of the sum in buf (other elements undefined).
  void reduce_scatter(float* buf, int64_t n, const Fold& fold, const std::vector<int64_t>& bounds) {
    allreduce_buckets(buf, {{0, n}}, fold, [](size_t) {}, bounds);
  }
  // The inverse: rank r holds elements [bounds[r], bounds[r + 1]) of buf;
  // every rank ends with all of them.
  virtual void all_gather(float* buf, const std::vector<int64_t>& bounds) = 0;
  // all_gather() to `root` alone: its buf ends with every rank's part.
  virtual void gather(float* buf, const std::vector<int64_t>& bounds, int root) = 0;
  // all[r * bytes, (r + 1) * bytes) = rank r's `mine`, on every rank.
  virtual void all_gather_bytes(const void* mine, void* all, size_t bytes) = 0;
  virtual void broadcast(void* data, size_t bytes, int root) = 0;
  virtual void barrier() = 0;
};

// Whether a launcher (mpirun) started this process as one of a job's ranks:
// its environment says so, whether or not this build has MPI.
bool launched();

// Every rank's value of `value` (a short description of what must agree:
// a model's configuration, a data set, a seed), compared: a DistributedError
// on every rank, naming `what` and the ranks that differ, unless all agree.
void check_same(Communicator& comm, const std::string& what, const std::string& value);

// Joins the job this process was launched into (MPI_Init_thread); leaves it
// (MPI_Finalize) when destroyed. A UsageError once this process has left
// (MPI initializes once per process). Defined by the nabla_mpi library, which
// builds where MPI is found; libnabla.so (the C API's) and the nabla tool
// carry it.
std::unique_ptr<Communicator> mpi_communicator();

// The job a launcher started this process in, joined through
// mpi_communicator() where this program carries nabla_mpi; null when no
// launcher started it. A UsageError, saying what to install, when one
// started several processes and this program cannot join them.
std::unique_ptr<Communicator> join_launched_job();

// A 64-bit FNV-1a hash of bytes, continuing `hash`: what check_same compares
// of large things (a data set, parameter values).
uint64_t fingerprint(const void* data, size_t bytes, uint64_t hash = 0xcbf29ce484222325ull);

// The elements [0, n) split into comm.size() contiguous parts, as even as can
// be: bounds[r] to bounds[r + 1] is rank r's.
std::vector<int64_t> even_bounds(int64_t n, int parts);

}  // namespace nabla::dist
