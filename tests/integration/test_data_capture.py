"""Data capture and shadow variants (issue 20; serving-contract.md §14 and §9's last row).

One module server with `data_capture.flush_interval_seconds` 1 and four endpoints of the test serving program
(endpoints/serve_app.py), created together:
- `cap`: DataCaptureConfig 100 %, InputAndOutput, CSV text/csv and JSON application/json: capture files whose
  records match the traffic exactly (count, data, encodings CSV/JSON/BASE64, observed content types,
  inferenceId, eventId, inferenceTime, the file naming); DescribeEndpoint's DataCaptureConfig summary;
- `zero`: InitialSamplingPercentage 0: nothing captured;
- `shadow`: a production variant and a shadow variant (VARIANT_TAG tells their answers apart) with capture on:
  every request answered by production only, copied to the shadow (its container's log stream, its
  Invocations metric, its answers captured under its own name), DescribeEndpoint's ShadowProductionVariants;
- `broken`: a shadow that answers 500 to everything (endpoints/failing_app.py): the caller's answers intact,
  the shadow's errors in its own metrics.
Plus the SageMaker SDK's DataCaptureConfig on Model.deploy() (sdk/data_capture_scenarios.py, an sdk_helpers
scenario started first) and CreateEndpointConfig refusals. ~25 s on 2 cores."""

import base64
import datetime
import json
import os
import re
import time

import pytest
from botocore.exceptions import ClientError

import endpoint_helpers as eh
import sdk_helpers
from training_helpers import sm  # noqa: F401 (module-scoped client fixture)

BUCKET = "kiln-capture"
KILN_CONFIG = dict(eh.ENDPOINT_CONFIG, data_capture={"flush_interval_seconds": 1},
                   endpoints={"invocation_timeout_seconds": 10, "stop_grace_seconds": 5,
                              "health_interval_seconds": 0.5})
FAILING_IMAGE = "local:" + os.path.join(eh.HERE, "endpoints", "failing_app.py")
KEY_RE = re.compile(r"^(?P<prefix>.+)/(?P<endpoint>[^/]+)/(?P<variant>[^/]+)/(?P<y>\d{4})/(?P<m>\d\d)/(?P<d>\d\d)/"
                    r"(?P<h>\d\d)/\d\d-\d\d-\d{3}-[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}\.jsonl$")


class CaptureScenarios(sdk_helpers.ScenarioRunner):
    """The SageMaker SDK's DataCaptureConfig in a process of its own (sdk_helpers)."""
    script = os.path.join(os.path.dirname(os.path.abspath(__file__)), "sdk", "data_capture_scenarios.py")


@pytest.fixture(scope="module", autouse=True)
def _no_endpoint_left_behind(sm):  # noqa: F811
    yield
    eh.delete_all_endpoints(sm)


@pytest.fixture(scope="module")
def srv(module_kiln):
    module_kiln.client("s3").create_bucket(Bucket=BUCKET)
    return module_kiln


@pytest.fixture(scope="module")
def s3(srv):
    return srv.client("s3")


@pytest.fixture(scope="module")
def rt(srv):
    return srv.client("sagemaker-runtime")


@pytest.fixture(scope="module")
def cw(srv):
    return srv.client("cloudwatch")


@pytest.fixture(scope="module")
def sdk_runner(srv, tmp_path_factory):
    lib = sdk_helpers.sdk_lib_dir()
    if lib is None:
        yield None
        return
    runner = CaptureScenarios(srv, str(tmp_path_factory.mktemp("sdk")), lib)
    runner.start("capture_predictor", {"bucket": BUCKET, "name": eh.unique_name("sdk-cap")}, timeout=120)
    yield runner
    runner.stop_all()


def capture_config(prefix, percentage=100):
    return {"EnableCapture": True, "InitialSamplingPercentage": percentage,
            "DestinationS3Uri": "s3://%s/%s" % (BUCKET, prefix),
            "CaptureOptions": [{"CaptureMode": "InputAndOutput"}],
            "CaptureContentTypeHeader": {"CsvContentTypes": ["text/csv"], "JsonContentTypes": ["application/json"]}}


def variant(name, model):
    return {"VariantName": name, "ModelName": model, "InitialInstanceCount": 1, "InstanceType": "ml.m5.large"}


