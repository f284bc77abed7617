#include "core/device.h"

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <thread>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "core/cpu_streams.h"
#include "core/excerpt.h"
#include "core/logging.h"
#include "core/status.h"
#include "core/tunables.h"

#if BAGPIPE_WITH_CUDA
#include "core/cuda_checks.h"
#endif

namespace bagpipe {
namespace {

constexpr size_t kHostAlignment = 64;

absl::StatusOr<void*> AllocateHost(size_t bytes, bool zero) {
  if (bytes == 0) return nullptr;
  const size_t rounded = (bytes + kHostAlignment - 1) / kHostAlignment * kHostAlignment;
  void* pointer = std::aligned_alloc(kHostAlignment, rounded);
  if (pointer == nullptr) {
    return absl::ResourceExhaustedError(
        absl::StrCat("host allocation of ", bytes, " bytes failed"));
  }
  if (zero) std::memset(pointer, 0, rounded);
  return pointer;
}

// Per-thread counters (DeviceContext::ThreadHostSyncs, ThreadAllocations) and, for CPU contexts
// in an asynchronous mode, the device the thread made current (-1: none).
thread_local int64_t tls_host_syncs = 0;
thread_local int64_t tls_allocations = 0;
thread_local int tls_cpu_device = -1;

int64_t NowNanos() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

#if BAGPIPE_WITH_CUDA
cudaStream_t AsStream(void* stream) { return static_cast<cudaStream_t>(stream); }
cudaEvent_t AsEvent(void* event) { return static_cast<cudaEvent_t>(event); }

// Polls `done` (a cudaStreamQuery or cudaEventQuery) until it stops answering cudaErrorNotReady
// or `timeout_us` (>= 0) passes.
template <typename Query>
absl::Status PollUntilDone(const Query& done, int64_t timeout_us, const char* what) {
  const absl::Time deadline = absl::Now() + absl::Microseconds(timeout_us);
  while (true) {
    const cudaError_t rc = done();
    if (rc == cudaSuccess) return absl::OkStatus();
    if (rc != cudaErrorNotReady) {
      return internal::CudaStatus(rc, what, __FILE__, __LINE__);
    }
    if (absl::Now() >= deadline) {
      return absl::DeadlineExceededError(
          absl::StrCat(what, ": the device did not finish the queued work within ",
                       absl::FormatDuration(absl::Microseconds(timeout_us)),
                       " (a collective whose peer died or hung?)"));
    }
    std::this_thread::yield();
  }
}
#endif

}  // namespace

std::string_view BackendName(Backend backend) { return backend == Backend::kCuda ? "cuda" : "cpu"; }

absl::StatusOr<Backend> ParseBackend(std::string_view text) {
  const std::string t = absl::AsciiStrToLower(std::string(text));
  if (t == "cpu") return Backend::kCpu;
  if (t == "cuda" || t == "gpu") {
    if (!CudaCompiledIn()) {
      return absl::FailedPreconditionError(
          "--device cuda: this build has no CUDA backend (configure with -DBAGPIPE_CUDA=ON)");
    }
    if (CudaDeviceCount() == 0) {
      return absl::FailedPreconditionError(
          absl::StrCat("--device cuda: no usable CUDA device (", CudaDeviceDescription(0), ")"));
    }
    return Backend::kCuda;
  }
  if (t == "auto") return CudaDeviceCount() > 0 ? Backend::kCuda : Backend::kCpu;
  return absl::InvalidArgumentError(
      absl::StrCat("unknown device '", Excerpt(absl::string_view(text.data(), text.size())),
                   "' (expected cpu, cuda or auto)"));
}

bool CudaCompiledIn() {
#if BAGPIPE_WITH_CUDA
  return true;
#else
  return false;
#endif
}

int CudaDeviceCount() {
#if BAGPIPE_WITH_CUDA
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    cudaGetLastError();  // clear the sticky "no driver" error
    return 0;
  }
  return count;
#else
  return 0;
#endif
}

std::string CudaDeviceDescription(int device) {
#if BAGPIPE_WITH_CUDA
  int count = 0;
  const cudaError_t rc = cudaGetDeviceCount(&count);
  if (rc != cudaSuccess) {
    cudaGetLastError();
    return absl::StrCat("CUDA reports: ", cudaGetErrorString(rc));
  }
  if (device >= count) return absl::StrCat("CUDA sees ", count, " device(s)");
  cudaDeviceProp prop;
  if (cudaGetDeviceProperties(&prop, device) != cudaSuccess) return "device properties unavailable";
  return absl::StrFormat("%s, %.1f GiB, %d SMs, compute capability %d.%d", prop.name,
                         prop.totalGlobalMem / double(1 << 30), prop.multiProcessorCount,
                         prop.major, prop.minor);
#else
  return "built without CUDA";
#endif
}

