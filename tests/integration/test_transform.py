"""Batch transform (issue 20; serving-contract.md §13, control-plane-api.md §8.6): CreateTransformJob,
DescribeTransformJob, ListTransformJobs and StopTransformJob against a `local:` serving program
(endpoints/transform_app.py: one CSV output line per input line, the sum of its integer fields).

- the SageMaker SDK's Transformer (sdk/transform_scenarios.py, an sdk_helpers scenario started first so
  that it overlaps the rest): 10,000 CSV lines in 4 objects on two instances, MultiRecord within
  MaxPayloadInMB 1 (several requests per object), InputFilter "$[1:]" (the id column is not sent),
  JoinSource Input: every output line is its input line plus the model's column, line for line;
  objects assigned round-robin to the two instances (data-log streams), the §4.1 variables seen by
  the container, its output in /aws/sagemaker/TransformJobs;
- boto3: a record larger than MaxPayloadInMB fails its object (FailureReason names it and both sizes)
  while the other object's output is written; Gzip objects listed by a ManifestFile (relative keys in
  the output names); /execution-parameters (SINGLE_RECORD from the container)
  with TFRecord frames sent without their framing; StopTransformJob → Stopping → Stopped; validation
  errors, Describe/List.
One module server; ~15 s on 2 cores."""

import gzip
import json
import os
import struct
import time

import pytest
from botocore.exceptions import ClientError

import endpoint_helpers as eh
import sdk_helpers
from training_helpers import logs, s3, sm  # noqa: F401 (module-scoped client fixtures)

HERE = os.path.dirname(os.path.abspath(__file__))
TRANSFORM_IMAGE = "local:" + os.path.join(HERE, "endpoints", "transform_app.py")
KILN_CONFIG = dict(eh.ENDPOINT_CONFIG, endpoints={"stop_grace_seconds": 5, "health_interval_seconds": 0.5})
BUCKET = "kiln-transform"
LOG_GROUP = "/aws/sagemaker/TransformJobs"
PAD = "p" * 500  # a non-integer column: ~1.3 MB per object, so MaxPayloadInMB 1 needs two requests


class TransformScenarios(sdk_helpers.ScenarioRunner):
    script = os.path.join(HERE, "sdk", "transform_scenarios.py")


@pytest.fixture(scope="module")
def srv(module_kiln):
    return module_kiln


@pytest.fixture(scope="module")
def bucket(s3):  # noqa: F811
    s3.create_bucket(Bucket=BUCKET)
    return BUCKET


def create_model(sm, name, env=None):  # noqa: F811
    container = {"Image": TRANSFORM_IMAGE}
    if env:
        container["Environment"] = env
    sm.create_model(ModelName=name, PrimaryContainer=container, ExecutionRoleArn=eh.ROLE_ARN)
    return name


@pytest.fixture(scope="module")
def model(sm):  # noqa: F811
    return create_model(sm, eh.unique_name("tm"))


def csv_lines(start, count):
    return ["id-%d,%d,%d,%s,%d" % (i, i, 2 * i, PAD, 7) for i in range(start, start + count)]


@pytest.fixture(scope="module")
def sdk_job(srv, s3, bucket, model, tmp_path_factory):  # noqa: F811
    """The SDK's Transformer over 10,000 lines in 4 objects, started before the other tests."""
    lines = {}
    for part in range(4):
        rows = csv_lines(part * 2500, 2500)
        key = "sdk-in/part-%d.csv" % part
        s3.put_object(Bucket=bucket, Key=key, Body=("\n".join(rows) + "\n").encode())
        lines[key] = rows
    lib = sdk_helpers.sdk_lib_dir()
    if lib is None:
        pytest.skip("the SageMaker Python SDK bundle is not available (KILN_SAGEMAKER_SDK_LIB)")
    runner = TransformScenarios(srv, str(tmp_path_factory.mktemp("sdk")), lib)
    name = eh.unique_name("sdk-tj")
    runner.start("transformer_join", {"bucket": bucket, "model": model, "name": name,
                                      "input": "s3://%s/sdk-in/" % bucket, "output": "s3://%s/sdk-out" % bucket},
                 timeout=120)
    yield runner, name, lines
    runner.stop_all()


def wait_job(sm, name, statuses=("Completed", "Failed", "Stopped"), timeout=60):  # noqa: F811
    deadline = time.monotonic() + timeout
    while True:
        d = sm.describe_transform_job(TransformJobName=name)
        if d["TransformJobStatus"] in statuses:
            return d
        assert time.monotonic() < deadline, "transform job %s still %s" % (name, d["TransformJobStatus"])
        time.sleep(0.1)


