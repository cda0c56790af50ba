"""Helpers for the per-instance network tests (issue 14: test_instance_networks.py,
test_distributed_training.py, bench/distributed_bench.py): what the hosts of a job printed
through jobs/distributed/net_probe.py, per-host log streams, and what a job leaves on the node
(Kiln bridges found by their ifalias, veths on them, processes of the job, their network
namespaces).

Kiln's bridges carry the ifalias "kiln <state_dir> <network name>" (runtime/process/
bridge_networks.h), a training job's network is `training-<job>`, its hosts' veths are the
bridge's ports; a namespace lives as long as a process is in it (the shim creates them with
unshare, nothing is bind-mounted), so "no process of the job" is "no namespace of the job"."""

import ipaddress
import json
import os
import re
import socket
import subprocess
import threading

import pytest

import training_helpers as th

HERE = os.path.dirname(os.path.abspath(__file__))
DIST_DIR = os.path.join(HERE, "jobs", "distributed")
NET_PROBE = os.path.join(DIST_DIR, "net_probe.py")
SYS_NET = "/sys/class/net"


def net_probe_image():
    return "local:" + NET_PROBE


def require_root():
    if os.geteuid() != 0:
        pytest.skip("per-instance networks need root (CAP_NET_ADMIN): the server runs namespaced only as "
                    "root, and these tests check namespaces, bridges and veths on the node")


def network_config(cidr, **scheduler):
    """A server config: network mode auto (namespaces when root) on `cidr` (a range no other test
    uses), shrink scheduling so that two 2-vCPU hosts fit a 2-core machine, short stop grace."""
    sched = {"policy": "shrink", "allow_cpu_fallback": True}
    sched.update(scheduler)
    return {"scheduler": sched, "training": {"stop_grace_seconds": 5},
            "network": {"mode": "auto", "cidr": cidr}}


def stop_running_jobs(sm, timeout=60):
    """Stops every job of the server that has not ended and waits (bounded) until they have: a job's
    hosts outlive a stopped server by design, so a failed test would otherwise leave its sleeping
    hosts, namespaces and bridge on the node."""
    import time
    names = []
    for status in ("InProgress", "Stopping"):
        for j in sm.list_training_jobs(StatusEquals=status, MaxResults=100)["TrainingJobSummaries"]:
            names.append(j["TrainingJobName"])
            if status == "InProgress":
                try:
                    sm.stop_training_job(TrainingJobName=j["TrainingJobName"])
                except Exception:  # noqa: BLE001 (it may have ended meanwhile)
                    pass
    deadline = time.monotonic() + timeout
    for name in names:
        while time.monotonic() < deadline:
            if sm.describe_training_job(TrainingJobName=name)["TrainingJobStatus"] in th.TERMINAL:
                break
            time.sleep(0.5)


# ---------------------------------------------------------------------------------------------
# What the hosts printed


def host_streams(logs, job):
    """{"algo-N": [messages]} from the per-host streams `<job>/algo-N-<epoch>` (epochs of one host
    concatenated in name order)."""
    out = {}
    pattern = re.compile(r"^%s/(algo-\d+)-\d+$" % re.escape(job))
    for stream in th.job_streams(logs, job):
        m = pattern.match(stream)
        assert m, "stream %r is not named <job>/algo-N-<epoch>" % stream
        out.setdefault(m.group(1), []).extend(e["message"] for e in th.stream_events(logs, stream))
    return out


def tagged(lines, tag):
    """The rest of every line starting with `tag ` (e.g. NETINFO, SHARD)."""
    return [line[len(tag) + 1:] for line in lines if line.startswith(tag + " ")]


def netinfo(logs, job):
    """{"algo-N": the NETINFO json the host printed}."""
    out = {}
    for host, lines in host_streams(logs, job).items():
        found = tagged(lines, "NETINFO")
        if found:
            out[host] = json.loads(found[0])
    return out


def wait_netinfo(logs, job, hosts, timeout=120):
    return th.wait_until(lambda: (lambda n: n if len(n) >= hosts else None)(netinfo(logs, job)),
                         timeout=timeout, what="NETINFO of %d hosts of %s" % (hosts, job))