std::string_view StreamName(Stream stream) {
  switch (stream) {
    case Stream::kCompute:
      return "compute";
    case Stream::kCopy:
      return "copy";
    case Stream::kComm:
      return "comm";
  }
  return "?";
}

std::string_view CpuStreamsName(CpuStreams mode) {
  switch (mode) {
    case CpuStreams::kSync:
      return "sync";
    case CpuStreams::kAsync:
      return "async";
    case CpuStreams::kLazy:
      return "lazy";
  }
  return "?";
}

absl::StatusOr<CpuStreams> ParseCpuStreams(std::string_view text) {
  const std::string t = absl::AsciiStrToLower(std::string(text));
  if (t == "sync" || t == "0") return CpuStreams::kSync;
  if (t == "async" || t == "1") return CpuStreams::kAsync;
  if (t == "lazy" || t == "2") return CpuStreams::kLazy;
  return absl::InvalidArgumentError(absl::StrCat(
      "unknown CPU stream mode '", Excerpt(absl::string_view(text.data(), text.size())),
      "' (expected sync, async or lazy)"));
}

namespace {
std::atomic<int> default_cpu_streams_override{-1};
}  // namespace

void SetDefaultCpuStreamsForTesting(int mode) {
  default_cpu_streams_override.store(mode, std::memory_order_relaxed);
}

CpuStreams DefaultCpuStreams() {
  const int override_mode = default_cpu_streams_override.load(std::memory_order_relaxed);
  if (override_mode >= 0 && override_mode <= 2) return static_cast<CpuStreams>(override_mode);
  static const CpuStreams mode = [] {
    const int64_t value = CpuStreamsMode();
    if (value < 0 || value > 2) {
      BAGPIPE_LOG(WARNING) << "BAGPIPE_CPU_STREAMS=" << value
                           << " is not 0 (sync), 1 (async) or 2 (lazy); using sync";
      return CpuStreams::kSync;
    }
    return static_cast<CpuStreams>(value);
  }();
  return mode;
}

DeviceContext::DeviceContext(Backend backend, int device, CpuStreams cpu_streams)
    : backend_(backend), device_(device), cpu_streams_(cpu_streams) {}

std::shared_ptr<DeviceContext> DeviceContext::Cpu() { return Cpu(DefaultCpuStreams()); }

std::shared_ptr<DeviceContext> DeviceContext::Cpu(CpuStreams mode) {
  std::shared_ptr<DeviceContext> context(new DeviceContext(Backend::kCpu, 0, mode));
  if (mode != CpuStreams::kSync) {
    for (int s = 0; s < kNumStreams; ++s) {
      context->executors_[s] = std::make_unique<internal::CpuStreamExecutor>(
          mode == CpuStreams::kLazy, std::string(StreamName(static_cast<Stream>(s))));
    }
    tls_cpu_device = context->device_;
  }
  return context;
}

