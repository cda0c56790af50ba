"""Self-test of endpoints/serve_app.py, the serving program the endpoint tests run as a `local:`
image: started here as a plain subprocess (no Kiln), so a broken test program is caught before it
makes an endpoint test fail for the wrong reason."""

import http.client
import json
import os
import signal
import socket
import subprocess
import time

import pytest

APP = os.path.join(os.path.dirname(os.path.abspath(__file__)), "endpoints", "serve_app.py")


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_app(tmp_path, env_extra=None, version="v7"):
    model = tmp_path / "model"
    model.mkdir(exist_ok=True)
    if version is not None:
        (model / "version.txt").write_text(version + "\n")
    port = free_port()
    env = dict(os.environ, SAGEMAKER_BIND_TO_PORT=str(port), SERVE_APP_MODEL_DIR=str(model))
    env.pop("HOSTNAME", None)
    env.update(env_extra or {})
    log_path = tmp_path / ("app-%d.log" % port)
    with open(log_path, "wb") as log:
        proc = subprocess.Popen([APP, "serve"], env=env, stdout=log, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 10
    while "serve_app ready on port %d" % port not in log_path.read_text():
        assert proc.poll() is None and time.monotonic() < deadline, log_path.read_text()
        time.sleep(0.02)
    return proc, port, model


@pytest.fixture
def app(tmp_path):
    proc, port, model = start_app(tmp_path, {"VARIANT_TAG": "blue"})
    yield proc, port, model
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=10) == 0


def request(conn, method, path, body=None, headers=None):
    conn.request(method, path, body=body, headers=headers or {})
    resp = conn.getresponse()
    return resp.status, dict((k.lower(), v) for k, v in resp.getheaders()), resp.read()


def test_ping_and_default_invocation_keepalive(app):
    proc, port, model = app
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    status, headers, body = request(conn, "GET", "/ping")
    assert (status, body, headers["content-length"]) == (200, b"", "0")
    sock = conn.sock
    status, headers, body = request(conn, "POST", "/invocations", b"hello", {
        "Content-Type": "text/csv", "X-Amzn-SageMaker-Custom-Attributes": "a=1"})
    assert conn.sock is sock  # the same keep-alive connection
    assert status == 200 and headers["content-type"] == "application/json"
    assert headers["x-amzn-sagemaker-custom-attributes"] == "a=1"
    doc = json.loads(body)
    assert doc["version"] == "v7" and doc["variant_env"] == "blue"
    assert doc["pid"] == proc.pid and doc["instance"] == socket.gethostname()
    assert len(doc["boot_id"]) == 32
    assert doc["echo_len"] == 5 and doc["headers"]["content-type"] == "text/csv"


def test_commands(app):
    proc, port, model = app
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    status, headers, body = request(conn, "POST", "/invocations", json.dumps({"status": 503, "message": "boom"}))
    assert (status, body, headers["content-type"]) == (503, b"boom", "text/plain")
    status, headers, body = request(conn, "POST", "/invocations", json.dumps({"size": 100000}))
    assert status == 200 and body == b"x" * 100000
    t0 = time.monotonic()
    status, _, body = request(conn, "POST", "/invocations", json.dumps({"sleep": 0.5}))
    assert status == 200 and time.monotonic() - t0 >= 0.5
    status, headers, body = request(conn, "POST", "/invocations", json.dumps({"stream": 3, "interval": 0}))
    assert status == 200 and headers["transfer-encoding"] == "chunked"
    assert body == b"chunk 0\nchunk 1\nchunk 2\n"
    # Chunked request bodies are read too.
    conn.putrequest("POST", "/invocations")
    conn.putheader("Transfer-Encoding", "chunked")
    conn.endheaders()
    conn.send(b"3\r\nabc\r\n2\r\nde\r\n0\r\n\r\n")
    resp = conn.getresponse()
    assert json.loads(resp.read())["echo_len"] == 5

    # Ping failure by command, by file.
    request(conn, "POST", "/invocations", json.dumps({"ping": "fail"}))
    assert request(conn, "GET", "/ping")[0] == 500
    request(conn, "POST", "/invocations", json.dumps({"ping": "ok"}))
    assert request(conn, "GET", "/ping")[0] == 200
    (model / "ping-fail").write_text("")
    assert request(conn, "GET", "/ping")[0] == 500
    (model / "ping-fail").unlink()
    assert request(conn, "GET", "/ping")[0] == 200


def raw_post(port, body):
    s = socket.create_connection(("127.0.0.1", port), timeout=5)
    s.sendall(b"POST /invocations HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body))
    return s


def test_reset_garbage_hang(app):
    proc, port, model = app
    s = raw_post(port, b'{"reset": true}')
    with pytest.raises(ConnectionResetError):
        while s.recv(4096):
            pass
    s.close()
    s = raw_post(port, b'{"garbage": true}')
    data = b""
    while True:
        chunk = s.recv(4096)
        if not chunk:
            break
        data += chunk
    assert data == b"NOT HTTP\r\n\r\n"
    s.close()
    s = raw_post(port, b'{"hang": true}')
    s.settimeout(1)
    with pytest.raises(socket.timeout):
        s.recv(1)
    s.close()
    # Still serving others.
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
    assert request(conn, "GET", "/ping")[0] == 200


def test_exit_after_answer(app):
    proc, port, model = app
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
    status, _, body = request(conn, "POST", "/invocations", json.dumps({"exit": 3}))
    assert status == 200 and json.loads(body)["pid"] == proc.pid
    assert proc.wait(timeout=5) == 3


def test_ping_fail_env_startup_delay_no_version(tmp_path):
    t0 = time.monotonic()
    proc, port, _ = start_app(tmp_path, {"PING_FAIL": "1", "STARTUP_DELAY_SECONDS": "0.5"}, version=None)
    try:
        assert time.monotonic() - t0 >= 0.5
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
        assert request(conn, "GET", "/ping")[0] == 500
        doc = json.loads(request(conn, "POST", "/invocations", b"not json")[2])
        assert doc["version"] == "none" and doc["variant_env"] is None and doc["echo_len"] == 8
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=10) == 0
