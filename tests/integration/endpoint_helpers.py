"""Helpers for the endpoint integration tests: deploy the test serving program (endpoints/serve_app.py,
a `local:` image) with boto3, wait for statuses, invoke, and build model archives.

Everything goes through boto3 / the AWS CLI against spec/control-plane-api.md and spec/runtime-api.md.
"""

import io
import json
import os
import tarfile
import time
import uuid

import pytest
from botocore.exceptions import ClientError

from training_helpers import wait_until  # noqa: F401 (re-exported for the endpoint tests)

HERE = os.path.dirname(os.path.abspath(__file__))
SERVE_APP = os.path.join(HERE, "endpoints", "serve_app.py")
SERVE_IMAGE = "local:" + SERVE_APP
ROLE_ARN = "arn:aws:iam::000000000000:role/KilnEndpointTest"

# The build host has 2 CPUs: "shrink" lets several ml.* instances share it; short budgets keep the
# failure tests fast.
ENDPOINT_CONFIG = {
    "scheduler": {"policy": "shrink", "allow_cpu_fallback": True},
    "endpoints": {"invocation_timeout_seconds": 3, "stop_grace_seconds": 5, "health_interval_seconds": 0.5},
}


def unique_name(prefix):
    return "%s-%s" % (prefix, uuid.uuid4().hex[:10])


def model_tarball(files):
    """A model.tar.gz from {member name: bytes or ("symlink", target) or ("hardlink", target)}."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for name, content in files.items():
            info = tarfile.TarInfo(name)
            if isinstance(content, tuple):
                info.type = tarfile.SYMTYPE if content[0] == "symlink" else tarfile.LNKTYPE
                info.linkname = content[1]
                tar.addfile(info)
            else:
                info.size = len(content)
                info.mode = 0o644
                tar.addfile(info, io.BytesIO(content))
    return buf.getvalue()


def put_model(s3, bucket, key, files):
    s3.put_object(Bucket=bucket, Key=key, Body=model_tarball(files))
    return "s3://%s/%s" % (bucket, key)


def create_model(sm, name, model_data_url=None, env=None, image=SERVE_IMAGE):
    container = {"Image": image}
    if model_data_url:
        container["ModelDataUrl"] = model_data_url
    if env:
        container["Environment"] = dict(env)
    sm.create_model(ModelName=name, PrimaryContainer=container, ExecutionRoleArn=ROLE_ARN)
    return name


def create_config(sm, name, variants, startup_timeout=None):
    """variants: [(variant name, model name, instance count, weight)]."""
    pvs = []
    for variant, model, count, weight in variants:
        pv = {"VariantName": variant, "ModelName": model, "InitialInstanceCount": count,
              "InstanceType": "ml.m5.large", "InitialVariantWeight": weight}
        if startup_timeout:
            pv["ContainerStartupHealthCheckTimeoutInSeconds"] = startup_timeout
        pvs.append(pv)
    sm.create_endpoint_config(EndpointConfigName=name, ProductionVariants=pvs)
    return name


def wait_endpoint(sm, name, statuses=("InService",), timeout=90, poll=0.2, server=None):
    if isinstance(statuses, str):
        statuses = (statuses,)
    deadline = time.monotonic() + timeout
    while True:
        d = sm.describe_endpoint(EndpointName=name)
        if d["EndpointStatus"] in statuses:
            return d
        if d["EndpointStatus"] == "Failed" and "Failed" not in statuses:
            raise AssertionError("endpoint %s failed: %s" % (name, d.get("FailureReason")))
        if time.monotonic() > deadline:
            raise AssertionError("endpoint %s still %s after %ss (waiting for %s)%s" % (
                name, d["EndpointStatus"], timeout, statuses,
                ("; server log tail:\n" + server.log_tail(40)) if server is not None else ""))
        time.sleep(poll)


def deploy(sm, name, variants, server=None, timeout=90):
    """Creates config `name`-cfg and endpoint `name`; waits InService; returns the Describe."""
    create_config(sm, name + "-cfg", variants)
    sm.create_endpoint(EndpointName=name, EndpointConfigName=name + "-cfg")
    return wait_endpoint(sm, name, server=server, timeout=timeout)


def invoke(rt, name, body=b"{}", **kwargs):
    """InvokeEndpoint; returns (parsed JSON body or raw bytes, the response)."""
    kwargs.setdefault("ContentType", "application/json")
    r = rt.invoke_endpoint(EndpointName=name, Body=body, **kwargs)
    data = r["Body"].read()
    try:
        return json.loads(data), r
    except ValueError:
        return data, r


def invoke_error(rt, name, body=b"{}", **kwargs):
    kwargs.setdefault("ContentType", "application/json")
    with pytest.raises(ClientError) as info:
        rt.invoke_endpoint(EndpointName=name, Body=body, **kwargs)
    return info.value.response


def endpoint_gone(sm, name):
    try:
        sm.describe_endpoint(EndpointName=name)
        return False
    except ClientError as e:
        assert e.response["Error"]["Code"] == "ValidationException", e.response
        assert "Could not find endpoint" in e.response["Error"]["Message"]
        return True


def delete_all_endpoints(sm, timeout=60):
    """Deletes every endpoint and waits until all are gone: endpoint instances outlive a stopped
    server by design (the next server adopts them), so tests must not leave any behind."""
    names = [e["EndpointName"] for e in sm.list_endpoints(MaxResults=100)["Endpoints"]]
    for name in names:
        try:
            sm.delete_endpoint(EndpointName=name)
        except ClientError:
            pass
    wait_until(lambda: not sm.list_endpoints(MaxResults=100)["Endpoints"], timeout=timeout,
               what="every endpoint deleted")
