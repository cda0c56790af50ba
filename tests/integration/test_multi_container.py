"""Multi-container endpoints and inference pipelines (issue 20; serving-contract.md §2, §8, §15).

One module server (the default network mode: as root each instance gets a network namespace of its own, which
every container of the instance shares) and the test serving program endpoints/pipeline_app.py in three roles:
- the SageMaker SDK's PipelineModel of a preprocessing container (CSV → JSON features) and a model container
  (JSON features → CSV, scaled by its own model data), deployed and predicted through (sdk/pipeline_scenarios.py,
  an sdk_helpers scenario started first): every answer is the chain's, the intermediate container got no Accept,
  the model got the preprocessing container's Content-Type; DescribeModel shows Containers and Mode Serial;
- a Direct endpoint (boto3) of two containers `alpha` and `beta`, each with its own model data, addressed by
  TargetContainerHostname: each answers from its own port (100 apart), with its own host name and scale;
- bad input: no TargetContainerHostname, an unknown one, one sent to the pipeline → ValidationError; a pipeline
  container answering 500 → ModelError naming it (container-1 / container-2: the SDK names none), while the other
  endpoint's and the pipeline's good requests keep being answered.
Plus one log stream per container (<variant>/<instance-id>/<hostname>), ContainerLatency per container in
CloudWatch, the pipeline model in a batch transform job, (a server of its own in network mode host) a port
block per container on the node's loopback and every container adopted after a kill -9 of the server, and the
same adoption of the namespaced endpoints after a kill -9 of the module's server (the last test). ~16 s on
2 cores."""

import datetime
import os
import threading

import pytest
from botocore.exceptions import ClientError

import endpoint_helpers as eh
import sdk_helpers
from training_helpers import sm, wait_until  # noqa: F401 (module-scoped client fixture)

BUCKET = "kiln-multi-container"
IMAGE = "local:" + os.path.join(eh.HERE, "endpoints", "pipeline_app.py")
KILN_CONFIG = dict(eh.ENDPOINT_CONFIG, endpoints={"invocation_timeout_seconds": 10, "stop_grace_seconds": 5,
                                                  "health_interval_seconds": 0.5})


class PipelineScenarios(sdk_helpers.ScenarioRunner):
    """The SageMaker SDK's PipelineModel in a process of its own (sdk_helpers)."""
    script = os.path.join(os.path.dirname(os.path.abspath(__file__)), "sdk", "pipeline_scenarios.py")


@pytest.fixture(scope="module", autouse=True)
def _no_endpoint_left_behind(sm):  # noqa: F811
    yield
    eh.delete_all_endpoints(sm)


@pytest.fixture(scope="module")
def srv(module_kiln):
    module_kiln.client("s3").create_bucket(Bucket=BUCKET)
    return module_kiln


@pytest.fixture(scope="module")
def s3(srv):
    return srv.client("s3")


@pytest.fixture(scope="module")
def rt(srv):
    return srv.client("sagemaker-runtime")


@pytest.fixture(scope="module")
def cw(srv):
    return srv.client("cloudwatch")


def scale_archive(s3, key, value):
    return eh.put_model(s3, BUCKET, key, {"scale.txt": str(value).encode()})


@pytest.fixture(scope="module")
def pipeline(srv, s3, tmp_path_factory):
    """The SDK scenario's result (its endpoint is the pipeline the other tests use), or None without the SDK."""
    lib = sdk_helpers.sdk_lib_dir()
    if lib is None:
        yield None
        return
    runner = PipelineScenarios(srv, str(tmp_path_factory.mktemp("sdk")), lib)
    runner.start("pipeline_predictor", {"bucket": BUCKET, "name": eh.unique_name("sdk-pipe"),
                                        "model_data": scale_archive(s3, "pipe/model.tar.gz", 2)}, timeout=150)
    yield runner
    runner.stop_all()


@pytest.fixture(scope="module")
def direct(sm, s3, srv):  # noqa: F811
    """A Direct multi-container endpoint: containers alpha (scale 3) and beta (scale 5)."""
    name = eh.unique_name("direct")
    containers = []
    for host, value in (("alpha", 3), ("beta", 5)):
        containers.append({"Image": IMAGE, "ContainerHostname": host,
                           "ModelDataUrl": scale_archive(s3, "direct/%s.tar.gz" % host, value),
                           "Environment": {"ROLE": "echo", "CONTAINER_TAG": host}})
    sm.create_model(ModelName=name, Containers=containers, InferenceExecutionConfig={"Mode": "Direct"},
                    ExecutionRoleArn=eh.ROLE_ARN)
    eh.create_config(sm, name + "-cfg", [("AllTraffic", name, 1, 1.0)])
    sm.create_endpoint(EndpointName=name, EndpointConfigName=name + "-cfg")
    eh.wait_endpoint(sm, name, server=srv, timeout=60)
    return name