@pytest.fixture(scope="module")
def endpoints(sm, sdk_runner):  # noqa: F811
    """name → endpoint name, all four created at once and awaited together."""
    tag = eh.unique_name("dc")
    eh.create_model(sm, tag + "-prod", env={"VARIANT_TAG": "prod"})
    eh.create_model(sm, tag + "-shadow", env={"VARIANT_TAG": "shadow"})
    sm.create_model(ModelName=tag + "-failing", PrimaryContainer={"Image": FAILING_IMAGE},
                    ExecutionRoleArn=eh.ROLE_ARN)
    configs = {
        "cap": {"ProductionVariants": [variant("AllTraffic", tag + "-prod")],
                "DataCaptureConfig": capture_config("boto")},
        "zero": {"ProductionVariants": [variant("AllTraffic", tag + "-prod")],
                 "DataCaptureConfig": capture_config("zero", percentage=0)},
        "shadow": {"ProductionVariants": [variant("Prod", tag + "-prod")],
                   "ShadowProductionVariants": [variant("Shadow", tag + "-shadow")],
                   "DataCaptureConfig": capture_config("shadow")},
        "broken": {"ProductionVariants": [variant("Prod", tag + "-prod")],
                   "ShadowProductionVariants": [variant("Broken", tag + "-failing")]},
    }
    names = {}
    for key, config in configs.items():
        names[key] = "%s-%s" % (tag, key)
        sm.create_endpoint_config(EndpointConfigName=names[key] + "-cfg", **config)
        sm.create_endpoint(EndpointName=names[key], EndpointConfigName=names[key] + "-cfg")
    for name in names.values():
        eh.wait_endpoint(sm, name, timeout=60)
    return names


def capture_records(s3, prefix):
    """[(key, record)] of every capture file under s3://BUCKET/prefix/, in key order."""
    out = []
    for page in s3.get_paginator("list_objects_v2").paginate(Bucket=BUCKET, Prefix=prefix + "/"):
        for obj in page.get("Contents", []):
            body = s3.get_object(Bucket=BUCKET, Key=obj["Key"])["Body"].read().decode()
            out.extend((obj["Key"], json.loads(line)) for line in body.splitlines())
    return out


def wait_records(s3, prefix, count, timeout=20):
    """The records under `prefix` once there are `count` of them (more is a failure)."""
    records = []

    def enough():
        records[:] = capture_records(s3, prefix)
        assert len(records) <= count, "%d records under %s, expected %d" % (len(records), prefix, count)
        return len(records) == count

    eh.wait_until(enough, timeout=timeout, poll=0.3, what="%d capture records under %s" % (count, prefix))
    return records


def decoded(captured):
    data = captured["data"]
    return base64.b64decode(data) if captured["encoding"] == "BASE64" else data.encode()


def metric_sum(cw, endpoint, variant_name, metric):
    now = datetime.datetime.now(datetime.timezone.utc)
    points = cw.get_metric_statistics(
        Namespace="AWS/SageMaker", MetricName=metric, StartTime=now - datetime.timedelta(minutes=10),
        EndTime=now + datetime.timedelta(minutes=1), Period=60, Statistics=["Sum"],
        Dimensions=[{"Name": "EndpointName", "Value": endpoint}, {"Name": "VariantName", "Value": variant_name}],
    )["Datapoints"]
    return sum(p["Sum"] for p in points)


