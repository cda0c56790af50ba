#!/usr/bin/env bash
# Sets Podman up for Kiln's container runtime (config "container_engine", README "Container
# runtime") on a Debian 12 node, as root, and starts its Docker-compatible API service:
#   1. cgroup v1 only: mounts the hugetlb controller when it is not mounted (Podman's rootful
#      containers fail to start without it);
#   2. /etc/containers/containers.conf with default_ulimits nofile and nproc the node can give
#      (`podman run`/`podman build` otherwise fail "setrlimit RLIMIT_NPROC: Operation not
#      permitted" in containers and VMs with a low hard limit); written when absent, or when
#      CI=true; an operator's existing file is never replaced otherwise;
#   3. `podman system service --time=0 unix://<socket>` in the background when the socket does not
#      answer, then waits (at most 20 s) until GET /_ping answers.
# Idempotent. Exits 0 when the socket answers, else non-zero with the reason as the last line.
#   scripts/podman-setup.sh [SOCKET]      (default /run/podman/podman.sock)
set -uo pipefail

socket="${1:-/run/podman/podman.sock}"
socket="${socket#unix://}"
log=/tmp/kiln-podman-service.log

fail() {
  echo "podman-setup: $*" >&2
  exit 1
}

ping_socket() {
  [ -S "$socket" ] && [ "$(curl -s -m 2 --unix-socket "$socket" http://d/_ping 2>/dev/null)" = OK ]
}

[ "$(id -u)" = 0 ] || fail "needs root (rootful Podman; run with sudo)"
command -v podman >/dev/null 2>&1 || fail "podman is not installed (apt-get install podman crun)"
command -v curl >/dev/null 2>&1 || fail "curl is not installed (apt-get install curl)"

# 1. cgroup v1 (a tmpfs at /sys/fs/cgroup): the hugetlb hierarchy, when the kernel has it.
if [ "$(stat -fc %T /sys/fs/cgroup 2>/dev/null)" = tmpfs ] && grep -qw '^hugetlb' /proc/cgroups 2>/dev/null; then
  if ! mountpoint -q /sys/fs/cgroup/hugetlb 2>/dev/null; then
    # The cgroup tmpfs may be read-only (a container): then it cannot be helped here.
    if mkdir -p /sys/fs/cgroup/hugetlb 2>/dev/null && mount -t cgroup -o hugetlb cgroup /sys/fs/cgroup/hugetlb; then
      echo "podman-setup: mounted the hugetlb cgroup at /sys/fs/cgroup/hugetlb"
    else
      echo "podman-setup: warning: could not mount the hugetlb cgroup (containers may fail to start)" >&2
    fi
  fi
fi

# 2. containers.conf: default ulimits within the node's hard limits.
conf=/etc/containers/containers.conf
if [ ! -e "$conf" ] || [ "${CI:-}" = true ]; then
  nofile=$(ulimit -Hn)
  nproc=$(ulimit -Hu)
  [ "$nofile" = unlimited ] || [ "$nofile" -gt 20000 ] && nofile=20000
  [ "$nproc" = unlimited ] || [ "$nproc" -gt 4096 ] && nproc=4096
  mkdir -p /etc/containers
  cat > "$conf.kiln-tmp" <<CONF
# Written by Kiln's scripts/podman-setup.sh: limits every container may have on this node (Podman's
# own defaults can exceed the node's hard limits, and crun then fails setrlimit).
[containers]
default_ulimits = ["nofile=$nofile:$nofile","nproc=$nproc:$nproc"]
CONF
  mv "$conf.kiln-tmp" "$conf"
  echo "podman-setup: wrote $conf (nofile=$nofile, nproc=$nproc)"
elif ! grep -q '^[[:space:]]*default_ulimits' "$conf"; then
  echo "podman-setup: note: $conf has no default_ulimits; if \`podman run\` fails with" \
    "\"setrlimit RLIMIT_NPROC\", add default_ulimits = [\"nofile=20000:20000\",\"nproc=4096:4096\"] under [containers]"
fi

# 3. The API service.
# The service answering is not enough when Podman's storage cannot work here (e.g. overlay on
# overlayfs): `podman info` opens it, and says why when it cannot.
check_storage() {
  local info
  if ! info=$(podman info --format '{{.Store.GraphDriverName}} {{.Store.GraphRoot}}' 2>&1); then
    echo "$info" | tail -n 3 >&2
    fail "podman info failed: Podman's storage does not work here (see above)"
  fi
  echo "podman-setup: storage: $info"
}

# A service whose working directory was deleted (started from a checkout that is gone, e.g. an
# earlier test run's clone) answers pings but cannot start containers: conmon fails "Failed to get
# working directory". Such a service is replaced.
for pid in $(pgrep -f "podman system service --time=0 unix://$socket" || true); do
  case "$(readlink "/proc/$pid/cwd" 2>/dev/null)" in
    *" (deleted)")
      echo "podman-setup: replacing the API service $pid (its working directory was deleted)"
      kill "$pid" 2>/dev/null || true
      for _ in $(seq 1 40); do kill -0 "$pid" 2>/dev/null || break; sleep 0.25; done
      ;;
  esac
done
if ping_socket; then
  check_storage
  echo "podman-setup: Podman's API answers at unix://$socket"
  exit 0
fi
mkdir -p "$(dirname "$socket")"
# A socket file left by a service that died would make the new one fail to bind.
[ -S "$socket" ] && rm -f "$socket"
# Its own session, so that it outlives this script (and the test run's process group).
# From /: the service (and every conmon it starts) keeps its working directory for its whole life.
# The redirections cover the whole background job and `exec` leaves no shell copy behind: a copy
# that forked setsid and waited for it kept this script's stdout open for the service's whole life,
# so a caller reading our output (`out=$(podman-setup.sh)`, test.sh) never saw it end; that hung a
# fresh machine's CI run, where the service was not yet running.
(cd / && exec setsid podman system service --time=0 "unix://$socket") >"$log" 2>&1 </dev/null &
for _ in $(seq 1 80); do
  if ping_socket; then
    check_storage
    echo "podman-setup: started Podman's API service at unix://$socket (log: $log)"
    exit 0
  fi
  sleep 0.25
done
tail -n 5 "$log" >&2 2>/dev/null
fail "Podman's API service did not answer at unix://$socket within 20 s (log: $log)"
