// At the start of an mpirun job every rank checks that it was started with the options that
// must agree across the job (the same --dim, --cache, --lr, ... on every rank): each rank
// sends rank 0 its options and their digest, rank 0 compares them with its own and answers
// every rank with the verdict. A mismatch fails the job on every rank before anything is
// trained, with one message naming the option, rank 0's value and the ranks that differ
// (mpirun runs every rank's command line as given, so a typo in one launch line, or an MPMD
// launch with two command lines, would otherwise train with mixed settings or fail later with
// a confusing symptom).
#ifndef BAGPIPE_TRAINER_HOOKS_OPTIONS_AGREEMENT_H_
#define BAGPIPE_TRAINER_HOOKS_OPTIONS_AGREEMENT_H_

#include <string>

#include "absl/status/status.h"
#include "nlohmann/json.hpp"
#include "sync/transport.h"
#include "trainer_hooks/job.h"

namespace bagpipe {

// The options of `options` that every rank must share, by the name of the bagpipe train flag
// that sets each ("--dim", "--lr", ...; the data's table sizes as "--data (table sizes)"),
// with options.checkpoint.identity's entries (the loop's own: --batch-size, --model, the dense
// optimizer, ...) added.
nlohmann::json OptionsThatMustAgree(const JobOptions& options);

// The agreement round over `transport` (kTagOptions), called by every rank at job start with
// its own `agreed` options. OK when every rank's equal rank 0's; otherwise InvalidArgument on
// every rank, naming each differing option (in name order, the first eight), rank 0's value and
// each differing rank's. Waits at most `timeout` for each message.
absl::Status CheckOptionsAgree(Transport& transport, const nlohmann::json& agreed,
                               absl::Duration timeout);

}  // namespace bagpipe

#endif  // BAGPIPE_TRAINER_HOOKS_OPTIONS_AGREEMENT_H_
