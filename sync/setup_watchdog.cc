#include "sync/setup_watchdog.h"

#include <signal.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace bagpipe {
namespace {

// The first of `names` set in the environment, or nullptr.
const char* FirstEnv(std::initializer_list<const char*> names) {
  for (const char* name : names) {
    if (const char* value = std::getenv(name); value != nullptr) return value;
  }
  return nullptr;
}

}  // namespace

std::string RankFromEnvironment() {
  const char* rank = FirstEnv({"OMPI_COMM_WORLD_RANK", "PMIX_RANK", "PMI_RANK"});
  const char* size = FirstEnv({"OMPI_COMM_WORLD_SIZE", "PMI_SIZE"});
  if (rank == nullptr) return "this rank";
  return size == nullptr ? absl::StrCat("rank ", rank) : absl::StrCat("rank ", rank, " of ", size);
}

void StopInSetupForTesting(std::string_view key) {
  const char* spec = std::getenv("BAGPIPE_TEST_STOP_IN_SETUP");
  const char* rank = FirstEnv({"OMPI_COMM_WORLD_RANK", "PMIX_RANK", "PMI_RANK"});
  if (spec == nullptr || rank == nullptr) return;
  const std::string text(spec);
  const size_t colon = text.find(':');
  int wanted = -1, mine = -2;
  if (colon == std::string::npos || text.substr(0, colon) != key ||
      !absl::SimpleAtoi(text.substr(colon + 1), &wanted) || !absl::SimpleAtoi(rank, &mine) ||
      wanted != mine) {
    return;
  }
  std::fprintf(stderr, "bagpipe: rank %d stops itself at set-up point '%s' (test hook)\n", mine,
               std::string(key).c_str());
  std::fflush(stderr);
  ::raise(SIGSTOP);
}

SetupWatchdog::SetupWatchdog(absl::Duration limit, std::string who, std::string stage)
    : limit_(limit), who_(std::move(who)), stage_(std::move(stage)) {
  if (limit_ == absl::InfiniteDuration() || limit_ <= absl::ZeroDuration()) return;
  thread_ = std::thread([this] { Watch(); });
}

SetupWatchdog::~SetupWatchdog() {
  Disarm();
  if (thread_.joinable()) thread_.join();
}

void SetupWatchdog::Enter(std::string phase) {
  absl::MutexLock lock(&mu_);
  phase_ = std::move(phase);
  entered_ = absl::Now();
  changed_.Signal();
}

void SetupWatchdog::Disarm() {
  absl::MutexLock lock(&mu_);
  disarmed_ = true;
  changed_.Signal();
}

void SetupWatchdog::Watch() {
  absl::MutexLock lock(&mu_);
  while (!disarmed_) {
    const absl::Time deadline =
        entered_ == absl::InfiniteFuture() ? absl::InfiniteFuture() : entered_ + limit_;
    if (absl::Now() < deadline) {
      changed_.WaitWithDeadline(&mu_, deadline);
      continue;
    }
    // The phase overran: a peer is stopped, hung or dead (or this rank's own MPI is stuck).
    // Nothing here may wait for anything: print and end the process; mpirun ends the job.
    const std::string message = absl::StrCat(
        "bagpipe: error: ", who_, " waited ", absl::FormatDuration(absl::Now() - entered_),
        " (the limit is --peer-timeout, ", absl::FormatDuration(limit_), ") in the job's ", stage_,
        ", ", phase_,
        ": a rank of the job is stopped, hung or died before reaching it; this rank ends (exit "
        "1) so that mpirun ends the job\n");
    std::fputs(message.c_str(), stderr);
    std::fflush(stderr);
    ::_exit(1);
  }
}

}  // namespace bagpipe
