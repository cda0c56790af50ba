"""Processing jobs end to end (issue 18; training-contract.md §17, control-plane-api.md §8.2), with
real clients against one module server:

  * the SageMaker Python SDK, unpatched, in processes of its own (jobs/processing/sdk_processing.py):
    - `SKLearnProcessor` over two hosts: a ShardedByS3Key input of 7 objects (each host sees a
      disjoint share, together all of them, object i on host i mod 2) and a Continuous output —
      the files each host writes first reach S3 while the job is still InProgress (the script
      then waits for a marker object the test puts only after it saw them), the final ones after
      it ends; `run(wait=True, logs=True)` tails both hosts' streams;
    - `PyTorchProcessor` (a FrameworkProcessor) with a source_dir: the SDK's runproc.sh under
      /bin/bash unpacks it and runs `python process.py`;
    - `ScriptProcessor` with command ["python3"] and an image mapped by the module's
      `environments` entry, two hosts, arguments, the /opt/ml/processing layout, both config
      files and the environment as the script sees them, an output whose destination the SDK
      fills in;
  * boto3: Describe (status, times, ExitMessage from /opt/ml/output/message, FailureReason from a
    failing script's stderr and from /opt/ml/output/failure, a message that is not UTF-8), List
    with filters and paging, Stop of a running job (SIGTERM reaches it; Stopped) and of one
    waiting for capacity, MaxRuntimeInSeconds, a Gzip Pipe input, a ManifestFile input, EndOfJob
    outputs of a failed job, tags, CloudWatch Logs (group /aws/sagemaker/ProcessingJobs, stream
    <job>/algo-<n>-<epoch>), AWS validation errors, a job surviving kill -9 of its server;
  * the AWS CLI: describe-processing-job.

Every job is submitted when the module starts (the boto3 ones first, then the SDK's once their
processes have imported the SDK); the 2-core host runs two 1-vCPU ml.m5.large hosts at a time in
submission order, so the module takes about as long as its jobs one after the other. A thread
watches S3 for the Continuous files and puts the marker, whichever test runs at that moment.
"""

import datetime
import json
import os
import re
import threading
import time
import uuid

import pytest
from botocore.exceptions import ClientError

import sdk_helpers
import training_helpers as th
from training_helpers import sm, s3, logs  # noqa: F401 (module-scoped client fixtures)

CIDR = "10.238.0.0/16"
IMAGE = "kiln.test/kiln-processing-python:3.11"
KILN_CONFIG = {
    "scheduler": {"policy": "shrink", "allow_cpu_fallback": True},
    # Two hosts at once on a 2-core machine.
    "instance_types": [{"type": "ml.m5.large", "vcpus": 1}],
    "training": {"stop_grace_seconds": 5},
    "network": {"mode": "auto", "cidr": CIDR},
    "environments": [{"name": "kiln-proc", "images": ["*kiln-processing-python*"], "interpreter": "/usr/bin/python3",
                      "env": {"KILN_PROCESSING_ENV": "kiln-proc"}}],
}

HERE = os.path.dirname(os.path.abspath(__file__))
PROC_DIR = os.path.join(HERE, "jobs", "processing")
LOG_GROUP = "/aws/sagemaker/ProcessingJobs"
ROLE = "arn:aws:iam::000000000000:role/KilnProcessingTest"
TERMINAL = ("Completed", "Failed", "Stopped")
RUN = uuid.uuid4().hex[:6]
SHARDS = 7
BUCKET = "proc-%s" % RUN
CODE_DIR = "/opt/ml/processing/input/code"
ARGUMENTS = ["--alpha", "1", "--beta", "two words", "--empty", ""]


def job_name(what):
    return "proc-%s-%s" % (RUN, what)


# ---------------------------------------------------------------------------------------------
# Helpers


def request(name, mode, instance_count=1, arguments=None, inputs=None, outputs=None, environment=None,
            max_runtime=300, bucket=None):
    """CreateProcessingJob running jobs/processing/boto3_jobs.py MODE (staged from
    s3://<bucket>/code/) with the module's environment."""
    req = {
        "ProcessingJobName": name,
        "AppSpecification": {"ImageUri": IMAGE,
                             "ContainerEntrypoint": ["python3", CODE_DIR + "/boto3_jobs.py", mode]},
        "ProcessingResources": {"ClusterConfig": {"InstanceCount": instance_count, "InstanceType": "ml.m5.large",
                                                  "VolumeSizeInGB": 1}},
        "StoppingCondition": {"MaxRuntimeInSeconds": max_runtime},
        "RoleArn": ROLE,
        "ProcessingInputs": [s3_input("code", "s3://%s/code/boto3_jobs.py" % (bucket or BUCKET), CODE_DIR)],
    }
    if arguments is not None:
        req["AppSpecification"]["ContainerArguments"] = arguments
    if inputs:
        req["ProcessingInputs"] += inputs
    if outputs:
        req["ProcessingOutputConfig"] = {"Outputs": outputs}
    if environment:
        req["Environment"] = environment
    return req


