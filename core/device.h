// The device abstraction: which backend runs a component and the resources it runs with.
//
// Components (cache, model, prefetcher) never reach for globals: they receive a DeviceContext
// (faiss's GpuResources pattern) holding the backend, the device index, the streams and the
// library handles. A CPU context carries none of these; its "device memory" is aligned host
// memory and its copies are memcpy. A CUDA context owns two streams: `compute` (kernels and
// GEMMs) and `copy` (the prefetcher's host-to-device traffic), and a cuBLAS handle bound to the
// compute stream.
//
// This header compiles with a plain host compiler; CUDA types appear only as opaque pointers.
// Thread-safety: a context may be shared by threads; the calls on it are thread-safe, but work
// queued on one stream from several threads is ordered only by the caller.
#ifndef BAGPIPE_CORE_DEVICE_H_
#define BAGPIPE_CORE_DEVICE_H_

#include <cstddef>
#include <memory>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace bagpipe {

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

enum class Stream { kCompute, kCopy };

class DeviceContext {
 public:
  static std::shared_ptr<DeviceContext> Cpu();
  // REQUIRES: 0 <= device < CudaDeviceCount(). Creates the streams and the cuBLAS handle.
  static absl::StatusOr<std::shared_ptr<DeviceContext>> Cuda(int device);
  ~DeviceContext();
  DeviceContext(const DeviceContext&) = delete;
  DeviceContext& operator=(const DeviceContext&) = delete;

  Backend backend() const { return backend_; }
  bool is_cuda() const { return backend_ == Backend::kCuda; }
  int device_index() const { return device_; }
  std::string Describe() const;

  // cudaStream_t of the given stream; nullptr for CPU.
  void* stream(Stream which) const;
  // cublasHandle_t bound to the compute stream; nullptr for CPU.
  void* cublas_handle() const { return cublas_; }

  // Makes this context's device current on the calling thread (cudaSetDevice). CPU: no-op.
  absl::Status MakeCurrent() const;
  // Waits for all work queued on `which`.
  absl::Status Synchronize(Stream which = Stream::kCompute) const;
  // Makes future work on `waiter` wait for the work queued so far on `signaller`
  // (an event recorded on one stream and waited on by the other). CPU: no-op.
  absl::Status StreamWait(Stream waiter, Stream signaller) const;

  // Device memory (CPU: 64-byte aligned host memory). Free accepts nullptr.
  absl::StatusOr<void*> Allocate(size_t bytes) const;
  void Free(void* pointer) const;
  // Page-locked host memory for staging (CPU: aligned host memory).
  absl::StatusOr<void*> AllocatePinned(size_t bytes) const;
  void FreePinned(void* pointer) const;

  // Copies ordered on `stream`; on CUDA they are asynchronous with respect to the host, so the
  // source (host) buffer must stay valid until the stream is synchronised. CPU: memcpy.
  absl::Status CopyToDevice(void* dst, const void* src, size_t bytes,
                            Stream stream = Stream::kCompute) const;
  absl::Status CopyToHost(void* dst, const void* src, size_t bytes,
                          Stream stream = Stream::kCompute) const;
  absl::Status CopyOnDevice(void* dst, const void* src, size_t bytes,
                            Stream stream = Stream::kCompute) const;
  absl::Status Zero(void* dst, size_t bytes, Stream stream = Stream::kCompute) const;

 private:
  DeviceContext(Backend backend, int device) : backend_(backend), device_(device) {}

  const Backend backend_;
  const int device_;
  void* compute_stream_ = nullptr;
  void* copy_stream_ = nullptr;
  void* cublas_ = nullptr;
  void* copy_done_event_ = nullptr;
  void* compute_done_event_ = nullptr;
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
