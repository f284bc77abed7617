#include "core/status.h"

#include <new>
#include <stdexcept>
#include <string>
#include <system_error>

namespace bagpipe {

absl::Status Annotate(const absl::Status& status, std::string_view context) {
  if (status.ok()) return status;
  return absl::Status(status.code(), absl::StrCat(std::string(context), ": ", status.message()));
}

absl::Status StatusOfException(std::exception_ptr error) {
  const auto thread = [](const char* what) {
    return absl::ResourceExhaustedError(
        absl::StrCat("cannot start a thread (", what,
                     "): lower --trainers or --servers, or raise the process limits (ulimit -u, "
                     "ulimit -v)"));
  };
  try {
    std::rethrow_exception(error);
  } catch (const std::bad_alloc&) {
    return absl::ResourceExhaustedError(
        "out of memory (lower the sizes: --cache-rows, --lookahead, --batch-size, --dim, "
        "--trainers, --servers; or raise the memory limit)");
  } catch (const std::system_error& e) {
    return thread(e.what());
  } catch (const std::length_error& e) {
    return absl::ResourceExhaustedError(
        absl::StrCat("a size too large to allocate (", e.what(),
                     "): lower --cache-rows, --lookahead, --batch-size or --dim"));
  } catch (const std::exception& e) {
    if (std::string(e.what()).find("pthread_create") != std::string::npos) {
      return thread(e.what());
    }
    return absl::InternalError(absl::StrCat("unexpected exception: ", e.what()));
  } catch (...) {
    return absl::InternalError("unexpected exception (not a std::exception)");
  }
}

}  // namespace bagpipe
