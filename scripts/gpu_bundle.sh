#!/usr/bin/env bash
# Builds the CUDA variant here and packs what the GPU machine needs into
# gpu-bundle.tar.xz (git-ignored, ~20 MB so that it fits what travels to the
# GPU machine): the programs and every shared library they load except the C
# runtime, the CUDA driver and the CUDA toolkit's libraries (cudart, cuBLAS:
# the GPU machine has the same CUDA 13 under /usr/local/cuda).
# Carry gpu-bundle.tar.xz to the GPU machine and run scripts/gpu_check.sh there.
set -euo pipefail
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build=$("$repo/scripts/build.sh" cuda)
staging=$(mktemp -d)
trap 'rm -rf "$staging"' EXIT
bundle=$staging/gpu-bundle
mkdir -p "$bundle/bin" "$bundle/lib"
programs=("$build/experiments/writescope" "$build/tests/writescope_tests" "$build/benchmarks/writescope_benchmarks")
for program in "${programs[@]}"; do
  cp "$program" "$bundle/bin/"
  strip --strip-unneeded "$bundle/bin/$(basename "$program")"
done
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
ldd "${programs[@]}" | awk '$2 == "=>" && $3 ~ /^\// { print $3 }' | sort -u |
  grep -Ev '/(libc|libm|libdl|librt|libpthread|ld-linux[^/]*|libcuda)\.so|^/usr/local/cuda' |
  while read -r library; do
    cp -L "$library" "$bundle/lib/"
    strip --strip-unneeded "$bundle/lib/$(basename "$library")" 2>/dev/null || true
  done
tar -C "$staging" -cJf "$repo/gpu-bundle.tar.xz" gpu-bundle
du -h "$repo/gpu-bundle.tar.xz" >&2
