// The device abstraction: which backend runs a component and the resources it runs with.
//
// Components (cache, model, prefetcher) never reach for globals: they receive a DeviceContext
// (faiss's GpuResources pattern) holding the backend, the device index, the streams and the
// library handles. A CUDA context owns three streams: `compute` (kernels and GEMMs), `copy`
// (host-to-device staging: the prefetcher's rows, the per-iteration batch data) and `comm` (the
// dense all-reduce), and a cuBLAS handle bound to the compute stream. A CPU context's "device
// memory" is aligned host memory and its kernels are CPU loops (TBB); how its streams run is its
// CpuStreams mode:
//   kSync   work runs inside the call that queues it; waits and events are no-ops (the
//           reference, and the fastest on a CPU);
//   kAsync  every stream is an in-order executor with its own thread that runs queued work
//           (copies, CPU kernels, event records, waits on other streams) after the call returned,
//           concurrently with the host, as a GPU does;
//   kLazy   as kAsync, but an executor runs queued work only once something waits for it (a host
//           synchronisation, an event, another stream's wait): the latest a GPU may run it.
// In the asynchronous modes a missing StreamWait, a host buffer reused before the copy that
// reads it ran, or device memory read before its stream finished give wrong results (kLazy:
// deterministically) or a ThreadSanitizer report, on a machine without a GPU. They also check,
// as the CUDA runtime cannot, that a thread made the context current (MakeCurrent) before using
// its streams: on CUDA such a thread would silently create a context on GPU 0.
//
// Counters: every host synchronisation (Synchronize, DeviceEvent::Synchronize, a Free, which
// synchronises like cudaFree) and every allocation and free is counted, per context and per
// calling thread, so tests and statistics can state "at most one host synchronisation per
// iteration, no allocation in the steady state".
//
// This header compiles with a plain host compiler; CUDA types appear only as opaque pointers.
// Thread-safety: a context may be shared by threads; the calls on it are thread-safe, but work
// queued on one stream from several threads is ordered only by the caller.
#ifndef BAGPIPE_CORE_DEVICE_H_
#define BAGPIPE_CORE_DEVICE_H_

#include <array>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace bagpipe {

namespace internal {
class CpuStreamExecutor;
}  // namespace internal

enum class Backend { kCpu, kCuda };

std::string_view BackendName(Backend backend);
// "cpu", "cuda" or "auto" (CUDA when a device is usable, else CPU).
absl::StatusOr<Backend> ParseBackend(std::string_view text);

// True when the CUDA backend was compiled in (BAGPIPE_CUDA=ON/AUTO found nvcc).
bool CudaCompiledIn();
// Number of usable CUDA devices; 0 when CUDA is not compiled in, or there is no driver or
// device. Never fails.
int CudaDeviceCount();
// One line describing the CUDA device (name, memory, SMs), or why there is none.
std::string CudaDeviceDescription(int device);

enum class Stream { kCompute, kCopy, kComm };
inline constexpr int kNumStreams = 3;
std::string_view StreamName(Stream stream);

// How a CPU context runs its streams (see the file comment).
enum class CpuStreams { kSync = 0, kAsync = 1, kLazy = 2 };
std::string_view CpuStreamsName(CpuStreams mode);
// "sync", "async" or "lazy".
absl::StatusOr<CpuStreams> ParseCpuStreams(std::string_view text);
// The mode of DeviceContext::Cpu(): the tunable BAGPIPE_CPU_STREAMS (core/tunables.h), unless a
// test overrode it.
CpuStreams DefaultCpuStreams();
// Tests only: makes DeviceContext::Cpu() use `mode` from now on (kSync, kAsync or kLazy), or
// the tunable again (-1). For suites that run whole jobs in several modes in one process.
void SetDefaultCpuStreamsForTesting(int mode);

class DeviceEvent;

class DeviceContext {
 public:
  // A CPU context in the default mode (DefaultCpuStreams()).
  static std::shared_ptr<DeviceContext> Cpu();
  // A CPU context in `mode`. The asynchronous modes start one executor thread per stream and
  // make the context current on the calling thread (as Cuda() does).
  static std::shared_ptr<DeviceContext> Cpu(CpuStreams mode);
  // REQUIRES: 0 <= device < CudaDeviceCount(). Creates the streams and the cuBLAS handle and
  // makes the device current on the calling thread.
  static absl::StatusOr<std::shared_ptr<DeviceContext>> Cuda(int device);
  // CPU (asynchronous modes): runs everything still queued, then stops the executors.
  ~DeviceContext();
  DeviceContext(const DeviceContext&) = delete;
  DeviceContext& operator=(const DeviceContext&) = delete;

