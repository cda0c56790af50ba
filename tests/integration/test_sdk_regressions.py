"""Regressions found by driving Kiln with the SageMaker Python SDK (issue 10), reproduced with boto3
so that they do not depend on the SDK: what the SDK sends is rebuilt here byte for byte where it
matters (a channel prefix without a trailing slash, a model.tar.gz repacked with
tarfile.add(dir, arcname="/")).

  * channel layout: upload_data returns s3://b/demo/train (no '/'); the script reads
    $SM_CHANNEL_TRAIN/train.csv (training-contract.md §6.2)
  * a model.tar.gz whose root member is "/" deploys and answers (serving-contract.md §3)
  * an endpoint whose image Kiln cannot run fails on the image before any model data is fetched
  * an instance that does not fit under the strict policy: DescribeEndpoint says what it waits
    for, then the endpoint fails after the provision timeout with AWS's capacity reason; a Failed
    endpoint reports no VariantStatus "Creating"

The module's server runs the strict policy on 2 vCPUs and 16 GiB whatever the host has, and a
short default provision timeout (endpoints.provision_timeout_seconds) so that the wait ends in
seconds, not in the API's 300 s minimum.
"""

import gzip
import io
import json
import os
import tarfile
import time

import pytest

import endpoint_helpers as eh
import kiln_harness as kh
import training_helpers as th
from training_helpers import sm, s3  # noqa: F401 (module-scoped fixtures)

PROVISION_TIMEOUT = 8

KILN_CONFIG = {
    "scheduler": {"policy": "strict", "cpus": 2, "memory_gib": 16},
    "endpoints": {"invocation_timeout_seconds": 5, "stop_grace_seconds": 5, "health_interval_seconds": 0.5,
                  "provision_timeout_seconds": PROVISION_TIMEOUT},
    "training": {"stop_grace_seconds": 10},
}

CAPACITY_SENTENCE = ("Unable to provision requested ML compute capacity. Please retry using a different ML "
                     "instance type.")


@pytest.fixture(autouse=True)
def _no_endpoint_left_behind(sm):
    yield
    eh.delete_all_endpoints(sm)


@pytest.fixture(scope="module")
def rt(module_kiln):
    return module_kiln.client("sagemaker-runtime")


@pytest.fixture(scope="module")
def bucket(module_kiln, s3):
    name = th.unique_name("sdkreg")
    s3.create_bucket(Bucket=name)
    return name


def config(server, name, model, instance_type="ml.m5.large", **variant_extra):
    """CreateEndpointConfig as raw signed JSON: the suite's botocore may predate members such as
    VariantInstanceProvisionTimeoutInSeconds (the server validates against its own model)."""
    pv = {"VariantName": "AllTraffic", "ModelName": model, "InitialInstanceCount": 1,
          "InstanceType": instance_type, "InitialVariantWeight": 1.0}
    pv.update(variant_extra)
    status, _, body = kh.json_request(server, "SageMaker.CreateEndpointConfig",
                                      {"EndpointConfigName": name, "ProductionVariants": [pv]})
    assert status == 200, body
    return name


def variant_statuses(d):
    return [s for pv in d.get("ProductionVariants", []) for s in pv.get("VariantStatus", [])]


# ---------------------------------------------------------------------------------------------
# Channel layout


TRAIN_PY = r'''
import json, os
channel = os.environ["SM_CHANNEL_TRAIN"]
with open(os.path.join(channel, "train.csv")) as f:   # what SDK users write
    rows = f.read().splitlines()
listing = sorted(os.path.relpath(os.path.join(d, n), channel) for d, _, files in os.walk(channel) for n in files)
with open(os.path.join(os.environ["SM_MODEL_DIR"], "seen.json"), "w") as f:
    json.dump({"channel": channel, "rows": rows, "listing": listing}, f)
print("read %d rows" % len(rows))
'''


def test_channel_prefix_without_trailing_slash_is_read_as_sm_channel_train_csv(module_kiln, sm, s3, bucket):
    # Session.upload_data("data", key_prefix="demo/train") uploads data/* to demo/train/* and
    # returns "s3://<bucket>/demo/train": no trailing slash.
    s3.put_object(Bucket=bucket, Key="demo/train/train.csv", Body=b"1,2\n3,4\n")
    s3.put_object(Bucket=bucket, Key="demo/train/extra/more.csv", Body=b"5,6\n")
    s3.put_object(Bucket=bucket, Key="code/sourcedir.tar.gz", Body=th.make_tar_gz({"train.py": TRAIN_PY}))
    name = th.unique_name("chan-noslash")
    hps = {"sagemaker_program": json.dumps("train.py"),
           "sagemaker_submit_directory": json.dumps("s3://%s/code/sourcedir.tar.gz" % bucket),
           "sagemaker_region": json.dumps("us-east-1")}
    sm.create_training_job(**th.training_request(
        name, bucket, image=th.PYTORCH_IMAGE, hyperparameters=hps,
        channels=[th.s3_channel("train", "s3://%s/demo/train" % bucket)]))
    d = th.wait_for_status(sm, name, timeout=180, server=module_kiln)
    assert d["TrainingJobStatus"] == "Completed", d.get("FailureReason")
    seen = json.loads(th.model_files(s3, d)["seen.json"])
    assert seen["channel"] == "/opt/ml/input/data/train"
    assert seen["rows"] == ["1,2", "3,4"]
    assert seen["listing"] == ["extra/more.csv", "train.csv"]


