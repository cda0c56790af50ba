"""The SageMaker Python SDK 2.257.6, unmodified, drives Kiln the way users do (issue 10):
Session.upload_data, S3Uploader/S3Downloader, PyTorch script mode fit(logs=True) with
MetricDefinitions, Estimator.attach / PyTorch.attach, training_job_analytics.dataframe(), SKLearn,
a generic Estimator with a `local:` image, Model(image_uri="local:...").deploy() with JSON and CSV
Predictors, the entry_point repack, delete_model/delete_endpoint.

Each SDK flow is a scenario in sdk/scenarios.py run in its own process (the SDK's boto3 1.43 must
not replace Debian's 1.26 in this process; see sdk_helpers.py). The independent scenarios are all
started when the module's server is up, so they overlap; a test waits for its scenario's result
and checks it, and checks the server with this process's boto3. One server and one PyTorch job are
shared: attach and analytics run on the job fit() trained.
"""

import io
import json
import os
import random
import re
import tarfile
import uuid

import pytest
from botocore.exceptions import ClientError

import endpoint_helpers as eh
import sdk_helpers
import training_helpers as th
from training_helpers import sm, s3  # noqa: F401 (module-scoped client fixtures)

KILN_CONFIG = {
    "scheduler": {"policy": "shrink", "allow_cpu_fallback": True},
    "training": {"stop_grace_seconds": 10},
    "endpoints": {"stop_grace_seconds": 5, "health_interval_seconds": 0.5},
}

EPOCHS = 6
TRUE_W = (2.0, -3.0)
TRUE_B = 1.0
ROWS = [[0.5, -0.25], [1.0, 1.0], [-2.0, 0.0]]
SERVE_MODEL = {"w": [2.0, -3.0], "b": 1.0}
LOSS_LINE = re.compile(r"epoch=(\d+) loss=([0-9.]+)")
PYTORCH_IMAGE = "763104351884.dkr.ecr.us-east-1.amazonaws.com/pytorch-training:2.1-cpu-py310"
SKLEARN_IMAGE = "683313688378.dkr.ecr.us-east-1.amazonaws.com/sagemaker-scikit-learn:1.2-1-cpu-py3"

# test -> the scenario it needs that depends on no other, started at once for the selected tests.
# The deploy scenarios start once every training job has ended: on a 2-CPU host an endpoint
# instance that finds free capacity reserves all of it, and training jobs then queue behind it for
# as long as it lives; overlapping them would make the suite's time (and, while the training
# scheduler is not woken by an endpoint's release, its outcome) depend on timing.
UP_FRONT = {
    "test_s3_upload_and_download": "s3_transfer",
    "test_pytorch_fit_streams_logs_and_metrics": "pytorch_fit",
    "test_attach_to_the_trained_job": "pytorch_fit",
    "test_training_job_analytics_dataframe": "pytorch_fit",
    "test_sklearn_estimator": "sklearn_fit",
    "test_generic_estimator_with_local_image": "local_image_fit",
    "test_byoc_estimator_attach_and_deploy": "byoc_fit",
    "test_failed_fit_raises_with_the_failure_reason": "failing_fit",
}
AFTER_TRAINING = {
    "test_model_deploy_json_and_csv_predictors": "deploy_json_csv",
    "test_model_deploy_with_entry_point_repacks": "deploy_repack",
}
TRAINING_SCENARIOS = ("pytorch_fit", "sklearn_fit", "local_image_fit", "byoc_fit", "failing_fit")
FAILURE = "ValueError: column 'y' is missing from train.csv"


def linear(row, w=SERVE_MODEL["w"], b=SERVE_MODEL["b"]):
    return sum(wi * xi for wi, xi in zip(w, row)) + b


def selected_tests(request):
    return {item.name for item in request.session.items if item.module is request.module}


