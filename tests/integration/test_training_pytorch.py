"""A real PyTorch script-mode training job end to end (training-contract.md §1, §4, §7, §8, §14-16):
sourcedir.tar.gz + a CSV `train` channel, metrics from the log, model.tar.gz that torch can load,
the secondary-status sequence, the Logs API paging over the job's stream, the same job through
the AWS CLI, and `kiln logs`."""

import io
import json
import os
import random
import re
import subprocess

import pytest

import kiln_harness as kh
import training_helpers as th
from training_helpers import sm, s3, logs  # noqa: F401 (module-scoped client fixtures)

KILN_CONFIG = th.SHRINK_CONFIG
EPOCHS = 8
TRUE_W = (2.0, -3.0)
TRUE_B = 1.0
LOSS_RE = re.compile(r"^epoch=(\d+) loss=([0-9.]+)$")


@pytest.fixture(scope="module")
def setup(module_kiln, s3):
    """Bucket with the data set (two CSV objects under train/) and sourcedir.tar.gz."""
    bucket = th.unique_name("pt")
    s3.create_bucket(Bucket=bucket)
    rnd = random.Random(7)
    for part in range(2):
        rows = []
        for _ in range(40):
            x1, x2 = rnd.uniform(-1, 1), rnd.uniform(-1, 1)
            y = TRUE_W[0] * x1 + TRUE_W[1] * x2 + TRUE_B + rnd.gauss(0, 0.01)
            rows.append("%.6f,%.6f,%.6f" % (y, x1, x2))
        s3.put_object(Bucket=bucket, Key="data/train/part-%d.csv" % part, Body=("\n".join(rows) + "\n").encode())
    with open(os.path.join(th.JOBS_DIR, "pytorch_linear", "train.py"), "rb") as f:
        source = th.make_tar_gz({"train.py": f.read()})
    s3.put_object(Bucket=bucket, Key="code/sourcedir.tar.gz", Body=source)
    return bucket


def pytorch_request(name, bucket):
    hps = {
        "epochs": str(EPOCHS),
        "lr": "0.1",
        "sagemaker_program": json.dumps("train.py"),
        "sagemaker_submit_directory": json.dumps("s3://%s/code/sourcedir.tar.gz" % bucket),
        "sagemaker_container_log_level": "20",
        "sagemaker_job_name": json.dumps(name),
        "sagemaker_region": json.dumps("us-east-1"),
    }
    req = th.training_request(
        name, bucket, image=th.PYTORCH_IMAGE, hyperparameters=hps, instance_type="ml.m5.xlarge",
        channels=[th.s3_channel("train", "s3://%s/data/train/" % bucket, ContentType="text/csv")])
    req["AlgorithmSpecification"]["MetricDefinitions"] = [{"Name": "loss", "Regex": "loss=([0-9.]+)"}]
    return req


@pytest.fixture(scope="module")
def jobs(module_kiln, sm, setup, tmp_path_factory):
    """Both jobs are submitted up front so that they run while the other test waits."""
    boto_name = th.unique_name("pt-boto3")
    cli_name = th.unique_name("pt-cli")
    r = sm.create_training_job(**pytorch_request(boto_name, setup))
    assert r["TrainingJobArn"] == "arn:aws:sagemaker:us-east-1:%s:training-job/%s" % (
        module_kiln.account_id or "000000000000", boto_name)
    cli = None
    cli_out = None
    home = str(tmp_path_factory.mktemp("awshome"))
    aws = th.aws_runner(module_kiln, home)
    if aws is not None:
        path = os.path.join(home, "req.json")
        with open(path, "w") as f:
            json.dump(pytorch_request(cli_name, setup), f)
        cli_out = aws("sagemaker", "create-training-job", "--cli-input-json", "file://" + path, "--output", "json")
        cli = aws
    return {"boto3": boto_name, "cli": cli_name, "aws": cli, "cli_create": cli_out}


EXPECTED = ["Starting", "Downloading", "Training", "Uploading", "Completed"]


def _statuses(tr):
    return th.main_statuses(tr)


def _check_transitions(d):
    tr = d["SecondaryStatusTransitions"]
    assert _statuses(tr) == EXPECTED, tr
    for i, t in enumerate(tr):
        assert isinstance(t.get("StatusMessage"), str) and t["StatusMessage"], t
        if i + 1 < len(tr):
            assert t["EndTime"] >= t["StartTime"], t
            assert tr[i + 1]["StartTime"] >= t["StartTime"], tr
    # Contract §14 says the last entry has no EndTime; a terminal one carrying EndTime == StartTime
    # is tolerated here (reported to the lead as a spec question).
    assert "EndTime" not in tr[-1] or tr[-1]["EndTime"] >= tr[-1]["StartTime"], tr[-1]
    assert tr[-1]["StatusMessage"] == "Training job completed", tr[-1]


def _loss_lines(lines):
    out = []
    for line in lines:
        m = LOSS_RE.match(line.strip())
        if m:
            out.append((int(m.group(1)), m.group(2)))
    return out


