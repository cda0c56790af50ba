"""Managed spot training (issue 18; training-contract.md §9-§11, §14): interruptions, resuming from
checkpoints, MaxWaitTimeInSeconds, preemption by on-demand work, billing times, bad input.

Two servers:

  * the module server (KILN_CONFIG: ml.m5.large declared 1 vCPU, so two jobs at once on a 2-core
    host; `spot.interrupt_after_seconds` [3, 3]: every spot job's first two attempts are
    interrupted after 3 s of training; `spot.restart_delay_seconds` 1). The SageMaker SDK,
    unpatched, in its own process (jobs/spot_checkpoint/sdk_spot.py): a `PyTorch` estimator with
    use_spot_instances, max_run, max_wait and checkpoint_s3_uri runs jobs/spot_checkpoint/train.py
    (a seeded torch model checkpointed after every epoch and on SIGTERM), beside an on-demand
    estimator with the same seed (on-demand jobs are never interrupted by the schedule). The spot
    job must go Starting → Downloading → Training → Interrupted twice, resume each time from the
    checkpoint it saved on SIGTERM, bill less than its wall time, and end with a model.tar.gz whose
    weights equal the on-demand job's bit for bit. Bad StoppingCondition/spot combinations are
    refused here too (no job runs).
  * a server whose node holds exactly one ml.m5.large (strict, 2 CPUs / 8 GiB; no schedule), for
    the tests that need the capacity to be full: `kiln interrupt` of a running spot job (it
    resumes and completes), an on-demand job preempting a running spot job, MaxWaitTimeInSeconds
    reached while running (after an interruption) and while never getting capacity, and the
    requests `kiln interrupt` refuses (on-demand, queued, finished, unknown jobs).

The SDK process starts with the module and runs while the one-slot tests run, so the file takes
about as long as its longer half. Statuses are read by polling Describe, never by sleeping.
"""

import io
import json
import os
import re
import subprocess
import uuid

import pytest
from botocore.exceptions import ClientError

import kiln_harness as kh
import sdk_helpers
import training_helpers as th
from training_helpers import sm, s3, logs  # noqa: F401 (module-scoped client fixtures)

KILN_CONFIG = {
    "scheduler": {"policy": "shrink", "allow_cpu_fallback": True},
    "instance_types": [{"type": "ml.m5.large", "vcpus": 1}],
    "training": {"stop_grace_seconds": 10},
    "spot": {"interrupt_after_seconds": [3, 3], "restart_delay_seconds": 1},
}
SCHEDULE = KILN_CONFIG["spot"]["interrupt_after_seconds"]
RESTART_DELAY = KILN_CONFIG["spot"]["restart_delay_seconds"]
# A node that fits exactly one ml.m5.large (2 vCPU / 8 GiB); preempt_for_on_demand is on by default.
ONE_SLOT_CONFIG = {
    "scheduler": {"policy": "strict", "allow_cpu_fallback": True, "cpus": 2, "memory_gib": 8,
                  "reserved_cpus": 0, "reserved_memory_gib": 0},
    "instance_types": [{"type": "ml.m5.large", "vcpus": 2, "memory_gib": 8}],
    "training": {"stop_grace_seconds": 5},
}

HERE = os.path.dirname(os.path.abspath(__file__))
SPOT_DIR = os.path.join(HERE, "jobs", "spot_checkpoint")
TRAIN = os.path.join(SPOT_DIR, "train.py")
SDK_SCENARIOS = os.path.join(SPOT_DIR, "sdk_spot.py")
SEED = 7
EPOCHS = 16          # 8 steps of 0.06 s: ~0.5 s an epoch, ~8 s of training, so 3 s interrupts land mid-run
STEP_SECONDS = 0.06
CKPT_FILE = "/opt/ml/checkpoints/checkpoint.pt"

INTERRUPTED_MESSAGE = "Training job interrupted, waiting for capacity"
MAX_WAIT_MESSAGE = "Job stopped because max wait time was exceeded"
START = ["Starting", "Downloading", "Training"]
RESTART = ["Interrupted"] + START
UPLOAD_DONE = ["Uploading", "Completed"]
TWO_INTERRUPTIONS = START + RESTART + RESTART + UPLOAD_DONE
ONE_INTERRUPTION = START + RESTART + UPLOAD_DONE
NO_INTERRUPTION = START + UPLOAD_DONE

