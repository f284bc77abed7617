#include "core/logging.h"

#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <mutex>

#include "absl/strings/ascii.h"
#include "absl/strings/str_format.h"
#include "core/excerpt.h"

namespace bagpipe {
namespace {

LogLevel LevelFromEnvironment() {
  LogLevel level = LogLevel::kInfo;
  if (const char* env = std::getenv("BAGPIPE_LOG_LEVEL")) ParseLogLevel(env, &level);
  return level;
}

std::atomic<int>& Threshold() {
  static std::atomic<int> threshold{static_cast<int>(LevelFromEnvironment())};
  return threshold;
}

// Protects the prefix string; messages themselves need no lock (one write(2) each).
std::mutex& PrefixMutex() {
  static std::mutex mu;
  return mu;
}
std::string& Prefix() {
  static std::string prefix;
  return prefix;
}

const auto kStart = std::chrono::steady_clock::now();

}  // namespace

void SetLogLevel(LogLevel level) { Threshold().store(static_cast<int>(level)); }
LogLevel GetLogLevel() {
  return static_cast<LogLevel>(Threshold().load(std::memory_order_relaxed));
}

void SetLogPrefix(std::string prefix) {
  std::lock_guard<std::mutex> lock(PrefixMutex());
  Prefix() = std::move(prefix);
}

bool ParseLogLevel(std::string_view text, LogLevel* level) {
  const std::string t = absl::AsciiStrToLower(std::string(text));
  if (t == "debug")
    *level = LogLevel::kDebug;
  else if (t == "info")
    *level = LogLevel::kInfo;
  else if (t == "warning" || t == "warn")
    *level = LogLevel::kWarning;
  else if (t == "error")
    *level = LogLevel::kError;
  else
    return false;
  return true;
}

namespace internal {

LogMessage::LogMessage(LogLevel level, const char* file, int line) : level_(level) {
  static constexpr char kLetters[] = {'D', 'I', 'W', 'E', 'F'};
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - kStart).count();
  std::string_view base(file);
  if (auto slash = base.rfind('/'); slash != std::string_view::npos) base.remove_prefix(slash + 1);
  std::string prefix;
  {
    std::lock_guard<std::mutex> lock(PrefixMutex());
    prefix = Prefix();
  }
  stream_ << kLetters[static_cast<int>(level)] << absl::StrFormat(" %9.3fs ", seconds);
  if (!prefix.empty()) stream_ << '[' << prefix << "] ";
  stream_ << base << ':' << line << "] ";
}

LogMessage::~LogMessage() {
  // Messages echo paths and values from the command line and the data: their control characters
  // are escaped (a terminal would act on them), their line breaks kept.
  const std::string text = Printable(stream_.str(), /*keep_newlines=*/true) + '\n';
  size_t done = 0;
  while (done < text.size()) {
    const ssize_t n = ::write(STDERR_FILENO, text.data() + done, text.size() - done);
    if (n <= 0) break;
    done += static_cast<size_t>(n);
  }
  if (level_ == LogLevel::kFatal) std::abort();
}

}  // namespace internal
}  // namespace bagpipe
