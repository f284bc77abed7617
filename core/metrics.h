// Machine-readable metrics: one JSON object per line (JSON Lines), written as they come so that
// a plot or `tail -f` sees progress while the job runs, and summaries as whole JSON files.
//
// Crash safety: the metrics file only ever holds complete lines. Start() replaces the previous
// file atomically (core/atomic_file.h) — with an empty one, or, when a job resumes from a
// checkpoint, with the previous file's complete lines up to the resumed iteration — and every
// record is then appended with one write(2). A write that fails or comes up short (a full
// disk) is cut back off the file and reported as an error: the file never ends in a partial
// line because of a failed write. The one thing no user-space writer can rule out is a
// SIGKILL landing while the kernel copies a line that straddles two pages; the readers in this
// project (resume, `bagpipe compare`, scripts/plot_runs.py) ignore a final line without its
// newline, and a resumed job drops it.
//
// JsonLinesWriter has internal synchronization; Write may be called from any thread.
#ifndef BAGPIPE_CORE_METRICS_H_
#define BAGPIPE_CORE_METRICS_H_

#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "nlohmann/json.hpp"

namespace bagpipe {

class JsonLinesWriter {
 public:
  // Checks that `path` can be written (its directory exists and is writable) without touching
  // the file; "-" writes to stdout.
  static absl::StatusOr<std::unique_ptr<JsonLinesWriter>> Open(const std::string& path);
  ~JsonLinesWriter();
  JsonLinesWriter(const JsonLinesWriter&) = delete;
  JsonLinesWriter& operator=(const JsonLinesWriter&) = delete;

  // Starts the file. keep_through_iteration < 0: an empty file replaces the old one. Otherwise
  // (a resumed job) the old file's complete lines whose "iteration" is at most that value (and
  // lines without one) are kept and later records appended. Either way the replacement is
  // atomic. Write calls Start(-1) if it was not called. Called once successfully; a failed
  // Start changed nothing and may be called again.
  //
  // `run_files` (a resumed job): the checkpointed run's first_lines() at its checkpoint. An old
  // file whose first line is none of them but which holds lines of iterations before the
  // checkpoint's is another run's: keeping those would splice two runs' metrics into one file,
  // so Start fails (FailedPrecondition) and leaves the file as it is. (Lines of the checkpoint's
  // iteration and later, such as the final line a stopped run wrote after its checkpoint, are
  // no sign of another run.) nullopt: not known (a checkpoint that did not record it); the
  // lines are kept as above.
  absl::Status Start(int64_t keep_through_iteration = -1,
                     std::optional<std::vector<int64_t>> run_files = std::nullopt);
  // The CRC32C (without its newline) of the first line of each metrics file the run wrote: this
  // file's once it has a line, and those Start was given (a resumed run's, which may have
  // written elsewhere before), the newest kMaxRunFiles. A checkpoint records them, so that a
  // job resuming from it recognises the run's files (Start).
  static constexpr size_t kMaxRunFiles = 16;
  std::vector<int64_t> first_lines() const;
  // Outputs of the same run (its summary, its parameter dump) that a fresh Start (not a resumed
  // one) removes if they are regular files: they belong to the earlier run the new metrics
  // replace. Call before Start.
  void set_stale_on_fresh_start(std::vector<std::string> paths) {
    stale_on_fresh_start_ = std::move(paths);
  }
  // Appends `record` as one line.
  absl::Status Write(const nlohmann::json& record);
  const std::string& path() const { return path_; }

 private:
  explicit JsonLinesWriter(std::string path) : path_(std::move(path)) {}
  absl::Status StartLocked(int64_t keep_through_iteration,
                           const std::optional<std::vector<int64_t>>& run_files)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // Serialises whole lines so concurrent writers never interleave.
  mutable std::mutex mu_;
  const std::string path_;
  int fd_ ABSL_GUARDED_BY(mu_) = -1;  // -1 until started; stdout's for "-"
  bool started_ ABSL_GUARDED_BY(mu_) = false;
  int64_t size_ ABSL_GUARDED_BY(mu_) = 0;  // bytes of complete lines in the file
  std::optional<int64_t> file_first_line_ ABSL_GUARDED_BY(mu_);  // this file's first line
  std::vector<int64_t> run_files_ ABSL_GUARDED_BY(mu_);          // Start's run_files
  std::vector<std::string> stale_on_fresh_start_;
};

// Checks, without touching it, that the file `path` (`what` names it in the message, e.g.
// "summary file") can be written: its directory exists and is writable, and it is no directory.
absl::Status CheckOutputFile(const std::string& path, absl::string_view what);

// Writes `value` to `path` as pretty-printed JSON (summaries), atomically: the file holds its
// old or its new contents whatever happens to the process.
absl::Status WriteJsonFile(const std::string& path, const nlohmann::json& value);
absl::StatusOr<nlohmann::json> ReadJsonFile(const std::string& path);

}  // namespace bagpipe

#endif  // BAGPIPE_CORE_METRICS_H_
