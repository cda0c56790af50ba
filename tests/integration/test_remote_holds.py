"""Issue 16, holds and idle stop (spec/remote-access.md R-15..R-18, §4 check 6) on the process
runtime, driven by boto3, the kiln CLI and OpenSSH:

- hold after exit: a failing job with `kiln:remote-hold-exit-seconds` ends Failed with its
  FailureReason (the automation sees the real outcome at once), its target is Held, and
  `/opt/ml/output/failure` is read through it; `kiln release` ends the hold (target Gone, the
  post-mortem instance removed), and `[kiln]` lines in the job's stream say so;
- hold before start: `kiln:remote-hold-start-seconds` shows "Waiting for remote connection" and the
  program has not run; `kiln release` starts it (the usual Training message, the program's output);
  releasing a target that is not held is a ConflictException;
- idle stop: `kiln:remote-idle-stop-seconds` stops a job nobody connects to (Stopped, the reason in
  the status message and a `[kiln]` line);
- bad tag values fail CreateTrainingJob with ValidationException.

Root only (the agent enters the instance's namespaces), OpenSSH's ssh required.
"""

import json
import os
import shutil
import subprocess

import pytest

import kiln_harness as kh
import training_helpers as th

pytestmark = [
    pytest.mark.skipif(os.geteuid() != 0, reason="remote access enters an instance's namespaces: root only"),
    pytest.mark.skipif(not shutil.which("ssh"), reason="OpenSSH's client (Debian openssh-client) is not installed"),
]

KILN_CONFIG = {
    "scheduler": {"policy": "shrink", "allow_cpu_fallback": True},
    "training": {"stop_grace_seconds": 5},
}


class Holds:
    def __init__(self, server, home):
        self.server = server
        self.home = home
        self.sm = server.client("sagemaker")
        self.s3 = server.client("s3")
        self.logs = server.client("logs")
        self.bucket = th.unique_name("holds")
        self.s3.create_bucket(Bucket=self.bucket)
        self.env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_") and not k.startswith("SSH_")}
        self.env.update({"HOME": home, "AWS_ACCESS_KEY_ID": server.access_key,
                         "AWS_SECRET_ACCESS_KEY": server.secret_key, "AWS_DEFAULT_REGION": "us-east-1"})
        self.jobs = []

    def kiln(self, *args, timeout=60):
        return subprocess.run([kh.kiln_bin()] + [str(a) for a in args], env=self.env, capture_output=True, text=True,
                              timeout=timeout, stdin=subprocess.DEVNULL)

    def create(self, prefix, tags, hyperparameters, remote=True):
        """CreateTrainingJob as raw JSON (Debian's botocore 1.26 predates RemoteDebugConfig)."""
        name = th.unique_name(prefix)
        extra = {"Tags": [{"Key": k, "Value": v} for k, v in tags.items()]}
        if remote:
            extra["RemoteDebugConfig"] = {"EnableRemoteDebug": True}
        status, _, body = kh.json_request(self.server, "SageMaker.CreateTrainingJob", th.training_request(
            name, self.bucket, hyperparameters=hyperparameters, max_runtime=600, **extra))
        if status == 200:
            self.jobs.append(name)
        return name, status, json.loads(body)

    def targets(self, job):
        p = self.kiln("targets", "--json", "--endpoint-url", self.server.endpoint, job)
        assert p.returncode == 0, (p.stdout, p.stderr)
        return json.loads(p.stdout)

    def target_state(self, job):
        return self.targets(job)["Targets"][0]["State"]

    def connect(self, job, *command):
        return self.kiln("connect", "--endpoint-url", self.server.endpoint, "training-job/%s/algo-1" % job, "--",
                         *command, timeout=90)

    def release(self, job):
        return self.kiln("release", "--endpoint-url", self.server.endpoint, "training-job/%s/algo-1" % job)

    def describe(self, job):
        return self.sm.describe_training_job(TrainingJobName=job)


@pytest.fixture(scope="module")
def holds(module_kiln, tmp_path_factory):
    server = module_kiln
    h = Holds(server, str(tmp_path_factory.mktemp("holds-home")))
    try:
        yield h
    finally:
        for name in h.jobs:
            try:
                h.sm.stop_training_job(TrainingJobName=name)
            except Exception:
                pass
        for name in h.jobs:
            try:
                th.wait_for_status(h.sm, name, timeout=60, server=server)
            except Exception:
                pass
        # A job whose hold is still on: released, so its post-mortem instance ends with the module.
        for name in h.jobs:
            h.release(name)