absl::StatusOr<std::shared_ptr<DeviceContext>> DeviceContext::Cuda(int device) {
#if BAGPIPE_WITH_CUDA
  if (device < 0 || device >= CudaDeviceCount()) {
    return absl::FailedPreconditionError(
        absl::StrCat("CUDA device ", device, " is not available: ", CudaDeviceDescription(device)));
  }
  std::shared_ptr<DeviceContext> context(
      new DeviceContext(Backend::kCuda, device, CpuStreams::kSync));
  CUDA_RETURN_IF_ERROR(cudaSetDevice(device));
  for (int s = 0; s < kNumStreams; ++s) {
    cudaStream_t stream;
    CUDA_RETURN_IF_ERROR(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    context->streams_[s] = stream;
    cudaEvent_t event;
    CUDA_RETURN_IF_ERROR(cudaEventCreateWithFlags(&event, cudaEventDisableTiming));
    context->wait_events_[s] = event;
  }
  cublasHandle_t handle;
  CUBLAS_RETURN_IF_ERROR(cublasCreate(&handle));
  context->cublas_ = handle;
  CUBLAS_RETURN_IF_ERROR(cublasSetStream(handle, AsStream(context->streams_[0])));
  return context;
#else
  return absl::FailedPreconditionError("built without CUDA (configure with -DBAGPIPE_CUDA=ON)");
#endif
}

DeviceContext::~DeviceContext() {
  if (executors_[0] != nullptr) {
    // Let every queued item run before any executor goes: an item of one may wait for another.
    for (auto& executor : executors_) executor->WaitFor(executor->last_queued());
    for (auto& executor : executors_) executor.reset();
  }
#if BAGPIPE_WITH_CUDA
  if (backend_ == Backend::kCuda) {
    cudaSetDevice(device_);
    if (cublas_) cublasDestroy(static_cast<cublasHandle_t>(cublas_));
    for (void* event : wait_events_) {
      if (event) cudaEventDestroy(AsEvent(event));
    }
    for (void* stream : streams_) {
      if (stream) cudaStreamDestroy(AsStream(stream));
    }
  }
#endif
}

std::string DeviceContext::Describe() const {
  if (backend_ == Backend::kCpu) {
    return cpu_streams_ == CpuStreams::kSync
               ? "cpu"
               : absl::StrCat("cpu (", std::string(CpuStreamsName(cpu_streams_)), " streams)");
  }
  return absl::StrCat("cuda:", device_, " (", CudaDeviceDescription(device_), ")");
}

void* DeviceContext::stream(Stream which) const { return streams_[static_cast<int>(which)]; }

internal::CpuStreamExecutor* DeviceContext::executor(Stream which) const {
  return executors_[static_cast<int>(which)].get();
}

void DeviceContext::CountSync() const {
  host_syncs_.fetch_add(1, std::memory_order_relaxed);
  ++tls_host_syncs;
}

void DeviceContext::CountAllocation() const {
  allocations_.fetch_add(1, std::memory_order_relaxed);
  ++tls_allocations;
}

int64_t DeviceContext::ThreadHostSyncs() { return tls_host_syncs; }
int64_t DeviceContext::ThreadAllocations() { return tls_allocations; }

absl::Status DeviceContext::CheckCurrent(const char* op) const {
  if (backend_ != Backend::kCpu || cpu_streams_ == CpuStreams::kSync) return absl::OkStatus();
  if (tls_cpu_device == device_) return absl::OkStatus();
  return absl::FailedPreconditionError(absl::StrCat(
      "DeviceContext::", op,
      " on a thread that did not make the context current "
      "(DeviceContext::MakeCurrent); on CUDA that thread would create a context on GPU 0"));
}

absl::Status DeviceContext::MakeCurrent() const {
#if BAGPIPE_WITH_CUDA
  if (is_cuda()) CUDA_RETURN_IF_ERROR(cudaSetDevice(device_));
#endif
  if (!is_cuda()) tls_cpu_device = device_;
  return absl::OkStatus();
}

void DeviceContext::set_sync_timeout(absl::Duration timeout) {
  sync_timeout_us_.store(
      timeout == absl::InfiniteDuration() ? -1 : absl::ToInt64Microseconds(timeout),
      std::memory_order_relaxed);
}

absl::Status DeviceContext::WaitForCudaStream(void* stream) const {
#if BAGPIPE_WITH_CUDA
  const int64_t timeout_us = sync_timeout_us_.load(std::memory_order_relaxed);
  if (timeout_us < 0) {
    CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(AsStream(stream)));
    return absl::OkStatus();
  }
  return PollUntilDone([&] { return cudaStreamQuery(AsStream(stream)); }, timeout_us,
                       "cudaStreamQuery");
#else
  return absl::OkStatus();
#endif
}

absl::Status DeviceContext::Synchronize(Stream which) const {
  CountSync();
  if (is_cuda()) {
#if BAGPIPE_WITH_CUDA
    CUDA_RETURN_IF_ERROR(cudaSetDevice(device_));
#endif
    return WaitForCudaStream(stream(which));
  }
  if (cpu_streams_ == CpuStreams::kSync) return absl::OkStatus();
  RETURN_IF_ERROR(CheckCurrent("Synchronize"));
  internal::CpuStreamExecutor* e = executor(which);
  e->WaitFor(e->last_queued());
  return absl::OkStatus();
}