# ---------------------------------------------------------------------------------------------
# Repacked model archive


def sdk_repacked_model_tar_gz(tmp_path):
    """model.tar.gz exactly as sagemaker.utils.repack_model writes it for deploy(entry_point=...):
    the model directory with code/ added, packed with tarfile.add(model_dir, arcname="/")."""
    model_dir = tmp_path / "model"
    (model_dir / "code").mkdir(parents=True)
    (model_dir / "version.txt").write_text("repacked-v1")
    (model_dir / "code" / "inference.py").write_text("def model_fn(model_dir):\n    return None\n")
    (model_dir / "code" / "requirements.txt").write_text("")
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        tar.add(str(model_dir), arcname="/")
    data = buf.getvalue()
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        raw_names = [m.name for m in tar.getmembers()]
    return data, raw_names


def test_model_tar_gz_with_a_root_member_deploys_and_answers(module_kiln, sm, s3, rt, bucket, tmp_path):
    data, names = sdk_repacked_model_tar_gz(tmp_path)
    # A header's name field is "/" (tarfile reads it back as "", the root directory).
    raw = gzip.decompress(data)
    assert any(raw[i:i + 100].rstrip(b"\0") == b"/" for i in range(0, len(raw), 512)), names
    assert names[0] == "" and "code/inference.py" in names, names
    s3.put_object(Bucket=bucket, Key="repacked/model.tar.gz", Body=data)
    name = eh.unique_name("ep-repacked")
    eh.create_model(sm, name + "-m", model_data_url="s3://%s/repacked/model.tar.gz" % bucket)
    config(module_kiln, name + "-cfg", name + "-m")
    sm.create_endpoint(EndpointName=name, EndpointConfigName=name + "-cfg")
    d = eh.wait_endpoint(sm, name, server=module_kiln, timeout=120)
    assert variant_statuses(d) == []
    body, _ = eh.invoke(rt, name)
    assert body["version"] == "repacked-v1"


# ---------------------------------------------------------------------------------------------
# Error order


def cache_files(server):
    root = os.path.join(server.data_dir, "model-cache")
    return [os.path.join(d, f) for d, _, files in os.walk(root) for f in files]


def test_unrunnable_image_fails_before_model_data_is_downloaded(module_kiln, sm, s3, bucket):
    missing_image = "local:/nonexistent/kiln-serve-%s" % th.unique_name("x")
    url = eh.put_model(s3, bucket, "order/model.tar.gz", {"version.txt": b"x"})
    before = cache_files(module_kiln)
    cases = {
        # The model data exists: it must not be fetched for an instance that cannot start.
        "present": url,
        # It does not: the download error must not hide the image's reason.
        "missing": "s3://%s/order/no-such-model.tar.gz" % bucket,
    }
    names = {}
    for case, model_url in cases.items():
        name = eh.unique_name("ep-img-" + case)
        eh.create_model(sm, name + "-m", model_data_url=model_url, image=missing_image)
        config(module_kiln, name + "-cfg", name + "-m")
        sm.create_endpoint(EndpointName=name, EndpointConfigName=name + "-cfg")
        names[case] = name
    for case, name in names.items():
        d = eh.wait_endpoint(sm, name, statuses=("Failed",), server=module_kiln)
        reason = d["FailureReason"]
        assert missing_image in reason, (case, reason)
        assert "ClientError" in reason, (case, reason)
        assert "no-such-model" not in reason and "NoSuchKey" not in reason, (case, reason)
        assert variant_statuses(d) == [], (case, d)
    assert cache_files(module_kiln) == before  # nothing was downloaded


def test_training_job_with_an_unrunnable_image_fails_on_the_image_not_on_its_channels(module_kiln, sm, bucket):
    missing_image = "local:/nonexistent/kiln-train-%s" % th.unique_name("x")
    name = th.unique_name("train-img")
    sm.create_training_job(**th.training_request(
        name, bucket, image=missing_image,
        channels=[th.s3_channel("train", "s3://%s/no/such/prefix/" % bucket)]))
    d = th.wait_for_status(sm, name, timeout=60, server=module_kiln)
    assert d["TrainingJobStatus"] == "Failed"
    assert missing_image in d["FailureReason"] and "No S3 objects found" not in d["FailureReason"], d["FailureReason"]


