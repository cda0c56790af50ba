"""Issue 16, remote access to a running training job on the process runtime, driven by real clients
(spec/remote-access.md §4 checks 2, 4, 8, 9 as far as the process runtime shows them; the wire
protocol and interfaces of notes/issue16-design.md).

One server for the module (network mode auto on 10.249.0.0/16, so that the instance has its own
network, UTS and pid namespaces: its host name is algo-1) and one long-running script-mode job
(TRAIN_PY below) shared by the tests: it prints a `REMOTE-TARGET ready` line with its own and PID 1's
start times (/proc/<pid>/stat field 22), serves JSON on 127.0.0.1:6006 inside the instance, listens
with debugpy on 127.0.0.1:5678 (when python3-debugpy is installed) and calls heartbeat() five
times a second until SIGTERM. The tests run in file order: the job starts with remote access
disabled, the first test enables it with UpdateTrainingJob and disables it again; the others enable
it (the `enabled` fixture).

- refused before enabling (403 AccessDeniedException on the upgrade; `kiln ssh-proxy` and `kiln
  connect` exit 255 with the server's message), enabled on the running job → reachable with its PID
  1 and the script's start times unchanged and the ready line printed once, disabled → an open
  interactive shell closes within 5 s, and connecting is refused again;
- `kiln targets --json`: algo-1 Ready with the AWS-style alias;
- `kiln ssh-config` → `ssh -F`: hostname algo-1, the channel's file under /opt/ml/input/data/train,
  SM_CURRENT_HOST and TRAINING_JOB_NAME, scp out and in, sftp batch ls/get;
- `kiln connect` under pexpect: a prompt, hostname, Ctrl-C stops a remote `sleep 100`, `exit 3`
  makes the client exit 3;
- `ssh -L` and `kiln port-forward` to the job's port 6006; debugpy attached through `ssh -L` with
  a minimal DAP client: a breakpoint in heartbeat() is hit (the job keeps running after detach);
- bad input: unknown job (404 ResourceNotFound), algo-9 of a one-host job and a malformed target
  (400 ValidationException), a finished job (400 ValidationException naming its status), a wrong
  secret key (the front door's InvalidSignatureException, as any JSON call gets), a missing
  `Upgrade: kiln-ssh` (400); a client killed -9 mid-session leaves no `kiln agent` of this server
  and no remote process behind;
- `kiln connect --local-port P` serves plain `ssh -p P`; `-R` from the instance to this machine;
- hold before start (tag kiln:remote-hold-start-seconds): `kiln connect --wait` reaches the held
  instance, `kill -USR1 1` starts the script with PID 1 unchanged;
- hold after exit (tag kiln:remote-hold-exit-seconds): a failing job ends Failed with its reason,
  its target is Held and /opt/ml/output/failure is read through it, `kill -USR1 1` ends the hold;
- a network-isolated job is reachable and still cannot reach Kiln's port (a non-isolated one can);
- an endpoint variant with EnableSSMAccess and two instances: two targets entered under load;
- operator settings (a server of their own): allowed_principals, idle and maximum-length timeouts;
  StopTrainingJob under a busy session closes it ("job ended", a closing message), nothing left;
- audit: `kiln connections --json <job>` lists the connections with the principal (STS
  GetCallerIdentity's ARN), bytes both ways, exit statuses (3 among them) and close reasons
  ("access disabled" for the shell the disable closed); `[kiln] remote connection <id> opened` / `closed` lines in the
  job's log stream.

Root only (entering an instance's namespaces needs it); OpenSSH's ssh/scp/sftp and python3-pexpect
are required (skipped with the reason otherwise).
"""

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import time
import urllib.parse
import urllib.request
import uuid

import pytest

import kiln_harness as kh
import training_helpers as th

pytestmark = [
    pytest.mark.skipif(os.geteuid() != 0, reason="remote access enters an instance's namespaces: root only"),
    pytest.mark.skipif(not shutil.which("ssh") or not shutil.which("scp") or not shutil.which("sftp")
                       or not shutil.which("ssh-keygen"),
                       reason="OpenSSH's client (ssh, scp, sftp, ssh-keygen; Debian openssh-client) is not installed"),
]

CIDR = "10.249.0.0/16"
KILN_CONFIG = {
    "scheduler": {"policy": "shrink", "allow_cpu_fallback": True},
    "training": {"stop_grace_seconds": 5},
    "network": {"mode": "auto", "cidr": CIDR},
    "instance_types": [{"type": "ml.m5.large", "vcpus": 1}],
}

APP_PORT = 6006
DEBUG_PORT = 5678
CHANNEL_FILE = "remote-train.csv"
CHANNEL_TEXT = "x,y\n1,2\n"

# The user's training script (script mode: the toolkit runs it from /opt/ml/code). Standard library
# plus debugpy when installed. heartbeat()'s marked line is where the debugger test breaks.
TRAIN_PY = r'''import http.server
import json
import os
import signal
import socket
import threading

def start_of(pid):
    with open("/proc/%s/stat" % pid) as f:
        return f.read().rsplit(")", 1)[1].split()[19]  # field 22, starttime

stop = threading.Event()
signal.signal(signal.SIGTERM, lambda *_: stop.set())

class Handler(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        body = json.dumps({"hostname": socket.gethostname(), "pid": os.getpid(), "path": self.path}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass

server = http.server.ThreadingHTTPServer(("127.0.0.1", 6006), Handler)
threading.Thread(target=server.serve_forever, daemon=True).start()
try:
    import debugpy
    debugpy.listen(("127.0.0.1", 5678))
    debugger = "listening"
except Exception as e:
    debugger = "unavailable:" + type(e).__name__

def heartbeat(n):
    n += 1  # BREAKPOINT
    return n

print("REMOTE-TARGET ready pid=%d start=%s pid1_start=%s file=%s debugpy=%s" % (
    os.getpid(), start_of(os.getpid()), start_of(1), os.path.abspath(__file__), debugger), flush=True)
beats = 0
while not stop.wait(0.2):
    beats = heartbeat(beats)
print("REMOTE-TARGET stopped after %d beats" % beats, flush=True)
'''
BREAKPOINT_LINE = next(i for i, line in enumerate(TRAIN_PY.splitlines(), 1) if "# BREAKPOINT" in line)

READY = re.compile(r"REMOTE-TARGET ready pid=(\d+) start=(\d+) pid1_start=(\d+) file=(\S+) debugpy=(\S+)")


# ---------------------------------------------------------------------------------------------
# Fixtures


