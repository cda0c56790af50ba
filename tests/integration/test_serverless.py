"""Serverless endpoint variants (issue 19; serving-contract.md §12, §15.2 ModelSetupTime; runtime-api.md
ThrottlingException / ModelNotReadyException): a variant with ServerlessConfig runs as a pool of instances of
the test serving program (endpoints/serve_app.py) that grows with requests in flight (one per instance) and
shrinks after `serverless.idle_seconds` (2 s here) to ProvisionedConcurrency (0 when unset).

- the SageMaker SDK's ServerlessInferenceConfig: model.deploy(serverless_inference_config=...) (in a scenario
  process, sdk_helpers.py), started first so that it overlaps the rest;
- boto3: the first request cold-starts an instance (ModelSetupTime in CloudWatch GetMetricStatistics), the
  pool returns to 0 when idle (DescribeEndpoint stays InService) and the next request starts it again;
- more than MaxConcurrency requests in flight → ThrottlingException (429);
- ProvisionedConcurrency 1: InService with a warm instance, no cold start for a lone request, a second
  concurrent one starts another instance, idle takes the pool back to 1; ServerlessUpdateConfig raises it
  to 2 (the pool follows); a DesiredProvisionedConcurrency scalable target with a target-tracking policy
  on SageMakerVariantProvisionedConcurrencyUtilization (whose metric Kiln publishes);
- bad configurations → ValidationException.
One module server; ~16 s on 2 cores."""

import datetime
import json
import os
import threading
import time

import pytest
from botocore.exceptions import ClientError

import endpoint_helpers as eh
import kiln_harness as kh
import sdk_helpers
from training_helpers import sm  # noqa: F401 (module-scoped client fixture)

IDLE_SECONDS = 2
KILN_CONFIG = dict(eh.ENDPOINT_CONFIG, serverless={"idle_seconds": IDLE_SECONDS},
                   endpoints={"invocation_timeout_seconds": 30, "stop_grace_seconds": 5,
                              "health_interval_seconds": 0.5})


class ServerlessScenarios(sdk_helpers.ScenarioRunner):
    """The SageMaker SDK's ServerlessInferenceConfig in a process of its own (sdk_helpers)."""
    script = os.path.join(os.path.dirname(os.path.abspath(__file__)), "sdk", "serverless_scenarios.py")


@pytest.fixture(scope="module", autouse=True)
def _no_endpoint_left_behind(sm):  # noqa: F811
    yield
    eh.delete_all_endpoints(sm)


@pytest.fixture(scope="module")
def srv(module_kiln):
    return module_kiln


@pytest.fixture(scope="module")
def sdk_runner(srv, tmp_path_factory):
    lib = sdk_helpers.sdk_lib_dir()
    if lib is None:
        yield None
        return
    srv.client("s3").create_bucket(Bucket="kiln-serverless-sdk")
    runner = ServerlessScenarios(srv, str(tmp_path_factory.mktemp("sdk")), lib)
    runner.start("serverless_predictor", {"bucket": "kiln-serverless-sdk", "name": eh.unique_name("sdk-sl")},
                 timeout=120)
    yield runner
    runner.stop_all()


@pytest.fixture(scope="module")
def rt(srv):
    # No retries: the throttling test counts ThrottlingExceptions (botocore retries them by name).
    return srv.client("sagemaker-runtime", retries=1, read_timeout=70)


def serverless_config(sm, name, model, max_concurrency=2, provisioned=None, memory=1024):  # noqa: F811
    config = {"MemorySizeInMB": memory, "MaxConcurrency": max_concurrency}
    if provisioned is not None:
        config["ProvisionedConcurrency"] = provisioned
    sm.create_endpoint_config(EndpointConfigName=name, ProductionVariants=[
        {"VariantName": "AllTraffic", "ModelName": model, "ServerlessConfig": config}])
    return name


@pytest.fixture(scope="module")
def endpoint(sm, sdk_runner):  # noqa: F811
    """A serverless endpoint with MaxConcurrency 2 and no ProvisionedConcurrency: InService at 0."""
    name = eh.unique_name("sl")
    eh.create_model(sm, name + "-m")
    serverless_config(sm, name + "-cfg", name + "-m")
    sm.create_endpoint(EndpointName=name, EndpointConfigName=name + "-cfg")
    eh.wait_endpoint(sm, name)
    return name


def instance_count(sm, name):  # noqa: F811
    """The routable instances of the endpoint's variant, as VariantStatus and the row know them."""
    d = sm.describe_endpoint(EndpointName=name)
    return d, d["ProductionVariants"][0] if d.get("ProductionVariants") else None


