// The communicator on MPI (object library nabla_mpi): the ordered folds as a chain
// of point-to-point messages, pipelined in chunks; gathers and broadcasts as
// MPI's own collectives, which move bytes without arithmetic.
#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <climits>
#include <thread>
#include <set>
#include <string>
#include <vector>

#include "dist/mpi_join.h"
#include "nabla/distributed.h"
#include "nabla/error.h"

namespace nabla::dist {

namespace {

// Elements per message of a fold's chain: large enough that per-message
// costs vanish, small enough that the ranks work on the chain side by side.
constexpr int64_t kChunk = int64_t{1} << 16;
// MPI counts are ints: larger transfers go in pieces of this many elements.
constexpr int64_t kMaxCount = int64_t{1} << 30;
constexpr int kFoldTag = 17, kPartTag = 18, kGatherTag = 19;

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
    int initialized = 0, finalized = 0;
    MPI_Initialized(&initialized);
    MPI_Finalized(&finalized);
    if (finalized) {
      throw UsageError("distributed: this process has left its job (MPI_Finalize), and MPI joins once per process");
    }
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

  void allreduce_buckets(float* buf, const std::vector<Range>& buckets, const Fold& fold,
                         const std::function<void(size_t)>& ready, const std::vector<int64_t>& bounds) override {
    int64_t n = 0;
    for (const Range& b : buckets) n = std::max(n, b.end);
    if (!bounds.empty()) check_bounds(bounds.back(), bounds, "reduce_scatter");
    if (!bounds.empty() && bounds.back() < n) throw UsageError("reduce_scatter: buckets reach past the bounds");
    const int last = size_ - 1;
    std::vector<MPI_Request> pending;
    // Elements [b, e) between the last rank and another (count-limited pieces).
    auto transfer = [&](int64_t b, int64_t e, int peer, bool send, int tag) {
      for (int64_t k = b; k < e; k += kMaxCount) {
        pending.emplace_back();
        const int count = int(std::min(kMaxCount, e - k));
        check(send ? MPI_Isend(buf + k, count, MPI_FLOAT, peer, tag, MPI_COMM_WORLD, &pending.back())
                   : MPI_Irecv(buf + k, count, MPI_FLOAT, peer, tag, MPI_COMM_WORLD, &pending.back()),
              send ? "MPI_Isend" : "MPI_Irecv");
      }
    };
    chain(buf, buckets, fold, ready, [&](const Range& bucket, std::vector<MPI_Request>& sent) {
      // The bucket's sum goes from the last rank to the others (to each its
      // own part, under bounds), once this rank's send of its running sum
      // (the same memory) is done.
      wait(sent);
      if (bounds.empty()) {
        for (int64_t b = bucket.begin; b < bucket.end; b += kMaxCount) {
          pending.emplace_back();
          check(MPI_Ibcast(buf + b, int(std::min(kMaxCount, bucket.end - b)), MPI_FLOAT, last, MPI_COMM_WORLD,
                           &pending.back()),
                "MPI_Ibcast");
        }
        return;
      }
      for (int r = 0; r < last; ++r) {
        const int64_t b = std::max(bucket.begin, bounds[size_t(r)]), e = std::min(bucket.end, bounds[size_t(r) + 1]);
        if (b >= e) continue;
        if (rank_ == last) transfer(b, e, r, true, kPartTag);
        if (rank_ == r) transfer(b, e, last, false, kPartTag);
      }
    });
    wait(pending);
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

  void gather(float* buf, const std::vector<int64_t>& bounds, int root) override {
    check_bounds(bounds.back(), bounds, "gather");
    if (root < 0 || root >= size_) {
      throw UsageError("gather: root " + std::to_string(root) + " of " + std::to_string(size_) + " ranks");
    }
    // Point to point: counts of any size, pieces of at most kMaxCount.
    std::vector<MPI_Request> requests;
    for (int r = 0; r < size_; ++r) {
      if (r == root || (rank_ != root && rank_ != r)) continue;
      for (int64_t k = bounds[size_t(r)]; k < bounds[size_t(r) + 1]; k += kMaxCount) {
        requests.emplace_back();
        const int count = int(std::min(kMaxCount, bounds[size_t(r) + 1] - k));
        check(rank_ == root ? MPI_Irecv(buf + k, count, MPI_FLOAT, r, kGatherTag, MPI_COMM_WORLD, &requests.back())
                            : MPI_Isend(buf + k, count, MPI_FLOAT, root, kGatherTag, MPI_COMM_WORLD, &requests.back()),
              "MPI_Irecv/MPI_Isend");
      }
    }
    wait(requests);
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

  // The fold in rank order: rank r receives each piece's running sum from
  // r - 1, adds its terms and passes it on; the last rank ends with the sum.
  // Buckets in order, each in pieces of kChunk; every piece's receive is
  // posted at once, so a rank folds one piece while the next are on their
  // way. done(bucket, sends) follows each bucket's pieces.
  void chain(float* buf, const std::vector<Range>& buckets, const Fold& fold, const std::function<void(size_t)>& ready,
             const std::function<void(const Range&, std::vector<MPI_Request>&)>& done) {
    std::vector<Range> pieces;
    for (const Range& bucket : buckets) {
      if (bucket.begin < 0 || bucket.end < bucket.begin) {
        throw UsageError("allreduce: bucket [" + std::to_string(bucket.begin) + ", " + std::to_string(bucket.end) + ")");
      }
      for (int64_t b = bucket.begin; b < bucket.end; b += kChunk) pieces.push_back({b, std::min(bucket.end, b + kChunk)});
    }
    std::vector<MPI_Request> received(rank_ > 0 ? pieces.size() : 0);
    for (size_t p = 0; p < received.size(); ++p) {
      check(MPI_Irecv(buf + pieces[p].begin, int(pieces[p].end - pieces[p].begin), MPI_FLOAT, rank_ - 1, kFoldTag,
                      MPI_COMM_WORLD, &received[p]),
            "MPI_Irecv");
    }
    size_t p = 0;
    for (size_t k = 0; k < buckets.size(); ++k) {
      ready(k);
      std::vector<MPI_Request> sent;
      for (int64_t b = buckets[k].begin; b < buckets[k].end; b += kChunk, ++p) {
        const Range& piece = pieces[p];
        if (rank_ > 0) wait_one(received[p]);
        fold(buf + piece.begin, piece.begin, piece.end, rank_ == 0);
        if (rank_ + 1 < size_) {
          sent.emplace_back();
          check(MPI_Isend(buf + piece.begin, int(piece.end - piece.begin), MPI_FLOAT, rank_ + 1, kFoldTag,
                          MPI_COMM_WORLD, &sent.back()),
                "MPI_Isend");
        }
      }
      done(buckets[k], sent);
    }
  }

  // Waits without holding a core: Open MPI's blocking calls poll, and this
  // thread may wait beside the threads computing the backward pass.
  static void wait(std::vector<MPI_Request>& requests) {
    for (MPI_Request& r : requests) wait_one(r);
    requests.clear();
  }
  static void wait_one(MPI_Request& request) {
    using Clock = std::chrono::steady_clock;
    const auto start = Clock::now();
    for (;;) {
      int done = 0;
      check(MPI_Test(&request, &done, MPI_STATUS_IGNORE), "MPI_Test");
      if (done) return;
      // A short spin for what is nearly there, then naps.
      // (Naps of 200 us: 50 us cost the two-process GPT-2 step 4%, waking
      // beside the backward's threads; 1 ms gained nothing more.)
      if (Clock::now() - start > std::chrono::microseconds(50)) std::this_thread::sleep_for(std::chrono::microseconds(200));
    }
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

namespace {
// Loaded with this file (an object library's, always linked whole):
// join_launched_job() joins through MPI from then on.
[[maybe_unused]] const bool registered = (mpi_join() = &mpi_communicator, true);
}  // namespace

}  // namespace nabla::dist
