"""Launching the user's entry point: host resolution, and the commands of the toolkit's runners
(ProcessRunner, TorchDistributedRunner, MPI / SMDataParallel master and workers)."""

import os
import sys
import time

from kiln_errors import ClientError, ExecuteUserScriptError, Stopped, log
from kiln_environment import MPI_CUSTOM_OPTIONS, MPI_NUM_PROCESSES, SMDDP_CUSTOM_OPTIONS, which
from kiln_code import PYTHON_PACKAGE, PYTHON_PROGRAM

MASTER_PORT = "7777"
RSH_AGENT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "kiln_rsh.py")


def _rsh():
    """kiln_rsh, loaded on first use from beside this file (only MPI launches need it, and
    train.py's directory is off sys.path by then); no bytecode is written, as for the rest."""
    mod = sys.modules.get("kiln_rsh")
    if mod is None:
        import importlib.util
        spec = importlib.util.spec_from_file_location("kiln_rsh", RSH_AGENT)
        mod = importlib.util.module_from_spec(spec)
        saved, sys.dont_write_bytecode = sys.dont_write_bytecode, True
        try:
            spec.loader.exec_module(mod)
        finally:
            sys.dont_write_bytecode = saved
        sys.modules["kiln_rsh"] = mod
    return mod
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


# Debian's torch 1.13 on Python 3.11: torchrun without --redirects/--tee passes None to
# to_map(), which fails ("'NoneType' object has no attribute 'get'"): Std.from_str("0") is None
# there because of 3.11's enum changes (fixed in torch 2.0). Passing both flags avoids it.
TORCHRUN_WORKAROUND = ["--redirects", "1", "--tee", "1"]

# Prints "<major> <minor> <torch version or ->" for the interpreter that runs it, without
# importing torch (that takes seconds): the installed distribution's metadata, else the
# version.py beside the torch package that find_spec locates.
_TORCH_PROBE = r"""
import sys
def torch_version():
    try:
        from importlib.metadata import version, PackageNotFoundError
        try:
            return version("torch")
        except PackageNotFoundError:
            pass
    except ImportError:
        pass
    try:
        import importlib.util, os, re
        spec = importlib.util.find_spec("torch")
        if spec is None or not spec.origin:
            return None
        with open(os.path.join(os.path.dirname(spec.origin), "version.py")) as f:
            m = re.search(r"__version__\s*=\s*['\"]([^'\"]+)['\"]", f.read())
        return m.group(1) if m else None
    except (ImportError, OSError, ValueError):
        return None
print(sys.version_info[0], sys.version_info[1], torch_version() or "-")
"""


def torchrun_needs_workaround(python_version, torch_version):
    """True for torch older than 2.0 on Python 3.11 or newer (see TORCHRUN_WORKAROUND).
    python_version: (major, minor); torch_version: a version string ("1.13.0a0+gitunknown")
    or None when torch is not installed."""
    if not torch_version or tuple(python_version) < (3, 11):
        return False
    import re
    m = re.match(r"\s*(\d+)", str(torch_version))
    return bool(m) and int(m.group(1)) < 2


def _torchrun_interpreter(torchrun):
    """The Python interpreter a torchrun executable runs under (its #! line), or None when it
    is not a Python script (a wrapper whose torch cannot be known)."""
    try:
        with open(torchrun, "rb") as f:
            first = f.readline(512)
    except OSError:
        return None
    if not first.startswith(b"#!"):
        return None
    words = first[2:].decode("utf-8", "replace").split()
    if words and os.path.basename(words[0]) == "env":
        words = [w for w in words[1:] if not w.startswith("-")]
        words[:1] = [which(words[0])] if words and which(words[0]) else []
    if not words or not os.path.basename(words[0]).startswith("python"):
        return None
    return words[0]


