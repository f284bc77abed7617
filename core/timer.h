// Wall-clock stopwatch on the monotonic clock.
#ifndef BAGPIPE_CORE_TIMER_H_
#define BAGPIPE_CORE_TIMER_H_

#include <chrono>

namespace bagpipe {

class Stopwatch {
 public:
  Stopwatch() : start_(Clock::now()) {}
  void Reset() { start_ = Clock::now(); }
  double Seconds() const { return std::chrono::duration<double>(Clock::now() - start_).count(); }
  double Millis() const { return Seconds() * 1e3; }

 private:
  using Clock = std::chrono::steady_clock;
  Clock::time_point start_;
};

// Adds the lifetime of the scope, in seconds, to *sink.
class ScopedTimer {
 public:
  explicit ScopedTimer(double* sink) : sink_(sink) {}
  ~ScopedTimer() { *sink_ += watch_.Seconds(); }
  ScopedTimer(const ScopedTimer&) = delete;
  ScopedTimer& operator=(const ScopedTimer&) = delete;

 private:
  double* sink_;
  Stopwatch watch_;
};

}  // namespace bagpipe

#endif  // BAGPIPE_CORE_TIMER_H_