EPOCH_LINE = re.compile(r"^epoch=(\d+) loss=([0-9.]+)$")
RESUMED = re.compile(r"^spot_checkpoint: resumed from (\S+) at epoch=(\d+) step=(\d+) attempt=(\d+)$")
SAVED_ON_SIGTERM = re.compile(r"^spot_checkpoint: SIGTERM, checkpoint saved at epoch=(\d+) step=(\d+)$")
FRESH = "spot_checkpoint: no checkpoint in /opt/ml/checkpoints, starting at epoch=0 step=0"


# ---------------------------------------------------------------------------------------------
# Helpers


def unique(prefix):
    return "%s-%s" % (prefix, uuid.uuid4().hex[:8])


def statuses(d):
    """The SecondaryStatusTransitions' statuses with capacity waits folded away: a `Pending` may
    only follow a `Starting`, and the `Starting` the server may add once capacity is granted is
    folded into the first."""
    out = []
    for s in (t["Status"] for t in d["SecondaryStatusTransitions"]):
        if s == "Pending":
            assert out and out[-1] == "Starting", d["SecondaryStatusTransitions"]
            continue
        if out and out[-1] == s:
            continue
        out.append(s)
    return out


def entries(d, status):
    """(index, transition) of every transition with this status."""
    return [(i, t) for i, t in enumerate(d["SecondaryStatusTransitions"]) if t["Status"] == status]


def secs(a, b):
    return (b - a).total_seconds()


def check_transitions_well_formed(d):
    tr = d["SecondaryStatusTransitions"]
    for i, t in enumerate(tr):
        assert isinstance(t.get("StatusMessage"), str) and t["StatusMessage"], t
        if i + 1 < len(tr):
            assert t["EndTime"] >= t["StartTime"] and tr[i + 1]["StartTime"] >= t["StartTime"], tr
    for _, t in entries(d, "Interrupted"):
        assert t["StatusMessage"] == INTERRUPTED_MESSAGE, t


def check_times(d):
    """TrainingTimeInSeconds is wall time from the first start; BillableTimeInSeconds the running
    time of the attempts (the Training spans), never more."""
    assert d["TrainingStartTime"] <= d["TrainingEndTime"], d
    first_training = entries(d, "Training")[0][1]
    assert abs(secs(d["TrainingStartTime"], first_training["StartTime"])) <= 1.0, (d["TrainingStartTime"],
                                                                                   first_training)
    wall = secs(d["TrainingStartTime"], d["TrainingEndTime"])
    assert abs(d["TrainingTimeInSeconds"] - wall) <= 1.0, (d["TrainingTimeInSeconds"], wall)
    assert 1 <= d["BillableTimeInSeconds"] <= d["TrainingTimeInSeconds"], d


def training_spans(d):
    tr = d["SecondaryStatusTransitions"]
    return [secs(t["StartTime"], tr[i + 1]["StartTime"]) for i, t in entries(d, "Training") if i + 1 < len(tr)]


def epoch_losses(lines):
    """{epoch: loss text}, asserting every epoch line appears once."""
    out = {}
    for line in lines:
        m = EPOCH_LINE.match(line.strip())
        if m:
            assert m.group(1) not in out, "epoch %s printed twice: %s" % (m.group(1), lines)
            out[int(m.group(1))] = m.group(2)
    return out


def resumes(lines):
    return [(m.group(1), int(m.group(2)), int(m.group(3)), int(m.group(4)))
            for m in (RESUMED.match(line.strip()) for line in lines) if m]


def sigterm_saves(lines):
    return [(int(m.group(1)), int(m.group(2))) for m in (SAVED_ON_SIGTERM.match(line.strip()) for line in lines) if m]


def kiln_lines(lines, word):
    return [line for line in lines if line.startswith("[kiln]") and word in line.lower()]


def load_state(data):
    import torch
    return torch.load(io.BytesIO(data))


