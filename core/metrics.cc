#include "core/metrics.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "core/atomic_file.h"
#include "core/crc32c.h"
#include "core/excerpt.h"
#include "core/json_fields.h"
#include "core/logging.h"
#include "core/status.h"

namespace bagpipe {

absl::Status CheckOutputFile(const std::string& path, absl::string_view what) {
  const std::filesystem::path p(path);
  const std::string dir = p.has_parent_path() ? p.parent_path().string() : ".";
  std::error_code error;
  if (std::filesystem::is_directory(p, error)) {
    return absl::InvalidArgumentError(
        absl::StrCat("cannot write ", what, " '", Printable(path), "': it is a directory"));
  }
  if (!std::filesystem::is_directory(dir, error)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "cannot write ", what, " '", Printable(path), "': '", Printable(dir), "' is ",
        std::filesystem::exists(dir, error) ? "not a directory" : "no directory (create it)"));
  }
  if (::access(dir.c_str(), W_OK | X_OK) != 0) {
    return absl::InvalidArgumentError(absl::StrCat("cannot write ", what, " '", Printable(path),
                                                   "': its directory: ", std::strerror(errno)));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<JsonLinesWriter>> JsonLinesWriter::Open(const std::string& path) {
  std::unique_ptr<JsonLinesWriter> writer(new JsonLinesWriter(path));
  if (path == "-") return writer;
  RETURN_IF_ERROR(CheckOutputFile(path, "metrics file"));
  return writer;
}

JsonLinesWriter::~JsonLinesWriter() {
  std::lock_guard<std::mutex> lock(mu_);
  if (fd_ >= 0 && path_ != "-") ::close(fd_);
}

absl::Status JsonLinesWriter::Start(int64_t keep_through_iteration,
                                    std::optional<std::vector<int64_t>> run_files) {
  std::lock_guard<std::mutex> lock(mu_);
  return StartLocked(keep_through_iteration, run_files);
}

std::vector<int64_t> JsonLinesWriter::first_lines() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<int64_t> lines = run_files_;
  if (file_first_line_.has_value() &&
      std::find(lines.begin(), lines.end(), *file_first_line_) == lines.end()) {
    lines.push_back(*file_first_line_);
  }
  if (lines.size() > kMaxRunFiles) lines.erase(lines.begin(), lines.end() - kMaxRunFiles);
  return lines;
}