def job_request(name, model, input_uri, output_uri, **extra):
    request = {
        "TransformJobName": name,
        "ModelName": model,
        "TransformInput": {"DataSource": {"S3DataSource": {"S3DataType": "S3Prefix", "S3Uri": input_uri}},
                           "ContentType": "text/csv", "SplitType": "Line"},
        "TransformOutput": {"S3OutputPath": output_uri, "AssembleWith": "Line"},
        "TransformResources": {"InstanceType": "ml.m5.large", "InstanceCount": 1},
    }
    for key, value in extra.items():
        if isinstance(value, dict) and isinstance(request.get(key), dict):
            request[key].update(value)
        else:
            request[key] = value
    return request


def get_text(s3, bucket, key):  # noqa: F811
    return s3.get_object(Bucket=bucket, Key=key)["Body"].read().decode()


def stream_events(logs, name):  # noqa: F811
    """{stream name: [messages]} of the job's streams."""
    out = {}
    kwargs = {"logGroupName": LOG_GROUP, "logStreamNamePrefix": name + "/"}
    while True:
        page = logs.filter_log_events(**kwargs)
        for e in page["events"]:
            out.setdefault(e["logStreamName"], []).append(e["message"])
        if not page.get("nextToken"):
            return out
        kwargs["nextToken"] = page["nextToken"]


def test_sdk_transformer_joins_10k_lines_on_two_instances(srv, sm, s3, logs, bucket, sdk_job):  # noqa: F811
    runner, name, lines = sdk_job
    result = runner.result("transformer_join")
    d = result["describe"]
    assert d["TransformJobStatus"] == "Completed", d
    assert d["TransformResources"]["InstanceCount"] == 2
    assert d["DataProcessing"] == {"InputFilter": "$[1:]", "JoinSource": "Input"}
    assert d["BatchStrategy"] == "MultiRecord" and d["MaxPayloadInMB"] == 1
    total = 0
    for key, rows in lines.items():
        out_key = "sdk-out/" + key.split("/", 1)[1] + ".out"
        got = get_text(s3, bucket, out_key).split("\n")
        assert got[-1] == "" and len(got) == len(rows) + 1, (out_key, len(got))
        for row, out in zip(rows, got):
            i = int(row.split(",")[1])
            assert out == "%s,%d" % (row, i + 2 * i + 7), (row[:40], out[-40:])
        total += len(rows)
    assert total == 10000
    # Two instances, objects round-robin in key order: parts 0 and 2 on one, 1 and 3 on the other.
    streams = stream_events(logs, name)
    data_logs = {s: m for s, m in streams.items() if s.endswith("/data-log")}
    assert len(data_logs) == 2, sorted(streams)
    shares = sorted(sorted(int(m.split("part-")[1][0]) for m in msgs if ": Completed" in m)
                    for msgs in data_logs.values())
    assert shares == [[0, 2], [1, 3]], data_logs
    for stream in data_logs:
        container = stream[:-len("/data-log")]
        assert container.startswith(name + "/i-") and container.rsplit("-", 1)[1].isdigit(), container
        env_lines = [m for m in streams.get(container, []) if m.startswith("transform_app env: ")]
        assert env_lines, streams.get(container)
        env = json.loads(env_lines[0][len("transform_app env: "):])
        assert env["SAGEMAKER_BATCH"] == "true"
        assert env["SAGEMAKER_MAX_PAYLOAD_IN_MB"] == "1"
        assert env["SAGEMAKER_BATCH_STRATEGY"] == "MULTI_RECORD"
        assert env["SAGEMAKER_MAX_CONCURRENT_TRANSFORMS"] == "2"
        # ~1.05 MB of filtered lines per object and 1 MB per request: more than one request each.
        requests = [m for m in streams[container] if m.startswith("request records=")]
        assert len(requests) >= 4, requests
        assert all(int(m.split("bytes=")[1].split()[0]) <= 1048576 for m in requests)


def test_record_over_max_payload_fails_its_object(sm, s3, bucket, model):  # noqa: F811
    s3.put_object(Bucket=bucket, Key="big-in/a-good.csv", Body=b"1,2\n3,4\n")
    big = b"5,6\n" + b"x" * (1024 * 1024 + 10) + b"\n7,8\n"
    s3.put_object(Bucket=bucket, Key="big-in/b-big.csv", Body=big)
    name = eh.unique_name("big")
    sm.create_transform_job(**job_request(name, model, "s3://%s/big-in/" % bucket, "s3://%s/big-out/" % bucket,
                                          MaxPayloadInMB=1, BatchStrategy="MultiRecord"))
    d = wait_job(sm, name)
    assert d["TransformJobStatus"] == "Failed", d
    assert d["FailureReason"] == ("ClientError: s3://%s/big-in/b-big.csv: record 2 is %d bytes, more than "
                                  "MaxPayloadInMB allows (1048576 bytes)" % (bucket, 1024 * 1024 + 11)), d
    assert get_text(s3, bucket, "big-out/a-good.csv.out") == "3\n7\n"
    keys = [o["Key"] for o in s3.list_objects_v2(Bucket=bucket, Prefix="big-out/").get("Contents", [])]
    assert keys == ["big-out/a-good.csv.out"]
    assert d["TransformStartTime"] <= d["TransformEndTime"]
    summary = [s for s in sm.list_transform_jobs(NameContains=name)["TransformJobSummaries"]]
    assert [s["TransformJobStatus"] for s in summary] == ["Failed"]
    assert summary[0]["FailureReason"] == d["FailureReason"]