class Remote:
    """The module's server, clients, the CLI's environment (HOME in a temp dir: the client key is
    created there) and the shared job."""

    def __init__(self, server, home):
        self.server = server
        self.home = home
        self.sm = server.client("sagemaker")
        self.s3 = server.client("s3")
        self.logs = server.client("logs")
        self.bucket = th.unique_name("remote")
        self.s3.create_bucket(Bucket=self.bucket)
        self.env = cli_env(server, home)
        self.job = None
        self.ready = None
        self.finished_job = None

    @property
    def target(self):
        return "training-job/%s/algo-1" % self.job

    def kiln(self, *args, env=None, timeout=60, input=None):
        """Runs the kiln CLI (with --endpoint-url where the subcommand takes one)."""
        cmd = [kh.kiln_bin()] + [str(a) for a in args]
        return subprocess.run(cmd, env=env or self.env, capture_output=True, text=True, timeout=timeout,
                              input=input, stdin=None if input is not None else subprocess.DEVNULL)

    def connect(self, *args, command=(), env=None, timeout=60):
        cmd = ["connect", "--endpoint-url", self.server.endpoint] + list(args)
        if command:
            cmd += ["--"] + list(command)
        return self.kiln(*cmd, env=env, timeout=timeout)

    def proxy(self, target, env=None, timeout=30):
        return self.kiln("ssh-proxy", "--endpoint-url", self.server.endpoint, target, env=env, timeout=timeout)

    def set_access(self, enabled):
        # UpdateTrainingJob as boto3 >= 1.34 sends it (Debian's botocore 1.26 predates RemoteDebugConfig).
        status, _, body = kh.json_request(self.server, "SageMaker.UpdateTrainingJob", {
            "TrainingJobName": self.job, "RemoteDebugConfig": {"EnableRemoteDebug": enabled}})
        assert status == 200, body

    def describe(self, name=None):
        """DescribeTrainingJob as raw JSON (Debian's botocore drops RemoteDebugConfig from it)."""
        status, _, body = kh.json_request(self.server, "SageMaker.DescribeTrainingJob",
                                          {"TrainingJobName": name or self.job})
        assert status == 200, body
        return json.loads(body)

    def log_lines(self):
        return th.job_log_lines(self.logs, self.job)


def cli_env(server, home, secret=None):
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_") and not k.startswith("SSH_")}
    env.update({
        "HOME": home,
        "AWS_ACCESS_KEY_ID": server.access_key,
        "AWS_SECRET_ACCESS_KEY": secret or server.secret_key,
        "AWS_DEFAULT_REGION": "us-east-1",
        "AWS_REGION": "us-east-1",
        "AWS_ENDPOINT_URL": server.endpoint,
        "AWS_CONFIG_FILE": os.path.join(home, "aws-config"),
        "AWS_SHARED_CREDENTIALS_FILE": os.path.join(home, "aws-credentials"),
    })
    return env


@pytest.fixture(scope="module")
def remote(module_kiln, tmp_path_factory):
    home = str(tmp_path_factory.mktemp("remote-home"))
    r = Remote(module_kiln, home)
    r.s3.put_object(Bucket=r.bucket, Key="data/train/" + CHANNEL_FILE, Body=CHANNEL_TEXT.encode())
    r.s3.put_object(Bucket=r.bucket, Key="code/sourcedir.tar.gz", Body=th.make_tar_gz({"train.py": TRAIN_PY}))
    r.job = th.unique_name("remote")
    r.finished_job = th.unique_name("remote-done")
    hps = {"sagemaker_program": json.dumps("train.py"),
           "sagemaker_submit_directory": json.dumps("s3://%s/code/sourcedir.tar.gz" % r.bucket),
           "sagemaker_region": json.dumps("us-east-1")}
    try:
        r.sm.create_training_job(**th.training_request(
            r.job, r.bucket, image=th.PYTORCH_IMAGE, hyperparameters=hps, max_runtime=3600,
            channels=[th.s3_channel("train", "s3://%s/data/train/" % r.bucket)]))
        # A job that has finished, with remote access enabled: the probe program exits at once.
        # (Raw JSON: Debian's botocore 1.26 knows RemoteDebugConfig on UpdateTrainingJob only.)
        status, _, body = kh.json_request(module_kiln, "SageMaker.CreateTrainingJob", th.training_request(
            r.finished_job, r.bucket, RemoteDebugConfig={"EnableRemoteDebug": True}))
        assert status == 200, body
        lines = th.wait_for_log_line(r.logs, r.job, READY.search, timeout=180)
        m = READY.search(lines[0])
        r.ready = {"pid": m.group(1), "start": m.group(2), "pid1_start": m.group(3), "file": m.group(4),
                   "debugpy": m.group(5)}
        yield r
    finally:
        # Instances outlive a stopped server by design: every job is stopped and waited for here.
        for name in (r.job, r.finished_job):
            try:
                r.sm.stop_training_job(TrainingJobName=name)
            except Exception:
                pass
        for name in (r.job, r.finished_job):
            try:
                th.wait_for_status(r.sm, name, timeout=60, server=module_kiln)
            except Exception as e:
                if "ResourceNotFound" not in repr(e) and "not found" not in repr(e):
                    raise


@pytest.fixture
def enabled(remote):
    remote.set_access(True)
    return remote


@pytest.fixture(scope="module")
def ssh_config(remote, tmp_path_factory):
    """`kiln ssh-config <target> --alias A` written to a file of its own, for `ssh -F`."""
    remote.set_access(True)
    alias = "h5-" + remote.job
    p = remote.kiln("ssh-config", "--endpoint-url", remote.server.endpoint, remote.target, "--alias", alias)
    assert p.returncode == 0, (p.stdout, p.stderr)
    block = p.stdout
    assert re.search(r"(?im)^\s*Host\s+%s\s*$" % re.escape(alias), block), block
    assert re.search(r"(?im)^\s*ProxyCommand\s+\S*kiln\S*\s+ssh-proxy\b", block), block
    path = str(tmp_path_factory.mktemp("ssh-config") / "config")
    with open(path, "w") as f:
        f.write(block)
    return path, alias


def ssh_base(config_path):
    # BatchMode: never prompt (a prompt would mean the key or host key was not taken from the block).
    # The known-hosts file is the test's own (the block's ~/.ssh/kiln_known_hosts is the passwd
    # entry's home, which OpenSSH uses whatever $HOME says; an earlier server on the same port would
    # have left another host key there under the same HostKeyAlias).
    known = os.path.join(os.path.dirname(config_path), "known_hosts")
    return ["-F", config_path, "-o", "BatchMode=yes", "-o", "ConnectTimeout=30", "-o", "UserKnownHostsFile=" + known]


def run_ssh(remote, config, *args, timeout=60, prog="ssh"):
    path, alias = config
    cmd = [prog] + ssh_base(path) + [a.replace("{host}", alias) for a in args]
    return subprocess.run(cmd, env=remote.env, capture_output=True, text=True, timeout=timeout,
                          stdin=subprocess.DEVNULL)


# ---------------------------------------------------------------------------------------------
# Raw upgrade requests (the exact AWS-shaped refusals) and process scans


def client_public_key(remote):
    path = os.path.join(remote.home, "raw-key")
    if not os.path.exists(path):
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "h5-raw", "-f", path], check=True,
                       stdin=subprocess.DEVNULL)
    with open(path + ".pub") as f:
        return f.read().strip()