def test_describe_shows_serverless_config(sm, endpoint):  # noqa: F811
    d, variant = instance_count(sm, endpoint)
    assert d["EndpointStatus"] == "InService"
    want = {"MemorySizeInMB": 1024, "MaxConcurrency": 2}
    assert variant["CurrentServerlessConfig"] == want
    assert variant["DesiredServerlessConfig"] == want
    assert "CurrentInstanceCount" not in variant and "DesiredInstanceCount" not in variant


def test_cold_start_scale_to_zero_and_back(srv, sm, rt, endpoint):  # noqa: F811
    t0 = time.monotonic()
    body, r = eh.invoke(rt, endpoint, body=json.dumps({"x": 1}).encode())
    first = time.monotonic() - t0
    assert r["ResponseMetadata"]["HTTPStatusCode"] == 200
    t0 = time.monotonic()
    eh.invoke(rt, endpoint)
    warm = time.monotonic() - t0
    assert warm < first, (warm, first)
    # Idle for IDLE_SECONDS: the instance is stopped; the endpoint stays InService.
    eh.wait_until(lambda: pool_size(srv, endpoint) == 0, timeout=IDLE_SECONDS + 15, poll=0.5,
                  what="the serverless pool back to 0")
    # The instance is gone (drained and stopped) before the next request, so it is a cold start.
    time.sleep(1)
    assert sm.describe_endpoint(EndpointName=endpoint)["EndpointStatus"] == "InService"
    # ...and the next request starts an instance again.
    t0 = time.monotonic()
    _, r = eh.invoke(rt, endpoint)
    second_cold = time.monotonic() - t0
    assert r["ResponseMetadata"]["HTTPStatusCode"] == 200
    assert second_cold > warm
    # ModelSetupTime: one sample per cold start, in Microseconds.
    cw = srv.client("cloudwatch")
    now = datetime.datetime.now(datetime.timezone.utc)

    def setup_time():
        out = cw.get_metric_statistics(
            Namespace="AWS/SageMaker", MetricName="ModelSetupTime",
            Dimensions=[{"Name": "EndpointName", "Value": endpoint}, {"Name": "VariantName", "Value": "AllTraffic"}],
            StartTime=now - datetime.timedelta(minutes=10), EndTime=now + datetime.timedelta(minutes=1),
            Period=3600, Statistics=["SampleCount", "Maximum"], Unit="Microseconds")
        points = out["Datapoints"]
        return points and points[0]["SampleCount"] >= 2 and points

    points = eh.wait_until(setup_time, timeout=10, poll=0.5, what="ModelSetupTime samples")
    assert 0 < points[0]["Maximum"] < 60e6, points


def pool_size(srv, endpoint):
    """The pool size the serverless scaler last wrote for `endpoint` (its log line), or None."""
    size = None
    for line in srv.log_text().splitlines():
        if "serverless: pool size" in line and endpoint in line:
            for word in line.split():
                if word.startswith("size="):
                    size = int(word[5:].strip('"'))
    return size


def test_max_concurrency_exceeded_is_throttled(srv, sm, rt, endpoint):  # noqa: F811
    results = []
    lock = threading.Lock()

    def call():
        try:
            eh.invoke(rt, endpoint, body=json.dumps({"sleep": 2}).encode())
            code = "ok"
        except ClientError as e:
            code = (e.response["Error"]["Code"], e.response["ResponseMetadata"]["HTTPStatusCode"],
                    e.response["Error"]["Message"])
        with lock:
            results.append(code)

    threads = [threading.Thread(target=call) for _ in range(2)]
    for t in threads:
        t.start()
    time.sleep(0.5)  # both admitted (MaxConcurrency 2) and waiting or running
    extra = threading.Thread(target=call)
    extra.start()
    extra.join()
    for t in threads:
        t.join()
    throttled = [r for r in results if r != "ok"]
    assert results.count("ok") == 2, results
    assert len(throttled) == 1 and throttled[0][0] == "ThrottlingException" and throttled[0][1] == 429, results
    assert "MaxConcurrency (2)" in throttled[0][2]


def model_setup_samples(srv, endpoint):
    cw = srv.client("cloudwatch")
    now = datetime.datetime.now(datetime.timezone.utc)
    points = cw.get_metric_statistics(
        Namespace="AWS/SageMaker", MetricName="ModelSetupTime",
        Dimensions=[{"Name": "EndpointName", "Value": endpoint}, {"Name": "VariantName", "Value": "AllTraffic"}],
        StartTime=now - datetime.timedelta(minutes=10), EndTime=now + datetime.timedelta(minutes=1),
        Period=3600, Statistics=["SampleCount"])["Datapoints"]
    return int(sum(p["SampleCount"] for p in points))


