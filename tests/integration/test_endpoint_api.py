"""The real-time inference control plane (control-plane-api.md §4, §5, §7, §8.3–8.5, §9.2):
models, endpoint configurations and endpoints — create/describe/list (filters, sorting, paging)/
delete, AWS's error texts, the features Kiln refuses, and tags on every one of these ARNs. No test
here needs an endpoint to become InService (the serving tests do that): endpoints are created with
a serving program that delays its start, so they stay Creating while the test runs."""

import json
import os
import time

import pytest
from botocore.exceptions import ClientError

import kiln_harness as kh
import training_helpers as th
from training_helpers import sm  # noqa: F401 (module-scoped client fixture)

# The slow test container is deleted before it installs its SIGTERM handler (as PID 1 it then
# ignores SIGTERM, like under `docker stop`): a short stop grace keeps deletes quick.
KILN_CONFIG = dict(th.SHRINK_CONFIG, endpoints={"stop_grace_seconds": 2})

ROLE = "arn:aws:iam::123456789012:role/kiln-test"
SERVE_APP = os.path.join(os.path.dirname(os.path.abspath(__file__)), "endpoints", "serve_app.py")
# Never passes /ping while a test runs: the endpoint stays Creating.
SLOW_CONTAINER = {"Image": "local:" + SERVE_APP, "Environment": {"STARTUP_DELAY_SECONDS": "600"}}


def error_of(excinfo):
    err = excinfo.value.response["Error"]
    return err["Code"], err["Message"]


def expect_error(fn, code, fragment=None, exact=None, **kwargs):
    with pytest.raises(ClientError) as e:
        fn(**kwargs)
    got_code, message = error_of(e)
    assert got_code == code, (got_code, message)
    if fragment is not None:
        assert fragment in message, message
    if exact is not None:
        assert message == exact, message
    return message


def raw_call(server, operation, payload):
    """For what Debian's boto3 (an older model: ExecutionRoleArn required) refuses client-side."""
    status, _, body = kh.json_request(server, "SageMaker." + operation, payload)
    doc = json.loads(body) if body else {}
    return status, doc.get("__type"), doc.get("message")


def arn_prefix(sm):
    # The account and region of this server, from an ARN it returned.
    name = th.unique_name("probe")
    arn = sm.create_model(ModelName=name, ExecutionRoleArn=ROLE, PrimaryContainer={"Image": "x"})["ModelArn"]
    sm.delete_model(ModelName=name)
    return arn[: arn.index(":model/") + 1]


@pytest.fixture(scope="module")
def prefix(sm):
    return arn_prefix(sm)


def create_model(sm, name, container=None, **extra):
    return sm.create_model(ModelName=name, ExecutionRoleArn=ROLE, PrimaryContainer=container or SLOW_CONTAINER,
                           **extra)["ModelArn"]


def variant(name, model, count=1, weight=None, instance_type="ml.m5.large", **extra):
    v = {"VariantName": name, "ModelName": model, "InstanceType": instance_type, "InitialInstanceCount": count}
    if weight is not None:
        v["InitialVariantWeight"] = weight
    v.update(extra)
    return v


@pytest.fixture(scope="module")
def model(sm):
    name = th.unique_name("mdl")
    create_model(sm, name)
    return name


@pytest.fixture(scope="module")
def config(sm, model):
    name = th.unique_name("cfg")
    sm.create_endpoint_config(EndpointConfigName=name, ProductionVariants=[variant("AllTraffic", model)])
    return name


# ---------------------------------------------------------------------------------------------
# Models


