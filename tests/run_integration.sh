#!/usr/bin/env bash
# Runs the integration suite (tests/integration) against a built kiln binary with Debian's
# Python (boto3 1.26) and AWS CLI v2. Extra arguments go to pytest, e.g.
#   tests/run_integration.sh -m 'not slow'          # skip the 300 MB transfers
#   tests/run_integration.sh -k listing -x
# Environment:
#   KILN_BIN        the kiln binary (default: build/src/cli/kiln)
#   KILN_BUILD_DIR  where objects_test lives (default: derived from KILN_BIN)
#   KILN_NEW_BOTO3_PYTHON  an interpreter with boto3 >= 1.36 for the newer-client runs
#   KILN_AWS_CLI    the AWS CLI to drive (default /usr/bin/aws)
set -euo pipefail
cd "$(dirname "$0")/.."
export KILN_BIN="${KILN_BIN:-$(pwd)/build/src/cli/kiln}"
if [ ! -x "$KILN_BIN" ]; then
  echo "run_integration.sh: no kiln binary at $KILN_BIN (build it: scripts/build.sh, or set KILN_BIN)" >&2
  exit 2
fi
exec /usr/bin/python3 -m pytest tests/integration -v -rs -p no:cacheprovider --durations=10 "$@"