@pytest.fixture(scope="module")
def sdk_result(pipeline, srv):
    if pipeline is None:
        pytest.skip("SageMaker Python SDK bundle not found (set KILN_SAGEMAKER_SDK_LIB)")
    return pipeline.result("pipeline_predictor")


def test_sdk_pipeline_model_chains_the_containers(sm, sdk_result):  # noqa: F811
    r = sdk_result
    got = [(a["row"], a["answer"]) for a in r["answers"]]
    assert got == [([1, 2, 3], "12"), ([10, 20, 30.5], "121"), ([0], "0")], got
    doc = r["json_answer"]  # Accept application/json reaches the last container only
    assert doc["value"] == 18
    assert doc["pre"]["content_type"] == "text/csv" and doc["pre"]["accept"] is None, doc
    assert doc["model"]["content_type"] == "application/json", doc
    assert doc["model"]["accept"] == "application/json", doc
    # One instance, two containers: the same host (its network), each on its own port.
    assert doc["model"]["port"] == doc["pre"]["port"] + 100, doc
    model = r["model"]
    assert len(model["Containers"]) == 2 and "PrimaryContainer" not in model, model
    assert model["InferenceExecutionConfig"] == {"Mode": "Serial"}, model
    images = r["describe"]["ProductionVariants"][0]["DeployedImages"]
    assert len(images) == 2, images


def test_direct_invocation_reaches_the_named_container(sm, rt, direct):  # noqa: F811
    answers = {}
    for host in ("alpha", "beta", "alpha"):
        doc, resp = eh.invoke(rt, direct, body=b"hello " + host.encode(), ContentType="text/plain",
                              TargetContainerHostname=host)
        assert resp["ResponseMetadata"]["HTTPHeaders"]["x-amzn-invoked-production-variant"] == "AllTraffic"
        assert doc["container"] == host and doc["echo"] == "hello " + host, doc
        assert doc["host"] == host, doc  # its ContainerHostname is its host name
        answers[host] = doc
    assert answers["alpha"]["scale"] == 3 and answers["beta"]["scale"] == 5  # each its own model data
    assert answers["beta"]["port"] == answers["alpha"]["port"] + 100
    d = sm.describe_endpoint(EndpointName=direct)
    assert [i["SpecifiedImage"] for i in d["ProductionVariants"][0]["DeployedImages"]] == [IMAGE, IMAGE]
    m = sm.describe_model(ModelName=direct)
    assert m["InferenceExecutionConfig"] == {"Mode": "Direct"}
    assert [c["ContainerHostname"] for c in m["Containers"]] == ["alpha", "beta"]


def error_of(call):
    with pytest.raises(ClientError) as info:
        call()
    return info.value.response


def test_bad_input_gets_the_contracts_errors_and_other_traffic_is_unaffected(rt, sdk_result, direct):
    pipe = sdk_result["describe"]["EndpointName"]
    stop = threading.Event()
    failures = []

    def keep_invoking():
        # The other endpoint's traffic runs throughout.
        while not stop.is_set():
            try:
                doc, _ = eh.invoke(rt, direct, body=b"x", ContentType="text/plain", TargetContainerHostname="beta")
                if doc["container"] != "beta":
                    failures.append(doc)
            except Exception as e:  # noqa: BLE001 (recorded, asserted below)
                failures.append(repr(e))

    background = threading.Thread(target=keep_invoking)
    background.start()
    try:
        missing = error_of(lambda: rt.invoke_endpoint(EndpointName=direct, Body=b"x", ContentType="text/plain"))
        assert missing["Error"]["Code"] == "ValidationError", missing
        assert "TargetContainerHostname" in missing["Error"]["Message"]
        unknown = error_of(lambda: rt.invoke_endpoint(EndpointName=direct, Body=b"x", ContentType="text/plain",
                                                      TargetContainerHostname="gamma"))
        assert unknown["Error"]["Code"] == "ValidationError"
        assert "gamma" in unknown["Error"]["Message"] and "alpha, beta" in unknown["Error"]["Message"], unknown
        serial = error_of(lambda: rt.invoke_endpoint(EndpointName=pipe, Body=b"1,2", ContentType="text/csv",
                                                     TargetContainerHostname="container-1"))
        assert serial["Error"]["Code"] == "ValidationError"
        assert "not a multi-container endpoint with Direct invocation" in serial["Error"]["Message"], serial
        # The model container fails (13 in its features): the chain stops with ModelError naming it.
        failed = error_of(lambda: rt.invoke_endpoint(EndpointName=pipe, Body=b"13,1", ContentType="text/csv"))
        assert failed["Error"]["Code"] == "ModelError", failed
        assert failed["OriginalStatusCode"] == 500
        assert "from container-2" in failed["Error"]["Message"], failed
        assert failed["OriginalMessage"] == "model failed on 13"
        # The preprocessing container fails: named too, the model never called.
        first = error_of(lambda: rt.invoke_endpoint(EndpointName=pipe, Body=b"fail-pre", ContentType="text/csv"))
        assert first["Error"]["Code"] == "ModelError" and "from container-1" in first["Error"]["Message"], first
        # The pipeline still answers good requests.
        answer, _ = eh.invoke(rt, pipe, body=b"1,1", ContentType="text/csv", Accept="text/csv")
        assert answer == 4, answer
        _, resp = eh.invoke(rt, pipe, body=b"2", ContentType="text/csv", CustomAttributes="trace=7")
        # Custom attributes go to every container; the last one's come back.
        assert resp["CustomAttributes"] == "trace=7;model", resp.get("CustomAttributes")
    finally:
        stop.set()
        background.join()
    assert not failures, failures[:3]


