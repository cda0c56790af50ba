"""Warm pools (issue 18; training-contract.md §19; control-plane-api.md §8.1): a finished job with
ResourceConfig.KeepAlivePeriodInSeconds keeps its hosts (the grant, the staged input files, the
persistent cache /opt/ml/sagemaker/warmpoolcache) for a matching next job.

One server whose node holds exactly one ml.m5.large (strict, 2 CPUs / 8 GiB), so that a kept pool
really holds the node:

  * the SageMaker SDK, unpatched, in its own process (jobs/warm_pool/sdk_warm_pool.py): a PyTorch
    estimator with keep_alive_period_in_seconds fits jobs/warm_pool/train.py on a channel; a
    second estimator with the same resources fits right after and lands on the first job's pool
    (Reused / InUse; it finds the first job's mark in the persistent cache and the same channel
    files); Session.update_training_job with KeepAlivePeriodInSeconds 0 ends the second's pool.
  * boto3: Describe and ListTrainingJobs (WarmPoolStatusEquals), a job that does not match
    terminating the pool for the capacity it needs, a pool ending when its period runs out, the
    updates UpdateTrainingJob allows and refuses, keep-alive with spot refused; the AWS CLI's
    list-training-jobs --warm-pool-status-equals.

Speeds are measured in bench/warm_pool_bench.py, not here.
"""

import json
import os
import uuid

import pytest
from botocore.exceptions import ClientError

import sdk_helpers
import training_helpers as th
from training_helpers import sm, s3, logs  # noqa: F401 (module-scoped client fixtures)

KILN_CONFIG = {
    "scheduler": {"policy": "strict", "allow_cpu_fallback": True, "cpus": 2, "memory_gib": 8,
                  "reserved_cpus": 0, "reserved_memory_gib": 0},
    "instance_types": [{"type": "ml.m5.large", "vcpus": 2, "memory_gib": 8}],
    "training": {"stop_grace_seconds": 5},
}

HERE = os.path.dirname(os.path.abspath(__file__))
SDK_SCENARIOS = os.path.join(HERE, "jobs", "warm_pool", "sdk_warm_pool.py")
SDK_TEST = "test_sdk_second_fit_lands_on_the_first_jobs_pool"
KEEP_ALIVE = 120


def unique(prefix):
    return "%s-%s" % (prefix, uuid.uuid4().hex[:8])


def keep_alive(seconds):
    return {"InstanceType": "ml.m5.large", "InstanceCount": 1, "VolumeSizeInGB": 1,
            "KeepAlivePeriodInSeconds": seconds}


def pool(sm, name):
    return sm.describe_training_job(TrainingJobName=name).get("WarmPoolStatus")


def wait_pool(sm, name, status, timeout=60):
    th.wait_until(lambda: (pool(sm, name) or {}).get("Status") == status, timeout=timeout,
                  what="warm pool of %s %s (now %s)" % (name, status, pool(sm, name)))
    return pool(sm, name)


def run_probe(sm, bucket, name, seconds=None, timeout=120, **extra):
    """A probe job with this keep-alive period (None: none), waited to its end."""
    req = th.training_request(name, bucket, **extra)
    if seconds is not None:
        req["ResourceConfig"] = keep_alive(seconds)
    sm.create_training_job(**req)
    return th.wait_for_status(sm, name, timeout=timeout)


def error_of(call):
    with pytest.raises(ClientError) as e:
        call()
    return e.value.response["Error"]


@pytest.fixture(scope="module")
def bucket(module_kiln, s3):
    name = th.unique_name("warm")
    s3.create_bucket(Bucket=name)
    # A channel of 24 objects (3 MiB): what the second job of a pool finds already in place.
    for i in range(24):
        s3.put_object(Bucket=name, Key="data/part-%02d.bin" % i, Body=os.urandom(128 * 1024))
    return name


def selected_tests(request):
    return {item.name for item in request.session.items if item.module is request.module}


class WarmPoolScenarios(sdk_helpers.ScenarioRunner):
    script = SDK_SCENARIOS


