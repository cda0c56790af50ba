#!/usr/bin/env bash
# A real Slurm cluster on this one host, for Kiln's Slurm runtime tests (tests/integration/
# test_slurm.py, bench/slurm_bench.py; issue 21). Debian's slurm-wlm (22.05) + munge, as root:
#
#   slurmctld   on the host, at 10.77.0.1 on the bridge kslurm0 (SlurmctldHost=<hostname>(10.77.0.1))
#   slurmd kn1  10.77.0.11 \  each in its own network + UTS + mount namespace (Debian's slurmd is not
#   slurmd kn2  10.77.0.12 /  built with --enable-multiple-slurmd): a veth to kslurm0, hostname knN,
#                             a private /tmp, its own spool and log, /etc/hosts naming the cluster
#                             and /etc/resolv.conf (no DNS)
#
# Plugins: proctrack/linuxproc, task/none, select/cons_tres CR_CPU, no accounting, no cgroups
# (nothing here needs them, and the host's cgroup layout then does not matter). Each node claims
# 64 CPUs and ~500 GB (SlurmdParameters=config_overrides) so that jobs shaped like ml.* instances
# fit; CPUs are not really reserved. SlurmdTimeout=10 s: a node whose slurmd is gone is DOWN within
# seconds. batch_sched_delay=0: a batch job is placed as soon as it is submitted (Slurm's default
# delays it up to 3 s, which would dominate the job-start numbers). BatchStartTimeout=120: with
# dozens of jobs starting at once on a 2-core host a batch step may take longer than Slurm's 10 s
# default to start, and slurmctld then ends the job as a node failure. Partitions: "debug" (default, both nodes) and "kdown" (State=DOWN: jobs sent there stay
# PENDING with reason PartitionDown, for the tests of pending reasons).
#
# /etc/slurm/slurm.conf is written by this script (clients find it there); an existing one that
# this script did not write is never replaced (it says so and stops). State, spool and logs live
# under /var/lib/kiln-slurm (logs: ctld.log, kn1/slurmd.log, kn2/slurmd.log).
#
#   scripts/slurm-setup.sh [up]     start what is not running; idempotent. Exits 0 once
#                                   both nodes are idle (at most ~30 s), else 1 with the reason
#                                   as the last line.
#   scripts/slurm-setup.sh down     stop the daemons (munged too when this script started it),
#                                   remove the namespaces, veths and bridge, and the state
#   scripts/slurm-setup.sh status   print sinfo; exit 0 iff both nodes answer
#
# Check: sbatch --nodes=2 -o /dev/null --wrap 'srun hostname'  (prints kn1 and kn2 in the output).
set -uo pipefail

action="${1:-up}"
base=/var/lib/kiln-slurm
conf=/etc/slurm/slurm.conf
bridge=kslurm0
ctl_addr=10.77.0.1
nodes=(kn1 kn2)
declare -A node_addr=([kn1]=10.77.0.11 [kn2]=10.77.0.12)
marker="# Written by Kiln's scripts/slurm-setup.sh"

fail() {
  echo "slurm-setup: $*" >&2
  echo "slurm-setup: $*"
  exit 1
}
say() { echo "slurm-setup: $*"; }

pid_alive() { [ -n "${1:-}" ] && kill -0 "$1" 2>/dev/null; }
pid_of_file() { [ -r "$1" ] && cat "$1" 2>/dev/null; }

# The pid from `file` if it is alive and runs `exe` (a stale pid file after a reboot names another
# process, or none).
daemon_pid() {
  local file=$1 exe=$2 pid
  pid=$(pid_of_file "$file") || return 1
  pid_alive "$pid" || return 1
  # Debian's daemons are alternatives links (/usr/sbin/slurmd -> slurmd-wlm): compare real paths.
  [ "$(readlink "/proc/$pid/exe" 2>/dev/null)" = "$(readlink -f "$exe")" ] || return 1
  echo "$pid"
}

