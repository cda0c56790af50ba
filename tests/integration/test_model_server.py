"""Kiln's model server (issue 13), the `kiln-model-server serve` program run directly: a subprocess
on a free loopback port with a temp SAGEMAKER_BASE_DIR and the environment of
src/modelserver/README.md, workers running python/kiln_toolkit/serve_worker.py under Debian's
python3 (torch, numpy). No Kiln server is involved; test_sdk_deploy.py covers the endpoint path.

What it shows: the default codecs (NPY, JSON, CSV) with the PyTorch default model_fn on a
TorchScript model.pt, compared to torch run in this process; handler errors (500 + message), a
worker killed mid-request (that request 500, the next ones 200, the worker replaced); 32 keep-alive
clients for 60 s without an error with the server's RSS (server + workers) bounded; bad input (400,
415, 500, 413, 504 with the timeout, 503 on a full queue); dynamic batching; multi-model mode
(load, list with paging, get, invoke, 409, 404, unload, 507); /ping before and after loading;
/execution-parameters; the native TorchScript backend answering as the Python path does.

Each server configuration is one module-scoped process; every one must exit 0 on SIGTERM.
"""

import http.client
import io
import json
import os
import signal
import subprocess
import threading
import time

import pytest

import kiln_harness as kh

HERE = os.path.dirname(os.path.abspath(__file__))
FIXTURES = os.path.join(HERE, "model_server")
WORKER = os.path.join(kh.REPO_ROOT, "python", "kiln_toolkit", "serve_worker.py")
PYTHON = "/usr/bin/python3"

# The TorchScript model every default-path test serves: y = x @ W.T + b, then tanh on column 1.
W = [[0.5, -1.0, 2.0], [1.5, 0.25, -0.75]]
B = [0.1, -0.2]
INPUT = [[1.0, 2.0, 3.0], [-1.0, 0.5, 0.0], [0.25, -0.5, 4.0]]


def server_binary():
    return os.path.join(kh.build_dir(), "src", "modelserver", "kiln-model-server")


@pytest.fixture(scope="module")
def binary():
    path = server_binary()
    if not os.access(path, os.X_OK):
        pytest.skip("kiln-model-server not built at %s (build target `kiln-model-server`, or set "
                    "KILN_BUILD_DIR)" % path)
    if not os.path.exists(WORKER):
        pytest.skip("the Python worker %s is missing" % WORKER)
    return path


# ---------------------------------------------------------------------------------------------
# The program as a subprocess


class ModelServer:
    """One `kiln-model-server serve` process; its stderr (the instance log) goes to a file."""

    def __init__(self, binary, base_dir, env, name):
        self.binary = binary
        self.base_dir = base_dir
        self.port = kh.free_port()
        self.log_path = os.path.join(os.path.dirname(base_dir), name + ".log")
        self.env = {k: v for k, v in os.environ.items()
                    if not k.startswith(("SAGEMAKER_", "KILN_MODEL_SERVER_"))}
        self.env.update({
            "SAGEMAKER_BIND_TO_PORT": str(self.port),
            "SAGEMAKER_BASE_DIR": base_dir,
            "KILN_MODEL_SERVER_PYTHON": PYTHON,
            "KILN_MODEL_SERVER_WORKER": WORKER,
            "PYTHONDONTWRITEBYTECODE": "1",
        })
        self.env.update({k: str(v) for k, v in env.items()})
        self.proc = None
        self.first_ping = None

    def start(self, timeout=60.0, wait_ready=True):
        self._log = open(self.log_path, "ab")
        self.proc = subprocess.Popen([self.binary, "serve"], env=self.env, stdin=subprocess.DEVNULL,
                                     stdout=self._log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                return False
            try:
                status, _, _ = self.request("GET", "/ping", timeout=2)
                if self.first_ping is None:
                    self.first_ping = status
                if status == 200 or not wait_ready:
                    return True
            except OSError:
                pass
            time.sleep(0.05)
        raise AssertionError("kiln-model-server not ready on port %d after %.0fs (first /ping: %s); log:\n%s"
                             % (self.port, timeout, self.first_ping, self.log_tail()))

    def request(self, method, path, body=None, headers=None, timeout=30):
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=timeout)
        try:
            conn.request(method, path, body=body, headers=headers or {})
            r = conn.getresponse()
            return r.status, {k.lower(): v for k, v in r.getheaders()}, r.read()
        finally:
            conn.close()

    def invoke(self, body, content_type="application/json", accept=None, path="/invocations", timeout=30):
        headers = {"Content-Type": content_type}
        if accept:
            headers["Accept"] = accept
        if isinstance(body, (dict, list)):
            body = json.dumps(body)
        return self.request("POST", path, body=body, headers=headers, timeout=timeout)

    def alive(self):
        return self.proc is not None and self.proc.poll() is None

    def log_tail(self, n=60):
        try:
            with open(self.log_path, "rb") as f:
                return "\n".join(f.read().decode("utf-8", "replace").splitlines()[-n:])
        except OSError:
            return ""

    def children(self):
        return children_of(self.proc.pid)

    def tree_rss(self):
        """RSS in bytes of the server and every process below it (workers), from /proc."""
        total = 0
        for pid in [self.proc.pid] + descendants(self.proc.pid):
            total += rss_of(pid)
        return total

    def stop(self, timeout=30.0):
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            rc = self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            rc = "ignored SIGTERM for %.0fs" % timeout
        self._log.close()
        return rc

    def healthy(self):
        """Still running and /ping answers 200."""
        if not self.alive():
            return False
        try:
            return self.request("GET", "/ping", timeout=5)[0] == 200
        except OSError:
            return False