@pytest.fixture(scope="module")
def sdk(module_kiln, bucket, tmp_path_factory, request):
    """Runs the SDK scenario first (the node has one slot: the boto3 tests come after it)."""
    lib = sdk_helpers.sdk_lib_dir()
    if lib is None or SDK_TEST not in selected_tests(request):
        yield None
        return
    runner = WarmPoolScenarios(module_kiln, str(tmp_path_factory.mktemp("sdk-warm")), lib)
    args = {"bucket": bucket, "first": unique("sdk-warm-a"), "second": unique("sdk-warm-b"),
            "keep_alive": KEEP_ALIVE, "channel": "s3://%s/data" % bucket}
    runner.start("reuse", args, timeout=300)
    try:
        yield runner.result("reuse"), args
    finally:
        runner.stop_all()


def test_sdk_second_fit_lands_on_the_first_jobs_pool(sdk, module_kiln, sm, logs):
    if sdk is None:
        pytest.skip("SageMaker Python SDK bundle not found")
    result, args = sdk
    first, second = args["first"], args["second"]
    a, b = result[first], result[second]
    assert a["TrainingJobStatus"] == "Completed" and b["TrainingJobStatus"] == "Completed"
    assert a["ResourceConfig"]["KeepAlivePeriodInSeconds"] == KEEP_ALIVE
    # When the second fit returned, the first job's pool was Reused by it and the second kept its own.
    assert b["WarmPoolStatus"] == {"Status": "Available"}, b["WarmPoolStatus"]
    reused = result["first_final"]["WarmPoolStatus"]
    assert reused["Status"] == "Reused" and reused["ReusedByJob"] == second, reused
    assert 0 <= reused["ResourceRetainedBillableTimeInSeconds"] <= KEEP_ALIVE
    # The second started on the kept hosts: no wait for capacity, and it says where they came from.
    starting = [t["StatusMessage"] for t in b["SecondaryStatusTransitions"] if t["Status"] == "Starting"]
    assert any(m.startswith("Reusing the warm pool of training job " + first) for m in starting), starting
    assert "Pending" not in [t["Status"] for t in b["SecondaryStatusTransitions"]]
    # update_training_job(KeepAlivePeriodInSeconds=0) ended the second's pool at once.
    after = result["second_after_update"]
    assert after["ResourceConfig"]["KeepAlivePeriodInSeconds"] == 0
    assert after["WarmPoolStatus"]["Status"] == "Terminated", after["WarmPoolStatus"]
    assert after["WarmPoolStatus"]["ResourceRetainedBillableTimeInSeconds"] >= 0
    # Inside: the persistent cache carried the first job's mark; the channel was the same data.
    first_lines, second_lines = th.job_log_lines(logs, first), th.job_log_lines(logs, second)
    assert "warm_pool: cache directory /opt/ml/sagemaker/warmpoolcache" in first_lines
    assert "warm_pool: cache empty" in first_lines, first_lines
    assert "warm_pool: cache kept from %s" % first in second_lines, second_lines
    digests = [[line for line in lines if line.startswith("warm_pool: channel files=24 ")]
               for lines in (first_lines, second_lines)]
    assert digests[0] and digests[0] == digests[1], digests
    # Nothing of the pools is held any more: the node is free for the next test.
    assert pool(sm, first)["Status"] == "Reused"


