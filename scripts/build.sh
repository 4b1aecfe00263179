#!/usr/bin/env bash
# Configures and builds WriteScope against the bootstrapped Kokkos stack.
#
#   scripts/build.sh [host|cuda]      (default: host)
#
# Builds into build/<variant>/ and prints that folder on stdout. The cuda
# variant compiles with Kokkos' nvcc_wrapper for sm_90 (the H200); it builds on
# any machine with nvcc, and runs where a GPU is.
set -euo pipefail
variant=${1:-host}
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
prefix=$("$repo/scripts/bootstrap.sh" "$variant")
build=$repo/build/$variant
jobs=${WRITESCOPE_JOBS:-$(nproc)}

compiler=()
if [ "$variant" = cuda ]; then
  export PATH=/usr/local/cuda/bin:$PATH
  compiler=(-DCMAKE_CXX_COMPILER="$prefix/bin/nvcc_wrapper")
fi
if [ ! -f "$build/build.ninja" ]; then
  echo "build: configuring $build" >&2
  cmake -S "$repo" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_PREFIX_PATH="$prefix" \
    -DCMAKE_BUILD_RPATH="$prefix/lib" "${compiler[@]}" >&2
fi
echo "build: compiling ($variant)" >&2
cmake --build "$build" -j "$jobs" >&2
echo "$build"
