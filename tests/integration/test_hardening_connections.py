"""Connection limits (issue: hardening): what an unauthenticated client can hold.

* 2,000 TCP connections that never send a byte do not lock out a new client: boto3 and a raw
  client are served within seconds (the server closes idle connections to make room, and at most
  `max_connections_per_address` of them stay open), and the server keeps serving;
* a silent connection is closed after `http.first_byte_timeout_seconds`, a used keep-alive one is
  not;
* `http.max_connections_per_address` refuses a busy address's extra connection with 503 +
  Connection: close, while another loopback address is served;
* accept() failing with EMFILE (the server's descriptor limit lowered under load) neither kills the
  server nor makes it spin, and it serves again once descriptors are back.
"""

import os
import resource
import socket
import time

import pytest

import kiln_harness as kh

IDLE_CONNECTIONS = 2000


def raise_fd_limit(need):
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < need:
        if hard != resource.RLIM_INFINITY and hard < need:
            pytest.skip("RLIMIT_NOFILE hard limit %d < %d" % (hard, need))
        resource.setrlimit(resource.RLIMIT_NOFILE, (need, hard))


def connect(port, source=None, timeout=10):
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.settimeout(timeout)
    if source:
        s.bind((source, 0))
    s.connect(("127.0.0.1", port))
    return s


def closed_by_server(s):
    """True when the server closed `s` (EOF or reset waiting); False when a read would block."""
    timeout = s.gettimeout()
    s.settimeout(0)  # with a timeout set, Python would wait for readability first
    try:
        return s.recv(1, socket.MSG_PEEK) == b""
    except BlockingIOError:
        return False
    except OSError:
        return True
    finally:
        s.settimeout(timeout)


def read_response(s, timeout=10):
    s.settimeout(timeout)
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = s.recv(65536)
        if not chunk:
            break
        data += chunk
    return data


def process_cpu_seconds(pid):
    with open("/proc/%d/stat" % pid) as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def test_two_thousand_idle_connections_do_not_lock_out_a_new_client(kiln_factory):
    raise_fd_limit(IDLE_CONNECTIONS + 512)
    # Limits far below the defaults (16384 in all, 4096 per address), so that 2,000 silent
    # connections are over them and idle ones must be closed to make room.
    srv = kiln_factory(config={"http": {"max_connections": 512, "max_connections_per_address": 128}})
    idle = []
    try:
        for _ in range(IDLE_CONNECTIONS):
            idle.append(connect(srv.port))
        # A new boto3 client (one attempt, no retries) and a raw one are served promptly.
        start = time.monotonic()
        s3 = kh.make_client("s3", srv.endpoint, srv.access_key, srv.secret_key, retries=1,
                            connect_timeout=5, read_timeout=10)
        assert "Buckets" in s3.list_buckets()
        status, _, _ = kh.http_request("GET", srv.endpoint + "/_kiln/health", timeout=10)
        assert status == 200
        elapsed = time.monotonic() - start
        assert elapsed < 10, "a new client waited %.1f s behind %d idle connections" % (elapsed, IDLE_CONNECTIONS)
        # The server closed idle connections to make room instead of holding them all.
        time.sleep(0.5)
        still_open = sum(1 for s in idle if not closed_by_server(s))
        assert still_open <= 128, still_open
        # It keeps serving, the old idle connections notwithstanding.
        s3.create_bucket(Bucket="after-idle-flood")
        s3.put_object(Bucket="after-idle-flood", Key="k", Body=b"v")
        assert s3.get_object(Bucket="after-idle-flood", Key="k")["Body"].read() == b"v"
        assert srv.alive() and srv.healthy()
        assert "http connection limits reached" in srv.log_text()
    finally:
        for s in idle:
            s.close()


def test_silent_connection_closed_after_first_byte_timeout(kiln_factory):
    srv = kiln_factory(config={"http": {"first_byte_timeout_seconds": 1}})
    silent = connect(srv.port)
    used = connect(srv.port)
    try:
        used.sendall(b"GET /_kiln/health HTTP/1.1\r\nHost: x\r\n\r\n")
        assert kh.status_of(read_response(used)) == 200
        start = time.monotonic()
        silent.settimeout(10)
        assert silent.recv(1) == b""  # closed by the server, nothing sent
        assert time.monotonic() - start < 5
        # A keep-alive connection between requests has the (75 s) idle timeout instead.
        time.sleep(1.5)
        assert not closed_by_server(used)
        used.sendall(b"GET /_kiln/health HTTP/1.1\r\nHost: x\r\n\r\n")
        assert kh.status_of(read_response(used)) == 200
    finally:
        silent.close()
        used.close()


def test_per_address_limit_refuses_a_busy_address_only(kiln_factory):
    srv = kiln_factory(config={"http": {"max_connections_per_address": 4}})
    busy = []
    try:
        for _ in range(4):
            s = connect(srv.port, source="127.0.0.2")
            s.sendall(b"GET /_kiln/health HTTP/1.1\r\nHost: x\r\n")  # header not finished: busy
            busy.append(s)
        time.sleep(0.3)  # let the server read them (a waiting byte already keeps them from eviction)
        extra = connect(srv.port, source="127.0.0.2")
        answer = read_response(extra)
        assert kh.status_of(answer) == 503, answer
        assert b"Connection: close" in answer
        extra.close()
        other = connect(srv.port, source="127.0.0.3")
        other.sendall(b"GET /_kiln/health HTTP/1.1\r\nHost: x\r\n\r\n")
        assert kh.status_of(read_response(other)) == 200
        other.close()
        # Finishing the requests frees the address.
        for s in busy:
            s.sendall(b"\r\n")
            assert kh.status_of(read_response(s)) == 200
    finally:
        for s in busy:
            s.close()


def test_out_of_descriptors_neither_kills_nor_spins(kiln_factory):
    srv = kiln_factory(config={"http": {"max_connections_per_address": 512}})
    pid = srv.proc.pid
    in_use = len(os.listdir("/proc/%d/fd" % pid))
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.prlimit(pid, resource.RLIMIT_NOFILE, (in_use + 48, hard))
    busy = []
    try:
        # Connections with an unfinished header are busy (nothing idle to close for a descriptor),
        # so past ~48 of them accept() fails with EMFILE while more wait in the backlog.
        for _ in range(120):
            s = connect(srv.port)
            s.sendall(b"GET /_kiln/health HTTP/1.1\r\nHost: x\r\n")
            busy.append(s)
        deadline = time.monotonic() + 10
        while "http accept failed" not in srv.log_text() and time.monotonic() < deadline:
            time.sleep(0.1)
        assert "http accept failed" in srv.log_text()
        cpu_before = process_cpu_seconds(pid)
        time.sleep(2)
        cpu = process_cpu_seconds(pid) - cpu_before
        assert cpu < 0.5, "server used %.2f s of CPU in 2 s while out of descriptors (spinning?)" % cpu
        assert srv.alive()
    finally:
        for s in busy:
            s.close()
    # Descriptors are back: new clients are served.
    deadline = time.monotonic() + 10
    while not srv.healthy() and time.monotonic() < deadline:
        time.sleep(0.2)
    assert srv.healthy()
    s3 = kh.make_client("s3", srv.endpoint, srv.access_key, srv.secret_key)
    assert "Buckets" in s3.list_buckets()
    resource.prlimit(pid, resource.RLIMIT_NOFILE, (hard, hard))