def test_model_create_describe_delete(sm, prefix):
    name = th.unique_name("Model")
    arn = sm.create_model(ModelName=name, ExecutionRoleArn=ROLE,
                          PrimaryContainer={"Image": "local:/bin/true", "ModelDataUrl": "s3://bucket/model.tar.gz",
                                            "Environment": {"A": "1"}},
                          Tags=[{"Key": "team", "Value": "ml"}])["ModelArn"]
    assert arn == prefix + "model/" + name
    d = sm.describe_model(ModelName=name.lower())
    assert d["ModelName"] == name and d["ModelArn"] == arn
    assert d["ExecutionRoleArn"] == ROLE
    assert d["PrimaryContainer"]["Image"] == "local:/bin/true"
    assert d["PrimaryContainer"]["ModelDataUrl"] == "s3://bucket/model.tar.gz"
    assert d["PrimaryContainer"]["Environment"] == {"A": "1"}
    assert d["PrimaryContainer"]["Mode"] == "SingleModel"
    assert d["EnableNetworkIsolation"] is False
    assert abs(d["CreationTime"].timestamp() - time.time()) < 60
    assert sm.list_tags(ResourceArn=arn)["Tags"] == [{"Key": "team", "Value": "ml"}]
    # The SageMaker SDK keys on this text and reuses the model.
    expect_error(sm.create_model, "ValidationException",
                 exact='Cannot create already existing model "%s".' % arn,
                 ModelName=name.upper(), ExecutionRoleArn=ROLE, PrimaryContainer={"Image": "x"})
    sm.delete_model(ModelName=name)
    missing = 'Could not find model "%smodel/%s".' % (prefix, name)
    expect_error(sm.describe_model, "ValidationException", exact=missing, ModelName=name)
    expect_error(sm.delete_model, "ValidationException", exact=missing, ModelName=name)


def test_model_container_rules(sm, module_kiln):
    name = th.unique_name("bad")
    expect_error(sm.create_model, "ValidationException", "PrimaryContainer or Containers", ModelName=name,
                 ExecutionRoleArn=ROLE)
    expect_error(sm.create_model, "ValidationException", "not both", ModelName=name, ExecutionRoleArn=ROLE,
                 PrimaryContainer={"Image": "x"}, Containers=[{"Image": "y"}])
    # The server's model lets ExecutionRoleArn out; Kiln needs it when there is model data (§8.3).
    status, code, message = raw_call(module_kiln, "CreateModel", {
        "ModelName": name, "PrimaryContainer": {"Image": "x", "ModelDataUrl": "s3://b/k.tar.gz"}})
    assert (status, code) == (400, "ValidationException") and "ExecutionRoleArn is required" in message, message
    status, code, message = raw_call(module_kiln, "CreateModel", {"ModelName": name, "PrimaryContainer": {"Image": "x"}})
    assert status == 200, message
    sm.delete_model(ModelName=name)
    # The service model's own checks run before Kiln's (AWS's message format).
    status, code, message = raw_call(module_kiln, "CreateModel", {"ModelName": "bad_name", "PrimaryContainer": {"Image": "x"}})
    assert code == "ValidationException" and "modelName" in message, message
    sm.create_model(ModelName=name, ExecutionRoleArn=ROLE, Containers=[{"Image": "x"}, {"Image": "y"}])
    assert len(sm.describe_model(ModelName=name)["Containers"]) == 2
    sm.delete_model(ModelName=name)


