"""Launching the user's entry point: host resolution, and the commands of the toolkit's runners
(ProcessRunner, TorchDistributedRunner, MPI / SMDataParallel master and workers)."""

import os
import sys
import time

from kiln_errors import ClientError, log
from kiln_environment import MPI_CUSTOM_OPTIONS, MPI_NUM_PROCESSES, SMDDP_CUSTOM_OPTIONS, which
from kiln_code import PYTHON_PACKAGE, PYTHON_PROGRAM

MASTER_PORT = "7777"
SMDDP_SERVER_PORT = "7592"


def wait_hostname_resolution(hosts, current_host, environ):
    """Resolves every host, retrying with exponential back-off (100 ms doubling, at most 30 s
    between tries) for up to 15 minutes, as entry_point._wait_hostname_resolution does.

    Kiln: a single-host job talks to no other host, so nothing is looked up there.
    KILN_DNS_WAIT_SECONDS overrides the 15 minutes (tests)."""
    import socket
    if len(hosts) <= 1 and (not hosts or hosts[0] == current_host):
        return
    deadline = time.monotonic() + float(environ.get("KILN_DNS_WAIT_SECONDS", 900))
    for host in hosts:
        attempt = 0
        while True:
            try:
                socket.gethostbyname(host)
                break
            except OSError:
                attempt += 1
                delay = min(0.1 * (2 ** attempt), 30.0)
                if time.monotonic() + delay > deadline:
                    raise ClientError("Could not resolve host %s (DNS lookups for 15 minutes)"
                                      % host)
                time.sleep(delay)


# --------------------------------------------------------------------------------------------
# Launchers (ProcessRunner, TorchDistributedRunner, MPI / SMDataParallel master).

def _tool(name):
    """The tool on PATH (the toolkit runs it through a shell), else the one installed beside
    this interpreter (a venv's bin/ that is not on PATH)."""
    found = which(name)
    if found:
        return found
    beside = os.path.join(os.path.dirname(sys.executable), name)
    return beside if os.access(beside, os.X_OK) else None


def process_command(kind, name, args):
    py = sys.executable
    if kind == PYTHON_PACKAGE:
        return [py, "-m", name.replace(".py", "")] + args, None
    if kind == PYTHON_PROGRAM:
        return [py, name] + args, None
    import shlex
    inner = "./%s %s" % (name, " ".join(shlex.quote(a) for a in args))
    # The toolkit shows the command with the quotes it hands to its shell.
    return ["/bin/sh", "-c", inner], '/bin/sh -c "%s"' % inner


def torchrun_command(tenv, kind, name, args, processes_per_host):
    if kind == PYTHON_PACKAGE:
        raise ClientError("Python packages are not supported for torch_distributed. "
                          "Please use a python script as the entry-point")
    if kind != PYTHON_PROGRAM:
        raise ClientError("Unsupported entry point type for torch_distributed")
    hosts = tenv.distribution_hosts
    torchrun = _tool("torchrun")
    if torchrun:
        cmd, shown = [torchrun], ["torchrun"]
    else:
        cmd, shown = [sys.executable, "-m", "torch.distributed.run"], ["torchrun"]
    opts = ["--nnodes", str(len(hosts)), "--nproc_per_node", str(processes_per_host)]
    if len(hosts) > 1:
        opts += ["--master_addr", str(tenv.master_hostname), "--master_port", MASTER_PORT,
                 "--node_rank", str(hosts.index(tenv.current_host))]
    tail = opts + [str(name)] + args
    return cmd + tail, " ".join(shown + tail)


def mpi_command(tenv, kind, name, args, processes_per_host, env, smddp):
    """mpirun on the master with the toolkit's options (contract 12.2)."""
    mpirun = _tool("mpirun")
    if not mpirun:
        raise ClientError(
            "Kiln toolkit: this job asks for an MPI launch (%s) but mpirun is not installed "
            "in this environment. Install Open MPI (and mpi4py) in the environment, or use "
            "distribution={'torch_distributed': {'enabled': True}}."
            % ("pytorchddp/smdistributed" if smddp else "mpi"))
    iface = tenv.network_interface_name
    hosts = tenv.distribution_hosts
    num_processes = tenv.additional_framework_parameters.get(MPI_NUM_PROCESSES) or \
        len(hosts) * processes_per_host
    cmd = [mpirun, "--host", ",".join("%s:%s" % (h, processes_per_host) for h in hosts),
           "-np", str(num_processes), "--allow-run-as-root", "--tag-output",
           "-mca", "btl_tcp_if_include", iface, "-mca", "oob_tcp_if_include", iface,
           "-mca", "plm_rsh_no_tree_spawn", "1", "-bind-to", "none", "-map-by", "slot",
           "-mca", "pml", "ob1", "-mca", "btl", "^openib",
           "-mca", "orte_abort_on_non_zero_status", "1"]
    agent = env.get("KILN_MPI_RSH_AGENT")
    if agent:
        cmd += ["-mca", "plm_rsh_agent", agent]
    cmd += ["-x", "NCCL_SOCKET_IFNAME=%s" % iface, "-x", "NCCL_DEBUG=%s"
            % env.get("NCCL_DEBUG", "INFO")]
    if env.get("LD_PRELOAD"):
        cmd += ["-x", "LD_PRELOAD=%s" % env["LD_PRELOAD"]]
    for key in sorted(env):
        if key not in ("NCCL_SOCKET_IFNAME", "NCCL_DEBUG", "LD_PRELOAD") and \
                not key.startswith("BASH_FUNC"):
            cmd += ["-x", key]
    import shlex
    custom = tenv.additional_framework_parameters.get(
        SMDDP_CUSTOM_OPTIONS if smddp else MPI_CUSTOM_OPTIONS, "")
    cmd += shlex.split(str(custom or ""))
    if kind == PYTHON_PACKAGE:
        prog = [sys.executable, "-m", name.replace(".py", "")]
    elif kind == PYTHON_PROGRAM:
        prog = [sys.executable, "-m", "mpi4py", name] if not smddp else [sys.executable, name]
    else:
        prog = ["./%s" % name]
    if smddp and _tool("smddprun"):
        prog = [_tool("smddprun")] + prog
    cmd += prog + args
    return cmd, None


def mpi_worker_wait(sup, tenv):
    """Workers of an MPI job run nothing themselves: the master's mpirun starts orted here
    (through Kiln's remote-launch agent). Wait until orted has come and gone."""
    def orted_running():
        for pid in os.listdir("/proc"):
            if pid.isdigit():
                try:
                    with open("/proc/%s/comm" % pid) as f:
                        if f.read().strip() in ("orted", "prted"):
                            return True
                except OSError:
                    pass
        return False
    log(20, "MPI worker %s waiting for the master %s to start orted"
        % (tenv.current_host, tenv.master_hostname))
    deadline = time.monotonic() + 3600
    while not orted_running():
        sup.check_stopped()
        if time.monotonic() > deadline:
            raise ClientError("MPI worker: orted was not started by the master within 1 hour")
        time.sleep(1)
    while orted_running():
        sup.check_stopped()
        time.sleep(1)
    log(20, "Orted process exited")
