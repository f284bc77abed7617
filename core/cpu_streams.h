// Internal: the in-order executors behind the asynchronous CPU stream modes of DeviceContext
// (core/device.h, CpuStreams::kAsync and kLazy). Not part of the public API.
//
// A CpuStreamExecutor is what a CUDA stream is to the host: work queued on it runs later, on the
// executor's own thread, one item after another in the order queued. Every queued item gets a
// sequence number (1, 2, ...); "item s has completed" is the only fact other threads observe, so
// an event is just a (executor, sequence number) pair captured when it is recorded.
//
//   eager (kAsync): the thread runs each item as soon as it is queued and the previous one is
//     done, concurrently with the host: races between the host and the "device" are real races
//     (ThreadSanitizer sees them).
//   lazy (kLazy): the thread runs an item only once something needs it to have completed (a
//     host wait on this executor or on an event recorded after it, or a wait item of another
//     executor that runs): the latest a GPU may run queued work. A missing wait then reads
//     stale data deterministically instead of by chance.
//
// A wait of one executor on another is itself an item (WaitItem): when it runs it demands the
// other executor's work up to the captured number and blocks until it completed. Numbers are
// captured when a wait is queued, so waits cannot form a cycle.
//
// Thread-safety: every method may be called from any thread. The destructor runs everything
// still queued (as a context's destruction lets a GPU finish), then joins the thread.
#ifndef BAGPIPE_CORE_CPU_STREAMS_H_
#define BAGPIPE_CORE_CPU_STREAMS_H_

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <mutex>
#include <string>
#include <thread>

namespace bagpipe::internal {

class CpuStreamExecutor {
 public:
  CpuStreamExecutor(bool lazy, std::string name);
  ~CpuStreamExecutor();
  CpuStreamExecutor(const CpuStreamExecutor&) = delete;
  CpuStreamExecutor& operator=(const CpuStreamExecutor&) = delete;

  // Queues `work` and returns its sequence number.
  uint64_t Enqueue(std::function<void()> work);
  // The number of the last item queued (0 before the first).
  uint64_t last_queued() const;
  // True once item `seq` (and every item before it) has run. Never blocks, demands nothing.
  bool Completed(uint64_t seq) const;
  // Lets a lazy executor run items up to `seq`, and blocks until they have run.
  void WaitFor(uint64_t seq);
  // Queues an item that waits for `other`'s item `seq` (captured now).
  uint64_t EnqueueWait(CpuStreamExecutor* other, uint64_t seq);

 private:
  struct Item {
    uint64_t seq;
    std::function<void()> work;
  };
  void Loop();

  const bool lazy_;
  const std::string name_;
  mutable std::mutex mu_;
  std::condition_variable cv_;  // queue, demand and completion changes
  std::deque<Item> queue_;
  uint64_t last_queued_ = 0;
  uint64_t demanded_ = 0;   // lazy: items up to this one may run
  uint64_t completed_ = 0;  // every item up to this one has run
  bool stop_ = false;
  std::thread thread_;
};

}  // namespace bagpipe::internal

#endif  // BAGPIPE_CORE_CPU_STREAMS_H_
