"""Asynchronous inference (spec/serving-contract.md §11, runtime-api.md §4) end to end with boto3:
AsyncInferenceConfig on an endpoint configuration, InvokeEndpointAsync answering 202 with the
output/failure locations, the dispatcher writing the output or failure object, webhook
notifications and data-log lines, 1,000 requests surviving a `kill -9` of the server (every one
produces its output, none runs to completion twice), a variant scaled to 0 instances and back
(requests queued meanwhile complete afterwards), and the same done by Application Auto Scaling as
AWS documents it for async endpoints: target tracking on ApproximateBacklogSizePerInstance takes an
idle endpoint to 0, a step policy behind a CloudWatch alarm on HasBacklogWithoutCapacity brings it
back when requests queue (the scaler evaluates every second here: `autoscaling.period_seconds`).

One server and one endpoint for the module (the test serving program, endpoints/serve_app.py)."""

import json
import os
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from botocore.exceptions import ClientError

import endpoint_helpers as eh
import kiln_harness as kh
import sdk_helpers

OK_TOPIC = "arn:aws:sns:us-east-1:123456789012:kiln-async-ok"
ERR_TOPIC = "arn:aws:sns:us-east-1:123456789012:kiln-async-err"
BUCKET = "async-it"


class Webhook:
    """A local HTTP server that records the notifications POSTed to it."""

    def __init__(self):
        self.events = []
        self.lock = threading.Lock()
        hook = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):  # noqa: N802
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                with hook.lock:
                    hook.events.append((self.path, self.headers.get("X-Kiln-Topic-Arn"), json.loads(body)))
                self.send_response(200)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def find(self, inference_id):
        with self.lock:
            return [e for e in self.events if e[2].get("inferenceId") == inference_id]


@pytest.fixture(scope="module")
def hook():
    h = Webhook()
    yield h
    h.server.shutdown()


@pytest.fixture(scope="module")
def srv(hook, tmp_path_factory):
    root = str(tmp_path_factory.mktemp("async"))
    config = json.loads(json.dumps(eh.ENDPOINT_CONFIG))
    config["endpoints"]["invocation_timeout_seconds"] = 10
    config["autoscaling"] = {"period_seconds": 1}
    config["async_inference"] = {"notifications": {
        OK_TOPIC: "http://127.0.0.1:%d/ok" % hook.port,
        ERR_TOPIC: "http://127.0.0.1:%d/err" % hook.port}}
    server = kh.KilnServer(os.path.join(root, "data"), config=config)
    server.start()
    yield server
    if server.alive():
        try:
            eh.delete_all_endpoints(server.client("sagemaker"))
        finally:
            assert server.stop() == 0, server.log_tail()


@pytest.fixture(scope="module")
def endpoint(srv):
    sm, s3 = srv.client("sagemaker"), srv.client("s3")
    s3.create_bucket(Bucket=BUCKET)
    name = eh.unique_name("async")
    eh.create_model(sm, name + "-m")
    async_config = {
        "ClientConfig": {"MaxConcurrentInvocationsPerInstance": 4},
        "OutputConfig": {
            "S3OutputPath": "s3://%s/out/" % BUCKET,
            "S3FailurePath": "s3://%s/failures" % BUCKET,
            "NotificationConfig": {"SuccessTopic": OK_TOPIC, "ErrorTopic": ERR_TOPIC,
                                   "IncludeInferenceResponseIn": ["SUCCESS_NOTIFICATION_TOPIC"]}}}
    create_async_config(srv, name + "-cfg", name + "-m", async_config)
    status, _, body = kh.json_request(srv, "SageMaker.DescribeEndpointConfig", {"EndpointConfigName": name + "-cfg"})
    assert status == 200 and json.loads(body)["AsyncInferenceConfig"] == async_config
    sm.create_endpoint(EndpointName=name, EndpointConfigName=name + "-cfg")
    eh.wait_endpoint(sm, name, server=srv)
    status, _, body = kh.json_request(srv, "SageMaker.DescribeEndpoint", {"EndpointName": name})
    assert json.loads(body)["AsyncInferenceConfig"] == async_config
    return name


