"""MPI launches of Kiln's toolkit without sshd (issue 14, design decision 8): the remote-launch
agent python/kiln_toolkit/kiln_rsh.py against a worker's server on this machine, the mpirun
command line, and a real `mpirun -np 4` over two hosts run by two train.py processes.

No Kiln server: everything runs the toolkit directly (as test_toolkit.py does). Ports: each test
takes its own KILN_RSH_PORT base from the kernel (other tests on the node may hold 7022).
"""

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import textwrap
import time

import pytest

from test_toolkit import PYTHON, RECORDER, RESOURCE_CONFIG_3, make_job, no_gpus  # noqa: F401

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
TOOLKIT = os.path.join(REPO, "python", "kiln_toolkit")
AGENT = os.path.join(TOOLKIT, "kiln_rsh.py")
TOKEN = "5f1c0ffee0ddba11"

sys.path.insert(0, TOOLKIT)
import kiln_rsh  # noqa: E402


def free_port(count=1):
    """A base port with `count` consecutive free ports after it (bound and released)."""
    for _ in range(50):
        s = socket.socket()
        s.bind(("0.0.0.0", 0))
        base = s.getsockname()[1]
        s.close()
        if base + count > 65535:
            continue
        ok = True
        for p in range(base, base + count):
            t = socket.socket()
            t.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                t.bind(("0.0.0.0", p))
            except OSError:
                ok = False
            finally:
                t.close()
        if ok:
            return base
    pytest.fail("no free ports")


# A worker's server in its own process (it reaps every child, so it cannot share pytest's),
# printing READY once it listens and its result as JSON when it returns.
SERVER = textwrap.dedent("""\
    import json, os, signal, sys
    sys.path.insert(0, sys.argv[1])
    import kiln_rsh
    stop = []
    signal.signal(signal.SIGTERM, lambda s, f: stop.append(s))
    env = kiln_rsh.session_environment(dict(os.environ, KILN_TEST_SIDE="worker"))
    server = kiln_rsh.WorkerServer(int(sys.argv[2]), sys.argv[3].encode(), env, os.getcwd(),
                                   lambda m: print("LOG " + m, file=sys.stderr, flush=True))
    server.bind()
    print("READY", flush=True)
    try:
        result = server.serve_forever(lambda: bool(stop), float(sys.argv[4]))
    except TimeoutError:
        result = "timeout"
    print(json.dumps(result), flush=True)
""")