def assert_same_weights(a, b):
    import torch
    assert sorted(a) == sorted(b), (sorted(a), sorted(b))
    different = [k for k in a if not torch.equal(a[k], b[k])]
    assert not different, "tensors differ: %s" % different


def script_request(name, bucket, epochs=10, spot=True, max_runtime=300, max_wait=600):
    """CreateTrainingJob for train.py in script mode (the PyTorch image runs on the host's
    interpreter with Kiln's toolkit), a managed spot job checkpointing under the bucket."""
    hps = {
        "epochs": str(epochs), "seed": str(SEED), "step-seconds": str(STEP_SECONDS),
        "sagemaker_program": json.dumps("train.py"),
        "sagemaker_submit_directory": json.dumps("s3://%s/code/sourcedir.tar.gz" % bucket),
        "sagemaker_container_log_level": "20",
        "sagemaker_job_name": json.dumps(name),
        "sagemaker_region": json.dumps("us-east-1"),
    }
    req = th.training_request(name, bucket, image=th.PYTORCH_IMAGE, hyperparameters=hps, max_runtime=max_runtime)
    if spot:
        req["EnableManagedSpotTraining"] = True
        req["StoppingCondition"]["MaxWaitTimeInSeconds"] = max_wait
        req["CheckpointConfig"] = {"S3Uri": "s3://%s/checkpoints/%s" % (bucket, name)}
    return req


def probe_request(name, bucket, hyperparameters, spot=False, max_runtime=300, max_wait=None):
    req = th.training_request(name, bucket, hyperparameters=hyperparameters, max_runtime=max_runtime)
    if spot:
        req["EnableManagedSpotTraining"] = True
        req["StoppingCondition"]["MaxWaitTimeInSeconds"] = max_wait or max_runtime
        req["CheckpointConfig"] = {"S3Uri": "s3://%s/checkpoints/%s" % (bucket, name)}
    return req


# ---------------------------------------------------------------------------------------------
# Fixtures


@pytest.fixture(scope="module")
def bucket_a(module_kiln, s3):
    name = th.unique_name("spot")
    s3.create_bucket(Bucket=name)
    return name


def selected_tests(request):
    return {item.name for item in request.session.items if item.module is request.module}


class SpotScenarios(sdk_helpers.ScenarioRunner):
    """sdk_helpers.ScenarioRunner for jobs/spot_checkpoint/sdk_spot.py."""

    script = SDK_SCENARIOS


SDK_TESTS = ("test_sdk_spot_job_interrupted_twice_ends_with_the_uninterrupted_model",
             "test_sdk_fit_streams_every_attempt_and_prints_the_savings")


@pytest.fixture(scope="module")
def sdk(module_kiln, bucket_a, tmp_path_factory, request):
    """Starts the SDK scenario when an SDK test is selected; yields (runner, args) or None."""
    lib = sdk_helpers.sdk_lib_dir()
    if lib is None or not set(SDK_TESTS) & selected_tests(request):
        yield None
        return
    runner = SpotScenarios(module_kiln, str(tmp_path_factory.mktemp("sdk-spot")), lib)
    spot = unique("sdk-spot")
    args = {"bucket": bucket_a, "spot": spot, "reference": unique("sdk-ondemand"), "epochs": EPOCHS, "seed": SEED,
            "step_seconds": STEP_SECONDS, "max_run": 300, "max_wait": 600,
            "checkpoint_uri": "s3://%s/spot-sdk/checkpoints/%s" % (bucket_a, spot)}
    runner.start("spot_and_reference", args, timeout=300)
    try:
        yield runner, args
    finally:
        runner.stop_all()
        for name, sc in sorted(runner.scenarios.items()):
            seconds = sc.seconds()
            print("sdk spot scenario %s rc=%s %s" % (name, sc.proc.returncode,
                                                     "%.1f s" % seconds if seconds else "(no result)"))


@pytest.fixture(scope="module", autouse=True)
def _sdk_started(sdk):
    """The SDK scenario starts before the first test, whichever it is."""
    return sdk


@pytest.fixture(scope="module")
def sdk_result(sdk, module_kiln):
    if sdk is None:
        pytest.skip("SageMaker Python SDK bundle not found (../shared/clients/sagemaker-python-sdk/lib beside the "
                    "repository, or $KILN_SAGEMAKER_SDK_LIB)")
    runner, args = sdk
    return runner.result("spot_and_reference"), args