  Backend backend() const { return backend_; }
  bool is_cuda() const { return backend_ == Backend::kCuda; }
  int device_index() const { return device_; }
  CpuStreams cpu_streams() const { return cpu_streams_; }
  // True when queued work may run after the call that queued it returned (CUDA, or a CPU
  // context in kAsync/kLazy): callers must then order streams and synchronise before the host
  // reads device memory or reuses a host buffer a queued copy reads.
  bool is_asynchronous() const { return is_cuda() || cpu_streams_ != CpuStreams::kSync; }
  std::string Describe() const;

  // cudaStream_t of the given stream; nullptr for CPU.
  void* stream(Stream which) const;
  // cublasHandle_t bound to the compute stream; nullptr for CPU. Components that change a
  // handle's state (pointer mode, atomics, workspace) create their own.
  void* cublas_handle() const { return cublas_; }

  // Makes this context's device current on the calling thread (cudaSetDevice; for a CPU
  // context in an asynchronous mode, the check the file comment describes).
  absl::Status MakeCurrent() const;
  // Blocks the host until all work queued on `which` has run. Counted.
  absl::Status Synchronize(Stream which = Stream::kCompute) const;
  // Synchronize on every stream. Counted once.
  absl::Status SynchronizeAll() const;
  // Makes future work on `waiter` wait for the work queued so far on `signaller`
  // (an event recorded on one stream and waited on by the other). Safe from several threads.
  absl::Status StreamWait(Stream waiter, Stream signaller) const;
  // Makes future work on `waiter` wait for the work `event` captured at its last Record.
  // REQUIRES: `event` belongs to this context.
  absl::Status StreamWaitEvent(Stream waiter, const DeviceEvent& event) const;
  // CUDA: Synchronize and DeviceEvent::Synchronize poll and give up after `timeout`
  // (DeadlineExceeded) instead of blocking forever on work that never finishes (a collective
  // whose peer died). Default: no limit.
  void set_sync_timeout(absl::Duration timeout);

  // Queues `kernel` on `stream` (CPU contexts: the CPU backends' kernels; kSync runs it now).
  // `kernel` must not own the context. Fails on a CUDA context.
  absl::Status Launch(Stream stream, std::function<void()> kernel) const;

  // Device memory (CPU: 64-byte aligned host memory, zero-filled in the asynchronous modes so
  // that a read before the first write is reproducible). Free accepts nullptr; it first waits
  // for every stream of the context (cudaFree synchronises the device), so memory queued work
  // still uses is never released under it.
  absl::StatusOr<void*> Allocate(size_t bytes) const;
  void Free(void* pointer) const;
  // Page-locked host memory for staging (CPU: aligned host memory). FreePinned waits for every
  // stream, as Free does.
  absl::StatusOr<void*> AllocatePinned(size_t bytes) const;
  void FreePinned(void* pointer) const;

  // Copies ordered on `stream`. In the asynchronous modes they run later: the source must stay
  // valid and unmodified, and the destination unread, until the stream has passed them
  // (an event or a synchronisation says so). kSync: memcpy.
  absl::Status CopyToDevice(void* dst, const void* src, size_t bytes,
                            Stream stream = Stream::kCompute) const;
  absl::Status CopyToHost(void* dst, const void* src, size_t bytes,
                          Stream stream = Stream::kCompute) const;
  absl::Status CopyOnDevice(void* dst, const void* src, size_t bytes,
                            Stream stream = Stream::kCompute) const;
  absl::Status Zero(void* dst, size_t bytes, Stream stream = Stream::kCompute) const;

  // Host synchronisations and allocations (Allocate/AllocatePinned with bytes > 0) and frees
  // (of non-null pointers) so far: on this context from any thread, and by the calling thread
  // on any context.
  int64_t host_syncs() const { return host_syncs_.load(std::memory_order_relaxed); }
  int64_t allocations() const { return allocations_.load(std::memory_order_relaxed); }
  static int64_t ThreadHostSyncs();
  static int64_t ThreadAllocations();

 private:
  friend class DeviceEvent;
  DeviceContext(Backend backend, int device, CpuStreams cpu_streams);
  // Asynchronous CPU modes: fails unless the calling thread made this context current.
  absl::Status CheckCurrent(const char* op) const;
  internal::CpuStreamExecutor* executor(Stream which) const;
  void CountSync() const;
  void CountAllocation() const;
  absl::Status WaitForCudaStream(void* stream) const;

