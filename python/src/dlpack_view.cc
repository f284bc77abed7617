#include "python/src/dlpack_view.h"

#include <mutex>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "dlpack/dlpack.h"

namespace bagpipe::python {
namespace py = pybind11;

namespace {

constexpr char kCapsuleName[] = "dltensor";

std::string ShapeText(const int64_t* shape, int ndim) {
  std::vector<std::string> parts;
  for (int d = 0; d < ndim; ++d) parts.push_back(std::to_string(shape[d]));
  return absl::StrCat("(", absl::StrJoin(parts, ", "), ")");
}

std::string ShapeText(const std::vector<int64_t>& shape) {
  std::vector<std::string> parts;
  for (int64_t s : shape) parts.push_back(s < 0 ? "any" : std::to_string(s));
  return absl::StrCat("(", absl::StrJoin(parts, ", "), ")");
}

std::string DeviceText(const DLDevice& device) {
  switch (device.device_type) {
    case kDLCPU:
      return "cpu";
    case kDLCUDA:
      return absl::StrCat("cuda:", device.device_id);
    case kDLCUDAHost:
      return "cuda pinned host memory";
    case kDLCUDAManaged:
      return absl::StrCat("cuda managed memory (device ", device.device_id, ")");
    default:
      return absl::StrCat("DLPack device type ", static_cast<int>(device.device_type));
  }
}

std::string DtypeText(const DLDataType& dtype) {
  // DLPack 0.8 added kDLBool (6), which this header (0.6) does not name; PyTorch 2 exports bool
  // tensors with it.
  constexpr uint8_t kBoolCode = 6;
  if (dtype.code == kBoolCode) return "bool";
  const char* kind = dtype.code == kDLFloat     ? "float"
                     : dtype.code == kDLInt     ? "int"
                     : dtype.code == kDLUInt    ? "uint"
                     : dtype.code == kDLBfloat  ? "bfloat"
                     : dtype.code == kDLComplex ? "complex"
                                                : "other";
  return absl::StrCat(kind, static_cast<int>(dtype.bits),
                      dtype.lanes != 1 ? absl::StrCat("x", dtype.lanes) : "");
}

}  // namespace

TensorView ViewTensor(py::handle tensor, const std::string& what, const std::vector<int64_t>& shape,
                      const DeviceContext& context) {
  py::object capsule;
  if (PyCapsule_CheckExact(tensor.ptr())) {
    capsule = py::reinterpret_borrow<py::object>(tensor);
  } else if (py::hasattr(tensor, "__dlpack__")) {
    // A torch tensor with the negative bit (a lazy negation, e.g. from _neg_view) exports its
    // memory without the sign through DLPack (torch 1.13): refused rather than read negated.
    if (py::hasattr(tensor, "is_neg") && py::bool_(tensor.attr("is_neg")())) {
      throw py::value_error(
          absl::StrCat(what,
                       ": a tensor with the negative bit set (a lazy negation): resolve it first "
                       "(tensor.resolve_neg())"));
    }
    // A tensor without memory: its device is what is wrong, not its type.
    if (py::hasattr(tensor, "device") &&
        std::string(py::str(tensor.attr("device"))) == std::string("meta")) {
      throw py::value_error(
          absl::StrCat(what, ": a tensor on the meta device (it has no memory to share)"));
    }
    try {
      capsule = tensor.attr("__dlpack__")();
    } catch (py::error_already_set& error) {
      // E.g. torch's bool tensors and tensors that require grad, numpy's read-only arrays: the
      // producer's own reason (without the traceback into its internals that what() adds).
      throw py::type_error(absl::StrCat(
          what, ": cannot be shared through DLPack: ", std::string(py::str(error.value()))));
    }
  } else {
    throw py::type_error(absl::StrCat(what,
                                      ": expected a tensor (torch.Tensor, numpy.ndarray or "
                                      "another DLPack producer), got ",
                                      std::string(py::str(py::type::of(tensor).attr("__name__")))));
  }
  auto* managed = static_cast<DLManagedTensor*>(PyCapsule_GetPointer(capsule.ptr(), kCapsuleName));
  if (managed == nullptr) {
    PyErr_Clear();
    throw py::type_error(
        absl::StrCat(what, ": not an unused DLPack capsule (\"dltensor\"): was it consumed?"));
  }
  const DLTensor& t = managed->dl_tensor;
  if (t.dtype.code != kDLFloat || t.dtype.bits != 32 || t.dtype.lanes != 1) {
    throw py::type_error(absl::StrCat(what, ": expected float32, got ", DtypeText(t.dtype)));
  }
  const bool host = t.device.device_type == kDLCPU || t.device.device_type == kDLCUDAHost;
  if (context.is_cuda()) {
    if (t.device.device_type != kDLCUDA || t.device.device_id != context.device_index()) {
      throw py::value_error(absl::StrCat(what,
                                         ": expected a tensor on cuda:", context.device_index(),
                                         " (the trainer's device), got ", DeviceText(t.device)));
    }
  } else if (!host) {
    throw py::value_error(absl::StrCat(what,
                                       ": expected a CPU tensor (the trainer runs on the "
                                       "CPU), got ",
                                       DeviceText(t.device)));
  }
  // An empty `shape`: any shape.
  bool shape_ok = shape.empty() || static_cast<size_t>(t.ndim) == shape.size();
  for (int d = 0; shape_ok && !shape.empty() && d < t.ndim; ++d) {
    shape_ok = shape[d] < 0 || shape[d] == t.shape[d];
  }
  if (!shape_ok) {
    throw py::value_error(absl::StrCat(what, ": expected shape ", ShapeText(shape), ", got ",
                                       ShapeText(t.shape, t.ndim)));
  }
  TensorView view;
  // A tensor without elements is contiguous whatever its strides (as PyTorch calls it: e.g. the
  // gradient autograd hands over for a trainer's empty share of a batch): nothing is read.
  int64_t elements = 1;
  for (int d = 0; d < t.ndim; ++d) elements *= t.shape[d];
  int64_t expected_stride = 1;
  for (int d = t.ndim - 1; d >= 0; --d) {
    // Strides of size-1 dimensions do not matter; NULL strides mean C-contiguous.
    if (elements != 0 && t.strides != nullptr && t.shape[d] != 1 &&
        t.strides[d] != expected_stride) {
      throw py::value_error(absl::StrCat(what,
                                         ": expected a contiguous tensor (row-major), got strides ",
                                         ShapeText(t.strides, t.ndim), " for shape ",
                                         ShapeText(t.shape, t.ndim), " (call .contiguous())"));
    }
    expected_stride *= t.shape[d];
  }
  view.elements = expected_stride;
  view.shape.assign(t.shape, t.shape + t.ndim);
  view.data = static_cast<char*>(t.data) + t.byte_offset;
  view.owner = std::move(capsule);
  return view;
}

// Buffers waiting to be handed out again, by size in bytes. At most kMaxFree are kept.
struct TensorPool::State {
  static constexpr size_t kMaxFree = 8;
  std::shared_ptr<DeviceContext> context;
  std::mutex mu;
  std::vector<std::pair<size_t, void*>> free;  // guarded by mu