def crc32c(data):
    crc = 0xFFFFFFFF
    for b in data:
        crc ^= b
        for _ in range(8):
            crc = (crc >> 1) ^ (0x82F63B78 if crc & 1 else 0)
    return crc ^ 0xFFFFFFFF


def tfrecord(data):
    def masked(c):
        return (((c >> 15) | (c << 17)) + 0xA282EAD8) & 0xFFFFFFFF
    length = struct.pack("<Q", len(data))
    return length + struct.pack("<I", masked(crc32c(length))) + data + struct.pack("<I", masked(crc32c(data)))


def test_execution_parameters_and_tfrecord_single_records(sm, s3, logs, bucket):  # noqa: F811
    params = {"BatchStrategy": "SINGLE_RECORD", "MaxConcurrentTransforms": 3, "MaxPayloadInMB": 1}
    m = create_model(sm, eh.unique_name("tm-ep"), env={"TRANSFORM_EXECUTION_PARAMETERS": json.dumps(params)})
    s3.put_object(Bucket=bucket, Key="tf-in/r.tfrecord",
                  Body=tfrecord(b"hello") + tfrecord(b"") + tfrecord(b"world!!") + tfrecord(b"x" * 100))
    name = eh.unique_name("tf")
    sm.create_transform_job(**job_request(name, m, "s3://%s/tf-in/" % bucket, "s3://%s/tf-out" % bucket,
                                          TransformInput={"ContentType": "application/x-tfrecord",
                                                          "SplitType": "TFRecord"}))
    d = wait_job(sm, name)
    assert d["TransformJobStatus"] == "Completed", d
    # One request per record, framing removed: the model saw the data lengths.
    assert get_text(s3, bucket, "tf-out/r.tfrecord.out") == "5\n0\n7\n100\n"
    streams = stream_events(logs, name)
    container = [s for s in streams if not s.endswith("/data-log")]
    requests = [m for s in container for m in streams[s] if m.startswith("request records=")]
    assert len(requests) == 4, streams
    env = json.loads([m for s in container for m in streams[s] if m.startswith("transform_app env: ")][0]
                     [len("transform_app env: "):])
    assert env["SAGEMAKER_BATCH"] == "true"
    assert "SAGEMAKER_BATCH_STRATEGY" not in env and "SAGEMAKER_MAX_PAYLOAD_IN_MB" not in env  # not in the request


def test_gzip_objects_from_a_manifest(sm, s3, bucket, model):  # noqa: F811
    s3.put_object(Bucket=bucket, Key="gz-in/d/one.csv.gz", Body=gzip.compress(b"1,2\n3,4\n"))
    s3.put_object(Bucket=bucket, Key="gz-in/d/two.csv.gz", Body=gzip.compress(b"10,20\n"))
    s3.put_object(Bucket=bucket, Key="gz-in/d/not-listed.csv.gz", Body=gzip.compress(b"5\n"))
    manifest = [{"prefix": "s3://%s/gz-in/" % bucket}, "d/one.csv.gz", "d/two.csv.gz"]
    s3.put_object(Bucket=bucket, Key="gz-manifest.json", Body=json.dumps(manifest).encode())
    name = eh.unique_name("gz")
    sm.create_transform_job(**job_request(
        name, model, "s3://%s/gz-manifest.json" % bucket, "s3://%s/gz-out" % bucket,
        TransformInput={"CompressionType": "Gzip", "DataSource": {"S3DataSource": {
            "S3DataType": "ManifestFile", "S3Uri": "s3://%s/gz-manifest.json" % bucket}}}))
    d = wait_job(sm, name)
    assert d["TransformJobStatus"] == "Completed", d
    keys = sorted(o["Key"] for o in s3.list_objects_v2(Bucket=bucket, Prefix="gz-out/")["Contents"])
    assert keys == ["gz-out/d/one.csv.gz.out", "gz-out/d/two.csv.gz.out"]
    assert get_text(s3, bucket, "gz-out/d/one.csv.gz.out") == "3\n7\n"
    assert get_text(s3, bucket, "gz-out/d/two.csv.gz.out") == "30\n"


