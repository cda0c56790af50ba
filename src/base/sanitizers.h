#pragma once
// KILN_UNDER_SANITIZERS is 1 in an AddressSanitizer (+UBSan) build, whichever compiler made it, else 0:
// GCC defines __SANITIZE_ADDRESS__, clang answers __has_feature(address_sanitizer) instead. Tests
// use it to skip what the sanitizer runtimes cannot run (they own fatal signals, and UBSan's vptr
// check needs a free descriptor to probe memory); the plain build runs those tests.

#if defined(__SANITIZE_ADDRESS__)
#define KILN_UNDER_SANITIZERS 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define KILN_UNDER_SANITIZERS 1
#endif
#endif
#ifndef KILN_UNDER_SANITIZERS
#define KILN_UNDER_SANITIZERS 0
#endif