  void Return(void* data, size_t bytes) {
    {
      std::lock_guard<std::mutex> lock(mu);
      if (free.size() < kMaxFree) {
        free.emplace_back(bytes, data);
        return;
      }
    }
    context->Free(data);
  }
  ~State() {
    for (auto& [bytes, data] : free) context->Free(data);
  }
};

namespace {

// What a produced DLManagedTensor owns.
struct Produced {
  DLManagedTensor managed{};
  std::vector<int64_t> shape;
  void* data = nullptr;
  size_t bytes = 0;
  std::shared_ptr<TensorPool::State> pool;  // keeps the pool (and its context) alive
};

void DeleteProduced(DLManagedTensor* managed) {
  auto* produced = static_cast<Produced*>(managed->manager_ctx);
  produced->pool->Return(produced->data, produced->bytes);
  delete produced;
}

// A capsule nobody consumed still owns its tensor.
void DestroyCapsule(PyObject* capsule) {
  if (PyCapsule_IsValid(capsule, kCapsuleName)) {
    auto* managed = static_cast<DLManagedTensor*>(PyCapsule_GetPointer(capsule, kCapsuleName));
    managed->deleter(managed);
  }
}

}  // namespace

TensorPool::TensorPool(std::shared_ptr<DeviceContext> context) : state_(std::make_shared<State>()) {
  state_->context = std::move(context);
}

TensorPool::~TensorPool() = default;

py::capsule TensorPool::Take(const std::vector<int64_t>& shape, float** data) {
  int64_t elements = 1;
  for (int64_t s : shape) elements *= s;
  const size_t bytes = std::max<size_t>(1, static_cast<size_t>(elements)) * sizeof(float);
  auto produced = std::make_unique<Produced>();
  {
    std::lock_guard<std::mutex> lock(state_->mu);
    for (auto it = state_->free.begin(); it != state_->free.end(); ++it) {
      if (it->first == bytes) {
        produced->data = it->second;
        state_->free.erase(it);
        break;
      }
    }
  }
  if (produced->data == nullptr) {
    absl::StatusOr<void*> allocated = state_->context->Allocate(bytes);
    if (!allocated.ok()) {
      PyErr_SetString(PyExc_MemoryError, std::string(allocated.status().message()).c_str());
      throw py::error_already_set();
    }
    produced->data = *allocated;
  }
  produced->bytes = bytes;
  produced->shape = shape;
  produced->pool = state_;
  DLTensor& t = produced->managed.dl_tensor;
  t.data = produced->data;
  t.device = state_->context->is_cuda() ? DLDevice{kDLCUDA, state_->context->device_index()}
                                        : DLDevice{kDLCPU, 0};
  t.ndim = static_cast<int>(shape.size());
  t.dtype = DLDataType{kDLFloat, 32, 1};
  t.shape = produced->shape.data();
  t.strides = nullptr;  // C-contiguous
  t.byte_offset = 0;
  produced->managed.manager_ctx = produced.get();
  produced->managed.deleter = DeleteProduced;
  *data = static_cast<float*>(produced->data);
  DLManagedTensor* managed = &produced.release()->managed;
  PyObject* capsule = PyCapsule_New(managed, kCapsuleName, DestroyCapsule);
  if (capsule == nullptr) {
    DeleteProduced(managed);
    throw py::error_already_set();
  }
  return py::reinterpret_steal<py::capsule>(capsule);
}

}  // namespace bagpipe::python