@pytest.fixture(scope="module")
def sdk_lib():
    lib = sdk_helpers.sdk_lib_dir()
    if lib is None:
        pytest.skip("SageMaker Python SDK bundle not found (../shared/clients/sagemaker-python-sdk/lib "
                    "beside the repository, or $KILN_SAGEMAKER_SDK_LIB)")
    return lib


@pytest.fixture(scope="module")
def inputs(module_kiln, s3, tmp_path_factory):
    """A bucket with the serving model, and the local files the scenarios upload."""
    work = tmp_path_factory.mktemp("sdk")
    bucket = "kiln-sdk-" + uuid.uuid4().hex[:10]
    s3.create_bucket(Bucket=bucket)
    rnd = random.Random(11)
    lines = []
    for _ in range(60):
        x1, x2 = rnd.uniform(-1, 1), rnd.uniform(-1, 1)
        y = TRUE_W[0] * x1 + TRUE_W[1] * x2 + TRUE_B + rnd.gauss(0, 0.01)
        lines.append("%.6f,%.6f,%.6f\n" % (y, x1, x2))
    data_dir = work / "data"
    data_dir.mkdir()
    (data_dir / "train.csv").write_text("".join(lines))
    files_dir = work / "files"
    (files_dir / "sub").mkdir(parents=True)
    (files_dir / "a.txt").write_text("file a\n")
    (files_dir / "sub" / "b.txt").write_text("file b in sub\n")
    s3.put_object(Bucket=bucket, Key="models/linear/model.tar.gz",
                  Body=eh.model_tarball({"model.json": json.dumps(SERVE_MODEL).encode()}))
    return {"bucket": bucket, "work": str(work), "data_dir": str(data_dir), "files_dir": str(files_dir),
            "model_data": "s3://%s/models/linear/model.tar.gz" % bucket,
            "s3_bucket": "kiln-sdk-s3-" + uuid.uuid4().hex[:8]}


@pytest.fixture(scope="module")
def runner(module_kiln, sm, sdk_lib, inputs, request):
    """Starts the scenarios of the selected tests at once; kills leftovers and deletes every
    endpoint (instances outlive a stopped server) at the end."""
    r = sdk_helpers.ScenarioRunner(module_kiln, os.path.join(inputs["work"], "scenarios"), sdk_lib)
    selected = selected_tests(request)
    try:
        for test, scenario in UP_FRONT.items():
            if test in selected:
                start(r, inputs, scenario)
        yield r
    finally:
        r.stop_all()
    eh.delete_all_endpoints(sm)
    for name, sc in sorted(r.scenarios.items()):
        seconds = sc.seconds()
        print("sdk scenario %-16s rc=%s %s" % (name, sc.proc.returncode,
                                                "%.1f s" % seconds if seconds else "(no result)"))


def start(r, inputs, scenario, **extra):
    b = inputs["bucket"]
    args = {
        "s3_transfer": dict(bucket=inputs["s3_bucket"], local_dir=inputs["files_dir"], workdir=inputs["work"]),
        "pytorch_fit": dict(bucket=b, data_dir=inputs["data_dir"], epochs=EPOCHS),
        "sklearn_fit": dict(bucket=b, data_dir=inputs["data_dir"]),
        "local_image_fit": dict(bucket=b, data_dir=inputs["data_dir"]),
        "deploy_json_csv": dict(bucket=b, model_data=inputs["model_data"], rows=ROWS,
                                name=eh.unique_name("sdk-ep")),
        "deploy_repack": dict(bucket=b, model_data=inputs["model_data"], rows=ROWS,
                              name=eh.unique_name("sdk-repack")),
        "byoc_fit": dict(bucket=b, data_dir=inputs["data_dir"]),
        "failing_fit": dict(bucket=b, failure=FAILURE),
        "byoc_deploy": dict(bucket=b, rows=ROWS, name=eh.unique_name("sdk-byoc")),
        "attach": dict(bucket=b),
        "analytics": dict(bucket=b),
    }[scenario]
    args.update(extra)
    return r.start(scenario, args, timeout=300)


