#!/usr/bin/env bash
# Runs every libFuzzer target for a while and reports executions, exec/s and crashes per target.
#
#   fuzz/run_all.sh [SECONDS_PER_TARGET (default 60)] [JOBS (default 1)]
#
# Builds build-fuzz first when needed (clang, KILN_BUILD_FUZZERS=ON, KILN_BUILD_TESTS=OFF; an
# existing build-fuzz is only brought up to date), then runs every *_fuzzer executable in
# build-fuzz/fuzz/ — whatever targets exist, so new ones are picked up without editing this —
# JOBS at a time, each on a scratch copy of its seed corpus (fuzz/corpus/<target>/; the checked-in
# corpus is never written) with fuzz/<target>.dict when there is one.
#
# A target that crashes is restarted for the rest of its time (at most 10 times), so one run can
# report several distinct crashes. Crash, timeout, leak and OOM inputs are kept in
#   $KILN_FUZZ_OUT (default build-fuzz/runs/<UTC timestamp>)/crashes/<target>-crash-<sha1> ...
# with each target's log beside them in logs/. Replay one with build-fuzz/fuzz/<target> <file>.
#
# Exit status: 0 when no target crashed, 1 when any did, 2 on a build or usage error.
# Not run by CI (minutes of CPU on purpose). Environment: KILN_FUZZ_JOBS_BUILD (build
# parallelism, default 2), KILN_FUZZ_ARGS (extra libFuzzer flags, e.g. "-max_len=8192"),
# KILN_FUZZ_ONLY (space-separated target names to run instead of all).
set -u -o pipefail

SECONDS_PER_TARGET=${1:-60}
JOBS=${2:-1}
if ! [[ $SECONDS_PER_TARGET =~ ^[0-9]+$ && $JOBS =~ ^[0-9]+$ && $JOBS -ge 1 ]]; then
  echo "usage: $0 [SECONDS_PER_TARGET] [JOBS]" >&2
  exit 2
fi

ROOT=$(cd "$(dirname "$0")/.." && pwd)
BUILD=$ROOT/build-fuzz
BUILD_JOBS=${KILN_FUZZ_JOBS_BUILD:-2}

# --- build -------------------------------------------------------------------------------------
if [[ ! -f $BUILD/CMakeCache.txt ]]; then
  generator=()
  command -v ninja >/dev/null && generator=(-G Ninja)
  cmake -S "$ROOT" -B "$BUILD" "${generator[@]}" -DCMAKE_C_COMPILER=clang -DCMAKE_CXX_COMPILER=clang++ \
        -DKILN_BUILD_FUZZERS=ON -DKILN_BUILD_TESTS=OFF -DCMAKE_BUILD_TYPE=Debug || exit 2
fi
if [[ -f $BUILD/build.ninja ]]; then
  mapfile -t targets < <(ninja -C "$BUILD" -t targets all | sed -n 's/^\([a-z0-9_]*_fuzzer\): phony$/\1/p' | grep -v '^cmake_' | sort -u)
else
  mapfile -t targets < <(make -C "$BUILD" help | sed -n 's/^\.\.\. \([a-z0-9_]*_fuzzer\)$/\1/p' | sort -u)
