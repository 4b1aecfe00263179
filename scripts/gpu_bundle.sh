#!/usr/bin/env bash
# Builds the CUDA variant here and packs what the GPU machine needs into
# gpu-bundle/ (git-ignored): the programs and every shared library they load
# except the C runtime and the CUDA driver, which the GPU machine provides.
# Carry gpu-bundle/ to the GPU machine and run scripts/gpu_check.sh there.
set -euo pipefail
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build=$("$repo/scripts/build.sh" cuda)
bundle=$repo/gpu-bundle
rm -rf "$bundle"
mkdir -p "$bundle/bin" "$bundle/lib"
programs=("$build/experiments/writescope" "$build/tests/writescope_tests" "$build/benchmarks/writescope_benchmarks")
for program in "${programs[@]}"; do
  cp "$program" "$bundle/bin/"
  strip --strip-unneeded "$bundle/bin/$(basename "$program")"
done
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
ldd "${programs[@]}" | awk '$2 == "=>" && $3 ~ /^\// { print $3 }' | sort -u |
  grep -Ev '/(libc|libm|libdl|librt|libpthread|ld-linux[^/]*|libcuda)\.so' |
  while read -r library; do
    cp -L "$library" "$bundle/lib/"
    strip --strip-unneeded "$bundle/lib/$(basename "$library")" 2>/dev/null || true
  done
du -sh "$bundle" >&2
