"""Multi-model endpoints (serving-contract.md §7, §15.2-§15.3; runtime-api.md TargetModel, ValidationError,
ModelNotReadyException). Kiln's model server runs the sagemaker-scikit-learn image's models in multi-model
mode (SAGEMAKER_MULTI_MODEL=true); Kiln downloads ModelDataUrl + TargetModel into the instance's
/opt/ml/models/<name>/model and loads it through the container's /models API, unloading the least
recently used model when the container answers 507.

- the SageMaker SDK's MultiDataModel (unpatched, in a scenario process: sdk/mme_scenarios.py) over an
  SKLearnModel with an entry point: deploy, add_model() of four archives, list_models(), predict() of every
  model twice round. Each loaded model holds 200 MB and the container's memory limit
  (KILN_MODEL_SERVER_MEMORY_LIMIT_MB 520) fits two: every answer is still the right model's,
  and CloudWatch shows the evictions (ModelUnloadingTime, LoadedModelCount below the model count, more
  loads than downloads: an evicted model's files stay on disk), cache hits and misses (ModelCacheHit);
- boto3: a TargetModel with no object → ValidationError "Failed to download model data"; no TargetModel →
  ValidationError; a model whose load outlasts multi_model.load_wait_seconds (2 s here) →
  ModelNotReadyException (429) while it keeps loading, then served; a single-model endpoint invoked all
  along answers every request meanwhile; refused configurations.
One module server; about 30 s on 2 cores."""

import datetime
import io
import json
import os
import tarfile
import threading
import time

import pytest

import endpoint_helpers as eh
import sdk_helpers
from training_helpers import sm  # noqa: F401 (module-scoped client fixture)

LOAD_WAIT_SECONDS = 2
KILN_CONFIG = dict(eh.ENDPOINT_CONFIG, multi_model={"load_wait_seconds": LOAD_WAIT_SECONDS},
                   endpoints={"invocation_timeout_seconds": 30, "stop_grace_seconds": 5,
                              "health_interval_seconds": 0.5})

HERE = os.path.dirname(os.path.abspath(__file__))
MODELS = 4
# A loaded model holds about BALLAST_MB + 40 MB (its worker process): two fit under the limit, and with
# two loaded the container's own check (90 % of the limit in use) answers 507 before a third loads.
BALLAST_MB = 200
MEMORY_LIMIT_MB = 520
ROWS = [[1.0, 2.0], [3.0, -1.0]]
BUCKET = "kiln-mme-sdk"
MODEL_BUCKET = "kiln-mme-models"  # not the session's default bucket (add_model then adds no owner check)
PREFIX = "s3://%s/mme/" % MODEL_BUCKET


class MmeScenarios(sdk_helpers.ScenarioRunner):
    script = os.path.join(HERE, "sdk", "mme_scenarios.py")


def weights(i):
    return [float(i + 1), -0.5 * i]


def archive(name, info, w):
    import numpy as np
    buf = io.BytesIO()
    np.save(buf, np.array(w, dtype=np.float64))
    files = {"weights.npy": buf.getvalue(), "info.json": json.dumps(dict(info, name=name)).encode()}
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w:gz") as tar:
        for member, content in files.items():
            ti = tarfile.TarInfo(member)
            ti.size = len(content)
            tar.addfile(ti, io.BytesIO(content))
    return out.getvalue()


def expected(i):
    w = weights(i)
    return [r[0] * w[0] + r[1] * w[1] for r in ROWS]


@pytest.fixture(scope="module", autouse=True)
def _no_endpoint_left_behind(sm):  # noqa: F811
    yield
    eh.delete_all_endpoints(sm)


@pytest.fixture(scope="module")
def srv(module_kiln):
    return module_kiln


@pytest.fixture(scope="module")
def rt(srv):
    # No retries: ModelNotReadyException and errors are counted as they come.
    return srv.client("sagemaker-runtime", retries=1, read_timeout=70)