class Node:
    """The one-slot server with its clients, a bucket holding train.py as sourcedir.tar.gz, and
    the `kiln` CLI pointed at it."""

    def __init__(self, server, home):
        self.server = server
        self.home = home
        self.sm = server.client("sagemaker")
        self.s3 = server.client("s3")
        self.logs = server.client("logs")
        self.bucket = th.unique_name("spot-node")
        self.s3.create_bucket(Bucket=self.bucket)
        with open(TRAIN, "rb") as f:
            self.s3.put_object(Bucket=self.bucket, Key="code/sourcedir.tar.gz",
                               Body=th.make_tar_gz({"train.py": f.read()}))
        self.env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
        self.env.update({"HOME": home, "AWS_ACCESS_KEY_ID": server.access_key,
                         "AWS_SECRET_ACCESS_KEY": server.secret_key, "AWS_DEFAULT_REGION": "us-east-1"})
        self.jobs = []

    def create(self, req):
        self.sm.create_training_job(**req)
        self.jobs.append(req["TrainingJobName"])
        return req["TrainingJobName"]

    def interrupt(self, job):
        return subprocess.run([kh.kiln_bin(), "interrupt", "--endpoint-url", self.server.endpoint, job],
                              env=self.env, capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL)

    def describe(self, job):
        return self.sm.describe_training_job(TrainingJobName=job)

    def wait(self, job, timeout=180):
        return th.wait_for_status(self.sm, job, timeout=timeout, server=self.server)

    def wait_transitions(self, job, predicate, what, timeout=120):
        def check():
            d = self.describe(job)
            if predicate(d):
                return d
            if d["TrainingJobStatus"] in th.TERMINAL:
                raise AssertionError("%s ended %s/%s before %s: %s" % (job, d["TrainingJobStatus"], d["SecondaryStatus"],
                                                                       what, d["SecondaryStatusTransitions"]))
            return None
        return th.wait_until(check, timeout=timeout, poll=0.1, what="%s: %s" % (job, what))

    def lines(self, job):
        return th.job_log_lines(self.logs, job)

    def debug(self, job):
        d = self.describe(job)
        return "%s %s/%s %s\nlog:\n%s" % (job, d["TrainingJobStatus"], d.get("SecondaryStatus"),
                                          [(t["Status"], t["StatusMessage"]) for t in d["SecondaryStatusTransitions"]],
                                          "\n".join(self.lines(job)[-40:]))


@pytest.fixture(scope="module")
def node(kiln_binary, tmp_path_factory):
    base = tmp_path_factory.mktemp("kiln-spot-one-slot")
    server = kh.KilnServer(str(base / "data"), config=ONE_SLOT_CONFIG)
    server.start()
    n = Node(server, str(base / "home"))
    os.makedirs(n.home, exist_ok=True)
    try:
        yield n
    finally:
        for job in n.jobs:
            try:
                n.sm.stop_training_job(TrainingJobName=job)
            except ClientError:
                pass  # ended already
        rc = server.stop(timeout=60)
        assert rc == 0, "one-slot kiln server exited %s on SIGTERM; log tail:\n%s" % (rc, server.log_tail())


# ---------------------------------------------------------------------------------------------
# Bad input (module server; nothing runs)


def _spot_case(req, spot, max_wait):
    req = json.loads(json.dumps(req))
    if spot is not None:
        req["EnableManagedSpotTraining"] = spot
    if max_wait is not None:
        req["StoppingCondition"]["MaxWaitTimeInSeconds"] = max_wait
    return req


BAD = {
    # (EnableManagedSpotTraining, MaxWaitTimeInSeconds) with MaxRuntimeInSeconds 600
    "spot without max wait": (True, None),
    "max wait below max runtime": (True, 599),
    "max wait without spot": (None, 1200),
    "max wait with spot false": (False, 1200),
}