def torch_runtime(interpreter):
    """((major, minor), torch version or None) of `interpreter`, or None when unknown. Asked in
    this process when it is this interpreter (same file, or the same binary in the same
    directory, as /usr/bin/python3 and /usr/bin/python3.11 are), else of a short child
    process (tens of milliseconds; only torch_distributed launches pay it)."""
    me = sys.executable
    same = os.path.abspath(interpreter) == os.path.abspath(me) or (
        os.path.dirname(os.path.abspath(interpreter)) == os.path.dirname(os.path.abspath(me))
        and os.path.realpath(interpreter) == os.path.realpath(me))
    if same:
        import contextlib
        import io
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            exec(_TORCH_PROBE, {"__name__": "kiln_torch_probe"})
        text = out.getvalue()
    else:
        import subprocess
        try:
            text = subprocess.run([interpreter, "-c", _TORCH_PROBE], capture_output=True,
                                  timeout=60, stdin=subprocess.DEVNULL).stdout.decode()
        except (OSError, subprocess.SubprocessError):
            return None
    parts = text.split()
    if len(parts) != 3:
        return None
    try:
        return (int(parts[0]), int(parts[1])), (None if parts[2] == "-" else parts[2])
    except ValueError:
        return None


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
        interpreter = _torchrun_interpreter(torchrun)
    else:
        cmd, shown = [sys.executable, "-m", "torch.distributed.run"], ["torchrun"]
        interpreter = sys.executable
    opts = ["--nnodes", str(len(hosts)), "--nproc_per_node", str(processes_per_host)]
    if len(hosts) > 1:
        opts += ["--master_addr", str(tenv.master_hostname), "--master_port", MASTER_PORT,
                 "--node_rank", str(hosts.index(tenv.current_host))]
    runtime = torch_runtime(interpreter) if interpreter else None
    if runtime and torchrun_needs_workaround(*runtime):
        opts += TORCHRUN_WORKAROUND
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
    # Kiln's host network mode: every host is 127.0.0.1 on the node's one network. Open MPI
    # would take algo-2 for the local node (its address is a local interface's) and start
    # its ranks here, and the named interface may not exist on the node: so it is told not
    # to resolve host names (the own hostname, algo-1, is still local) and to talk over lo.
    shared_loopback = _rsh().hosts_share_loopback(tenv.hosts)
    if shared_loopback:
        iface = "lo"
    num_processes = tenv.additional_framework_parameters.get(MPI_NUM_PROCESSES) or \
        len(hosts) * processes_per_host
    cmd = [mpirun, "--host", ",".join("%s:%s" % (h, processes_per_host) for h in hosts),
           "-np", str(num_processes), "--allow-run-as-root", "--tag-output",
           "-mca", "btl_tcp_if_include", iface, "-mca", "oob_tcp_if_include", iface,
           "-mca", "plm_rsh_no_tree_spawn", "1", "-bind-to", "none", "-map-by", "slot",
           "-mca", "pml", "ob1", "-mca", "btl", "^openib",
           "-mca", "orte_abort_on_non_zero_status", "1"]
    if shared_loopback:
        cmd += ["-mca", "if_base_retain_loopback", "1", "-mca", "if_base_do_not_resolve", "1"]
    import shlex
    custom = shlex.split(str(tenv.additional_framework_parameters.get(
        SMDDP_CUSTOM_OPTIONS if smddp else MPI_CUSTOM_OPTIONS, "") or ""))
    # mpirun starts orted on the other hosts through Kiln's agent instead of ssh (workers
    # serve it: mpi_worker_serve). Isolated mode: the user's PYTHONPATH must not reach it.
    # Custom options that name an agent themselves win (mpirun refuses a parameter twice).
    if not any(o in ("plm_rsh_agent", "orte_rsh_agent", "pls_rsh_agent") for o in custom):
        agent = env.get("KILN_MPI_RSH_AGENT") or "%s -I %s" % (sys.executable, RSH_AGENT)
        cmd += ["-mca", "plm_rsh_agent", agent]
    cmd += ["-x", "NCCL_SOCKET_IFNAME=%s" % iface, "-x", "NCCL_DEBUG=%s"
            % env.get("NCCL_DEBUG", "INFO")]
    if env.get("LD_PRELOAD"):
        cmd += ["-x", "LD_PRELOAD=%s" % env["LD_PRELOAD"]]
    for key in sorted(env):
        if key not in ("NCCL_SOCKET_IFNAME", "NCCL_DEBUG", "LD_PRELOAD") and \
                not key.startswith("BASH_FUNC"):
            cmd += ["-x", key]
    cmd += custom
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


def mpi_worker_serve(sup, tenv, env, cwd):
    """Workers of an MPI job run nothing themselves: the master's mpirun starts orted here
    through Kiln's remote-launch agent (kiln_rsh.py), which this serves in place of sshd.
    Returns when what was launched (orted, daemonized or not) has ended; raises
    ExecuteUserScriptError when it failed, Stopped on SIGTERM, ClientError when the master
    launches nothing within 1 hour (KILN_MPI_WORKER_WAIT_SECONDS)."""
    kiln_rsh = _rsh()
    token = kiln_rsh.token_from(env)
    if token is None:
        raise ClientError(
            "MPI worker %s: KILN_RSH_TOKEN is not set, so the master's remote launch cannot be "
            "authenticated. Kiln sets it for every host of a multi-host training job; when "
            "running the toolkit yourself, give all hosts the same value" % tenv.current_host)
    try:
        port = kiln_rsh.rsh_port(tenv.current_host, tenv.hosts, env)
        wait = float(env.get("KILN_MPI_WORKER_WAIT_SECONDS") or 3600)
    except ValueError as e:
        raise ClientError("MPI worker %s: %s" % (tenv.current_host, e))
    server = kiln_rsh.WorkerServer(port, token, kiln_rsh.session_environment(env), cwd,
                                   log=lambda msg: log(20, msg))
    try:
        server.bind()
    except OSError as e:
        raise ClientError(
            "MPI worker %s: cannot listen on port %d for the master's remote launch: %s. "
            "Another job on this node's shared network may hold it; set KILN_RSH_PORT in the "
            "job's Environment to another port" % (tenv.current_host, port, e))
    log(20, "MPI worker %s waiting for the master %s to launch orted (port %d)"
        % (tenv.current_host, tenv.master_hostname, port))
    try:
        failures = server.serve_forever(lambda: sup.stop_signal is not None, wait)
    except TimeoutError:
        raise ClientError("MPI worker %s: the master %s launched nothing here within %d s"
                          % (tenv.current_host, tenv.master_hostname, wait))
    if failures == "stopped":
        raise Stopped()
    if failures:
        what, code = failures[0]
        raise ExecuteUserScriptError(what, return_code=code, output=(
            "the remote launch from the master %s ended with exit code %d"
            % (tenv.master_hostname, code)))
    log(20, "Orted process exited")
