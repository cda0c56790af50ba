"""Real-time endpoints end to end (issue 4): deploy the bring-your-own `serve` program
(endpoints/serve_app.py, a `local:` image) with boto3 and the AWS CLI, invoke it through Kiln's
runtime API, and check routing, updates, replacement, errors and metrics against
spec/serving-contract.md and spec/runtime-api.md.
"""

import collections
import json
import os
import threading
import time
import urllib.request

import pytest

import endpoint_helpers as eh
from training_helpers import sm, s3, logs  # noqa: F401 (module-scoped fixtures)

KILN_CONFIG = eh.ENDPOINT_CONFIG


@pytest.fixture(scope="module", autouse=True)
def _no_endpoint_left_behind(sm):
    yield
    eh.delete_all_endpoints(sm)


@pytest.fixture(scope="module")
def rt(module_kiln):
    return module_kiln.client("sagemaker-runtime")


@pytest.fixture(scope="module")
def model_bucket(s3):
    name = "endpoint-models"
    s3.create_bucket(Bucket=name)
    return name


@pytest.fixture(scope="module")
def one_instance(sm, module_kiln):
    """One endpoint with one instance, shared by the tests that only invoke it."""
    name = eh.unique_name("ep-basic")
    eh.create_model(sm, name + "-m", env={"VARIANT_TAG": "basic"})
    eh.deploy(sm, name, [("AllTraffic", name + "-m", 1, 1.0)], server=module_kiln)
    return name


def test_invoke_passes_and_strips_headers(sm, rt, logs, one_instance):
    body, r = eh.invoke(rt, one_instance, body=b'{"x": 1}', Accept="application/json",
                        CustomAttributes="trace=abc")
    assert r["ResponseMetadata"]["HTTPStatusCode"] == 200
    assert r["InvokedProductionVariant"] == "AllTraffic"
    assert r["ContentType"] == "application/json"
    assert r["CustomAttributes"] == "trace=abc"
    assert r["ResponseMetadata"]["HTTPHeaders"].get("x-amzn-requestid")
    assert body["variant_env"] == "basic"
    assert body["echo_len"] == len(b'{"x": 1}')
    seen = body["headers"]
    assert seen["content-type"] == "application/json"
    assert seen["accept"] == "application/json"
    assert seen["x-amzn-sagemaker-custom-attributes"] == "trace=abc"
    for stripped in ("authorization", "x-amz-date", "x-amz-security-token", "user-agent"):
        assert stripped not in seen, seen
    # botocore's default content type when the caller gives none.
    r = rt.invoke_endpoint(EndpointName=one_instance, Body=b"raw bytes")
    assert json.loads(r["Body"].read())["headers"]["content-type"] == "application/octet-stream"

    d = sm.describe_endpoint(EndpointName=one_instance)
    assert d["EndpointStatus"] == "InService"
    [pv] = d["ProductionVariants"]
    assert pv["VariantName"] == "AllTraffic"
    assert pv["CurrentInstanceCount"] == pv["DesiredInstanceCount"] == 1
    assert pv["CurrentWeight"] == pv["DesiredWeight"] == 1.0
    assert pv["DeployedImages"][0]["SpecifiedImage"] == eh.SERVE_IMAGE

    # Container output lands in /aws/sagemaker/Endpoints/<name>, stream <variant>/<instance-id>.
    group = "/aws/sagemaker/Endpoints/" + one_instance

    def ready_line():
        try:
            streams = logs.describe_log_streams(logGroupName=group)["logStreams"]
        except Exception:  # noqa: BLE001 (the group appears with the first line)
            return None
        for s in streams:
            events = logs.get_log_events(logGroupName=group, logStreamName=s["logStreamName"],
                                         startFromHead=True)["events"]
            if any("serve_app ready" in e["message"] for e in events):
                return s["logStreamName"]
        return None
    stream = eh.wait_until(ready_line, timeout=20, what="the ready line in the endpoint log")
    variant, instance = stream.split("/")
    assert variant == "AllTraffic" and instance.startswith("i-") and len(instance) == 19
    assert instance == body["instance"]  # the container's hostname is its instance id