stop_pid_file() {
  local file=$1 exe=$2 name=$3 pid i
  pid=$(daemon_pid "$file" "$exe") || { rm -f "$file"; return 0; }
  kill "$pid" 2>/dev/null
  for i in $(seq 1 50); do pid_alive "$pid" || break; sleep 0.1; done
  pid_alive "$pid" && kill -9 "$pid" 2>/dev/null
  rm -f "$file"
  say "stopped $name (pid $pid)"
}

down() {
  for n in "${nodes[@]}"; do
    stop_pid_file "$base/$n/slurmd.pid" /usr/sbin/slurmd "slurmd $n"
    # Job processes of a killed slurmd (slurmstepd and its tasks) run on in the namespace: end
    # them, or the namespace (and its veth) outlives the teardown.
    if [ -e "/run/netns/kslurm-$n" ]; then
      for pid in $(ip netns pids "kslurm-$n" 2>/dev/null); do kill -9 "$pid" 2>/dev/null; done
      ip netns del "kslurm-$n" 2>/dev/null
    fi
    ip link del "ks-$n" 2>/dev/null
  done
  stop_pid_file "$base/slurmctld.pid" /usr/sbin/slurmctld slurmctld
  if [ -e "$base/munged.started" ]; then
    stop_pid_file /run/munge/munged.pid /usr/sbin/munged munged
    rm -f "$base/munged.started"
  fi
  ip link del "$bridge" 2>/dev/null
  # Spool, job state and logs go; the config is left (it is only read while daemons run).
  rm -rf "$base"
  say "down"
}

status() {
  command -v sinfo >/dev/null 2>&1 || fail "sinfo is not installed"
  sinfo -N -h -o '%N %T' 2>&1
  local idle
  idle=$(sinfo -N -h -o '%N %T' 2>/dev/null | grep -cE '^kn[12] (idle|mixed|allocated|completing)')
  [ "$idle" = 2 ]
}

case "$action" in
  up) ;;
  down) down; exit 0 ;;
  status) status; exit $? ;;
  *) echo "usage: $0 [up|down|status]" >&2; exit 2 ;;
esac

# ---- up ----
[ "$(id -u)" = 0 ] || fail "needs root (network namespaces, the bridge, slurmd): run with sudo"
for cmd in slurmctld slurmd munged sbatch scontrol sinfo ip unshare nsenter; do
  command -v "$cmd" >/dev/null 2>&1 || fail "$cmd is not installed (apt-get install slurm-wlm slurm-client munge iproute2; scripts/install-deps.sh --test)"
done
ctl_host=$(hostname -s)
[ -n "$ctl_host" ] || fail "this host has no hostname (SlurmctldHost needs one)"

# 1. The bridge and the node namespaces. A failure here is the host forbidding them (a container
#    without CAP_NET_ADMIN, say): say so.
mkdir -p "$base"
if ! ip link show "$bridge" >/dev/null 2>&1; then
  ip link add "$bridge" type bridge 2>"$base/ip.err" || fail "cannot create bridge $bridge: $(cat "$base/ip.err")"
fi
ip addr replace "$ctl_addr/24" dev "$bridge" 2>"$base/ip.err" || fail "cannot address $bridge: $(cat "$base/ip.err")"
ip link set "$bridge" up || fail "cannot bring $bridge up"