def s3_input(name, uri, local_path, **extra):
    s3 = {"S3Uri": uri, "LocalPath": local_path, "S3DataType": "S3Prefix", "S3InputMode": "File"}
    s3.update(extra)
    return {"InputName": name, "S3Input": s3}


def s3_output(name, uri, local_path, mode="EndOfJob"):
    return {"OutputName": name, "S3Output": {"S3Uri": uri, "LocalPath": local_path, "S3UploadMode": mode}}


def wait_for(sm, name, statuses=TERMINAL, timeout=180, server=None):
    deadline = time.monotonic() + timeout
    while True:
        d = sm.describe_processing_job(ProcessingJobName=name)
        if d["ProcessingJobStatus"] in statuses:
            return d
        if time.monotonic() > deadline:
            raise AssertionError("processing job %s still %s after %ss (waiting for %s)%s" % (
                name, d["ProcessingJobStatus"], timeout, statuses,
                ("; server log tail:\n" + sdk_helpers.server_events(server)) if server else ""))
        time.sleep(0.25)


def error_of(call, **kwargs):
    with pytest.raises(ClientError) as e:
        call(**kwargs)
    return e.value.response["Error"]["Code"], e.value.response["Error"]["Message"]


def streams(logs, job):
    try:
        r = logs.describe_log_streams(logGroupName=LOG_GROUP, logStreamNamePrefix=job + "/")
    except ClientError as e:
        if e.response["Error"]["Code"] == "ResourceNotFoundException":
            return []
        raise
    return sorted(s["logStreamName"] for s in r["logStreams"])


def stream_lines(logs, stream):
    events, token = [], None
    while True:
        kwargs = dict(logGroupName=LOG_GROUP, logStreamName=stream, startFromHead=True)
        if token:
            kwargs["nextToken"] = token
        r = logs.get_log_events(**kwargs)
        if not r["events"]:
            return [e["message"] for e in events]
        events += r["events"]
        token = r["nextForwardToken"]


def job_lines(logs, job):
    return [line for stream in streams(logs, job) for line in stream_lines(logs, stream)]


def keys_under(s3, bucket, prefix):
    out, token = {}, None
    while True:
        kwargs = dict(Bucket=bucket, Prefix=prefix)
        if token:
            kwargs["ContinuationToken"] = token
        r = s3.list_objects_v2(**kwargs)
        for o in r.get("Contents", []):
            out[o["Key"][len(prefix):]] = o
        token = r.get("NextContinuationToken")
        if not token:
            return out


def get_json(s3, bucket, key):
    return json.loads(s3.get_object(Bucket=bucket, Key=key)["Body"].read())


def check_times(d):
    assert d["CreationTime"] <= d["ProcessingStartTime"] <= d["ProcessingEndTime"], d
    assert d["LastModifiedTime"] >= d["ProcessingEndTime"], d


# ---------------------------------------------------------------------------------------------
# The module's jobs


class ContinuousWatcher(threading.Thread):
    """Polls S3 for both hosts' seen.json of the SKLearnProcessor job and records, once both are
    there, the job's status at that moment; then puts the marker that lets the script end."""

    def __init__(self, sm, s3, bucket, prefix, job, marker_key, timeout=240):
        super().__init__(daemon=True)
        self.sm, self.s3, self.bucket, self.prefix = sm, s3, bucket, prefix
        self.job, self.marker_key, self.timeout = job, marker_key, timeout
        self.status_when_seen = None
        self.keys_when_seen = None
        self.error = None
        self.done = threading.Event()

    def run(self):
        try:
            deadline = time.monotonic() + self.timeout
            while time.monotonic() < deadline:
                keys = keys_under(self.s3, self.bucket, self.prefix)
                if {"algo-1/seen.json", "algo-2/seen.json"} <= set(keys):
                    self.keys_when_seen = sorted(keys)
                    self.status_when_seen = self.sm.describe_processing_job(
                        ProcessingJobName=self.job)["ProcessingJobStatus"]
                    break
                try:
                    status = self.sm.describe_processing_job(ProcessingJobName=self.job)["ProcessingJobStatus"]
                    if status in TERMINAL:
                        self.error = "job ended %s before both seen.json files were in S3 (%s)" % (
                            status, sorted(keys))
                        break
                except ClientError:
                    pass  # not created yet
                time.sleep(0.3)
            else:
                self.error = "both seen.json files not in S3 after %ss" % self.timeout
        except Exception as e:  # noqa: BLE001 (reported by the test)
            self.error = "watcher failed: %r" % e
        finally:
            self.s3.put_object(Bucket=self.bucket, Key=self.marker_key, Body=b"go")
            self.done.set()


class World:
    pass