absl::Status DeviceContext::SynchronizeAll() const {
  CountSync();
  if (is_cuda()) {
#if BAGPIPE_WITH_CUDA
    CUDA_RETURN_IF_ERROR(cudaSetDevice(device_));
#endif
    for (void* s : streams_) RETURN_IF_ERROR(WaitForCudaStream(s));
    return absl::OkStatus();
  }
  if (cpu_streams_ == CpuStreams::kSync) return absl::OkStatus();
  RETURN_IF_ERROR(CheckCurrent("SynchronizeAll"));
  for (const auto& e : executors_) e->WaitFor(e->last_queued());
  return absl::OkStatus();
}

absl::Status DeviceContext::StreamWait(Stream waiter, Stream signaller) const {
  if (waiter == signaller) return absl::OkStatus();
#if BAGPIPE_WITH_CUDA
  if (is_cuda()) {
    std::lock_guard<std::mutex> lock(wait_mu_);
    auto event = AsEvent(wait_events_[static_cast<int>(signaller)]);
    CUDA_RETURN_IF_ERROR(cudaEventRecord(event, AsStream(stream(signaller))));
    CUDA_RETURN_IF_ERROR(cudaStreamWaitEvent(AsStream(stream(waiter)), event, 0));
    return absl::OkStatus();
  }
#endif
  if (cpu_streams_ == CpuStreams::kSync) return absl::OkStatus();
  RETURN_IF_ERROR(CheckCurrent("StreamWait"));
  internal::CpuStreamExecutor* s = executor(signaller);
  executor(waiter)->EnqueueWait(s, s->last_queued());
  return absl::OkStatus();
}

absl::Status DeviceContext::StreamWaitEvent(Stream waiter, const DeviceEvent& event) const {
  if (event.context_.get() != this) {
    return absl::InvalidArgumentError("StreamWaitEvent: the event belongs to another context");
  }
#if BAGPIPE_WITH_CUDA
  if (is_cuda()) {
    CUDA_RETURN_IF_ERROR(
        cudaStreamWaitEvent(AsStream(stream(waiter)), AsEvent(event.cuda_event_), 0));
    return absl::OkStatus();
  }
#endif
  if (cpu_streams_ == CpuStreams::kSync) return absl::OkStatus();
  RETURN_IF_ERROR(CheckCurrent("StreamWaitEvent"));
  if (event.executor_ != nullptr) executor(waiter)->EnqueueWait(event.executor_, event.seq_);
  return absl::OkStatus();
}

absl::Status DeviceContext::Launch(Stream stream_kind, std::function<void()> kernel) const {
  if (is_cuda()) {
    return absl::FailedPreconditionError("DeviceContext::Launch runs CPU kernels only");
  }
  if (cpu_streams_ == CpuStreams::kSync) {
    kernel();
    return absl::OkStatus();
  }
  RETURN_IF_ERROR(CheckCurrent("Launch"));
  executor(stream_kind)->Enqueue(std::move(kernel));
  return absl::OkStatus();
}

absl::StatusOr<void*> DeviceContext::Allocate(size_t bytes) const {
  if (bytes == 0) return nullptr;
  CountAllocation();
#if BAGPIPE_WITH_CUDA
  if (is_cuda()) {
    void* pointer = nullptr;
    CUDA_RETURN_IF_ERROR(cudaSetDevice(device_));
    CUDA_RETURN_IF_ERROR(cudaMalloc(&pointer, bytes));
    return pointer;
  }
#endif
  // As cudaSetDevice above: allocating makes the device current.
  if (cpu_streams_ != CpuStreams::kSync) tls_cpu_device = device_;
  return AllocateHost(bytes, /*zero=*/cpu_streams_ != CpuStreams::kSync);
}

void DeviceContext::Free(void* pointer) const {
  if (pointer == nullptr) return;
  CountAllocation();
  CountSync();
#if BAGPIPE_WITH_CUDA
  if (is_cuda()) {
    cudaSetDevice(device_);
    cudaFree(pointer);
    return;
  }
#endif
  for (const auto& e : executors_) {
    if (e != nullptr) e->WaitFor(e->last_queued());
  }
  std::free(pointer);
}

absl::StatusOr<void*> DeviceContext::AllocatePinned(size_t bytes) const {
  if (bytes == 0) return nullptr;
  CountAllocation();
#if BAGPIPE_WITH_CUDA
  if (is_cuda()) {
    void* pointer = nullptr;
    // Without this, a thread that never chose a device would create a context on GPU 0.
    CUDA_RETURN_IF_ERROR(cudaSetDevice(device_));
    CUDA_RETURN_IF_ERROR(cudaMallocHost(&pointer, bytes));
    return pointer;
  }
#endif
  if (cpu_streams_ != CpuStreams::kSync) tls_cpu_device = device_;
  return AllocateHost(bytes, /*zero=*/cpu_streams_ != CpuStreams::kSync);
}