def test_aws_cli_invoke_endpoint(aws_cli_runner, one_instance, tmp_path):
    out = tmp_path / "out.json"
    result = aws_cli_runner("sagemaker-runtime", "invoke-endpoint", "--endpoint-name", one_instance,
                            "--content-type", "application/json", "--body", "e30=", str(out))
    meta = json.loads(result.stdout)
    assert meta["InvokedProductionVariant"] == "AllTraffic"
    assert json.loads(out.read_text())["echo_len"] == 2


@pytest.fixture(scope="module")
def aws_cli_runner(module_kiln, tmp_path_factory):
    import subprocess
    home = str(tmp_path_factory.mktemp("awshome"))
    env = module_kiln.aws_env(home)

    def run(*args, check=True, timeout=120):
        cmd = ["/usr/bin/aws", "--endpoint-url", module_kiln.endpoint, "--output", "json"] + list(args)
        p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)
        if check and p.returncode != 0:
            raise AssertionError("aws %s failed (%s): %s" % (" ".join(args), p.returncode, p.stderr))
        return p
    return run


def test_errors_map_to_the_runtime_api(rt, one_instance, module_kiln):
    # Container 500 → ModelError 424 with the original status and message.
    e = eh.invoke_error(rt, one_instance, body=json.dumps({"status": 500, "message": "boom"}).encode())
    assert e["ResponseMetadata"]["HTTPStatusCode"] == 424
    assert e["Error"]["Code"] == "ModelError"
    assert e["OriginalStatusCode"] == 500
    assert e["OriginalMessage"] == "boom"
    assert e["LogStreamArn"].endswith(":log-group:/aws/sagemaker/Endpoints/" + one_instance)
    assert 'Received server error (500) from primary with message "boom"' in e["Error"]["Message"]
    # Container 4xx → ModelError too, as a client error.
    e = eh.invoke_error(rt, one_instance, body=json.dumps({"status": 400, "message": "feature 3 missing"}).encode())
    assert e["Error"]["Code"] == "ModelError" and e["OriginalStatusCode"] == 400
    assert "Received client error (400)" in e["Error"]["Message"]
    # A hanging container → ModelError with OriginalStatusCode 0 after the (configured 3 s) budget.
    started = time.monotonic()
    e = eh.invoke_error(rt, one_instance, body=b'{"hang": true}')
    assert e["Error"]["Code"] == "ModelError" and e["OriginalStatusCode"] == 0
    assert "timed out" in e["Error"]["Message"]
    assert 2.5 < time.monotonic() - started < 15
    # Reset connections and garbage answers.
    for command in ({"reset": True}, {"garbage": True}):
        e = eh.invoke_error(rt, one_instance, body=json.dumps(command).encode())
        assert e["Error"]["Code"] == "ModelError", (command, e)
        assert e["OriginalStatusCode"] == 0
    # 7 MB body → 413 without an error type (AWS behaviour).
    e = eh.invoke_error(rt, one_instance, body=b"x" * (7 * 1024 * 1024), ContentType="application/octet-stream")
    assert e["ResponseMetadata"]["HTTPStatusCode"] == 413
    assert "6291456" in json.dumps(e["Error"]) or "6291456" in str(e)
    # Unknown endpoint.
    e = eh.invoke_error(rt, "no-such-endpoint")
    assert e["ResponseMetadata"]["HTTPStatusCode"] == 400
    assert e["Error"]["Code"] == "ValidationError"
    assert e["Error"]["Message"] == "Endpoint no-such-endpoint of account %s not found." % module_kiln.account_id
    # Unknown target variant.
    e = eh.invoke_error(rt, one_instance, TargetVariant="Nope")
    assert e["Error"]["Code"] == "ValidationError" and "Nope" in e["Error"]["Message"]
    # After all that the endpoint still serves.
    body, _ = eh.invoke(rt, one_instance)
    assert body["variant_env"] == "basic"


