//! LocalWorld's async executor: one worker thread per communicator that runs the `*_async`
//! operations in call order (started on the first post, joined when the communicator dies).
#pragma once

#include <condition_variable>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>
#include <utility>

#include "fourway/config.hpp"

// In the mode's inline namespace (config.hpp) like every part of LocalWorld: host and CUDA
// units of one program link distinct symbols, never two bodies under one name.
namespace fourway::detail {
FOURWAY_BEGIN_MODE_NAMESPACE

/// One worker thread running a communicator's async operations in order.
class LocalExecutor {
 public:
  LocalExecutor() = default;
  LocalExecutor(const LocalExecutor&) = delete;
  LocalExecutor& operator=(const LocalExecutor&) = delete;
  ~LocalExecutor() {
    {
      std::lock_guard lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    if (thread_.joinable()) thread_.join();
  }
  /// True when nothing is queued or running (only the owner posts, so this stays true).
  bool idle() {
    std::lock_guard lock(mu_);
    return queue_.empty() && !running_;
  }
  void post(std::function<void()> task) {
    {
      std::lock_guard lock(mu_);
      queue_.push_back(std::move(task));
      if (!thread_.joinable()) thread_ = std::thread([this] { loop(); });
    }
    cv_.notify_all();
  }

 private:
  void loop() {
    std::unique_lock lock(mu_);
    for (;;) {
      cv_.wait(lock, [&] { return stop_ || !queue_.empty(); });
      if (queue_.empty()) return;  // stop_ and drained
      auto task = std::move(queue_.front());
      queue_.pop_front();
      running_ = true;
      lock.unlock();
      task();  // never throws: tasks catch into their Work
      lock.lock();
      running_ = false;
    }
  }
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> queue_;
  bool running_ = false;
  bool stop_ = false;
  std::thread thread_;
};

FOURWAY_END_MODE_NAMESPACE
}  // namespace fourway::detail