def raw_connect(remote, target, creds=None, upgrade=True, public_key=True):
    """One signed GET /_kiln/remote/connect; returns (status, headers, parsed JSON body or raw)."""
    url = remote.server.endpoint + "/_kiln/remote/connect?target=" + urllib.parse.quote(target, safe="")
    headers = {"Connection": "Upgrade"}
    signed = ["host", "x-amz-date"]
    if upgrade:
        headers["Upgrade"] = "kiln-ssh"
    if public_key:
        headers["X-Kiln-Ssh-Public-Key"] = client_public_key(remote)
        signed.append("x-kiln-ssh-public-key")
    hdrs, _, _ = kh.sign_request("GET", url, headers, creds or remote.server.creds(), "sagemaker",
                                 payload_hash=kh.EMPTY_SHA256, signed_headers=signed)
    # A raw socket: a 101 is followed by the SSH stream (http.client would read it as a body).
    path = url[len(remote.server.endpoint):]
    head = "GET %s HTTP/1.1\r\n%s\r\n" % (path, "".join("%s: %s\r\n" % kv for kv in hdrs.items()))
    with socket.create_connection(("127.0.0.1", remote.server.port), timeout=30) as sock:
        sock.sendall(head.encode())
        data = b""
        while b"\r\n\r\n" not in data:
            chunk = sock.recv(65536)
            if not chunk:
                raise AssertionError("connection closed before an answer's head: %r" % data)
            data += chunk
        raw_head, _, body = data.partition(b"\r\n\r\n")
        lines = raw_head.decode("latin-1").split("\r\n")
        status = int(lines[0].split()[1])
        resp_headers = {}
        for line in lines[1:]:
            k, _, v = line.partition(":")
            resp_headers[k.strip().lower()] = v.strip()
        if status == 101:
            return status, resp_headers, None
        length = int(resp_headers.get("content-length", "0"))
        while len(body) < length:
            chunk = sock.recv(65536)
            if not chunk:
                break
            body += chunk
    try:
        doc = json.loads(body)
    except ValueError:
        doc = body
    return status, resp_headers, doc


def assert_refused(remote, target, status, code, message_re, creds=None, **kwargs):
    got_status, headers, doc = raw_connect(remote, target, creds=creds, **kwargs)
    got_code = (doc.get("__type") or "").split("#")[-1] if isinstance(doc, dict) else None
    assert (got_status, got_code) == (status, code), (got_status, headers, doc)
    assert headers.get("x-amzn-errortype", "").split(":")[0] == code, headers
    assert re.search(message_re, doc.get("message") or doc.get("Message") or ""), doc
    return doc.get("message") or doc.get("Message")


def assert_cli_refused(remote, target, message, env=None):
    """`kiln ssh-proxy` and `kiln connect` both exit 255 and print the server's message."""
    p = remote.proxy(target, env=env)
    assert p.returncode == 255, ("ssh-proxy", p.returncode, p.stdout, p.stderr)
    assert message in p.stderr, (message, p.stderr)
    p = remote.connect(target, command=["true"], env=env)
    assert p.returncode == 255, ("connect", p.returncode, p.stdout, p.stderr)
    assert message in p.stderr, (message, p.stderr)


def processes():
    """{pid: argv} of every process on the node."""
    out = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open("/proc/%s/cmdline" % entry, "rb") as f:
                argv = [a.decode("utf-8", "replace") for a in f.read().split(b"\0") if a]
        except OSError:
            continue
        if argv:
            out[int(entry)] = argv
    return out


def agents_of(server):
    """`kiln agent` processes started by this server (their --host-key lives in its data dir)."""
    return {pid: argv for pid, argv in processes().items()
            if len(argv) > 1 and argv[1] == "agent" and os.path.basename(argv[0]) == "kiln"
            and any(a.startswith(server.data_dir) for a in argv)}


def wait_until(predicate, timeout, what):
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError("timed out after %ss waiting for %s" % (timeout, what))
        time.sleep(0.1)


def start_time_script():
    # Field 22 of /proc/<pid>/stat, read inside the instance (comm may hold spaces: cut after ')').
    return "for p in 1 $PID; do sed 's/.*) //' /proc/$p/stat | cut -d' ' -f20; done"


def spawn_shell(remote, *extra):
    import pexpect
    child = pexpect.spawn(kh.kiln_bin(), ["connect", "--endpoint-url", remote.server.endpoint] + list(extra)
                          + [remote.target], env=remote.env, encoding="utf-8", timeout=30, dimensions=(24, 120))
    child.expect(r"[#$] ")
    child.sendline("PS1='H5''PROMPT> '")  # the echo of this line does not match the prompt
    child.expect("H5PROMPT> ")
    return child


def pexpect_or_skip():
    try:
        import pexpect  # noqa: F401
    except ImportError:
        pytest.skip("python3-pexpect is not installed")


# ---------------------------------------------------------------------------------------------
# Enabling on a running job (§4 check 4)


def test_refused_until_enabled_then_reachable_unrestarted_then_disabled_closes_the_shell(remote):
    pexpect_or_skip()
    import pexpect
    d = remote.describe()
    assert d["TrainingJobStatus"] == "InProgress" and not (d.get("RemoteDebugConfig") or {}).get("EnableRemoteDebug")

    message = assert_refused(remote, remote.target, 403, "AccessDeniedException", r"EnableRemoteDebug")
    assert_cli_refused(remote, remote.target, message)

    remote.set_access(True)
    d = remote.describe()
    assert d["RemoteDebugConfig"]["EnableRemoteDebug"] is True and d["TrainingJobStatus"] == "InProgress", d

    script = "hostname; PID=%s; %s" % (remote.ready["pid"], start_time_script())
    p = remote.connect(remote.target, command=[script])
    assert p.returncode == 0, (p.stdout, p.stderr)
    assert p.stdout.split() == ["algo-1", remote.ready["pid1_start"], remote.ready["start"]], (p.stdout, remote.ready)
    # Not restarted: the script printed its ready line once.
    assert len([line for line in remote.log_lines() if READY.search(line)]) == 1

    child = spawn_shell(remote)
    try:
        child.sendline("hostname")
        child.expect("algo-1")
        child.expect("H5PROMPT> ")
        remote.set_access(False)
        disabled_at = time.monotonic()
        child.expect(pexpect.EOF, timeout=30)
        closed_after = time.monotonic() - disabled_at
        child.close()
    finally:
        if child.isalive():
            child.close(force=True)
    assert closed_after <= 5.0, "the open shell closed %.1f s after access was disabled (R-2/R-28: 5 s)" % closed_after
    assert child.exitstatus != 0, (child.exitstatus, child.signalstatus)

    assert_refused(remote, remote.target, 403, "AccessDeniedException", r"EnableRemoteDebug")
    d = remote.sm.describe_training_job(TrainingJobName=remote.job)
    assert d["TrainingJobStatus"] == "InProgress", d
    # The audit says why the shell ended.
    newest = connection_list(remote, remote.job)[0]
    assert newest["CloseReason"] == "access disabled" and "EndTime" in newest, newest


# ---------------------------------------------------------------------------------------------
# Targets


def test_targets_lists_algo_1_ready_with_its_alias(enabled):
    p = enabled.kiln("targets", "--endpoint-url", enabled.server.endpoint, "--json", enabled.job)
    assert p.returncode == 0, (p.stdout, p.stderr)
    doc = json.loads(p.stdout)
    assert doc["ResourceStatus"] == "InProgress" and doc["AccessEnabled"] is True, doc
    assert doc["ResourceArn"].endswith(":training-job/" + enabled.job), doc
    assert doc["Targets"] == [{"Target": enabled.target, "Alias": "sagemaker-training-job:%s_algo-1" % enabled.job,
                               "InstanceId": "training-%s-algo-1" % enabled.job, "Hostname": "algo-1",
                               "State": "Ready"}], doc
    # The table form names the same target.
    p = enabled.kiln("targets", "--endpoint-url", enabled.server.endpoint, enabled.job)
    assert p.returncode == 0 and enabled.target in p.stdout and "Ready" in p.stdout, (p.stdout, p.stderr)
    # Every documented spelling of the target reaches the same instance: the upgrade's answer names
    # the canonical target and the connection.
    for spelling in ("training-job/" + enabled.job, "sagemaker-training-job:%s_algo-1" % enabled.job,
                     "algo-1.%s.training.kiln" % enabled.job, enabled.job):
        status, headers, _ = raw_connect(enabled, spelling)
        assert status == 101 and headers.get("upgrade") == "kiln-ssh", (spelling, status, headers)
        assert headers.get("x-kiln-target") == enabled.target and headers.get("x-kiln-connection-id"), headers
        p = enabled.connect(spelling, command=["hostname"])
        assert (p.returncode, p.stdout.strip()) == (0, "algo-1"), (spelling, p.stdout, p.stderr)