@pytest.fixture(scope="module")
def world(module_kiln, sm, s3, tmp_path_factory):
    """Creates the bucket and data, submits every job, starts the SDK scenarios and the watcher;
    at the end stops whatever still runs."""
    w = World()
    w.server = module_kiln
    w.bucket = BUCKET
    s3.create_bucket(Bucket=w.bucket)
    with open(os.path.join(PROC_DIR, "boto3_jobs.py"), "rb") as f:
        s3.put_object(Bucket=w.bucket, Key="code/boto3_jobs.py", Body=f.read())
    w.shard_keys = ["shards/part-%02d.csv" % i for i in range(SHARDS)]
    for i, key in enumerate(w.shard_keys):
        s3.put_object(Bucket=w.bucket, Key=key, Body=("row,%d\n" % i).encode() * (i + 1))
    s3.put_object(Bucket=w.bucket, Key="gz/part-01.csv.gz", Body=th.gzip_bytes(b"row,1\n" * 2))
    s3.put_object(Bucket=w.bucket, Key="manifests/ok.manifest", Body=json.dumps(
        [{"prefix": "s3://%s/shards/" % w.bucket}, "part-02.csv", "part-03.csv"]).encode())
    w.names = {what: job_name(what) for what in ("stop", "queued", "ok", "fail", "failfile", "badmsg", "timeout",
                                                 "sklearn", "script", "framework")}

    # boto3 jobs, in the order they run: the stop job first (it runs until the stop test stops it).
    sm.create_processing_job(**request(w.names["stop"], "stop", max_runtime=600))
    # Two hosts do not fit beside the stop job: this one waits (and the jobs after it) until the
    # stop test stops it.
    sm.create_processing_job(**request(w.names["queued"], "ok", instance_count=2))
    sm.create_processing_job(**request(
        w.names["ok"], "ok", arguments=["first", "two words"], environment={"GREETING": "hi"},
        inputs=[s3_input("shards", "s3://%s/shards/part-00.csv" % w.bucket, "/opt/ml/processing/input/one"),
                s3_input("piped", "s3://%s/gz/part-01.csv.gz" % w.bucket, "/opt/ml/processing/input/piped",
                         S3InputMode="Pipe", S3CompressionType="Gzip"),
                s3_input("manifest", "s3://%s/manifests/ok.manifest" % w.bucket, "/opt/ml/processing/input/manifest",
                         S3DataType="ManifestFile")],
        outputs=[s3_output("result", "s3://%s/ok-output" % w.bucket, "/opt/ml/processing/output/result")]),
        Tags=[{"Key": "team", "Value": "ml"}])
    sm.create_processing_job(**request(w.names["fail"], "fail", outputs=[
        s3_output("partial", "s3://%s/fail-output/" % w.bucket, "/opt/ml/processing/output")]))
    sm.create_processing_job(**request(w.names["failfile"], "failfile"))
    sm.create_processing_job(**request(w.names["badmsg"], "badmsg"))
    sm.create_processing_job(**request(w.names["timeout"], "stop", max_runtime=3))

    # The SDK scenarios (their processes import the SDK first, so their jobs queue after these).
    w.sdk = None
    lib = sdk_helpers.sdk_lib_dir()
    workdir = str(tmp_path_factory.mktemp("sdk-processing"))
    if lib is not None:
        data_dir = os.path.join(workdir, "script-data")
        os.makedirs(data_dir)
        for name, text in {"a.csv": "a,1\n", "b.csv": "b,2\nb,3\n"}.items():
            with open(os.path.join(data_dir, name), "w") as f:
                f.write(text)
        runner = ProcessingScenarios(module_kiln, workdir, lib)
        w.sdk_args = {"bucket": w.bucket, "image": IMAGE, "data_dir": data_dir, "arguments": ARGUMENTS,
                      "sklearn_job": w.names["sklearn"], "script_job": w.names["script"],
                      "framework_job": w.names["framework"],
                      "input_uri": "s3://%s/shards" % w.bucket,
                      "output_uri": "s3://%s/sklearn-output" % w.bucket,
                      "marker_key": "markers/%s" % w.names["sklearn"]}
        runner.start("processors", w.sdk_args, timeout=240)
        w.sdk = runner
        w.watcher = ContinuousWatcher(sm, s3, w.bucket, "sklearn-output/", w.names["sklearn"],
                                      w.sdk_args["marker_key"])
        w.watcher.start()
    try:
        yield w
    finally:
        if w.sdk is not None:
            w.sdk.stop_all()
        for name in w.names.values():
            try:
                sm.stop_processing_job(ProcessingJobName=name)
            except ClientError:
                pass  # ended already, or never created
        for name in w.names.values():
            try:
                wait_for(sm, name, timeout=30)
            except (ClientError, AssertionError):
                pass


class ProcessingScenarios(sdk_helpers.ScenarioRunner):
    script = os.path.join(PROC_DIR, "sdk_processing.py")


