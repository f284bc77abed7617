#include "core/tunables.h"

#include <cstdlib>

#include "absl/strings/numbers.h"
#include "core/logging.h"

namespace bagpipe {
namespace {

int64_t ReadTunable(const char* env, int64_t default_value) {
  const char* text = std::getenv(env);
  if (text == nullptr) return default_value;
  int64_t value = 0;
  if (!absl::SimpleAtoi(text, &value)) {
    BAGPIPE_LOG(WARNING) << env << "='" << text << "' is not an integer; using the default "
                         << default_value;
    return default_value;
  }
  return value;
}

}  // namespace

#define BAGPIPE_DEFINE_TUNABLE_(name, env, def, doc)    \
  int64_t name() {                                      \
    static const int64_t value = ReadTunable(env, def); \
    return value;                                       \
  }
BAGPIPE_TUNABLES(BAGPIPE_DEFINE_TUNABLE_)
#undef BAGPIPE_DEFINE_TUNABLE_

std::vector<TunableInfo> ListTunables() {
  std::vector<TunableInfo> list;
#define BAGPIPE_LIST_TUNABLE_(name, env, def, doc) list.push_back({env, doc, def, name()});
  BAGPIPE_TUNABLES(BAGPIPE_LIST_TUNABLE_)
#undef BAGPIPE_LIST_TUNABLE_
  return list;
}

}  // namespace bagpipe
