// Tensors from Python without copies, through DLPack: any object with __dlpack__ (torch.Tensor,
// numpy.ndarray, ...) or a "dltensor" capsule (torch.utils.dlpack.to_dlpack). The view borrows
// the producer's memory; the capsule it keeps owns the producer's reference, so the memory lives
// as long as the view (or a copy of its `owner`) does. libtorch is not needed.
#ifndef BAGPIPE_PYTHON_SRC_DLPACK_VIEW_H_
#define BAGPIPE_PYTHON_SRC_DLPACK_VIEW_H_

#include <cstdint>
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

}  // namespace bagpipe::python

#endif  // BAGPIPE_PYTHON_SRC_DLPACK_VIEW_H_
