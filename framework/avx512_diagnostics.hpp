#pragma once
// Included first by translation units with AVX-512 code: GCC 12's AVX-512
// intrinsics warn about their own undefined vectors (GCC bug 105593, fixed in
// GCC 13), and the diagnostic must be off where <immintrin.h> is first included.
#if defined(__GNUC__) && !defined(__clang__) && __GNUC__ < 13
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#endif