def check_namespaced(infos, cidr, isolated=False):
    """Each host has its own address on `network_interface_name` inside `cidr`, all hosts on one
    subnet, every algo-N resolving to that host's address, its hostname algo-N, and (not isolated)
    a default route through the subnet's gateway. Returns {host: address}."""
    net = ipaddress.ip_network(cidr)
    addresses = {}
    for host, info in sorted(infos.items()):
        eth = info.get("interface")
        assert eth, "%s has no %s interface (not in a namespace of its own?): %s" % (
            host, info.get("interface_name"), info)
        assert info["interface_name"] == "eth0", info
        assert ipaddress.ip_address(eth["address"]) in net, (
            "%s's address %s is not in the configured range %s: the server is not running instances in "
            "namespaces (network mode auto as root should)" % (host, eth["address"], cidr))
        assert info["hostname"] == host, info
        addresses[host] = eth["address"]
        if isolated:
            assert info["default_route"] is None, info
        else:
            assert info["default_route"] == eth["gateway"], info
        assert "lo" in info["interfaces"] and "eth0" in info["interfaces"], info
    assert len(set(addresses.values())) == len(addresses), addresses
    assert len({i["interface"]["network"] for i in infos.values()}) == 1, infos
    for host, info in infos.items():
        assert info["resolves"] == addresses, (host, info["resolves"], addresses)
    return addresses


# ---------------------------------------------------------------------------------------------
# What a job leaves on the node


def _read(path):
    try:
        with open(path, "rb") as f:
            return f.read().decode("utf-8", "replace").strip()
    except OSError:
        return None


def links():
    try:
        return set(os.listdir(SYS_NET))
    except OSError:
        return set()


def kiln_bridges(data_dir, network):
    """Links whose ifalias says Kiln made them for `network` of the server with `data_dir`."""
    out = []
    for name in links():
        alias = _read(os.path.join(SYS_NET, name, "ifalias")) or ""
        if alias.startswith("kiln ") and alias.endswith(" " + network) and data_dir in alias:
            out.append(name)
    return sorted(out)


def bridge_ports(bridge):
    try:
        return sorted(os.listdir(os.path.join(SYS_NET, bridge, "brif")))
    except OSError:
        return []


def _environ(pid):
    try:
        with open("/proc/%s/environ" % pid, "rb") as f:
            return f.read().split(b"\0")
    except OSError:
        return []


def _cmdline(pid):
    try:
        with open("/proc/%s/cmdline" % pid, "rb") as f:
            return f.read().replace(b"\0", b" ")
    except OSError:
        return b""


def job_processes(job, data_dir=None):
    """Pids of the job's processes still alive: its programs (TRAINING_JOB_NAME in the environment)
    and its shims (the pids in <data_dir>/instances/training-<job>-algo-N/started.json, when they are
    still a process whose command line or environment names that instance)."""
    want = ("TRAINING_JOB_NAME=%s" % job).encode()
    instance = ("training-%s-algo-" % job).encode()
    pids = set()
    for pid in os.listdir("/proc"):
        if not pid.isdigit() or int(pid) == os.getpid():
            continue
        env = _environ(pid)
        if want in env or instance in _cmdline(pid) or any(instance in e for e in env):
            pids.add(int(pid))
    if data_dir:
        root = os.path.join(data_dir, "instances")
        for d in (os.listdir(root) if os.path.isdir(root) else []):
            if not d.startswith("training-%s-algo-" % job):
                continue
            try:
                with open(os.path.join(root, d, "started.json")) as f:
                    shim = json.load(f).get("shim_pid")
            except (OSError, ValueError):
                continue
            if shim and os.path.exists("/proc/%d" % shim):
                cmd = _cmdline(shim)
                if d.encode() in cmd or any(d.encode() in e for e in _environ(shim)) or b"shim" in cmd:
                    pids.add(int(shim))
    return sorted(pids)


def program_hosts(job):
    """{"algo-N": [pids]} of the job's programs still alive (TRAINING_JOB_NAME in the environment),
    the host read from resourceconfig.json as the process sees it (/proc/<pid>/root)."""
    want = ("TRAINING_JOB_NAME=%s" % job).encode()
    out = {}
    for pid in os.listdir("/proc"):
        if pid.isdigit() and want in _environ(pid):
            try:
                with open("/proc/%s/root/opt/ml/input/config/resourceconfig.json" % pid) as f:
                    host = json.load(f)["current_host"]
            except (OSError, ValueError, KeyError):
                host = "?"
            out.setdefault(host, []).append(int(pid))
    return out


def netns_of(pids):
    """{pid: net namespace inode} of the pids that are still alive."""
    out = {}
    for pid in pids:
        try:
            out[pid] = os.readlink("/proc/%d/ns/net" % pid)
        except OSError:
            pass
    return out