# ---------------------------------------------------------------------------------------------
# Capacity under the strict policy


def test_unfittable_variant_says_why_it_waits_then_fails_with_a_capacity_reason(module_kiln, sm):
    # The first endpoint takes both vCPUs of the (configured) host; the second cannot start.
    holder = eh.unique_name("ep-holder")
    eh.create_model(sm, holder + "-m")
    config(module_kiln, holder + "-cfg", holder + "-m")
    sm.create_endpoint(EndpointName=holder, EndpointConfigName=holder + "-cfg")
    eh.wait_endpoint(sm, holder, server=module_kiln)

    name = eh.unique_name("ep-nofit")
    eh.create_model(sm, name + "-m")
    config(module_kiln, name + "-cfg", name + "-m")
    created = time.monotonic()
    sm.create_endpoint(EndpointName=name, EndpointConfigName=name + "-cfg")

    def waiting():
        d = sm.describe_endpoint(EndpointName=name)
        assert d["EndpointStatus"] == "Creating", d
        statuses = variant_statuses(d)
        return statuses and "Waiting for compute capacity" in statuses[0].get("StatusMessage", "") and d
    d = eh.wait_until(waiting, timeout=PROVISION_TIMEOUT, what="a capacity wait in VariantStatus")
    [status] = variant_statuses(d)
    assert status["Status"] == "Creating"
    message = status["StatusMessage"]
    assert "ml.m5.large needs 2 vCPUs and 8 GiB; 0 of 2 vCPUs free" in message, message
    assert "VariantInstanceProvisionTimeoutInSeconds (%d s;" % PROVISION_TIMEOUT in message, message

    d = eh.wait_endpoint(sm, name, statuses=("Failed",), timeout=PROVISION_TIMEOUT + 30, server=module_kiln)
    assert time.monotonic() - created >= PROVISION_TIMEOUT - 1
    reason = d["FailureReason"]
    assert reason.startswith(CAPACITY_SENTENCE), reason
    assert "AllTraffic" in reason and "ml.m5.large" in reason and "0 of 2 vCPUs free" in reason, reason
    # A Failed endpoint reports no variant as still Creating, on the first Describe that says Failed.
    assert all(s["Status"] != "Creating" for s in variant_statuses(d)), d
    # The endpoint that held the capacity was never touched.
    assert sm.describe_endpoint(EndpointName=holder)["EndpointStatus"] == "InService"


def test_variant_provision_timeout_is_taken_from_the_variant(module_kiln, sm):
    holder = eh.unique_name("ep-holder2")
    eh.create_model(sm, holder + "-m")
    config(module_kiln, holder + "-cfg", holder + "-m")
    sm.create_endpoint(EndpointName=holder, EndpointConfigName=holder + "-cfg")
    eh.wait_endpoint(sm, holder, server=module_kiln)
    name = eh.unique_name("ep-nofit300")
    eh.create_model(sm, name + "-m")
    config(module_kiln, name + "-cfg", name + "-m", VariantInstanceProvisionTimeoutInSeconds=300)
    sm.create_endpoint(EndpointName=name, EndpointConfigName=name + "-cfg")

    def waiting():
        statuses = variant_statuses(sm.describe_endpoint(EndpointName=name))
        return statuses and "(300 s;" in statuses[0].get("StatusMessage", "") and statuses
    eh.wait_until(waiting, timeout=PROVISION_TIMEOUT, what="the variant's own provision timeout")
    # Deleting the holder frees the vCPUs: the waiting instance starts.
    sm.delete_endpoint(EndpointName=holder)
    d = eh.wait_endpoint(sm, name, timeout=60, server=module_kiln)
    assert variant_statuses(d) == []


def test_type_larger_than_the_host_fails_at_once_with_a_capacity_reason(module_kiln, sm):
    name = eh.unique_name("ep-huge")
    eh.create_model(sm, name + "-m")
    config(module_kiln, name + "-cfg", name + "-m", instance_type="ml.m5.24xlarge")
    sm.create_endpoint(EndpointName=name, EndpointConfigName=name + "-cfg")
    d = eh.wait_endpoint(sm, name, statuses=("Failed",), timeout=PROVISION_TIMEOUT - 2, server=module_kiln)
    reason = d["FailureReason"]
    assert reason.startswith(CAPACITY_SENTENCE), reason
    assert "ml.m5.24xlarge" in reason and "96 vCPUs" in reason, reason
    assert variant_statuses(d) == []