def sdk_result(world, name):
    if world.sdk is None:
        pytest.skip("SageMaker Python SDK bundle not found (../shared/clients/sagemaker-python-sdk/lib beside the "
                    "repository, or $KILN_SAGEMAKER_SDK_LIB)")
    return world.sdk.result(name)


# ---------------------------------------------------------------------------------------------
# Validation (nothing runs)


def test_validation_errors_as_aws(world, sm):
    name = job_name("refused")
    good_input = s3_input("in", "s3://%s/shards/" % world.bucket, "/opt/ml/processing/input/in")

    # LocalPath outside /opt/ml/processing (input and output).
    code, message = error_of(sm.create_processing_job, **request(
        name, "ok", inputs=[s3_input("in", "s3://%s/shards/" % world.bucket, "/tmp/in")]))
    assert code == "ValidationException" and "/opt/ml/processing/" in message, message
    code, message = error_of(sm.create_processing_job, **request(
        name, "ok", outputs=[s3_output("out", "s3://%s/o" % world.bucket, "/opt/ml/output")]))
    assert code == "ValidationException" and "/opt/ml/processing/" in message, message
    code, message = error_of(sm.create_processing_job, **request(
        name, "ok", inputs=[s3_input("in", "s3://%s/shards/" % world.bucket, "/opt/ml/processing/../x")]))
    assert code == "ValidationException", message

    # More than 10 inputs: the code input and ten more (botocore checks no list maximum: the server must).
    eleven = [s3_input("in%d" % i, "s3://%s/shards/" % world.bucket, "/opt/ml/processing/input/%d" % i)
              for i in range(10)]
    code, message = error_of(sm.create_processing_job, **request(name, "ok", inputs=eleven))
    assert code == "ValidationException", message
    assert "10" in message, message

    # A name outside the model's pattern.
    code, message = error_of(sm.create_processing_job, **request(name.replace("-", "_"), "ok"))
    assert code == "ValidationException", message

    # Duplicate input names; a name that is taken.
    code, message = error_of(sm.create_processing_job, **request(name, "ok", inputs=[good_input, good_input]))
    assert code == "ValidationException", message
    code, message = error_of(sm.create_processing_job, **request(world.names["ok"], "ok"))
    assert code == "ResourceInUse", message

    # Unknown jobs.
    code, message = error_of(sm.describe_processing_job, ProcessingJobName=name)
    assert code == "ValidationException" and name in message, message
    code, message = error_of(sm.stop_processing_job, ProcessingJobName=name)
    assert code == "ValidationException", message

    # None of the refused requests left a job behind.
    listed = sm.list_processing_jobs(NameContains=name)["ProcessingJobSummaries"]
    assert listed == [], listed


# ---------------------------------------------------------------------------------------------
# boto3: Stop, Describe, logs, List


def test_stop_running_job_ends_stopped(world, sm, logs):
    name = world.names["stop"]
    th.wait_until(lambda: "stop-job: running" in job_lines(logs, name), timeout=90, what="%s to run" % name)
    d = sm.describe_processing_job(ProcessingJobName=name)
    assert d["ProcessingJobStatus"] == "InProgress", d
    assert "ProcessingStartTime" in d and "ProcessingEndTime" not in d, d

    # A job still waiting for capacity ends Stopped at once, never having started.
    queued = world.names["queued"]
    q = sm.describe_processing_job(ProcessingJobName=queued)
    assert q["ProcessingJobStatus"] == "InProgress" and "ProcessingStartTime" not in q, q
    sm.stop_processing_job(ProcessingJobName=queued)
    q = wait_for(sm, queued, timeout=30, server=world.server)
    assert q["ProcessingJobStatus"] == "Stopped", q
    assert "ProcessingStartTime" not in q and "FailureReason" not in q, q
    assert q["ProcessingEndTime"] >= q["CreationTime"], q
    assert streams(logs, queued) == [], streams(logs, queued)

    sm.stop_processing_job(ProcessingJobName=name)
    d = sm.describe_processing_job(ProcessingJobName=name)
    assert d["ProcessingJobStatus"] in ("Stopping", "Stopped"), d
    sm.stop_processing_job(ProcessingJobName=name)  # a second stop while stopping is accepted
    d = wait_for(sm, name, timeout=60, server=world.server)
    assert d["ProcessingJobStatus"] == "Stopped", d
    assert "FailureReason" not in d, d
    check_times(d)
    lines = job_lines(logs, name)
    assert "stop-job: got SIGTERM" in lines, lines
    code, message = error_of(sm.stop_processing_job, ProcessingJobName=name)
    assert code == "ValidationException" and "Stopped" in message, message