@pytest.fixture(scope="module")
def trained(runner, inputs, request):
    """The PyTorch job fit() trained; the scenarios that read it start as soon as it is done."""
    result = runner.result("pytorch_fit")
    selected = selected_tests(request)
    job = result["job_name"]
    if "test_attach_to_the_trained_job" in selected:
        start(runner, inputs, "attach", job_name=job)
    if "test_training_job_analytics_dataframe" in selected:
        start(runner, inputs, "analytics", job_name=job)
    return result


@pytest.fixture(scope="module")
def deploys(runner, inputs, request):
    """Starts the selected deploy scenarios together once the training scenarios have ended."""
    for name in TRAINING_SCENARIOS:
        if name in runner.scenarios:
            runner.scenarios[name].wait()
    selected = selected_tests(request)
    for test, scenario in AFTER_TRAINING.items():
        if test in selected:
            start(runner, inputs, scenario)
    if "test_byoc_estimator_attach_and_deploy" in selected:
        try:
            job = runner.result("byoc_fit")["job_name"]
        except sdk_helpers.ScenarioFailed:
            pass  # the test reports it
        else:
            start(runner, inputs, "byoc_deploy", job_name=job)
    return runner


def printed_losses(output):
    return [(int(m.group(1)), float(m.group(2))) for m in LOSS_LINE.finditer(output)]


def s3_bytes(s3, uri):
    return th.get_s3(s3, uri)


def assert_gone(sm, name):
    """predictor.delete_model()/delete_endpoint(): model and configuration at once, the endpoint
    once its instances stopped."""
    th.wait_until(lambda: eh.endpoint_gone(sm, name), timeout=60, what="endpoint %s deleted" % name)
    with pytest.raises(ClientError) as e:
        sm.describe_endpoint_config(EndpointConfigName=name)
    assert "Could not find endpoint configuration" in e.value.response["Error"]["Message"]
    with pytest.raises(ClientError) as e:
        sm.describe_model(ModelName=name)
    assert "Could not find model" in e.value.response["Error"]["Message"]


# ---------------------------------------------------------------------------------------------


def test_s3_upload_and_download(runner, s3, inputs):
    r = runner.result("s3_transfer")
    b = inputs["s3_bucket"]
    s3.head_bucket(Bucket=b)  # the SDK created its default bucket
    assert r["upload_dir_uri"] == "s3://%s/sdk-s3/dir" % b  # a directory: the prefix, no slash
    assert r["upload_file_uri"] == "s3://%s/sdk-s3/file/a.txt" % b
    assert r["uploader_dir_uri"] == "s3://%s/sdk-s3/uploader" % b
    assert sorted(r["list"]) == ["s3://%s/sdk-s3/uploader/a.txt" % b, "s3://%s/sdk-s3/uploader/sub/b.txt" % b]
    assert r["read_file"] == "hello from the SDK"
    assert r["read_bytes"] == list(range(256))
    assert r["downloaded"] == {"a.txt": "file a\n", "sub/b.txt": "file b in sub\n"}
    assert sorted(r["list_s3_files"]) == ["sdk-s3/dir/a.txt", "sdk-s3/dir/sub/b.txt"]
    assert r["read_s3_file"] == "file a\n"
    assert s3_bytes(s3, r["uploader_string_uri"]) == b"hello from the SDK"
    assert s3_bytes(s3, r["uploader_bytes_uri"]) == bytes(range(256))
    assert s3_bytes(s3, "s3://%s/sdk-s3/uploader/sub/b.txt" % b) == b"file b in sub\n"