  const Backend backend_;
  const int device_;
  const CpuStreams cpu_streams_;
  std::array<std::unique_ptr<internal::CpuStreamExecutor>, kNumStreams> executors_;
  std::array<void*, kNumStreams> streams_ = {};
  void* cublas_ = nullptr;
  // StreamWait's events, one per signalling stream; the record and the wait happen under
  // `wait_mu_` so that two threads never interleave on one event.
  std::array<void*, kNumStreams> wait_events_ = {};
  mutable std::mutex wait_mu_;
  std::atomic<int64_t> sync_timeout_us_{-1};
  mutable std::atomic<int64_t> host_syncs_{0};
  mutable std::atomic<int64_t> allocations_{0};
};

// A point in a stream's work (cudaEvent_t; a CPU context's executor position). Record captures
// the work queued so far on a stream; waits and queries refer to the last Record. Created once
// and reused (no allocation per record). Movable, not copyable; not thread-safe (one owner).
class DeviceEvent {
 public:
  DeviceEvent() = default;
  // `timing`: the event can be used with ElapsedMs (CUDA: without cudaEventDisableTiming; CPU:
  // the time the stream reached the record).
  static absl::StatusOr<DeviceEvent> Create(std::shared_ptr<DeviceContext> context,
                                            bool timing = false);
  ~DeviceEvent();
  DeviceEvent(DeviceEvent&& other) noexcept;
  DeviceEvent& operator=(DeviceEvent&& other) noexcept;
  DeviceEvent(const DeviceEvent&) = delete;
  DeviceEvent& operator=(const DeviceEvent&) = delete;

  bool valid() const { return context_ != nullptr; }
  const std::shared_ptr<DeviceContext>& context() const { return context_; }
  absl::Status Record(Stream stream);
  // True when the work of the last Record has run (and before any Record). Never blocks and,
  // in kLazy, demands nothing.
  absl::StatusOr<bool> Query() const;
  // Blocks the host until the work of the last Record has run. Counted as a host sync.
  absl::Status Synchronize() const;
  // Milliseconds from `start` to `end` (both timing events of one context, recorded and
  // complete).
  static absl::StatusOr<double> ElapsedMs(const DeviceEvent& start, const DeviceEvent& end);

 private:
  friend class DeviceContext;
  std::shared_ptr<DeviceContext> context_;
  bool timing_ = false;
  void* cuda_event_ = nullptr;
  // CPU: the executor and sequence number of the last Record (executor null: none or kSync),
  // and, for timing events, where the executor writes the time it got there.
  internal::CpuStreamExecutor* executor_ = nullptr;
  uint64_t seq_ = 0;
  std::shared_ptr<std::atomic<int64_t>> cpu_time_ns_;
};

// An owned, typed array in a context's device memory (RAII over Allocate/Free). Movable.
template <typename T>
class DeviceArray {
 public:
  DeviceArray() = default;
  static absl::StatusOr<DeviceArray<T>> Create(std::shared_ptr<DeviceContext> context,
                                               size_t size) {
    DeviceArray<T> array;
    array.context_ = std::move(context);
    array.size_ = size;
    if (size > 0) {
      auto pointer = array.context_->Allocate(size * sizeof(T));
      if (!pointer.ok()) return pointer.status();
      array.data_ = static_cast<T*>(*pointer);
    }
    return array;
  }
  ~DeviceArray() { Reset(); }
  DeviceArray(DeviceArray&& other) noexcept { *this = std::move(other); }
  DeviceArray& operator=(DeviceArray&& other) noexcept {
    if (this != &other) {
      Reset();
      context_ = std::move(other.context_);
      data_ = other.data_;
      size_ = other.size_;
      other.data_ = nullptr;
      other.size_ = 0;
    }
    return *this;
  }
  DeviceArray(const DeviceArray&) = delete;
  DeviceArray& operator=(const DeviceArray&) = delete;

  T* data() { return data_; }
  const T* data() const { return data_; }
  size_t size() const { return size_; }
  size_t bytes() const { return size_ * sizeof(T); }
  bool empty() const { return size_ == 0; }

  void Reset() {
    if (data_ != nullptr) context_->Free(data_);
    data_ = nullptr;
    size_ = 0;
  }

 private:
  std::shared_ptr<DeviceContext> context_;
  T* data_ = nullptr;
  size_t size_ = 0;
};

}  // namespace bagpipe

#endif  // BAGPIPE_CORE_DEVICE_H_
