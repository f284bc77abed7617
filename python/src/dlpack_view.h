// Tensors from Python without copies, through DLPack: any object with __dlpack__ (torch.Tensor,
// numpy.ndarray, ...) or a "dltensor" capsule (torch.utils.dlpack.to_dlpack). The view borrows
// the producer's memory; the capsule it keeps owns the producer's reference, so the memory lives
// as long as the view (or a copy of its `owner`) does. libtorch is not needed.
#ifndef BAGPIPE_PYTHON_SRC_DLPACK_VIEW_H_
#define BAGPIPE_PYTHON_SRC_DLPACK_VIEW_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/device.h"
#include "pybind11/pybind11.h"

namespace bagpipe::python {

struct TensorView {
  void* data = nullptr;
  std::vector<int64_t> shape;
  int64_t elements = 1;
  pybind11::object owner;  // the capsule: keeps the memory alive
};

// Views `tensor` as a C-contiguous float32 array in
// `context`'s memory (CPU: host memory; CUDA: memory of the context's device) of shape `shape`
// (-1: any size of that dimension; an empty `shape`: any shape). Raises TypeError (not a tensor,
// wrong dtype) or ValueError (wrong shape, device or layout) naming `what` and what was expected.
TensorView ViewTensor(pybind11::handle tensor, const std::string& what,
                      const std::vector<int64_t>& shape, const DeviceContext& context);

// Float32 tensors in a DeviceContext's memory handed to Python as DLPack capsules
// (torch.utils.dlpack.from_dlpack makes them tensors without a copy), recycled: a buffer goes
// back to the pool when its consumer releases it — the DLManagedTensor's deleter, called when the
// last view of the tensor dies — and serves a later request of the same size. So a loop that
// asks for the same shapes every iteration allocates (and page-faults) nothing in the steady
// state, and a tensor the caller keeps is never written again. Thread-safe; the deleter may run
// on any thread, without the GIL.
class TensorPool {
 public:
  explicit TensorPool(std::shared_ptr<DeviceContext> context);
  ~TensorPool();
  TensorPool(const TensorPool&) = delete;
  TensorPool& operator=(const TensorPool&) = delete;

  // A new (uninitialised) tensor of `shape`; `*data` receives its memory. Raises MemoryError.
  pybind11::capsule Take(const std::vector<int64_t>& shape, float** data);

  struct State;  // shared with the tensors handed out

 private:
  std::shared_ptr<State> state_;
};

}  // namespace bagpipe::python

#endif  // BAGPIPE_PYTHON_SRC_DLPACK_VIEW_H_