def test_completed_job_describe_output_and_exit_message(world, sm, s3):
    name = world.names["ok"]
    d = wait_for(sm, name, server=world.server)
    assert d["ProcessingJobStatus"] == "Completed", d
    assert d["ExitMessage"] == "processed 42 rows", d
    assert "FailureReason" not in d, d
    check_times(d)
    assert d["ProcessingJobArn"].endswith(":processing-job/" + name), d
    tags = sm.list_tags(ResourceArn=d["ProcessingJobArn"])["Tags"]
    assert tags == [{"Key": "team", "Value": "ml"}], tags
    assert d["AppSpecification"]["ImageUri"] == IMAGE, d
    assert d["AppSpecification"]["ContainerArguments"] == ["first", "two words"], d
    assert d["ProcessingResources"]["ClusterConfig"]["InstanceCount"] == 1, d
    assert d["Environment"] == {"GREETING": "hi"}, d
    assert d["RoleArn"] == ROLE and d["StoppingCondition"] == {"MaxRuntimeInSeconds": 300}, d
    inp = d["ProcessingInputs"][0]
    assert inp["S3Input"]["S3DataDistributionType"] == "FullyReplicated", inp  # AWS's default filled in
    out = d["ProcessingOutputConfig"]["Outputs"][0]
    assert out["S3Output"]["S3UploadMode"] == "EndOfJob", out
    # The output's files, individually, at S3Uri/<relative path>.
    keys = keys_under(s3, world.bucket, "ok-output/")
    assert sorted(keys) == ["manifest.json", "nested/answer.txt", "piped.txt"], keys
    body = s3.get_object(Bucket=world.bucket, Key="ok-output/nested/answer.txt")["Body"].read()
    assert body == b"42\n"
    # What the Pipe input's FIFO (<LocalPath>_0) streamed: the gzip object, decompressed.
    piped = s3.get_object(Bucket=world.bucket, Key="ok-output/piped.txt")["Body"].read()
    assert piped == b"row,1\n" * 2, piped
    # A ManifestFile input: the objects it names, by their keys relative to its prefix.
    manifest = get_json(s3, world.bucket, "ok-output/manifest.json")
    assert manifest == {"part-02.csv": "row,2\n" * 3, "part-03.csv": "row,3\n" * 4}, manifest


def test_failed_jobs_failure_reason(world, sm, s3):
    d = wait_for(sm, world.names["fail"], server=world.server)
    assert d["ProcessingJobStatus"] == "Failed", d
    assert d["FailureReason"] == "AlgorithmError: ValueError: column 'price' has negative values, exit code: 3", d
    check_times(d)
    # EndOfJob outputs are uploaded after a failure too (§17); an S3Uri ending in "/" adds no empty segment.
    keys = keys_under(s3, world.bucket, "fail-output/")
    assert sorted(keys) == ["partial.txt"], keys
    d = wait_for(sm, world.names["failfile"], server=world.server)
    assert d["ProcessingJobStatus"] == "Failed", d
    assert d["FailureReason"] == "ClientError: the input has no header row", d
    # A message that is not UTF-8 fails a job that exited 0, as the program's fault (§17).
    d = wait_for(sm, world.names["badmsg"], server=world.server)
    assert d["ProcessingJobStatus"] == "Failed", d
    assert d["FailureReason"].startswith("ClientError: ") and "UTF-8" in d["FailureReason"], d
    assert "ExitMessage" not in d, d


def test_max_runtime_stops_the_job(world, sm, logs):
    """MaxRuntimeInSeconds (3 s) stops the job as StopProcessingJob would (SIGTERM, then Stopped)."""
    name = world.names["timeout"]
    d = wait_for(sm, name, timeout=60, server=world.server)
    assert d["ProcessingJobStatus"] == "Stopped", d
    assert "FailureReason" not in d, d
    check_times(d)
    ran = (d["ProcessingEndTime"] - d["ProcessingStartTime"]).total_seconds()
    assert 3 <= ran < 12, d
    lines = job_lines(logs, name)
    assert lines[:1] == ["stop-job: running"] and "stop-job: got SIGTERM" in lines, lines


def test_logs_in_cloudwatch(world, sm, logs):
    name = world.names["ok"]
    d = wait_for(sm, name, server=world.server)
    names = streams(logs, name)
    assert len(names) == 1, names
    m = re.match(r"^%s/algo-1-(\d+)$" % re.escape(name), names[0])
    assert m, names
    start = d["ProcessingStartTime"].timestamp()
    assert abs(int(m.group(1)) - start) <= 2, (names, d["ProcessingStartTime"])
    lines = stream_lines(logs, names[0])
    assert 'ok-job: args=["first", "two words"]' in lines, lines
    assert "ok-job: greeting=hi" in lines, lines
    # The failing job's stderr is in its stream too.
    fail_lines = job_lines(logs, world.names["fail"])
    assert "ValueError: column 'price' has negative values" in fail_lines, fail_lines


