// A fixed pool of worker threads for the CPU backend's loops. parallel_for splits [0, n) into one
// contiguous chunk per thread; every output element is computed by exactly one thread in a fixed order,
// so results are bit-identical whatever the thread count.
//
//   ThreadPool pool(2);
//   pool.parallel_for(rows, [&](size_t begin, size_t end) { for (size_t r = begin; r < end; ++r) ...; });
#pragma once

#include <condition_variable>
#include <cstddef>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace gantry {

class ThreadPool {
 public:
  explicit ThreadPool(int threads);  // threads <= 0: one per hardware core
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int threads() const { return static_cast<int>(workers_.size()) + 1; }
  void parallel_for(size_t n, const std::function<void(size_t begin, size_t end)>& fn);

 private:
  void worker_main(int index);

  std::vector<std::thread> workers_;
  std::mutex mu_;
  std::condition_variable start_cv_;
  std::condition_variable done_cv_;
  const std::function<void(size_t, size_t)>* job_ = nullptr;
  size_t job_n_ = 0;
  uint64_t generation_ = 0;
  int pending_ = 0;
  bool stopping_ = false;
};

}  // namespace gantry