absl::Status JsonLinesWriter::StartLocked(int64_t keep_through_iteration,
                                          const std::optional<std::vector<int64_t>>& run_files) {
  if (started_) {
    return absl::FailedPreconditionError(
        "metrics file started twice (one writer per job: the loop of one trainer, e.g. trainer "
        "0, starts and writes it)");
  }
  // Kept once Start succeeds (a failed Start changes nothing).
  std::vector<int64_t> carried =
      keep_through_iteration >= 0 && run_files.has_value() ? *run_files : std::vector<int64_t>();
  if (path_ == "-") {  // nothing to read back
    run_files_ = std::move(carried);
    started_ = true;
    fd_ = STDOUT_FILENO;
    return absl::OkStatus();
  }
  std::string kept;
  std::optional<int64_t> gap_from;  // the last line kept, when before the checkpoint's iteration
  std::optional<int64_t> dropped_past;  // the first line dropped past the checkpoint's iteration
  int64_t dropped_from = 0;             // the first iteration it covers
  if (keep_through_iteration >= 0) {
    // Read back only from a regular file: a FIFO would block and a device never end.
    std::error_code error;
    const auto status = std::filesystem::status(path_, error);
    if (!error && std::filesystem::exists(status) && !std::filesystem::is_regular_file(status)) {
      return absl::FailedPreconditionError(absl::StrCat(
          "metrics file '", path_, "' is not a regular file (a directory, FIFO or device)"));
    }
    std::ifstream in(path_, std::ios::binary);
    std::stringstream buffer;
    buffer << in.rdbuf();
    const std::string old = buffer.str();
    std::optional<int64_t> old_first_line;     // the old file's
    std::optional<int64_t> earlier_iteration;  // its first line before the checkpoint's
    std::optional<int64_t> last_kept;          // the latest iteration of a line kept
    size_t begin = 0;
    while (begin < old.size()) {
      const size_t end = old.find('\n', begin);
      if (end == std::string::npos) break;  // a torn last line
      const std::string_view line(old.data() + begin, end - begin);
      if (begin == 0) old_first_line = static_cast<int64_t>(Crc32c(line));
      // Lines up to the iteration resumed from stay, and lines that name no iteration; a line
      // whose "iteration" is not an int64 (a damaged line) goes.
      const nlohmann::json record = ParseUntrustedJson(line);
      bool keep = !record.is_discarded();
      if (keep && record.is_object() && record.contains("iteration")) {
        const absl::StatusOr<int64_t> iteration = JsonToInt64(record["iteration"], "iteration");
        keep = iteration.ok() && *iteration <= keep_through_iteration;
        if (iteration.ok() && *iteration < keep_through_iteration && !earlier_iteration) {
          earlier_iteration = *iteration;
        }
        if (keep) last_kept = std::max(last_kept.value_or(*iteration), *iteration);
        // The first line past the checkpoint, and the first iteration it covers (a line names
        // how many it covers in "iterations"): a resume drops it even where it covers some
        // iterations up to the checkpoint.
        if (iteration.ok() && *iteration > keep_through_iteration && !dropped_past) {
          dropped_past = *iteration;
          const absl::StatusOr<int64_t> covered =
              record.contains("iterations") ? JsonToInt64(record["iterations"], "iterations")
                                            : absl::StatusOr<int64_t>(0);
          dropped_from = covered.ok() && *covered > 0 ? *iteration - *covered + 1 : *iteration;
        }
      }
      if (keep) kept.append(old, begin, end + 1 - begin);
      begin = end + 1;
    }
    if (run_files.has_value() && old_first_line.has_value() && earlier_iteration.has_value() &&
        std::find(run_files->begin(), run_files->end(), *old_first_line) == run_files->end()) {
      return absl::FailedPreconditionError(absl::StrCat(
          "metrics file '", Printable(path_), "' holds another run's metrics: its first line is ",
          "none the checkpointed run wrote, and it has lines before the checkpoint's iteration ",
          keep_through_iteration, " (the first of iteration ", *earlier_iteration,
          "): keeping them would splice the two runs. Resume with that run's own --out (or "
          "--metrics-out), a new one, or remove the file"));
    }
    if (last_kept.has_value() && *last_kept < keep_through_iteration) gap_from = *last_kept;
    // No line kept, but a dropped one covered iterations up to the checkpoint: those are lost.
    if (!last_kept.has_value() && dropped_past.has_value() &&
        dropped_from <= keep_through_iteration) {
      gap_from = dropped_from - 1;
    }
  }
  RETURN_IF_ERROR(Annotate(WriteFileAtomically(path_, kept), "metrics file"));
  if (keep_through_iteration < 0) {
    // A fresh run replaces the earlier run's figures in full: its summary and parameters go with
    // its metrics, so a run that then fails leaves no summary that the metrics contradict.
    for (const std::string& stale : stale_on_fresh_start_) {
      std::error_code error;
      if (!stale.empty() && stale != "-" &&
          std::filesystem::is_regular_file(std::filesystem::symlink_status(stale, error)) &&
          !std::filesystem::remove(stale, error) && error) {
        return absl::FailedPreconditionError(
            absl::StrCat("cannot remove the earlier run's '", stale, "': ", error.message()));
      }
    }
  }
  fd_ = ::open(path_.c_str(), O_WRONLY | O_APPEND | O_CLOEXEC);
  if (fd_ < 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("cannot open metrics file '", path_, "': ", std::strerror(errno)));
  }
  run_files_ = std::move(carried);
  started_ = true;
  size_ = static_cast<int64_t>(kept.size());
  const size_t first_end = kept.find('\n');
  if (first_end != std::string::npos) {
    file_first_line_ = static_cast<int64_t>(Crc32c(std::string_view(kept).substr(0, first_end)));
  }
  if (gap_from.has_value()) {
    // Not an error: the run that reached the checkpoint wrote those lines to another file (a
    // second resume into the first run's --out), was killed before writing them, or wrote them
    // in a line that also covered iterations past the checkpoint.
    const bool straddled = dropped_past.has_value() && dropped_from <= keep_through_iteration;
    BAGPIPE_LOG(WARNING) << "metrics file '" << Printable(path_) << "' "
                         << (kept.empty() ? std::string("keeps no line")
                                          : absl::StrCat("ends at iteration ", *gap_from))
                         << ", before the checkpoint's " << keep_through_iteration
                         << ": it has no line for iterations " << *gap_from + 1 << " to "
                         << keep_through_iteration << " ("
                         << (straddled ? absl::StrCat("its line of iteration ", *dropped_past,
                                                      " covered iterations ", dropped_from, " to ",
                                                      *dropped_past,
                                                      ", past the checkpoint too, and is dropped")
                                       : "the run that trained them wrote them elsewhere, or was "
                                         "stopped before writing them")
                         << "); this run's lines follow from there";
  }
  return absl::OkStatus();
}

absl::Status JsonLinesWriter::Write(const nlohmann::json& record) {
  const std::string line = DumpJson(record) + "\n";
  std::lock_guard<std::mutex> lock(mu_);
  if (!started_) RETURN_IF_ERROR(StartLocked(-1, std::nullopt));
  if (fd_ < 0) return absl::FailedPreconditionError("metrics file not open");
  // One write(2) per line; a failed or short one is cut back off (no partial line stays).
  ssize_t written;
  do {
    written = ::write(fd_, line.data(), line.size());
  } while (written < 0 && errno == EINTR);
  if (written == static_cast<ssize_t>(line.size())) {
    if (size_ == 0) {
      file_first_line_ =
          static_cast<int64_t>(Crc32c(std::string_view(line).substr(0, line.size() - 1)));
    }
    size_ += written;
    return absl::OkStatus();
  }
  const int error = written < 0 ? errno : ENOSPC;
  if (path_ != "-") (void)::ftruncate(fd_, size_);
  return absl::DataLossError(absl::StrCat("failed writing a line to metrics file '", path_,
                                          "': ", std::strerror(error),
                                          " (the file keeps its complete lines)"));
}

absl::Status WriteJsonFile(const std::string& path, const nlohmann::json& value) {
  return WriteFileAtomically(path, DumpJson(value, 2) + "\n");
}

absl::StatusOr<nlohmann::json> ReadJsonFile(const std::string& path) {
  std::ifstream in(path);
  if (!in) {
    return absl::NotFoundError(absl::StrCat("cannot open '", path, "': ", std::strerror(errno)));
  }
  std::stringstream text;
  text << in.rdbuf();
  bool too_deep = false;
  nlohmann::json value = ParseUntrustedJson(text.str(), &too_deep);
  if (value.is_discarded()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "'", path, "' is not valid JSON",
        too_deep ? absl::StrCat(" (nested deeper than ", kMaxJsonDepth, " levels)") : ""));
  }
  return value;
}

}  // namespace bagpipe
