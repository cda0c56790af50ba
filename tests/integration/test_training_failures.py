"""How training jobs end other than Completed (training-contract.md §2, §8, §10, §11, §14):
the failure file, a non-zero exit without it, StopTrainingJob with a SIGTERM handler, and
MaxRuntimeInSeconds. Artifacts are uploaded in every case. All jobs are submitted at once. And a
full disk while staging (its own server on a small tmpfs)."""

import os
import subprocess

import pytest

import kiln_harness as kh
import training_helpers as th
from training_helpers import sm, s3, logs  # noqa: F401 (module-scoped client fixtures)

KILN_CONFIG = th.SHRINK_CONFIG

LONG_REASON = "ValueError: custom failure from the training script. " + "".join(
    "detail %04d; " % i for i in range(140))  # ~1,900 characters (values may have 2,500)


@pytest.fixture(scope="module")
def bucket(s3):
    name = th.unique_name("fail")
    s3.create_bucket(Bucket=name)
    return name


@pytest.fixture(scope="module")
def jobs(sm, bucket):
    specs = {
        "failure_file": {"failure": LONG_REASON, "write_model": "partial model", "write_output": "partial output",
                         "exit_code": "2"},
        "exit_code": {"stderr": "RuntimeError: boom in step 7", "exit_code": "3", "write_model": "before crash"},
        "stop": {"sigterm": "1", "ticks": "300", "tick_interval": "0.5"},
        "max_runtime": {"sleep": "120", "write_model": "slept", "sigterm": "1"},
    }
    names = {}
    for key, hps in specs.items():
        name = th.unique_name("f-" + key.replace("_", "-"))
        req = th.training_request(name, bucket, hyperparameters=hps)
        if key == "max_runtime":
            req["StoppingCondition"] = {"MaxRuntimeInSeconds": 3}
        sm.create_training_job(**req)
        names[key] = name
    return names


def test_failure_file_becomes_failure_reason(module_kiln, sm, s3, jobs):
    d = th.wait_for_status(sm, jobs["failure_file"], timeout=180, server=module_kiln)
    assert d["TrainingJobStatus"] == "Failed"
    assert d["SecondaryStatus"] == "Failed"
    assert d["FailureReason"] == LONG_REASON[:1024]
    tr = d["SecondaryStatusTransitions"]
    assert tr[-1]["Status"] == "Failed" and tr[-1]["StatusMessage"], tr
    assert th.main_statuses(tr)[:3] == ["Starting", "Downloading", "Training"], tr
    assert all(t.get("StatusMessage") for t in tr), tr
    # Artifacts are uploaded for failed jobs too.
    files = th.model_files(s3, d)
    assert files["partial.txt"] == b"partial model"
    out = th.untar(th.get_s3(s3, d["ModelArtifacts"]["S3ModelArtifacts"].replace("model.tar.gz", "output.tar.gz")))
    assert out["out.txt"] == b"partial output"
    assert d["TrainingEndTime"] >= d["TrainingStartTime"]


def test_nonzero_exit_without_failure_file(module_kiln, sm, s3, jobs):
    d = th.wait_for_status(sm, jobs["exit_code"], timeout=180, server=module_kiln)
    assert d["TrainingJobStatus"] == "Failed"
    reason = d["FailureReason"]
    assert "exit code: 3" in reason, reason
    assert reason.startswith("AlgorithmError:"), reason
    assert "RuntimeError: boom in step 7" in reason, reason  # last stderr line is the summary
    assert len(reason) <= 1024
    assert th.model_files(s3, d)["partial.txt"] == b"before crash"


