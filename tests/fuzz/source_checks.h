// Reading a source to its end, checking every batch it returns.
#ifndef BAGPIPE_TESTS_FUZZ_SOURCE_CHECKS_H_
#define BAGPIPE_TESTS_FUZZ_SOURCE_CHECKS_H_

#include <cmath>
#include <string>

#include "absl/strings/str_cat.h"
#include "data/source.h"
#include "tests/fuzz/fuzz_util.h"

namespace bagpipe {

// Reads `source` in reads of `chunk` samples for `epochs` epochs (stops at the first error,
// whose message is checked). Every batch must be well-formed for the schema (ids in range),
// with labels in [0, 1] and finite dense values.
inline void ReadAndCheck(SampleSource& source, int64_t chunk, int epochs, const std::string& path) {
  Batch batch;
  for (int epoch = 0; epoch < epochs; ++epoch) {
    while (true) {
      absl::StatusOr<int64_t> read = source.Read(chunk, &batch);
      if (!read.ok()) return CheckMessage(read.status(), path);
      if (*read == 0) break;
      if (*read != batch.num_samples || *read > chunk) FuzzFail("a read returned a wrong count");
      const absl::Status valid = batch.Validate(source.schema());
      if (!valid.ok()) FuzzFail(absl::StrCat("an invalid batch: ", valid.message()));
      for (const float label : batch.labels) {
        if (!(label >= 0 && label <= 1)) FuzzFail(absl::StrCat("label ", label));
      }
      for (const float value : batch.dense) {
        if (!std::isfinite(value)) FuzzFail(absl::StrCat("dense value ", value));
      }
    }
    const absl::Status rewound = source.Rewind();
    if (!rewound.ok()) return CheckMessage(rewound, path);
  }
}

}  // namespace bagpipe

#endif  // BAGPIPE_TESTS_FUZZ_SOURCE_CHECKS_H_
