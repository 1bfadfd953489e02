//! LocalWorld's async executor: one worker thread per communicator that runs the `*_async`
//! operations in call order (started on the first post, joined when the communicator dies).
//! For the strict world's deadlock detection it reports when it has work to do (`activity`):
//! +1 when a task is posted to an idle worker, -1 when the worker runs out of tasks, so a task
//! queued behind one that waits is not counted as running, and one not yet picked up is.
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
      if (queue_.empty() && !running_ && activity_) activity_(+1);
      queue_.push_back(std::move(task));
      if (!thread_.joinable()) thread_ = std::thread([this] { loop(); });
    }
    cv_.notify_all();
  }
  /// `f(+1)` when the worker gets work while idle, `f(-1)` when it runs out (set before the
  /// first post).
  void set_activity(std::function<void(int)> f) { activity_ = std::move(f); }

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
      if (queue_.empty() && activity_) activity_(-1);
    }
  }
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> queue_;
  bool running_ = false;
  bool stop_ = false;
  std::function<void(int)> activity_;
  std::thread thread_;
};

FOURWAY_END_MODE_NAMESPACE
}  // namespace fourway::detail