def children_of(pid):
    out = []
    try:
        for tid in os.listdir("/proc/%d/task" % pid):
            with open("/proc/%d/task/%s/children" % (pid, tid)) as f:
                out += [int(p) for p in f.read().split()]
    except OSError:
        pass
    return sorted(set(out))


def descendants(pid):
    out = []
    for child in children_of(pid):
        out.append(child)
        out += descendants(child)
    return out


def rss_of(pid):
    try:
        with open("/proc/%d/status" % pid) as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def is_python_worker(pid):
    try:
        with open("/proc/%d/cmdline" % pid, "rb") as f:
            return b"serve_worker.py" in f.read()
    except OSError:
        return False


def python_workers(server):
    return [p for p in server.children() if is_python_worker(p)]


def assert_close(got, expected, rtol=1e-5, atol=1e-6):
    """Nested lists (or arrays) equal in shape and within float32 rounding."""
    import numpy as np
    got, expected = np.asarray(got, dtype=np.float64), np.asarray(expected, dtype=np.float64)
    assert got.shape == expected.shape, (got.tolist(), expected.tolist())
    np.testing.assert_allclose(got, expected, rtol=rtol, atol=atol)


def is_close(got, expected):
    try:
        assert_close(got, expected)
        return True
    except (AssertionError, ValueError, TypeError):
        return False


def error_json(body):
    """The error body every error answer carries: {"code", "type", "message"}."""
    doc = json.loads(body)
    assert {"code", "type", "message"} <= set(doc), doc
    return doc


@pytest.fixture(scope="module")
def servers(binary, tmp_path_factory):
    """Starts servers on demand (module-scoped); SIGTERMs them all at the end (each must exit 0)."""
    started = []

    def start(name, env, setup, wait_ready=True, expect_start=True):
        base = str(tmp_path_factory.mktemp("ms-" + name) / "opt_ml")
        os.makedirs(base)
        setup(base)
        srv = ModelServer(binary, base, env, name)
        started.append(srv)
        ok = srv.start(wait_ready=wait_ready)
        if expect_start and not ok:
            raise AssertionError("kiln-model-server (%s) exited %s during start; log:\n%s"
                                 % (name, srv.proc.returncode, srv.log_tail()))
        return srv

    yield start
    failures = []
    for srv in started:
        was_running = srv.alive()
        rc = srv.stop()
        if was_running and rc != 0:
            failures.append("%s exited %s on SIGTERM; log:\n%s" % (srv.log_path, rc, srv.log_tail(30)))
    assert not failures, "\n".join(failures)


# ---------------------------------------------------------------------------------------------
# Model directories


_MODEL = []


def torch_model():
    """The TorchScript module (built once per process)."""
    if _MODEL:
        return _MODEL[0]
    import torch

    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.linear = torch.nn.Linear(3, 2)
            with torch.no_grad():
                self.linear.weight.copy_(torch.tensor(W))
                self.linear.bias.copy_(torch.tensor(B))

        def forward(self, x):
            y = self.linear(x)
            return torch.stack([y[:, 0], torch.tanh(y[:, 1])], dim=1)

    _MODEL.append(torch.jit.script(Net()))
    return _MODEL[0]