@pytest.mark.parametrize("case", sorted(BAD), ids=lambda c: c.replace(" ", "-"))
def test_bad_spot_stopping_conditions_are_refused(module_kiln, sm, bucket_a, case):
    spot, max_wait = BAD[case]
    name = unique("bad-spot")
    req = _spot_case(th.training_request(name, bucket_a, max_runtime=600), spot, max_wait)
    with pytest.raises(ClientError) as e:
        sm.create_training_job(**req)
    err = e.value.response["Error"]
    assert err["Code"] == "ValidationException", err
    assert "MaxWaitTimeInSeconds" in err["Message"], err
    # The exact __type on the wire, and nothing was created.
    status, _, body = kh.json_request(module_kiln, "SageMaker.CreateTrainingJob", req)
    doc = json.loads(body)
    assert (status, doc.get("__type")) == (400, "ValidationException"), (status, doc)
    assert th.describe_error(sm, name) == ("ValidationException", "Requested resource not found.")


# ---------------------------------------------------------------------------------------------
# One-slot node: `kiln interrupt`, preemption, MaxWaitTimeInSeconds


def test_kiln_interrupt_resumes_from_the_checkpoint(node):
    """`kiln interrupt` of a running spot job: SIGTERM (train.py saves its state), Interrupted,
    then Starting → Downloading → Training with the checkpoint restored; the job completes, every
    epoch printed once, and a finished job cannot be interrupted."""
    job = node.create(script_request(unique("spot-cli"), node.bucket, epochs=10))
    th.wait_for_log_line(node.logs, job, lambda line: line.startswith("epoch=1 "), timeout=120)
    p = node.interrupt(job)
    assert p.returncode == 0, (p.stdout, p.stderr, node.debug(job))
    assert p.stdout.strip() == "interrupted %s: it resumes from its checkpoints when capacity returns" % job, p.stdout

    d = node.wait(job)
    debug = node.debug(job)
    assert d["TrainingJobStatus"] == "Completed" and d["SecondaryStatus"] == "Completed", debug
    assert statuses(d) == ONE_INTERRUPTION, debug
    check_transitions_well_formed(d)
    check_times(d)

    lines = node.lines(job)
    assert lines.count(FRESH) == 1, debug
    saved = sigterm_saves(lines)
    back = resumes(lines)
    assert len(saved) == 1 and len(back) == 1, debug
    # Resumed from exactly what the SIGTERM handler saved, past the two epochs printed before it.
    assert back[0] == (CKPT_FILE, saved[0][0], saved[0][1], 1), (saved, back)
    assert saved[0][0] >= 2, saved
    assert sorted(epoch_losses(lines)) == list(range(10)), debug
    assert "spot_checkpoint: done, model saved (80 steps)" in lines, debug
    assert kiln_lines(lines, "interrupt"), debug  # a [kiln] line says why the program stopped
    assert "model.pth" in th.model_files(node.s3, d)

    # The checkpoint prefix holds the last state (epoch 10) and nothing else (the .tmp renamed away).
    bucket, prefix = th.split_s3_uri(d["CheckpointConfig"]["S3Uri"])
    keys = [o["Key"] for o in node.s3.list_objects_v2(Bucket=bucket, Prefix=prefix).get("Contents", [])]
    assert keys == [prefix.rstrip("/") + "/checkpoint.pt"], keys
    state = load_state(node.s3.get_object(Bucket=bucket, Key=keys[0])["Body"].read())
    assert (state["epoch"], state["step"], state["attempt"]) == (10, 0, 1), state["epoch"]

    p = node.interrupt(job)
    assert p.returncode == 1 and "ValidationException" in p.stderr, (p.stdout, p.stderr)
    assert node.describe(job)["TrainingJobStatus"] == "Completed"


