#!/usr/bin/env bash
# Object-store benchmark (see bench/README.md). Arguments go to object_store_bench.py, e.g.
#   bench/object_store_bench.sh --size-mib 1024 --threads 8 --part-mib 64
set -euo pipefail
cd "$(dirname "$0")/.."
export KILN_BIN="${KILN_BIN:-$(pwd)/build/src/cli/kiln}"
if [ ! -x "$KILN_BIN" ]; then
  echo "object_store_bench.sh: no kiln binary at $KILN_BIN (build it, or set KILN_BIN)" >&2
  exit 2
fi
exec /usr/bin/python3 bench/object_store_bench.py "$@"
