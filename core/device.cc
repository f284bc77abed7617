#include "core/device.h"

#include <cstdlib>
#include <cstring>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "core/logging.h"

#if BAGPIPE_WITH_CUDA
#include "core/cuda_checks.h"
#endif

namespace bagpipe {
namespace {

constexpr size_t kHostAlignment = 64;

absl::StatusOr<void*> AllocateHost(size_t bytes) {
  if (bytes == 0) return nullptr;
  const size_t rounded = (bytes + kHostAlignment - 1) / kHostAlignment * kHostAlignment;
  void* pointer = std::aligned_alloc(kHostAlignment, rounded);
  if (pointer == nullptr) {
    return absl::ResourceExhaustedError(
        absl::StrCat("host allocation of ", bytes, " bytes failed"));
  }
  return pointer;
}

#if BAGPIPE_WITH_CUDA
cudaStream_t AsStream(void* stream) { return static_cast<cudaStream_t>(stream); }
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
      absl::StrCat("unknown device '", std::string(text), "' (expected cpu, cuda or auto)"));
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

std::shared_ptr<DeviceContext> DeviceContext::Cpu() {
  return std::shared_ptr<DeviceContext>(new DeviceContext(Backend::kCpu, 0));
}

absl::StatusOr<std::shared_ptr<DeviceContext>> DeviceContext::Cuda(int device) {
#if BAGPIPE_WITH_CUDA
  if (device < 0 || device >= CudaDeviceCount()) {
    return absl::FailedPreconditionError(
        absl::StrCat("CUDA device ", device, " is not available: ", CudaDeviceDescription(device)));
  }
  std::shared_ptr<DeviceContext> context(new DeviceContext(Backend::kCuda, device));
  CUDA_RETURN_IF_ERROR(cudaSetDevice(device));
  cudaStream_t compute, copy;
  CUDA_RETURN_IF_ERROR(cudaStreamCreateWithFlags(&compute, cudaStreamNonBlocking));
  context->compute_stream_ = compute;
  CUDA_RETURN_IF_ERROR(cudaStreamCreateWithFlags(&copy, cudaStreamNonBlocking));
  context->copy_stream_ = copy;
  cudaEvent_t copy_done, compute_done;
  CUDA_RETURN_IF_ERROR(cudaEventCreateWithFlags(&copy_done, cudaEventDisableTiming));
  context->copy_done_event_ = copy_done;
  CUDA_RETURN_IF_ERROR(cudaEventCreateWithFlags(&compute_done, cudaEventDisableTiming));
  context->compute_done_event_ = compute_done;
  cublasHandle_t handle;
  CUBLAS_RETURN_IF_ERROR(cublasCreate(&handle));
  context->cublas_ = handle;
  CUBLAS_RETURN_IF_ERROR(cublasSetStream(handle, compute));
  return context;
#else
  return absl::FailedPreconditionError("built without CUDA (configure with -DBAGPIPE_CUDA=ON)");
#endif
}

DeviceContext::~DeviceContext() {
#if BAGPIPE_WITH_CUDA
  if (backend_ == Backend::kCuda) {
    cudaSetDevice(device_);
    if (cublas_) cublasDestroy(static_cast<cublasHandle_t>(cublas_));
    if (copy_done_event_) cudaEventDestroy(static_cast<cudaEvent_t>(copy_done_event_));
    if (compute_done_event_) cudaEventDestroy(static_cast<cudaEvent_t>(compute_done_event_));
    if (compute_stream_) cudaStreamDestroy(AsStream(compute_stream_));
    if (copy_stream_) cudaStreamDestroy(AsStream(copy_stream_));
  }
#endif
}

std::string DeviceContext::Describe() const {
  if (backend_ == Backend::kCpu) return "cpu";
  return absl::StrCat("cuda:", device_, " (", CudaDeviceDescription(device_), ")");
}

void* DeviceContext::stream(Stream which) const {
  return which == Stream::kCompute ? compute_stream_ : copy_stream_;
}

absl::Status DeviceContext::MakeCurrent() const {
#if BAGPIPE_WITH_CUDA
  if (is_cuda()) CUDA_RETURN_IF_ERROR(cudaSetDevice(device_));
#endif
  return absl::OkStatus();
}

absl::Status DeviceContext::Synchronize(Stream which) const {
#if BAGPIPE_WITH_CUDA
  if (is_cuda()) CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(AsStream(stream(which))));
#endif
  return absl::OkStatus();
}

absl::Status DeviceContext::StreamWait(Stream waiter, Stream signaller) const {
#if BAGPIPE_WITH_CUDA
  if (is_cuda() && waiter != signaller) {
    auto event = static_cast<cudaEvent_t>(signaller == Stream::kCopy ? copy_done_event_
                                                                     : compute_done_event_);
    CUDA_RETURN_IF_ERROR(cudaEventRecord(event, AsStream(stream(signaller))));
    CUDA_RETURN_IF_ERROR(cudaStreamWaitEvent(AsStream(stream(waiter)), event, 0));
  }
#endif
  return absl::OkStatus();
}

absl::StatusOr<void*> DeviceContext::Allocate(size_t bytes) const {
#if BAGPIPE_WITH_CUDA
  if (is_cuda()) {
    if (bytes == 0) return nullptr;
    void* pointer = nullptr;
    CUDA_RETURN_IF_ERROR(cudaSetDevice(device_));
    CUDA_RETURN_IF_ERROR(cudaMalloc(&pointer, bytes));
    return pointer;
  }
#endif
  return AllocateHost(bytes);
}

void DeviceContext::Free(void* pointer) const {
  if (pointer == nullptr) return;
#if BAGPIPE_WITH_CUDA
  if (is_cuda()) {
    cudaFree(pointer);
    return;
  }
#endif
  std::free(pointer);
}

absl::StatusOr<void*> DeviceContext::AllocatePinned(size_t bytes) const {
#if BAGPIPE_WITH_CUDA
  if (is_cuda()) {
    if (bytes == 0) return nullptr;
    void* pointer = nullptr;
    CUDA_RETURN_IF_ERROR(cudaMallocHost(&pointer, bytes));
    return pointer;
  }
#endif
  return AllocateHost(bytes);
}

void DeviceContext::FreePinned(void* pointer) const {
  if (pointer == nullptr) return;
#if BAGPIPE_WITH_CUDA
  if (is_cuda()) {
    cudaFreeHost(pointer);
    return;
  }
#endif
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
  std::memcpy(dst, src, bytes);
  return absl::OkStatus();
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
  std::memcpy(dst, src, bytes);
  return absl::OkStatus();
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
  std::memmove(dst, src, bytes);
  return absl::OkStatus();
}

absl::Status DeviceContext::Zero(void* dst, size_t bytes, Stream stream_kind) const {
  if (bytes == 0) return absl::OkStatus();
#if BAGPIPE_WITH_CUDA
  if (is_cuda()) {
    CUDA_RETURN_IF_ERROR(cudaMemsetAsync(dst, 0, bytes, AsStream(stream(stream_kind))));
    return absl::OkStatus();
  }
#endif
  std::memset(dst, 0, bytes);
  return absl::OkStatus();
}

}  // namespace bagpipe
