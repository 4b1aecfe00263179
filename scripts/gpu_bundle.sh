#!/usr/bin/env bash
# Builds the CUDA variant here and packs what the GPU machine needs into
# gpu-bundle.tar.xz (git-ignored, ~18 MB so that it fits what travels to the
# GPU machine): the programs, the shipped profiles (share/writescope/profiles,
# found beside the programs at run time) and every shared library they load
# except the C runtime, the CUDA driver and cuBLAS (CUDA's runtime travels, so
# the bundle does not depend on which CUDA 13 is installed there; cuBLAS is
# ~700 MB and comes from the GPU machine: scripts/gpu_check.sh looks in
# /usr/local/cuda and in Python's nvidia packages), and the hashes of the
# tracked sources it was built from (sources.sha256).
# Carry gpu-bundle.tar.xz to the GPU machine and run scripts/gpu_check.sh there.
set -euo pipefail
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build=$("$repo/scripts/build.sh" cuda)
staging=$(mktemp -d)
trap 'rm -rf "$staging"' EXIT
bundle=$staging/gpu-bundle
mkdir -p "$bundle/bin" "$bundle/lib" "$bundle/share/writescope"
cp -r "$build/share/writescope/profiles" "$bundle/share/writescope/"
programs=("$build/experiments/writescope" "$build/tests/writescope_tests" "$build/benchmarks/writescope_benchmarks")
for program in "${programs[@]}"; do
  cp "$program" "$bundle/bin/"
  strip --strip-unneeded "$bundle/bin/$(basename "$program")"
done
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
ldd "${programs[@]}" | awk '$2 == "=>" && $3 ~ /^\// { print $3 }' | sort -u |
  grep -Ev '/(libc|libm|libdl|librt|libpthread|ld-linux[^/]*|libcuda|libcublas|libcublasLt)\.so' |
  while read -r library; do
    cp -L "$library" "$bundle/lib/"
    strip --strip-unneeded "$bundle/lib/$(basename "$library")" 2>/dev/null || true
  done
# The sources it was built from, which scripts/gpu_check.sh compares with the tree it runs in.
(cd "$repo" && git ls-files -z | xargs -0 sha256sum 2>/dev/null) >"$bundle/sources.sha256" || true
tar -C "$staging" -cJf "$repo/gpu-bundle.tar.xz" gpu-bundle
du -h "$repo/gpu-bundle.tar.xz" >&2