def test_capture_records_match_the_traffic_and_sampling_zero_captures_nothing(sm, s3, rt, endpoints):  # noqa: F811
    cap, zero = endpoints["cap"], endpoints["zero"]
    summary = sm.describe_endpoint(EndpointName=cap)["DataCaptureConfig"]
    assert summary == {"EnableCapture": True, "CaptureStatus": "Started", "CurrentSamplingPercentage": 100,
                       "DestinationS3Uri": "s3://%s/boto" % BUCKET}, summary
    assert sm.describe_endpoint(EndpointName=zero)["DataCaptureConfig"]["CurrentSamplingPercentage"] == 0
    sent = {}  # request body → (content type, inference id, answer body, answer content type)
    bodies = [(b"69,0,153.7,%d\n" % i, "text/csv") for i in range(4)]
    bodies += [(json.dumps({"row": i, "s": "q\"uote\n\u00e9"}).encode(), "application/json") for i in range(4)]
    bodies += [(bytes([i, 0, 255, 254, 10, 128]) * (i + 1), "application/x-npy") for i in range(4)]
    for i, (body, content_type) in enumerate(bodies):
        kwargs = {"InferenceId": "order-%d" % i} if i % 3 == 0 else {}
        r = rt.invoke_endpoint(EndpointName=cap, Body=body, ContentType=content_type, **kwargs)
        sent[body] = (content_type, kwargs.get("InferenceId"), r["Body"].read(), r["ContentType"])
        rt.invoke_endpoint(EndpointName=zero, Body=body, ContentType=content_type)
    hour = datetime.datetime.now(datetime.timezone.utc).strftime("%Y/%m/%d/%H")
    records = wait_records(s3, "boto", len(bodies))
    event_ids = set()
    for key, record in records:
        m = KEY_RE.match(key)
        assert m and m["prefix"] == "boto" and m["endpoint"] == cap and m["variant"] == "AllTraffic", key
        assert "%s/%s/%s/%s" % (m["y"], m["m"], m["d"], m["h"]) == hour or time.gmtime().tm_min == 0, key
        assert record["eventVersion"] == "0"
        inp, out = record["captureData"]["endpointInput"], record["captureData"]["endpointOutput"]
        body = decoded(inp)
        content_type, inference_id, answer, answer_type = sent.pop(body)
        assert inp["mode"] == "INPUT" and out["mode"] == "OUTPUT"
        assert inp["observedContentType"] == content_type
        assert inp["encoding"] == {"text/csv": "CSV", "application/json": "JSON"}.get(content_type, "BASE64"), record
        assert out["observedContentType"] == answer_type == "application/json"
        assert out["encoding"] == "JSON" and decoded(out) == answer
        meta = record["eventMetadata"]
        assert meta.get("inferenceId") == inference_id, record
        assert re.match(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ$", meta["inferenceTime"]), meta
        event_ids.add(meta["eventId"])
    assert not sent and len(event_ids) == len(bodies)
    # The zero endpoint's requests were served in the same flush periods: nothing of them was written.
    time.sleep(1.5)
    assert capture_records(s3, "zero") == []
    assert len(capture_records(s3, "boto")) == len(bodies)


def test_sdk_data_capture_config_on_deploy(sm, s3, sdk_runner):  # noqa: F811
    if sdk_runner is None:
        pytest.skip("SageMaker Python SDK bundle not found (KILN_SAGEMAKER_SDK_LIB)")
    result = sdk_runner.result("capture_predictor")
    config = result["endpoint_config"]["DataCaptureConfig"]
    assert config["CaptureOptions"] == [{"CaptureMode": "Input"}, {"CaptureMode": "Output"}], config
    assert config["CaptureContentTypeHeader"] == {"CsvContentTypes": ["text/csv"],
                                                  "JsonContentTypes": ["application/json"]}, config
    assert result["describe"]["DataCaptureConfig"]["CaptureStatus"] == "Started"
    name = result["describe"]["EndpointName"]
    calls = {c["sent"]: c for c in result["calls"]}
    records = wait_records(s3, "sdk-capture/" + name, len(calls))
    for key, record in records:
        assert KEY_RE.match(key)["variant"] == "AllTraffic", key
        inp, out = record["captureData"]["endpointInput"], record["captureData"]["endpointOutput"]
        call = calls.pop(inp["data"])
        assert inp["encoding"] == "JSON" and inp["observedContentType"] == "application/json"
        assert out["data"] == call["answer"] and out["encoding"] == "JSON"
        assert record["eventMetadata"].get("inferenceId") == call["inference_id"]
    assert not calls
    sm.delete_endpoint(EndpointName=name)


def test_shadow_variant_sees_every_request_and_never_answers(srv, sm, s3, rt, cw, endpoints):  # noqa: F811
    name = endpoints["shadow"]
    d = sm.describe_endpoint(EndpointName=name)
    assert [v["VariantName"] for v in d["ProductionVariants"]] == ["Prod"]
    assert [v["VariantName"] for v in d["ShadowProductionVariants"]] == ["Shadow"]
    assert d["ShadowProductionVariants"][0]["CurrentInstanceCount"] == 1
    n = 8
    for i in range(n):
        doc, r = eh.invoke(rt, name, body=json.dumps({"request": i}).encode(), InferenceId="shadow-%d" % i)
        assert doc["variant_env"] == "prod", doc
        assert r["ResponseMetadata"]["HTTPHeaders"]["x-amzn-invoked-production-variant"] == "Prod"
    # Both variants' answers captured, each under its own name; the shadow got the same requests.
    records = wait_records(s3, "shadow", 2 * n)
    by_variant = {"Prod": {}, "Shadow": {}}
    for key, record in records:
        answer = json.loads(record["captureData"]["endpointOutput"]["data"])
        by_variant[KEY_RE.match(key)["variant"]][record["captureData"]["endpointInput"]["data"]] = (
            answer, record["eventMetadata"]["inferenceId"])
    want = {json.dumps({"request": i}): "shadow-%d" % i for i in range(n)}
    for variant_name, tag in (("Prod", "prod"), ("Shadow", "shadow")):
        got = by_variant[variant_name]
        assert {body: inference_id for body, (_, inference_id) in got.items()} == want, variant_name
        assert all(answer["variant_env"] == tag for answer, _ in got.values()), got
    # The shadow container got the inference id and content type the client sent.
    answer, inference_id = by_variant["Shadow"][json.dumps({"request": 0})]
    assert answer["headers"]["x-amzn-sagemaker-inference-id"] == inference_id == "shadow-0"
    assert answer["headers"]["content-type"] == "application/json"
    # Its container's log stream shows each request; its metrics are under its own name.
    logs = srv.client("logs")

    def shadow_log_lines():
        events = logs.filter_log_events(logGroupName="/aws/sagemaker/Endpoints/" + name,
                                        logStreamNamePrefix="Shadow/")["events"]
        return sum("POST /invocations" in e["message"] for e in events)

    eh.wait_until(lambda: shadow_log_lines() == n, timeout=15, poll=0.3, what="the shadow's log lines")
    eh.wait_until(lambda: metric_sum(cw, name, "Shadow", "Invocations") == n, timeout=15, poll=0.3,
                  what="the shadow's Invocations metric")
    assert metric_sum(cw, name, "Prod", "Invocations") == n


def test_failing_shadow_leaves_the_callers_answers_intact(sm, rt, cw, endpoints):  # noqa: F811
    name = endpoints["broken"]
    for i in range(5):
        doc, r = eh.invoke(rt, name, body=json.dumps({"request": i}).encode())
        assert r["ResponseMetadata"]["HTTPStatusCode"] == 200 and doc["variant_env"] == "prod", doc
    eh.wait_until(lambda: metric_sum(cw, name, "Broken", "Invocation5XXErrors") == 5, timeout=15, poll=0.3,
                  what="the failing shadow's 5XX errors")
    assert metric_sum(cw, name, "Broken", "InvocationModelErrors") == 5
    assert metric_sum(cw, name, "Prod", "InvocationModelErrors") == 0
    assert metric_sum(cw, name, "Prod", "Invocations") == 5


def test_refused_configurations(sm, endpoints):  # noqa: F811
    tag = endpoints["cap"]

    def refused(**config):
        with pytest.raises(ClientError) as info:
            sm.create_endpoint_config(EndpointConfigName=eh.unique_name("bad"), **config)
        assert info.value.response["Error"]["Code"] == "ValidationException", info.value.response
        return info.value.response["Error"]["Message"]

    prod = variant("Prod", tag.rsplit("-", 1)[0] + "-prod")
    shadow = variant("Shadow", tag.rsplit("-", 1)[0] + "-shadow")
    assert "exactly one production variant and one shadow" in refused(
        ProductionVariants=[prod, dict(prod, VariantName="Other")], ShadowProductionVariants=[shadow])
    assert "exactly one production variant and one shadow" in refused(
        ProductionVariants=[prod], ShadowProductionVariants=[shadow, dict(shadow, VariantName="S2")])
    assert "unique" in refused(ProductionVariants=[prod], ShadowProductionVariants=[dict(shadow, VariantName="prod")])
    assert "Could not find model" in refused(ProductionVariants=[prod],
                                             ShadowProductionVariants=[dict(shadow, ModelName="missing")])
    assert "must be an S3 URI" in refused(
        ProductionVariants=[prod], DataCaptureConfig=dict(capture_config("x"), DestinationS3Uri="https://h/x"))
    assert "KmsKeyId" in refused(ProductionVariants=[prod], DataCaptureConfig=dict(capture_config("x"), KmsKeyId="k"))
    # botocore's own checks (the model's range): a percentage over 100 never reaches the server.
    with pytest.raises(Exception):
        sm.create_endpoint_config(EndpointConfigName=eh.unique_name("bad"), ProductionVariants=[prod],
                                  DataCaptureConfig=dict(capture_config("x"), InitialSamplingPercentage=101))