def setup_torch(base):
    os.makedirs(os.path.join(base, "model"))
    torch_model().save(os.path.join(base, "model", "model.pt"))


def expected_output(rows):
    """What the TorchScript model computes, run here with torch (float32)."""
    import torch
    with torch.no_grad():
        return torch_model()(torch.tensor(rows, dtype=torch.float32)).numpy()


def setup_code(handler_dir, extra=None):
    def setup(base):
        code = os.path.join(base, "model", "code")
        os.makedirs(code)
        with open(os.path.join(FIXTURES, handler_dir, "inference.py"), "rb") as f:
            data = f.read()
        with open(os.path.join(code, "inference.py"), "wb") as f:
            f.write(data)
        for name, content in (extra or {}).items():
            with open(os.path.join(base, "model", name), "w") as f:
                f.write(content)
    return setup


@pytest.fixture(scope="module")
def defaults(servers):
    """PyTorch framework, a TorchScript model.pt and no code/: the default model_fn and codecs.
    SAGEMAKER_MAX_PAYLOAD_IN_MB=1 for the 413 test."""
    return servers("defaults", {"KILN_MODEL_SERVER_FRAMEWORK": "pytorch", "SAGEMAKER_MODEL_SERVER_WORKERS": 2,
                                "SAGEMAKER_MAX_PAYLOAD_IN_MB": 1}, setup_torch)


@pytest.fixture(scope="module")
def handlers(servers):
    """handlers/inference.py on two workers, a 2 s request timeout, model_fn sleeping 1.5 s."""
    return servers("handlers", {"SAGEMAKER_MODEL_SERVER_WORKERS": 2, "SAGEMAKER_MODEL_SERVER_TIMEOUT": 2},
                   setup_code("handlers", {"model_fn_seconds.txt": "1.5"}))


# ---------------------------------------------------------------------------------------------
# Default codecs (no inference.py)


def test_json_round_trip_through_the_defaults(defaults):
    status, headers, body = defaults.invoke(INPUT, accept="application/json")
    assert status == 200, (status, body[:500])
    assert headers["content-type"].startswith("application/json"), headers
    assert_close(json.loads(body), expected_output(INPUT))


def test_csv_round_trip_through_the_defaults(defaults):
    csv_in = "\n".join(",".join(repr(v) for v in row) for row in INPUT)
    status, headers, body = defaults.invoke(csv_in, content_type="text/csv", accept="text/csv")
    assert status == 200, (status, body[:500])
    assert headers["content-type"].startswith("text/csv"), headers
    rows = [[float(v) for v in line.split(",")] for line in body.decode().strip().splitlines()]
    assert_close(rows, expected_output(INPUT))


def test_npy_round_trip_through_the_defaults(defaults):
    import numpy as np
    buf = io.BytesIO()
    np.save(buf, np.array(INPUT, dtype=np.float32))
    status, headers, body = defaults.invoke(buf.getvalue(), content_type="application/x-npy",
                                            accept="application/x-npy")
    assert status == 200, (status, body[:500])
    assert headers["content-type"].startswith("application/x-npy"), headers
    out = np.load(io.BytesIO(body), allow_pickle=False)
    assert out.shape == (3, 2)
    np.testing.assert_allclose(out, expected_output(INPUT), rtol=1e-6, atol=1e-6)


def test_accept_defaults_to_json(defaults):
    """No Accept (and */*): SAGEMAKER_DEFAULT_INVOCATIONS_ACCEPT's default, application/json."""
    for accept in (None, "*/*"):
        status, headers, body = defaults.invoke(INPUT, accept=accept)
        assert status == 200, (accept, status, body[:500])
        assert headers["content-type"].startswith("application/json"), (accept, headers)
        assert_close(json.loads(body), expected_output(INPUT))


# ---------------------------------------------------------------------------------------------
# Bad input


def test_undecodable_json_is_400(defaults):
    status, _, body = defaults.invoke(b'{"not json', content_type="application/json")
    assert status == 400, (status, body[:500])
    assert error_json(body)["code"] == 400
    assert defaults.healthy()


