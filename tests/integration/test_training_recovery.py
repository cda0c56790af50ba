"""kill -9 (and a clean SIGTERM stop) of the server while a job trains (DESIGN: jobs outlive the
control plane): after a restart on the same data dir the job runs on and completes, Describe is
right, the log holds every line exactly once, and the model is uploaded."""

import re
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