def test_on_demand_job_preempts_the_running_spot_job(node):
    """The node fits one job. A spot job trains; an on-demand job is created: the spot job is
    Interrupted, the on-demand job runs, and only after it ended does the spot job train again,
    resume from its checkpoint and complete."""
    spot = node.create(script_request(unique("spot-pre"), node.bucket, epochs=10))
    th.wait_for_log_line(node.logs, spot, lambda line: line.startswith("epoch=0 "), timeout=120)
    demand = node.create(probe_request(unique("on-demand"), node.bucket, {"lines": "2", "sleep": "2"}))
    d_demand = node.wait(demand)
    d_spot = node.wait(spot)
    debug = node.debug(spot) + "\n" + node.debug(demand)
    assert d_demand["TrainingJobStatus"] == "Completed", debug
    assert statuses(d_demand) == NO_INTERRUPTION, debug
    assert d_spot["TrainingJobStatus"] == "Completed", debug
    assert statuses(d_spot) == ONE_INTERRUPTION, debug
    check_transitions_well_formed(d_spot)
    check_times(d_spot)

    # Order: spot trains → spot interrupted → on-demand trains and ends → spot trains again.
    (_, interrupted), = entries(d_spot, "Interrupted")
    first, second = [t for _, t in entries(d_spot, "Training")]
    assert first["StartTime"] < interrupted["StartTime"] <= d_demand["TrainingStartTime"], debug
    assert d_demand["TrainingEndTime"] <= second["StartTime"], debug
    assert d_demand["CreationTime"] <= interrupted["StartTime"], debug

    lines = node.lines(spot)
    saved, back = sigterm_saves(lines), resumes(lines)
    assert len(saved) == 1 and back == [(CKPT_FILE, saved[0][0], saved[0][1], 1)], debug
    assert sorted(epoch_losses(lines)) == list(range(10)), debug
    # [kiln] lines say why (capacity for the on-demand job, named) and that it was interrupted.
    assert [line for line in lines if line.startswith("[kiln]") and demand in line], debug
    assert kiln_lines(lines, "interrupt"), debug


def test_max_wait_reached_while_running_after_an_interruption(node):
    """MaxWaitTimeInSeconds = MaxRuntimeInSeconds = 6: the job is interrupted once (`kiln
    interrupt`), resumes with its checkpoint restored, and is stopped when 6 s have passed since
    creation (its running time is still below 6): Stopping → Stopped / MaxWaitTimeExceeded, the
    program's SIGTERM handler ran and its model was uploaded."""
    job = node.create(probe_request(unique("spot-wait"), node.bucket,
                                    {"checkpoint": "saved by attempt 1", "sigterm": "1", "sleep": "120"},
                                    spot=True, max_runtime=6, max_wait=6))
    node.wait_transitions(job, lambda d: d.get("SecondaryStatus") == "Training", "Training")
    p = node.interrupt(job)
    assert p.returncode == 0, (p.stdout, p.stderr, node.debug(job))
    d = node.wait(job, timeout=60)
    debug = node.debug(job)
    assert (d["TrainingJobStatus"], d["SecondaryStatus"]) == ("Stopped", "MaxWaitTimeExceeded"), debug
    assert statuses(d) == START + RESTART + ["Stopping", "MaxWaitTimeExceeded"], debug
    assert d["SecondaryStatusTransitions"][-1]["StatusMessage"] == MAX_WAIT_MESSAGE, debug
    check_transitions_well_formed(d)
    check_times(d)
    stopping = entries(d, "Stopping")[0][1]
    assert 5.95 <= secs(d["CreationTime"], stopping["StartTime"]) < 9.0, (d["CreationTime"], stopping)
    # Billed: the two Training spans (whole seconds, rounded up), not the wait between them.
    assert abs(d["BillableTimeInSeconds"] - sum(training_spans(d))) <= 1, (d["BillableTimeInSeconds"],
                                                                            training_spans(d))

    files = th.model_files(node.s3, d)
    assert "sigterm.txt" in files, sorted(files)
    report = json.loads(files["report.json"])
    # The second attempt found the first one's checkpoint file, restored from CheckpointConfig.
    assert report["checkpoints_seen"] == {"ckpt-new.txt": th.sha256(b"saved by attempt 1")}, report


@pytest.fixture(scope="module")
def busy_node(node):
    """The node's one slot held by an on-demand probe job (sleeps, SIGTERM handler); stopped after
    the tests that use it."""
    job = node.create(probe_request(unique("holder"), node.bucket, {"sigterm": "1", "sleep": "300"}))
    node.wait_transitions(job, lambda d: d.get("SecondaryStatus") == "Training", "Training")
    yield job
    node.sm.stop_training_job(TrainingJobName=job)
    d = node.wait(job, timeout=60)
    assert d["TrainingJobStatus"] == "Stopped", node.debug(job)
    assert "Interrupted" not in statuses(d), d["SecondaryStatusTransitions"]


