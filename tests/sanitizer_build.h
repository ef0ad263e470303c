// Whether this test binary was built with a sanitizer (the asan and tsan presets), for the few
// tests whose bounds or set-up the instrumentation changes. GCC defines __SANITIZE_*__; clang
// answers __has_feature.
#ifndef ADAPTCOMM_TESTS_SANITIZER_BUILD_H_
#define ADAPTCOMM_TESTS_SANITIZER_BUILD_H_

#if defined(__has_feature)
#define ADAPTCOMM_TESTS_HAS_FEATURE(x) __has_feature(x)
#else
#define ADAPTCOMM_TESTS_HAS_FEATURE(x) 0
#endif

namespace adaptcomm::testing {

inline constexpr bool kUnderThreadSanitizer =
#if defined(__SANITIZE_THREAD__) || ADAPTCOMM_TESTS_HAS_FEATURE(thread_sanitizer)
    true;
#else
    false;
#endif

inline constexpr bool kUnderAddressSanitizer =
#if defined(__SANITIZE_ADDRESS__) || ADAPTCOMM_TESTS_HAS_FEATURE(address_sanitizer)
    true;
#else
    false;
#endif

// ASan or TSan: timing bounds get the instrumentation's slowdown, address-space limits cannot be
// set (both reserve terabytes of it at start).
inline constexpr bool kUnderSanitizer = kUnderThreadSanitizer || kUnderAddressSanitizer;

}  // namespace adaptcomm::testing

#endif  // ADAPTCOMM_TESTS_SANITIZER_BUILD_H_
