// FUZZ_CHECK(condition, message): a broken invariant found by a fuzz target. Prints what broke
// and aborts, which libFuzzer reports as a crash (with the input saved) and the replay test as
// a failure. Works in every build type (assert() would vanish under NDEBUG).
#ifndef ENTROKV_TESTS_FUZZ_FUZZ_CHECK_H_
#define ENTROKV_TESTS_FUZZ_FUZZ_CHECK_H_

#include <cstdio>
#include <cstdlib>
#include <string>

#define FUZZ_CHECK(condition, message)                                                           \
  do {                                                                                           \
    if (!(condition)) {                                                                          \
      std::fprintf(stderr, "%s:%d: FUZZ_CHECK(%s) failed: %s\n", __FILE__, __LINE__, #condition, \
                   std::string(message).c_str());                                                \
      std::abort();                                                                              \
    }                                                                                            \
  } while (false)

#endif  // ENTROKV_TESTS_FUZZ_FUZZ_CHECK_H_
