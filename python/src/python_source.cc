#include "python/src/python_source.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "pybind11/numpy.h"

namespace bagpipe::python {
namespace py = pybind11;

namespace {

bool InterpreterAlive() { return Py_IsInitialized() && !_Py_IsFinalizing(); }

// The jobs whose Python iterables this thread is reading, innermost last (an iterable may drive
// another job's start, whose own source then reads on its own thread, not this one).
thread_local std::vector<const void*> tls_reading;

// Per job, the threads inside its Python iterables now (PythonDataReadInFlight).
absl::Mutex in_flight_mu;
absl::flat_hash_map<const void*, int>& InFlight() ABSL_EXCLUSIVE_LOCKS_REQUIRED(in_flight_mu) {
  static auto* in_flight = new absl::flat_hash_map<const void*, int>();
  return *in_flight;
}

// Marks the thread as reading a Python iterable of `owner`'s for its life.
class Reading {
 public:
  explicit Reading(const void* owner) : owner_(owner) {
    tls_reading.push_back(owner);
    absl::MutexLock lock(&in_flight_mu);
    ++InFlight()[owner];
  }
  ~Reading() {
    tls_reading.pop_back();
    absl::MutexLock lock(&in_flight_mu);
    auto it = InFlight().find(owner_);
    if (--it->second == 0) InFlight().erase(it);
  }
  Reading(const Reading&) = delete;
  Reading& operator=(const Reading&) = delete;

 private:
  const void* const owner_;
};

class PythonSource final : public SampleSource {
 public:
  PythonSource(py::object iterable, py::object normalize, Schema schema, const void* owner,
               const char* role)
      : iterable_(std::move(iterable)),
        normalize_(std::move(normalize)),
        schema_(std::move(schema)),
        owner_(owner),
        role_(role) {
    py::gil_scoped_acquire gil;
    description_ = absl::StrCat(
        "python iterable (", std::string(py::str(py::type::of(iterable_).attr("__name__"))), ")");
  }

  ~PythonSource() override {
    if (InterpreterAlive()) {
      py::gil_scoped_acquire gil;
      iterator_ = py::object();
      iterable_ = py::object();
      normalize_ = py::object();
    } else {
      // The interpreter is gone: its objects cannot be released any more.
      iterator_.release();
      iterable_.release();
      normalize_.release();
    }
  }

  const Schema& schema() const override { return schema_; }

  absl::StatusOr<int64_t> Read(int64_t max_samples, Batch* batch) override {
    if (next_ >= pending_.num_samples) {
      absl::StatusOr<bool> got = Pull();
      if (!got.ok()) return got.status();
      if (!*got) return 0;
    }
    const int32_t end = static_cast<int32_t>(
        std::min<int64_t>(pending_.num_samples, next_ + std::max<int64_t>(max_samples, 1)));
    *batch = pending_.Slice(next_, end);
    batch->first_sample = samples_;
    const int64_t read = end - next_;
    next_ = end;
    samples_ += read;
    return read;
  }

  absl::Status Rewind() override {
    if (!InterpreterAlive()) return absl::CancelledError("the Python interpreter is exiting");
    py::gil_scoped_acquire gil;
    Reading reading(owner_);  // finalising a generator runs its code
    iterator_ = py::object();
    pending_ = Batch();
    next_ = 0;
    return absl::OkStatus();
  }

  SourceStats stats() const override {
    SourceStats stats;
    stats.samples = samples_;
    return stats;
  }
  std::string Describe() const override { return description_; }

 private:
  // Takes the next item into pending_; false at the end of the iterable.
  absl::StatusOr<bool> Pull() {
    if (!InterpreterAlive()) return absl::CancelledError("the Python interpreter is exiting");
    py::gil_scoped_acquire gil;
    Reading reading(owner_);
    try {
      if (!iterator_) iterator_ = py::iter(iterable_);
      // An item without samples (e.g. a loader's empty last batch) is skipped.
      while (true) {
        PyObject* item = PyIter_Next(iterator_.ptr());
        if (item == nullptr) {
          if (PyErr_Occurred()) throw py::error_already_set();
          return false;
        }
        py::object owned = py::reinterpret_steal<py::object>(item);
        py::tuple parts = normalize_(owned);
        absl::StatusOr<bool> filled = Fill(parts);
        if (!filled.ok()) return filled.status();
        ++items_;
        if (*filled) return true;
      }
    } catch (py::error_already_set& e) {
      return absl::InvalidArgumentError(absl::StrCat(Where(), e.what()));
    } catch (const std::exception& e) {
      // pybind11's cast errors, std::bad_alloc: this runs on the oracle's thread, where an
      // escaping exception would terminate the process.
      return absl::InvalidArgumentError(absl::StrCat(Where(), e.what()));
    }
  }

