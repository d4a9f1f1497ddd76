// parallel_for: coverage of the range, chunk boundaries, exceptions, nesting,
// fork/join under many quick calls, sleeps and concurrent callers, and which
// thread starts where.
#include "backend/cpu/thread_pool.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <map>
#include <mutex>
#include <set>
#include <stdexcept>
#include <thread>
#include <vector>

namespace nabla::cpu {
namespace {

constexpr int kThreadCounts[] = {1, 2, 3, 4, 8};

TEST(ThreadPool, EveryIndexOnceWithExactChunks) {
  for (int threads : kThreadCounts) {
    for (int64_t n : {0, 1, 5, 100, 1000, 12345}) {
      for (int64_t grain : {1, 3, 7, 64, 1000, 100000}) {
        SCOPED_TRACE(testing::Message()
                     << "threads=" << threads << " n=" << n << " grain=" << grain);
        std::vector<std::atomic<int>> hits(n);
        std::atomic<bool> bad_chunk{false};
        std::mutex ids_mutex;
        std::set<std::thread::id> ids;
        parallel_for(threads, n, grain, [&](int64_t begin, int64_t end) {
          // Chunk boundaries depend only on n and grain, never on the thread count.
          if (begin % grain != 0 || end != std::min(n, begin + grain)) bad_chunk = true;
          for (int64_t i = begin; i < end; ++i) hits[i].fetch_add(1);
          std::lock_guard<std::mutex> lock(ids_mutex);
          ids.insert(std::this_thread::get_id());
        });
        EXPECT_FALSE(bad_chunk);
        for (int64_t i = 0; i < n; ++i) ASSERT_EQ(hits[i].load(), 1) << "index " << i;
        const int64_t chunks = (n + grain - 1) / grain;
        EXPECT_LE(static_cast<int64_t>(ids.size()), std::min<int64_t>(threads, chunks));
      }
    }
  }
}

TEST(ThreadPool, NonPositiveGrainIsOne) {
  std::vector<std::atomic<int>> hits(10);
  parallel_for(4, 10, 0, [&](int64_t begin, int64_t end) {
    EXPECT_EQ(end, begin + 1);
    hits[begin].fetch_add(1);
  });
  for (auto& h : hits) EXPECT_EQ(h.load(), 1);
}

TEST(ThreadPool, ExceptionPropagates) {
  for (int threads : kThreadCounts) {
    SCOPED_TRACE(threads);
    EXPECT_THROW(parallel_for(threads, 100, 1,
                              [](int64_t begin, int64_t) {
                                if (begin == 37) throw std::runtime_error("chunk 37");
                              }),
                 std::runtime_error);
    // Every chunk throws: exactly one exception reaches the caller.
    try {
      parallel_for(threads, 64, 1, [](int64_t, int64_t) { throw std::logic_error("all"); });
      ADD_FAILURE() << "no exception";
    } catch (const std::logic_error& e) {
      EXPECT_STREQ(e.what(), "all");
    }
    // The pool is still usable afterwards.
    std::atomic<int64_t> sum{0};
    parallel_for(threads, 1000, 10, [&](int64_t begin, int64_t end) {
      for (int64_t i = begin; i < end; ++i) sum += i;
    });
    EXPECT_EQ(sum.load(), 999 * 1000 / 2);
  }
}

TEST(ThreadPool, NestedCallsRunInline) {
  for (int threads : kThreadCounts) {
    SCOPED_TRACE(threads);
    std::vector<std::atomic<int>> hits(8 * 100);
    parallel_for(threads, 8, 1, [&](int64_t outer, int64_t) {
      parallel_for(threads, 100, 10, [&](int64_t begin, int64_t end) {
        for (int64_t i = begin; i < end; ++i) hits[outer * 100 + i].fetch_add(1);
      });
    });
    for (auto& h : hits) ASSERT_EQ(h.load(), 1);
  }
}

TEST(ThreadPool, ManyQuickCalls) {
  for (int threads : {2, 4, 8}) {
    SCOPED_TRACE(threads);
    std::atomic<int64_t> total{0};
    for (int call = 0; call < 10000; ++call) {
      parallel_for(threads, threads, 1, [&](int64_t begin, int64_t end) { total += end - begin; });
    }
    EXPECT_EQ(total.load(), int64_t{10000} * threads);
  }
}

// Pauses between calls let the workers fall asleep, exercising the wake-up path.
TEST(ThreadPool, CallsAfterWorkersSleep) {
  for (int call = 0; call < 20; ++call) {
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
    std::atomic<int64_t> total{0};
    parallel_for(4, 100, 1, [&](int64_t begin, int64_t end) { total += end - begin; });
    ASSERT_EQ(total.load(), 100);
  }
}

TEST(ThreadPool, ConcurrentCallers) {
  std::atomic<int64_t> total{0};
  std::vector<std::thread> callers;
  for (int t = 0; t < 3; ++t) {
    callers.emplace_back([&, t] {
      for (int call = 0; call < 1000; ++call) {
        parallel_for(2 + t, 16, 2, [&](int64_t begin, int64_t end) { total += end - begin; });
      }
    });
  }
  for (auto& c : callers) c.join();
  EXPECT_EQ(total.load(), 3 * 1000 * 16);
}

// The caller runs the start of the range and a helper the start of its own
// later segment, call after call: what keeps a row kernel's rows on the core
// whose cache the previous op left them in. Chunks of 20 ms, so only a
// thread descheduled for the length of a whole segment would see another
// thread take its first chunk.
TEST(ThreadPool, EachThreadStartsItsOwnSegment) {
  for (int call = 0; call < 3; ++call) {
    std::mutex mutex;
    std::vector<std::pair<std::thread::id, int64_t>> order;
    parallel_for(2, 8, 1, [&](int64_t begin, int64_t) {
      {
        std::lock_guard<std::mutex> lock(mutex);
        order.emplace_back(std::this_thread::get_id(), begin);
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    });
    ASSERT_EQ(order.size(), 8u);
    std::map<std::thread::id, int64_t> first;
    for (const auto& [id, chunk] : order) first.emplace(id, chunk);
    EXPECT_EQ(first[std::this_thread::get_id()], 0);
    for (const auto& [id, chunk] : first) {
      if (id != std::this_thread::get_id()) {
        EXPECT_EQ(chunk, 4) << "a helper began outside its segment";
      }
    }
  }
}

TEST(ThreadPool, DefaultThreadsIsPositive) { EXPECT_GE(default_threads(), 1); }

}  // namespace
}  // namespace nabla::cpu