def test_list_models_sort_filter_paging(sm):
    tag = th.unique_name("lm")
    names = ["%s-b" % tag, "%s-a" % tag, "%s-c" % tag]
    for n in names:
        create_model(sm, n)
        time.sleep(1.1)  # boto3 1.26 sends request timestamps in whole seconds
    got = sm.list_models(NameContains=tag.upper())["Models"]
    assert [m["ModelName"] for m in got] == list(reversed(names))  # CreationTime, Descending
    asc = sm.list_models(NameContains=tag, SortBy="Name", SortOrder="Ascending")["Models"]
    assert [m["ModelName"] for m in asc] == sorted(names)
    seen, token = [], None
    while True:
        kwargs = {"NameContains": tag, "SortBy": "Name", "MaxResults": 1}
        if token:
            kwargs["NextToken"] = token
        page = sm.list_models(**kwargs)
        assert len(page["Models"]) <= 1
        seen += [m["ModelName"] for m in page["Models"]]
        token = page.get("NextToken")
        if not token:
            break
    assert seen == sorted(names, reverse=True)
    created = sm.describe_model(ModelName=names[1])["CreationTime"].timestamp()
    # Sent as whole seconds: floor(created + 1) lies between the second and the third creation.
    after = sm.list_models(NameContains=tag, CreationTimeAfter=created + 1)["Models"]
    assert [m["ModelName"] for m in after] == [names[2]]
    before = sm.list_models(NameContains=tag, CreationTimeBefore=created + 1)["Models"]
    assert sorted(m["ModelName"] for m in before) == sorted(names[:2])
    # A token reused with other filters.
    first = sm.list_models(NameContains=tag, MaxResults=1)
    expect_error(sm.list_models, "ValidationException", exact="The provided NextToken is invalid.",
                 NameContains=tag + "-a", NextToken=first["NextToken"])
    paginated = [m["ModelName"] for p in sm.get_paginator("list_models").paginate(
        NameContains=tag, PaginationConfig={"PageSize": 2}) for m in p["Models"]]
    assert sorted(paginated) == sorted(names)
    for n in names:
        sm.delete_model(ModelName=n)


# ---------------------------------------------------------------------------------------------
# Endpoint configurations


def test_endpoint_config_create_describe_delete(sm, model, prefix):
    name = th.unique_name("Cfg")
    arn = sm.create_endpoint_config(
        EndpointConfigName=name,
        ProductionVariants=[variant("AllTraffic", model, 2, ContainerStartupHealthCheckTimeoutInSeconds=120)],
        Tags=[{"Key": "k", "Value": "v"}])["EndpointConfigArn"]
    assert arn == prefix + "endpoint-config/" + name
    d = sm.describe_endpoint_config(EndpointConfigName=name.lower())
    assert d["EndpointConfigName"] == name and d["EndpointConfigArn"] == arn
    v = d["ProductionVariants"][0]
    assert v["VariantName"] == "AllTraffic" and v["ModelName"] == model
    assert v["InitialInstanceCount"] == 2 and v["InstanceType"] == "ml.m5.large"
    assert v["InitialVariantWeight"] == 1.0  # AWS's default, echoed
    assert v["ContainerStartupHealthCheckTimeoutInSeconds"] == 120
    assert sm.list_tags(ResourceArn=arn)["Tags"] == [{"Key": "k", "Value": "v"}]
    expect_error(sm.create_endpoint_config, "ValidationException",
                 exact='Cannot create already existing endpoint configuration "%s".' % arn,
                 EndpointConfigName=name.upper(), ProductionVariants=[variant("v", model)])
    sm.delete_endpoint_config(EndpointConfigName=name)
    missing = 'Could not find endpoint configuration "%sendpoint-config/%s".' % (prefix, name)
    expect_error(sm.describe_endpoint_config, "ValidationException", exact=missing, EndpointConfigName=name)
    expect_error(sm.delete_endpoint_config, "ValidationException", exact=missing, EndpointConfigName=name)


