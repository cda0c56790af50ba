"""Images for the container-runtime tests and benchmark (issue 15), built locally: the machines reach
no registry, so a base image is assembled from the host's own files and the test images are
`podman build` layers on top of it.

  base     localhost/kiln-test-base:<hash>     `podman import` of a root filesystem holding the host's
                                               /usr/bin/python3.11 (+ python3), dash as /bin/sh, a few
                                               coreutils, every library they and Python's extension
                                               modules load (ldd), /usr/lib/python3.11 without test/
                                               and __pycache__, a minimal /etc/passwd and group (~55 MB)
  byo      localhost/kiln-test-byo:<hash>      ENTRYPOINT ["/opt/program/entry"], ENTRY_PROGRAM below:
                                               `train` and `serve` as SageMaker runs a BYO image
  notrain  localhost/kiln-test-notrain:<hash>  the base with no entrypoint: `train` is not a program
                                               in it
  quits    localhost/kiln-test-quits:<hash>    an entrypoint that prints a line and exits 3 at once

Every tag is a hash of what goes into the image (host files' paths, sizes and mtimes; the
Containerfile and the program), so a rerun finds the image already there and builds nothing; a
changed program gets a new tag. Builds of one tag in concurrent processes are serialised by an
flock. Images are left in the engine's store on purpose (that is what makes reruns fast); remove
them with `podman rmi` of the `localhost/kiln-test-*` names.

The same ENTRY_PROGRAM runs on the process runtime as `local:<dir>/entry` (host_program()): its
`#!/usr/bin/python3` is the host's interpreter there and the base image's copy of it in a container.

Podman is found at $KILN_PODMAN_SOCKET (a path or unix:// URI), else /run/podman/podman.sock when
that socket answers `GET /_ping`; podman_or_skip() skips the calling test with the reason otherwise.
"""

import contextlib
import fcntl
import hashlib
import http.client
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile

DEFAULT_SOCKET = "/run/podman/podman.sock"
LOCK_PATH = "/tmp/kiln-test-images.lock"
BASE_REPO = "localhost/kiln-test-base"
BYO_REPO = "localhost/kiln-test-byo"
NOTRAIN_REPO = "localhost/kiln-test-notrain"
QUITS_REPO = "localhost/kiln-test-quits"
# The glob a server's container_engine.images takes to run these images on the engine.
IMAGE_GLOB = "localhost/kiln-test-*"

PYTHON = "/usr/bin/python3.11"
SHELL = "/bin/dash"
COREUTILS = ["cat", "sleep", "ls", "env", "echo", "mkdir", "kill", "rm", "head"]

