#!/usr/bin/env bash
# Sets up everything on a fresh Debian 12 machine, builds the host variant and
# runs every test. Extra arguments go to ctest (e.g. -R Config).
set -euo pipefail
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
build=$("$repo/scripts/build.sh" host)
cd "$build"
ctest --output-on-failure --timeout 600 "$@"