def test_one_log_stream_per_container_and_container_latency(srv, cw, sdk_result, direct):
    pipe = sdk_result["describe"]["EndpointName"]
    logs = srv.client("logs")

    def streams(name):
        return [s["logStreamName"] for s in logs.describe_log_streams(
            logGroupName="/aws/sagemaker/Endpoints/" + name)["logStreams"]]

    wait_until(lambda: len(streams(pipe)) >= 2 and len(streams(direct)) >= 2, timeout=20,
               what="a log stream per container")
    for name, hosts in ((pipe, ("container-1", "container-2")), (direct, ("alpha", "beta"))):
        names = streams(name)
        for host in hosts:
            mine = [s for s in names if s.startswith("AllTraffic/i-") and s.endswith("/" + host)]
            assert len(mine) == 1, (host, names)
            events = logs.get_log_events(logGroupName="/aws/sagemaker/Endpoints/" + name,
                                         logStreamName=mine[0], startFromHead=True)["events"]
            ready = [e["message"] for e in events if "ready on port" in e["message"]]
            assert ready and "aux bound" in ready[0], (host, [e["message"] for e in events][:5])

    def points(endpoint, metric, container):
        now = datetime.datetime.now(datetime.timezone.utc)
        dims = [{"Name": "EndpointName", "Value": endpoint}, {"Name": "VariantName", "Value": "AllTraffic"},
                {"Name": "ContainerName", "Value": container}]
        return cw.get_metric_statistics(
            Namespace="AWS/SageMaker", MetricName=metric, StartTime=now - datetime.timedelta(minutes=10),
            EndTime=now + datetime.timedelta(minutes=1), Period=60, Statistics=["SampleCount", "Sum"],
            Unit="Microseconds" if metric == "ContainerLatency" else "Count", Dimensions=dims)["Datapoints"]

    wait_until(lambda: points(pipe, "ContainerLatency", "container-2") and points(direct, "Invocations", "alpha"),
               timeout=20, what="ContainerLatency and Direct invocations in CloudWatch")
    first = sum(p["SampleCount"] for p in points(pipe, "ContainerLatency", "container-1"))
    second = sum(p["SampleCount"] for p in points(pipe, "ContainerLatency", "container-2"))
    assert first >= second > 0, (first, second)  # a failing first container stops the chain
    assert sum(p["Sum"] for p in points(direct, "Invocations", "alpha")) >= 2


def test_batch_transform_runs_the_inference_pipeline(sm, s3, sdk_result):  # noqa: F811
    """serving-contract.md §8.2's last line: the same pipeline model in a transform job, every record through
    both containers (SingleRecord: the preprocessing container reads one CSV line)."""
    import time
    model = sdk_result["model"]["ModelName"]
    s3.put_object(Bucket=BUCKET, Key="tf-in/a.csv", Body=b"1,2,3\n4,5,6\n0.5\n")
    name = eh.unique_name("pipe-tf")
    sm.create_transform_job(
        TransformJobName=name, ModelName=model, BatchStrategy="SingleRecord",
        TransformInput={"DataSource": {"S3DataSource": {"S3DataType": "S3Prefix", "S3Uri": "s3://%s/tf-in/" % BUCKET}},
                        "ContentType": "text/csv", "SplitType": "Line"},
        TransformOutput={"S3OutputPath": "s3://%s/tf-out" % BUCKET, "AssembleWith": "Line", "Accept": "text/csv"},
        TransformResources={"InstanceType": "ml.m5.large", "InstanceCount": 1})
    deadline = time.monotonic() + 60
    while True:
        d = sm.describe_transform_job(TransformJobName=name)
        if d["TransformJobStatus"] in ("Completed", "Failed", "Stopped"):
            break
        assert time.monotonic() < deadline, d["TransformJobStatus"]
        time.sleep(0.2)
    assert d["TransformJobStatus"] == "Completed", d.get("FailureReason")
    out = s3.get_object(Bucket=BUCKET, Key="tf-out/a.csv.out")["Body"].read().decode()
    assert out.split() == ["12", "30", "1"], out  # (sum of the line) × the model container's scale 2