  // "batch 3 of eval_data, the python iterable (list): " — the item being read.
  std::string Where() const {
    return absl::StrCat("batch ", items_, " of ", role_, ", the ", description_, ": ");
  }

  // Takes an item's samples into pending_; false for an item without samples (consistently
  // empty: no dense value, no id).
  absl::StatusOr<bool> Fill(const py::tuple& parts) {
    using F = py::array_t<float, py::array::c_style | py::array::forcecast>;
    using I = py::array_t<int64_t, py::array::c_style | py::array::forcecast>;
    F dense = parts[0].cast<F>();
    F labels = parts[1].cast<F>();
    I offsets = parts[2].cast<I>();
    I ids = parts[3].cast<I>();
    const int64_t n = labels.size();
    const int tables = schema_.num_tables();
    const int num_dense = schema_.num_dense();
    auto bad = [&](const std::string& what) {
      return absl::InvalidArgumentError(absl::StrCat(Where(), what));
    };
    if (n == 0) {
      if (dense.size() == 0 && ids.size() == 0 && offsets.size() <= 1) return false;
      return bad(absl::StrCat("no samples (labels is empty) but ", dense.size(),
                              " dense values and ", ids.size(), " ids"));
    }
    if (dense.size() != n * num_dense) {
      return bad(absl::StrCat(dense.size(), " dense values for ", n, " samples of ", num_dense,
                              " dense features"));
    }
    if (offsets.size() != tables * n + 1) {
      return bad(absl::StrCat(offsets.size(), " offsets for ", n, " samples of ", tables,
                              " tables (expected tables * samples + 1 = ", tables * n + 1, ")"));
    }
    const int64_t* o = offsets.data();
    if (o[0] != 0) return bad("the offsets do not start at 0");
    for (int64_t k = 0; k < tables * n; ++k) {
      if (o[k + 1] < o[k]) return bad(absl::StrCat("the offsets decrease at position ", k + 1));
    }
    if (o[tables * n] != ids.size()) {
      return bad(absl::StrCat("the offsets end at ", o[tables * n], " but there are ", ids.size(),
                              " ids"));
    }
    // Labels are probabilities (the loss is binary cross-entropy) and features finite, as the
    // file readers require: a NaN would reach every trainer's gradients.
    for (int64_t i = 0; i < n; ++i) {
      const float label = labels.data()[i];
      if (!(label >= 0.0f && label <= 1.0f)) {
        return bad(absl::StrCat("sample ", i, ": label ", label, " is not in [0, 1]"));
      }
    }
    for (int64_t i = 0; i < dense.size(); ++i) {
      if (!std::isfinite(dense.data()[i])) {
        return bad(absl::StrCat("sample ", i / num_dense, ": dense feature ", i % num_dense, " is ",
                                dense.data()[i]));
      }
    }
    pending_.Reset(num_dense, tables);
    pending_.num_samples = static_cast<int32_t>(n);
    pending_.labels.assign(labels.data(), labels.data() + n);
    pending_.dense.assign(dense.data(), dense.data() + dense.size());
    pending_.offsets.assign(o, o + offsets.size());
    pending_.ids.assign(ids.data(), ids.data() + ids.size());
    next_ = 0;
    return true;
  }

  py::object iterable_;
  py::object normalize_;
  py::object iterator_;
  const Schema schema_;
  const void* const owner_;
  const char* const role_;
  std::string description_;
  Batch pending_;
  int32_t next_ = 0;
  int64_t samples_ = 0;
  int64_t items_ = 0;
};

}  // namespace

bool ReadingPythonData(const void* owner) {
  return std::find(tls_reading.begin(), tls_reading.end(), owner) != tls_reading.end();
}

bool PythonDataReadInFlight(const void* owner) {
  absl::MutexLock lock(&in_flight_mu);
  return InFlight().contains(owner);
}

std::unique_ptr<SampleSource> MakePythonSource(py::object iterable, py::object normalize,
                                               Schema schema, const void* owner, const char* role) {
  return std::make_unique<PythonSource>(std::move(iterable), std::move(normalize),
                                        std::move(schema), owner, role);
}

}  // namespace bagpipe::python
