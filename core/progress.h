// Progress reporting for long work. On a terminal (stderr is a TTY) it redraws one bar line
// ("train [#####.....] 512/1000 51% 3.2 it/s eta 2m31s | loss 0.45"); otherwise it prints a
// plain line every BAGPIPE_PROGRESS_INTERVAL_MS and at the end, so logs stay readable.
// Not thread-safe: update from one thread.
#ifndef BAGPIPE_CORE_PROGRESS_H_
#define BAGPIPE_CORE_PROGRESS_H_

#include <cstdint>
#include <string>

#include "core/timer.h"

namespace bagpipe {

class Progress {
 public:
  // `total` <= 0 means unknown (no bar, no ETA). `enabled` false silences it (e.g. --quiet).
  // `unit` names what is counted in the rate ("it/s", "MB/s", "samples/s").
  Progress(std::string label, int64_t total, bool enabled = true, std::string unit = "it");
  ~Progress();

  // Work resumes at `done` (a job resumed from a checkpoint): the count starts there, and the
  // rate, the ETA and the time shown count only what is done from now on.
  void Resume(int64_t done);
  // Sets the completed count and an optional status text shown after the bar.
  void Update(int64_t done, const std::string& status = "");
  // Draws the final state and ends the line.
  void Finish(const std::string& status = "");

 private:
  void Draw(bool final_line);

  std::string label_;
  std::string unit_;
  int64_t total_;
  bool enabled_;
  bool tty_;
  bool finished_ = false;
  int64_t done_ = 0;
  int64_t resumed_at_ = 0;  // Resume's count, which the rate leaves out
  std::string status_;
  Stopwatch watch_;
  double last_draw_ = -1e9;
};

}  // namespace bagpipe

#endif  // BAGPIPE_CORE_PROGRESS_H_