def test_host_mode_port_blocks_and_adoption_after_a_kill(kiln_factory):
    """Network mode host: each container its own block of 100 ports on the node's network; after kill -9 and a
    restart the next server adopts every container of the instance (the same processes answer)."""
    server = kiln_factory("host", config=dict(KILN_CONFIG, network={"mode": "host"}))
    sm_h, rt_h, s3_h = server.client("sagemaker"), server.client("sagemaker-runtime"), server.client("s3")
    s3_h.create_bucket(Bucket=BUCKET)
    name = eh.unique_name("host-direct")
    containers = [{"Image": IMAGE, "ContainerHostname": host, "Environment": {"ROLE": "echo", "CONTAINER_TAG": host},
                   "ModelDataUrl": scale_archive(s3_h, "host/%s.tar.gz" % host, value)}
                  for host, value in (("alpha", 7), ("beta", 11))]
    sm_h.create_model(ModelName=name, Containers=containers, InferenceExecutionConfig={"Mode": "Direct"},
                      ExecutionRoleArn=eh.ROLE_ARN)
    try:
        eh.deploy(sm_h, name, [("AllTraffic", name, 1, 1.0)], server=server, timeout=60)

        def both():
            return {h: eh.invoke(rt_h, name, body=b"x", ContentType="text/plain", TargetContainerHostname=h)[0]
                    for h in ("alpha", "beta")}

        before = both()
        assert before["alpha"]["scale"] == 7 and before["beta"]["scale"] == 11, before
        assert before["alpha"]["port"] != 8080, before  # a block of the server's port range
        assert before["beta"]["port"] == before["alpha"]["port"] + 100, before
        server.kill()
        server.start()
        eh.wait_endpoint(sm_h, name, server=server, timeout=30)
        wait_until(lambda: sm_h.describe_endpoint(EndpointName=name)["ProductionVariants"][0]
                   .get("CurrentInstanceCount") == 1, timeout=20, what="the adopted instance routed")
        after = both()
        for host in ("alpha", "beta"):
            assert after[host]["boot"] == before[host]["boot"], (host, before[host], after[host])  # not relaunched
            assert after[host]["port"] == before[host]["port"]
    finally:
        sm_h.delete_endpoint(EndpointName=name)
        wait_until(lambda: eh.endpoint_gone(sm_h, name), timeout=30, what="the endpoint deleted")


def test_namespaced_containers_adopted_after_a_kill(srv, sm, rt, sdk_result, direct):  # noqa: F811
    """Last in the module (it kills the module's server): after kill -9 and a restart the next server adopts
    every container of both endpoints, whose containers share the first's network namespace — the same
    processes answer, the pipeline chains again."""
    pipe = sdk_result["describe"]["EndpointName"]

    def both():
        return {h: eh.invoke(rt, direct, body=b"x", ContentType="text/plain", TargetContainerHostname=h)[0]
                for h in ("alpha", "beta")}

    before = both()
    assert before["alpha"]["port"] == 8080 and before["beta"]["port"] == 8180, before  # one namespace, 100 apart
    srv.kill()
    srv.start()
    for name in (direct, pipe):
        eh.wait_endpoint(sm, name, server=srv, timeout=30)
        wait_until(lambda: sm.describe_endpoint(EndpointName=name)["ProductionVariants"][0]
                   .get("CurrentInstanceCount") == 1, timeout=20, what="the adopted instance of %s routed" % name)
    after = both()
    for host in ("alpha", "beta"):
        assert after[host]["boot"] == before[host]["boot"], (host, before[host], after[host])  # not relaunched
    answer, _ = eh.invoke(rt, pipe, body=b"2,3", ContentType="text/csv", Accept="text/csv")
    assert answer == 10, answer
    assert "endpoint instance launched" not in srv.log_text().split("listening")[-1], srv.log_tail(30)