def test_endpoint_config_refusals(sm, model, prefix):
    name = th.unique_name("cfg")
    ghost = th.unique_name("ghost")
    expect_error(sm.create_endpoint_config, "ValidationException",
                 exact='Could not find model "%smodel/%s".' % (prefix, ghost),
                 EndpointConfigName=name, ProductionVariants=[variant("v", ghost)])
    # Serverless variants are offered (test_serverless.py); their memory sizes are whole GB.
    expect_error(sm.create_endpoint_config, "ValidationException", "Valid values are 1024, 2048",
                 EndpointConfigName=name, ProductionVariants=[
                     {"VariantName": "v", "ModelName": model,
                      "ServerlessConfig": {"MemorySizeInMB": 2000, "MaxConcurrency": 1}}])
    expect_error(sm.create_endpoint_config, "ValidationException", "must be an S3 URI",
                 EndpointConfigName=name, ProductionVariants=[variant("v", model)],
                 AsyncInferenceConfig={"OutputConfig": {"S3OutputPath": "https://example.com/out"}})
    expect_error(sm.create_endpoint_config, "ValidationException", "InstanceType and InitialInstanceCount",
                 EndpointConfigName=name, ProductionVariants=[{"VariantName": "v", "ModelName": model}])
    expect_error(sm.create_endpoint_config, "ValidationException", "unique",
                 EndpointConfigName=name, ProductionVariants=[variant("v", model), variant("v", model)])
    multi = th.unique_name("multi")
    sm.create_model(ModelName=multi, ExecutionRoleArn=ROLE, Containers=[{"Image": "x"}, {"Image": "y"}])
    # Multi-container models are served (test_multi_container.py), but not by serverless variants.
    expect_error(sm.create_endpoint_config, "ValidationException", "does not support multi-container endpoints",
                 EndpointConfigName=name, ProductionVariants=[
                     {"VariantName": "v", "ModelName": multi,
                      "ServerlessConfig": {"MemorySizeInMB": 1024, "MaxConcurrency": 1}}])
    mme = th.unique_name("mme")
    sm.create_model(ModelName=mme, ExecutionRoleArn=ROLE, PrimaryContainer={"Image": "x", "Mode": "MultiModel"})
    expect_error(sm.create_endpoint_config, "ValidationException", "its ModelDataUrl must be the S3 prefix",
                 EndpointConfigName=name, ProductionVariants=[variant("v", mme)])
    # Not an instance type at all: the service model's enum check.
    expect_error(sm.create_endpoint_config, "ValidationException", "instanceType",
                 EndpointConfigName=name, ProductionVariants=[variant("v", model, instance_type="ml.nope.large")])
    for m in (multi, mme):
        sm.delete_model(ModelName=m)
    assert name not in [c["EndpointConfigName"] for c in sm.list_endpoint_configs(NameContains=name)["EndpointConfigs"]]


def test_list_endpoint_configs(sm, model):
    tag = th.unique_name("lc")
    names = ["%s-2" % tag, "%s-1" % tag]
    for n in names:
        sm.create_endpoint_config(EndpointConfigName=n, ProductionVariants=[variant("v", model)])
        time.sleep(0.01)
    got = sm.list_endpoint_configs(NameContains=tag)["EndpointConfigs"]
    assert [c["EndpointConfigName"] for c in got] == list(reversed(names))
    asc = sm.list_endpoint_configs(NameContains=tag, SortBy="Name", SortOrder="Ascending", MaxResults=1)
    assert [c["EndpointConfigName"] for c in asc["EndpointConfigs"]] == [names[1]]
    rest = sm.list_endpoint_configs(NameContains=tag, SortBy="Name", SortOrder="Ascending", MaxResults=1,
                                    NextToken=asc["NextToken"])
    assert [c["EndpointConfigName"] for c in rest["EndpointConfigs"]] == [names[0]]
    assert "NextToken" not in rest
    for n in names:
        sm.delete_endpoint_config(EndpointConfigName=n)


# ---------------------------------------------------------------------------------------------
# Endpoints (none of these needs instances to come up)