def test_hold_after_exit_keeps_a_failed_job_reachable(holds):
    job, status, body = holds.create("hold-exit", {"kiln:remote-hold-exit-seconds": "900"},
                                     {"failure": "CUDA out of memory on rank 0", "exit_code": "3"})
    assert status == 200, body
    d = th.wait_for_status(holds.sm, job, timeout=180, server=holds.server)
    # The job's outcome is the program's, at once: the hold does not delay the terminal status.
    assert d["TrainingJobStatus"] == "Failed", d
    assert "CUDA out of memory on rank 0" in d["FailureReason"], d["FailureReason"]
    th.wait_until(lambda: holds.target_state(job) == "Held", timeout=60, what="target Held")
    p = holds.connect(job, "cat", "/opt/ml/output/failure")
    assert p.returncode == 0, (p.stdout, p.stderr)
    assert "CUDA out of memory on rank 0" in p.stdout
    p = holds.connect(job, "hostname")
    assert p.stdout.strip() == "algo-1", (p.stdout, p.stderr)

    p = holds.release(job)
    assert p.returncode == 0, (p.stdout, p.stderr)
    th.wait_until(lambda: holds.target_state(job) == "Gone", timeout=30, what="target Gone after release")
    p = holds.connect(job, "true")
    assert p.returncode == 255 and "ValidationException" in p.stderr, (p.stdout, p.stderr)
    lines = "\n".join(th.job_log_lines(holds.logs, job))
    assert "[kiln] the program exited; algo-1 is held for up to 900 s" in lines, lines
    th.wait_until(lambda: "after exit ended" in "\n".join(th.job_log_lines(holds.logs, job)), timeout=30,
                  what="the hold's end in the log stream")
    assert holds.describe(job)["TrainingJobStatus"] == "Failed"


def test_hold_before_start_and_release(holds):
    job, status, body = holds.create("hold-start", {"kiln:remote-hold-start-seconds": "600"},
                                     {"lines": "2", "sleep": "600"})
    assert status == 200, body
    th.wait_until(lambda: holds.describe(job).get("SecondaryStatus") == "Training"
                  and holds.target_state(job) == "Ready", timeout=120, what="the held host Ready")
    d = holds.describe(job)
    assert d["SecondaryStatusTransitions"][-1]["StatusMessage"] == "Waiting for remote connection", d
    assert not any(line.startswith("line ") for line in th.job_log_lines(holds.logs, job))
    # The hold is PID 1 until released; inside, the instance's files are there already.
    p = holds.connect(job, "cat", "/proc/1/cmdline")
    assert p.returncode == 0 and "hold-start" in p.stdout, (p.stdout, p.stderr)

    p = holds.release(job)
    assert p.returncode == 0, (p.stdout, p.stderr)
    th.wait_for_log_line(holds.logs, job, lambda line: line.startswith("line 1"), timeout=60)
    th.wait_until(lambda: holds.describe(job)["SecondaryStatusTransitions"][-1]["StatusMessage"]
                  != "Waiting for remote connection", timeout=30, what="the Training message back")
    p = holds.connect(job, "cat", "/proc/1/cmdline")
    assert "hold-start" not in p.stdout and "probe.py" in p.stdout, (p.stdout, p.stderr)
    # Nothing holds now: a second release is refused, saying why.
    p = holds.release(job)
    assert p.returncode != 0 and "ConflictException" in p.stderr, (p.stdout, p.stderr)
    holds.sm.stop_training_job(TrainingJobName=job)
    assert th.wait_for_status(holds.sm, job, timeout=60, server=holds.server)["TrainingJobStatus"] == "Stopped"


def test_idle_stop_ends_a_job_nobody_uses(holds):
    job, status, body = holds.create("idle", {"kiln:remote-idle-stop-seconds": "3"}, {"sleep": "600"})
    assert status == 200, body
    d = th.wait_for_status(holds.sm, job, timeout=120, server=holds.server)
    assert d["TrainingJobStatus"] == "Stopped", d
    messages = [t.get("StatusMessage", "") for t in d["SecondaryStatusTransitions"]]
    assert any("no remote connection for 3 s" in m for m in messages), messages
    th.wait_until(lambda: any("[kiln] no remote connection for 3 s" in line
                              for line in th.job_log_lines(holds.logs, job)), timeout=30, what="the idle line")


@pytest.mark.parametrize("key,value", [
    ("kiln:remote-hold-start-seconds", "3601"),
    ("kiln:remote-hold-start-seconds", "soon"),
    ("kiln:remote-hold-exit-seconds", "21601"),
    ("kiln:remote-idle-stop-seconds", "0"),
])
def test_bad_hold_tags_fail_the_create(holds, key, value):
    _, status, body = holds.create("bad-tag", {key: value}, {})
    assert status == 400, body
    assert body["__type"].endswith("ValidationException"), body
    assert key in body["message"], body