def create_async_config(srv, name, model, async_config):
    """CreateEndpointConfig as a signed JSON request: Debian's botocore 1.26 (the suite's client)
    predates S3FailurePath and IncludeInferenceResponseIn."""
    status, _, body = kh.json_request(srv, "SageMaker.CreateEndpointConfig", {
        "EndpointConfigName": name,
        "ProductionVariants": [{"VariantName": "AllTraffic", "ModelName": model, "InitialInstanceCount": 1,
                                "InstanceType": "ml.m5.large"}],
        "AsyncInferenceConfig": async_config})
    assert status == 200, body


def invoke_async_raw(srv, endpoint, **headers):
    """InvokeEndpointAsync as a signed request with any §4.1 header (botocore 1.26 lacks
    Filename, S3OutputPathExtension and InvocationTimeoutSeconds, and drops FailureLocation).
    Returns (status, lower-cased headers, parsed JSON body)."""
    hdrs = {"X-Amzn-SageMaker-" + k: str(v) for k, v in headers.items()}
    status, out, body = kh.signed_request(srv, "POST", "/endpoints/%s/async-invocations" % endpoint,
                                          service="sagemaker", headers=hdrs)
    return status, out, json.loads(body or b"{}")


class AsyncScenarios(sdk_helpers.ScenarioRunner):
    """The SageMaker SDK's AsyncInferenceConfig/AsyncPredictor in a process of its own (sdk_helpers)."""
    script = os.path.join(os.path.dirname(os.path.abspath(__file__)), "sdk", "async_scenarios.py")


@pytest.fixture(scope="module")
def sdk_runner(srv, endpoint, tmp_path_factory):
    """Started with the module's first test, so the SDK's 30 s deploy poll overlaps the others;
    collected before the kill -9 test."""
    lib = sdk_helpers.sdk_lib_dir()
    if lib is None:
        yield None
        return
    runner = AsyncScenarios(srv, str(tmp_path_factory.mktemp("sdk")), lib)
    runner.start("async_predictor", {"bucket": BUCKET, "name": eh.unique_name("sdk-async")}, timeout=150)
    yield runner
    runner.stop_all()


def put_input(s3, body, content_type="application/json"):
    key = "in/%s.json" % uuid.uuid4().hex
    s3.put_object(Bucket=BUCKET, Key=key, Body=body, ContentType=content_type)
    return "s3://%s/%s" % (BUCKET, key)


def get_object(s3, location):
    assert location.startswith("s3://%s/" % BUCKET), location
    key = location[len("s3://%s/" % BUCKET):]
    try:
        return s3.get_object(Bucket=BUCKET, Key=key)
    except ClientError as e:
        if e.response["Error"]["Code"] in ("NoSuchKey", "404"):
            return None
        raise


def wait_object(s3, location, timeout=30):
    return eh.wait_until(lambda: get_object(s3, location), timeout=timeout, poll=0.1, what=location)


