// Graceful stop on SIGINT, SIGTERM and SIGUSR1 (Ctrl-C, a scheduler's preemption or time-limit
// warning, a signal mpirun forwards to its ranks): the first signal only records itself — the
// job polls StopSignal() at iteration boundaries and stops cleanly (trainer_hooks/checkpoint.h)
// — and a second one ends the process at once with status 128 + the signal's number.
//
// Under mpirun: Open MPI 4 forwards SIGUSR1 to every rank and lets the job end by itself, so
// `kill -USR1 <mpirun>` stops an mpirun job cleanly. A SIGTERM to mpirun is no clean stop with
// Open MPI 4.1: it reaches the ranks only after odls_base_sigkill_timeout seconds and they are
// killed about as long after (docs/checkpoints.md, "Stopping").
//
// Thread-safety: the handlers are async-signal-safe (one lock-free atomic, _exit); StopSignal
// may be called from any thread.
#ifndef BAGPIPE_CORE_SIGNALS_H_
#define BAGPIPE_CORE_SIGNALS_H_

namespace bagpipe {

// Installs the SIGINT, SIGTERM and SIGUSR1 handlers (idempotent).
void InstallStopHandlers();
// 0 until the first of those signals arrived; then its number.
int StopSignal();
// Puts back the signals' default actions (the job is over: a signal ends the process).
void RestoreDefaultStopHandlers();
// Forgets a recorded signal (tests).
void ResetStopSignal();

// Exit status of a job that stopped on request and can be resumed: EX_TEMPFAIL (sysexits.h).
inline constexpr int kStoppedExitStatus = 75;

}  // namespace bagpipe

#endif  // BAGPIPE_CORE_SIGNALS_H_