# ---------------------------------------------------------------------------------------------
# OpenSSH through kiln ssh-config (§4 check 2's client side)


def test_ssh_scp_sftp_through_ssh_config(enabled, ssh_config, tmp_path):
    p = run_ssh(enabled, ssh_config, "{host}", "hostname")
    assert (p.returncode, p.stdout.strip()) == (0, "algo-1"), (p.stdout, p.stderr)
    p = run_ssh(enabled, ssh_config, "{host}", "ls /opt/ml/input/data/train")
    assert p.returncode == 0 and CHANNEL_FILE in p.stdout.split(), (p.stdout, p.stderr)
    p = run_ssh(enabled, ssh_config, "{host}", 'echo "$SM_CURRENT_HOST $TRAINING_JOB_NAME"; pwd; id -u')
    assert p.returncode == 0 and p.stdout.split() == ["algo-1", enabled.job, "/opt/ml/code", "0"], (p.stdout, p.stderr)
    p = run_ssh(enabled, ssh_config, "{host}", "exit 7")
    assert p.returncode == 7, (p.stdout, p.stderr)

    # scp out of the job and back in.
    out = tmp_path / "out.csv"
    p = run_ssh(enabled, ssh_config, "{host}:/opt/ml/input/data/train/" + CHANNEL_FILE, str(out), prog="scp")
    assert p.returncode == 0 and out.read_text() == CHANNEL_TEXT, (p.stdout, p.stderr)
    payload = os.urandom(3 * 1024 * 1024 + 17)
    local = tmp_path / "in.bin"
    local.write_bytes(payload)
    remote_path = "/tmp/h5-scp-%s.bin" % uuid.uuid4().hex[:8]
    p = run_ssh(enabled, ssh_config, str(local), "{host}:" + remote_path, prog="scp")
    assert p.returncode == 0, (p.stdout, p.stderr)
    p = run_ssh(enabled, ssh_config, "{host}", "sha256sum " + remote_path)
    assert p.returncode == 0 and p.stdout.split()[0] == kh.sha256_file(str(local)), (p.stdout, p.stderr)

    # sftp in batch mode: ls and get.
    batch = tmp_path / "batch"
    got = tmp_path / "got.bin"
    batch.write_text("ls /opt/ml/input/data/train\nget %s %s\nrm %s\n" % (remote_path, got, remote_path))
    p = run_ssh(enabled, ssh_config, "-b", str(batch), "{host}", prog="sftp")
    assert p.returncode == 0, (p.stdout, p.stderr)
    assert CHANNEL_FILE in p.stdout, p.stdout
    assert got.read_bytes() == payload
    p = run_ssh(enabled, ssh_config, "{host}", "test -e %s; echo $?" % remote_path)
    assert p.stdout.strip() == "1", (p.stdout, p.stderr)


# ---------------------------------------------------------------------------------------------
# Interactive kiln connect (pexpect)


def test_interactive_connect(enabled):
    pexpect_or_skip()
    import pexpect
    child = spawn_shell(enabled)
    try:
        child.sendline("hostname")
        child.expect(r"\balgo-1\r\n")  # (bash may put bracketed-paste codes before it)
        child.expect("H5PROMPT> ")
        child.sendline("ls /opt/ml/input/data/train; echo \"host=$SM_CURRENT_HOST job=$TRAINING_JOB_NAME\"")
        child.expect(re.escape(CHANNEL_FILE))
        child.expect(re.escape("host=algo-1 job=%s" % enabled.job))
        child.expect("H5PROMPT> ")
        # Ctrl-C reaches the remote foreground command through the terminal.
        child.sendline("sleep 100")
        time.sleep(1.0)
        child.sendintr()
        started = time.monotonic()
        child.expect("H5PROMPT> ", timeout=10)
        assert time.monotonic() - started < 10
        child.sendline("echo status=$?")
        child.expect("status=130")
        child.expect("H5PROMPT> ")
        child.sendline("exit 3")
        child.expect(pexpect.EOF, timeout=20)
        child.close()
    finally:
        if child.isalive():
            child.close(force=True)
    assert child.exitstatus == 3, (child.exitstatus, child.signalstatus)

    # The same status without a terminal.
    p = enabled.connect(enabled.target, command=["exit 3"])
    assert p.returncode == 3, (p.stdout, p.stderr)
    p = enabled.connect(enabled.target, command=["true"])
    assert p.returncode == 0, (p.stdout, p.stderr)


# ---------------------------------------------------------------------------------------------
# Forwards and the debugger (§4 checks 2 and 8)


class Background:
    """A forwarding client in its own process group, killed with it at the end."""

    def __init__(self, cmd, env):
        self.proc = subprocess.Popen(cmd, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, start_new_session=True)

    def stop(self):
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        return self.proc.stdout.read().decode(errors="replace") + self.proc.stderr.read().decode(errors="replace")


