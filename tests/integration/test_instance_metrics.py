"""Instance metrics (issue 10; training-contract.md §15, serving-contract.md §15.3): a training job
that keeps one core busy shows CPUUtilization, MemoryUtilization and DiskUtilization (unit
Percent) under Host=<job>/algo-1 in /aws/sagemaker/TrainingJobs, read back with CloudWatch's
GetMetricStatistics through Debian's boto3; no GPU metrics on a host without GPUs. A two-instance
endpoint variant writes both instances' points into one EndpointName+VariantName series and each
into its own Host=<endpoint>/<variant>/<instance-id> series in /aws/sagemaker/Endpoints.

The server samples every second here (instance_metrics.interval_seconds) so that a 12 s job gives
about ten points; production samples every 10 s."""

import datetime
import os

import pytest

import endpoint_helpers as eh
import training_helpers as th
from training_helpers import sm, s3  # noqa: F401 (module-scoped client fixtures)

KILN_CONFIG = dict(th.SHRINK_CONFIG, endpoints=eh.ENDPOINT_CONFIG["endpoints"],
                   instance_metrics={"interval_seconds": 1})
NS = "/aws/sagemaker/TrainingJobs"
BURN_IMAGE = "local:" + os.path.join(th.JOBS_DIR, "cpu_burn.py")


@pytest.fixture(scope="module")
def cloudwatch(module_kiln):
    return module_kiln.client("cloudwatch")


@pytest.fixture(scope="module")
def burned_job(module_kiln, sm, s3):
    bucket = th.unique_name("im")
    s3.create_bucket(Bucket=bucket)
    name = th.unique_name("burn")
    sm.create_training_job(**th.training_request(name, bucket, image=BURN_IMAGE,
                                                 hyperparameters={"seconds": "12", "memory_mib": "64"}))
    d = th.wait_for_status(sm, name, timeout=90, server=module_kiln)
    assert d["TrainingJobStatus"] == "Completed", d.get("FailureReason")
    return d


def stats(cloudwatch, job, metric, start, end):
    r = cloudwatch.get_metric_statistics(
        Namespace=NS, MetricName=metric, Dimensions=[{"Name": "Host", "Value": job + "/algo-1"}],
        StartTime=start, EndTime=end, Period=60, Statistics=["Average", "Maximum", "Minimum", "SampleCount"])
    return r["Datapoints"]


def test_training_host_metrics(burned_job, cloudwatch):
    job = burned_job["TrainingJobName"]
    start = burned_job["TrainingStartTime"] - datetime.timedelta(minutes=2)
    end = burned_job["TrainingEndTime"] + datetime.timedelta(minutes=2)

    cpu = stats(cloudwatch, job, "CPUUtilization", start, end)
    assert cpu, "no CPUUtilization for Host=%s/algo-1" % job
    assert all(p["Unit"] == "Percent" for p in cpu)
    assert sum(p["SampleCount"] for p in cpu) >= 5  # ~1 s samples over a 12 s job
    # One core busy: ~100 % (0–100 × vCPUs). Other work on a 2-core build host can take some of it.
    assert max(p["Maximum"] for p in cpu) > 40, cpu
    assert max(p["Maximum"] for p in cpu) <= 100 * os.cpu_count() + 5, cpu

    memory = stats(cloudwatch, job, "MemoryUtilization", start, end)
    assert memory and all(p["Unit"] == "Percent" for p in memory)
    assert all(0 < p["Minimum"] and p["Maximum"] <= 100 for p in memory), memory

    disk = stats(cloudwatch, job, "DiskUtilization", start, end)
    assert disk and all(p["Unit"] == "Percent" for p in disk)
    assert all(0 < p["Minimum"] and p["Maximum"] <= 100 for p in disk), disk

    # No GPUs on this host and the job's instance type has none: no GPU metrics; and nothing
    # under the job-level dimension set, which belongs to MetricDefinitions' metrics.
    assert stats(cloudwatch, job, "GPUUtilization", start, end) == []
    r = cloudwatch.get_metric_statistics(
        Namespace=NS, MetricName="CPUUtilization", Dimensions=[{"Name": "TrainingJobName", "Value": job}],
        StartTime=start, EndTime=end, Period=60, Statistics=["Average"])
    assert r["Datapoints"] == []


def test_endpoint_instance_metrics(module_kiln, sm, cloudwatch):
    name = eh.unique_name("im-ep")
    eh.create_model(sm, name + "-model")
    eh.deploy(sm, name, [("AllTraffic", name + "-model", 2, 1.0)], server=module_kiln)
    start = datetime.datetime.now(datetime.timezone.utc) - datetime.timedelta(minutes=2)
    variant = [{"Name": "EndpointName", "Value": name}, {"Name": "VariantName", "Value": "AllTraffic"}]

    def variant_stats(metric):
        return cloudwatch.get_metric_statistics(
            Namespace="/aws/sagemaker/Endpoints", MetricName=metric, Dimensions=variant, StartTime=start,
            EndTime=datetime.datetime.now(datetime.timezone.utc) + datetime.timedelta(minutes=2), Period=60,
            Statistics=["SampleCount", "Maximum", "Minimum"])["Datapoints"]

    # Both instances write into the variant's series: after ~3 samples each there are >= 4 points.
    th.wait_until(lambda: sum(p["SampleCount"] for p in variant_stats("CPUUtilization")) >= 4, timeout=30,
                  what="CPUUtilization points of both instances")
    memory = variant_stats("MemoryUtilization")
    assert memory and all(0 < p["Minimum"] and p["Maximum"] <= 100 and p["Unit"] == "Percent" for p in memory)
    assert variant_stats("DiskUtilization")
    assert variant_stats("GPUUtilization") == []

    # One Host series per instance, named <endpoint>/<variant>/<instance-id>.
    hosts = set()
    for page in cloudwatch.get_paginator("list_metrics").paginate(Namespace="/aws/sagemaker/Endpoints",
                                                                  MetricName="CPUUtilization"):
        for m in page["Metrics"]:
            for d in m["Dimensions"]:
                if d["Name"] == "Host" and d["Value"].startswith(name + "/AllTraffic/"):
                    hosts.add(d["Value"])
    assert len(hosts) == 2, hosts
    sm.delete_endpoint(EndpointName=name)
    # Deletion finishes asynchronously (instances stopped, the endpoint's network removed): the
    # module's server must not stop before, or the network stays until a server sweeps it.
    th.wait_until(lambda: eh.endpoint_gone(sm, name), timeout=60, what="endpoint %s deleted" % name)