def test_weighted_split_target_variant_and_live_weights(sm, rt, module_kiln):
    name = eh.unique_name("ep-split")
    eh.create_model(sm, name + "-a", env={"VARIANT_TAG": "a"})
    eh.create_model(sm, name + "-b", env={"VARIANT_TAG": "b"})
    eh.deploy(sm, name, [("A", name + "-a", 1, 0.7), ("B", name + "-b", 1, 0.3)], server=module_kiln)

    def split(n):
        counts = collections.Counter()
        for _ in range(n):
            body, r = eh.invoke(rt, name)
            assert body["variant_env"] == r["InvokedProductionVariant"].lower()
            counts[r["InvokedProductionVariant"]] += 1
        return counts

    counts = split(2000)
    # Binomial(2000, 0.7): sd ≈ 20.5; 5 sd either side.
    assert abs(counts["A"] - 1400) < 103, counts
    for _ in range(50):
        _, r = eh.invoke(rt, name, TargetVariant="B")
        assert r["InvokedProductionVariant"] == "B"

    sm.update_endpoint_weights_and_capacities(
        EndpointName=name, DesiredWeightsAndCapacities=[{"VariantName": "A", "DesiredWeight": 0.2},
                                                        {"VariantName": "B", "DesiredWeight": 0.8}])
    d = eh.wait_endpoint(sm, name, server=module_kiln)
    weights = {pv["VariantName"]: (pv["CurrentWeight"], pv["DesiredWeight"]) for pv in d["ProductionVariants"]}
    assert weights == {"A": (0.2, 0.2), "B": (0.8, 0.8)}
    counts = split(1000)
    # Binomial(1000, 0.2): sd ≈ 12.6.
    assert abs(counts["A"] - 200) < 64, counts

    # Capacity too: B goes to 2 instances, both serve.
    sm.update_endpoint_weights_and_capacities(
        EndpointName=name, DesiredWeightsAndCapacities=[{"VariantName": "B", "DesiredInstanceCount": 2}])
    d = eh.wait_endpoint(sm, name, server=module_kiln)
    b = [pv for pv in d["ProductionVariants"] if pv["VariantName"] == "B"][0]
    assert b["CurrentInstanceCount"] == b["DesiredInstanceCount"] == 2
    instances = set()
    for _ in range(40):
        body, _ = eh.invoke(rt, name, TargetVariant="B")
        instances.add(body["instance"])
    assert len(instances) == 2
    sm.delete_endpoint(EndpointName=name)
    eh.wait_until(lambda: eh.endpoint_gone(sm, name), timeout=60, what="endpoint deletion")
    e = eh.invoke_error(rt, name)
    assert e["Error"]["Code"] == "ValidationError"