def get_json_through(port, proc, timeout=30):
    """GET http://127.0.0.1:<port>/probe, retried until the forward listens."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            with urllib.request.urlopen("http://127.0.0.1:%d/probe" % port, timeout=10) as resp:
                return json.loads(resp.read())
        except OSError as e:
            if proc.poll() is not None or time.monotonic() > deadline:
                raise AssertionError("no answer through the forward on %d (%r); client exited %s"
                                     % (port, e, proc.poll()))
            time.sleep(0.2)


def test_ssh_local_forward_and_kiln_port_forward(enabled, ssh_config):
    path, alias = ssh_config
    port = kh.free_port()
    fwd = Background(["ssh"] + ssh_base(path) + ["-N", "-o", "ExitOnForwardFailure=yes",
                                                  "-L", "127.0.0.1:%d:127.0.0.1:%d" % (port, APP_PORT), alias],
                     enabled.env)
    try:
        doc = get_json_through(port, fwd.proc)
        assert doc == {"hostname": "algo-1", "pid": int(enabled.ready["pid"]), "path": "/probe"}, doc
    finally:
        fwd.stop()

    port = kh.free_port()
    fwd = Background([kh.kiln_bin(), "port-forward", "--endpoint-url", enabled.server.endpoint, enabled.target,
                      str(APP_PORT), str(port)], enabled.env)
    try:
        for _ in range(3):  # one forward, several connections
            doc = get_json_through(port, fwd.proc)
            assert doc["hostname"] == "algo-1" and doc["pid"] == int(enabled.ready["pid"]), doc
    finally:
        fwd.stop()


class Dap:
    """A minimal Debug Adapter Protocol client (Content-Length framed JSON) over one socket."""

    def __init__(self, port, timeout=30):
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=timeout)
        self.buf = b""
        self.seq = 0
        self.messages = []

    def send(self, command, **arguments):
        self.seq += 1
        body = json.dumps({"seq": self.seq, "type": "request", "command": command, "arguments": arguments}).encode()
        self.sock.sendall(b"Content-Length: %d\r\n\r\n" % len(body) + body)
        return self.seq

    def _read(self):
        while b"\r\n\r\n" not in self.buf:
            chunk = self.sock.recv(65536)
            if not chunk:
                raise AssertionError("debug adapter closed the connection; seen: %s" % self.messages[-5:])
            self.buf += chunk
        head, _, rest = self.buf.partition(b"\r\n\r\n")
        length = int(re.search(rb"Content-Length:\s*(\d+)", head, re.I).group(1))
        while len(rest) < length:
            chunk = self.sock.recv(65536)
            if not chunk:
                raise AssertionError("debug adapter closed mid-message")
            rest += chunk
        self.buf = rest[length:]
        msg = json.loads(rest[:length])
        self.messages.append(msg)
        return msg

    def wait(self, predicate, what, timeout=30):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            msg = self._read()
            if predicate(msg):
                return msg
        raise AssertionError("no %s within %ss; seen: %s" % (what, timeout, self.messages[-8:]))

    def response(self, seq, what):
        msg = self.wait(lambda m: m.get("type") == "response" and m.get("request_seq") == seq, what)
        assert msg.get("success"), msg
        return msg

    def event(self, name):
        return self.wait(lambda m: m.get("type") == "event" and m.get("event") == name, "%s event" % name)

    def close(self):
        self.sock.close()


def test_debugpy_breakpoint_through_ssh_forward(enabled, ssh_config):
    if enabled.ready["debugpy"] != "listening":
        pytest.skip("the job could not start debugpy (%s): install python3-debugpy" % enabled.ready["debugpy"])
    path, alias = ssh_config
    port = kh.free_port()
    fwd = Background(["ssh"] + ssh_base(path) + ["-N", "-o", "ExitOnForwardFailure=yes",
                                                  "-L", "127.0.0.1:%d:127.0.0.1:%d" % (port, DEBUG_PORT), alias],
                     enabled.env)
    dap = None
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                dap = Dap(port)
                seq = dap.send("initialize", clientID="kiln-h5", adapterID="debugpy", pathFormat="path",
                               linesStartAt1=True, columnsStartAt1=True)
                dap.response(seq, "initialize response")
                break
            except (OSError, AssertionError):
                if dap:
                    dap.close()
                    dap = None
                if fwd.proc.poll() is not None or time.monotonic() > deadline:
                    raise
                time.sleep(0.3)
        attach = dap.send("attach", justMyCode=False, subProcess=False)
        dap.event("initialized")
        source = enabled.ready["file"]
        seq = dap.send("setBreakpoints", source={"path": source}, breakpoints=[{"line": BREAKPOINT_LINE}])
        resp = dap.response(seq, "setBreakpoints response")
        assert resp["body"]["breakpoints"][0].get("verified") is not False, resp
        seq = dap.send("configurationDone")
        dap.response(seq, "configurationDone response")
        dap.response(attach, "attach response")
        stopped = dap.event("stopped")
        assert stopped["body"]["reason"] == "breakpoint", stopped
        thread = stopped["body"]["threadId"]
        seq = dap.send("stackTrace", threadId=thread, startFrame=0, levels=1)
        frame = dap.response(seq, "stackTrace response")["body"]["stackFrames"][0]
        assert (frame["name"], frame["line"], frame["source"]["path"]) == ("heartbeat", BREAKPOINT_LINE, source), frame
        seq = dap.send("setBreakpoints", source={"path": source}, breakpoints=[])
        dap.response(seq, "clearing breakpoints")
        seq = dap.send("continue", threadId=thread)
        dap.response(seq, "continue response")
        seq = dap.send("disconnect", terminateDebuggee=False)
        dap.response(seq, "disconnect response")
    finally:
        if dap:
            dap.close()
        fwd.stop()
    # The job runs on after the debugger left, still answering through a forward.
    d = enabled.sm.describe_training_job(TrainingJobName=enabled.job)
    assert d["TrainingJobStatus"] == "InProgress", d
    p = enabled.connect(enabled.target, command=["kill -0 %s && echo alive" % enabled.ready["pid"]])
    assert (p.returncode, p.stdout.strip()) == (0, "alive"), (p.stdout, p.stderr)


def test_local_port_serves_any_ssh_client_and_remote_forward(enabled, tmp_path):
    """`kiln connect --local-port P` (§4 check 2): plain `ssh -p P -i ~/.ssh/sagemaker-ssh-gw
    root@localhost`, one upgrade per accepted connection; `-R` (R-23): a port inside the instance
    reaches a server on this machine."""
    port = kh.free_port()
    server = Background([kh.kiln_bin(), "connect", "--endpoint-url", enabled.server.endpoint, "--local-port",
                         str(port), enabled.target], enabled.env)
    key = os.path.join(enabled.home, ".ssh", "sagemaker-ssh-gw")
    ssh = ["ssh", "-p", str(port), "-i", key, "-o", "IdentitiesOnly=yes", "-o", "BatchMode=yes",
           "-o", "UserKnownHostsFile=" + str(tmp_path / "known_hosts"), "-o", "StrictHostKeyChecking=accept-new",
           "root@127.0.0.1"]
    try:
        def answered():
            p = subprocess.run(ssh + ["hostname"], env=enabled.env, capture_output=True, text=True, timeout=30,
                               stdin=subprocess.DEVNULL)
            if p.returncode != 0 and server.proc.poll() is not None:
                raise AssertionError("kiln connect --local-port exited %s: %s" % (server.proc.poll(), p.stderr))
            return p if p.returncode == 0 else None
        p = wait_until(answered, 30, "ssh through --local-port")
        assert p.stdout.strip() == "algo-1", p.stdout
        p = subprocess.run(ssh + ["echo $SM_CURRENT_HOST; exit 5"], env=enabled.env, capture_output=True, text=True,
                           timeout=30, stdin=subprocess.DEVNULL)
        assert (p.returncode, p.stdout.strip()) == (5, "algo-1"), (p.returncode, p.stdout, p.stderr)
    finally:
        server.stop()

    # -R: a listener inside the instance forwards to an HTTP server of the test.
    import http.server
    import threading

    class Hello(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            body = b"hello from the laptop"
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Hello)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    inside = 17000 + uuid.uuid4().int % 1000
    fetch = ("python3 -c \"import urllib.request; "
             "print(urllib.request.urlopen('http://127.0.0.1:%d/', timeout=10).read().decode())\"" % inside)
    try:
        p = enabled.connect("-R", "127.0.0.1:%d:127.0.0.1:%d" % (inside, httpd.server_address[1]), enabled.target,
                            command=[fetch])
    finally:
        httpd.shutdown()
    assert (p.returncode, p.stdout.strip()) == (0, "hello from the laptop"), (p.returncode, p.stdout, p.stderr)


def test_network_isolated_job_is_reachable_and_stays_isolated(remote):
    """§4 check 5: an EnableNetworkIsolation job is entered like any other, and from its shell Kiln's
    port on the node's loopback is still out of reach (isolated instances get no loopback relay)."""
    name = th.unique_name("remote-iso")
    status, _, body = kh.json_request(remote.server, "SageMaker.CreateTrainingJob", th.training_request(
        name, remote.bucket, hyperparameters={"sleep": "300", "sigterm": "1"}, EnableNetworkIsolation=True,
        RemoteDebugConfig={"EnableRemoteDebug": True}))
    assert status == 200, body
    target = "training-job/%s/algo-1" % name
    try:
        def reachable():
            p = remote.connect(target, command=["hostname"])
            return p if p.returncode == 0 else None
        p = wait_until(reachable, 60, "the isolated job to be reachable")
        assert p.stdout.strip() == "algo-1", p.stdout
        probe = ("python3 -c \"import socket; socket.create_connection(('127.0.0.1', %d), 3)\" 2>/dev/null "
                 "&& echo reached || echo unreachable" % remote.server.port)
        p = remote.connect(target, command=[probe])
        assert (p.returncode, p.stdout.strip()) == (0, "unreachable"), (p.stdout, p.stderr)
        # The same probe from the module's job (not isolated) reaches Kiln through its relay.
        remote.set_access(True)
        p = remote.connect(remote.target, command=[probe])
        assert (p.returncode, p.stdout.strip()) == (0, "reached"), (p.stdout, p.stderr)
    finally:
        try:
            remote.sm.stop_training_job(TrainingJobName=name)
        except Exception:
            pass
        th.wait_for_status(remote.sm, name, timeout=60, server=remote.server)


