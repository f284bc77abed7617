// Status helpers used at every module boundary.
//
// Bagpipe reports errors as absl::Status / absl::StatusOr<T>. Debian's Abseil predates Abseil's
// own status macros, so the project defines the two it needs:
//
//   RETURN_IF_ERROR(expr);            // expr yields absl::Status; returns it from the caller
//                                     // when it is not OK.
//   ASSIGN_OR_RETURN(lhs, expr);      // expr yields absl::StatusOr<T>; on success moves the
//                                     // value into `lhs` (a declaration or an lvalue), otherwise
//                                     // returns the status from the caller.
//
// Both work in functions returning absl::Status or absl::StatusOr<U>.
#ifndef BAGPIPE_CORE_STATUS_H_
#define BAGPIPE_CORE_STATUS_H_

#include <exception>
#include <string_view>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"

#define BAGPIPE_STATUS_CONCAT_INNER_(a, b) a##b
#define BAGPIPE_STATUS_CONCAT_(a, b) BAGPIPE_STATUS_CONCAT_INNER_(a, b)

#define RETURN_IF_ERROR(expr)                          \
  do {                                                 \
    ::absl::Status bagpipe_status_ = (expr);           \
    if (!bagpipe_status_.ok()) return bagpipe_status_; \
  } while (false)

#define BAGPIPE_ASSIGN_OR_RETURN_IMPL_(tmp, lhs, rexpr) \
  auto tmp = (rexpr);                                   \
  if (!tmp.ok()) return std::move(tmp).status();        \
  lhs = std::move(tmp).value()

#define ASSIGN_OR_RETURN(lhs, rexpr) \
  BAGPIPE_ASSIGN_OR_RETURN_IMPL_(BAGPIPE_STATUS_CONCAT_(bagpipe_statusor_, __LINE__), lhs, rexpr)

namespace bagpipe {

// Returns `status` with `context` prepended to its message ("context: message"); OK stays OK.
// Used to say where an error happened as it travels up ("reading plan 12: ...").
absl::Status Annotate(const absl::Status& status, std::string_view context);

// The status of an exception that escaped the code meant to return statuses: an allocation the
// up-front estimates did not foresee (std::bad_alloc, e.g. under a memory limit), a thread the
// process could not start (std::system_error, or TBB's "pthread_create has failed"), a size too
// large (std::length_error), anything else by its what(). ResourceExhausted or Internal.
absl::Status StatusOfException(std::exception_ptr error);

// Runs `body` (returning absl::Status); an exception escaping it becomes StatusOfException's
// status. For the bodies of threads, whose escaping exception would end the process.
template <typename Body>
absl::Status StatusOfCall(Body&& body) {
  try {
    return std::forward<Body>(body)();
  } catch (...) {
    return StatusOfException(std::current_exception());
  }
}

}  // namespace bagpipe

#endif  // BAGPIPE_CORE_STATUS_H_
