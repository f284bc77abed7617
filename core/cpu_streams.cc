#include "core/cpu_streams.h"

#include <algorithm>
#include <limits>
#include <utility>

namespace bagpipe::internal {

CpuStreamExecutor::CpuStreamExecutor(bool lazy, std::string name)
    : lazy_(lazy), name_(std::move(name)) {
  thread_ = std::thread([this] { Loop(); });
}

CpuStreamExecutor::~CpuStreamExecutor() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
    demanded_ = std::numeric_limits<uint64_t>::max();
  }
  cv_.notify_all();
  thread_.join();
}

uint64_t CpuStreamExecutor::Enqueue(std::function<void()> work) {
  uint64_t seq;
  {
    std::lock_guard<std::mutex> lock(mu_);
    seq = ++last_queued_;
    queue_.push_back(Item{seq, std::move(work)});
  }
  if (!lazy_) cv_.notify_all();
  return seq;
}

uint64_t CpuStreamExecutor::last_queued() const {
  std::lock_guard<std::mutex> lock(mu_);
  return last_queued_;
}

bool CpuStreamExecutor::Completed(uint64_t seq) const {
  std::lock_guard<std::mutex> lock(mu_);
  return completed_ >= seq;
}

void CpuStreamExecutor::WaitFor(uint64_t seq) {
  std::unique_lock<std::mutex> lock(mu_);
  if (completed_ >= seq) return;
  if (demanded_ < seq) {
    demanded_ = seq;
    cv_.notify_all();
  }
  cv_.wait(lock, [&] { return completed_ >= seq; });
}

uint64_t CpuStreamExecutor::EnqueueWait(CpuStreamExecutor* other, uint64_t seq) {
  if (other == this || seq == 0) {
    // In-order execution already orders an executor after its own earlier items.
    return Enqueue([] {});
  }
  return Enqueue([other, seq] { other->WaitFor(seq); });
}

void CpuStreamExecutor::Loop() {
  std::unique_lock<std::mutex> lock(mu_);
  while (true) {
    cv_.wait(lock, [&] {
      return (!queue_.empty() && (!lazy_ || queue_.front().seq <= demanded_)) ||
             (stop_ && queue_.empty());
    });
    if (queue_.empty()) return;  // stopping, and everything ran
    Item item = std::move(queue_.front());
    queue_.pop_front();
    lock.unlock();
    item.work();
    item.work = nullptr;  // captured state is released before completion is announced
    lock.lock();
    completed_ = item.seq;
    cv_.notify_all();
  }
}

}  // namespace bagpipe::internal