def test_invoke_async_writes_output_and_notifies(srv, endpoint, hook, sdk_runner):
    s3, rt = srv.client("s3"), srv.client("sagemaker-runtime")
    # InvokeEndpoint on an async endpoint is refused (AWS behaviour).
    error = eh.invoke_error(rt, endpoint)
    assert error["Error"]["Code"] == "ValidationError"
    assert "InvokeEndpointAsync" in error["Error"]["Message"]

    source = put_input(s3, b'{"hello": 1}')
    r = rt.invoke_endpoint_async(EndpointName=endpoint, InputLocation=source, ContentType="application/x-test",
                                 Accept="application/json", CustomAttributes="attr=1", InferenceId="my-id-1")
    assert r["ResponseMetadata"]["HTTPStatusCode"] == 202
    assert r["InferenceId"] == "my-id-1"
    assert r["OutputLocation"] == "s3://%s/out/my-id-1.out" % BUCKET
    assert r["ResponseMetadata"]["HTTPHeaders"]["x-amzn-sagemaker-failurelocation"] == \
        "s3://%s/failures/my-id-1-error.out" % BUCKET
    obj = wait_object(s3, r["OutputLocation"])
    assert obj["ContentType"] == "application/json"
    answer = json.loads(obj["Body"].read())
    assert answer["echo_len"] == len(b'{"hello": 1}')
    assert answer["headers"]["content-type"] == "application/x-test"
    assert answer["headers"]["accept"] == "application/json"
    assert answer["headers"]["x-amzn-sagemaker-custom-attributes"] == "attr=1"
    assert answer["headers"]["x-amzn-sagemaker-inference-id"] == "my-id-1"
    events = eh.wait_until(lambda: hook.find("my-id-1"), timeout=10, what="the success notification")
    path, topic, event = events[0]
    assert (path, topic) == ("/ok", OK_TOPIC)
    assert event["invocationStatus"] == "Completed"
    assert event["eventName"] == "InferenceResult" and event["eventSource"] == "aws:sagemaker"
    assert event["requestParameters"] == {"contentType": "application/x-test", "endpointName": endpoint,
                                          "inputLocation": source}
    assert event["responseParameters"]["outputLocation"] == r["OutputLocation"]
    assert event["responseBody"]["encoding"] == "STRING"
    assert json.loads(event["responseBody"]["content"])["echo_len"] == 12

    # Generated id, Filename and S3OutputPathExtension (§11.3).
    r = rt.invoke_endpoint_async(EndpointName=endpoint, InputLocation=source, RequestTTLSeconds=600)
    uuid.UUID(r["InferenceId"])
    assert r["OutputLocation"] == "s3://%s/out/%s.out" % (BUCKET, r["InferenceId"])
    wait_object(s3, r["OutputLocation"])
    status, headers, body = invoke_async_raw(srv, endpoint, InputLocation=source, S3OutputPathExtension="ext/sub",
                                             Filename="result.json", InvocationTimeoutSeconds=30)
    assert status == 202, body
    assert headers["x-amzn-sagemaker-outputlocation"] == "s3://%s/out/ext/sub/result.json" % BUCKET
    assert headers["x-amzn-sagemaker-failurelocation"] == "s3://%s/failures/ext/sub/%s-error.out" % (
        BUCKET, body["InferenceId"])
    wait_object(s3, headers["x-amzn-sagemaker-outputlocation"])
    for bad in ({"Filename": "a.b.c"}, {"S3OutputPathExtension": "s3:/x"}, {"InvocationTimeoutSeconds": 0},
                {"Inference-Id": "x" * 65}):
        status, _, body = invoke_async_raw(srv, endpoint, InputLocation=source, **bad)
        assert status == 400 and "validation error" in body["message"], (bad, body)

    # The data-log stream has a line per request outcome.
    logs = srv.client("logs")
    group = "/aws/sagemaker/Endpoints/" + endpoint

    def logged():
        try:
            events = logs.filter_log_events(logGroupName=group, filterPattern='"my-id-1"')["events"]
        except ClientError:
            return None
        return [e for e in events if e["logStreamName"].endswith("/data-log")]
    lines = eh.wait_until(logged, timeout=10, what="the data-log line")
    assert lines[0]["logStreamName"].startswith("AllTraffic/")
    assert json.loads(lines[0]["message"])["invocationStatus"] == "Completed"