def test_describe_list_and_a_job_that_does_not_match(module_kiln, sm, bucket, sdk):
    kept, other = unique("kept"), unique("other")
    assert run_probe(sm, bucket, kept, seconds=600)["TrainingJobStatus"] == "Completed"
    d = sm.describe_training_job(TrainingJobName=kept)
    assert d["WarmPoolStatus"] == {"Status": "Available"}
    assert d["ResourceConfig"]["KeepAlivePeriodInSeconds"] == 600
    listed = sm.list_training_jobs(WarmPoolStatusEquals="Available", MaxResults=100)["TrainingJobSummaries"]
    assert kept in [s["TrainingJobName"] for s in listed]
    assert [s["WarmPoolStatus"] for s in listed if s["TrainingJobName"] == kept] == [{"Status": "Available"}]
    # A job without a keep-alive period does not match; the pool holds the only slot, so it is
    # terminated for the job instead of the job waiting behind it.
    assert run_probe(sm, bucket, other)["TrainingJobStatus"] == "Completed"
    ended = pool(sm, kept)
    assert ended["Status"] == "Terminated" and "ReusedByJob" not in ended, ended
    assert ended["ResourceRetainedBillableTimeInSeconds"] >= 0
    assert "WarmPoolStatus" not in sm.describe_training_job(TrainingJobName=other)
    names = [s["TrainingJobName"]
             for s in sm.list_training_jobs(WarmPoolStatusEquals="Terminated", MaxResults=100)["TrainingJobSummaries"]]
    assert kept in names and other not in names
    # A Terminated pool has nothing to update.
    err = error_of(lambda: sm.update_training_job(TrainingJobName=kept,
                                                  ResourceConfig={"KeepAlivePeriodInSeconds": 60}))
    assert err["Code"] == "ValidationException" and "is Completed" in err["Message"], err


def test_a_pool_ends_when_its_period_runs_out(module_kiln, sm, bucket, sdk):
    name = unique("short")
    assert run_probe(sm, bucket, name, seconds=2)["TrainingJobStatus"] == "Completed"
    ended = wait_pool(sm, name, "Terminated", timeout=30)
    assert 1 <= ended["ResourceRetainedBillableTimeInSeconds"] <= 2, ended


def test_update_extends_an_available_pool_and_refuses_other_changes(module_kiln, sm, bucket, sdk):
    name = unique("upd")
    run_probe(sm, bucket, name, seconds=30)
    assert pool(sm, name) == {"Status": "Available"}
    sm.update_training_job(TrainingJobName=name, ResourceConfig={"KeepAlivePeriodInSeconds": 900})
    assert sm.describe_training_job(TrainingJobName=name)["ResourceConfig"]["KeepAlivePeriodInSeconds"] == 900
    err = error_of(lambda: sm.update_training_job(TrainingJobName=name,
                                                  ProfilerConfig={"DisableProfiler": True}))
    assert err["Code"] == "ValidationException", err
    assert "KeepAlivePeriodInSeconds" in err["Message"], err
    sm.update_training_job(TrainingJobName=name, ResourceConfig={"KeepAlivePeriodInSeconds": 0})
    assert pool(sm, name)["Status"] == "Terminated"


def test_keep_alive_with_spot_or_out_of_range_is_refused(module_kiln, sm, bucket):
    spot = th.training_request(unique("spot-pool"), bucket, EnableManagedSpotTraining=True)
    spot["ResourceConfig"] = keep_alive(60)
    spot["StoppingCondition"]["MaxWaitTimeInSeconds"] = 1200
    err = error_of(lambda: sm.create_training_job(**spot))
    assert err["Code"] == "ValidationException" and "managed spot" in err["Message"], err
    too_long = th.training_request(unique("long-pool"), bucket)
    too_long["ResourceConfig"] = keep_alive(21601)
    assert error_of(lambda: sm.create_training_job(**too_long))["Code"] == "ValidationException"


def test_aws_cli_lists_by_warm_pool_status(module_kiln, bucket, tmp_path, sdk):
    name = unique("cli")
    sm = module_kiln.client("sagemaker")
    run_probe(sm, bucket, name, seconds=600)
    aws = th.aws_runner(module_kiln, str(tmp_path))
    out = aws("sagemaker", "list-training-jobs", "--warm-pool-status-equals", "Available", "--output", "json")
    names = [s["TrainingJobName"] for s in json.loads(out.stdout)["TrainingJobSummaries"]]
    assert name in names
    sm.update_training_job(TrainingJobName=name, ResourceConfig={"KeepAlivePeriodInSeconds": 0})
