#!/usr/bin/env bash
# README command 1: install what is needed, build, and start `kiln server` on its embedded
# defaults (SQLite, the built-in object store) at 127.0.0.1:5456 with data in ~/.kiln
# (or $KILN_DATA_DIR). Prints how to point AWS clients at it, then serves until Ctrl-C.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
scripts/build.sh
data_dir="${KILN_DATA_DIR:-$HOME/.kiln}"
listen="${KILN_LISTEN:-127.0.0.1:5456}"
build/src/cli/kiln server --data-dir "$data_dir" --listen "$listen" &
server_pid=$!
trap 'kill -TERM $server_pid 2>/dev/null; wait $server_pid' INT TERM
for _ in $(seq 1 100); do
  if curl -fsS "http://$listen/_kiln/health" >/dev/null 2>&1; then break; fi
  sleep 0.1
done
cat <<MSG

Kiln is running at http://$listen (data in $data_dir).
Point AWS clients at it from another shell:

  eval "\$($(pwd)/build/src/cli/kiln env --data-dir $data_dir --listen $listen)"
  aws s3 mb s3://my-bucket                       # AWS CLI >= 2.13 reads AWS_ENDPOINT_URL
  aws --endpoint-url "\$AWS_ENDPOINT_URL" s3 ls  # older clients need the flag

The web console: http://$listen/console/ (sign in with the key \`kiln env\` prints).

Stop with Ctrl-C.
MSG
wait $server_pid