def test_missing_input_bad_headers_and_model_errors(srv, endpoint, hook):
    s3, rt = srv.client("s3"), srv.client("sagemaker-runtime")
    with pytest.raises(ClientError) as info:
        rt.invoke_endpoint_async(EndpointName=endpoint, InputLocation="s3://%s/in/nothing-here" % BUCKET)
    assert info.value.response["Error"]["Code"] == "ValidationError"
    assert "nothing-here" in info.value.response["Error"]["Message"]
    source = put_input(s3, b"{}")
    status, headers, body = invoke_async_raw(srv, endpoint, InputLocation=source, RequestTTLSeconds=5)
    assert status == 400 and headers["x-amzn-errortype"].startswith("ValidationError"), body
    with pytest.raises(ClientError) as info:
        rt.invoke_endpoint_async(EndpointName="no-such-endpoint", InputLocation=source)
    assert info.value.response["Error"]["Code"] == "ValidationError"

    # A model error: the container's answer becomes the failure object; error notification.
    bad = put_input(s3, json.dumps({"status": 500, "message": "model exploded"}).encode())
    r = rt.invoke_endpoint_async(EndpointName=endpoint, InputLocation=bad, InferenceId="boom-1")
    r["FailureLocation"] = r["ResponseMetadata"]["HTTPHeaders"]["x-amzn-sagemaker-failurelocation"]
    failure = wait_object(s3, r["FailureLocation"])
    assert r["FailureLocation"] == "s3://%s/failures/boom-1-error.out" % BUCKET
    assert failure["Body"].read() == b"model exploded"
    assert get_object(s3, r["OutputLocation"]) is None
    path, topic, event = eh.wait_until(lambda: hook.find("boom-1"), timeout=10, what="the error notification")[0]
    assert (path, topic) == ("/err", ERR_TOPIC)
    assert event["invocationStatus"] == "Failed"
    assert event["responseParameters"]["failureLocation"] == r["FailureLocation"]
    assert "500" in event["responseParameters"]["failureReason"]
    assert "responseBody" not in event  # IncludeInferenceResponseIn names only the success topic

    # A timeout (InvocationTimeoutSeconds) is a failure with Kiln's JSON document.
    slow = put_input(s3, json.dumps({"sleep": 3}).encode())
    status, headers, _ = invoke_async_raw(srv, endpoint, InputLocation=slow, InvocationTimeoutSeconds=1)
    assert status == 202
    doc = json.loads(wait_object(s3, headers["x-amzn-sagemaker-failurelocation"])["Body"].read())
    assert "InvocationTimeoutSeconds" in doc["errorMessage"]


def test_sdk_async_predictor(srv, sdk_runner):
    if sdk_runner is None:
        pytest.skip("SageMaker Python SDK bundle not found (KILN_SAGEMAKER_SDK_LIB)")
    r = sdk_runner.result("async_predictor")
    assert r["predictor_class"] == "AsyncPredictor"
    assert r["result"]["echo_len"] == len(json.dumps({"hello": "sdk"}))
    assert r["result"]["headers"]["content-type"] == "application/json"
    assert r["output_path"].startswith("s3://%s/sdk-async/out/" % BUCKET)
    assert r["failure_path"].startswith("s3://%s/sdk-async/err/" % BUCKET)
    assert r["failure"] and "AsyncInferenceModelError" in r["failure"], r["failure"]
    assert "sdk boom" in r["failure"]