def test_list_with_filters(world, sm):
    for what in ("ok", "fail", "failfile", "badmsg", "stop", "queued", "timeout"):
        wait_for(sm, world.names[what], server=world.server)
    prefix = "proc-%s-" % RUN
    every = sm.list_processing_jobs(NameContains=prefix, MaxResults=100)["ProcessingJobSummaries"]
    names = [s["ProcessingJobName"] for s in every]
    for what in ("ok", "fail", "failfile", "stop"):
        assert world.names[what] in names, names
    # Default order: CreationTime ascending.
    creation = [s["CreationTime"] for s in every]
    assert creation == sorted(creation), every

    failed = sm.list_processing_jobs(NameContains=prefix, StatusEquals="Failed")["ProcessingJobSummaries"]
    assert sorted(s["ProcessingJobName"] for s in failed) == sorted(
        world.names[w] for w in ("fail", "failfile", "badmsg")), failed
    for s in failed:
        assert s["ProcessingJobStatus"] == "Failed" and s["FailureReason"], s
        assert s["ProcessingJobArn"].endswith("/" + s["ProcessingJobName"]) and "ProcessingEndTime" in s, s
    completed = sm.list_processing_jobs(NameContains=world.names["ok"], StatusEquals="Completed")
    [summary] = completed["ProcessingJobSummaries"]
    assert summary["ExitMessage"] == "processed 42 rows", summary
    stopped = sm.list_processing_jobs(NameContains=prefix, StatusEquals="Stopped")["ProcessingJobSummaries"]
    assert sorted(s["ProcessingJobName"] for s in stopped) == sorted(
        world.names[w] for w in ("stop", "queued", "timeout")), stopped

    # Sorted by name, descending, one page at a time.
    paged, token = [], None
    while True:
        kwargs = dict(NameContains=prefix, SortBy="Name", SortOrder="Descending", MaxResults=1)
        if token:
            kwargs["NextToken"] = token
        r = sm.list_processing_jobs(**kwargs)
        assert len(r["ProcessingJobSummaries"]) <= 1, r
        paged += [s["ProcessingJobName"] for s in r["ProcessingJobSummaries"]]
        token = r.get("NextToken")
        if not token:
            break
    assert paged == sorted(paged, reverse=True), paged
    assert set(paged) >= {world.names[w] for w in ("ok", "fail", "stop")}, paged

    # Time windows (botocore 1.26 sends whole seconds, so the bounds stay seconds away from the jobs).
    first = min(creation) - datetime.timedelta(seconds=2)
    later = datetime.datetime.now(datetime.timezone.utc) + datetime.timedelta(seconds=60)

    def listed(**kwargs):
        r = sm.list_processing_jobs(NameContains=prefix, MaxResults=100, **kwargs)
        return sorted(s["ProcessingJobName"] for s in r["ProcessingJobSummaries"])

    mine = {world.names[what] for what in ("ok", "fail", "failfile", "stop")}  # the SDK's may come meanwhile
    assert mine <= set(listed(CreationTimeAfter=first))
    assert mine <= set(listed(CreationTimeBefore=later))
    assert mine <= set(listed(LastModifiedTimeAfter=first, LastModifiedTimeBefore=later))
    assert listed(CreationTimeAfter=later) == []
    assert listed(CreationTimeBefore=first) == []
    assert listed(LastModifiedTimeBefore=first) == []


def test_aws_cli_describe(world, sm, tmp_path):
    name = world.names["ok"]
    wait_for(sm, name, server=world.server)
    run = th.aws_runner(world.server, str(tmp_path / "awshome"))
    if run is None:
        pytest.skip("no AWS CLI found (/usr/bin/aws or aws on PATH)")
    p = run("sagemaker", "describe-processing-job", "--processing-job-name", name, "--output", "json")
    d = json.loads(p.stdout)
    assert d["ProcessingJobName"] == name and d["ProcessingJobStatus"] == "Completed", d
    assert d["ExitMessage"] == "processed 42 rows", d
    assert d["ProcessingJobArn"].endswith(":processing-job/" + name), d
    p = run("sagemaker", "describe-processing-job", "--processing-job-name", job_name("nope"), check=False)
    assert p.returncode != 0 and "ValidationException" in p.stderr, (p.returncode, p.stderr)