def test_endpoint_instances_are_targets_and_keep_serving(remote):
    """§4 check 7: a variant with EnableSSMAccess and two instances lists two Ready targets; each is
    entered (its PID 1 is the serving program, its host name the target's) while invocations go on
    without a failure; the serving port is reached through `kiln port-forward`."""
    import threading
    import endpoint_helpers as eh
    rt = remote.server.client("sagemaker-runtime")
    name = eh.unique_name("remote-ep")
    eh.create_model(remote.sm, name)
    # (Raw JSON: Debian's botocore 1.26 predates EnableSSMAccess.)
    status, _, body = kh.json_request(remote.server, "SageMaker.CreateEndpointConfig", {
        "EndpointConfigName": name + "-cfg", "ProductionVariants": [{
            "VariantName": "main", "ModelName": name, "InitialInstanceCount": 2, "InstanceType": "ml.m5.large",
            "InitialVariantWeight": 1.0, "EnableSSMAccess": True}]})
    assert status == 200, body
    remote.sm.create_endpoint(EndpointName=name, EndpointConfigName=name + "-cfg")
    try:
        eh.wait_endpoint(remote.sm, name, server=remote.server)
        p = remote.kiln("targets", "--endpoint-url", remote.server.endpoint, "--json", "endpoint/" + name)
        assert p.returncode == 0, (p.stdout, p.stderr)
        doc = json.loads(p.stdout)
        assert doc["AccessEnabled"] is True and doc["ResourceStatus"] == "InService", doc
        targets = doc["Targets"]
        assert len(targets) == 2 and all(t["State"] == "Ready" for t in targets), targets
        assert all(t["Target"] == "endpoint/%s/main/%s" % (name, t["InstanceId"]) for t in targets), targets

        failures, done = [], threading.Event()

        def load():
            while not done.is_set():
                try:
                    eh.invoke(rt, name)
                except Exception as e:  # noqa: BLE001 (every failure is reported)
                    failures.append(repr(e))
                time.sleep(0.02)
        loader = threading.Thread(target=load)
        loader.start()
        try:
            for t in targets:
                p = remote.connect(t["Target"], command=["hostname; tr '\\0' ' ' < /proc/1/cmdline"])
                assert p.returncode == 0, (t, p.stdout, p.stderr)
                host, cmdline = p.stdout.split("\n", 1)
                assert host == t["Hostname"] and "serve_app.py" in cmdline, (t, p.stdout)
            port = kh.free_port()
            fwd = Background([kh.kiln_bin(), "port-forward", "--endpoint-url", remote.server.endpoint,
                              targets[0]["Target"], "8080", str(port)], remote.env)
            try:
                def pinged():
                    try:
                        with urllib.request.urlopen("http://127.0.0.1:%d/ping" % port, timeout=5) as resp:
                            return resp.status == 200
                    except OSError:
                        if fwd.proc.poll() is not None:
                            raise AssertionError("kiln port-forward exited %s" % fwd.proc.poll())
                        return False
                wait_until(pinged, 30, "GET /ping through kiln port-forward to the endpoint instance")
            finally:
                fwd.stop()
        finally:
            done.set()
            loader.join()
        assert failures == [], failures[:5]
        assert remote.sm.describe_endpoint(EndpointName=name)["EndpointStatus"] == "InService"
    finally:
        eh.delete_all_endpoints(remote.sm, timeout=60)


# ---------------------------------------------------------------------------------------------
# Bad input


def test_unknown_missing_host_finished_and_malformed_targets_are_refused(enabled):
    msg = assert_refused(enabled, "training-job/no-such-job-h5/algo-1", 404, "ResourceNotFound", r"no-such-job-h5")
    assert_cli_refused(enabled, "training-job/no-such-job-h5/algo-1", msg)
    msg = assert_refused(enabled, "training-job/%s/algo-9" % enabled.job, 400, "ValidationException", r"algo-9")
    assert_cli_refused(enabled, "training-job/%s/algo-9" % enabled.job, msg)
    assert_refused(enabled, "training-job/", 400, "ValidationException", r".")
    assert_refused(enabled, "training-job/%s/host-1" % enabled.job, 400, "ValidationException", r".")

    d = th.wait_for_status(enabled.sm, enabled.finished_job, timeout=120, server=enabled.server)
    assert d["TrainingJobStatus"] == "Completed", d.get("FailureReason")
    msg = assert_refused(enabled, "training-job/%s/algo-1" % enabled.finished_job, 400, "ValidationException",
                         r"Completed")
    assert_cli_refused(enabled, "training-job/%s/algo-1" % enabled.finished_job, msg)

    # The upgrade is a remote-access request only with `Upgrade: kiln-ssh`, and needs the client's key.
    assert_refused(enabled, enabled.target, 400, "ValidationException", r"(?i)upgrade", upgrade=False)
    assert_refused(enabled, enabled.target, 400, "ValidationException", r"(?i)key", public_key=False)


def test_wrong_secret_key_is_refused_like_any_json_call(enabled):
    bad = kh.Creds(enabled.server.access_key, "wrong" + enabled.server.secret_key[5:])
    # What the front door answers a JSON 1.1 call signed with this secret.
    status, _, body = kh.json_request(enabled.server, "SageMaker.ListTrainingJobs", {}, creds=bad)
    expected_code = json.loads(body)["__type"].split("#")[-1]
    assert expected_code == "InvalidSignatureException", body
    got_status, headers, doc = raw_connect(enabled, enabled.target, creds=bad)
    assert (got_status, (doc.get("__type") or "").split("#")[-1]) == (status, expected_code), (got_status, doc)
    p = enabled.proxy(enabled.target, env=cli_env(enabled.server, enabled.home, secret=bad.secret_key))
    assert p.returncode == 255 and "signature" in p.stderr.lower(), (p.returncode, p.stderr)
    assert agents_of(enabled.server) == {}