def test_unsupported_content_type_and_accept_are_415(defaults):
    status, _, body = defaults.invoke(b"\x00\x01", content_type="application/x-kiln-unknown")
    assert status == 415, (status, body[:500])
    assert "application/x-kiln-unknown" in error_json(body)["message"], body
    status, _, body = defaults.invoke(INPUT, accept="application/x-kiln-unknown")
    assert status == 415, (status, body[:500])
    assert "application/x-kiln-unknown" in error_json(body)["message"], body
    assert defaults.healthy()


def raw_post(port, path, body, content_type="application/json", timeout=30):
    """POST on a raw socket; a server that answers 413 and closes before reading the whole body
    may reset the send, so the answer is read whatever the send did."""
    import socket
    s = socket.create_connection(("127.0.0.1", port), timeout=timeout)
    try:
        head = ("POST %s HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: %s\r\nContent-Length: %d\r\n\r\n"
                % (path, content_type, len(body))).encode()
        try:
            s.sendall(head + body)
        except OSError:
            pass
        data = b""
        while b"\r\n\r\n" not in data:
            chunk = s.recv(65536)
            if not chunk:
                break
            data += chunk
        head, _, rest = data.partition(b"\r\n\r\n")
        return int(head.split(b" ", 2)[1]), rest
    finally:
        s.close()


def test_body_over_max_payload_is_413(defaults):
    body = b"[" + b"1.0," * (400 * 1024) + b"1.0]"  # 1.6 MB, SAGEMAKER_MAX_PAYLOAD_IN_MB=1
    status, answer = raw_post(defaults.port, "/invocations", body)
    assert status == 413, (status, answer[:500])
    assert defaults.healthy()
    status, _, answer = defaults.invoke(INPUT)
    assert status == 200, (status, answer[:300])


def test_handler_returning_the_wrong_type_is_500(handlers):
    status, _, body = handlers.invoke({"op": "wrong_type"})
    assert status == 500, (status, body[:500])
    assert error_json(body)["code"] == 500
    assert handlers.invoke({"op": "echo", "value": 1})[0] == 200


# ---------------------------------------------------------------------------------------------
# Handlers: errors, dying workers, hanging workers


def test_ping_is_503_until_the_model_is_loaded(handlers):
    # The fixture polled /ping from the moment the port answered; model_fn sleeps 1.5 s.
    assert handlers.first_ping == 503, handlers.first_ping
    status, _, body = handlers.request("GET", "/ping")
    assert status == 200, (status, body)


def test_execution_parameters(handlers):
    status, _, body = handlers.request("GET", "/execution-parameters")
    assert status == 200, (status, body)
    assert json.loads(body) == {"MaxConcurrentTransforms": 2, "BatchStrategy": "MULTI_RECORD",
                                "MaxPayloadInMB": 6}


def test_handler_exception_is_500_with_its_message(handlers):
    status, _, body = handlers.invoke({"op": "raise", "message": "kiln-test: the handler gave up"})
    assert status == 500, (status, body[:500])
    err = error_json(body)
    assert "kiln-test: the handler gave up" in err["message"], err
    assert handlers.healthy()
    status, _, body = handlers.invoke({"op": "echo", "value": "after"})
    assert status == 200 and json.loads(body)["value"] == "after", (status, body)
    log = handlers.log_tail(400)
    assert "kiln-test: the handler gave up" in log and "Traceback" in log, log  # the traceback goes to the log


def test_killing_a_worker_mid_request_fails_only_that_request(handlers, tmp_path):
    workers = python_workers(handlers)
    assert len(workers) == 2, (workers, handlers.children())
    mark = str(tmp_path / "busy.pid")
    result = {}

    def slow():
        result["answer"] = handlers.invoke({"op": "sleep", "seconds": 1.5, "mark": mark}, timeout=30)

    t = threading.Thread(target=slow)
    t.start()
    deadline = time.monotonic() + 10
    while not os.path.exists(mark) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert os.path.exists(mark), "the sleeping handler never started"
    pid = int(open(mark).read())
    assert pid in workers, (pid, workers)
    os.kill(pid, signal.SIGKILL)
    t.join(30)
    status, _, body = result["answer"]
    assert status == 500, (status, body[:500])
    error_json(body)
    for i in range(6):
        status, _, body = handlers.invoke({"op": "echo", "value": i})
        assert status == 200, (i, status, body[:500])
        assert json.loads(body)["value"] == i
    # The dead worker is replaced: two live workers again, the killed one gone.
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        now = python_workers(handlers)
        if len(now) == 2 and pid not in now:
            break
        time.sleep(0.1)
    assert len(now) == 2 and pid not in now, (pid, now)
    assert handlers.healthy()