def test_model_error_fails_object_after_retries(sm, s3, logs, bucket, model):  # noqa: F811
    s3.put_object(Bucket=bucket, Key="err-in/e.csv", Body=b"1,1\nfail\n")
    name = eh.unique_name("err")
    sm.create_transform_job(**job_request(name, model, "s3://%s/err-in/" % bucket, "s3://%s/err-out/" % bucket,
                                          ModelClientConfig={"InvocationsMaxRetries": 1,
                                                             "InvocationsTimeoutInSeconds": 10}))
    d = wait_job(sm, name)
    assert d["TransformJobStatus"] == "Failed"
    assert d["FailureReason"].startswith("ClientError: s3://%s/err-in/e.csv: records 1-2: the model answered 500"
                                         % bucket), d["FailureReason"]
    assert d["FailureReason"].endswith("(after 1 retries)")
    assert "Contents" not in s3.list_objects_v2(Bucket=bucket, Prefix="err-out/")
    data_log = [m for s, msgs in stream_events(logs, name).items() if s.endswith("/data-log") for m in msgs]
    assert sum("attempt" in m for m in data_log) == 2, data_log


def test_stop_transform_job(sm, s3, bucket, model):  # noqa: F811
    s3.put_object(Bucket=bucket, Key="stop-in/s.csv", Body=b"1,2\n")
    name = eh.unique_name("stop")
    sm.create_transform_job(**job_request(name, model, "s3://%s/stop-in/" % bucket, "s3://%s/stop-out/" % bucket,
                                          Environment={"TRANSFORM_SLEEP_SECONDS": "60"}))
    time.sleep(1)
    sm.stop_transform_job(TransformJobName=name)
    assert sm.describe_transform_job(TransformJobName=name)["TransformJobStatus"] in ("Stopping", "Stopped")
    d = wait_job(sm, name, timeout=30)
    assert d["TransformJobStatus"] == "Stopped", d
    assert "FailureReason" not in d
    assert "Contents" not in s3.list_objects_v2(Bucket=bucket, Prefix="stop-out/")
    with pytest.raises(ClientError) as info:
        sm.stop_transform_job(TransformJobName=name)
    assert info.value.response["Error"]["Code"] == "ValidationException"
    assert "only InProgress jobs can be stopped" in info.value.response["Error"]["Message"]


def error_of(call, **kwargs):
    with pytest.raises(ClientError) as info:
        call(**kwargs)
    return info.value.response["Error"]["Code"], info.value.response["Error"]["Message"]


def test_validation_errors(sm, bucket, model):  # noqa: F811
    inp, out = "s3://%s/v-in/" % bucket, "s3://%s/v-out/" % bucket
    code, message = error_of(sm.describe_transform_job, TransformJobName="no-such-job")
    assert (code, message) == ("ValidationException", "Could not find requested job with name no-such-job")
    code, message = error_of(sm.stop_transform_job, TransformJobName="no-such-job")
    assert code == "ValidationException"
    code, message = error_of(sm.create_transform_job, **job_request("v1", "no-such-model", inp, out))
    assert code == "ValidationException" and message.startswith('Could not find model "arn:aws:sagemaker:'), message
    code, message = error_of(sm.create_transform_job, **job_request(
        "v2", model, inp, out, BatchStrategy="MultiRecord", TransformInput={"SplitType": "None"}))
    assert code == "ValidationException" and "requires a SplitType other than None" in message
    code, message = error_of(sm.create_transform_job, **job_request(
        "v3", model, inp, out, MaxConcurrentTransforms=20, MaxPayloadInMB=6))
    assert code == "ValidationException" and "must not exceed 100 MB" in message
    code, message = error_of(sm.create_transform_job, **job_request(
        "v4", model, inp, out, DataProcessing={"InputFilter": "$[1:"}))
    assert code == "ValidationException" and message.startswith("DataProcessing.InputFilter: The JSONPath")
    code, message = error_of(sm.create_transform_job, **job_request(
        "v5", model, inp, out, TransformInput={"DataSource": {"S3DataSource": {
            "S3DataType": "AugmentedManifestFile", "S3Uri": inp}}}))
    assert code == "ValidationException" and "AugmentedManifestFile" in message
    code, message = error_of(sm.create_transform_job, **job_request("bad name!", model, inp, out))
    assert code == "ValidationException"
    # Nothing was created.
    names = [s["TransformJobName"] for s in sm.list_transform_jobs(MaxResults=100)["TransformJobSummaries"]]
    assert not [n for n in names if n.startswith("v")], names
