#!/usr/bin/env bash
# Installs everything WriteScope needs on a Debian 12 machine and builds
# Kokkos 3.4.1 + Kokkos Kernels 3.4.1 from Debian's own `trilinos` source
# package, with the patches in cmake/patches/.
#
#   scripts/bootstrap.sh [host|cuda]     (default: host)
#
# Idempotent: packages are only installed when missing and the Kokkos stack
# is only rebuilt when its inputs (patches, options, this script) change, so a
# second run takes seconds. Prints nothing but progress lines on stderr and,
# on stdout, the install prefix of the requested variant.
#
# WRITESCOPE_DEPS  cache folder outside the work tree (default ~/.cache/writescope)
# WRITESCOPE_JOBS  parallel build jobs (default: nproc)
set -euo pipefail

variant=${1:-host}
case "$variant" in
  host | cuda) ;;
  *) echo "bootstrap: unknown variant '$variant' (expected host or cuda)" >&2; exit 2 ;;
esac

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
deps=${WRITESCOPE_DEPS:-$HOME/.cache/writescope}
jobs=${WRITESCOPE_JOBS:-$(nproc)}
trilinos_version=13.2.0
trilinos_debian_revision=13.2.0-4
log() { echo "bootstrap: $*" >&2; }

as_root() {
  if [ "$(id -u)" = 0 ]; then "$@"; else sudo "$@"; fi
}

# --- 1. Debian packages -------------------------------------------------------
packages=(
  build-essential cmake ninja-build pkg-config git patch xz-utils dpkg-dev
  libhdf5-dev hdf5-tools libyaml-cpp-dev libgtest-dev libgmock-dev
  libbenchmark-dev libopenblas-dev
  python3 python3-matplotlib python3-h5py python3-numpy
)
missing=()
for p in "${packages[@]}"; do
  status=$(dpkg-query -W -f='${Status}' "$p" 2>/dev/null || true)
  [ "$status" = "install ok installed" ] || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  log "installing ${missing[*]}"
  as_root apt-get update -q >&2
  as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${missing[@]}" >&2
fi

# --- 2. Kokkos sources from Debian 12's trilinos source package ---------------
src_dir=$deps/src
mkdir -p "$src_dir"
orig_tarball=$src_dir/trilinos_${trilinos_version}.orig.tar.gz