def test_a_hanging_handler_is_504_after_the_timeout(handlers):
    t0 = time.monotonic()
    status, _, body = handlers.invoke({"op": "sleep", "seconds": 30}, timeout=30)
    took = time.monotonic() - t0
    assert status == 504, (status, body[:500])
    error_json(body)
    assert took < 6, "504 came after %.1f s with SAGEMAKER_MODEL_SERVER_TIMEOUT=2" % took
    status, _, body = handlers.invoke({"op": "echo", "value": "next"})
    assert status == 200, (status, body[:500])
    assert handlers.healthy()


def test_a_full_queue_answers_503_at_once(servers):
    srv = servers("queue", {"SAGEMAKER_MODEL_SERVER_WORKERS": 1, "KILN_MODEL_SERVER_QUEUE_SIZE": 1},
                  setup_code("handlers"))
    answers = []
    lock = threading.Lock()

    def call():
        t0 = time.monotonic()
        status, _, body = srv.invoke({"op": "sleep", "seconds": 1.5}, timeout=30)
        with lock:
            answers.append((status, time.monotonic() - t0, body))

    threads = [threading.Thread(target=call) for _ in range(8)]
    for t in threads:
        t.start()
        time.sleep(0.02)
    for t in threads:
        t.join(30)
    statuses = sorted(a[0] for a in answers)
    assert set(statuses) <= {200, 503}, answers
    assert statuses.count(200) >= 1 and statuses.count(503) >= 5, statuses
    for status, took, body in answers:
        if status == 503:
            assert took < 1.0, "a 503 took %.2f s (the handler sleeps 1.5 s)" % took
            error_json(body)
    assert srv.healthy()


def test_a_model_that_cannot_load_exits_1_with_the_traceback(servers):
    t0 = time.monotonic()
    srv = servers("broken", {"SAGEMAKER_MODEL_SERVER_WORKERS": 1}, setup_code("broken"), expect_start=False)
    try:
        rc = srv.proc.wait(30)
    except subprocess.TimeoutExpired:
        raise AssertionError("kiln-model-server still runs 30 s after model_fn raised; log:\n%s" % srv.log_tail())
    took = time.monotonic() - t0
    log = srv.log_tail(200)
    assert rc == 1, (rc, log)
    assert "kiln-test: the weights in" in log and "Traceback" in log, log
    assert took < 20, "exited %.1f s after start" % took


def test_sigterm_finishes_the_request_in_flight(servers, tmp_path):
    srv = servers("sigterm", {"SAGEMAKER_MODEL_SERVER_WORKERS": 1}, setup_code("handlers"))
    mark = str(tmp_path / "busy.pid")
    result = {}

    def slow():
        result["answer"] = srv.invoke({"op": "sleep", "seconds": 1.0, "mark": mark}, timeout=30)

    t = threading.Thread(target=slow)
    t.start()
    deadline = time.monotonic() + 10
    while not os.path.exists(mark) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert os.path.exists(mark), "the sleeping handler never started"
    srv.proc.send_signal(signal.SIGTERM)
    t.join(30)
    status, _, body = result["answer"]
    assert status == 200 and json.loads(body)["slept"] == 1.0, (status, body[:300])
    rc = srv.proc.wait(30)
    assert rc == 0, (rc, srv.log_tail())
    assert python_workers(srv) == [] and not os.path.exists("/proc/%s" % open(mark).read()), \
        "the worker outlived the server"


def test_default_invocations_accept(servers):
    srv = servers("accept", {"KILN_MODEL_SERVER_FRAMEWORK": "pytorch", "SAGEMAKER_MODEL_SERVER_WORKERS": 1,
                             "SAGEMAKER_DEFAULT_INVOCATIONS_ACCEPT": "text/csv"}, setup_torch)
    for accept in (None, "*/*"):
        status, headers, body = srv.invoke(INPUT, accept=accept)
        assert status == 200, (accept, status, body[:300])
        assert headers["content-type"].startswith("text/csv"), (accept, headers)
        rows = [[float(v) for v in line.split(",")] for line in body.decode().strip().splitlines()]
        assert_close(rows, expected_output(INPUT))
    status, headers, body = srv.invoke(INPUT, accept="application/json")
    assert status == 200 and headers["content-type"].startswith("application/json"), (status, headers)