def test_pytorch_fit_streams_logs_and_metrics(runner, trained, s3, inputs):
    d = trained["describe"]
    out = trained["output"]
    assert d["TrainingJobStatus"] == "Completed", d.get("FailureReason")
    assert trained["job_name"].startswith("sdk-pytorch-")
    assert d["AlgorithmSpecification"]["TrainingImage"] == PYTORCH_IMAGE
    assert d["AlgorithmSpecification"]["MetricDefinitions"] == [{"Name": "train:loss", "Regex": "loss=([0-9.]+)"}]
    hps = d["HyperParameters"]
    assert hps["epochs"] == str(EPOCHS) and hps["lr"] == "0.1"
    assert hps["sagemaker_program"] == '"train.py"'
    submit = json.loads(hps["sagemaker_submit_directory"])
    assert submit.startswith("s3://%s/%s/" % (inputs["bucket"], trained["job_name"])), submit
    channel = d["InputDataConfig"][0]
    assert channel["ChannelName"] == "train"
    assert channel["DataSource"]["S3DataSource"]["S3Uri"] == trained["train_uri"]
    assert trained["train_uri"] == "s3://%s/sdk/pytorch/train" % inputs["bucket"]

    # fit(logs=True) streamed the script's output and the status changes, then the totals.
    losses = printed_losses(out)
    assert [e for e, _ in losses] == list(range(EPOCHS)), out[-3000:]
    assert "loaded 60 rows with 2 features" in out
    assert re.search(r"Completed - Training job completed", out), out[-3000:]
    assert re.search(r"^Training seconds: \d+$", out, re.M), out[-2000:]
    assert re.search(r"^Billable seconds: \d+$", out, re.M), out[-2000:]

    # MetricDefinitions: the last printed value is the final metric.
    final = {m["MetricName"]: m["Value"] for m in d["FinalMetricDataList"]}
    assert final["train:loss"] == pytest.approx(losses[-1][1], abs=1e-6)

    files = th.untar(s3_bytes(s3, trained["model_data"]))
    assert {"model.pth", "model.json"} <= set(files), sorted(files)
    weights = json.loads(files["model.json"])
    assert weights["w"] == pytest.approx(list(TRUE_W), abs=0.2)
    assert weights["b"] == pytest.approx(TRUE_B, abs=0.2)


def test_attach_to_the_trained_job(runner, trained, inputs):
    r = runner.result("attach")
    g = r["generic"]
    assert g["job_name"] == trained["job_name"]
    assert g["model_data"] == trained["model_data"]
    assert g["image_uri"] == PYTORCH_IMAGE
    assert g["role"] == sdk_helpers.ROLE_ARN
    assert (g["instance_type"], g["instance_count"]) == ("ml.m5.large", 1)
    # (metric_definitions stay unset: the SDK looks for "MetricDefinitons" in Describe.)
    assert g["output_kms_key"] == ""  # Describe's OutputDataConfig.KmsKeyId, read without a default
    assert g["output_path"] == "s3://%s/" % inputs["bucket"]
    assert g["hyperparameters"]["epochs"] == str(EPOCHS)
    p = r["pytorch"]
    assert (p["framework_version"], p["py_version"]) == ("2.1", "py310")
    assert p["entry_point"] == "train.py"
    assert p["source_dir"] == json.loads(trained["describe"]["HyperParameters"]["sagemaker_submit_directory"])
    assert p["hyperparameters"]["epochs"] == str(EPOCHS)
    assert p["model_data"] == trained["model_data"]
    # logs() of the attached estimator prints the finished job's log again.
    again = r["output"].split("=== logs() of the attached estimator", 1)[1]
    assert printed_losses(again) == printed_losses(trained["output"])