def test_a_thousand_requests_survive_kill_9(srv, endpoint):
    s3 = srv.client("s3")
    source = put_input(s3, b'{"x": 1}')
    total = 1000
    ids = ["k9-%04d" % i for i in range(total)]
    accepted = {}
    lock = threading.Lock()

    def submit(rt, inference_id):
        for _ in range(200):
            try:
                r = rt.invoke_endpoint_async(EndpointName=endpoint, InputLocation=source, InferenceId=inference_id)
                with lock:
                    accepted[inference_id] = r["OutputLocation"]
                return
            except Exception:  # noqa: BLE001 (the server is down or not yet routing again)
                time.sleep(0.1)
        raise AssertionError("never accepted: " + inference_id)

    rt = kh.make_client("sagemaker-runtime", srv.endpoint, srv.access_key, srv.secret_key, retries=0)
    with ThreadPoolExecutor(8) as pool:
        list(pool.map(lambda i: submit(rt, i), ids[:total // 2]))
    # Kill while the first half is still being worked off, then submit the rest.
    srv.kill()
    srv.start()
    rt = kh.make_client("sagemaker-runtime", srv.endpoint, srv.access_key, srv.secret_key, retries=0)
    with ThreadPoolExecutor(8) as pool:
        list(pool.map(lambda i: submit(rt, i), ids[total // 2:]))
    assert len(accepted) == total
    s3 = srv.client("s3")

    def outputs():
        keys = set()
        for page in s3.get_paginator("list_objects_v2").paginate(Bucket=BUCKET, Prefix="out/k9-"):
            keys.update(o["Key"] for o in page.get("Contents", []))
        return keys
    eh.wait_until(lambda: len(outputs()) == total, timeout=60, poll=0.5, what="1,000 outputs")
    for inference_id in ids[::97]:
        body = json.loads(get_object(s3, accepted[inference_id])["Body"].read())
        assert body["headers"]["x-amzn-sagemaker-inference-id"] == inference_id
    # None ran to completion twice: at most one "Completed" data-log line per inference id (a
    # request whose output existed before the restart is not run again).
    logs = srv.client("logs")
    group = "/aws/sagemaker/Endpoints/" + endpoint
    completed = {}
    for page in logs.get_paginator("filter_log_events").paginate(logGroupName=group, filterPattern='"k9-"'):
        for e in page["events"]:
            if not e["logStreamName"].endswith("/data-log"):
                continue
            line = json.loads(e["message"])
            if line["invocationStatus"] == "Completed":
                completed[line["inferenceId"]] = completed.get(line["inferenceId"], 0) + 1
    twice = {k: n for k, n in completed.items() if n > 1}
    assert not twice, twice
    assert len(completed) >= total - 50  # lines lost with the kill are the only ones missing


def test_scale_to_zero_and_back(srv, endpoint):
    sm, s3, rt = srv.client("sagemaker"), srv.client("s3"), srv.client("sagemaker-runtime")
    cw = srv.client("cloudwatch")
    sm.update_endpoint_weights_and_capacities(
        EndpointName=endpoint, DesiredWeightsAndCapacities=[{"VariantName": "AllTraffic", "DesiredInstanceCount": 0}])
    d = eh.wait_endpoint(sm, endpoint, server=srv)
    eh.wait_until(lambda: sm.describe_endpoint(EndpointName=endpoint)["ProductionVariants"][0]
                  ["CurrentInstanceCount"] == 0, timeout=30, what="0 instances")
    assert d["ProductionVariants"][0]["DesiredInstanceCount"] == 0
    source = put_input(s3, b"{}")
    queued = [rt.invoke_endpoint_async(EndpointName=endpoint, InputLocation=source)["OutputLocation"]
              for _ in range(5)]
    time.sleep(2)
    assert all(get_object(s3, location) is None for location in queued)

    def without_capacity():
        now = time.time()
        points = cw.get_metric_statistics(
            Namespace="AWS/SageMaker", MetricName="HasBacklogWithoutCapacity",
            Dimensions=[{"Name": "EndpointName", "Value": endpoint}],
            StartTime=now - 60, EndTime=now + 60, Period=60, Statistics=["Maximum"])["Datapoints"]
        # The window spans up to two 1-minute periods; the earlier one may hold 0s from before.
        return any(p["Maximum"] == 1 for p in points)
    eh.wait_until(without_capacity, timeout=10, what="HasBacklogWithoutCapacity = 1")

    sm.update_endpoint_weights_and_capacities(
        EndpointName=endpoint, DesiredWeightsAndCapacities=[{"VariantName": "AllTraffic", "DesiredInstanceCount": 1}])
    for location in queued:
        wait_object(s3, location, timeout=60)
    eh.wait_endpoint(sm, endpoint, server=srv)
    # A synchronous endpoint still cannot go to 0.
    other = eh.unique_name("sync")
    with pytest.raises(ClientError) as info:
        sm.update_endpoint_weights_and_capacities(
            EndpointName=other, DesiredWeightsAndCapacities=[{"VariantName": "AllTraffic", "DesiredInstanceCount": 0}])
    assert info.value.response["Error"]["Code"] == "ValidationException"


def test_autoscaling_takes_an_idle_async_endpoint_to_zero_and_a_backlog_back(srv, endpoint):
    sm, s3, rt = srv.client("sagemaker"), srv.client("s3"), srv.client("sagemaker-runtime")
    aas, cw = srv.client("application-autoscaling"), srv.client("cloudwatch")
    key = dict(ServiceNamespace="sagemaker", ResourceId="endpoint/%s/variant/AllTraffic" % endpoint,
               ScalableDimension="sagemaker:variant:DesiredInstanceCount")

    def instances():
        return sm.describe_endpoint(EndpointName=endpoint)["ProductionVariants"][0]["CurrentInstanceCount"]
    eh.wait_until(lambda: instances() == 1, timeout=60, what="the endpoint back at 1 instance")
    aas.register_scalable_target(MinCapacity=0, MaxCapacity=2, **key)
    alarm = "has-backlog-without-capacity-" + endpoint
    try:
        aas.put_scaling_policy(
            PolicyName="backlog-per-instance", PolicyType="TargetTrackingScaling",
            TargetTrackingScalingPolicyConfiguration={
                "TargetValue": 5.0, "ScaleInCooldown": 0, "ScaleOutCooldown": 0,
                "CustomizedMetricSpecification": {
                    "MetricName": "ApproximateBacklogSizePerInstance", "Namespace": "AWS/SageMaker",
                    "Dimensions": [{"Name": "EndpointName", "Value": endpoint}], "Statistic": "Average"}},
            **key)
        step = aas.put_scaling_policy(
            PolicyName="scale-up-from-zero", PolicyType="StepScaling",
            StepScalingPolicyConfiguration={
                "AdjustmentType": "ChangeInCapacity", "MetricAggregationType": "Average", "Cooldown": 0,
                "StepAdjustments": [{"MetricIntervalLowerBound": 0, "ScalingAdjustment": 1}]},
            **key)
        cw.put_metric_alarm(
            AlarmName=alarm, Namespace="AWS/SageMaker", MetricName="HasBacklogWithoutCapacity",
            Dimensions=[{"Name": "EndpointName", "Value": endpoint}], Statistic="Average", Period=10,
            EvaluationPeriods=1, DatapointsToAlarm=1, Threshold=1, ComparisonOperator="GreaterThanOrEqualToThreshold",
            TreatMissingData="missing", AlarmActions=[step["PolicyARN"]])

        # Idle: 15 periods below 0.9 x 5 requests per instance, then AlarmLow scales in to 0.
        eh.wait_until(lambda: instances() == 0, timeout=90, poll=0.5, what="the idle endpoint scaled in to 0")
        eh.wait_endpoint(sm, endpoint, server=srv)
        source = put_input(s3, b"{}")
        queued = [rt.invoke_endpoint_async(EndpointName=endpoint, InputLocation=source)["OutputLocation"]
                  for _ in range(3)]
        # HasBacklogWithoutCapacity = 1 puts the alarm in ALARM within a 10-s period; its step policy
        # adds an instance, which works the queue off.
        for location in queued:
            assert wait_object(s3, location, timeout=90) is not None, location
        state = cw.describe_alarms(AlarmNames=[alarm])["MetricAlarms"][0]
        assert state["AlarmActions"] == [step["PolicyARN"]], state
        activities = aas.describe_scaling_activities(ServiceNamespace="sagemaker", ResourceId=key["ResourceId"],
                                                     ScalableDimension=key["ScalableDimension"])["ScalingActivities"]
        text = [(a["Description"], a["Cause"], a["StatusCode"]) for a in activities]
        assert any("to 0" in d for d, _, _ in text), text
        assert any(alarm in c and "scale-up-from-zero" in c for _, c, _ in text), text
    finally:
        cw.delete_alarms(AlarmNames=[alarm])
        aas.deregister_scalable_target(**key)