def test_job_survives_server_kill_9(kiln_factory):
    """A server of its own (host network, so its networks cannot meet the module server's) is
    killed -9 while a job runs; after the restart the job is adopted, not run again: every tick
    once in its stream, every Continuous file in S3, Completed with its ExitMessage."""
    config = dict(KILN_CONFIG, network={"mode": "host"})
    srv = kiln_factory("restart", config=config)
    sm, s3, logs = srv.client("sagemaker"), srv.client("s3"), srv.client("logs")
    bucket = "proc-restart-%s" % RUN
    s3.create_bucket(Bucket=bucket)
    with open(os.path.join(PROC_DIR, "boto3_jobs.py"), "rb") as f:
        s3.put_object(Bucket=bucket, Key="code/boto3_jobs.py", Body=f.read())
    name = job_name("survivor")
    ticks = 6
    sm.create_processing_job(**request(
        name, "ticks", arguments=[str(ticks)], bucket=bucket,
        outputs=[s3_output("ticks", "s3://%s/ticks" % bucket, "/opt/ml/processing/output/ticks", "Continuous")]))
    th.wait_until(lambda: "tick 1" in job_lines(logs, name), timeout=60, what="two ticks")
    srv.kill()
    killed_at = time.time()
    time.sleep(1.5)  # the job ticks on while no server runs
    srv.start()
    sm, s3, logs = srv.client("sagemaker"), srv.client("s3"), srv.client("logs")
    d = wait_for(sm, name, timeout=60, server=srv)
    assert d["ProcessingJobStatus"] == "Completed", d
    assert d["ExitMessage"] == "ticked %d times" % ticks, d
    assert d["ProcessingStartTime"].timestamp() < killed_at < d["ProcessingEndTime"].timestamp(), d
    lines = [line for line in job_lines(logs, name) if line.startswith("tick ")]
    assert lines == ["tick %d" % i for i in range(ticks)], lines
    assert len(streams(logs, name)) == 1, streams(logs, name)
    keys = keys_under(s3, bucket, "ticks/")
    assert sorted(keys) == sorted("tick-%d.txt" % i for i in range(ticks)), keys


# ---------------------------------------------------------------------------------------------
# The SageMaker Python SDK


def test_sdk_sklearn_processor_sharded_input_continuous_output(world, sm, s3, logs):
    result = sdk_result(world, "processors")["sklearn"]
    name = world.names["sklearn"]
    d = result["describe"]
    assert d["ProcessingJobStatus"] == "Completed", d
    assert "sagemaker-scikit-learn" in result["image_uri"], result["image_uri"]
    app = d["AppSpecification"]
    assert app["ContainerEntrypoint"] == ["python3", "/opt/ml/processing/input/code/shard_continuous.py"], app
    assert app["ContainerArguments"] == ["--shards", "7"], app

    # Continuous: both hosts' first files were in S3 while the job was still running.
    world.watcher.done.wait(30)
    assert world.watcher.error is None, world.watcher.error
    assert world.watcher.status_when_seen == "InProgress", world.watcher.status_when_seen
    assert "algo-1/final.json" not in world.watcher.keys_when_seen, world.watcher.keys_when_seen

    # Every file at the end (the final pass after exit).
    keys = keys_under(s3, world.bucket, "sklearn-output/")
    assert sorted(keys) == ["algo-1/final.json", "algo-1/seen.json", "algo-2/final.json", "algo-2/seen.json"], keys
    seen = {h: get_json(s3, world.bucket, "sklearn-output/%s/seen.json" % h) for h in ("algo-1", "algo-2")}
    for h, report in seen.items():
        assert report["host"] == h and report["argv"] == ["--shards", "7"] and report["sklearn"], report
        final = get_json(s3, world.bucket, "sklearn-output/%s/final.json" % h)
        assert final["count"] == len(report["seen"]), final

    # ShardedByS3Key: disjoint shares, together every object, object i on host i mod 2.
    shares = {h: set(report["seen"]) for h, report in seen.items()}
    assert not shares["algo-1"] & shares["algo-2"], shares
    every = {k.split("/", 1)[1] for k in world.shard_keys}
    assert shares["algo-1"] | shares["algo-2"] == every, shares
    assert shares["algo-1"] == {k.split("/", 1)[1] for k in world.shard_keys[0::2]}, shares
    assert shares["algo-2"] == {k.split("/", 1)[1] for k in world.shard_keys[1::2]}, shares
    for h, report in seen.items():
        for rel, digest in report["seen"].items():
            body = s3.get_object(Bucket=world.bucket, Key="shards/" + rel)["Body"].read()
            assert th.sha256(body) == digest, (h, rel)

    # run(logs=True) printed both hosts' lines; the streams are algo-1 and algo-2.
    out = world.sdk.scenarios["processors"].output()
    for h in ("algo-1", "algo-2"):
        assert "shard_continuous: %s saw the marker, done" % h in out, out[-3000:]
    names = streams(logs, name)
    assert [re.sub(r"-\d+$", "", n) for n in names] == [name + "/algo-1", name + "/algo-2"], names