# The BYO program (training and serving). Standard library only.
ENTRY_PROGRAM = r'''#!/usr/bin/python3
"""A bring-your-own-container program (issue 15 tests): SageMaker runs the image as `<entrypoint>
train` or `<entrypoint> serve`.

train: reads every file of channel `channel` (hyperparameter, default "train") under
  /opt/ml/input/data/<channel>, the hyperparameters from /opt/ml/input/config/hyperparameters.json,
  prints "tick i" every second for `ticks` seconds, then writes /opt/ml/model/model.json
  {"channel", "files": {path: text}, "hyperparameters", "hostname", "in_container", "peers"}
  (model-<current host>.json when the job has several hosts). With fail=1 it writes
  `failure_text` to /opt/ml/output/failure and exits 1. With sigterm=1, SIGTERM prints
  "caught SIGTERM", writes model/stopped.json and exits 0. With rendezvous=1 the first host of
  resourceconfig.json listens on 7777 and every other host connects to it by name (algo-1) and sends
  its own name; "peers" holds the names the first host received (or, on the others, the address
  they reached it at). With contract=1 it writes model/contract.json (environment, /dev/shm size,
  rlimits, uid, cwd, config files, /opt/ml entries, host name).
serve: answers on $SAGEMAKER_BIND_TO_PORT (default 8080) GET /ping 200 and POST /invocations with
  {"echo": the request body, "model": /opt/ml/model/model.json or null, "hostname",
  "tag": $MODEL_TAG, "address": its host name's address, "port",
  "started": when this process started, "pid", "in_container"}; exits 0 on SIGTERM.
"""
import json
import os
import signal
import socket
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

ML = "/opt/ml"
STARTED = time.time()


def log(message):
    sys.stdout.write(message + "\n")
    sys.stdout.flush()


def in_container():
    # The test base image's marker (the host running the process runtime may itself be a container).
    return os.path.exists("/etc/kiln-test-image")


def hostname():
    return os.environ.get("HOSTNAME") or socket.gethostname()


def train():
    try:
        with open(os.path.join(ML, "input/config/hyperparameters.json")) as f:
            hp = json.load(f)
    except OSError:
        hp = {}
    channel = hp.get("channel", "train")
    root = os.path.join(ML, "input/data", channel)
    files = {}
    for dirpath, _, names in os.walk(root):
        for name in sorted(names):
            path = os.path.join(dirpath, name)
            with open(path, "rb") as f:
                files[os.path.relpath(path, root)] = f.read().decode("utf-8", "replace")
    log("training on %d files of channel %s" % (len(files), channel))
    if hp.get("sigterm") == "1":
        def on_term(signum, frame):
            log("caught SIGTERM")
            with open(os.path.join(ML, "model/stopped.json"), "w") as f:
                json.dump({"stopped": True, "hostname": hostname()}, f)
            sys.exit(0)
        signal.signal(signal.SIGTERM, on_term)
    with open(os.path.join(ML, "input/config/resourceconfig.json")) as f:
        rc = json.load(f)
    peers = rendezvous(rc) if hp.get("rendezvous") == "1" else None
    if hp.get("contract") == "1":
        write_contract()
    for i in range(int(hp.get("ticks", "0"))):
        log("tick %d" % i)
        time.sleep(1)
    if hp.get("fail") == "1":
        with open(os.path.join(ML, "output/failure"), "w") as f:
            f.write(hp.get("failure_text", "the training program failed"))
        log("failing as asked")
        sys.exit(1)
    model = {"channel": channel, "files": files, "hyperparameters": hp, "hostname": hostname(),
             "in_container": in_container(), "peers": peers, "probes": probe(hp)}
    name = "model.json" if len(rc["hosts"]) == 1 else "model-%s.json" % rc["current_host"]
    with open(os.path.join(ML, "model", name), "w") as f:
        json.dump(model, f, sort_keys=True)
    log("model written")


def probe(hp):
    """{"host:port": connected?} for hyperparameter probes="host:port,..." and, with
    probe_endpoint=1, Kiln's endpoint as AWS_ENDPOINT_URL names it (EnableNetworkIsolation)."""
    targets = [t for t in hp.get("probes", "").split(",") if t]
    if hp.get("probe_endpoint") == "1":
        url = os.environ.get("AWS_ENDPOINT_URL", "")
        targets.append(url.split("//", 1)[-1].split("/", 1)[0])
    results = {}
    for target in targets:
        host, port = target.rsplit(":", 1)
        try:
            socket.create_connection((host, int(port)), timeout=3).close()
            results[target] = True
        except OSError:
            results[target] = False
    return results


def write_contract():
    import resource
    shm = os.statvfs("/dev/shm")
    contract = {
        "env": dict(os.environ),
        "shm_bytes": shm.f_blocks * shm.f_frsize,
        "limits": {name: list(resource.getrlimit(getattr(resource, "RLIMIT_" + name.upper())))
                   for name in ("nofile", "nproc", "memlock", "stack")},
        "uid": os.getuid(),
        "cwd": os.getcwd(),
        "config_files": sorted(os.listdir(os.path.join(ML, "input/config"))),
        "ml_dirs": sorted(d for d in os.listdir(ML)),
        "hostname": socket.gethostname(),
    }
    with open(os.path.join(ML, "model/contract.json"), "w") as f:
        json.dump(contract, f, sort_keys=True)


def rendezvous(rc):
    hosts, me = rc["hosts"], rc["current_host"]
    if me == hosts[0]:
        listener = socket.socket()
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("0.0.0.0", 7777))
        listener.listen(8)
        listener.settimeout(60)
        got = []
        while len(got) < len(hosts) - 1:
            conn, _ = listener.accept()
            with conn:
                got.append(conn.makefile().readline().strip())
                conn.sendall(b"ok\n")
        log("rendezvous: heard from %s" % ",".join(sorted(got)))
        return sorted(got)
    deadline = time.time() + 60
    while True:
        try:
            with socket.create_connection((hosts[0], 7777), timeout=2) as conn:
                conn.sendall(me.encode() + b"\n")
                conn.makefile().readline()
                address = conn.getpeername()[0]
                log("rendezvous: reached %s at %s" % (hosts[0], address))
                return [address]
        except OSError:
            if time.time() > deadline:
                raise
            time.sleep(0.2)


def serve():
    port = int(os.environ.get("SAGEMAKER_BIND_TO_PORT") or "8080")
    try:
        with open(os.path.join(ML, "model/model.json")) as f:
            model = json.load(f)
    except (OSError, ValueError):
        model = None

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args):
            pass

        def answer(self, status, body, content_type="application/json"):
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_GET(self):
            if self.path == "/ping":
                self.answer(200, b"")
            else:
                self.answer(404, b"not found", "text/plain")

        def do_POST(self):
            data = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            if self.path != "/invocations":
                self.answer(404, b"not found", "text/plain")
                return
            out = {"echo": data.decode("utf-8", "replace"), "model": model, "hostname": hostname(),
                   "tag": os.environ.get("MODEL_TAG"), "address": address, "port": port,
                   "started": STARTED, "pid": os.getpid(), "in_container": in_container()}
            self.answer(200, json.dumps(out).encode())

    try:
        address = socket.gethostbyname(hostname())  # the instance's address (its /etc/hosts line)
    except OSError:
        address = None
    ThreadingHTTPServer.allow_reuse_address = True
    ThreadingHTTPServer.daemon_threads = True
    server = ThreadingHTTPServer(("0.0.0.0", port), Handler)

    def on_term(signum, frame):
        log("caught SIGTERM, stopping")
        threading.Thread(target=server.shutdown, daemon=True).start()

    signal.signal(signal.SIGTERM, on_term)
    log("serving on %d" % port)
    server.serve_forever()
    log("stopped")


if __name__ == "__main__":
    what = sys.argv[1] if len(sys.argv) > 1 else ""
    if what == "train":
        train()
    elif what == "serve":
        serve()
    else:
        sys.stderr.write("usage: entry train|serve (got %r)\n" % sys.argv[1:])
        sys.exit(2)
'''