void DeviceContext::FreePinned(void* pointer) const {
  if (pointer == nullptr) return;
  CountAllocation();
  CountSync();
#if BAGPIPE_WITH_CUDA
  if (is_cuda()) {
    cudaSetDevice(device_);
    cudaFreeHost(pointer);
    return;
  }
#endif
  for (const auto& e : executors_) {
    if (e != nullptr) e->WaitFor(e->last_queued());
  }
  std::free(pointer);
}

absl::Status DeviceContext::CopyToDevice(void* dst, const void* src, size_t bytes,
                                         Stream stream_kind) const {
  if (bytes == 0) return absl::OkStatus();
#if BAGPIPE_WITH_CUDA
  if (is_cuda()) {
    CUDA_RETURN_IF_ERROR(
        cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, AsStream(stream(stream_kind))));
    return absl::OkStatus();
  }
#endif
  return Launch(stream_kind, [dst, src, bytes] { std::memcpy(dst, src, bytes); });
}

absl::Status DeviceContext::CopyToHost(void* dst, const void* src, size_t bytes,
                                       Stream stream_kind) const {
  if (bytes == 0) return absl::OkStatus();
#if BAGPIPE_WITH_CUDA
  if (is_cuda()) {
    CUDA_RETURN_IF_ERROR(
        cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, AsStream(stream(stream_kind))));
    return absl::OkStatus();
  }
#endif
  return Launch(stream_kind, [dst, src, bytes] { std::memcpy(dst, src, bytes); });
}

absl::Status DeviceContext::CopyOnDevice(void* dst, const void* src, size_t bytes,
                                         Stream stream_kind) const {
  if (bytes == 0) return absl::OkStatus();
#if BAGPIPE_WITH_CUDA
  if (is_cuda()) {
    CUDA_RETURN_IF_ERROR(
        cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, AsStream(stream(stream_kind))));
    return absl::OkStatus();
  }
#endif
  return Launch(stream_kind, [dst, src, bytes] { std::memmove(dst, src, bytes); });
}

absl::Status DeviceContext::Zero(void* dst, size_t bytes, Stream stream_kind) const {
  if (bytes == 0) return absl::OkStatus();
#if BAGPIPE_WITH_CUDA
  if (is_cuda()) {
    CUDA_RETURN_IF_ERROR(cudaMemsetAsync(dst, 0, bytes, AsStream(stream(stream_kind))));
    return absl::OkStatus();
  }
#endif
  return Launch(stream_kind, [dst, bytes] { std::memset(dst, 0, bytes); });
}

// --- DeviceEvent ---------------------------------------------------------------------------

absl::StatusOr<DeviceEvent> DeviceEvent::Create(std::shared_ptr<DeviceContext> context,
                                                bool timing) {
  if (context == nullptr) return absl::InvalidArgumentError("DeviceEvent: null context");
  DeviceEvent event;
  event.timing_ = timing;
#if BAGPIPE_WITH_CUDA
  if (context->is_cuda()) {
    CUDA_RETURN_IF_ERROR(cudaSetDevice(context->device_index()));
    cudaEvent_t handle;
    CUDA_RETURN_IF_ERROR(
        cudaEventCreateWithFlags(&handle, timing ? cudaEventDefault : cudaEventDisableTiming));
    event.cuda_event_ = handle;
  }
#endif
  event.context_ = std::move(context);
  return event;
}

DeviceEvent::~DeviceEvent() {
#if BAGPIPE_WITH_CUDA
  if (cuda_event_ != nullptr) {
    cudaSetDevice(context_->device_index());
    cudaEventDestroy(AsEvent(cuda_event_));
  }
#endif
}

DeviceEvent::DeviceEvent(DeviceEvent&& other) noexcept { *this = std::move(other); }