@pytest.fixture(scope="module")
def mme(srv, tmp_path_factory):
    """The SDK scenario's endpoint (deployed, every model predicted twice round) and its result."""
    if sdk_helpers.sdk_lib_dir() is None:
        pytest.skip("SageMaker Python SDK bundle not found (../shared/clients/sagemaker-python-sdk/lib)")
    s3 = srv.client("s3")
    s3.create_bucket(Bucket=BUCKET)
    s3.create_bucket(Bucket=MODEL_BUCKET)
    work = tmp_path_factory.mktemp("mme")
    paths = []
    for i in range(MODELS):
        path = work / ("model-%d.tar.gz" % i)
        path.write_bytes(archive("model-%d" % i, {"ballast_mb": BALLAST_MB}, weights(i)))
        paths.append(str(path))
    # Not added through the SDK: the slow model of test_model_not_ready.
    s3.put_object(Bucket=MODEL_BUCKET, Key="mme/slow.tar.gz",
                  Body=archive("slow", {"load_seconds": LOAD_WAIT_SECONDS + 2}, [1.0, 1.0]))
    runner = MmeScenarios(srv, str(work / "sdk"), sdk_helpers.sdk_lib_dir())
    name = eh.unique_name("mme")
    runner.start("multidatamodel", {"bucket": BUCKET, "name": name, "prefix": PREFIX, "archives": paths,
                                    "rows": ROWS, "env": {"KILN_MODEL_SERVER_MEMORY_LIMIT_MB": str(MEMORY_LIMIT_MB)}},
                 timeout=120)
    try:
        yield name, runner.result("multidatamodel")
    finally:
        runner.stop_all()


@pytest.fixture(scope="module")
def single(sm):  # noqa: F811
    """A single-model endpoint of the test serving program, the "other traffic"."""
    name = eh.unique_name("mme-other")
    eh.create_model(sm, name + "-m")
    eh.deploy(sm, name, [("AllTraffic", name + "-m", 1, 1.0)])
    return name


def metric(srv, endpoint, name, stats=("SampleCount", "Sum", "Maximum"), namespace="AWS/SageMaker", host=None):
    dims = [{"Name": "EndpointName", "Value": endpoint}, {"Name": "VariantName", "Value": "AllTraffic"}]
    if host:
        dims.append({"Name": "Host", "Value": host})
    now = datetime.datetime.now(datetime.timezone.utc)
    out = srv.client("cloudwatch").get_metric_statistics(
        Namespace=namespace, MetricName=name, Dimensions=dims, StartTime=now - datetime.timedelta(minutes=10),
        EndTime=now + datetime.timedelta(minutes=1), Period=3600, Statistics=list(stats))
    points = out["Datapoints"]
    if not points:
        return None
    total = {s: 0.0 for s in stats}
    for p in points:
        for s in stats:
            total[s] = max(total[s], p[s]) if s == "Maximum" else total[s] + p[s]
    total["Unit"] = points[0]["Unit"]
    return total


def test_sdk_multidatamodel_serves_every_model(mme):
    name, result = mme
    container = result["model"]["PrimaryContainer"]
    assert container["Mode"] == "MultiModel"
    assert container["ModelDataUrl"] == PREFIX
    assert sorted(os.path.basename(p) for p in result["added"]) == ["model-%d.tar.gz" % i for i in range(MODELS)]
    assert result["listed"] == ["model-%d.tar.gz" % i for i in range(MODELS)] + ["slow.tar.gz"]
    assert len(result["predictions"]) == 2 * MODELS
    for p in result["predictions"]:
        i = int(p["target"].split("-")[1].split(".")[0])
        assert p["answer"]["model"] == "model-%d" % i, p
        assert p["answer"]["prediction"] == pytest.approx(expected(i)), p


def test_lru_evictions_observed(srv, sm, rt, mme):  # noqa: F811
    name, result = mme
    # A hit: the model just served is loaded (same worker process).
    last = result["predictions"][-1]
    body, _ = eh.invoke(rt, name, body=json.dumps(ROWS).encode(), TargetModel=last["target"])
    assert body["pid"] == last["answer"]["pid"]
    # Two models fit: the second round found the first ones evicted.
    pids = {}
    for p in result["predictions"]:
        pids.setdefault(p["target"], set()).add(p["answer"]["pid"])
    assert any(len(v) == 2 for v in pids.values()), pids  # reloaded: a new worker process

    def settled():
        loads = metric(srv, name, "ModelLoadingTime")
        unloads = metric(srv, name, "ModelUnloadingTime")
        hits = metric(srv, name, "ModelCacheHit")
        return loads and unloads and hits and hits["SampleCount"] >= 2 * MODELS + 1 and (loads, unloads, hits)

    loads, unloads, hits = eh.wait_until(settled, timeout=10, poll=0.5, what="the multi-model metrics")
    downloads = metric(srv, name, "ModelDownloadingTime")
    assert downloads["SampleCount"] == MODELS  # files stay on disk when a model is unloaded
    assert loads["SampleCount"] > MODELS
    assert unloads["SampleCount"] >= loads["SampleCount"] - 3
    assert loads["Unit"] == unloads["Unit"] == downloads["Unit"] == "Microseconds"
    assert 1 <= hits["Sum"] < hits["SampleCount"]
    assert hits["Unit"] == "Count"
    wait = metric(srv, name, "ModelLoadingWaitTime")
    assert wait["SampleCount"] == hits["SampleCount"] - hits["Sum"]
    count = metric(srv, name, "LoadedModelCount", namespace="/aws/sagemaker/Endpoints")
    assert count["Unit"] == "Count"
    assert 2 <= count["Maximum"] < MODELS
    instance = sm.describe_endpoint(EndpointName=name)["ProductionVariants"][0]
    assert instance["CurrentInstanceCount"] == 1


