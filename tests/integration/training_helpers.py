"""Helpers for the training-job integration tests (test_training_*.py): request builders, polling,
artifact download, log collection, and the user programs under jobs/.

Everything here is written against spec/training-contract.md and spec/control-plane-api.md; the
server is only ever reached through boto3 / raw signed JSON requests.
"""

import gzip
import hashlib
import io
import json
import os
import tarfile
import time
import uuid

import pytest
from botocore.exceptions import ClientError

HERE = os.path.dirname(os.path.abspath(__file__))
JOBS_DIR = os.path.join(HERE, "jobs")

ROLE_ARN = "arn:aws:iam::000000000000:role/KilnTrainingTest"
PYTORCH_IMAGE = "763104351884.dkr.ecr.us-east-1.amazonaws.com/pytorch-training:2.1.0-cpu-py310"
LOG_GROUP = "/aws/sagemaker/TrainingJobs"
TERMINAL = ("Completed", "Failed", "Stopped")

# Server configurations. The build host has 2 CPUs; "shrink" lets ordinary instance types run there.
SHRINK_CONFIG = {
    "scheduler": {"policy": "shrink", "allow_cpu_fallback": True},
    "training": {"stop_grace_seconds": 10},
}


def probe_image():
    """A `local:` image running jobs/probe.py (`/abs/path train`)."""
    return "local:" + os.path.join(JOBS_DIR, "probe.py")


def unique_name(prefix):
    name = "%s-%s" % (prefix, uuid.uuid4().hex[:10])
    assert len(name) <= 63
    return name


def training_request(name, bucket, image=None, hyperparameters=None, channels=None, instance_type="ml.m5.large",
                     input_mode="File", max_runtime=600, **extra):
    """A complete CreateTrainingJob request (botocore member names) for the probe or any image."""
    req = {
        "TrainingJobName": name,
        "AlgorithmSpecification": {"TrainingImage": image or probe_image(), "TrainingInputMode": input_mode},
        "RoleArn": ROLE_ARN,
        "OutputDataConfig": {"S3OutputPath": "s3://%s/output" % bucket},
        "ResourceConfig": {"InstanceType": instance_type, "InstanceCount": 1, "VolumeSizeInGB": 1},
        "StoppingCondition": {"MaxRuntimeInSeconds": max_runtime},
    }
    if hyperparameters:
        req["HyperParameters"] = dict(hyperparameters)
    if channels:
        req["InputDataConfig"] = list(channels)
    req.update(extra)
    return req


def s3_channel(name, uri, data_type="S3Prefix", **extra):
    ch = {"ChannelName": name,
          "DataSource": {"S3DataSource": {"S3DataType": data_type, "S3Uri": uri,
                                          "S3DataDistributionType": "FullyReplicated"}}}
    ch.update(extra)
    return ch


# ---------------------------------------------------------------------------------------------
# Polling


class Timeline:
    """What polling Describe observed: every (primary, secondary, message) seen, in order."""

    def __init__(self):
        self.seen = []

    def add(self, d):
        item = (d["TrainingJobStatus"], d.get("SecondaryStatus"), _last_message(d))
        if not self.seen or self.seen[-1] != item:
            self.seen.append(item)

    def primaries(self):
        return _dedup([p for p, _, _ in self.seen])

    def secondaries(self):
        return _dedup([s for _, s, _ in self.seen])


def _dedup(xs):
    out = []
    for x in xs:
        if not out or out[-1] != x:
            out.append(x)
    return out


def _last_message(d):
    tr = d.get("SecondaryStatusTransitions") or []
    return tr[-1].get("StatusMessage") if tr else None


def wait_for_status(sm, name, statuses=TERMINAL, timeout=180, poll=0.25, timeline=None, server=None):
    """Polls DescribeTrainingJob until TrainingJobStatus is in `statuses`; returns the Describe."""
    if isinstance(statuses, str):
        statuses = (statuses,)
    deadline = time.monotonic() + timeout
    last = None
    while True:
        last = sm.describe_training_job(TrainingJobName=name)
        if timeline is not None:
            timeline.add(last)
        if last["TrainingJobStatus"] in statuses:
            return last
        if time.monotonic() > deadline:
            raise AssertionError("job %s still %s/%s after %ss (waiting for %s)%s" % (
                name, last["TrainingJobStatus"], last.get("SecondaryStatus"), timeout, statuses,
                ("; server log tail:\n" + server.log_tail(40)) if server is not None else ""))
        time.sleep(poll)


def wait_for_secondary(sm, name, secondaries, timeout=120, poll=0.2, timeline=None):
    if isinstance(secondaries, str):
        secondaries = (secondaries,)
    deadline = time.monotonic() + timeout
    while True:
        d = sm.describe_training_job(TrainingJobName=name)
        if timeline is not None:
            timeline.add(d)
        if d.get("SecondaryStatus") in secondaries:
            return d
        if d["TrainingJobStatus"] in TERMINAL:
            raise AssertionError("job %s ended %s/%s (%s) before reaching %s" % (
                name, d["TrainingJobStatus"], d.get("SecondaryStatus"), d.get("FailureReason"), secondaries))
        if time.monotonic() > deadline:
            raise AssertionError("job %s still %s after %ss (waiting for %s)" % (
                name, d.get("SecondaryStatus"), timeout, secondaries))
        time.sleep(poll)


def wait_until(predicate, timeout=60, poll=0.25, what="condition"):
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError("timed out after %ss waiting for %s" % (timeout, what))
        time.sleep(poll)