QUITS_ENTRY = "#!/bin/sh\necho \"quitting at once ($*)\"\nexit 3\n"


class Unavailable(Exception):
    """Podman (or its API socket) cannot be used here; the message says why."""


# ---------------------------------------------------------------------------------------------
# The engine


def socket_path():
    """The engine's socket path ($KILN_PODMAN_SOCKET without its unix:// prefix, or the default)."""
    path = os.environ.get("KILN_PODMAN_SOCKET") or DEFAULT_SOCKET
    return path[len("unix://"):] if path.startswith("unix://") else path


def socket_uri():
    return "unix://" + socket_path()


class _UnixConnection(http.client.HTTPConnection):
    def __init__(self, path, timeout=10):
        super().__init__("localhost", timeout=timeout)
        self._path = path

    def connect(self):
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(self.timeout)
        self.sock.connect(self._path)


def engine_request(method, path, body=None, timeout=10):
    """One request to the engine's Docker-compatible API: (status, parsed JSON or raw bytes)."""
    conn = _UnixConnection(socket_path(), timeout=timeout)
    try:
        headers = {}
        data = None
        if body is not None:
            data = json.dumps(body).encode()
            headers["Content-Type"] = "application/json"
        conn.request(method, path, body=data, headers=headers)
        resp = conn.getresponse()
        raw = resp.read()
        try:
            return resp.status, json.loads(raw)
        except ValueError:
            return resp.status, raw
    finally:
        conn.close()