def test_missing_model_and_missing_target(rt, mme):
    name, _ = mme
    err = eh.invoke_error(rt, name, body=json.dumps(ROWS).encode(), TargetModel="team-x/absent.tar.gz")
    assert err["Error"]["Code"] == "ValidationError"
    assert err["ResponseMetadata"]["HTTPStatusCode"] == 400
    assert err["Error"]["Message"] == (
        "Failed to download model data(bucket: %s, key: mme/team-x/absent.tar.gz). Please ensure that there is an "
        "object located at the URL and that the role passed to CreateModel has permissions to download the model."
        % MODEL_BUCKET)
    err = eh.invoke_error(rt, name, body=json.dumps(ROWS).encode())
    assert err["Error"]["Code"] == "ValidationError"
    assert "TargetModel" in err["Error"]["Message"]


def test_model_not_ready_then_served_other_traffic_unaffected(srv, rt, mme, single):
    name, result = mme
    loaded = result["predictions"][-1]  # the last model served: still loaded
    failures, latencies = [], []
    stop = threading.Event()
    other = srv.client("sagemaker-runtime", retries=1, read_timeout=70)

    def other_traffic():
        while not stop.is_set():
            t0 = time.monotonic()
            try:
                eh.invoke(other, single)
            except Exception as e:  # noqa: BLE001
                failures.append(repr(e))
            latencies.append(time.monotonic() - t0)

    thread = threading.Thread(target=other_traffic)
    thread.start()
    try:
        t0 = time.monotonic()
        err = eh.invoke_error(rt, name, body=json.dumps(ROWS).encode(), TargetModel="slow.tar.gz")
        waited = time.monotonic() - t0
        assert err["Error"]["Code"] == "ModelNotReadyException", err
        assert err["ResponseMetadata"]["HTTPStatusCode"] == 429
        assert LOAD_WAIT_SECONDS - 0.5 <= waited < LOAD_WAIT_SECONDS + 2, waited
        # Meanwhile a loaded model of the endpoint is served as before.
        t0 = time.monotonic()
        body, _ = eh.invoke(rt, name, body=json.dumps(ROWS).encode(), TargetModel=loaded["target"])
        assert body["pid"] == loaded["answer"]["pid"]
        assert time.monotonic() - t0 < 1.0
        # The load went on: soon the slow model answers.

        def served():
            try:
                b, _ = eh.invoke(rt, name, body=json.dumps(ROWS).encode(), TargetModel="slow.tar.gz")
                return b
            except Exception as e:  # noqa: BLE001
                if "ModelNotReadyException" not in repr(e):
                    raise
                return None

        body = eh.wait_until(served, timeout=20, poll=0.5, what="the slow model loaded")
        assert body["model"] == "slow"
        assert body["prediction"] == pytest.approx([3.0, 2.0])
    finally:
        stop.set()
        thread.join()
    assert not failures, failures[:3]
    assert len(latencies) > 10
    assert max(latencies) < 2.0, max(latencies)


def test_refused_configurations(srv, sm, mme):  # noqa: F811
    name, _ = mme
    model = sm.describe_endpoint_config(
        EndpointConfigName=sm.describe_endpoint(EndpointName=name)["EndpointConfigName"])["ProductionVariants"][0][
        "ModelName"]
    with pytest.raises(Exception) as info:
        sm.create_endpoint_config(EndpointConfigName=eh.unique_name("mme-sl"), ProductionVariants=[
            {"VariantName": "AllTraffic", "ModelName": model,
             "ServerlessConfig": {"MemorySizeInMB": 1024, "MaxConcurrency": 1}}])
    assert "ValidationException" in str(info.value)
    assert "multi-model" in str(info.value)
    with pytest.raises(Exception) as info:
        sm.create_endpoint_config(EndpointConfigName=eh.unique_name("mme-async"), ProductionVariants=[
            {"VariantName": "AllTraffic", "ModelName": model, "InstanceType": "ml.m5.large",
             "InitialInstanceCount": 1}],
            AsyncInferenceConfig={"OutputConfig": {"S3OutputPath": "s3://%s/out/" % BUCKET}})
    assert "ValidationException" in str(info.value)
    assert "multi-model" in str(info.value)
