// Invariant checks for programming errors (never for user input, which gets a Status): a
// failed SHARDSCOPE_CHECK prints "file:line: check failed: <condition>: <message>" to stderr
// and aborts, in debug and release builds alike, so a broken invariant stops where it broke
// instead of running on into undefined behaviour.
#ifndef SHARDSCOPE_BASE_CHECK_H_
#define SHARDSCOPE_BASE_CHECK_H_

#include <cstdio>
#include <cstdlib>
#include <string_view>

namespace shardscope::base_internal {

[[noreturn]] inline void CheckFailed(const char* file, int line, const char* condition,
                                     std::string_view message) {
  std::fprintf(stderr, "%s:%d: check failed: %s: %.*s\n", file, line, condition,
               static_cast<int>(message.size()), message.data());
  std::fflush(stderr);
  std::abort();
}

}  // namespace shardscope::base_internal

// `message` is evaluated only when the check fails.
#define SHARDSCOPE_CHECK(condition, message)                                              \
  do {                                                                                    \
    if (!(condition)) {                                                                   \
      ::shardscope::base_internal::CheckFailed(__FILE__, __LINE__, #condition, (message)); \
    }                                                                                     \
  } while (0)

#endif  // SHARDSCOPE_BASE_CHECK_H_
