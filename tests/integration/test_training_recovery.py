"""kill -9 (and a clean SIGTERM stop) of the server while a job trains (DESIGN: jobs outlive the
control plane): after a restart on the same data dir the job runs on and completes, Describe is
right, the log holds every line exactly once, and the model is uploaded."""

import json
import os
import re
import signal
import time

import pytest

import training_helpers as th

TICKS = 12


@pytest.mark.parametrize("how", ["kill-9", "sigterm"])
def test_job_survives_server_restart(kiln_factory, how):
    srv = kiln_factory("recovery-" + how, config=th.SHRINK_CONFIG)
    sm, s3, logs = srv.client("sagemaker"), srv.client("s3"), srv.client("logs")
    bucket = th.unique_name("recover")
    s3.create_bucket(Bucket=bucket)
    name = th.unique_name("survivor")
    sm.create_training_job(**th.training_request(
        name, bucket, hyperparameters={"ticks": str(TICKS), "tick_interval": "1", "write_model": "survived"}))
    th.wait_for_secondary(sm, name, "Training", timeout=120)
    th.wait_until(lambda: len([l for l in th.job_log_lines(logs, name) if l.startswith("tick ")]) >= 3,
                  timeout=60, what="three ticks")

    if how == "kill-9":
        srv.kill()
    else:
        assert srv.stop() == 0  # a clean stop leaves instances running too
    killed_at = time.time()
    time.sleep(2)  # the job keeps ticking while no server runs
    srv.start()
    sm, s3, logs = srv.client("sagemaker"), srv.client("s3"), srv.client("logs")

    d = th.wait_for_status(sm, name, timeout=180, server=srv)
    assert d["TrainingJobStatus"] == "Completed", (d["TrainingJobStatus"], d.get("FailureReason"), srv.log_tail(40))
    assert d["SecondaryStatus"] == "Completed"
    statuses = th.main_statuses(d["SecondaryStatusTransitions"])
    assert statuses == ["Starting", "Downloading", "Training", "Uploading", "Completed"], statuses
    assert all(t.get("StatusMessage") for t in d["SecondaryStatusTransitions"])
    assert d["TrainingStartTime"].timestamp() < killed_at < d["TrainingEndTime"].timestamp()
    # It ran the full ~12 s once, not again from the start after the restart.
    run = (d["TrainingEndTime"] - d["TrainingStartTime"]).total_seconds()
    assert TICKS - 1 <= run < TICKS + 30, run
    assert d["TrainingTimeInSeconds"] >= TICKS - 1

    ticks = [l for l in th.job_log_lines(logs, name) if re.fullmatch(r"tick \d+", l)]
    assert ticks == ["tick %d" % i for i in range(TICKS)], ticks
    files = th.model_files(s3, d)
    assert files["partial.txt"] == b"survived"
    report = th.model_report(s3, d)
    assert report.get("finished") is True


PIPE_READER = r'''#!/usr/bin/python3
import hashlib, os, time
for epoch in range(3):
    path = "/opt/ml/input/data/train_%d" % epoch
    while not os.path.exists(path):
        time.sleep(0.05)
    with open(path, "rb") as f:
        data = f.read()
    print("epoch %d bytes=%d sha=%s" % (epoch, len(data), hashlib.sha256(data).hexdigest()), flush=True)
    if epoch == 0:
        time.sleep(float(os.environ["PAUSE"]))  # the server is killed and restarted meanwhile
'''


