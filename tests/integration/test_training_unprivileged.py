"""`kiln server` as an unprivileged user (issue: "Works as root and, where the host allows, as an
unprivileged user inside a user namespace"): the server runs as `nobody`, the process runtime
builds each instance's sandbox inside a user namespace, and a two-host `local:` job completes
with its hostnames, config files, inter-host traffic and artifacts as under root.

Needs root (to drop to nobody with setpriv) and a host that allows unprivileged user
namespaces; skipped otherwise, saying why."""

import os
import pwd
import shutil
import subprocess
import tempfile

import pytest

import kiln_harness as kh
import training_helpers as th

PROGRAM = r'''#!/usr/bin/python3
import json, os, socket, time
rc = json.load(open("/opt/ml/input/config/resourceconfig.json"))
me = rc["current_host"]
print("host", me, "hostname", socket.gethostname(), "uid", os.getuid(), flush=True)
if me == "algo-1":
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind(("0.0.0.0", int(os.environ["PORT"])))
    s.listen(1)
    s.settimeout(30)
    c, _ = s.accept()
    print("received", c.recv(100).decode(), flush=True)
else:
    for _ in range(300):
        try:
            socket.create_connection(("algo-1", int(os.environ["PORT"])), timeout=2).sendall(b"hi from " + me.encode())
            break
        except OSError:
            time.sleep(0.1)
with open("/opt/ml/model/%s.txt" % me, "w") as f:
    f.write(socket.gethostname())
'''


def _userns_allowed():
    probe = subprocess.run(["setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups",
                            "unshare", "--user", "--map-root-user", "true"], capture_output=True, text=True)
    return probe.returncode == 0, probe.stderr.strip()


class NobodyServer(kh.KilnServer):
    """A KilnServer started as nobody, from a copy of the binary nobody can read."""

    def __init__(self, root, binary, **kwargs):
        super().__init__(os.path.join(root, "data"), log_path=os.path.join(root, "server.log"), **kwargs)
        self.binary = binary

    def command(self):
        cmd = super().command()
        return ["setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups", self.binary] + cmd[1:]


@pytest.fixture(scope="module")
def nobody_kiln():
    if os.geteuid() != 0:
        pytest.skip("needs root to start the server as nobody")
    if shutil.which("setpriv") is None or shutil.which("unshare") is None:
        pytest.skip("setpriv/unshare (util-linux) not installed")
    allowed, why = _userns_allowed()
    if not allowed:
        pytest.skip("this host does not allow unprivileged user namespaces: " + why)
    nobody = pwd.getpwnam("nobody")
    root = tempfile.mkdtemp(prefix="kiln-nobody-")
    os.chmod(root, 0o755)
    binary = os.path.join(root, "kiln")
    shutil.copy(kh.kiln_bin(), binary)
    os.chmod(binary, 0o755)
    program = os.path.join(root, "program.py")
    with open(program, "w") as f:
        f.write(PROGRAM)
    os.chmod(program, 0o755)
    os.makedirs(os.path.join(root, "data"))
    for path in (root, os.path.join(root, "data")):
        os.chown(path, nobody.pw_uid, nobody.pw_gid)
    server = NobodyServer(root, binary, config=th.SHRINK_CONFIG)
    server.start()
    server.program = program
    yield server
    server.stop()
    shutil.rmtree(root, ignore_errors=True)


def test_two_host_job_as_nobody(nobody_kiln):
    sm, s3, logs = nobody_kiln.client("sagemaker"), nobody_kiln.client("s3"), nobody_kiln.client("logs")
    bucket = th.unique_name("nobody")
    s3.create_bucket(Bucket=bucket)
    name = th.unique_name("nobody-job")
    request = th.training_request(name, bucket, image="local:" + nobody_kiln.program,
                                  Environment={"PORT": str(kh.free_port())})
    request["ResourceConfig"]["InstanceCount"] = 2
    sm.create_training_job(**request)
    d = th.wait_for_status(sm, name, timeout=120, server=nobody_kiln)
    assert d["TrainingJobStatus"] == "Completed", d.get("FailureReason")

    text = "\n".join(th.job_log_lines(logs, name))
    # Inside its user namespace the program is root (uid 0), as in a container.
    assert "host algo-1 hostname algo-1 uid 0" in text, text
    assert "host algo-2 hostname algo-2 uid 0" in text, text
    assert "received hi from algo-2" in text, text
    files = th.model_files(s3, d)
    assert files.get("algo-1.txt") == b"algo-1" and files.get("algo-2.txt") == b"algo-2", files
