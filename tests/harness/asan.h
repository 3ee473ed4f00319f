// L3D_TEST_ASAN: defined when this file is compiled under AddressSanitizer. GCC says so with
// __SANITIZE_ADDRESS__; clang 14 (CI's sanitizer build) only through __has_feature.
#ifndef L3D_TESTS_HARNESS_ASAN_H
#define L3D_TESTS_HARNESS_ASAN_H

#if defined(__SANITIZE_ADDRESS__)
#define L3D_TEST_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define L3D_TEST_ASAN 1
#endif
#endif

#endif