def test_kiln_interrupt_refuses_on_demand_and_unknown_jobs(node, busy_node):
    p = node.interrupt(busy_node)
    assert p.returncode == 1, (p.stdout, p.stderr)
    assert "ValidationException" in p.stderr and p.stdout == "", (p.stdout, p.stderr)
    p = node.interrupt("no-such-spot-job")
    assert p.returncode == 1, (p.stdout, p.stderr)
    assert "ResourceNotFound" in p.stderr and "no-such-spot-job" in p.stderr, p.stderr
    d = node.describe(busy_node)
    assert (d["TrainingJobStatus"], d["SecondaryStatus"]) == ("InProgress", "Training"), node.debug(busy_node)


def test_spot_job_that_never_gets_capacity_stops_at_max_wait(node, busy_node):
    """A spot job queued behind an on-demand job on the full node (spot never preempts on-demand)
    with MaxWaitTimeInSeconds 3: Starting → Stopping → Stopped / MaxWaitTimeExceeded, never
    Downloading or Training; while it waits `kiln interrupt` has nothing to reclaim."""
    job = node.create(probe_request(unique("spot-never"), node.bucket, {"lines": "1"}, spot=True,
                                    max_runtime=3, max_wait=3))
    p = node.interrupt(job)
    assert p.returncode == 1 and "ValidationException" in p.stderr, (p.stdout, p.stderr, node.debug(job))
    d = node.wait(job, timeout=60)
    debug = node.debug(job)
    assert (d["TrainingJobStatus"], d["SecondaryStatus"]) == ("Stopped", "MaxWaitTimeExceeded"), debug
    assert statuses(d) == ["Starting", "Stopping", "MaxWaitTimeExceeded"], debug
    assert d["SecondaryStatusTransitions"][-1]["StatusMessage"] == MAX_WAIT_MESSAGE, debug
    assert "TrainingStartTime" not in d and not d.get("BillableTimeInSeconds"), debug
    assert 2.95 <= secs(d["CreationTime"], entries(d, "Stopping")[0][1]["StartTime"]) < 6.0, debug
    assert not [line for line in node.lines(job) if not line.startswith("[kiln]")], debug  # the program never ran
    d = node.describe(busy_node)
    assert (d["TrainingJobStatus"], d["SecondaryStatus"]) == ("InProgress", "Training"), node.debug(busy_node)


# ---------------------------------------------------------------------------------------------
# The SageMaker SDK (module server, started by the `sdk` fixture with the module)