def test_update_endpoint_under_load_drops_nothing(sm, s3, rt, model_bucket, module_kiln):
    name = eh.unique_name("ep-update")
    v1 = eh.put_model(s3, model_bucket, name + "/v1/model.tar.gz", {"version.txt": b"v1"})
    v2 = eh.put_model(s3, model_bucket, name + "/v2/model.tar.gz", {"version.txt": b"v2"})
    eh.create_model(sm, name + "-v1", model_data_url=v1)
    eh.create_model(sm, name + "-v2", model_data_url=v2)
    eh.deploy(sm, name, [("AllTraffic", name + "-v1", 1, 1.0)], server=module_kiln)
    eh.create_config(sm, name + "-cfg2", [("AllTraffic", name + "-v2", 1, 1.0)])

    stop = threading.Event()
    seen = collections.Counter()
    failures = []
    rt_loop = module_kiln.client("sagemaker-runtime")

    def loop():
        while not stop.is_set():
            try:
                body, _ = eh.invoke(rt_loop, name)
                seen[body["version"]] += 1
            except Exception as e:  # noqa: BLE001 (every failure counts)
                failures.append(repr(e))

    worker = threading.Thread(target=loop)
    worker.start()
    try:
        time.sleep(0.5)
        sm.update_endpoint(EndpointName=name, EndpointConfigName=name + "-cfg2")
        d = sm.describe_endpoint(EndpointName=name)
        assert d["EndpointStatus"] == "Updating"
        assert d["PendingDeploymentSummary"]["EndpointConfigName"] == name + "-cfg2"
        d = eh.wait_endpoint(sm, name, server=module_kiln)
        assert d["EndpointConfigName"] == name + "-cfg2"
        eh.wait_until(lambda: seen["v2"] > 50, timeout=30, what="traffic on v2")
        time.sleep(1.0)  # the old instance drains and stops meanwhile
    finally:
        stop.set()
        worker.join()
    assert failures == [], failures[:5]
    assert seen["v1"] > 0 and seen["v2"] > 50, seen
    # Once the switch happened no request goes back to v1.
    for _ in range(20):
        body, _ = eh.invoke(rt, name)
        assert body["version"] == "v2"


def test_a_dead_instance_is_replaced_while_the_other_serves(sm, rt, module_kiln):
    name = eh.unique_name("ep-replace")
    eh.create_model(sm, name + "-m")
    eh.deploy(sm, name, [("AllTraffic", name + "-m", 2, 1.0)], server=module_kiln)
    before = set()
    eh.wait_until(lambda: before.add(eh.invoke(rt, name)[0]["instance"]) or len(before) == 2,
                  timeout=20, what="both instances answering")
    victim, _ = eh.invoke(rt, name, body=b'{"exit": 1}')  # answers, then its process exits
    victim = victim["instance"]
    # A request that reaches the instance in the microseconds while it exits fails like it would on
    # AWS (the container may have processed it: the router does not resend it). Once it is dead,
    # none may fail: a refused connection is retried on the other instance until the health watch
    # takes the dead one out of routing.
    time.sleep(0.3)
    failures = 0
    for _ in range(200):
        try:
            eh.invoke(rt, name)
        except Exception:  # noqa: BLE001
            failures += 1
    assert failures == 0

    def replaced():
        d = sm.describe_endpoint(EndpointName=name)
        [pv] = d["ProductionVariants"]
        answering = {eh.invoke(rt, name)[0]["instance"] for _ in range(10)}
        return pv["CurrentInstanceCount"] == 2 and len(answering) == 2 and victim not in answering and d
    d = eh.wait_until(replaced, timeout=60, what="a replacement instance")
    assert d["EndpointStatus"] == "InService"


def test_unsafe_model_archives_fail_the_endpoint(sm, s3, model_bucket, module_kiln):
    cases = {
        "dotdot": {"version.txt": b"x", "../evil-dotdot": b"pwned"},
        "symlink": {"version.txt": b"x", "link": ("symlink", "/etc"), "link/evil-symlink": b"pwned"},
        # A leading '/' is dropped (as tar and tarfile do); what still climbs out is refused.
        "absolute": {"/../evil-absolute": b"pwned"},
    }
    names = {}
    for case, files in cases.items():
        name = eh.unique_name("ep-" + case)
        url = eh.put_model(s3, model_bucket, name + "/model.tar.gz", files)
        eh.create_model(sm, name + "-m", model_data_url=url)
        eh.create_config(sm, name + "-cfg", [("AllTraffic", name + "-m", 1, 1.0)])
        sm.create_endpoint(EndpointName=name, EndpointConfigName=name + "-cfg")
        names[case] = (name, url)
    for case, (name, url) in names.items():
        d = eh.wait_endpoint(sm, name, statuses=("Failed",), server=module_kiln)
        assert url in d["FailureReason"], (case, d["FailureReason"])
        assert "ClientError" in d["FailureReason"]
    for root, _, files in os.walk(module_kiln.data_dir):
        assert not [f for f in files if f.startswith("evil-")], root
    assert not os.path.exists("/evil-absolute")
    assert not os.path.exists("/etc/evil-symlink")
    for name, _ in names.values():
        sm.delete_endpoint(EndpointName=name)