fi
if [[ ${#targets[@]} -eq 0 ]]; then
  echo "no *_fuzzer targets in $BUILD (configured with KILN_BUILD_FUZZERS=ON?)" >&2
  exit 2
fi
cmake --build "$BUILD" --parallel "$BUILD_JOBS" --target "${targets[@]}" || exit 2

# --- run ---------------------------------------------------------------------------------------
OUT=${KILN_FUZZ_OUT:-$BUILD/runs/$(date -u +%Y%m%dT%H%M%SZ)}
mkdir -p "$OUT/crashes" "$OUT/logs" "$OUT/corpus" "$OUT/results"
mapfile -t fuzzers < <(find "$BUILD/fuzz" -maxdepth 1 -type f -executable -name '*_fuzzer' -printf '%f\n' | sort)
if [[ -n ${KILN_FUZZ_ONLY:-} ]]; then
  read -r -a fuzzers <<<"$KILN_FUZZ_ONLY"
fi

# Crash, timeout, leak and OOM inputs of one target (slow-unit files are not failures).
count_artifacts() {
  find "$OUT/crashes" -name "$1-*" ! -name "$1-slow-unit-*" | wc -l
}

# Runs one target for SECONDS_PER_TARGET; writes "<target> <executions> <exec/s> <crashes>" to
# results/<target>.
run_target() {
  local name=$1 bin=$BUILD/fuzz/$1 corpus=$OUT/corpus/$1 log=$OUT/logs/$1.log
  local deadline=$((SECONDS + SECONDS_PER_TARGET)) execs=0 crashes=0 restarts=0 rc
  mkdir -p "$corpus"
  [[ -d $ROOT/fuzz/corpus/$name ]] && cp -r "$ROOT/fuzz/corpus/$name/." "$corpus/"
  local dict=()
  [[ -f $ROOT/fuzz/$name.dict ]] && dict=(-dict="$ROOT/fuzz/$name.dict")
  : >"$log"
  while :; do
    local left=$((deadline - SECONDS))
    ((left >= 1)) || break
    local before
    before=$(count_artifacts "$name")
    # shellcheck disable=SC2086  # KILN_FUZZ_ARGS is a list of flags
    timeout --kill-after=30 $((left + 120)) "$bin" -max_total_time="$left" -print_final_stats=1 \
      -timeout=30 -rss_limit_mb=2560 -artifact_prefix="$OUT/crashes/$name-" "${dict[@]}" \
      ${KILN_FUZZ_ARGS:-} "$corpus" >"$log.run" 2>&1
    rc=$?
    # The final stats of this run (libFuzzer prints them on exit and on a crash); a run killed
    # before printing them counts its last "#N" status line.
    local units
    units=$(grep -o 'stat::number_of_executed_units: [0-9]*' "$log.run" | tail -1 | grep -o '[0-9]*$')
    [[ -n $units ]] || units=$(grep -o '^#[0-9]*' "$log.run" | tail -1 | tr -d '#')
    execs=$((execs + ${units:-0}))
    cat "$log.run" >>"$log" && rm -f "$log.run"
    echo "--- run ended (rc=$rc)" >>"$log"
    ((rc == 0)) && break
    local after
    after=$(count_artifacts "$name")
    if ((after > before)); then
      crashes=$((crashes + after - before))
    else
      crashes=$((crashes + 1))  # died without leaving an input (e.g. killed by the timeout)
    fi
    restarts=$((restarts + 1))
    ((restarts < 10)) || break
  done
  local rate=0
  ((SECONDS_PER_TARGET > 0)) && rate=$((execs / SECONDS_PER_TARGET))
  echo "$name $execs $rate $crashes" >"$OUT/results/$name"
}

echo "fuzzing ${#fuzzers[@]} targets for ${SECONDS_PER_TARGET}s each, $JOBS at a time; output in $OUT"
running=0
for f in "${fuzzers[@]}"; do
  run_target "$f" &
  running=$((running + 1))
  if ((running >= JOBS)); then
    wait -n
    running=$((running - 1))
  fi
done
wait

total_execs=0
total_crashes=0
printf '%-24s %14s %10s %8s\n' target executions exec/s crashes
for f in "${fuzzers[@]}"; do
  read -r name execs rate crashes <"$OUT/results/$f" || { name=$f execs=0 rate=0 crashes=1; }
  printf '%-24s %14s %10s %8s\n' "$name" "$execs" "$rate" "$crashes"
  total_execs=$((total_execs + execs))
  total_crashes=$((total_crashes + crashes))
done
printf '%-24s %14s %10s %8s\n' total "$total_execs" "" "$total_crashes"
if ((total_crashes > 0)); then
  echo "crash inputs in $OUT/crashes (logs in $OUT/logs)"
  exit 1
fi
exit 0