def test_provisioned_concurrency_stays_warm(srv, sm, rt):  # noqa: F811
    """ProvisionedConcurrency 1 (a signed JSON request: botocore 1.26 lacks it): InService with one warm
    instance, a lone request is no cold start, two at once start a second instance, and idle takes the
    pool back to 1, not 0."""
    name = eh.unique_name("sl-prov")
    eh.create_model(sm, name + "-m")
    config = {"MemorySizeInMB": 1024, "MaxConcurrency": 2, "ProvisionedConcurrency": 1}
    status, _, body = kh.json_request(srv, "SageMaker.CreateEndpointConfig", {
        "EndpointConfigName": name + "-cfg",
        "ProductionVariants": [{"VariantName": "AllTraffic", "ModelName": name + "-m", "ServerlessConfig": config}]})
    assert status == 200, body
    sm.create_endpoint(EndpointName=name, EndpointConfigName=name + "-cfg")
    eh.wait_endpoint(sm, name, server=srv)
    status, _, body = kh.json_request(srv, "SageMaker.DescribeEndpoint", {"EndpointName": name})
    assert json.loads(body)["ProductionVariants"][0]["CurrentServerlessConfig"] == config
    eh.invoke(rt, name)
    time.sleep(1.5)  # ModelSetupTime is written once a second
    assert model_setup_samples(srv, name) == 0
    threads = [threading.Thread(target=eh.invoke, args=(rt, name), kwargs={"body": b'{"sleep": 1}'})
               for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert pool_size(srv, name) == 2
    eh.wait_until(lambda: pool_size(srv, name) == 1, timeout=IDLE_SECONDS + 15, poll=0.5, what="the pool back to 1")
    assert sm.describe_endpoint(EndpointName=name)["EndpointStatus"] == "InService"

    # ServerlessUpdateConfig (botocore 1.26 lacks it: a signed JSON request) raises the warm pool.
    status, _, body = kh.json_request(srv, "SageMaker.UpdateEndpointWeightsAndCapacities", {
        "EndpointName": name, "DesiredWeightsAndCapacities": [
            {"VariantName": "AllTraffic", "ServerlessUpdateConfig": {"MaxConcurrency": 3,
                                                                     "ProvisionedConcurrency": 2}}]})
    assert status == 200, body
    eh.wait_until(lambda: pool_size(srv, name) == 2, timeout=15, poll=0.2, what="the pool raised to 2")
    eh.wait_endpoint(sm, name, server=srv)
    status, _, body = kh.json_request(srv, "SageMaker.DescribeEndpoint", {"EndpointName": name})
    assert json.loads(body)["ProductionVariants"][0]["CurrentServerlessConfig"] == dict(
        config, MaxConcurrency=3, ProvisionedConcurrency=2)
    status, _, body = kh.json_request(srv, "SageMaker.UpdateEndpointWeightsAndCapacities", {
        "EndpointName": name, "DesiredWeightsAndCapacities": [
            {"VariantName": "AllTraffic", "ServerlessUpdateConfig": {"ProvisionedConcurrency": 4}}]})
    assert status == 400 and "exceeds its MaxConcurrency 3" in body.decode(), body

    # Application Auto Scaling scales ProvisionedConcurrency on the utilization Kiln publishes.
    aas = srv.client("application-autoscaling")
    resource = "endpoint/%s/variant/AllTraffic" % name
    aas.register_scalable_target(ServiceNamespace="sagemaker", ResourceId=resource,
                                 ScalableDimension="sagemaker:variant:DesiredProvisionedConcurrency",
                                 MinCapacity=1, MaxCapacity=3)
    aas.put_scaling_policy(
        PolicyName="pc", ServiceNamespace="sagemaker", ResourceId=resource,
        ScalableDimension="sagemaker:variant:DesiredProvisionedConcurrency", PolicyType="TargetTrackingScaling",
        TargetTrackingScalingPolicyConfiguration={
            "TargetValue": 0.5,
            "PredefinedMetricSpecification": {"PredefinedMetricType":
                                              "SageMakerVariantProvisionedConcurrencyUtilization"}})
    metrics = srv.client("cloudwatch").list_metrics(
        Namespace="AWS/SageMaker", MetricName="ServerlessProvisionedConcurrencyUtilization",
        Dimensions=[{"Name": "EndpointName", "Value": name}])["Metrics"]
    assert metrics, "no ServerlessProvisionedConcurrencyUtilization series"
    aas.deregister_scalable_target(ServiceNamespace="sagemaker", ResourceId=resource,
                                   ScalableDimension="sagemaker:variant:DesiredProvisionedConcurrency")
    sm.delete_endpoint(EndpointName=name)


def test_no_instance_count_scaling(srv, sm, endpoint):  # noqa: F811
    """The pool follows requests: DesiredInstanceCount is neither set by hand nor by Application Auto Scaling."""
    with pytest.raises(ClientError) as e:
        sm.update_endpoint_weights_and_capacities(EndpointName=endpoint, DesiredWeightsAndCapacities=[
            {"VariantName": "AllTraffic", "DesiredInstanceCount": 2}])
    assert e.value.response["Error"]["Code"] == "ValidationException"
    assert "is serverless" in e.value.response["Error"]["Message"]
    aas = srv.client("application-autoscaling")
    with pytest.raises(ClientError) as e:
        aas.register_scalable_target(ServiceNamespace="sagemaker",
                                     ResourceId="endpoint/%s/variant/AllTraffic" % endpoint,
                                     ScalableDimension="sagemaker:variant:DesiredInstanceCount",
                                     MinCapacity=1, MaxCapacity=2)
    assert e.value.response["Error"]["Code"] == "ValidationException"
    assert "is serverless" in e.value.response["Error"]["Message"]


def test_bad_configs_are_refused(srv, sm):  # noqa: F811
    model = eh.unique_name("sl-bad")
    eh.create_model(sm, model)

    def refused(variants, **extra):
        with pytest.raises(ClientError) as e:
            sm.create_endpoint_config(EndpointConfigName=eh.unique_name("sl-bad-cfg"), ProductionVariants=variants,
                                      **extra)
        assert e.value.response["Error"]["Code"] == "ValidationException", e.value.response
        return e.value.response["Error"]["Message"]

    def variant(config, name="AllTraffic", **more):
        return dict({"VariantName": name, "ModelName": model, "ServerlessConfig": config}, **more)

    assert "Valid values are 1024, 2048" in refused([variant({"MemorySizeInMB": 1500, "MaxConcurrency": 1})])
    # A signed JSON request: Debian's botocore 1.26 (the suite's client) predates ProvisionedConcurrency.
    status, _, body = kh.json_request(srv, "SageMaker.CreateEndpointConfig", {
        "EndpointConfigName": eh.unique_name("sl-bad-cfg"),
        "ProductionVariants": [variant({"MemorySizeInMB": 1024, "MaxConcurrency": 2, "ProvisionedConcurrency": 3})]})
    assert status == 400 and json.loads(body)["__type"].endswith("ValidationException"), body
    assert "ProvisionedConcurrency (3) must be less than or equal to MaxConcurrency (2)" in json.loads(body)["message"]
    assert "exactly one production variant" in refused(
        [variant({"MemorySizeInMB": 1024, "MaxConcurrency": 1}),
         variant({"MemorySizeInMB": 1024, "MaxConcurrency": 1}, name="B")])
    assert "has both ServerlessConfig and InstanceType" in refused(
        [variant({"MemorySizeInMB": 1024, "MaxConcurrency": 1}, InstanceType="ml.m5.large")])
    assert "DataCaptureConfig is not supported for serverless" in refused(
        [variant({"MemorySizeInMB": 1024, "MaxConcurrency": 1})],
        DataCaptureConfig={"InitialSamplingPercentage": 10, "DestinationS3Uri": "s3://b/c",
                           "CaptureOptions": [{"CaptureMode": "Input"}]})
    isolated = eh.unique_name("sl-iso")
    sm.create_model(ModelName=isolated, PrimaryContainer={"Image": eh.SERVE_IMAGE}, ExecutionRoleArn=eh.ROLE_ARN,
                    EnableNetworkIsolation=True)
    with pytest.raises(ClientError) as e:
        sm.create_endpoint_config(EndpointConfigName=eh.unique_name("sl-bad-cfg"), ProductionVariants=[
            {"VariantName": "AllTraffic", "ModelName": isolated,
             "ServerlessConfig": {"MemorySizeInMB": 1024, "MaxConcurrency": 1}}])
    assert "network isolation" in e.value.response["Error"]["Message"]


def test_sdk_serverless_predictor(sdk_runner):
    if sdk_runner is None:
        pytest.skip("SageMaker Python SDK bundle not found (KILN_SAGEMAKER_SDK_LIB)")
    r = sdk_runner.result("serverless_predictor")
    assert r["endpoint_config"]["ProductionVariants"][0]["ServerlessConfig"] == {
        "MemorySizeInMB": 1024, "MaxConcurrency": 2}
    assert r["result"]["echo_len"] == len(json.dumps({"hello": "serverless"}))