def test_an_instance_that_never_answers_ping_fails_the_endpoint(sm, module_kiln):
    name = eh.unique_name("ep-noping")
    eh.create_model(sm, name + "-m", env={"PING_FAIL": "1"})
    eh.create_config(sm, name + "-cfg", [("AllTraffic", name + "-m", 1, 1.0)], startup_timeout=60)
    sm.create_endpoint(EndpointName=name, EndpointConfigName=name + "-cfg")
    d = eh.wait_endpoint(sm, name, statuses=("Failed",), timeout=90, server=module_kiln)
    assert "did not pass the ping health check" in d["FailureReason"]
    assert "AllTraffic" in d["FailureReason"]


def test_metrics_are_exported(rt, one_instance, module_kiln):
    for _ in range(5):
        eh.invoke(rt, one_instance)
    eh.invoke_error(rt, one_instance, body=json.dumps({"status": 503, "message": "x"}).encode())
    with urllib.request.urlopen(module_kiln.endpoint + "/metrics", timeout=10) as r:
        text = r.read().decode()
    lines = [l for l in text.splitlines() if one_instance in l and not l.startswith("#")]
    invocations = [l for l in lines if l.startswith("kiln_invocations_total{")]
    assert invocations and float(invocations[0].rsplit(" ", 1)[1]) >= 6, lines
    assert any(l.startswith("kiln_invocation_5xx_errors_total{") and float(l.rsplit(" ", 1)[1]) >= 1
               for l in lines), lines


def _rss_kib(pid):
    with open("/proc/%d/status" % pid) as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise AssertionError("no VmRSS")


def test_bad_input_leaves_memory_and_other_endpoints_alone(sm, rt, one_instance, module_kiln):
    """Every kind of bad invocation, many times over: each gets its runtime-API error, another
    endpoint keeps answering, and the server's memory settles instead of growing."""
    import http.client
    other = eh.unique_name("ep-bystander")
    eh.create_model(sm, other + "-m")
    eh.deploy(sm, other, [("AllTraffic", other + "-m", 1, 1.0)], server=module_kiln)
    bad = [json.dumps(c).encode() for c in ({"status": 500, "message": "x" * 5000}, {"garbage": True},
                                            {"reset": True}, {"size": 7 * 1024 * 1024})]
    host, port = module_kiln.endpoint.split("//")[1].split(":")

    def round_of_abuse():
        for body in bad:
            assert eh.invoke_error(rt, one_instance, body=body)["Error"]["Code"] == "ModelError"
        assert eh.invoke_error(rt, one_instance, body=b"x" * (6291456 + 1))["ResponseMetadata"]["HTTPStatusCode"] == 413
        # Malformed headers straight on the wire.
        conn = http.client.HTTPConnection(host, int(port), timeout=10)
        conn.putrequest("POST", "/endpoints/%s/invocations" % one_instance)
        conn.putheader("Content-Length", "not-a-number")
        conn.endheaders()
        assert conn.getresponse().status == 400
        conn.close()
        assert eh.invoke(rt, other)[0]["echo_len"] == 2

    for _ in range(5):
        round_of_abuse()
    before = _rss_kib(module_kiln.proc.pid)
    for _ in range(30):
        round_of_abuse()
    after = _rss_kib(module_kiln.proc.pid)
    assert after - before < 32 * 1024, (before, after)
    sm.delete_endpoint(EndpointName=other)