def test_create_endpoint_errors(sm, config, prefix):
    ghost = th.unique_name("nocfg")
    expect_error(sm.create_endpoint, "ValidationException",
                 exact='Could not find endpoint configuration "%sendpoint-config/%s".' % (prefix, ghost),
                 EndpointName=th.unique_name("ep"), EndpointConfigName=ghost)
    name = th.unique_name("Ep")
    arn = sm.create_endpoint(EndpointName=name, EndpointConfigName=config,
                             Tags=[{"Key": "k", "Value": "v"}])["EndpointArn"]
    try:
        assert arn == prefix + "endpoint/" + name
        d = sm.describe_endpoint(EndpointName=name.lower())
        assert d["EndpointName"] == name and d["EndpointArn"] == arn
        assert d["EndpointConfigName"] == config
        assert d["EndpointStatus"] == "Creating"
        assert abs(d["CreationTime"].timestamp() - time.time()) < 60
        assert sm.list_tags(ResourceArn=arn)["Tags"] == [{"Key": "k", "Value": "v"}]
        expect_error(sm.create_endpoint, "ValidationException",
                     exact='Cannot create already existing endpoint "%s".' % arn,
                     EndpointName=name.upper(), EndpointConfigName=config)
        busy = 'Cannot update in-progress endpoint "%s".' % arn
        expect_error(sm.update_endpoint, "ValidationException", exact=busy, EndpointName=name, EndpointConfigName=config)
        expect_error(sm.update_endpoint_weights_and_capacities, "ValidationException", exact=busy, EndpointName=name,
                     DesiredWeightsAndCapacities=[{"VariantName": "AllTraffic", "DesiredWeight": 0.5}])
        listed = sm.list_endpoints(NameContains=name, StatusEquals="Creating")["Endpoints"]
        assert [e["EndpointName"] for e in listed] == [name]
        assert listed[0]["EndpointStatus"] == "Creating"
    finally:
        sm.delete_endpoint(EndpointName=name)
    wait_deleted(sm, name, prefix)


def wait_deleted(sm, name, prefix, timeout=90):
    missing = 'Could not find endpoint "%sendpoint/%s".' % (prefix, name)
    deadline = time.time() + timeout
    while time.time() < deadline:
        try:
            d = sm.describe_endpoint(EndpointName=name)
            assert d["EndpointStatus"] == "Deleting", d["EndpointStatus"]
        except ClientError as e:
            err = e.response["Error"]
            assert (err["Code"], err["Message"]) == ("ValidationException", missing)
            return
        time.sleep(0.25)
    raise AssertionError("endpoint %s still there after %ss" % (name, timeout))


def test_delete_endpoint_then_not_found(sm, config, prefix):
    name = th.unique_name("del")
    arn = sm.create_endpoint(EndpointName=name, EndpointConfigName=config)["EndpointArn"]
    sm.delete_endpoint(EndpointName=name)
    try:
        # Deleting twice: AWS's in-progress text (unless the controller was already done).
        sm.delete_endpoint(EndpointName=name)
    except ClientError as e:
        code, message = e.response["Error"]["Code"], e.response["Error"]["Message"]
        assert code == "ValidationException"
        assert message in ('Cannot update in-progress endpoint "%s".' % arn,
                           'Could not find endpoint "%sendpoint/%s".' % (prefix, name)), message
    wait_deleted(sm, name, prefix)
    # The waiter the SDK uses for this.
    sm.get_waiter("endpoint_deleted").wait(EndpointName=name, WaiterConfig={"Delay": 1, "MaxAttempts": 5})
    missing = 'Could not find endpoint "%sendpoint/%s".' % (prefix, name)
    expect_error(sm.delete_endpoint, "ValidationException", exact=missing, EndpointName=name)
    expect_error(sm.update_endpoint, "ValidationException", exact=missing, EndpointName=name, EndpointConfigName=config)
    expect_error(sm.list_tags, "ValidationException", "Could not find resource", ResourceArn=arn)


def test_deleting_model_and_config_keeps_the_endpoint(sm, prefix):
    m = th.unique_name("m")
    create_model(sm, m)
    c = th.unique_name("c")
    sm.create_endpoint_config(EndpointConfigName=c, ProductionVariants=[variant("AllTraffic", m)])
    name = th.unique_name("keep")
    sm.create_endpoint(EndpointName=name, EndpointConfigName=c)
    try:
        sm.delete_endpoint_config(EndpointConfigName=c)
        sm.delete_model(ModelName=m)
        d = sm.describe_endpoint(EndpointName=name)
        assert d["EndpointConfigName"] == c
    finally:
        sm.delete_endpoint(EndpointName=name)
    wait_deleted(sm, name, prefix)