def test_submit_directory_tarball_transform_fn_and_custom_attributes(servers, tmp_path):
    """SAGEMAKER_SUBMIT_DIRECTORY naming a sourcedir.tar.gz (staged by `prepare`) with
    SAGEMAKER_PROGRAM; transform_fn with a context; custom attributes both ways."""
    import tarfile
    tarball = str(tmp_path / "sourcedir.tar.gz")
    with tarfile.open(tarball, "w:gz") as tf:
        for name in ("my_handler.py", "helper_module.py"):
            tf.add(os.path.join(FIXTURES, "transform", name), arcname=name)
    srv = servers("submit", {"SAGEMAKER_MODEL_SERVER_WORKERS": 1, "SAGEMAKER_SUBMIT_DIRECTORY": tarball,
                             "SAGEMAKER_PROGRAM": "my_handler.py"},
                  lambda base: os.makedirs(os.path.join(base, "model")))
    status, headers, body = srv.request(
        "POST", "/invocations", body=b'{"a": 1}',
        headers={"Content-Type": "application/json", "Accept": "application/json",
                 "X-Amzn-SageMaker-Custom-Attributes": "trace=abc,k=v"})
    assert status == 200, (status, body[:500])
    answer = json.loads(body)
    assert answer == {"model": "transform-model", "type": "str", "body": '{"a": 1}',
                      "content_type": "application/json", "accept": "application/json",
                      "attrs": "trace=abc,k=v"}, answer
    assert headers.get("x-amzn-sagemaker-custom-attributes") == "seen=trace=abc,k=v", headers
    status, _, body = srv.invoke(b"\x00\xff", content_type="application/octet-stream", accept="application/json")
    assert status == 200, (status, body[:500])
    answer = json.loads(body)
    assert (answer["type"], answer["body"]) == ("bytes", "00ff"), answer


# ---------------------------------------------------------------------------------------------
# Dynamic batching


