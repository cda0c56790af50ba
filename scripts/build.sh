#!/usr/bin/env bash
# Configures and builds Kiln into build/ (or $KILN_BUILD_DIR). Extra args go to CMake configure.
# First the web console (ui/, issue 22): `npm ci` when ui/node_modules is missing or older than
# ui/package-lock.json, then `npm run build` into ui/dist, which the kiln binary embeds. Without
# npm the server is built all the same and its /console/ answers 503 "not built"
# (scripts/install-deps.sh installs node and npm). KILN_SKIP_UI=1 skips the ui step.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ "${KILN_SKIP_UI:-0}" != 1 ] && [ -f ui/package.json ]; then
  if command -v npm >/dev/null 2>&1; then
    ui_modules=1
    if [ ! -d ui/node_modules ] || [ ui/package-lock.json -nt ui/node_modules ]; then
      # A registry that cannot be reached is the machine's problem, not the code's: warn and build
      # the server (the console keeps the last ui/dist, or answers 503 without one).
      if (cd ui && npm ci --no-audit --no-fund); then
        touch ui/node_modules  # the next run compares against package-lock.json
      else
        ui_modules=0
        echo "build: npm ci failed in ui/: building the server without rebuilding the web console" >&2
      fi
    fi
    if [ "$ui_modules" = 1 ]; then (cd ui && npm run build); fi
  else
    echo "build: npm not found: building the server without the web console (/console/ will answer 503;" \
      "scripts/install-deps.sh installs node and npm)" >&2
  fi
fi
build_dir="${KILN_BUILD_DIR:-build}"
jobs="${KILN_JOBS:-$(nproc)}"
cmake -S . -B "$build_dir" -DCMAKE_BUILD_TYPE="${KILN_BUILD_TYPE:-RelWithDebInfo}" "$@" >/dev/null
# KILN_BUILD_TARGETS (space-separated): only those targets, e.g. the sanitizer pass's test binaries.
targets=()
for t in ${KILN_BUILD_TARGETS:-}; do targets+=(--target "$t"); done
cmake --build "$build_dir" -j "$jobs" "${targets[@]}"
