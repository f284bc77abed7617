// Graceful stop on SIGINT and SIGTERM (Ctrl-C, a scheduler's preemption, Open MPI's mpirun
// forwarding SIGTERM to its ranks): the first signal only records itself — the job polls
// StopSignal() at iteration boundaries and stops cleanly (trainer_hooks/checkpoint.h) — and a
// second one ends the process at once with status 128 + the signal's number.
//
// Thread-safety: the handlers are async-signal-safe (one lock-free atomic, _exit); StopSignal
// may be called from any thread.
#ifndef BAGPIPE_CORE_SIGNALS_H_
#define BAGPIPE_CORE_SIGNALS_H_

namespace bagpipe {

// Installs the SIGINT and SIGTERM handlers (idempotent).
void InstallStopHandlers();
// 0 until the first SIGINT or SIGTERM arrived; then its number.
int StopSignal();
// Forgets a recorded signal (tests).
void ResetStopSignal();

// Exit status of a job that stopped on request and can be resumed: EX_TEMPFAIL (sysexits.h).
inline constexpr int kStoppedExitStatus = 75;

}  // namespace bagpipe

#endif  // BAGPIPE_CORE_SIGNALS_H_