def test_dynamic_batching_answers_each_request(servers):
    srv = servers("batching", {"SAGEMAKER_MODEL_SERVER_WORKERS": 1, "SAGEMAKER_TS_BATCH_SIZE": 8,
                               "SAGEMAKER_TS_MAX_BATCH_DELAY": 50}, setup_code("batching"))
    answers = {}

    def call(i):
        answers[i] = srv.invoke({"x": i}, timeout=30)

    threads = [threading.Thread(target=call, args=(i,)) for i in range(24)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    sizes = []
    for i in range(24):
        status, _, body = answers[i]
        assert status == 200, (i, status, body[:300])
        [[x, n]] = json.loads(body)
        assert x == float(i), (i, body)  # each request got its own row back
        assert 1 <= n <= 8, (i, n)
        sizes.append(int(n))
    assert max(sizes) > 1, "no batch had more than one request: %s" % sizes
    print("batch sizes seen: %s" % sorted(sizes))


# ---------------------------------------------------------------------------------------------
# Multi-model mode


def setup_models(names):
    def setup(base):
        for name in names:
            model = os.path.join(base, "models", name, "model")
            os.makedirs(os.path.join(model, "code"))
            with open(os.path.join(FIXTURES, "multi", "inference.py"), "rb") as f:
                data = f.read()
            with open(os.path.join(model, "code", "inference.py"), "wb") as f:
                f.write(data)
            with open(os.path.join(model, "name.txt"), "w") as f:
                f.write(name)
    return setup


def load_model(srv, name):
    url = os.path.join(srv.base_dir, "models", name, "model")
    return srv.request("POST", "/models", body=json.dumps({"model_name": name, "url": url}),
                       headers={"Content-Type": "application/json"}, timeout=60)


def test_multi_model_load_list_invoke_unload(servers):
    srv = servers("multi", {"SAGEMAKER_MULTI_MODEL": "true"}, setup_models(["alpha", "beta", "gamma"]))
    assert srv.request("GET", "/ping")[0] == 200  # multi-model: healthy once the server runs
    for name in ("alpha", "beta"):
        status, _, body = load_model(srv, name)
        assert status == 200, (name, status, body[:500])
    status, _, body = load_model(srv, "alpha")
    assert status == 409, (status, body[:500])

    # List, one per page.
    seen, token, pages = [], None, 0
    while True:
        path = "/models?limit=1" + ("&next_page_token=%s" % token if token else "")
        status, _, body = srv.request("GET", path)
        assert status == 200, (path, status, body)
        page = json.loads(body)
        assert len(page["models"]) <= 1, page
        seen += page["models"]
        pages += 1
        token = page.get("nextPageToken")
        if not token:
            break
        assert pages < 5, page
    assert sorted(m["modelName"] for m in seen) == ["alpha", "beta"], seen
    assert pages == 2, pages
    status, _, body = srv.request("GET", "/models")
    assert sorted(m["modelName"] for m in json.loads(body)["models"]) == ["alpha", "beta"]

    status, _, body = srv.request("GET", "/models/alpha")
    assert status == 200, (status, body)
    doc = json.loads(body)
    doc = doc[0] if isinstance(doc, list) else doc
    assert doc["modelName"] == "alpha"
    assert doc["modelUrl"] == os.path.join(srv.base_dir, "models", "alpha", "model")

    for name in ("alpha", "beta"):
        status, _, body = srv.invoke({"q": name}, path="/models/%s/invoke" % name)
        assert status == 200, (name, status, body[:500])
        answer = json.loads(body)
        assert answer["model"] == name and answer["input"] == {"q": name}, answer
    # Each model has its own workers.
    pids = {json.loads(srv.invoke({}, path="/models/%s/invoke" % n)[2])["pid"] for n in ("alpha", "beta")}
    assert len(pids) == 2, pids

    # Unknown and unloaded models: 404.
    assert srv.request("GET", "/models/gamma")[0] == 404
    assert srv.invoke({}, path="/models/gamma/invoke")[0] == 404
    assert srv.request("DELETE", "/models/gamma")[0] == 404
    status, _, body = srv.request("DELETE", "/models/beta", timeout=60)
    assert status == 200, (status, body)
    assert srv.request("GET", "/models/beta")[0] == 404
    assert srv.invoke({}, path="/models/beta/invoke")[0] == 404
    status, _, body = srv.request("GET", "/models")
    assert [m["modelName"] for m in json.loads(body)["models"]] == ["alpha"]
    # Reload after unload works, and the other model kept serving throughout.
    assert load_model(srv, "beta")[0] == 200
    assert srv.invoke({}, path="/models/alpha/invoke")[0] == 200
    assert srv.healthy()


def test_multi_model_load_without_memory_is_507(servers):
    srv = servers("multi507", {"SAGEMAKER_MULTI_MODEL": "true", "KILN_MODEL_SERVER_MEMORY_LIMIT_MB": 1},
                  setup_models(["one", "two"]))
    answers = [load_model(srv, name) for name in ("one", "two")]
    # 90 % of 1 MiB cannot hold a Python worker: the second load (the first too, if the server
    # measures the model it is loading) answers 507 with a message.
    status, _, body = answers[-1]
    assert status == 507, answers
    assert error_json(body)["message"], body
    assert answers[0][0] in (200, 507), answers
    assert srv.healthy()
    status, _, body = srv.request("GET", "/models")
    loaded = [m["modelName"] for m in json.loads(body)["models"]]
    assert "two" not in loaded, loaded


def test_single_model_mode_has_no_models_api(handlers):
    assert handlers.request("GET", "/models")[0] == 404


# ---------------------------------------------------------------------------------------------
# TorchScript backend


def test_torchscript_backend_matches_the_python_path(servers, defaults):
    import numpy as np
    srv = servers("torchscript", {"KILN_MODEL_SERVER_BACKEND": "torchscript",
                                  "KILN_MODEL_SERVER_FRAMEWORK": "pytorch"},
                  setup_torch, expect_start=False)
    if not srv.alive():
        log = srv.log_tail(30)
        if "built without libtorch" in log:
            pytest.skip("kiln-model-server was built without libtorch (its startup error: %s)"
                        % log.strip().splitlines()[-1])
        raise AssertionError("kiln-model-server with KILN_MODEL_SERVER_BACKEND=torchscript exited %s; log:\n%s"
                             % (srv.proc.returncode, log))
    assert python_workers(srv) == [], "the TorchScript backend must not start Python workers"
    rows = INPUT + [[float(i), -float(i) / 3, 0.5] for i in range(5)]
    status, _, body = srv.invoke(rows, accept="application/json")
    assert status == 200, (status, body[:500])
    native = json.loads(body)
    status, _, body = defaults.invoke(rows, accept="application/json")
    assert status == 200, (status, body[:500])
    assert_close(native, json.loads(body))
    buf = io.BytesIO()
    np.save(buf, np.array(rows, dtype=np.float32))
    answers = []
    for srv_ in (srv, defaults):
        status, _, body = srv_.invoke(buf.getvalue(), content_type="application/x-npy", accept="application/x-npy")
        assert status == 200, (status, body[:500])
        answers.append(np.load(io.BytesIO(body), allow_pickle=False))
    np.testing.assert_allclose(answers[0], answers[1], rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(answers[0], expected_output(rows), rtol=1e-6, atol=1e-6)
    status, _, body = srv.invoke(b'{"broken', content_type="application/json")
    assert 400 <= status < 500, (status, body[:300])
    assert srv.healthy()


# ---------------------------------------------------------------------------------------------
# Soak: 32 keep-alive clients for 60 s


SOAK_SECONDS = 60
SOAK_CLIENTS = 32


def test_32_clients_for_60_seconds(defaults):
    body = json.dumps(INPUT)
    expected = expected_output(INPUT).tolist()
    status, _, reference = defaults.invoke(body, accept="application/json")
    assert status == 200, (status, reference[:300])
    stop = threading.Event()
    counts = [0] * SOAK_CLIENTS
    errors = []

    def client(i):
        conn = None
        while not stop.is_set():
            try:
                if conn is None:
                    conn = http.client.HTTPConnection("127.0.0.1", defaults.port, timeout=30)
                conn.request("POST", "/invocations", body=body,
                             headers={"Content-Type": "application/json", "Accept": "application/json"})
                r = conn.getresponse()
                data = r.read()
                if r.status != 200:
                    errors.append((i, r.status, data[:200]))
                elif data != reference and not is_close(json.loads(data), expected):
                    errors.append((i, "wrong answer", data[:200]))
                else:
                    counts[i] += 1
                if r.getheader("Connection", "").lower() == "close":
                    conn.close()
                    conn = None
            except Exception as e:  # noqa: BLE001 (every failure is reported)
                errors.append((i, repr(e)))
                if conn is not None:
                    conn.close()
                conn = None
            if len(errors) > 50:
                return
        if conn is not None:
            conn.close()

    threads = [threading.Thread(target=client, args=(i,), daemon=True) for i in range(SOAK_CLIENTS)]
    t0 = time.monotonic()
    for t in threads:
        t.start()
    samples = []
    while time.monotonic() - t0 < SOAK_SECONDS:
        time.sleep(2)
        samples.append((time.monotonic() - t0, defaults.tree_rss(), rss_of(defaults.proc.pid)))
        if len(errors) > 50:
            break
    stop.set()
    for t in threads:
        t.join(35)
    elapsed = time.monotonic() - t0
    total = sum(counts)
    print("soak: %d clients, %.0f s, %d requests, %.0f req/s; RSS MiB (server+workers/server) over time: %s" % (
        SOAK_CLIENTS, elapsed, total, total / elapsed,
        " ".join("%.1f/%.1f@%.0fs" % (rss / 2**20, own / 2**20, t) for t, rss, own in samples)))
    assert not errors, "%d errors, first: %s" % (len(errors), errors[:5])
    assert all(c > 0 for c in counts), counts  # every client was served
    # Memory stays bounded: after a 10 s warm-up, the last sample is within 20 % (+32 MiB) of the
    # first, for the server with its workers and for the front end alone (a leak of 1 KB per request
    # would add ~250 MB over the run).
    warm = [(rss, own) for t, rss, own in samples if t >= 10]
    assert len(warm) >= 5, samples
    (first_all, first_own), (last_all, last_own) = warm[0], warm[-1]
    assert last_all <= first_all * 1.2 + 32 * 2**20, \
        "RSS of server + workers grew from %.0f MiB (10 s) to %.0f MiB (end)" % (first_all / 2**20, last_all / 2**20)
    assert last_own <= first_own * 1.2 + 16 * 2**20, \
        "RSS of the front end grew from %.0f MiB (10 s) to %.0f MiB (end)" % (first_own / 2**20, last_own / 2**20)
    assert defaults.healthy()
    assert len(python_workers(defaults)) == 2
