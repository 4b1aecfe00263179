#!/usr/bin/env bash
# Shows that the host kernels are the same machine code in the host and the
# CUDA variant: the translation units of writescope_host_kernels() (built by
# the host compiler alone in both, cmake/WriteScopeTarget.cmake) disassembled
# from build/host and build/cuda and compared instruction by instruction.
#
#   scripts/compare_host_kernels.sh      (after scripts/build.sh host and cuda)
set -euo pipefail
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
# The objects of every writescope_host_kernels(<target> <source>...) call in
# the folders' CMakeLists.txt, as CMake names them: read from there, so that the
# list follows the build.
objects=()
for lists in "$repo"/*/CMakeLists.txt; do
  folder=$(basename "$(dirname "$lists")")
  while read -r target sources; do
    for source in $sources; do objects+=("$folder/CMakeFiles/$target.dir/$source.o"); done
  done < <(tr '\n' ' ' <"$lists" | grep -o 'writescope_host_kernels([^)]*)' |
             sed -E 's/writescope_host_kernels\(([^)]*)\)/\1/')
done
[ ${#objects[@]} -gt 0 ] || { echo "no writescope_host_kernels() call found"; exit 1; }
# Instructions only: no addresses, no raw bytes, no file names.
disassemble() { objdump -d --no-show-raw-insn -C "$1" | sed -n '/^Disassembly/,$p' | grep -v '^Disassembly' |
  sed -E 's/^ *[0-9a-f]+:\t//; s/^[0-9a-f]{16} /<fn> /'; }
status=0
for object in "${objects[@]}"; do
  host=$repo/build/host/$object cuda=$repo/build/cuda/$object
  if [ ! -f "$host" ] || [ ! -f "$cuda" ]; then
    echo "missing: $object (build both variants first)"; status=1; continue
  fi
  instructions=$(disassemble "$host" | grep -c '^[a-z]' || true)
  if diff -q <(disassemble "$host") <(disassemble "$cuda") >/dev/null; then
    echo "same:      $(basename "$object" .o) ($instructions instructions)"
  else
    echo "DIFFERENT: $(basename "$object" .o): diff <(objdump -d $host) <(objdump -d $cuda)"; status=1
  fi
done
exit $status