def test_pipe_feeding_resumes_after_kill_9(kiln_factory, tmp_path):
    """Pipe mode across a server restart: the new server's feeder continues with the next epoch
    (its progress is recorded beside the FIFOs), so the job reads every epoch whole."""
    srv = kiln_factory("recovery-pipe", config=th.SHRINK_CONFIG)
    sm, s3, logs = srv.client("sagemaker"), srv.client("s3"), srv.client("logs")
    bucket = th.unique_name("pipe-recover")
    s3.create_bucket(Bucket=bucket)
    objects = {"p/a": b"A" * 200000, "p/b": os.urandom(100000)}
    for key, data in objects.items():
        s3.put_object(Bucket=bucket, Key=key, Body=data)
    expected = b"".join(objects[k] for k in sorted(objects))
    program = tmp_path / "pipe_reader.py"
    program.write_text(PIPE_READER)
    program.chmod(0o755)
    name = th.unique_name("pipe-survivor")
    sm.create_training_job(**th.training_request(
        name, bucket, image="local:%s" % program, input_mode="Pipe", Environment={"PAUSE": "5"},
        channels=[th.s3_channel("train", "s3://%s/p/" % bucket)]))
    th.wait_for_log_line(logs, name, lambda l: l.startswith("epoch 0 "), timeout=120)

    srv.kill()
    srv.start()
    sm, logs = srv.client("sagemaker"), srv.client("logs")
    d = th.wait_for_status(sm, name, timeout=120, server=srv)
    assert d["TrainingJobStatus"] == "Completed", (d.get("FailureReason"), srv.log_tail(40))
    want = "bytes=%d sha=%s" % (len(expected), th.sha256(expected))
    epochs = [l for l in th.job_log_lines(logs, name) if l.startswith("epoch ")]
    assert epochs == ["epoch %d %s" % (i, want) for i in range(3)], epochs


def test_retry_strategy_restarts_after_an_internal_failure(kiln_factory):
    """RetryStrategy (training-contract.md §10): an instance lost to Kiln (its shim killed) is an
    InternalServerError; with MaximumRetryAttempts the job goes Restarting and runs again, in a new
    log stream, and completes."""
    srv = kiln_factory("retry", config=th.SHRINK_CONFIG)
    sm, s3, logs = srv.client("sagemaker"), srv.client("s3"), srv.client("logs")
    bucket = th.unique_name("retry")
    s3.create_bucket(Bucket=bucket)
    name = th.unique_name("retried")
    sm.create_training_job(**th.training_request(
        name, bucket, hyperparameters={"ticks": "3", "tick_interval": "1"},
        RetryStrategy={"MaximumRetryAttempts": 1}))
    th.wait_for_log_line(logs, name, lambda l: l == "tick 0", timeout=120)
    started = os.path.join(srv.data_dir, "instances", "training-%s-algo-1" % name, "started.json")
    with open(started) as f:
        shim_pid = json.load(f)["shim_pid"]
    os.kill(shim_pid, signal.SIGKILL)  # Kiln's supervisor dies: the instance is lost

    d = th.wait_for_status(sm, name, timeout=120, server=srv)
    assert d["TrainingJobStatus"] == "Completed", (d.get("FailureReason"), srv.log_tail(30))
    statuses = [t["Status"] for t in d["SecondaryStatusTransitions"]]
    assert "Restarting" in statuses, statuses
    restarting = d["SecondaryStatusTransitions"][statuses.index("Restarting")]
    assert "InternalServerError" in restarting["StatusMessage"], restarting
    assert statuses.index("Restarting") < len(statuses) - 1 - statuses[::-1].index("Training"), statuses
    assert len(th.job_streams(logs, name)) == 2  # a restarted container gets a new stream


def test_without_retry_strategy_a_lost_instance_fails_the_job(kiln_factory):
    srv = kiln_factory("no-retry", config=th.SHRINK_CONFIG)
    sm, s3, logs = srv.client("sagemaker"), srv.client("s3"), srv.client("logs")
    bucket = th.unique_name("noretry")
    s3.create_bucket(Bucket=bucket)
    name = th.unique_name("lost")
    sm.create_training_job(**th.training_request(name, bucket, hyperparameters={"ticks": "30", "tick_interval": "1"}))
    th.wait_for_log_line(logs, name, lambda l: l == "tick 0", timeout=120)
    with open(os.path.join(srv.data_dir, "instances", "training-%s-algo-1" % name, "started.json")) as f:
        os.kill(json.load(f)["shim_pid"], signal.SIGKILL)
    d = th.wait_for_status(sm, name, timeout=60, server=srv)
    assert d["TrainingJobStatus"] == "Failed", d["TrainingJobStatus"]
    assert d["FailureReason"].startswith("InternalServerError: "), d["FailureReason"]