def test_sdk_spot_job_interrupted_twice_ends_with_the_uninterrupted_model(sdk_result, module_kiln, sm, s3, logs):
    r, a = sdk_result
    d = sm.describe_training_job(TrainingJobName=a["spot"])
    ref = sm.describe_training_job(TrainingJobName=a["reference"])
    lines = th.job_log_lines(logs, a["spot"])
    debug = "%s\n%s\nlog:\n%s" % ([(t["Status"], t["StatusMessage"]) for t in d["SecondaryStatusTransitions"]],
                                  d.get("FailureReason"), "\n".join(lines[-60:]))
    assert d["TrainingJobStatus"] == "Completed", debug
    assert ref["TrainingJobStatus"] == "Completed", ref.get("FailureReason")
    assert d["EnableManagedSpotTraining"] is True and not ref.get("EnableManagedSpotTraining")
    assert d["StoppingCondition"] == {"MaxRuntimeInSeconds": a["max_run"], "MaxWaitTimeInSeconds": a["max_wait"]}
    assert d["CheckpointConfig"]["S3Uri"] == a["checkpoint_uri"]

    # Statuses: interrupted exactly twice (the schedule's two entries), in the contract's order.
    assert statuses(d) == TWO_INTERRUPTIONS, debug
    assert statuses(ref) == NO_INTERRUPTION, ref["SecondaryStatusTransitions"]
    check_transitions_well_formed(d)
    tr = d["SecondaryStatusTransitions"]
    for i, t in entries(d, "Interrupted"):
        trained = secs(tr[i - 1]["StartTime"], t["StartTime"])
        assert SCHEDULE[0] - 0.1 <= trained < SCHEDULE[0] + 10, (trained, debug)  # 3 s, then the stop
        waited = secs(t["StartTime"], tr[i + 1]["StartTime"])
        assert waited >= RESTART_DELAY - 0.05, (waited, debug)  # spot.restart_delay_seconds

    # Times: billable is the running time only.
    check_times(d)
    assert d["BillableTimeInSeconds"] < d["TrainingTimeInSeconds"], (d["BillableTimeInSeconds"],
                                                                     d["TrainingTimeInSeconds"])
    running = sum(training_spans(d))
    assert abs(d["BillableTimeInSeconds"] - running) <= 2, (d["BillableTimeInSeconds"], training_spans(d))

    # Logs: a fresh start, two SIGTERM saves, two resumes from exactly those states.
    assert lines.count(FRESH) == 1, debug
    saved, back = sigterm_saves(lines), resumes(lines)
    assert len(saved) == 2, debug
    assert back == [(CKPT_FILE, e, s, n) for (e, s), n in zip(saved, (1, 2))], (saved, back)
    assert saved[0] <= saved[1], saved
    assert len(kiln_lines(lines, "interrupt")) >= 2, debug
    ref_lines = th.job_log_lines(logs, a["reference"])
    assert FRESH in ref_lines and not resumes(ref_lines)
    # Every epoch printed once, with the same loss as the uninterrupted job.
    losses = epoch_losses(lines)
    assert sorted(losses) == list(range(EPOCHS)), debug
    assert losses == epoch_losses(ref_lines)

    # The models: bit for bit the same weights.
    assert r["spot_model_data"] == d["ModelArtifacts"]["S3ModelArtifacts"]
    spot_files = th.model_files(s3, d)
    ref_files = th.model_files(s3, ref)
    assert sorted(spot_files) == sorted(ref_files) == ["model.pth"], (sorted(spot_files), sorted(ref_files))
    spot_model = load_state(spot_files["model.pth"])
    assert_same_weights(spot_model, load_state(ref_files["model.pth"]))

    # The checkpoint the SDK's checkpoint_s3_uri points at: the final state, attempt 2.
    bucket, prefix = th.split_s3_uri(a["checkpoint_uri"])
    keys = [o["Key"] for o in s3.list_objects_v2(Bucket=bucket, Prefix=prefix + "/").get("Contents", [])]
    assert keys == [prefix + "/checkpoint.pt"], keys
    state = load_state(s3.get_object(Bucket=bucket, Key=keys[0])["Body"].read())
    assert (state["epoch"], state["step"], state["attempt"]) == (EPOCHS, 0, 2)
    assert_same_weights(state["model"], spot_model)


def test_sdk_fit_streams_every_attempt_and_prints_the_savings(sdk_result):
    """fit(logs=True) printed the lines of all three attempts (each attempt writes a stream of its
    own, which the SDK finds on its next poll) and the savings it computes from
    BillableTimeInSeconds / TrainingTimeInSeconds.

    Only "at least once": the SDK's `_flush_log_streams` asks DescribeLogStreams with
    limit=instance_count and, when a nextToken comes back, once more without the token, appending
    that second page to the first (the first stream listed twice), and it keeps no list between
    polls. A poll that sees two or more streams while the first one still has unread lines prints
    those lines twice; whether that happens depends on when its 10 s polls fall."""
    r, a = sdk_result
    out = r["output"]
    m = re.search(r"^Managed Spot Training savings: (-?\d+\.\d)%$", out, re.M)
    assert m and float(m.group(1)) > 0, out[-3000:]
    printed = [line.strip() for line in out.splitlines()]
    seen = {"fresh start": FRESH in printed,
            "resumed at attempt 1 and 2": sorted({n for _, _, _, n in resumes(printed)}) == [1, 2],
            "done": "spot_checkpoint: done, model saved (%d steps)" % (EPOCHS * 8) in printed}
    assert all(seen.values()), (seen, [line for line in printed if line.startswith(("spot_checkpoint:", "[kiln]"))])
