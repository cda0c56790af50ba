"""Requests stuck on a dead instance (issue 9, finding 4): once the endpoint controller declares an
instance failed (it stopped answering /ping, or its process is gone), the invocations already sent
to it are answered at once — ModelError 424 saying what happened — instead of after the 60 s
invocation timeout. A normal drain (DeleteEndpoint) still lets requests in flight finish.

The invocation timeout stays at AWS's 60 s here so that a cut request is told apart from a timed
out one; the health watch runs every 0.3 s so that a failure is declared within a few seconds.
"""

import os
import re
import signal
import threading
import time
from datetime import datetime, timezone

import pytest
from botocore.exceptions import ClientError

import endpoint_helpers as eh
from training_helpers import sm  # noqa: F401 (module-scoped fixture)

KILN_CONFIG = {
    "scheduler": {"policy": "shrink", "allow_cpu_fallback": True},
    "endpoints": {"invocation_timeout_seconds": 60, "stop_grace_seconds": 2, "health_interval_seconds": 0.3},
}

# How long after the controller declares the instance failed the stuck request may still take.
CUT_WITHIN_SECONDS = 1.0

FAILED_LINE = re.compile(r'^ts=(\S+) level=\S+ msg="endpoint instance failed" endpoint=(\S+) instance=(\S+)')


@pytest.fixture(scope="module", autouse=True)
def _no_endpoint_left_behind(sm):  # noqa: F811
    yield
    eh.delete_all_endpoints(sm)


@pytest.fixture(scope="module")
def rt(module_kiln):
    return module_kiln.client("sagemaker-runtime")


def deploy_one(sm, server, prefix):  # noqa: F811
    name = eh.unique_name(prefix)
    eh.create_model(sm, name + "-m")
    eh.deploy(sm, name, [("AllTraffic", name + "-m", 1, 1.0)], server=server)
    return name


class InFlight:
    """One InvokeEndpoint on its own thread; records when and how it ended (wall clock, to compare
    with the server log's timestamps)."""

    def __init__(self, rt, name, body):
        self.error = None
        self.body = None
        self.ended_at = None
        self.started_at = time.time()
        self._thread = threading.Thread(target=self._run, args=(rt, name, body), daemon=True)
        self._thread.start()

    def _run(self, rt, name, body):
        try:
            self.body, _ = eh.invoke(rt, name, body=body)
        except ClientError as e:
            self.error = e.response
        finally:
            self.ended_at = time.time()

    def join(self, timeout):
        self._thread.join(timeout)
        assert not self._thread.is_alive(), "the request is still stuck after %s s" % timeout


def failure_declared(server, endpoint):
    """(wall-clock time, instance id) of the controller's 'endpoint instance failed' line, or None."""
    for line in server.log_text().splitlines():
        m = FAILED_LINE.match(line)
        if m and m.group(2) == endpoint:
            when = datetime.strptime(m.group(1), "%Y-%m-%dT%H:%M:%S.%fZ").replace(tzinfo=timezone.utc)
            return when.timestamp(), m.group(3), line
    return None