def test_pytorch_script_mode_job(module_kiln, sm, s3, logs, setup, jobs):
    import torch

    name = jobs["boto3"]
    timeline = th.Timeline()
    d = th.wait_for_status(sm, name, timeout=300, timeline=timeline, server=module_kiln)
    assert d["TrainingJobStatus"] == "Completed", (d.get("FailureReason"), th.job_log_lines(logs, name)[-30:])
    assert d["SecondaryStatus"] == "Completed"
    assert "FailureReason" not in d
    # Every status we saw while polling is in the final transition list, in the same order.
    seen = [s for s in timeline.secondaries() if s]
    listed = [t["Status"] for t in d["SecondaryStatusTransitions"]]
    assert [s for s in listed if s in seen] == seen, (seen, listed)
    _check_transitions(d)

    assert d["CreationTime"] <= d["TrainingStartTime"] <= d["TrainingEndTime"] <= d["LastModifiedTime"]
    assert d["TrainingTimeInSeconds"] >= 1 and d["BillableTimeInSeconds"] >= 1, d
    assert d["HyperParameters"]["epochs"] == str(EPOCHS)
    assert d["HyperParameters"]["sagemaker_program"] == '"train.py"'
    assert d["AlgorithmSpecification"]["TrainingImage"] == th.PYTORCH_IMAGE
    assert d["ResourceConfig"]["InstanceType"] == "ml.m5.xlarge"
    assert d["InputDataConfig"][0]["ChannelName"] == "train"
    assert d["RoleArn"] == th.ROLE_ARN
    assert d["StoppingCondition"]["MaxRuntimeInSeconds"] == 600

    # Model: <S3OutputPath>/<job>/output/model.tar.gz holding model.pth that torch loads.
    uri = d["ModelArtifacts"]["S3ModelArtifacts"]
    assert uri == "s3://%s/output/%s/output/model.tar.gz" % (setup, name)
    files = th.model_files(s3, d)
    assert "model.pth" in files, sorted(files)
    state = torch.load(io.BytesIO(files["model.pth"]))
    assert sorted(state) == ["bias", "weight"]
    assert tuple(state["weight"].shape) == (1, 2) and tuple(state["bias"].shape) == (1,)
    assert abs(state["weight"][0, 0].item() - TRUE_W[0]) < 0.1, state
    assert abs(state["weight"][0, 1].item() - TRUE_W[1]) < 0.1, state
    assert abs(state["bias"][0].item() - TRUE_B) < 0.1, state

    out = th.untar(th.get_s3(s3, "s3://%s/output/%s/output/output.tar.gz" % (setup, name)))
    losses = json.loads(out["losses.json"])
    assert len(losses["losses"]) == EPOCHS
    assert losses["hosts"] == ["algo-1"]

    # Logs: one stream <job>/algo-1-<epoch seconds>, the epoch lines in order.
    streams = th.job_streams(logs, name)
    assert len(streams) == 1 and re.fullmatch(re.escape(name) + r"/algo-1-\d{10}", streams[0]), streams
    lines = th.job_log_lines(logs, name)
    printed = _loss_lines(lines)
    assert [e for e, _ in printed] == list(range(EPOCHS)), lines
    assert float(printed[-1][1]) < float(printed[0][1])
    assert float(printed[-1][1]) == pytest.approx(losses["losses"][-1], abs=1e-6)

    # FinalMetricDataList: the last value printed.
    metrics = {m["MetricName"]: m for m in d.get("FinalMetricDataList", [])}
    assert "loss" in metrics, d.get("FinalMetricDataList")
    assert metrics["loss"]["Value"] == pytest.approx(float(printed[-1][1]), rel=1e-5, abs=1e-6)
    assert metrics["loss"]["Timestamp"] >= d["TrainingStartTime"]


def test_log_paging_matches_aws(module_kiln, sm, logs, jobs):
    name = jobs["boto3"]
    th.wait_for_status(sm, name, timeout=300, server=module_kiln)
    stream = th.job_streams(logs, name)[0]
    everything = logs.get_log_events(logGroupName=th.LOG_GROUP, logStreamName=stream, startFromHead=True)["events"]
    assert len(everything) >= EPOCHS + 1
    messages = [e["message"] for e in everything]
    assert all(not m.endswith("\n") for m in messages)
    ts = [e["timestamp"] for e in everything]
    assert ts == sorted(ts)

    # Forward, two at a time, until the token repeats on an empty page.
    got, token, pages = [], None, 0
    while True:
        kwargs = dict(logGroupName=th.LOG_GROUP, logStreamName=stream, limit=2, startFromHead=True)
        if token:
            kwargs["nextToken"] = token
        r = logs.get_log_events(**kwargs)
        assert r["nextForwardToken"].startswith("f/") and r["nextBackwardToken"].startswith("b/"), r
        pages += 1
        assert pages <= len(messages) + 2
        if not r["events"]:
            assert r["nextForwardToken"] == token, "the end of the stream must repeat the token sent"
            break
        assert len(r["events"]) <= 2
        got += [e["message"] for e in r["events"]]
        token = r["nextForwardToken"]
    assert got == messages
    # Polling again at the end still repeats the token.
    r = logs.get_log_events(logGroupName=th.LOG_GROUP, logStreamName=stream, nextToken=token)
    assert r["events"] == [] and r["nextForwardToken"] == token

    # Backward from the newest page.
    r = logs.get_log_events(logGroupName=th.LOG_GROUP, logStreamName=stream, limit=2)
    pages_back = [[e["message"] for e in r["events"]]]
    assert pages_back[0] == messages[-2:]
    token = r["nextBackwardToken"]
    for _ in range(len(messages) + 2):
        r = logs.get_log_events(logGroupName=th.LOG_GROUP, logStreamName=stream, limit=2, nextToken=token)
        if not r["events"]:
            break
        pages_back.append([e["message"] for e in r["events"]])
        token = r["nextBackwardToken"]
    else:
        raise AssertionError("backward paging never reached the head")
    assert [m for page in reversed(pages_back) for m in page] == messages

    # DescribeLogStreams facts about the stream.
    s = logs.describe_log_streams(logGroupName=th.LOG_GROUP, logStreamNamePrefix=name + "/")["logStreams"]
    assert [x["logStreamName"] for x in s] == [stream]
    assert s[0]["firstEventTimestamp"] == everything[0]["timestamp"]
    assert s[0]["lastEventTimestamp"] == everything[-1]["timestamp"]


