#!/usr/bin/env bash
# Configures and builds Kiln into build/ (or $KILN_BUILD_DIR). Extra args go to CMake configure.
set -euo pipefail
cd "$(dirname "$0")/.."
build_dir="${KILN_BUILD_DIR:-build}"
jobs="${KILN_JOBS:-$(nproc)}"
cmake -S . -B "$build_dir" -DCMAKE_BUILD_TYPE="${KILN_BUILD_TYPE:-RelWithDebInfo}" "$@" >/dev/null
# KILN_BUILD_TARGETS (space-separated): only those targets, e.g. the sanitizer pass's test binaries.
targets=()
for t in ${KILN_BUILD_TARGETS:-}; do targets+=(--target "$t"); done
cmake --build "$build_dir" -j "$jobs" "${targets[@]}"