class Worker:
    def __init__(self, tmp_path, port, token=TOKEN, first_wait=30):
        script = tmp_path / "worker_server.py"
        script.write_text(SERVER)
        self.cwd = tmp_path
        self.proc = subprocess.Popen(
            [PYTHON, str(script), TOOLKIT, str(port), token, str(first_wait)],
            cwd=str(tmp_path), stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        line = self.proc.stdout.readline().decode()
        assert line.strip() == "READY", self.proc.stderr.read().decode()

    def result(self, timeout=30):
        out, err = self.proc.communicate(timeout=timeout)
        return json.loads(out.decode().strip().splitlines()[-1]), err.decode()

    def kill(self):
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.communicate()


@pytest.fixture
def worker(tmp_path):
    made = []

    def make(**kw):
        port = free_port()
        w = Worker(tmp_path, port, **kw)
        w.port = port
        made.append(w)
        return w
    yield make
    for w in made:
        w.kill()


def agent_env(port, token=TOKEN, **extra):
    env = {"PATH": "/usr/bin:/bin", "KILN_RSH_PORT": str(port), "LANG": "C.UTF-8"}
    if token is not None:
        env["KILN_RSH_TOKEN"] = token
    env.update(extra)
    return env


def run_agent(args, env, stdin=b"", timeout=60):
    return subprocess.run([PYTHON, "-I", AGENT] + args, env=env, input=stdin,
                          capture_output=True, timeout=timeout)


# ---------------------------------------------------------------------------------------------
# The agent and the worker's server

def test_command_output_stdin_and_exit_status(worker):
    w = worker()
    # Open MPI passes the host, then the command's words (the first with a leading space).
    got = run_agent(["localhost", " echo", "out-$KILN_TEST_SIDE;", "echo", "err", ">&2;", "cat;",
                     "exit", "3"], agent_env(w.port), stdin=b"from-stdin\n")
    assert got.returncode == 3, got.stderr
    assert got.stdout == b"out-worker\nfrom-stdin\n"
    assert got.stderr == b"err\n"
    result, log = w.result()
    assert result == [["/bin/sh -c  echo out-$KILN_TEST_SIDE; echo err >&2; cat; exit 3", 3]]
    assert "remote launch from 127.0.0.1:" in log


def test_session_environment_is_the_workers_plus_login_variables(worker):
    w = worker()
    got = run_agent(["localhost", "echo", "$USER,$LOGNAME,$HOME,$SHELL,$PATH,$(pwd)"],
                    agent_env(w.port, PATH="/agent/side/only"))
    assert got.returncode == 0, got.stderr
    user, logname, home, shell, path, cwd = got.stdout.decode().strip().split(",")
    assert user and user == logname and home and shell
    assert path == os.environ["PATH"]  # the worker's PATH (pytest's here), not the agent's
    assert cwd == str(w.cwd)
    assert w.result()[0] is None


def test_wrong_token_is_refused_and_the_worker_keeps_serving(worker):
    w = worker()
    bad = run_agent(["localhost", "echo", "never"], agent_env(w.port, token="not-the-token"))
    assert bad.returncode == 255
    assert b"never" not in bad.stdout
    assert b"authentication failed" in bad.stderr
    good = run_agent(["localhost", "true"], agent_env(w.port))
    assert good.returncode == 0, good.stderr
    assert w.result()[0] is None


def test_missing_token_refused_by_the_agent(worker):
    w = worker()
    got = run_agent(["localhost", "true"], agent_env(w.port, token=None))
    assert got.returncode == 255
    assert b"KILN_RSH_TOKEN is not set" in got.stderr
    w.kill()


def test_agent_that_cannot_connect_gives_up_after_the_connect_window():
    port = free_port()
    t0 = time.monotonic()
    got = run_agent(["localhost", "true"], agent_env(port, KILN_RSH_CONNECT_SECONDS="1"))
    assert got.returncode == 255
    assert b"could not connect to localhost:%d" % port in got.stderr
    assert time.monotonic() - t0 < 20


def test_agent_retries_until_the_worker_listens(tmp_path):
    port = free_port()
    agent = subprocess.Popen([PYTHON, "-I", AGENT, "localhost", "echo", "late"],
                             env=agent_env(port), stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE)
    try:
        time.sleep(1.5)  # the worker is still "installing requirements"
        w = Worker(tmp_path, port)
        out, err = agent.communicate(timeout=30)
        assert agent.returncode == 0, err
        assert out == b"late\n"
        assert w.result()[0] is None
    finally:
        if agent.poll() is None:
            agent.kill()


def pid_alive(pid):
    try:
        with open("/proc/%d/stat" % pid) as f:
            return f.read().split(") ")[1][0] != "Z"
    except OSError:
        return False


def test_killing_the_agent_kills_the_remote_command(worker):
    w = worker()
    agent = subprocess.Popen([PYTHON, "-I", AGENT, "localhost", "echo $$; exec sleep 120"],
                             env=agent_env(w.port), stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE)
    remote = int(agent.stdout.readline())
    assert pid_alive(remote)
    agent.kill()  # as mpirun does at the end of a job
    agent.communicate()
    deadline = time.monotonic() + 10
    while pid_alive(remote) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not pid_alive(remote)
    result, log = w.result()
    assert result == [["/bin/sh -c echo $$; exec sleep 120", 128 + signal.SIGTERM]]
    assert "the agent went away" in log


def test_worker_waits_for_what_the_command_left_running(worker):
    # orted --daemonize: the launched shell ends at once, the daemon runs on (re-parented to the
    # worker, a subreaper) and its exit status is the worker's result.
    w = worker()
    got = run_agent(["localhost", "(sleep 1; exit 5) </dev/null >/dev/null 2>&1 &"],
                    agent_env(w.port))
    assert got.returncode == 0, got.stderr
    t0 = time.monotonic()
    result, _ = w.result()
    assert time.monotonic() - t0 > 0.5
    assert len(result) == 1 and result[0][1] == 5
    assert result[0][0].startswith("sh (pid ")
    assert "left running by a launched command" in result[0][0]


def test_sigterm_stops_the_worker_and_its_commands(worker):
    w = worker()
    agent = subprocess.Popen([PYTHON, "-I", AGENT, "localhost", "echo $$; exec sleep 120"],
                             env=agent_env(w.port), stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE)
    remote = int(agent.stdout.readline())
    w.proc.send_signal(signal.SIGTERM)
    result, _ = w.result()
    assert result == "stopped"
    assert not pid_alive(remote)
    agent.communicate(timeout=10)
    assert agent.returncode == 128 + signal.SIGTERM


def test_worker_with_no_connection_times_out(worker):
    w = worker(first_wait=0.5)
    assert w.result()[0] == "timeout"


def test_agent_arguments():
    assert kiln_rsh.parse_agent_args(["algo-2", " orted", "-mca", "ess", "\"env\""]) == (
        "algo-2", None, " orted -mca ess \"env\"")
    assert kiln_rsh.parse_agent_args(["-x", "-p", "2222", "root@algo-3", "hostname"]) == (
        "algo-3", 2222, "hostname")
    with pytest.raises(ValueError):
        kiln_rsh.parse_agent_args(["algo-2"])


def test_ports_by_network_mode():
    env = {}
    # Hosts on a job network (namespaces): every host serves 7022.
    assert kiln_rsh.rsh_port("10.213.9.3", ["10.213.9.2", "10.213.9.3"], env) == 7022
    # Host mode, every host a loopback address: one port per host.
    loop = ["localhost", "127.0.0.2", "127.0.0.3"]
    assert [kiln_rsh.rsh_port(h, loop, env) for h in loop] == [7022, 7023, 7024]
    assert kiln_rsh.rsh_port("127.0.0.3", loop, {"KILN_RSH_PORT": "9000"}) == 9002
    assert kiln_rsh.rsh_port("localhost", ["localhost"], {"KILN_RSH_PORT": "9000"}) == 9000


# ---------------------------------------------------------------------------------------------
# mpirun's command line (contract 12.2), with a stand-in mpirun that records its argv

def mpi_hps(**extra):
    hps = {"sagemaker_program": "\"train.py\"", "sagemaker_mpi_enabled": "true",
           "sagemaker_mpi_num_of_processes_per_host": "3",
           "sagemaker_mpi_custom_mpi_options": "\"--mca btl_tcp_links 2 -x FOO=1\"",
           "epochs": "2"}
    hps.update(extra)
    return hps


def two_hosts(hosts, current):
    return dict(RESOURCE_CONFIG_3, hosts=hosts, current_host=current,
                instance_groups=[dict(RESOURCE_CONFIG_3["instance_groups"][0], hosts=hosts)])


def recorded_mpirun(job, extra_env=None):
    no_gpus(job)
    job.fake_tool("mpirun", RECORDER)
    job.write_code("train.py", "print('never run here')\n")
    env = {"PATH": job.bin + ":/usr/bin:/bin", "KILN_RSH_TOKEN": TOKEN}
    env.update(extra_env or {})
    rc, _, err = job.run(extra_env=env)
    assert rc == 0, err
    with open(job.path("output", "data", "launcher.json")) as f:
        return json.load(f)["argv"], err


def test_mpirun_command_on_a_job_network(make_job):
    hosts = ["10.213.250.2", "10.213.250.3"]  # addresses: resolve without DNS, not loopback
    job = make_job(hps=mpi_hps(), resource_config=two_hosts(hosts, hosts[0]))
    argv, err = recorded_mpirun(job)
    assert argv[:6] == ["--host", "10.213.250.2:3,10.213.250.3:3", "-np", "6",
                        "--allow-run-as-root", "--tag-output"]
    joined = " ".join(argv)
    assert ("-mca btl_tcp_if_include eth0 -mca oob_tcp_if_include eth0 -mca "
            "plm_rsh_no_tree_spawn 1 -bind-to none -map-by slot -mca pml ob1 -mca btl ^openib "
            "-mca orte_abort_on_non_zero_status 1 -mca plm_rsh_agent") in joined
    i = argv.index("plm_rsh_agent")
    assert argv[i + 1] == "%s -I %s" % (PYTHON, AGENT)
    assert "if_base_do_not_resolve" not in joined
    assert "-x NCCL_SOCKET_IFNAME=eth0" in joined
    assert "-x KILN_RSH_TOKEN" in joined and "-x SM_HOSTS" in joined
    assert argv[-11:] == ["--mca", "btl_tcp_links", "2", "-x", "FOO=1", PYTHON, "-m", "mpi4py",
                          "train.py", "--epochs", "2"]
    assert "plm_rsh_agent %s -I %s" % (PYTHON, AGENT) in err  # the logged command


def test_mpirun_command_in_host_network_mode(make_job):
    hosts = ["127.0.0.1", "127.0.0.2"]  # Kiln's host mode: every host a loopback address
    job = make_job(hps=mpi_hps(sagemaker_mpi_num_processes="5"),
                   resource_config=two_hosts(hosts, hosts[0]))
    argv, _ = recorded_mpirun(job)
    assert argv[:4] == ["--host", "127.0.0.1:3,127.0.0.2:3", "-np", "5"]
    joined = " ".join(argv)
    assert "-mca btl_tcp_if_include lo -mca oob_tcp_if_include lo" in joined
    assert "-mca if_base_retain_loopback 1 -mca if_base_do_not_resolve 1" in joined
    assert "-x NCCL_SOCKET_IFNAME=lo" in joined


def test_mpirun_agent_override_and_pytorchddp(make_job):
    hosts = ["10.213.250.2", "10.213.250.3"]
    hps = {"sagemaker_program": "\"train.py\"", "sagemaker_pytorch_ddp_enabled": "true",
           "sagemaker_distributed_dataparallel_custom_mpi_options": "\"-x BAR=2\""}
    job = make_job(hps=hps, resource_config=two_hosts(hosts, hosts[0]))
    argv, _ = recorded_mpirun(job, {"KILN_MPI_RSH_AGENT": "/opt/agent --flag"})
    assert argv[:4] == ["--host", "10.213.250.2:1,10.213.250.3:1", "-np", "2"]
    i = argv.index("plm_rsh_agent")
    assert argv[i + 1] == "/opt/agent --flag"
    assert argv.count("plm_rsh_agent") == 1
    assert argv[-4:] == ["-x", "BAR=2", PYTHON, "train.py"]


def test_custom_options_naming_an_agent_replace_kilns(make_job):
    hosts = ["10.213.250.2", "10.213.250.3"]
    job = make_job(hps=mpi_hps(sagemaker_mpi_custom_mpi_options="\"--mca plm_rsh_agent ssh\""),
                   resource_config=two_hosts(hosts, hosts[0]))
    argv, _ = recorded_mpirun(job)
    assert argv.count("plm_rsh_agent") == 1
    i = argv.index("plm_rsh_agent")
    assert argv[i - 1:i + 2] == ["--mca", "plm_rsh_agent", "ssh"]


def test_worker_without_token_fails_clearly(make_job):
    hosts = ["127.0.0.1", "127.0.0.2"]
    job = make_job(hps=mpi_hps(), resource_config=two_hosts(hosts, hosts[1]))
    no_gpus(job)
    job.write_code("train.py", "print('never run here')\n")
    rc, _, _ = job.run(extra_env={"KILN_RSH_PORT": str(free_port(2))})
    assert rc == 1
    assert "KILN_RSH_TOKEN is not set" in job.failure()


def test_worker_gives_up_when_the_master_launches_nothing(make_job):
    hosts = ["127.0.0.1", "127.0.0.2"]
    job = make_job(hps=mpi_hps(), resource_config=two_hosts(hosts, hosts[1]))
    no_gpus(job)
    job.write_code("train.py", "print('never run here')\n")
    rc, _, err = job.run(extra_env={"KILN_RSH_TOKEN": TOKEN,
                                    "KILN_RSH_PORT": str(free_port(2)),
                                    "KILN_MPI_WORKER_WAIT_SECONDS": "1"})
    assert rc == 1, err
    assert "launched nothing here within 1 s" in job.failure()


# ---------------------------------------------------------------------------------------------
# A real mpirun over two hosts: two train.py processes, one the master, one the worker

MPI_SCRIPT = """\
import os, sys
from mpi4py import MPI
comm = MPI.COMM_WORLD
total = comm.allreduce(comm.Get_rank() + 1)
side = os.environ.get("KILN_TEST_SIDE", "master")
# One write per line: with PYTHONUNBUFFERED print() writes the newline apart, and Open MPI
# tags every chunk it reads.
sys.stdout.write("rank %d of %d on %s sum %d\\n" % (comm.Get_rank(), comm.Get_size(), side, total))
"""


def test_real_mpirun_over_two_hosts(make_job):
    """Open MPI treats its own host name as local and any other as remote: the master is this
    machine's host name, the worker 127.0.0.2 (a loopback address but no interface's), so the
    worker's two ranks go through kiln_rsh.py to the worker train.py's server. All hosts are
    loopback addresses: Kiln's host mode (lo, one port per host)."""
    if not shutil.which("mpirun") or subprocess.run(
            [PYTHON, "-c", "import mpi4py"], capture_output=True).returncode != 0:
        pytest.skip("needs openmpi-bin and python3-mpi4py (scripts/install-deps.sh --test)")
    me = socket.gethostname()
    if not kiln_rsh._is_loopback(me):
        pytest.skip("this machine's host name %s does not resolve to a loopback address" % me)
    hosts = [me, "127.0.0.2"]
    base = free_port(2)
    hps = mpi_hps(sagemaker_mpi_num_of_processes_per_host="2",
                  sagemaker_mpi_custom_mpi_options="\"-mca btl_tcp_links 1\"")
    env = {"KILN_RSH_TOKEN": TOKEN, "KILN_RSH_PORT": str(base), "PATH": "/usr/bin:/bin"}
    master = make_job(hps=hps, resource_config=two_hosts(hosts, hosts[0]))
    workerjob = make_job(hps=hps, resource_config=two_hosts(hosts, hosts[1]))
    for job in (master, workerjob):
        no_gpus(job)
        job.write_code("train.py", MPI_SCRIPT)
    # Both "hosts" have this machine's host name, which names Open MPI's shared-memory
    # segments: the worker's go elsewhere (Kiln's hosts have their own names, algo-N).
    w = workerjob.start(extra_env=dict(env, KILN_TEST_SIDE="worker",
                                       PATH=workerjob.bin + ":/usr/bin:/bin",
                                       OMPI_MCA_btl_vader_backing_directory=str(workerjob.root)))
    try:
        m = master.start(extra_env=dict(env, PATH=master.bin + ":/usr/bin:/bin"))
        mout, merr = m.communicate(timeout=120)
        mout, merr = mout.decode(), merr.decode()
        try:
            wout, werr = w.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            w.kill()
            wout, werr = w.communicate()
            pytest.fail("the worker did not end:\n%s\n--- master ---\n%s%s"
                        % (werr.decode(), mout, merr))
    finally:
        if w.poll() is None:
            w.kill()
            w.communicate()
    werr = werr.decode()
    assert m.returncode == 0, merr + "\n--- worker ---\n" + werr
    assert w.returncode == 0, werr
    lines = sorted(l for l in mout.splitlines() if "rank " in l)
    assert lines == ["[1,0]<stdout>:rank 0 of 4 on master sum 10",
                     "[1,1]<stdout>:rank 1 of 4 on master sum 10",
                     "[1,2]<stdout>:rank 2 of 4 on worker sum 10",
                     "[1,3]<stdout>:rank 3 of 4 on worker sum 10"], mout + merr
    assert master.success() and workerjob.success()
    assert "remote launch from" in werr and "orted" in werr
    assert "Orted process exited" in werr


def test_real_mpirun_in_host_mode_with_algo_names(make_job, tmp_path):
    """Kiln's process runtime in host network mode: each host has its own host name (algo-N,
    UTS namespace) and an /etc/hosts where every algo-N is 127.0.0.1 (mount namespace), all on
    the node's one network. Open MPI must still start algo-2's ranks through the agent (not
    locally, though algo-2's address is the node's), and algo-2 serves on base port + 1."""
    if not shutil.which("mpirun") or not shutil.which("unshare") or subprocess.run(
            [PYTHON, "-c", "import mpi4py"], capture_output=True).returncode != 0:
        pytest.skip("needs openmpi-bin, python3-mpi4py and unshare")
    if subprocess.run(["unshare", "--mount", "--uts", "true"],
                      capture_output=True).returncode != 0:
        pytest.skip("mount and UTS namespaces need root (CAP_SYS_ADMIN)")
    hosts = ["algo-1", "algo-2"]
    hosts_file = tmp_path / "hosts"
    hosts_file.write_text("127.0.0.1 localhost\n127.0.0.1 algo-1 algo-2\n")
    hps = mpi_hps(sagemaker_mpi_num_of_processes_per_host="2",
                  sagemaker_mpi_custom_mpi_options="\"\"")
    env = {"KILN_RSH_TOKEN": TOKEN, "KILN_RSH_PORT": str(free_port(2)),
           "KILN_DNS_WAIT_SECONDS": "5"}
    jobs = {}
    procs = {}
    try:
        for host in hosts:
            job = jobs[host] = make_job(hps=hps, resource_config=two_hosts(hosts, host))
            no_gpus(job)
            job.write_code("train.py", MPI_SCRIPT)
            side = {"KILN_TEST_SIDE": "worker"} if host == "algo-2" else {}
            sandbox = ("hostname %s && mount --bind %s /etc/hosts && cd %s && exec %s %s"
                       % (host, hosts_file, job.path("code"), PYTHON,
                          os.path.join(TOOLKIT, "train.py")))
            procs[host] = subprocess.Popen(
                ["unshare", "--mount", "--uts", "/bin/sh", "-c", sandbox],
                env=job.env(dict(env, PATH=job.bin + ":/usr/bin:/bin", **side)),
                stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        mout, merr = (x.decode() for x in procs["algo-1"].communicate(timeout=120))
        wout, werr = (x.decode() for x in procs["algo-2"].communicate(timeout=60))
    finally:
        for p in procs.values():
            if p.poll() is None:
                p.kill()
                p.communicate()
    assert procs["algo-1"].returncode == 0, merr + "\n--- worker ---\n" + werr
    assert procs["algo-2"].returncode == 0, werr
    lines = sorted(l for l in mout.splitlines() if "rank " in l)
    assert lines == ["[1,0]<stdout>:rank 0 of 4 on master sum 10",
                     "[1,1]<stdout>:rank 1 of 4 on master sum 10",
                     "[1,2]<stdout>:rank 2 of 4 on worker sum 10",
                     "[1,3]<stdout>:rank 3 of 4 on worker sum 10"], mout + merr
    assert "(port %d)" % (int(env["KILN_RSH_PORT"]) + 1) in werr
    assert "-mca if_base_do_not_resolve 1" in merr