def test_pytorch_job_through_aws_cli(module_kiln, sm, s3, setup, jobs):
    aws = jobs["aws"]
    if aws is None:
        pytest.skip("no AWS CLI")
    name = jobs["cli"]
    created = json.loads(jobs["cli_create"].stdout)
    assert created["TrainingJobArn"].endswith(":training-job/" + name)
    d = th.wait_for_status(sm, name, timeout=300, server=module_kiln)
    assert d["TrainingJobStatus"] == "Completed", d.get("FailureReason")
    aws("sagemaker", "wait", "training-job-completed-or-stopped", "--training-job-name", name, timeout=120)
    out = json.loads(aws("sagemaker", "describe-training-job", "--training-job-name", name, "--output", "json").stdout)
    assert out["TrainingJobName"] == name and out["TrainingJobStatus"] == "Completed"
    assert out["SecondaryStatus"] == "Completed"
    assert _statuses(out["SecondaryStatusTransitions"]) == EXPECTED
    assert out["ModelArtifacts"]["S3ModelArtifacts"] == "s3://%s/output/%s/output/model.tar.gz" % (setup, name)
    assert any(m["MetricName"] == "loss" for m in out.get("FinalMetricDataList", []))
    assert "model.pth" in th.model_files(s3, d)
    listed = json.loads(aws("sagemaker", "list-training-jobs", "--name-contains", name, "--output", "json").stdout)
    assert [j["TrainingJobName"] for j in listed["TrainingJobSummaries"]] == [name]
    assert listed["TrainingJobSummaries"][0]["TrainingJobStatus"] == "Completed"


def _without_status_line(lines):
    """`kiln logs` may end with its own `[kiln] training job <name>: <status>` line."""
    if lines and lines[-1].startswith("[kiln] training job "):
        return lines[:-1]
    return lines


def test_kiln_logs_command(module_kiln, sm, logs, jobs):
    """`kiln logs <job>` prints the job's lines (skipped while the command is not wired up)."""
    help_run = subprocess.run([kh.kiln_bin(), "logs", "--help"], capture_output=True, text=True, timeout=30)
    if help_run.returncode != 0 or "follow" not in (help_run.stdout + help_run.stderr):
        pytest.skip("`kiln logs` not available in this binary")
    name = jobs["boto3"]
    th.wait_for_status(sm, name, timeout=300, server=module_kiln)
    help_text = help_run.stdout + help_run.stderr
    env = dict(os.environ, AWS_ACCESS_KEY_ID=module_kiln.access_key, AWS_SECRET_ACCESS_KEY=module_kiln.secret_key,
               AWS_DEFAULT_REGION="us-east-1", AWS_REGION="us-east-1", AWS_ENDPOINT_URL=module_kiln.endpoint,
               KILN_ENDPOINT=module_kiln.endpoint)
    args = [kh.kiln_bin(), "logs", name]
    if "--endpoint" in help_text:
        args += ["--endpoint", module_kiln.endpoint]
    if "--data-dir" in help_text:
        args += ["--data-dir", module_kiln.data_dir]
    expected = th.job_log_lines(logs, name)
    p = subprocess.run(args, capture_output=True, text=True, timeout=60, env=env)
    assert p.returncode == 0, (args, p.stdout, p.stderr)
    assert _without_status_line(p.stdout.splitlines()) == expected, (p.stdout, expected)
    p = subprocess.run(args + ["-f"], capture_output=True, text=True, timeout=60, env=env)
    assert p.returncode == 0, (p.stdout, p.stderr)
    assert _without_status_line(p.stdout.splitlines()) == expected
    p = subprocess.run(args[:2] + ["no-such-job-xyz"] + args[3:], capture_output=True, text=True, timeout=60, env=env)
    assert p.returncode != 0
