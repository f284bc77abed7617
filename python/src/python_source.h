// A SampleSource over a Python iterable of batches, so that a PyTorch user's own data (a
// DataLoader, a generator, a list) feeds the oracle, which reads ahead of training on its own
// thread (taking the GIL only while it pulls the next item).
//
// `normalize` turns one item into (dense float32 [n, num_dense], labels float32 [n], offsets
// int64 [num_tables * n + 1] table-major CSR starting at 0, ids int64 [offsets[-1]]) — numpy
// arrays (python/bagpipe/data.py accepts the friendlier forms). The samples of successive items
// are cut into global batches of the job's batch size by BatchStream; Rewind starts a new pass
// with iter(iterable) (an iterator that cannot restart ends after its first epoch... as a
// "yields no samples" error if more epochs were asked for).
#ifndef BAGPIPE_PYTHON_SRC_PYTHON_SOURCE_H_
#define BAGPIPE_PYTHON_SRC_PYTHON_SOURCE_H_

#include <memory>
#include <string>

#include "data/source.h"
#include "pybind11/pybind11.h"

namespace bagpipe::python {

// `owner`: the job the source feeds (ReadingPythonData's key). `role`: what the iterable is to
// that job ("data", "eval_data"), named by the source's errors.
std::unique_ptr<SampleSource> MakePythonSource(pybind11::object iterable,
                                               pybind11::object normalize, Schema schema,
                                               const void* owner, const char* role);

// True on a runtime thread while it reads a Python iterable of `owner`'s (the oracle's, reading
// its data): that job closed from there would join the very thread it runs on. Another job's
// reading thread (whose iterable may drop or close an earlier job) is no such thread.
bool ReadingPythonData(const void* owner);

// True while any thread is inside one of `owner`'s Python iterables (a loader may block there
// for as long as it likes: JobCore::Close does not join such a thread).
bool PythonDataReadInFlight(const void* owner);

}  // namespace bagpipe::python

#endif  // BAGPIPE_PYTHON_SRC_PYTHON_SOURCE_H_