def check_podman():
    """Raises Unavailable with the reason unless the podman CLI and the engine socket both work."""
    if shutil.which("podman") is None:
        raise Unavailable("podman is not installed (scripts/podman-setup.sh installs and sets it up)")
    path = socket_path()
    if not os.path.exists(path):
        if os.environ.get("KILN_PODMAN_SKIP_REASON"):  # scripts/test.sh says why it could not set Podman up
            raise Unavailable(os.environ["KILN_PODMAN_SKIP_REASON"])
        raise Unavailable("no engine socket at %s (start `podman system service --time=0 unix://%s`, or set "
                          "KILN_PODMAN_SOCKET)" % (path, path))
    try:
        status, body = engine_request("GET", "/_ping", timeout=5)
    except OSError as e:
        raise Unavailable("the engine socket %s does not answer: %s" % (path, e))
    if status != 200:
        raise Unavailable("the engine socket %s answered /_ping with %d: %r" % (path, status, body))


def podman_or_skip():
    import pytest
    try:
        check_podman()
    except Unavailable as e:
        pytest.skip(str(e))


def podman(*args, check=True, timeout=300, input=None):
    p = subprocess.run(["podman"] + [str(a) for a in args], capture_output=True, text=True, timeout=timeout,
                       input=input)
    if check and p.returncode != 0:
        raise RuntimeError("podman %s failed (%d): %s%s" % (" ".join(map(str, args)), p.returncode, p.stderr,
                                                            p.stdout))
    return p


def image_exists(ref):
    return podman("image", "exists", ref, check=False).returncode == 0


