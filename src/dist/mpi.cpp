// The communicator on MPI (library nabla_mpi): the ordered folds as a chain
// of point-to-point messages, pipelined in chunks; gathers and broadcasts as
// MPI's own collectives, which move bytes without arithmetic.
#include <mpi.h>

#include <algorithm>
#include <climits>
#include <set>
#include <string>
#include <vector>

#include "nabla/distributed.h"
#include "nabla/error.h"

namespace nabla::dist {

namespace {

// Elements per message of a fold's chain: large enough that per-message
// costs vanish, small enough that the ranks work on the chain side by side.
constexpr int64_t kChunk = int64_t{1} << 16;
// MPI counts are ints: larger transfers go in pieces of this many elements.
constexpr int64_t kMaxCount = int64_t{1} << 30;
constexpr int kFoldTag = 17, kPartTag = 18;

void check(int status, const char* call) {
  if (status == MPI_SUCCESS) return;
  char text[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(status, text, &len);
  throw DistributedError(std::string("distributed: ") + call + " failed: " + std::string(text, size_t(len)));
}

class MpiCommunicator final : public Communicator {
 public:
  MpiCommunicator() {
    int initialized = 0;
    MPI_Initialized(&initialized);
    if (!initialized) {
      int provided = 0;
      // One thread at a time calls MPI (the training loop's).
      check(MPI_Init_thread(nullptr, nullptr, MPI_THREAD_SERIALIZED, &provided), "MPI_Init_thread");
      owns_ = true;
    }
    MPI_Comm_rank(MPI_COMM_WORLD, &rank_);
    MPI_Comm_size(MPI_COMM_WORLD, &size_);
    describe_job();
  }
  ~MpiCommunicator() override {
    if (owns_) MPI_Finalize();
  }

  int rank() const override { return rank_; }
  int size() const override { return size_; }

  std::string describe() const override { return description_; }

  void allreduce(float* buf, int64_t n, const Fold& fold) override {
    chain(buf, n, fold);
    // The last rank holds the sum: everyone gets a copy.
    for (int64_t b = 0; b < n; b += kMaxCount) {
      check(MPI_Bcast(buf + b, int(std::min(kMaxCount, n - b)), MPI_FLOAT, size_ - 1, MPI_COMM_WORLD), "MPI_Bcast");
    }
  }

  void reduce_scatter(float* buf, int64_t n, const Fold& fold, const std::vector<int64_t>& bounds) override {
    check_bounds(n, bounds, "reduce_scatter");
    chain(buf, n, fold);
    const int last = size_ - 1;
    std::vector<MPI_Request> requests;
    for (int r = 0; r < last; ++r) {
      const int64_t b = bounds[size_t(r)], e = bounds[size_t(r) + 1];
      if (rank_ != last && rank_ != r) continue;
      for (int64_t k = b; k < e; k += kMaxCount) {
        requests.emplace_back();
        const int count = int(std::min(kMaxCount, e - k));
        if (rank_ == last) {
          check(MPI_Isend(buf + k, count, MPI_FLOAT, r, kPartTag, MPI_COMM_WORLD, &requests.back()), "MPI_Isend");
        } else {
          check(MPI_Irecv(buf + k, count, MPI_FLOAT, last, kPartTag, MPI_COMM_WORLD, &requests.back()), "MPI_Irecv");
        }
      }
    }
    check(MPI_Waitall(int(requests.size()), requests.data(), MPI_STATUSES_IGNORE), "MPI_Waitall");
  }

  void all_gather(float* buf, const std::vector<int64_t>& bounds) override {
    check_bounds(bounds.back(), bounds, "all_gather");
    if (bounds.back() >= INT_MAX) throw UsageError("all_gather: " + std::to_string(bounds.back()) + " elements exceed MPI's counts");
    std::vector<int> counts(static_cast<size_t>(size_)), displs(static_cast<size_t>(size_));
    for (int r = 0; r < size_; ++r) {
      displs[size_t(r)] = int(bounds[size_t(r)]);
      counts[size_t(r)] = int(bounds[size_t(r) + 1] - bounds[size_t(r)]);
    }
    check(MPI_Allgatherv(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, buf, counts.data(), displs.data(), MPI_FLOAT,
                         MPI_COMM_WORLD),
          "MPI_Allgatherv");
  }

  void all_gather_bytes(const void* mine, void* all, size_t bytes) override {
    if (bytes > size_t(INT_MAX)) throw UsageError("all_gather_bytes: " + std::to_string(bytes) + " bytes exceed MPI's counts");
    check(MPI_Allgather(mine, int(bytes), MPI_BYTE, all, int(bytes), MPI_BYTE, MPI_COMM_WORLD), "MPI_Allgather");
  }

  void broadcast(void* data, size_t bytes, int root) override {
    if (root < 0 || root >= size_) {
      throw UsageError("broadcast: root " + std::to_string(root) + " of " + std::to_string(size_) + " ranks");
    }
    auto* p = static_cast<char*>(data);
    for (size_t b = 0; b < bytes; b += size_t(kMaxCount)) {
      check(MPI_Bcast(p + b, int(std::min(size_t(kMaxCount), bytes - b)), MPI_BYTE, root, MPI_COMM_WORLD),
            "MPI_Bcast");
    }
  }

  void barrier() override { check(MPI_Barrier(MPI_COMM_WORLD), "MPI_Barrier"); }

 private:
  void check_bounds(int64_t n, const std::vector<int64_t>& bounds, const char* what) const {
    bool ok = bounds.size() == size_t(size_) + 1 && bounds.front() == 0 && bounds.back() == n;
    for (size_t i = 1; ok && i < bounds.size(); ++i) ok = bounds[i - 1] <= bounds[i];
    if (!ok) {
      throw UsageError(std::string(what) + ": bounds must rise from 0 to " + std::to_string(n) + " in " +
                       std::to_string(size_ + 1) + " entries");
    }
  }

  // The fold in rank order: rank r receives each chunk's running sum from
  // r - 1, adds its terms and passes it on; the last rank ends with the sum.
  // Every chunk's receive is posted at once, so a rank folds chunk c while
  // the next ones are on their way.
  void chain(float* buf, int64_t n, const Fold& fold) {
    if (n < 0) throw UsageError("allreduce: negative length " + std::to_string(n));
    const int64_t chunks = (n + kChunk - 1) / kChunk;
    std::vector<MPI_Request> received(size_t(rank_ > 0 ? chunks : 0)), sent;
    for (int64_t c = 0; rank_ > 0 && c < chunks; ++c) {
      const int64_t b = c * kChunk;
      check(MPI_Irecv(buf + b, int(std::min(kChunk, n - b)), MPI_FLOAT, rank_ - 1, kFoldTag, MPI_COMM_WORLD,
                      &received[size_t(c)]),
            "MPI_Irecv");
    }
    for (int64_t c = 0; c < chunks; ++c) {
      const int64_t b = c * kChunk, e = std::min(n, b + kChunk);
      if (rank_ > 0) check(MPI_Wait(&received[size_t(c)], MPI_STATUS_IGNORE), "MPI_Wait");
      fold(buf + b, b, e, rank_ == 0);
      if (rank_ + 1 < size_) {
        sent.emplace_back();
        check(MPI_Isend(buf + b, int(e - b), MPI_FLOAT, rank_ + 1, kFoldTag, MPI_COMM_WORLD, &sent.back()),
              "MPI_Isend");
      }
    }
    check(MPI_Waitall(int(sent.size()), sent.data(), MPI_STATUSES_IGNORE), "MPI_Waitall");
  }

  // "MPI (Open MPI v4.1.4), 2 processes on 1 host": the hosts counted once,
  // here, where every rank takes part.
  void describe_job() {
    char version[MPI_MAX_LIBRARY_VERSION_STRING];
    int len = 0;
    MPI_Get_library_version(version, &len);
    std::string lib(version, size_t(len));
    lib = lib.substr(0, lib.find_first_of(",\n"));
    char host[MPI_MAX_PROCESSOR_NAME] = {};
    MPI_Get_processor_name(host, &len);
    std::vector<char> hosts(size_t(size_) * MPI_MAX_PROCESSOR_NAME);
    check(MPI_Allgather(host, MPI_MAX_PROCESSOR_NAME, MPI_CHAR, hosts.data(), MPI_MAX_PROCESSOR_NAME, MPI_CHAR,
                        MPI_COMM_WORLD),
          "MPI_Allgather");
    std::set<std::string> distinct;
    for (int r = 0; r < size_; ++r) distinct.insert(std::string(hosts.data() + size_t(r) * MPI_MAX_PROCESSOR_NAME));
    description_ = "MPI (" + lib + "), " + std::to_string(size_) + " processes on " + std::to_string(distinct.size()) +
                   (distinct.size() == 1 ? " host" : " hosts");
  }

  int rank_ = 0, size_ = 1;
  bool owns_ = false;
  std::string description_;
};

}  // namespace

std::unique_ptr<Communicator> mpi_communicator() { return std::make_unique<MpiCommunicator>(); }

}  // namespace nabla::dist