cat > "$base/hosts" <<HOSTS
127.0.0.1 localhost
$ctl_addr $ctl_host kslurmctl
HOSTS
# The nodes have no way out but the bridge: a resolver on their own 127.0.0.1 (nothing listens:
# refused at once) rather than the host's, which a node cannot reach and would wait on (glibc asks
# DNS for the AAAA records /etc/hosts lacks).
cat > "$base/resolv.conf" <<RESOLV
nameserver 127.0.0.1
options timeout:1 attempts:1
RESOLV
for n in "${nodes[@]}"; do
  echo "${node_addr[$n]} $n" >> "$base/hosts"
  ns="kslurm-$n"
  if [ ! -e "/run/netns/$ns" ]; then
    ip netns add "$ns" 2>"$base/ip.err" || fail "cannot create network namespace $ns: $(cat "$base/ip.err")"
  fi
  if ! ip netns exec "$ns" ip link show eth0 >/dev/null 2>&1; then
    ip link del "ks-$n" 2>/dev/null
    ip link add "ks-$n" type veth peer name eth0 netns "$ns" 2>"$base/ip.err" ||
      fail "cannot create the veth of $n: $(cat "$base/ip.err")"
  fi
  ip link set "ks-$n" master "$bridge" up || fail "cannot attach ks-$n to $bridge"
  ip netns exec "$ns" ip link set lo up
  ip netns exec "$ns" ip addr replace "${node_addr[$n]}/24" dev eth0 || fail "cannot address eth0 of $n"
  ip netns exec "$ns" ip link set eth0 up
  ip netns exec "$ns" ip route replace default via "$ctl_addr" 2>/dev/null
done

# 2. munge: the key (the package creates one; make one if it did not) and munged.
if [ ! -s /etc/munge/munge.key ]; then
  if command -v mungekey >/dev/null 2>&1; then mungekey --create --force >/dev/null 2>&1; fi
  [ -s /etc/munge/munge.key ] || { dd if=/dev/urandom of=/etc/munge/munge.key bs=1024 count=1 2>/dev/null; }
  chown munge:munge /etc/munge/munge.key 2>/dev/null
  chmod 0400 /etc/munge/munge.key
  say "created /etc/munge/munge.key"
fi
if ! munge -n 2>/dev/null | unmunge >/dev/null 2>&1; then
  mkdir -p /run/munge /var/log/munge /var/lib/munge
  chown munge:munge /run/munge /var/log/munge /var/lib/munge 2>/dev/null
  chmod 0755 /run/munge
  runuser -u munge -- /usr/sbin/munged --force 2>"$base/munged.err" ||
    /usr/sbin/munged --force 2>>"$base/munged.err" || fail "munged does not start: $(tail -n 1 "$base/munged.err")"
  touch "$base/munged.started"
  for i in $(seq 1 50); do munge -n 2>/dev/null | unmunge >/dev/null 2>&1 && break; sleep 0.1; done
  munge -n 2>/dev/null | unmunge >/dev/null 2>&1 || fail "munged started but munge -n | unmunge fails: $(tail -n 1 "$base/munged.err")"
  say "started munged"
fi

# 3. slurm.conf (ours, or refuse).
if [ -e "$conf" ] && ! grep -qF "$marker" "$conf"; then
  fail "$conf exists and was not written by this script: this host has a Slurm configuration of its own (move it away to use the test cluster)"
fi
mkdir -p /etc/slurm "$base/ctld"
tmp="$conf.kiln-tmp"
cat > "$tmp" <<CONF
$marker: the single-host test cluster (see the script).
ClusterName=kiln
SlurmctldHost=$ctl_host($ctl_addr)
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CryptoType=crypto/munge
MpiDefault=none
SwitchType=switch/none
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SlurmdParameters=config_overrides
SlurmctldPort=6817
SlurmdPort=6818
StateSaveLocation=$base/ctld
SlurmctldPidFile=$base/slurmctld.pid
SlurmctldLogFile=$base/ctld.log
SlurmdSpoolDir=$base/%n/spool
SlurmdPidFile=$base/%n/slurmd.pid
SlurmdLogFile=$base/%n/slurmd.log
SlurmctldDebug=info
SlurmdDebug=info
ReturnToService=2
SlurmdTimeout=10
SlurmctldTimeout=10
MessageTimeout=20
BatchStartTimeout=120
InactiveLimit=0
KillWait=10
MinJobAge=300
JobRequeue=0
SchedulerParameters=batch_sched_delay=0
NodeName=kn1 NodeAddr=${node_addr[kn1]} CPUs=64 RealMemory=500000 State=UNKNOWN
NodeName=kn2 NodeAddr=${node_addr[kn2]} CPUs=64 RealMemory=500000 State=UNKNOWN
PartitionName=debug Nodes=kn1,kn2 Default=YES MaxTime=INFINITE State=UP
PartitionName=kdown Nodes=kn1,kn2 Default=NO MaxTime=INFINITE State=DOWN
CONF
if ! cmp -s "$tmp" "$conf"; then
  mv "$tmp" "$conf"
  conf_changed=1
  say "wrote $conf"
