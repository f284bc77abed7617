#include "core/tunables.h"

#include <cstdlib>
#include <string>

#include "absl/strings/escaping.h"
#include "absl/strings/numbers.h"
#include "core/logging.h"

namespace bagpipe {

int64_t ReadTunable(const char* env, int64_t default_value, int64_t min_value, int64_t max_value) {
  const char* text = std::getenv(env);
  if (text == nullptr) return default_value;
  int64_t value = 0;
  if (!absl::SimpleAtoi(text, &value) || value < min_value || value > max_value) {
    BAGPIPE_LOG(WARNING) << env << "='" << absl::CEscape(std::string(text).substr(0, 40))
                         << "' is not an integer in [" << min_value << ", " << max_value
                         << "]; using the default " << default_value;
    return default_value;
  }
  return value;
}

#define BAGPIPE_DEFINE_TUNABLE_(name, env, def, min, max, doc)    \
  int64_t name() {                                                \
    static const int64_t value = ReadTunable(env, def, min, max); \
    return value;                                                 \
  }
BAGPIPE_TUNABLES(BAGPIPE_DEFINE_TUNABLE_)
#undef BAGPIPE_DEFINE_TUNABLE_

std::vector<TunableInfo> ListTunables() {
  std::vector<TunableInfo> list;
#define BAGPIPE_LIST_TUNABLE_(name, env, def, min, max, doc) \
  list.push_back({env, doc, def, min, max, name()});
  BAGPIPE_TUNABLES(BAGPIPE_LIST_TUNABLE_)
#undef BAGPIPE_LIST_TUNABLE_
  return list;
}

}  // namespace bagpipe