def instance_pid(endpoint):
    """Host pid of the serve_app process of `endpoint`'s instance: its /opt/ml is bound from the
    endpoint's instance directory (<data>/endpoints/<endpoint>/<instance>/opt_ml)."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open("/proc/%s/cmdline" % entry, "rb") as f:
                if b"serve_app.py" not in f.read():
                    continue
            with open("/proc/%s/mountinfo" % entry) as f:
                mounts = f.read()
        except OSError:
            continue
        if "/endpoints/%s/" % endpoint in mounts:
            found.append(int(entry))
    assert len(found) == 1, "expected one serve_app process for %s, found %s" % (endpoint, found)
    return found[0]


def assert_cut(request, server, endpoint, cause):
    declared = eh.wait_until(lambda: failure_declared(server, endpoint), timeout=45,
                             what="the instance of %s declared failed" % endpoint)
    declared_at, instance, line = declared
    assert cause in line, line
    request.join(timeout=10)
    print("%s: request ended %.3f s after the instance was declared failed (%.1f s after it was sent)" % (
        endpoint, request.ended_at - declared_at, request.ended_at - request.started_at))
    # Within a second of the declaration, and not before it (log timestamps have ms precision).
    assert request.ended_at - declared_at < CUT_WITHIN_SECONDS, (request.ended_at - declared_at, line)
    assert request.ended_at >= declared_at - 0.01, (request.ended_at - declared_at, line)
    assert request.ended_at - request.started_at < 40, "waited for the invocation timeout"
    error = request.error
    assert error is not None, request.body
    assert error["ResponseMetadata"]["HTTPStatusCode"] == 424, error
    assert error["Error"]["Code"] == "ModelError", error
    assert error["OriginalStatusCode"] == 0, error
    prefix = "The instance %s serving variant AllTraffic failed while the request was in flight: " % instance
    assert error["OriginalMessage"].startswith(prefix), error
    assert cause in error["OriginalMessage"], error
    assert error["Error"]["Message"].startswith('Received server error (0) from primary with message "' + prefix)
    return instance


def test_a_request_is_cut_when_its_instance_stops_answering_ping(sm, rt, module_kiln):  # noqa: F811
    name = deploy_one(sm, module_kiln, "ep-cut-ping")
    # The request makes later pings fail and then never answers.
    request = InFlight(rt, name, b'{"ping": "fail", "hang": true}')
    failed = assert_cut(request, module_kiln, name, "health checks in a row")
    # The endpoint gets a replacement and serves again (503 until it is routable).
    def replacement_answers():
        try:
            return eh.invoke(rt, name)[0]["instance"] != failed
        except ClientError as e:
            assert e.response["Error"]["Code"] == "ServiceUnavailable", e.response
            return False
    eh.wait_until(replacement_answers, timeout=60, what="a replacement instance answering")


def test_a_request_is_cut_when_its_instance_process_is_stopped(sm, rt, module_kiln):  # noqa: F811
    name = deploy_one(sm, module_kiln, "ep-cut-stop")
    pid = instance_pid(name)
    request = InFlight(rt, name, b'{"hang": true}')
    time.sleep(0.5)  # the request is in the container's hands
    os.kill(pid, signal.SIGSTOP)  # the instance stops answering anything (pings time out after 2 s)
    try:
        assert_cut(request, module_kiln, name, "health checks in a row")
    finally:
        try:
            os.kill(pid, signal.SIGCONT)
        except ProcessLookupError:
            pass


def test_a_request_ends_when_its_instance_process_dies(sm, rt, module_kiln):  # noqa: F811
    # The kernel closes the instance's sockets with it: the request ends at once with a ModelError
    # (before the health watch even notices), and the watch then declares the instance failed.
    name = deploy_one(sm, module_kiln, "ep-cut-kill")
    pid = instance_pid(name)
    request = InFlight(rt, name, b'{"hang": true}')
    time.sleep(0.5)
    killed_at = time.time()
    os.kill(pid, signal.SIGKILL)
    request.join(timeout=10)
    assert request.ended_at - killed_at < CUT_WITHIN_SECONDS, request.ended_at - killed_at
    assert request.error is not None, request.body
    assert request.error["Error"]["Code"] == "ModelError", request.error
    assert request.error["OriginalStatusCode"] == 0, request.error
    declared = eh.wait_until(lambda: failure_declared(module_kiln, name), timeout=30,
                             what="the killed instance declared failed")
    assert "killed by signal" in declared[2] or "exited" in declared[2], declared[2]


def test_a_normal_drain_lets_the_request_finish(sm, rt, module_kiln):  # noqa: F811
    name = deploy_one(sm, module_kiln, "ep-drain")
    request = InFlight(rt, name, b'{"sleep": 2}')
    time.sleep(0.5)
    sm.delete_endpoint(EndpointName=name)
    request.join(timeout=30)
    assert request.error is None, request.error
    assert request.body["echo_len"] == len(b'{"sleep": 2}'), request.body
    eh.wait_until(lambda: eh.endpoint_gone(sm, name), timeout=30, what="the endpoint deleted")


def idle_pooled_connections(server):
    import urllib.request
    with urllib.request.urlopen(server.endpoint + "/metrics", timeout=10) as r:
        text = r.read().decode()
    m = re.search(r"^kiln_http_client_idle_connections (\d+)$", text, re.M)
    assert m, text[:500]
    return int(m.group(1))


def test_a_deleted_endpoints_pooled_connections_are_closed(kiln_factory):
    """The router's keep-alive pool holds sockets only to live instances: deleting an endpoint
    closes the idle connections to its instances (they used to stay until the port was reused)."""
    srv = kiln_factory("pool", config=KILN_CONFIG)
    sm, rt = srv.client("sagemaker"), srv.client("sagemaker-runtime")
    name = deploy_one(sm, srv, "ep-pool")
    for _ in range(5):
        eh.invoke(rt, name, body=b"{}")
    assert idle_pooled_connections(srv) >= 1
    sm.delete_endpoint(EndpointName=name)
    eh.wait_until(lambda: eh.endpoint_gone(sm, name), timeout=30, what="the endpoint deleted")
    eh.wait_until(lambda: idle_pooled_connections(srv) == 0, timeout=10, what="no idle pooled connection left")
