#!/usr/bin/env bash
# Checks that every C++ file under src/, fuzz/ and bench/ is laid out as .clang-format says.
#   scripts/check-format.sh          report the files that differ (exit 1 if any)
#   scripts/check-format.sh --fix    rewrite them in place
set -euo pipefail
cd "$(dirname "$0")/.."
formatter="$(command -v clang-format-14 || command -v clang-format || true)"
if [ -z "$formatter" ]; then echo "check-format: clang-format not installed (apt-get install clang-format)"; exit 1; fi
mapfile -t files < <(git ls-files -co --exclude-standard 'src/*.cc' 'src/*.h' 'fuzz/*.cc' 'fuzz/*.h' 'bench/*.cc')
if [ "${1:-}" = --fix ]; then "$formatter" -i "${files[@]}"; exit 0; fi
bad=()
for f in "${files[@]}"; do
  [ -f "$f" ] || continue
  if ! "$formatter" --dry-run --Werror "$f" >/dev/null 2>&1; then bad+=("$f"); fi
done
if [ ${#bad[@]} -ne 0 ]; then
  printf 'check-format: not formatted (run scripts/check-format.sh --fix):\n'; printf '  %s\n' "${bad[@]}"; exit 1
fi
echo "check-format: ${#files[@]} files formatted"