# Writes a deb-src entry for Debian 12 that mirrors the machine's own `deb`
# entry for the Debian archive, so no archive host name lives in this repo.
add_deb_src_entry() {
  local entry=/etc/apt/sources.list.d/writescope-deb-src.sources
  local stanza=""
  local f
  for f in /etc/apt/sources.list.d/*.sources; do
    [ -f "$f" ] || continue
    stanza=$(awk -v RS= '
      /(^|\n)Types:[^\n]*(^|[ \t])deb([ \t]|\n|$)/ && /(^|\n)Suites:[^\n]*[ \t]bookworm([ \t]|\n|$)/ {
        n = split($0, lines, "\n")
        for (i = 1; i <= n; i++)
          if (lines[i] ~ /^(URIs|Signed-By):/) print lines[i]
        exit
      }' "$f")
    [ -n "$stanza" ] && break
  done
  if [ -n "$stanza" ]; then
    printf 'Types: deb-src\n%s\nSuites: bookworm\nComponents: main\n' "$stanza" |
      as_root tee "$entry" >/dev/null
  else
    local uri
    uri=$(awk '$1 == "deb" && / bookworm / { for (i = 2; i <= NF; i++) if ($i ~ /:\/\//) { print $i; exit } }' \
      /etc/apt/sources.list 2>/dev/null || true)
    if [ -z "$uri" ]; then
      log "error: no Debian 12 (bookworm) 'deb' entry found in the apt sources to derive a deb-src entry from"
      exit 1
    fi
    printf 'Types: deb-src\nURIs: %s\nSuites: bookworm\nComponents: main\n' "$uri" | as_root tee "$entry" >/dev/null
  fi
  log "added $entry"
  as_root apt-get update -q >&2
}

if [ ! -f "$orig_tarball" ]; then
  if ! apt-cache showsrc "trilinos=$trilinos_debian_revision" 2>/dev/null | grep -q "^Version: $trilinos_debian_revision"; then
    add_deb_src_entry
  fi
  log "downloading the trilinos $trilinos_debian_revision source package"
  (cd "$src_dir" && apt-get source --download-only "trilinos=$trilinos_debian_revision" >&2)
fi

pristine=$src_dir/trilinos-${trilinos_version}-kokkos
if [ ! -f "$pristine/.extracted" ]; then
  log "extracting packages/kokkos and packages/kokkos-kernels"
  rm -rf "$pristine" && mkdir -p "$pristine"
  tar -xzf "$orig_tarball" -C "$pristine" --strip-components=2 \
    --wildcards '*/packages/kokkos/*' '*/packages/kokkos-kernels/*'
  touch "$pristine/.extracted"
fi

# --- 3. Patch, configure, build, install -------------------------------------
kokkos_options=(
  -DCMAKE_BUILD_TYPE=Release -DCMAKE_CXX_STANDARD=17 -DBUILD_SHARED_LIBS=ON
  -DKokkos_ENABLE_OPENMP=ON -DKokkos_ENABLE_DEPRECATED_CODE_3=OFF
  # AVX2 baseline: runs on the development machines (AMD Zen 3) and on the
  # GPU machine (Intel, AVX-512); wider paths are chosen at run time.
  -DKokkos_ARCH_HSW=ON
)
kernels_options=(
  -DCMAKE_BUILD_TYPE=Release -DCMAKE_CXX_STANDARD=17 -DBUILD_SHARED_LIBS=ON
  -DKokkosKernels_ADD_DEFAULT_ETI=OFF -DKokkosKernels_ENABLE_TPL_BLAS=ON
  -DBLAS_LIBRARIES=openblas -DLAPACK_LIBRARIES=openblas
  -DKokkosKernels_ENABLE_TESTS=OFF -DKokkosKernels_ENABLE_EXAMPLES=OFF
)
if [ "$variant" = cuda ]; then
  if ! command -v nvcc >/dev/null 2>&1; then
    for d in /usr/local/cuda/bin; do [ -x "$d/nvcc" ] && export PATH=$d:$PATH; done
  fi
  command -v nvcc >/dev/null 2>&1 || { log "error: the cuda variant needs nvcc on PATH"; exit 1; }
  kokkos_options+=(
    -DKokkos_ENABLE_SERIAL=OFF -DKokkos_ENABLE_CUDA=ON -DKokkos_ENABLE_CUDA_LAMBDA=ON
    -DKokkos_ENABLE_CUDA_CONSTEXPR=ON -DKokkos_ARCH_HOPPER90=ON
  )
  kernels_options+=(-DKokkosKernels_ENABLE_TPL_CUBLAS=ON -DKokkosKernels_ENABLE_TPL_CUSPARSE=OFF)
else
  kokkos_options+=(-DKokkos_ENABLE_SERIAL=ON)
fi

prefix=$deps/$variant
stamp_file=$prefix/install/.writescope-stamp
stamp=$( {
  cat "$repo"/cmake/patches/kokkos/*.patch "$repo"/cmake/patches/kokkos-kernels/*.patch 2>/dev/null
  cat "${BASH_SOURCE[0]}"
  echo "${kokkos_options[*]} ${kernels_options[*]}"
  if [ "$variant" = cuda ]; then nvcc --version; fi
} | sha256sum | cut -d' ' -f1)

if [ -f "$stamp_file" ] && [ "$(cat "$stamp_file")" = "$stamp" ]; then
  echo "$prefix/install"
  exit 0
fi

log "building Kokkos + Kokkos Kernels ($variant) into $prefix/install"
rm -rf "$prefix"
mkdir -p "$prefix"
cp -a "$pristine/kokkos" "$prefix/kokkos-src"
cp -a "$pristine/kokkos-kernels" "$prefix/kokkos-kernels-src"
for component in kokkos kokkos-kernels; do
  for p in "$repo"/cmake/patches/$component/*.patch; do
    [ -f "$p" ] || continue
    log "applying $(basename "$p")"
    patch -d "$prefix/$component-src" -p1 --quiet <"$p"
  done
done

compiler=()
if [ "$variant" = cuda ]; then
  compiler=(-DCMAKE_CXX_COMPILER="$prefix/kokkos-src/bin/nvcc_wrapper")
fi
cmake -S "$prefix/kokkos-src" -B "$prefix/build-kokkos" -G Ninja "${compiler[@]}" \
  -DCMAKE_INSTALL_PREFIX="$prefix/install" "${kokkos_options[@]}" >"$prefix/kokkos-configure.log" 2>&1 ||
  { tail -40 "$prefix/kokkos-configure.log" >&2; exit 1; }
cmake --build "$prefix/build-kokkos" -j "$jobs" --target install >"$prefix/kokkos-build.log" 2>&1 ||
  { tail -40 "$prefix/kokkos-build.log" >&2; exit 1; }

cmake -S "$prefix/kokkos-kernels-src" -B "$prefix/build-kokkos-kernels" -G Ninja "${compiler[@]}" \
  -DCMAKE_INSTALL_PREFIX="$prefix/install" -DKokkos_ROOT="$prefix/install" \
  "${kernels_options[@]}" >"$prefix/kernels-configure.log" 2>&1 ||
  { tail -40 "$prefix/kernels-configure.log" >&2; exit 1; }
cmake --build "$prefix/build-kokkos-kernels" -j "$jobs" --target install >"$prefix/kernels-build.log" 2>&1 ||
  { tail -40 "$prefix/kernels-build.log" >&2; exit 1; }

echo "$stamp" >"$stamp_file"
log "done: $prefix/install"
echo "$prefix/install"
