// Machine-readable metrics: one JSON object per line (JSON Lines), flushed as written so that a
// plot or `tail -f` sees progress while the job runs. Has internal synchronization; Write may be
// called from any thread.
#ifndef BAGPIPE_CORE_METRICS_H_
#define BAGPIPE_CORE_METRICS_H_

#include <cstdio>
#include <memory>
#include <mutex>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "nlohmann/json.hpp"

namespace bagpipe {

class JsonLinesWriter {
 public:
  // Opens (truncates) `path`; "-" writes to stdout.
  static absl::StatusOr<std::unique_ptr<JsonLinesWriter>> Open(const std::string& path);
  ~JsonLinesWriter();
  JsonLinesWriter(const JsonLinesWriter&) = delete;
  JsonLinesWriter& operator=(const JsonLinesWriter&) = delete;

  // Appends `record` as one line and flushes.
  void Write(const nlohmann::json& record);
  const std::string& path() const { return path_; }

 private:
  JsonLinesWriter(std::FILE* file, std::string path, bool owned)
      : file_(file), path_(std::move(path)), owned_(owned) {}

  // Serialises whole lines so concurrent writers never interleave.
  std::mutex mu_;
  std::FILE* file_ ABSL_GUARDED_BY(mu_);
  const std::string path_;
  const bool owned_;
};

// Writes `value` to `path` as pretty-printed JSON (summaries).
absl::Status WriteJsonFile(const std::string& path, const nlohmann::json& value);
absl::StatusOr<nlohmann::json> ReadJsonFile(const std::string& path);

}  // namespace bagpipe

#endif  // BAGPIPE_CORE_METRICS_H_