@contextlib.contextmanager
def _build_lock():
    with open(LOCK_PATH, "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


# ---------------------------------------------------------------------------------------------
# The base image


def _ldd(paths):
    """The libraries (resolved paths) the ELF files in `paths` load, plus the dynamic loader."""
    libs = set()
    for i in range(0, len(paths), 200):
        p = subprocess.run(["ldd"] + paths[i:i + 200], capture_output=True, text=True)
        for line in p.stdout.splitlines():
            line = line.strip()
            if "=>" in line:
                target = line.split("=>", 1)[1].strip().split(" ")[0]
                if target.startswith("/"):
                    libs.add(target)
            elif line.startswith("/") and not line.endswith(":"):  # the loader; "path:" heads a file
                libs.add(line.split(" ")[0])
    return sorted(libs)


def _base_inputs():
    """[(path in the image, host path or None for a directory tree copy)]: what the base holds."""
    programs = [PYTHON, SHELL] + [shutil.which(c) or "/bin/" + c for c in COREUTILS]
    pylib = "/usr/lib/python3.11"
    extensions = []
    for dirpath, _, names in os.walk(os.path.join(pylib, "lib-dynload")):
        extensions += [os.path.join(dirpath, n) for n in names if n.endswith(".so")]
    return programs, pylib, _ldd(programs + extensions)


def _pylib_files(pylib):
    for dirpath, dirnames, names in os.walk(pylib):
        rel = os.path.relpath(dirpath, pylib)
        dirnames[:] = sorted(d for d in dirnames if d != "__pycache__"
                             and not (rel == "." and d in ("test", "idlelib", "tkinter", "turtledemo")))
        for name in sorted(names):
            yield os.path.join(dirpath, name)


def _stat_key(path):
    st = os.stat(path)
    return "%s %d %d" % (path, st.st_size, int(st.st_mtime))


def base_image():
    """localhost/kiln-test-base:<hash of the host files' paths, sizes, mtimes>; built when absent."""
    programs, pylib, libs = _base_inputs()
    h = hashlib.sha256(b"kiln-test-base v2\n")
    for path in programs + libs:
        h.update(_stat_key(path).encode() + b"\n")
    # The library tree: its file list and sizes (mtimes change with Debian updates, sizes mostly too).
    for path in _pylib_files(pylib):
        h.update(_stat_key(path).encode() + b"\n")
    ref = "%s:%s" % (BASE_REPO, h.hexdigest()[:16])
    if image_exists(ref):
        return ref
    with _build_lock():
        if image_exists(ref):
            return ref
        root = tempfile.mkdtemp(prefix="kiln-test-rootfs-")
        try:
            _assemble_rootfs(root, programs, pylib, libs)
            tar = subprocess.Popen(["tar", "-C", root, "-cf", "-", "."], stdout=subprocess.PIPE)
            p = subprocess.run(["podman", "import", "--change", "ENV PATH=/usr/local/bin:/usr/bin:/bin",
                                "--change", "ENV LANG=C.UTF-8", "-", ref], stdin=tar.stdout,
                               capture_output=True, text=True, timeout=300)
            tar.stdout.close()
            tar.wait()
            if p.returncode != 0 or tar.returncode != 0:
                raise RuntimeError("podman import of %s failed (%d, tar %d): %s" % (ref, p.returncode, tar.returncode,
                                                                                  p.stderr))
        finally:
            shutil.rmtree(root, ignore_errors=True)
    return ref


def _copy(src, root, dest=None):
    dest = os.path.join(root, (dest or src).lstrip("/"))
    os.makedirs(os.path.dirname(dest), exist_ok=True)
    shutil.copy2(src, dest)


def _assemble_rootfs(root, programs, pylib, libs):
    for d in ("bin", "usr/bin", "usr/local/bin", "etc", "tmp", "root", "opt", "proc", "sys", "dev", "run",
              "var/tmp", "lib64"):
        os.makedirs(os.path.join(root, d), exist_ok=True)
    os.chmod(os.path.join(root, "tmp"), 0o1777)
    os.chmod(os.path.join(root, "var/tmp"), 0o1777)
    _copy(PYTHON, root)
    os.symlink("python3.11", os.path.join(root, "usr/bin/python3"))
    _copy(SHELL, root, "/bin/dash")
    os.symlink("dash", os.path.join(root, "bin/sh"))
    for c in COREUTILS:
        src = shutil.which(c) or "/bin/" + c
        _copy(src, root, "/usr/bin/" + c)
        if not os.path.exists(os.path.join(root, "bin", c)):
            os.symlink("/usr/bin/" + c, os.path.join(root, "bin", c))
    for lib in libs:
        _copy(os.path.realpath(lib), root, lib)
    for path in _pylib_files(pylib):
        if os.path.islink(path):
            dest = os.path.join(root, path.lstrip("/"))
            os.makedirs(os.path.dirname(dest), exist_ok=True)
            os.symlink(os.readlink(path), dest)
        else:
            _copy(path, root)
    with open(os.path.join(root, "etc/passwd"), "w") as f:
        f.write("root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/nonexistent:/bin/sh\n")
    with open(os.path.join(root, "etc/group"), "w") as f:
        f.write("root:x:0:\nnogroup:x:65534:\n")
    with open(os.path.join(root, "etc/kiln-test-image"), "w") as f:
        f.write("built by tests/integration/container_images.py\n")
    for name in ("hosts", "resolv.conf", "hostname"):
        open(os.path.join(root, "etc", name), "a").close()


# ---------------------------------------------------------------------------------------------
# Images built on the base


def _build(repo, base, containerfile, files):
    """`podman build` of `containerfile` (its FROM replaced by `base`) with `files` {name: (text, mode)}
    in the context; tag <repo>:<hash of base + containerfile + files>. Returns the reference."""
    containerfile = containerfile.replace("FROM base", "FROM " + base)
    h = hashlib.sha256(containerfile.encode())
    for name in sorted(files):
        text, mode = files[name]
        h.update(("\0%s\0%o\0" % (name, mode)).encode() + text.encode())
    ref = "%s:%s" % (repo, h.hexdigest()[:16])
    if image_exists(ref):
        return ref
    with _build_lock():
        if image_exists(ref):
            return ref
        ctx = tempfile.mkdtemp(prefix="kiln-test-build-")
        try:
            with open(os.path.join(ctx, "Containerfile"), "w") as f:
                f.write(containerfile)
            for name, (text, mode) in files.items():
                path = os.path.join(ctx, name)
                with open(path, "w") as f:
                    f.write(text)
                os.chmod(path, mode)
            podman("build", "--pull=never", "--layers=false", "-q", "-f", os.path.join(ctx, "Containerfile"),
                   "-t", ref, ctx)
        finally:
            shutil.rmtree(ctx, ignore_errors=True)
    return ref


def byo_image(base=None):
    return _build(BYO_REPO, base or base_image(),
                  "FROM base\nCOPY entry /opt/program/entry\nENTRYPOINT [\"/opt/program/entry\"]\n",
                  {"entry": (ENTRY_PROGRAM, 0o755)})


def notrain_image(base=None):
    # No entrypoint, no program named `train`: the engine is asked to run `train` and cannot.
    return _build(NOTRAIN_REPO, base or base_image(), "FROM base\nLABEL kiln.test=notrain\n", {})


def quits_image(base=None):
    return _build(QUITS_REPO, base or base_image(),
                  "FROM base\nCOPY quits /opt/program/quits\nENTRYPOINT [\"/opt/program/quits\"]\n",
                  {"quits": (QUITS_ENTRY, 0o755)})


def all_images():
    """{"base", "byo", "notrain", "quits": reference}, built when absent."""
    base = base_image()
    return {"base": base, "byo": byo_image(base), "notrain": notrain_image(base), "quits": quits_image(base)}


def host_program(directory):
    """ENTRY_PROGRAM written as <directory>/entry (mode 0755); returns the `local:` image URI."""
    os.makedirs(directory, exist_ok=True)
    path = os.path.join(directory, "entry")
    with open(path, "w") as f:
        f.write(ENTRY_PROGRAM)
    os.chmod(path, 0o755)
    return "local:" + path


class PrivateEngine:
    """A Podman API service of the test's own on `path` (same image store as every other), so that a
    test can kill the engine under a server and bring it back without touching the shared one.
    Containers started through it run on under conmon while it is down."""

    def __init__(self, path):
        self.path = path
        self.proc = None
        self.log_path = path + ".log"

    @property
    def uri(self):
        return "unix://" + self.path

    def start(self, timeout=30):
        import time
        if os.path.exists(self.path):
            os.unlink(self.path)
        log = open(self.log_path, "ab")
        self.proc = subprocess.Popen(["podman", "system", "service", "--time=0", self.uri], stdout=log,
                                     stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
        log.close()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError("podman system service exited %s; see %s" % (self.proc.returncode, self.log_path))
            try:
                conn = _UnixConnection(self.path, timeout=2)
                conn.request("GET", "/_ping")
                if conn.getresponse().status == 200:
                    conn.close()
                    return self
                conn.close()
            except OSError:
                pass
            time.sleep(0.05)
        self.kill()
        raise RuntimeError("podman system service on %s did not answer in %ss" % (self.path, timeout))

    def kill(self):
        """SIGKILL of the service (an engine that dies); its containers keep running."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        self.proc = None


# ---------------------------------------------------------------------------------------------
# What a server left in the engine


def server_label(data_dir):
    """The label Kiln gives a server's containers (`kiln.server`): 8 hex of sha256(data dir)."""
    return hashlib.sha256(os.path.abspath(data_dir).encode()).hexdigest()[:8]


def containers_of(label):
    """[(name, state)] of every container (running or not) labelled kiln.server=<label>."""
    filters = json.dumps({"label": ["kiln.server=%s" % label]})
    status, body = engine_request("GET", "/v1.41/containers/json?all=true&filters=" +
                                  urllib_quote(filters))
    if status != 200:
        raise RuntimeError("listing containers answered %d: %r" % (status, body))
    return [((c.get("Names") or ["?"])[0].lstrip("/"), c.get("State")) for c in body]


def urllib_quote(s):
    import urllib.parse
    return urllib.parse.quote(s, safe="")


UNIT_BASE = "localhost/kiln-unit-base:latest"

if __name__ == "__main__":
    import time
    t0 = time.monotonic()
    check_podman()
    if sys.argv[1:] == ["--unit-base"]:
        # The C++ unit tests' live cases (runtime_docker_test) run this image: the base (sh,
        # sleep, python3) under a fixed name, so that they need no Python to find it.
        podman("tag", base_image(), UNIT_BASE)
        print(UNIT_BASE)
        sys.exit(0)
    refs = all_images()
    print(json.dumps(refs, indent=1))
    print("%.2f s" % (time.monotonic() - t0))