def test_client_killed_mid_session_leaves_no_agent_and_no_shell(enabled):
    assert agents_of(enabled.server) == {}, "agents left from earlier tests"
    seconds = "%d" % (2000 + uuid.uuid4().int % 900)
    marker = ["sleep", seconds]
    client = subprocess.Popen([kh.kiln_bin(), "connect", "--endpoint-url", enabled.server.endpoint, enabled.target,
                               "--", "sleep", seconds], env=enabled.env, stdin=subprocess.DEVNULL,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        wait_until(lambda: [p for p, argv in processes().items() if argv == marker], 30, "the remote sleep")
        agents = agents_of(enabled.server)
        assert len(agents) == 1, agents
    finally:
        os.killpg(client.pid, signal.SIGKILL)  # ssh and its ProxyCommand alike
        client.wait()
    wait_until(lambda: not agents_of(enabled.server), 15, "the agent to exit after its client was killed")
    wait_until(lambda: not [p for p, argv in processes().items() if argv == marker], 15,
               "the remote sleep to be killed with the session")


# ---------------------------------------------------------------------------------------------
# Hold before start (§4 check 1, R-15, R-24)


def test_hold_before_start_connect_wait_then_release(remote):
    """A job tagged kiln:remote-hold-start-seconds holds before its program: `kiln connect --wait`
    gets a root shell in /opt/ml/code with TRAINING_JOB_NAME while the script has not started;
    `kill -USR1 1` in the instance (what `kiln release` sends) starts it with PID 1 unchanged."""
    name = th.unique_name("remote-hold")
    hps = {"sagemaker_program": json.dumps("train.py"),
           "sagemaker_submit_directory": json.dumps("s3://%s/code/sourcedir.tar.gz" % remote.bucket),
           "sagemaker_region": json.dumps("us-east-1")}
    status, _, body = kh.json_request(remote.server, "SageMaker.CreateTrainingJob", th.training_request(
        name, remote.bucket, image=th.PYTORCH_IMAGE, hyperparameters=hps, max_runtime=600,
        RemoteDebugConfig={"EnableRemoteDebug": True},
        Tags=[{"Key": "kiln:remote-hold-start-seconds", "Value": "600"}]))
    assert status == 200, body
    target = "training-job/%s/algo-1" % name
    try:
        p = remote.connect("--wait", "--wait-timeout", "120", target, timeout=180, command=[
            'pwd; id -u; echo "job=$TRAINING_JOB_NAME"; sed "s/.*) //" /proc/1/stat | cut -d" " -f20'])
        assert p.returncode == 0, (p.stdout, p.stderr)
        cwd, uid, job_line, pid1_start = p.stdout.split()
        assert (cwd, uid, job_line) == ("/opt/ml/code", "0", "job=" + name), p.stdout
        d = remote.sm.describe_training_job(TrainingJobName=name)
        assert d["TrainingJobStatus"] == "InProgress", d
        assert d["SecondaryStatusTransitions"][-1].get("StatusMessage") == "Waiting for remote connection", d
        assert not [line for line in th.job_log_lines(remote.logs, name) if READY.search(line)]

        p = remote.connect(target, command=["kill -USR1 1"])
        assert p.returncode == 0, (p.stdout, p.stderr)
        lines = th.wait_for_log_line(remote.logs, name, READY.search, timeout=60)
        assert READY.search(lines[0]).group(3) == pid1_start, (lines[0], pid1_start)
        d = remote.sm.describe_training_job(TrainingJobName=name)
        assert d["TrainingJobStatus"] == "InProgress" and \
            d["SecondaryStatusTransitions"][-1].get("StatusMessage") != "Waiting for remote connection", d
    finally:
        try:
            remote.sm.stop_training_job(TrainingJobName=name)
        except Exception:
            pass
        th.wait_for_status(remote.sm, name, timeout=60, server=remote.server)


def test_held_failed_job_failure_file_read_through_the_held_target(remote):
    """§4 check 6 (R-16): a failing job tagged kiln:remote-hold-exit-seconds ends Failed with its
    failure file as FailureReason (automation sees the real result at once), its target is Held and
    /opt/ml/output/failure is read through it; `kill -USR1 1` (what `kiln release` sends) ends the
    hold and the target is refused as the finished job's."""
    name = th.unique_name("remote-held")
    reason = "h5: the loss went to NaN at step 3"
    status, _, body = kh.json_request(remote.server, "SageMaker.CreateTrainingJob", th.training_request(
        name, remote.bucket, hyperparameters={"failure": reason, "exit_code": "1"},
        RemoteDebugConfig={"EnableRemoteDebug": True},
        Tags=[{"Key": "kiln:remote-hold-exit-seconds", "Value": "900"}]))
    assert status == 200, body
    target = "training-job/%s/algo-1" % name
    try:
        d = th.wait_for_status(remote.sm, name, timeout=120, server=remote.server)
        assert d["TrainingJobStatus"] == "Failed" and d["FailureReason"] == reason, d

        def held():
            p = remote.kiln("targets", "--endpoint-url", remote.server.endpoint, "--json", name)
            assert p.returncode == 0, (p.stdout, p.stderr)
            t = json.loads(p.stdout)["Targets"]
            return t if t and t[0]["State"] == "Held" else None
        targets = wait_until(held, 15, "the failed job's target to be Held")
        assert targets[0]["Target"] == target, targets
        p = remote.connect(target, command=["cat /opt/ml/output/failure; echo; hostname"])
        assert p.returncode == 0, (p.stdout, p.stderr)
        assert p.stdout.split("\n")[:2] == [reason, "algo-1"], p.stdout
        assert remote.sm.describe_training_job(TrainingJobName=name)["TrainingJobStatus"] == "Failed"

        remote.connect(target, command=["kill -USR1 1"])
        def released():
            s, _, doc = raw_connect(remote, target)
            return s == 400 and isinstance(doc, dict)
        wait_until(released, 30, "the hold to end after SIGUSR1")
        assert_refused(remote, target, 400, "ValidationException", r"Failed")
    finally:
        try:
            remote.sm.stop_training_job(TrainingJobName=name)
        except Exception:
            pass


# ---------------------------------------------------------------------------------------------
# Audit (§4 check 9, last: it reads the connections of the tests above)


def connection_list(remote, resource):
    p = remote.kiln("connections", "--endpoint-url", remote.server.endpoint, "--json", resource)
    assert p.returncode == 0, (p.stdout, p.stderr)
    return json.loads(p.stdout)["Connections"]


def test_connections_audit_and_log_lines(enabled):
    arn = enabled.server.client("sts").get_caller_identity()["Arn"]
    before = {c["ConnectionId"] for c in connection_list(enabled, enabled.job)}
    # Three connections of its own: exit 3, exit 0, and a local forward to the job's port.
    assert enabled.connect(enabled.target, command=["echo to-stdout; exit 3"]).returncode == 3
    assert enabled.connect(enabled.target, command=["true"]).returncode == 0
    port = kh.free_port()
    fwd = Background([kh.kiln_bin(), "connect", "--endpoint-url", enabled.server.endpoint,
                      "-L", "127.0.0.1:%d:localhost:%d" % (port, APP_PORT), enabled.target, "--", "sleep", "60"],
                     enabled.env)
    try:
        assert get_json_through(port, fwd.proc)["hostname"] == "algo-1"
    finally:
        fwd.stop()

    def new_closed():
        conns = [c for c in connection_list(enabled, enabled.job) if c["ConnectionId"] not in before]
        return conns if len(conns) == 3 and all("EndTime" in c for c in conns) else None
    conns = wait_until(new_closed, 15, "three new closed connections in the audit")
    starts = [c["StartTime"] for c in conns]
    assert starts == sorted(starts, reverse=True), "newest first: %s" % starts
    forward, ok, three = conns
    for c in conns:
        assert c["Principal"] == arn, c
        assert c["ResourceArn"].endswith(":training-job/" + enabled.job), c
        assert c["Target"] == enabled.target, c
        assert c["SourceAddress"].startswith("127.0.0.1"), c
        assert c["BytesIn"] > 0 and c["BytesOut"] > 0, c
        assert c["EndTime"] >= c["StartTime"], c
        assert c["CloseReason"] == "client disconnected", c
    assert three["ExitStatuses"] == [3] and ok["ExitStatuses"] == [0], conns
    assert forward["Forwards"] == ["direct-tcpip localhost:%d" % APP_PORT], forward
    assert not three.get("Forwards") and not ok.get("Forwards"), conns

    # Every connection of the module so far is listed (the first test's ended by the disable).
    everything = connection_list(enabled, enabled.job)
    assert {c["CloseReason"] for c in everything if "EndTime" in c} >= {"client disconnected"}, everything
    # Connections to other resources are not listed under this job.
    assert connection_list(enabled, enabled.finished_job) == []

    def logged():
        lines = enabled.log_lines()
        for c in conns:
            cid = re.escape(c["ConnectionId"])
            if not [line for line in lines if re.search(
                    r"^\[kiln\] remote connection %s opened by %s from 127\.0\.0\.1" % (cid, re.escape(arn)), line)]:
                return None
            if not [line for line in lines if re.search(
                    r"^\[kiln\] remote connection %s closed after .*client disconnected" % cid, line)]:
                return None
        return True
    wait_until(logged, 15, "[kiln] opened/closed lines of the three connections in the job's log stream")


# ---------------------------------------------------------------------------------------------
# Operator settings and a job ending under an open session: a server of their own


ADMIN = {"access_key_id": "AKIAH5REMOTEADMIN001", "secret_access_key": "h5-admin-secret-" + "a" * 24,
         "principal_arn": "arn:aws:iam::000000000000:user/h5-admin"}
INTERN = {"access_key_id": "AKIAH5REMOTEINTERN01", "secret_access_key": "h5-intern-secret-" + "b" * 23,
          "principal_arn": "arn:aws:iam::000000000000:user/h5-intern"}
IDLE_SECONDS = 2
MAX_SECONDS = 8


def test_principals_idle_and_max_timeouts_and_a_job_ending_under_a_session(kiln_factory, tmp_path):
    """allowed_principals (R-25, §4 check 9): another principal is refused with AccessDeniedException
    naming kiln:RemoteConnect; a tunnel without bytes closes after idle_timeout_seconds, a busy one
    after max_connection_seconds (R-27); StopTrainingJob under an open session closes it ("job
    ended") with no agent and no remote process left. A `local:` probe job that sleeps (and exits on
    SIGTERM: as its instance's PID 1 it would not die of an unhandled one)."""
    server = kiln_factory("operator", config={
        "credentials": [ADMIN, INTERN],
        "scheduler": {"policy": "shrink", "allow_cpu_fallback": True},
        "training": {"stop_grace_seconds": 5},
        "network": {"mode": "auto", "cidr": "10.248.0.0/16"},
        "instance_types": [{"type": "ml.m5.large", "vcpus": 1}],
        "remote_access": {"allowed_principals": ["arn:aws:iam::*:user/h5-admin"],
                          "idle_timeout_seconds": IDLE_SECONDS, "max_connection_seconds": MAX_SECONDS}})
    server.credentials = dict(ADMIN)  # every client of the test (boto3, the CLI) is the allowed principal
    home = str(tmp_path / "home")
    os.makedirs(home)
    r = Remote(server, home)
    r.job = th.unique_name("remote-op")
    status, _, body = kh.json_request(server, "SageMaker.CreateTrainingJob", th.training_request(
        r.job, r.bucket, hyperparameters={"sleep": "300", "sigterm": "1"}, RemoteDebugConfig={"EnableRemoteDebug": True}))
    assert status == 200, body
    try:
        def ready():
            p = r.kiln("targets", "--endpoint-url", server.endpoint, "--json", r.job)
            return p.returncode == 0 and json.loads(p.stdout)["Targets"][0]["State"] == "Ready"
        wait_until(ready, 60, "the probe job's target to be Ready")

        intern = kh.Creds(INTERN["access_key_id"], INTERN["secret_access_key"])
        msg = assert_refused(r, r.target, 403, "AccessDeniedException", r"kiln:RemoteConnect", creds=intern)
        assert INTERN["principal_arn"] in msg, msg
        intern_env = dict(r.env, AWS_ACCESS_KEY_ID=INTERN["access_key_id"],
                          AWS_SECRET_ACCESS_KEY=INTERN["secret_access_key"])
        assert_cli_refused(r, r.target, msg, env=intern_env)

        # Idle: nothing crosses the tunnel while the remote command sleeps.
        started = time.monotonic()
        p = r.connect(r.target, command=["sleep 60"], timeout=60)
        took = time.monotonic() - started
        assert p.returncode != 0 and took < 30, (p.returncode, took, p.stderr)
        newest = connection_list(r, r.job)[0]
        assert newest["CloseReason"] == "idle timeout" and newest["Principal"] == ADMIN["principal_arn"], newest
        assert newest["EndTime"] - newest["StartTime"] >= IDLE_SECONDS, newest

        # Busy: output every 0.3 s keeps it from idling; the maximum length ends it.
        started = time.monotonic()
        p = r.connect(r.target, command=["while :; do echo tick; sleep 0.3; done"], timeout=60)
        took = time.monotonic() - started
        assert p.returncode != 0 and took < 40 and p.stdout.count("tick") >= MAX_SECONDS, (p.returncode, took)
        newest = connection_list(r, r.job)[0]
        assert newest["CloseReason"] == "max connection time", newest
        assert newest["EndTime"] - newest["StartTime"] >= MAX_SECONDS, newest

        # The job stopped under an open (busy) session.
        token = "h5-ending-%s" % uuid.uuid4().hex[:8]
        client = subprocess.Popen([kh.kiln_bin(), "connect", "--endpoint-url", server.endpoint, r.target, "--",
                                   "while :; do echo %s; sleep 0.3; done" % token], env=r.env,
                                  stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                  start_new_session=True)
        try:
            first = client.stdout.readline().decode()
            assert token in first, (first, client.poll())
            r.sm.stop_training_job(TrainingJobName=r.job)
            client.wait(30)
            stderr = client.stderr.read().decode(errors="replace")
        finally:
            if client.poll() is None:
                os.killpg(client.pid, signal.SIGKILL)
                client.wait()
        assert client.returncode != 0, (client.returncode, stderr)
        d = th.wait_for_status(r.sm, r.job, timeout=60, server=server)
        assert d["TrainingJobStatus"] == "Stopped", d
        wait_until(lambda: not agents_of(server), 15, "no kiln agent of the server")
        wait_until(lambda: not [pid for pid, argv in processes().items() if any(token in a for a in argv)], 15,
                   "the remote loop to be gone")
        assert_refused(r, r.target, 400, "ValidationException", r"Stopped")
        # Why it ended: in the audit (whichever end noticed first: the instance is gone), and to the user.
        newest = connection_list(r, r.job)[0]
        assert newest["CloseReason"] == "job ended", (newest, client.returncode, stderr)
        assert re.search(r"job ended|Stopp", stderr), "no closing message for the user: %r" % stderr
    finally:
        try:
            r.sm.stop_training_job(TrainingJobName=r.job)
        except Exception:
            pass
        th.wait_for_status(r.sm, r.job, timeout=60, server=server)
