#!/usr/bin/env bash
# README command 2: install everything the tests need, build, and run every test:
#   1. unit tests (ctest) on the normal build,
#   2. the unit tests of the input-parsing modules under AddressSanitizer + UndefinedBehaviorSanitizer, built with clang++
#      when installed (clang's -Wthread-safety then checks the lock annotations, as errors) or else
#      with the default compiler,
#   3. the integration suite (pytest + boto3 + AWS CLI against a live server);
# Podman is set up after the build for the container runtime's tests (scripts/podman-setup.sh; they
# skip saying why when it cannot work);
# first, the C++ layout check (scripts/check-format.sh, .clang-format).
# Exits non-zero when anything fails; pytest's summary line is the last thing printed.
set -uo pipefail
cd "$(dirname "$0")/.."
start_seconds=$SECONDS
# Each stage's header says when it began (minutes into the run): CI's wall is 90 minutes.
stage() { echo "== $1 (at $(((SECONDS - start_seconds) / 60)) min)"; }
stage "install"
scripts/install-deps.sh --test || exit 1

failed=0
stage "format"
scripts/check-format.sh || failed=1

stage "build"
scripts/build.sh || exit 1

stage "container engine"
# Podman's API service for the container runtime's tests (runtime_docker_test's live cases and
# tests/integration/test_container_*.py): they run on KILN_PODMAN_SOCKET, exported only when it
# answers, and otherwise skip saying why.
# Output through a file, not $(...): a reader of a pipe waits for every process holding it, and
# the script starts a long-lived service. Bounded, so that no engine state can stall the run.
podman_log=$(mktemp)
if timeout 300 scripts/podman-setup.sh >"$podman_log" 2>&1; then podman_ok=1; else podman_ok=0; fi
podman_out=$(cat "$podman_log"); rm -f "$podman_log"
if [ $podman_ok = 1 ]; then
  echo "$podman_out"
  export KILN_PODMAN_SOCKET=/run/podman/podman.sock
  # The unit tests' live cases run localhost/kiln-unit-base (tests/integration/container_images.py
  # builds it from the host's files in about a second); without it they skip.
  timeout 600 /usr/bin/python3 tests/integration/container_images.py --unit-base || echo "test.sh: the unit tests' base image could not be built (their live Podman cases will skip)"
else
  echo "$podman_out"
  KILN_PODMAN_SKIP_REASON="Podman is not usable here: $(echo "$podman_out" | tail -n 1)"
  export KILN_PODMAN_SKIP_REASON
  echo "test.sh: $KILN_PODMAN_SKIP_REASON (the container-runtime tests will skip)"
fi

stage "unit tests"
(cd build && ctest --output-on-failure -j "$(nproc)" --timeout 600) || failed=1

if [ "${KILN_SKIP_SANITIZERS:-0}" != 1 ]; then
  # A second compiler for the second build: clang adds the thread-safety analysis (KILN_THREAD_SAFETY,
  # on by default) and warnings g++ lacks, all errors under -Werror. Its own build directory, since
  # CMake keeps the compiler a directory was first configured with.
  # Line tables only: the sanitizers' reports name file:line with them, and full debug info would
  # make this build about a quarter slower.
  san_dir=build-asan
  san_cc=(-DCMAKE_C_FLAGS_DEBUG=-g1 -DCMAKE_CXX_FLAGS_DEBUG=-g1)
  if command -v clang++ >/dev/null 2>&1 && command -v clang >/dev/null 2>&1; then
    san_dir=build-asan-clang
    san_cc=(-DCMAKE_C_COMPILER=clang -DCMAKE_CXX_COMPILER=clang++
            -DCMAKE_C_FLAGS_DEBUG=-gline-tables-only -DCMAKE_CXX_FLAGS_DEBUG=-gline-tables-only)
  fi
  # What the sanitizers check: the modules that parse what users and instances send (HTTP, SigV4
  # and the AWS codecs, S3 and its XML, the API's JSON, the store, logs and metrics, staging and
  # tar extraction, the router and the model server). The controllers', the runtimes', remote
  # access's and the CLI's tests (threads over fakes, forks, engines) run in the first pass only:
  # building and running them twice would not fit CI's 90 minutes. Every module's library (the
  # controllers', the runtimes' and the CLI's included) is still compiled by clang with
  # -Wthread-safety. Binaries not built here are registered as <name>_NOT_BUILT, which ctest leaves out.
  san_tests=(base_test net_test aws_test store_test objects_test s3api_test observe_test serving_test
             modelserver_test api_test agent_test runtime_test kiln_cli kiln_runtime_docker kiln_runtime_process
             kiln_access kiln_control)
  stage "unit tests under ASan+UBSan ($san_dir: ${san_tests[*]})"
  # Without libtorch: it is not built with the sanitizers (the TorchScript backend's tests run in the
  # first build).
  KILN_BUILD_DIR=$san_dir KILN_BUILD_TYPE=Debug KILN_BUILD_TARGETS="${san_tests[*]}" scripts/build.sh \
    -DKILN_SANITIZE=ON -DKILN_WITH_LIBTORCH=OFF "${san_cc[@]}" || exit 1
  (cd "$san_dir" && ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1 \
     ctest --output-on-failure -j "$(nproc)" --timeout 900 -E '_NOT_BUILT$') || failed=1
fi

if [ $failed -ne 0 ]; then echo "test.sh: unit tests FAILED (see above); running the integration suite anyway"; fi
stage "integration tests"
KILN_BIN="$(pwd)/build/src/cli/kiln" KILN_BUILD_DIR="$(pwd)/build" \
  /usr/bin/python3 -m pytest tests/integration -v -rs --durations=15
rc=$?
# Nothing is printed after pytest's summary line.
if [ $rc -ne 0 ]; then failed=1; fi
exit $failed