def boot_ticks():
    """Now, in clock ticks since boot (the unit of a process's start time in /proc/<pid>/stat)."""
    return float(_read("/proc/uptime").split()[0]) * os.sysconf("SC_CLK_TCK")


def start_ticks(pid):
    """When process `pid` started, in clock ticks since boot (None when it is gone)."""
    stat = _read("/proc/%d/stat" % pid)
    if not stat:
        return None
    # The command name (field 2) may hold spaces and parentheses: fields resume after the last ')'.
    return int(stat[stat.rindex(")") + 2:].split()[19])


def processes_in_netns(inodes, started_before=None):
    """Pids (any process of the node) in one of the namespaces `inodes` ("net:[...]"). With
    started_before (ticks since boot), only processes that started by then: the kernel reuses a freed
    namespace's inode number, so a namespace made later (another job's) can carry the same name."""
    found = []
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            try:
                if os.readlink("/proc/%s/ns/net" % pid) not in inodes:
                    continue
            except OSError:
                continue
            started = start_ticks(int(pid))
            if started is not None and (started_before is None or started <= started_before):
                found.append(int(pid))
    return found


def nsfs_mounts(inodes):
    """Bind mounts of the namespaces `inodes` in the node's mount table (ip netns add leaves one)."""
    text = _read("/proc/1/mountinfo") or ""
    numbers = {i[len("net:["):-1] for i in inodes}
    return [line for line in text.splitlines() if " nsfs " in line and any("[%s]" % n in line for n in numbers)]


class Footprint:
    """What a running job has on the node, taken while it runs: its bridge(s), the bridge's
    ports (veths), its processes and their network namespaces. gone() says what is still there."""

    def __init__(self, data_dir, job):
        self.data_dir, self.job = data_dir, job
        self.network = "training-" + job
        self.bridges = kiln_bridges(data_dir, self.network)
        self.veths = sorted(v for b in self.bridges for v in bridge_ports(b))
        self.pids = job_processes(job, data_dir)
        self.netns = sorted(set(netns_of(self.pids).values()) - {os.readlink("/proc/self/ns/net")})
        # Processes of the job's namespaces started later are not the job's (inode numbers are reused
        # once its namespaces are gone); a later process of the job names it and is in job_processes.
        self.taken_at = boot_ticks()

    def describe(self):
        return "bridges %s, veths %s, pids %s, namespaces %s" % (self.bridges, self.veths, self.pids, self.netns)

    def left(self):
        """What of the footprint is still on the node (empty dict when all is gone)."""
        now = links()
        out = {}
        bridges = kiln_bridges(self.data_dir, self.network)
        if bridges:
            out["bridges"] = bridges
        veths = [v for v in self.veths if v in now]
        if veths:
            out["veths"] = veths
        pids = job_processes(self.job, self.data_dir)
        if pids:
            out["processes"] = {p: _cmdline(p).decode("utf-8", "replace")[:200] for p in pids}
        in_ns = processes_in_netns(set(self.netns), started_before=self.taken_at)
        if in_ns:
            out["processes in the job's namespaces"] = in_ns
        mounts = nsfs_mounts(self.netns)
        if mounts:
            out["namespace mounts"] = mounts
        return out


class NodeListener:
    """A TCP listener on 0.0.0.0:<free port> of the node that records who connected (instances on
    per-instance networks try to reach the node through it)."""

    def __init__(self):
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind(("0.0.0.0", 0))
        self.sock.listen(64)
        self.port = self.sock.getsockname()[1]
        self.peers = []
        self.closed = False
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self):
        while not self.closed:
            try:
                conn, peer = self.sock.accept()
            except OSError:
                return
            self.peers.append(peer[0])
            conn.close()

    def close(self):
        self.closed = True
        self.sock.close()


def node_address():
    """A non-loopback IPv4 address of the node that is not on a Kiln bridge or veth."""
    out = subprocess.run(["ip", "-4", "-o", "addr", "show", "scope", "global"], capture_output=True,
                         text=True).stdout
    for line in out.splitlines():
        m = re.match(r"\d+:\s+(\S+)\s+inet (\d+\.\d+\.\d+\.\d+)/", line)
        if m and not m.group(1).startswith(("kb-", "kv")) and not ipaddress.ip_address(m.group(2)).is_loopback:
            return m.group(2)
    pytest.skip("the node has no non-loopback IPv4 address to try")