else
  rm -f "$tmp"
  conf_changed=0
fi

# 4. slurmctld on the host.
if pid=$(daemon_pid "$base/slurmctld.pid" /usr/sbin/slurmctld); then
  if [ "$conf_changed" = 1 ]; then scontrol reconfigure >/dev/null 2>&1; fi
else
  /usr/sbin/slurmctld 2>"$base/ctld.err" || fail "slurmctld does not start: $(tail -n 1 "$base/ctld.err") $(tail -n 2 "$base/ctld.log" 2>/dev/null)"
  for i in $(seq 1 100); do scontrol ping 2>/dev/null | grep -q 'is UP' && break; sleep 0.1; done
  scontrol ping 2>/dev/null | grep -q 'is UP' || fail "slurmctld does not answer (log $base/ctld.log): $(tail -n 2 "$base/ctld.log" 2>/dev/null)"
  say "started slurmctld"
fi

# 5. One slurmd per node, in its namespace: nsenter joins the network namespace (not `ip netns
#    exec`, which remounts /sys and so hides /sys/fs/cgroup, without which slurmd 22.05 refuses to
#    start even with no cgroup plugin configured); unshare adds the UTS and mount namespaces, where
#    /tmp and /etc/hosts are the node's own.
for n in "${nodes[@]}"; do
  mkdir -p "$base/$n/spool" "$base/$n/tmp"
  chmod 1777 "$base/$n/tmp"
  if daemon_pid "$base/$n/slurmd.pid" /usr/sbin/slurmd >/dev/null; then continue; fi
  nsenter --net="/run/netns/kslurm-$n" unshare --uts --mount --propagation private sh -c "
    hostname $n &&
    mount --bind '$base/$n/tmp' /tmp &&
    mount --bind '$base/hosts' /etc/hosts &&
    mount --bind '$base/resolv.conf' /etc/resolv.conf &&
    exec /usr/sbin/slurmd -N $n" 2>"$base/$n/start.err" ||
    fail "slurmd $n does not start: $(tail -n 1 "$base/$n/start.err") $(tail -n 2 "$base/$n/slurmd.log" 2>/dev/null)"
  say "started slurmd $n (${node_addr[$n]})"
done

# 6. Wait until both nodes are usable; a node left DOWN by an earlier run (or drained) is resumed.
for i in $(seq 1 300); do
  states=$(sinfo -N -h -p debug -o '%N %T' 2>/dev/null)
  ready=$(echo "$states" | grep -cE '^kn[12] (idle|mixed|allocated|completing)$')
  [ "$ready" = 2 ] && break
  if [ $((i % 20)) = 0 ]; then
    for n in "${nodes[@]}"; do
      if echo "$states" | grep -qE "^$n (down|drained|draining|fail)"; then
        scontrol update nodename="$n" state=resume >/dev/null 2>&1
      fi
    done
  fi
  sleep 0.1
done
[ "$ready" = 2 ] || fail "the nodes are not ready after 30 s: $(echo $states) (logs: $base/kn1/slurmd.log, $base/ctld.log: $(tail -n 1 "$base/kn1/slurmd.log" 2>/dev/null))"
say "up: slurmctld $ctl_host ($ctl_addr), nodes kn1 (${node_addr[kn1]}) kn2 (${node_addr[kn2]}) idle"
