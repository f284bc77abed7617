#include "core/progress.h"

#include <unistd.h>

#include <cstdio>

#include "absl/strings/str_format.h"
#include "core/tunables.h"

namespace bagpipe {
namespace {

std::string FormatDuration(double seconds) {
  if (seconds < 0 || seconds > 1e7) return "?";
  const int64_t s = static_cast<int64_t>(seconds + 0.5);
  if (s >= 3600) return absl::StrFormat("%dh%02dm", s / 3600, (s / 60) % 60);
  if (s >= 60) return absl::StrFormat("%dm%02ds", s / 60, s % 60);
  return absl::StrFormat("%ds", s);
}

}  // namespace

Progress::Progress(std::string label, int64_t total, bool enabled, std::string unit)
    : label_(std::move(label)),
      unit_(std::move(unit)),
      total_(total),
      enabled_(enabled),
      tty_(isatty(STDERR_FILENO)) {}

Progress::~Progress() {
  if (!finished_ && tty_ && enabled_ && last_draw_ > -1e9) std::fputc('\n', stderr);
}

void Progress::Resume(int64_t done) {
  done_ = resumed_at_ = done;
  watch_.Reset();
  last_draw_ = -1e9;
}

void Progress::Update(int64_t done, const std::string& status) {
  done_ = done;
  status_ = status;
  if (!enabled_) return;
  const double now = watch_.Seconds();
  const double interval = tty_ ? 0.1 : ProgressIntervalMs() / 1000.0;
  if (now - last_draw_ >= interval) {
    last_draw_ = now;
    Draw(false);
  }
}

void Progress::Finish(const std::string& status) {
  if (finished_) return;
  finished_ = true;
  if (!status.empty()) status_ = status;
  if (enabled_) Draw(true);
}

void Progress::Draw(bool final_line) {
  const double elapsed = watch_.Seconds();
  const double rate = elapsed > 0 ? static_cast<double>(done_ - resumed_at_) / elapsed : 0.0;
  std::string line = label_;
  if (total_ > 0) {
    const double fraction = std::min(1.0, static_cast<double>(done_) / total_);
    constexpr int kWidth = 24;
    const int filled = static_cast<int>(fraction * kWidth);
    line += " [" + std::string(filled, '#') + std::string(kWidth - filled, '.') + "]";
    line += absl::StrFormat(" %d/%d", done_, total_);
    if (unit_ != "it") line += " " + unit_;  // iterations go without saying; MB do not
    line += absl::StrFormat(" %3.0f%%", 100 * fraction);
  } else {
    line += absl::StrFormat(" %d", done_);
    if (unit_ != "it") line += " " + unit_;
  }
  line += absl::StrFormat(" %.1f %s/s", rate, unit_);
  if (total_ > 0 && !final_line && rate > 0) {
    line += " eta " + FormatDuration((total_ - done_) / rate);
  }
  if (final_line) line += " in " + FormatDuration(elapsed);
  if (!status_.empty()) line += " | " + status_;
  if (tty_) {
    std::fprintf(stderr, "\r\033[K%s%s", line.c_str(), final_line ? "\n" : "");
  } else {
    std::fprintf(stderr, "%s\n", line.c_str());
  }
  std::fflush(stderr);
}

}  // namespace bagpipe
