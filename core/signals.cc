#include "core/signals.h"

#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <initializer_list>

namespace bagpipe {
namespace {

std::atomic<int> stop_signal{0};
static_assert(std::atomic<int>::is_always_lock_free);

void OnStopSignal(int signal) {
  int none = 0;
  if (!stop_signal.compare_exchange_strong(none, signal)) _exit(128 + signal);
}

}  // namespace

void InstallStopHandlers() {
  struct sigaction action = {};
  action.sa_handler = OnStopSignal;
  sigemptyset(&action.sa_mask);
  action.sa_flags = SA_RESTART;
  sigaction(SIGINT, &action, nullptr);
  sigaction(SIGTERM, &action, nullptr);
  sigaction(SIGUSR1, &action, nullptr);
}

void RestoreDefaultStopHandlers() {
  for (const int signal : {SIGINT, SIGTERM, SIGUSR1}) ::signal(signal, SIG_DFL);
}

int StopSignal() { return stop_signal.load(); }

void ResetStopSignal() { stop_signal.store(0); }

}  // namespace bagpipe