def test_training_job_analytics_dataframe(runner, trained):
    """TrainingJobAnalytics asks GetMetricStatistics for Average over 60 s periods under
    TrainingJobName, TrainingStartTime .. TrainingEndTime + 60 s; each row is then the mean of the
    values printed in one minute, in order."""
    r = runner.result("analytics")
    assert r["columns"] == ["timestamp", "metric_name", "value"]
    rows = r["rows"]
    assert rows, "training_job_analytics returned no rows"
    assert {row["metric_name"] for row in rows} == {"train:loss"}
    stamps = [row["timestamp"] for row in rows]
    assert stamps[0] == 0.0 and stamps == sorted(stamps) and all(t % 60 == 0 for t in stamps), stamps
    printed = [v for _, v in printed_losses(trained["output"])]
    values = [row["value"] for row in rows]
    assert splits_into_means(printed, values), (printed, values)


def splits_into_means(seq, means, tol=1e-6):
    """Whether `seq` cuts into len(means) consecutive non-empty runs whose averages are `means`."""
    def go(i, j):
        if j == len(means):
            return i == len(seq)
        total = 0.0
        for k in range(i, len(seq)):
            total += seq[k]
            if abs(total / (k - i + 1) - means[j]) <= tol and go(k + 1, j + 1):
                return True
        return False
    return go(0, 0)


def test_sklearn_estimator(runner, s3):
    r = runner.result("sklearn_fit")
    d = r["describe"]
    assert d["TrainingJobStatus"] == "Completed", d.get("FailureReason")
    assert d["AlgorithmSpecification"]["TrainingImage"] == SKLEARN_IMAGE == r["image_uri"]
    assert d["HyperParameters"]["alpha"] == "0.001"
    m = re.search(r"r2=([0-9.]+)", r["output"])
    assert m and float(m.group(1)) > 0.99, r["output"][-3000:]
    files = th.untar(s3_bytes(s3, r["model_data"]))
    assert "model.joblib" in files, sorted(files)
    import joblib
    model = joblib.load(io.BytesIO(files["model.joblib"]))
    assert model.predict([[1.0, 1.0]])[0] == pytest.approx(TRUE_W[0] + TRUE_W[1] + TRUE_B, abs=0.1)


def test_generic_estimator_with_local_image(runner, s3, inputs):
    r = runner.result("local_image_fit")
    d = r["describe"]
    assert d["TrainingJobStatus"] == "Completed", d.get("FailureReason")
    assert d["AlgorithmSpecification"]["TrainingImage"] == "local:" + os.path.join(th.JOBS_DIR, "probe.py")
    assert d["HyperParameters"] == {"copy_channels": "1", "lines": "3"}
    assert r["model_data"].startswith("s3://%s/sdk/probe/output/%s/" % (inputs["bucket"], r["job_name"]))
    # (The SDK ends its last status line without a newline: the first log line follows on it.)
    for i in range(3):
        assert re.search(r"line %d$" % i, r["output"], re.M), r["output"][-3000:]
    report = th.model_report(s3, d)
    assert report["argv"][1:] == ["train"]
    assert report["hyperparameters"] == {"copy_channels": "1", "lines": "3"}
    assert report["inputdataconfig"]["train"]["ContentType"] == "text/csv"
    # upload_data gave s3://bucket/sdk/probe/train (no trailing slash): the object's key minus
    # that prefix, minus the leading "/", is the file's path in the channel (contract §6.2).
    with open(os.path.join(inputs["data_dir"], "train.csv"), "rb") as f:
        assert report["channels"]["train"] == {"train.csv": th.sha256(f.read())}


def test_failed_fit_raises_with_the_failure_reason(runner, sm):
    r = runner.result("failing_fit")
    assert r["raised"] == "UnexpectedStatusException", r
    assert r["actual_status"] == "Failed"
    d = sm.describe_training_job(TrainingJobName=r["job_name"])
    assert d["FailureReason"] == FAILURE
    # "Error for Training job <name>: Failed. Reason: <FailureReason>. Check troubleshooting guide..."
    assert "Error for Training job %s: Failed. Reason: %s." % (r["job_name"], FAILURE) in r["message"], r["message"]
    assert re.search(r"line 1$", r["output"], re.M), r["output"][-3000:]  # the log was streamed first