def describe_error(sm, name):
    try:
        sm.describe_training_job(TrainingJobName=name)
    except ClientError as e:
        return e.response["Error"]["Code"], e.response["Error"]["Message"]
    return None


# ---------------------------------------------------------------------------------------------
# S3 artifacts


def split_s3_uri(uri):
    assert uri.startswith("s3://"), uri
    bucket, _, key = uri[5:].partition("/")
    return bucket, key


def get_s3(s3, uri):
    bucket, key = split_s3_uri(uri)
    return s3.get_object(Bucket=bucket, Key=key)["Body"].read()


def untar(data):
    """{member path (./ stripped): bytes} of the regular files in a (gzip) tarball."""
    out = {}
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:*") as tf:
        for m in tf.getmembers():
            if m.isfile():
                name = m.name[2:] if m.name.startswith("./") else m.name
                out[name] = tf.extractfile(m).read()
    return out


def model_files(s3, describe):
    """The files in the job's model.tar.gz (ModelArtifacts.S3ModelArtifacts)."""
    uri = describe["ModelArtifacts"]["S3ModelArtifacts"]
    data = get_s3(s3, uri)
    assert data[:2] == b"\x1f\x8b", "model.tar.gz is not gzip: %r" % data[:16]
    return untar(data)


def model_report(s3, describe):
    """The probe's report.json out of model.tar.gz."""
    files = model_files(s3, describe)
    assert "report.json" in files, "probe report missing from model.tar.gz: %s" % sorted(files)
    return json.loads(files["report.json"])


def make_tar_gz(files):
    """files: {relative path: bytes or str} -> gzip tarball bytes."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tf:
        for rel, data in sorted(files.items()):
            if isinstance(data, str):
                data = data.encode()
            info = tarfile.TarInfo(rel)
            info.size = len(data)
            info.mode = 0o644
            info.mtime = int(time.time())
            tf.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def gzip_bytes(data):
    return gzip.compress(data)


def sha256(data):
    return hashlib.sha256(data).hexdigest()


# ---------------------------------------------------------------------------------------------
# Logs


def job_streams(logs, job):
    """Stream names of the job (prefix `<job>/`), ordered by name; [] before the group exists."""
    names, token = [], None
    while True:
        kwargs = dict(logGroupName=LOG_GROUP, logStreamNamePrefix=job + "/")
        if token:
            kwargs["nextToken"] = token
        try:
            r = logs.describe_log_streams(**kwargs)
        except ClientError as e:
            if e.response["Error"]["Code"] == "ResourceNotFoundException":
                return []
            raise
        names += [s["logStreamName"] for s in r["logStreams"]]
        token = r.get("nextToken")
        if not token:
            return names


def stream_events(logs, stream, limit=None, max_pages=10000):
    """Every event of one stream, paged forward from the head until the token repeats."""
    events, token = [], None
    for _ in range(max_pages):
        kwargs = dict(logGroupName=LOG_GROUP, logStreamName=stream, startFromHead=True)
        if limit:
            kwargs["limit"] = limit
        if token:
            kwargs["nextToken"] = token
        r = logs.get_log_events(**kwargs)
        if not r["events"]:
            return events
        events += r["events"]
        token = r["nextForwardToken"]
    raise AssertionError("stream %s: no end after %d pages" % (stream, max_pages))


def job_log_lines(logs, job):
    """All messages of all the job's streams (streams in name order, events in stream order)."""
    lines = []
    for stream in job_streams(logs, job):
        lines += [e["message"] for e in stream_events(logs, stream)]
    return lines


def wait_for_log_line(logs, job, predicate, timeout=60):
    def found():
        return [line for line in job_log_lines(logs, job) if predicate(line)]
    return wait_until(found, timeout=timeout, what="log line in %s" % job)


# ---------------------------------------------------------------------------------------------
# AWS CLI against any server


def aws_runner(server, home):
    import subprocess
    import kiln_harness as kh
    cli = kh.aws_cli()
    if not cli:
        return None
    os.makedirs(home, exist_ok=True)
    env = server.aws_env(home)

    def run(*args, check=True, timeout=300):
        cmd = [cli, "--endpoint-url", server.endpoint, "--no-cli-pager"] + [str(a) for a in args]
        p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)
        if check and p.returncode != 0:
            raise AssertionError("%s failed (%d)\nstdout:\n%s\nstderr:\n%s"
                                 % (" ".join(cmd), p.returncode, p.stdout, p.stderr))
        return p

    return run


def main_statuses(transitions):
    """The SecondaryStatusTransitions statuses with a capacity wait folded away: `Pending` may only
    follow the first `Starting`; the server's `Starting → Pending → Starting` (a second Starting
    once capacity is granted, not in the §9.1 state machine) is tolerated and folded too."""
    statuses = [t["Status"] for t in transitions]
    if "Pending" in statuses:
        i = statuses.index("Pending")
        assert i == 1 and statuses[0] == "Starting", statuses
        del statuses[i]
        if i < len(statuses) and statuses[i] == "Starting":
            del statuses[i]
    return statuses


# Module-scoped clients of the module's own server (conftest.py `module_kiln`). Test modules
# import these by name: `from training_helpers import sm, s3, logs  # noqa: F401 (fixtures)`.
@pytest.fixture(scope="module")
def sm(module_kiln):
    return module_kiln.client("sagemaker")


@pytest.fixture(scope="module")
def s3(module_kiln):
    return module_kiln.client("s3")


@pytest.fixture(scope="module")
def logs(module_kiln):
    return module_kiln.client("logs")