def test_sdk_script_processor_layout_and_config(world, sm, s3):
    result = sdk_result(world, "processors")["script"]
    name = world.names["script"]
    d = result["describe"]
    assert d["ProcessingJobStatus"] == "Completed", d
    app = d["AppSpecification"]
    assert app["ImageUri"] == IMAGE, app
    assert app["ContainerEntrypoint"] == ["python3", "/opt/ml/processing/input/code/layout_probe.py"], app
    assert app["ContainerArguments"] == ARGUMENTS, app

    # The SDK's default destination for an output without one.
    [destination] = result["outputs"]
    assert destination == "s3://%s/%s/output/layout" % (world.bucket, name), destination
    bucket, prefix = th.split_s3_uri(destination)
    keys = keys_under(s3, bucket, prefix + "/")
    assert sorted(keys) == ["algo-1.json", "algo-2.json"], keys
    reports = {h: get_json(s3, bucket, "%s/%s.json" % (prefix, h)) for h in ("algo-1", "algo-2")}

    for host, r in reports.items():
        assert r["host"] == host and r["hostname"] == host, r["hostname"]
        # Interpreter of the environments entry, the script, the arguments verbatim.
        assert r["argv"] == ["/opt/ml/processing/input/code/layout_probe.py"] + ARGUMENTS, r["argv"]
        assert os.path.realpath(r["executable"]) == os.path.realpath("/usr/bin/python3"), r["executable"]
        env = r["env"]
        assert env.get("KILN_PROCESSING_ENV") == "kiln-proc", env
        assert env.get("PROBE_GREETING") == "hello processing", env
        assert env.get("AWS_REGION") == "us-east-1" and env.get("AWS_DEFAULT_REGION") == "us-east-1", env
        assert env.get("AWS_ACCESS_KEY_ID") and env.get("AWS_SECRET_ACCESS_KEY") == "<set>", env
        assert not [k for k in env if k.startswith(("TRAINING_JOB", "SM_"))], sorted(env)

        # The layout: config files, code and data inputs, output directory.
        tree = set(r["tree"])
        for path in ("/opt/ml/config/processingjobconfig.json", "/opt/ml/config/resourceconfig.json",
                     "/opt/ml/processing/input/code/layout_probe.py", "/opt/ml/processing/input/data/a.csv",
                     "/opt/ml/processing/input/data/b.csv", "/opt/ml/processing/output/layout/"):
            assert path in tree, (path, sorted(tree))
        assert r["inputs"] == {"a.csv": "a,1\n", "b.csv": "b,2\nb,3\n"}, r["inputs"]  # FullyReplicated

        resource = json.loads(r["resourceconfig_text"])
        assert resource == {"current_host": host, "hosts": ["algo-1", "algo-2"]}, resource
        config = json.loads(r["processingjobconfig_text"])
        assert config["ProcessingJobArn"] == d["ProcessingJobArn"], config
        assert config["ProcessingJobName"] == name, config
        assert config["AppSpecification"] == app, config
        assert config["Environment"] == {"PROBE_GREETING": "hello processing"}, config
        assert config["ProcessingResources"] == d["ProcessingResources"], config
        assert config["ProcessingResources"]["ClusterConfig"]["InstanceCount"] == 2, config
        assert config["RoleArn"] == sdk_helpers.ROLE_ARN, config
        assert config["StoppingCondition"] == {"MaxRuntimeInSeconds": 300}, config
        assert config["ProcessingInputs"] == d["ProcessingInputs"], config
        assert sorted(i["InputName"] for i in config["ProcessingInputs"]) == ["code", "data"], config
        assert config["ProcessingOutputConfig"] == d["ProcessingOutputConfig"], config
        # Members the request did not give are explicit nulls (§17).
        assert "NetworkConfig" in config and config["NetworkConfig"] is None, config

        # Every host resolves every host.
        assert sorted(r["peers"]) == ["algo-1", "algo-2"], r["peers"]
        assert not [v for v in r["peers"].values() if v.startswith("error")], r["peers"]
    assert reports["algo-1"]["processingjobconfig_text"] == reports["algo-2"]["processingjobconfig_text"]


def test_sdk_framework_processor_source_dir(world, sm, s3):
    """PyTorchProcessor (a FrameworkProcessor): the SDK's runproc.sh runs under /bin/bash, unpacks
    sourcedir.tar.gz and calls `python process.py ARGS` — `python` must be the environment's
    interpreter, as it is in the framework image."""
    result = sdk_result(world, "processors")["framework"]
    d = result["describe"]
    assert d["ProcessingJobStatus"] == "Completed", d
    app = d["AppSpecification"]
    assert app["ContainerEntrypoint"][0] == "/bin/bash" and app["ContainerEntrypoint"][1].endswith("runproc.sh"), app
    assert "pytorch-training" in app["ImageUri"], app
    [destination] = result["outputs"]
    bucket, prefix = th.split_s3_uri(destination)
    report = get_json(s3, bucket, prefix + "/report.json")
    assert report["argv"] == ["process.py", "--mode", "framework"], report
    assert report["cwd"] == "/opt/ml/processing/input/code", report
    assert report["helper"] == "helper imported from the source_dir", report
    assert os.path.realpath(report["executable"]) == os.path.realpath("/usr/bin/python3"), report