DeviceEvent& DeviceEvent::operator=(DeviceEvent&& other) noexcept {
  if (this != &other) {
#if BAGPIPE_WITH_CUDA
    if (cuda_event_ != nullptr) {
      cudaSetDevice(context_->device_index());
      cudaEventDestroy(AsEvent(cuda_event_));
    }
#endif
    context_ = std::move(other.context_);
    timing_ = other.timing_;
    cuda_event_ = other.cuda_event_;
    executor_ = other.executor_;
    seq_ = other.seq_;
    cpu_time_ns_ = std::move(other.cpu_time_ns_);
    other.cuda_event_ = nullptr;
    other.executor_ = nullptr;
    other.seq_ = 0;
  }
  return *this;
}

absl::Status DeviceEvent::Record(Stream stream) {
  if (context_ == nullptr) return absl::FailedPreconditionError("DeviceEvent: not created");
#if BAGPIPE_WITH_CUDA
  if (context_->is_cuda()) {
    CUDA_RETURN_IF_ERROR(cudaEventRecord(AsEvent(cuda_event_), AsStream(context_->stream(stream))));
    return absl::OkStatus();
  }
#endif
  if (context_->cpu_streams() == CpuStreams::kSync) {
    if (timing_) cpu_time_ns_ = std::make_shared<std::atomic<int64_t>>(NowNanos());
    return absl::OkStatus();
  }
  RETURN_IF_ERROR(context_->CheckCurrent("DeviceEvent::Record"));
  internal::CpuStreamExecutor* e = context_->executor(stream);
  executor_ = e;
  if (timing_) {
    auto time = std::make_shared<std::atomic<int64_t>>(-1);
    cpu_time_ns_ = time;
    seq_ = e->Enqueue([time] { time->store(NowNanos(), std::memory_order_release); });
  } else {
    seq_ = e->last_queued();
  }
  return absl::OkStatus();
}

absl::StatusOr<bool> DeviceEvent::Query() const {
  if (context_ == nullptr) return absl::FailedPreconditionError("DeviceEvent: not created");
#if BAGPIPE_WITH_CUDA
  if (context_->is_cuda()) {
    const cudaError_t rc = cudaEventQuery(AsEvent(cuda_event_));
    if (rc == cudaSuccess) return true;
    if (rc == cudaErrorNotReady) return false;
    return internal::CudaStatus(rc, "cudaEventQuery", __FILE__, __LINE__);
  }
#endif
  return executor_ == nullptr || executor_->Completed(seq_);
}

absl::Status DeviceEvent::Synchronize() const {
  if (context_ == nullptr) return absl::FailedPreconditionError("DeviceEvent: not created");
  context_->CountSync();
#if BAGPIPE_WITH_CUDA
  if (context_->is_cuda()) {
    const int64_t timeout_us = context_->sync_timeout_us_.load(std::memory_order_relaxed);
    if (timeout_us < 0) {
      CUDA_RETURN_IF_ERROR(cudaEventSynchronize(AsEvent(cuda_event_)));
      return absl::OkStatus();
    }
    return PollUntilDone([&] { return cudaEventQuery(AsEvent(cuda_event_)); }, timeout_us,
                         "cudaEventQuery");
  }
#endif
  if (executor_ == nullptr) return absl::OkStatus();
  RETURN_IF_ERROR(context_->CheckCurrent("DeviceEvent::Synchronize"));
  executor_->WaitFor(seq_);
  return absl::OkStatus();
}

absl::StatusOr<double> DeviceEvent::ElapsedMs(const DeviceEvent& start, const DeviceEvent& end) {
  if (start.context_ == nullptr || start.context_ != end.context_ || !start.timing_ ||
      !end.timing_) {
    return absl::InvalidArgumentError(
        "DeviceEvent::ElapsedMs: needs two timing events of one context");
  }
#if BAGPIPE_WITH_CUDA
  if (start.context_->is_cuda()) {
    float ms = 0;
    CUDA_RETURN_IF_ERROR(
        cudaEventElapsedTime(&ms, AsEvent(start.cuda_event_), AsEvent(end.cuda_event_)));
    return static_cast<double>(ms);
  }
#endif
  if (start.cpu_time_ns_ == nullptr || end.cpu_time_ns_ == nullptr) {
    return absl::FailedPreconditionError("DeviceEvent::ElapsedMs: an event was never recorded");
  }
  const int64_t a = start.cpu_time_ns_->load(std::memory_order_acquire);
  const int64_t b = end.cpu_time_ns_->load(std::memory_order_acquire);
  if (a < 0 || b < 0) {
    return absl::FailedPreconditionError("DeviceEvent::ElapsedMs: an event has not completed");
  }
  return static_cast<double>(b - a) / 1e6;
}

}  // namespace bagpipe
