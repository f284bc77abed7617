// Minimal leveled logging to stderr.
//
//   BAGPIPE_LOG(INFO) << "planned " << n << " batches";
//   BAGPIPE_LOG(FATAL) << "...";   // prints, then aborts the process
//
// Each message is written with one write(2), prefixed by level, time since start and, in MPI
// jobs, "[rank r role]" (SetLogPrefix), so lines from threads and ranks never interleave.
// The threshold comes from the environment variable BAGPIPE_LOG_LEVEL (DEBUG, INFO, WARNING,
// ERROR; default INFO) or SetLogLevel. Thread-safe.
#ifndef BAGPIPE_CORE_LOGGING_H_
#define BAGPIPE_CORE_LOGGING_H_

#include <sstream>
#include <string>
#include <string_view>

namespace bagpipe {

enum class LogLevel { kDebug = 0, kInfo = 1, kWarning = 2, kError = 3, kFatal = 4 };

void SetLogLevel(LogLevel level);
LogLevel GetLogLevel();
// Text put before every message, e.g. "rank 2 trainer 1". Empty by default.
void SetLogPrefix(std::string prefix);
// Parses "debug", "info", "warning", "error" (any case). Returns false when unknown.
bool ParseLogLevel(std::string_view text, LogLevel* level);

namespace internal {

class LogMessage {
 public:
  LogMessage(LogLevel level, const char* file, int line);
  ~LogMessage();
  LogMessage(const LogMessage&) = delete;
  LogMessage& operator=(const LogMessage&) = delete;
  std::ostringstream& stream() { return stream_; }

 private:
  LogLevel level_;
  std::ostringstream stream_;
};

// Swallows the stream when the level is below the threshold.
struct LogVoidify {
  void operator&(std::ostream&) {}
};

}  // namespace internal
}  // namespace bagpipe

#define BAGPIPE_LOG_LEVEL_DEBUG ::bagpipe::LogLevel::kDebug
#define BAGPIPE_LOG_LEVEL_INFO ::bagpipe::LogLevel::kInfo
#define BAGPIPE_LOG_LEVEL_WARNING ::bagpipe::LogLevel::kWarning
#define BAGPIPE_LOG_LEVEL_ERROR ::bagpipe::LogLevel::kError
#define BAGPIPE_LOG_LEVEL_FATAL ::bagpipe::LogLevel::kFatal

#define BAGPIPE_LOG(severity)                                                                 \
  (BAGPIPE_LOG_LEVEL_##severity < ::bagpipe::GetLogLevel())                                   \
      ? (void)0                                                                               \
      : ::bagpipe::internal::LogVoidify() &                                                   \
            ::bagpipe::internal::LogMessage(BAGPIPE_LOG_LEVEL_##severity, __FILE__, __LINE__) \
                .stream()

#endif  // BAGPIPE_CORE_LOGGING_H_