def test_model_deploy_json_and_csv_predictors(deploys, sm):
    r = deploys.result("deploy_json_csv")
    name = r["endpoint_name"]
    d = r["describe"]
    assert d["EndpointStatus"] == "InService"
    [variant] = d["ProductionVariants"]
    assert variant["VariantName"] == "AllTraffic"
    assert variant["CurrentInstanceCount"] == 1
    expected = [linear(row) for row in ROWS]
    assert r["json"]["predictions"] == pytest.approx(expected)
    assert r["json"]["handler"] == "default"
    assert r["json"]["content_type"] == "application/json"
    assert r["json"]["model_files"] == ["model.json"]
    assert [len(row) for row in r["csv"]] == [1] * len(ROWS), r["csv"]
    assert [float(row[0]) for row in r["csv"]] == pytest.approx(expected)
    assert r["csv_numpy_json"]["content_type"] == "text/csv"
    assert r["csv_numpy_json"]["predictions"] == pytest.approx(expected)
    assert_gone(sm, name)


def test_model_deploy_with_entry_point_repacks(deploys, sm, s3, inputs):
    r = deploys.result("deploy_repack")
    repacked = r["repacked_model_data"]
    assert repacked != inputs["model_data"] and repacked.endswith("/model.tar.gz"), repacked
    with tarfile.open(fileobj=io.BytesIO(s3_bytes(s3, repacked)), mode="r:gz") as tf:
        names = tf.getnames()
    # The SDK's archive carries its root directory as a member named "/" (tarfile.add(dir, "/")).
    assert names[0] in ("/", ""), names
    assert {"model.json", "code/inference.py", "code/scale.py"} <= {n.lstrip("/") for n in names}, names
    container = r["model"]["PrimaryContainer"]
    assert container["ModelDataUrl"] == repacked
    assert container["Environment"]["SAGEMAKER_PROGRAM"] == "inference.py"
    assert container["Environment"]["SAGEMAKER_SUBMIT_DIRECTORY"] == "/opt/ml/model/code"
    answer = r["json"]
    assert answer["handler"] == "inference.py"
    assert answer["predictions"] == pytest.approx([10.0 * linear(row) for row in ROWS])
    assert {"model.json", "code/inference.py", "code/scale.py"} <= set(answer["model_files"])
    assert_gone(sm, r["model"]["ModelName"])


def test_byoc_estimator_attach_and_deploy(deploys, sm, s3):
    """One `local:` image that trains and serves: Estimator.fit(), then Estimator.attach(job)
    .deploy() of the job's model.tar.gz with the same image, answering with the fitted model."""
    fit = deploys.result("byoc_fit")
    assert re.search(r"fitted w=.* on 60 rows", fit["output"]), fit["output"][-3000:]
    # A managed spot job: the SDK divides BillableTimeInSeconds by TrainingTimeInSeconds.
    assert re.search(r"^Managed Spot Training savings: \d+\.\d%$", fit["output"], re.M), fit["output"][-2000:]
    files = th.untar(s3_bytes(s3, fit["model_data"]))
    fitted = json.loads(files["model.json"])
    assert fitted["w"] == pytest.approx(list(TRUE_W), abs=0.05) and fitted["b"] == pytest.approx(TRUE_B, abs=0.05)
    r = deploys.result("byoc_deploy")
    assert r["model_data"] == fit["model_data"]
    container = r["model"]["PrimaryContainer"]
    assert container["Image"] == "local:" + os.path.join(sdk_helpers.SDK_DIR, "linear_image.py")
    assert container["ModelDataUrl"] == fit["model_data"]
    assert r["json"]["content_type"] == "text/csv"
    assert r["json"]["predictions"] == pytest.approx([linear(row, fitted["w"], fitted["b"]) for row in ROWS])
    assert_gone(sm, r["endpoint_name"])