def test_list_endpoints_sort_and_paging(sm, config, prefix):
    tag = th.unique_name("le")
    names = ["%s-b" % tag, "%s-a" % tag, "%s-c" % tag]
    try:
        for n in names:
            sm.create_endpoint(EndpointName=n, EndpointConfigName=config)
            time.sleep(0.01)
        got = sm.list_endpoints(NameContains=tag)["Endpoints"]
        assert [e["EndpointName"] for e in got] == list(reversed(names))
        by_name = sm.list_endpoints(NameContains=tag, SortBy="Name", SortOrder="Ascending", MaxResults=2)
        assert [e["EndpointName"] for e in by_name["Endpoints"]] == sorted(names)[:2]
        rest = sm.list_endpoints(NameContains=tag, SortBy="Name", SortOrder="Ascending", MaxResults=2,
                                 NextToken=by_name["NextToken"])
        assert [e["EndpointName"] for e in rest["Endpoints"]] == sorted(names)[2:]
        by_status = sm.list_endpoints(NameContains=tag, SortBy="Status")["Endpoints"]
        assert len(by_status) == 3
        for e in by_status:
            assert set(e) >= {"EndpointName", "EndpointArn", "CreationTime", "LastModifiedTime", "EndpointStatus"}
        assert sm.list_endpoints(NameContains=tag, StatusEquals="InService")["Endpoints"] == []
    finally:
        for n in names:
            try:
                sm.delete_endpoint(EndpointName=n)
            except ClientError:
                pass
    for n in names:
        wait_deleted(sm, n, prefix)


# ---------------------------------------------------------------------------------------------
# Tags on every inference ARN, resolved case-insensitively


def test_tags_on_inference_resources(sm, model, config, prefix):
    ep = th.unique_name("tagep")
    sm.create_endpoint(EndpointName=ep, EndpointConfigName=config)
    try:
        for arn in (prefix + "model/" + model, prefix + "endpoint-config/" + config, prefix + "endpoint/" + ep):
            sm.add_tags(ResourceArn=arn, Tags=[{"Key": "a", "Value": "1"}, {"Key": "b", "Value": "2"}])
            assert {t["Key"]: t["Value"] for t in sm.list_tags(ResourceArn=arn.lower())["Tags"]} == {"a": "1", "b": "2"}
            sm.delete_tags(ResourceArn=arn, TagKeys=["a"])
            assert sm.list_tags(ResourceArn=arn)["Tags"] == [{"Key": "b", "Value": "2"}]
        for arn in (prefix + "model/nope-x", prefix + "endpoint-config/nope-x", prefix + "endpoint/nope-x"):
            expect_error(sm.add_tags, "ValidationException", "Could not find resource",
                         ResourceArn=arn, Tags=[{"Key": "a", "Value": "1"}])
    finally:
        sm.delete_endpoint(EndpointName=ep)
    wait_deleted(sm, ep, prefix)


# ---------------------------------------------------------------------------------------------
# AWS CLI


def test_aws_cli_model_and_config(module_kiln, tmp_path, model):
    run = th.aws_runner(module_kiln, str(tmp_path / "home"))
    if run is None:
        pytest.skip("no AWS CLI")
    name = th.unique_name("cli")
    run("sagemaker", "create-endpoint-config", "--endpoint-config-name", name, "--production-variants",
        json.dumps([variant("AllTraffic", model, 1, 0.5)]))
    out = json.loads(run("sagemaker", "describe-endpoint-config", "--endpoint-config-name", name).stdout)
    assert out["EndpointConfigName"] == name
    assert out["ProductionVariants"][0]["InitialVariantWeight"] == 0.5
    listed = json.loads(run("sagemaker", "list-endpoint-configs", "--name-contains", name).stdout)
    assert [c["EndpointConfigName"] for c in listed["EndpointConfigs"]] == [name]
    p = run("sagemaker", "describe-endpoint", "--endpoint-name", name, check=False)
    assert p.returncode != 0 and "Could not find endpoint" in p.stderr, p.stderr
    run("sagemaker", "delete-endpoint-config", "--endpoint-config-name", name)
