"""Queueing on a host that fits two jobs (training-contract.md §1 step 2, §14 `Pending`): twenty
ml.m5.large jobs on a strict host sized for exactly two of them all complete, start in submission
order, never run more than two at a time, and the waiting ones report `Pending`.

The build host has 2 CPUs and `scheduler.cpus` can only narrow what the process may use, so the
module's server overrides the catalog row of ml.m5.large (operator instance_types, extending the
built-in catalog) to 1 vCPU / 4 GiB and offers 2 CPUs / 8 GiB with nothing reserved."""

import threading
import time

import pytest
from botocore.exceptions import ClientError

import training_helpers as th
from training_helpers import sm, s3  # noqa: F401 (module-scoped client fixtures)

KILN_CONFIG = {
    "scheduler": {"policy": "strict", "allow_cpu_fallback": True, "cpus": 2, "memory_gib": 8,
                  "reserved_cpus": 0, "reserved_memory_gib": 0},
    "instance_types": {"instance_types": [{"type": "ml.m5.large", "vcpus": 1, "memory_gib": 4}]},
    "training": {"stop_grace_seconds": 10},
}
JOBS = 20


def _transition(d, status):
    for t in d["SecondaryStatusTransitions"]:
        if t["Status"] == status:
            return t
    raise AssertionError("%s never went through %s: %s" % (d["TrainingJobName"], status, d["SecondaryStatusTransitions"]))


def test_twenty_jobs_on_a_host_that_fits_two(module_kiln, sm, s3):
    bucket = th.unique_name("sched")
    s3.create_bucket(Bucket=bucket)
    prefix = th.unique_name("q")
    names = ["%s-%02d" % (prefix, i) for i in range(JOBS)]
    for name in names:
        sm.create_training_job(**th.training_request(name, bucket, hyperparameters={"sleep": "1.5", "lines": "2"}))

    # Watch the queue while it drains: the waiting jobs say Pending (with a message).
    pending_seen = {}
    stop = threading.Event()
    watcher_sm = module_kiln.client("sagemaker")

    def watch():
        finished = set()
        while not stop.is_set():
            for name in names:
                if name in finished:
                    continue
                d = watcher_sm.describe_training_job(TrainingJobName=name)
                if d.get("SecondaryStatus") == "Pending":
                    msg = d["SecondaryStatusTransitions"][-1].get("StatusMessage")
                    pending_seen.setdefault(name, msg)
                if d["TrainingJobStatus"] in th.TERMINAL:
                    finished.add(name)
            time.sleep(0.3)

    t = threading.Thread(target=watch, daemon=True)
    t.start()
    try:
        done = [th.wait_for_status(sm, name, timeout=600, server=module_kiln) for name in names]
    finally:
        stop.set()
        t.join(30)

    assert [d["TrainingJobStatus"] for d in done] == ["Completed"] * JOBS, [
        (d["TrainingJobName"], d["TrainingJobStatus"], d.get("FailureReason")) for d in done
        if d["TrainingJobStatus"] != "Completed"]

    # None lost: the list has all twenty (paged 7 at a time).
    listed, token = [], None
    while True:
        kwargs = dict(NameContains=prefix, MaxResults=7, SortBy="Name", SortOrder="Ascending")
        if token:
            kwargs["NextToken"] = token
        r = sm.list_training_jobs(**kwargs)
        listed += [s["TrainingJobName"] for s in r["TrainingJobSummaries"]]
        token = r.get("NextToken")
        if not token:
            break
    assert listed == names

    # Started in submission order. Two jobs admitted together may reach their first instruction a
    # moment apart in either order, so neighbours get a small tolerance; anything further apart
    # must be strictly ordered.
    starts = [d["TrainingStartTime"].timestamp() for d in done]
    order = [(d["TrainingJobName"], d["TrainingStartTime"]) for d in done]
    for i in range(1, JOBS):
        assert starts[i] >= starts[i - 1] - 1.0, order
        if i >= 2:
            assert starts[i] >= starts[i - 2], order
    admitted = [_transition(d, "Downloading")["StartTime"].timestamp() for d in done]
    for i in range(1, JOBS):
        assert admitted[i] >= admitted[i - 1] - 0.25, [(d["TrainingJobName"], a) for d, a in zip(done, admitted)]

    # Never more than two running at once (ends before starts at equal instants).
    events = []
    for d in done:
        events.append((d["TrainingStartTime"], 1))
        events.append((d["TrainingEndTime"], -1))
    running = peak = 0
    for _, delta in sorted(events, key=lambda e: (e[0], e[1])):
        running += delta
        peak = max(peak, running)
    assert peak <= 2, "more than two jobs trained at once"
    assert peak == 2, "the host fits two: two jobs should have overlapped at some point"

    # Waiting jobs went through Pending with a message, recorded in their transitions.
    with_pending = [d for d in done if "Pending" in [x["Status"] for x in d["SecondaryStatusTransitions"]]]
    assert len(with_pending) >= JOBS - 4, "expected most jobs to wait in Pending"
    for d in with_pending:
        statuses = [x["Status"] for x in d["SecondaryStatusTransitions"]]
        assert statuses[0] == "Starting" and statuses[-1] == "Completed", statuses
        assert statuses.index("Pending") < statuses.index("Downloading") < statuses.index("Training"), statuses
        tr = d["SecondaryStatusTransitions"][statuses.index("Pending")]
        assert tr.get("StatusMessage"), tr
    assert pending_seen, "no job was ever observed in Pending while polling"
    assert all(msg for msg in pending_seen.values()), pending_seen


def test_strict_policy_refuses_shapes_larger_than_the_host(sm, s3):
    bucket = th.unique_name("strict")
    s3.create_bucket(Bucket=bucket)
    name = th.unique_name("too-big")
    with pytest.raises(ClientError) as e:
        sm.create_training_job(**th.training_request(name, bucket, instance_type="ml.m5.4xlarge"))
    err = e.value.response["Error"]
    assert err["Code"] == "ResourceLimitExceeded", err
    assert "ml.m5.4xlarge" in err["Message"] and "shrink" in err["Message"], err
    assert th.describe_error(sm, name) == ("ValidationException", "Requested resource not found.")  # nothing created


def test_job_queued_behind_an_endpoint_starts_when_the_endpoint_goes(module_kiln, sm, s3):
    """Capacity freed by an endpoint (not by another job) starts the queued job: the scheduler
    tells the training controller of every release. Before, nothing re-ran the queue and the job
    stayed Pending forever (found by the SageMaker SDK suite: fit() after delete_endpoint hung)."""
    import endpoint_helpers as eh
    bucket = th.unique_name("behind-ep")
    s3.create_bucket(Bucket=bucket)
    ep = eh.unique_name("holder")
    eh.create_model(sm, ep + "-model")
    eh.deploy(sm, ep, [("AllTraffic", ep + "-model", 2, 1.0)], server=module_kiln)  # both CPUs
    name = th.unique_name("waits")
    try:
        sm.create_training_job(**th.training_request(name, bucket, hyperparameters={"lines": "1"}))
        th.wait_for_secondary(sm, name, ["Pending"], timeout=60)
        time.sleep(1)  # still waiting: nothing of ours will free capacity
        assert sm.describe_training_job(TrainingJobName=name)["SecondaryStatus"] == "Pending"
    finally:
        sm.delete_endpoint(EndpointName=ep)
    d = th.wait_for_status(sm, name, timeout=60, server=module_kiln)
    assert d["TrainingJobStatus"] == "Completed", d.get("FailureReason")