def test_stop_training_job_runs_sigterm_handler(module_kiln, sm, s3, logs, jobs):
    name = jobs["stop"]
    th.wait_for_secondary(sm, name, "Training", timeout=180)
    th.wait_for_log_line(logs, name, lambda line: line.startswith("tick "), timeout=60)
    sm.stop_training_job(TrainingJobName=name)
    d = sm.describe_training_job(TrainingJobName=name)
    assert d["TrainingJobStatus"] in ("Stopping", "Stopped"), d["TrainingJobStatus"]
    timeline = th.Timeline()
    timeline.add(d)
    d = th.wait_for_status(sm, name, timeout=120, timeline=timeline, server=module_kiln)
    assert d["TrainingJobStatus"] == "Stopped", (d["TrainingJobStatus"], d.get("FailureReason"))
    assert d["SecondaryStatus"] == "Stopped"
    statuses = th.main_statuses(d["SecondaryStatusTransitions"])
    assert statuses[-2:] == ["Stopping", "Stopped"], statuses
    assert statuses[:3] == ["Starting", "Downloading", "Training"], statuses
    assert all(t.get("StatusMessage") for t in d["SecondaryStatusTransitions"])
    if "Stopping" in [p for p, _, _ in timeline.seen]:
        assert timeline.primaries()[-2:] == ["Stopping", "Stopped"]
    # The handler ran: its file is in model.tar.gz and its line in the log.
    files = th.model_files(s3, d)
    assert files.get("sigterm.txt") == b"terminated gracefully\n", sorted(files)
    assert "caught SIGTERM" in th.job_log_lines(logs, name)
    # Stopping a stopped job is a ValidationException.
    from botocore.exceptions import ClientError
    with pytest.raises(ClientError) as e:
        sm.stop_training_job(TrainingJobName=name)
    assert e.value.response["Error"]["Code"] == "ValidationException"


def test_max_runtime_exceeded(module_kiln, sm, s3, jobs):
    d = th.wait_for_status(sm, jobs["max_runtime"], timeout=180, server=module_kiln)
    assert d["TrainingJobStatus"] == "Stopped", (d["TrainingJobStatus"], d.get("FailureReason"))
    assert d["SecondaryStatus"] == "MaxRuntimeExceeded"
    statuses = th.main_statuses(d["SecondaryStatusTransitions"])
    assert statuses[-1] == "MaxRuntimeExceeded", statuses
    assert "Training" in statuses and "Stopping" in statuses, statuses
    assert all(t.get("StatusMessage") for t in d["SecondaryStatusTransitions"])
    # It ran about 3 s, far less than the 120 s sleep.
    run = (d["TrainingEndTime"] - d["TrainingStartTime"]).total_seconds()
    assert 0 <= run < 60, run
    assert (d["TrainingEndTime"] - d["CreationTime"]).total_seconds() >= 3
    assert th.model_files(s3, d)["partial.txt"] == b"slept"


def test_full_disk_fails_the_job_clearly_and_the_server_keeps_serving(tmp_path):
    """A full disk while staging (issue: "a full disk: the job fails with a FailureReason that
    tells the user what to fix, and the server keeps serving"). The server's data dir is a small
    tmpfs (needs root to mount); the channel does not fit a second time."""
    if os.geteuid() != 0:
        pytest.skip("needs root to mount a small tmpfs as the data dir")
    mnt = tmp_path / "small-disk"
    mnt.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=48m", "tmpfs", str(mnt)]).returncode != 0:
        pytest.skip("cannot mount a tmpfs here")
    srv = None
    try:
        srv = kh.KilnServer(str(mnt / "data"), config=th.SHRINK_CONFIG, log_path=str(tmp_path / "server.log"))
        srv.start()
        sm, s3 = srv.client("sagemaker"), srv.client("s3")
        bucket = th.unique_name("full")
        s3.create_bucket(Bucket=bucket)
        for i in range(3):
            s3.put_object(Bucket=bucket, Key="train/part-%d" % i, Body=os.urandom(10 * 1024 * 1024))
        name = th.unique_name("full-disk")
        sm.create_training_job(**th.training_request(
            name, bucket, channels=[th.s3_channel("train", "s3://%s/train/" % bucket)]))
        d = th.wait_for_status(sm, name, timeout=120, server=srv)
        assert d["TrainingJobStatus"] == "Failed", d["TrainingJobStatus"]
        reason = d["FailureReason"]
        assert reason.startswith("ClientError: Data download failed: no space left on device"), reason
        assert "free space" in reason, reason

        # The server keeps serving, and the failed job's volume was given back: a job without the
        # big channel runs.
        for i in range(3):
            s3.delete_object(Bucket=bucket, Key="train/part-%d" % i)
        small = th.unique_name("after-full")
        sm.create_training_job(**th.training_request(small, bucket, hyperparameters={"lines": "2"}))
        d = th.wait_for_status(sm, small, timeout=120, server=srv)
        assert d["TrainingJobStatus"] == "Completed", d.get("FailureReason")
    finally:
        if srv is not None and srv.alive():
            srv.stop()
        subprocess.run(["umount", "-l", str(mnt)])
