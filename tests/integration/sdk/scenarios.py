"""SageMaker Python SDK scenarios, each run as its own process by test_sdk.py:

    /usr/bin/python3 scenarios.py NAME RESULT.json ARGS.json

with the SDK bundle's lib/ first on the path and AWS_ENDPOINT_URL + keys of the server under test
(sdk_helpers.ScenarioRunner.env). A scenario drives Kiln only through the SDK's public API, the
way a user's notebook does, and writes what it observed to RESULT.json (datetimes as strings);
the checks live in test_sdk.py. Anything the SDK raises fails the process with its traceback.
Everything the SDK prints (fit()'s streamed logs) is the scenario's output, which the test reads.
"""

import json
import logging
import os
import sys
import time

STARTED = time.monotonic()
HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
import sdk_helpers  # noqa: E402

ROLE = sdk_helpers.ROLE_ARN
LINEAR_IMAGE = "local:" + os.path.join(HERE, "linear_image.py")  # train and serve
PROBE_IMAGE = "local:" + os.path.join(sdk_helpers.JOBS_DIR, "probe.py")


def _describe_job(sess, name):
    return sess.sagemaker_client.describe_training_job(TrainingJobName=name)


def s3_transfer(sess, a):
    """Session.upload_data (a directory and a file), S3Uploader and S3Downloader."""
    from sagemaker.s3 import S3Downloader, S3Uploader
    bucket, src = a["bucket"], a["local_dir"]
    out = {}
    out["upload_dir_uri"] = sess.upload_data(src, key_prefix="sdk-s3/dir")
    out["upload_file_uri"] = sess.upload_data(os.path.join(src, "a.txt"), key_prefix="sdk-s3/file")
    out["uploader_dir_uri"] = S3Uploader.upload(src, "s3://%s/sdk-s3/uploader" % bucket, sagemaker_session=sess)
    out["uploader_string_uri"] = S3Uploader.upload_string_as_file_body(
        "hello from the SDK", "s3://%s/sdk-s3/strings/hello.txt" % bucket, sagemaker_session=sess)
    out["uploader_bytes_uri"] = S3Uploader.upload_bytes(
        bytes(range(256)), "s3://%s/sdk-s3/bytes/all.bin" % bucket, sagemaker_session=sess)
    out["list"] = S3Downloader.list("s3://%s/sdk-s3/uploader" % bucket, sagemaker_session=sess)
    out["read_file"] = S3Downloader.read_file("s3://%s/sdk-s3/strings/hello.txt" % bucket, sagemaker_session=sess)
    out["read_bytes"] = list(S3Downloader.read_bytes("s3://%s/sdk-s3/bytes/all.bin" % bucket,
                                                     sagemaker_session=sess))
    dest = os.path.join(a["workdir"], "downloaded")
    out["download_returned"] = S3Downloader.download("s3://%s/sdk-s3/dir" % bucket, dest, sagemaker_session=sess)
    tree = {}
    for dirpath, _, files in os.walk(dest):
        for fn in files:
            with open(os.path.join(dirpath, fn), "rb") as f:
                tree[os.path.relpath(os.path.join(dirpath, fn), dest)] = f.read().decode()
    out["downloaded"] = tree
    out["list_s3_files"] = sess.list_s3_files(bucket, "sdk-s3/dir/")
    out["read_s3_file"] = sess.read_s3_file(bucket, "sdk-s3/file/a.txt")
    return out


def pytorch_fit(sess, a):
    """upload_data -> PyTorch script mode (framework_version, MetricDefinitions) -> fit(logs=True)."""
    from sagemaker.pytorch import PyTorch
    train_uri = sess.upload_data(a["data_dir"], key_prefix="sdk/pytorch/train")
    est = PyTorch(entry_point="train.py", source_dir=os.path.join(HERE, "pytorch_src"), role=ROLE,
                  framework_version="2.1", py_version="py310", instance_type="ml.m5.large",
                  instance_count=1, hyperparameters={"epochs": a["epochs"], "lr": 0.1},
                  metric_definitions=[{"Name": "train:loss", "Regex": "loss=([0-9.]+)"}],
                  base_job_name="sdk-pytorch", sagemaker_session=sess)
    t0 = time.monotonic()
    est.fit({"train": train_uri}, logs=True)
    name = est.latest_training_job.name
    return {"train_uri": train_uri, "job_name": name, "model_data": est.model_data,
            "image_uri": est.training_image_uri(), "fit_seconds": time.monotonic() - t0,
            "describe": _describe_job(sess, name)}


def attach(sess, a):
    """Estimator.attach (generic) and PyTorch.attach on a finished job, then logs() again."""
    from sagemaker.estimator import Estimator
    from sagemaker.pytorch import PyTorch
    est = Estimator.attach(a["job_name"], sagemaker_session=sess)
    out = {"generic": {"model_data": est.model_data, "image_uri": est.image_uri, "role": est.role,
                       "instance_type": est.instance_type, "instance_count": est.instance_count,
                       "hyperparameters": est.hyperparameters(), "output_kms_key": est.output_kms_key,
                       "output_path": est.output_path, "job_name": est.latest_training_job.name}}
    pt = PyTorch.attach(a["job_name"], sagemaker_session=sess)
    out["pytorch"] = {"framework_version": pt.framework_version, "py_version": pt.py_version,
                      "entry_point": pt.entry_point, "source_dir": pt.source_dir,
                      "hyperparameters": pt.hyperparameters(), "model_data": pt.model_data}
    print("=== logs() of the attached estimator", flush=True)
    pt.logs()
    return out


def analytics(sess, a):
    """estimator.training_job_analytics.dataframe() on an attached estimator (CloudWatch
    GetMetricStatistics, Average over 60 s periods, names from MetricDefinitions)."""
    from sagemaker.pytorch import PyTorch
    est = PyTorch.attach(a["job_name"], sagemaker_session=sess)
    df = est.training_job_analytics.dataframe()
    return {"columns": list(df.columns), "rows": df.to_dict(orient="records")}


def sklearn_fit(sess, a):
    """SKLearn estimator (framework image resolved by the SDK) with Debian's scikit-learn."""
    from sagemaker.sklearn import SKLearn
    train_uri = sess.upload_data(a["data_dir"], key_prefix="sdk/sklearn/train")
    est = SKLearn(entry_point="train.py", source_dir=os.path.join(HERE, "sklearn_src"), role=ROLE,
                  framework_version="1.2-1", py_version="py3", instance_type="ml.m5.large",
                  instance_count=1, hyperparameters={"alpha": 0.001}, base_job_name="sdk-sklearn",
                  sagemaker_session=sess)
    est.fit({"train": train_uri}, logs=True)
    name = est.latest_training_job.name
    return {"job_name": name, "model_data": est.model_data, "image_uri": est.training_image_uri(),
            "describe": _describe_job(sess, name)}


def local_image_fit(sess, a):
    """A generic Estimator with a `local:` image (the probe), a TrainingInput channel."""
    from sagemaker.estimator import Estimator
    from sagemaker.inputs import TrainingInput
    train_uri = sess.upload_data(a["data_dir"], key_prefix="sdk/probe/train")
    est = Estimator(image_uri=PROBE_IMAGE, role=ROLE, instance_count=1, instance_type="ml.m5.large",
                    output_path="s3://%s/sdk/probe/output" % a["bucket"], base_job_name="sdk-probe",
                    hyperparameters={"copy_channels": 1, "lines": 3}, sagemaker_session=sess)
    est.fit({"train": TrainingInput(train_uri, content_type="text/csv")}, logs=True)
    name = est.latest_training_job.name
    return {"train_uri": train_uri, "job_name": name, "model_data": est.model_data,
            "describe": _describe_job(sess, name)}


def failing_fit(sess, a):
    """fit() of a job whose program fails: the SDK raises UnexpectedStatusException carrying the
    FailureReason the program wrote, after streaming its log."""
    from sagemaker.estimator import Estimator
    from sagemaker.exceptions import UnexpectedStatusException
    est = Estimator(image_uri=PROBE_IMAGE, role=ROLE, instance_count=1, instance_type="ml.m5.large",
                    base_job_name="sdk-failing", sagemaker_session=sess,
                    hyperparameters={"lines": 2, "failure": a["failure"], "exit_code": 3})
    try:
        est.fit(logs=True)
    except UnexpectedStatusException as e:
        return {"raised": type(e).__name__, "message": str(e), "actual_status": e.actual_status,
                "job_name": est.latest_training_job.name}
    return {"raised": None, "job_name": est.latest_training_job.name}


def byoc_fit(sess, a):
    """The bring-your-own-container pattern: a generic Estimator whose image trains and serves,
    as a managed spot job (fit() then prints the savings from Billable/TrainingTimeInSeconds)."""
    from sagemaker.estimator import Estimator
    train_uri = sess.upload_data(a["data_dir"], key_prefix="sdk/byoc/train")
    est = Estimator(image_uri=LINEAR_IMAGE, role=ROLE, instance_count=1, instance_type="ml.m5.large",
                    use_spot_instances=True, max_run=600, max_wait=1200,
                    base_job_name="sdk-byoc", sagemaker_session=sess)
    est.fit({"train": train_uri}, logs=True)
    return {"job_name": est.latest_training_job.name, "model_data": est.model_data}


def byoc_deploy(sess, a):
    """Estimator.attach to the finished BYOC job, then estimator.deploy(): a model from the job's
    image and artifacts, a Predictor (CSV in, JSON out); deleted again."""
    from sagemaker.deserializers import JSONDeserializer
    from sagemaker.estimator import Estimator
    from sagemaker.serializers import CSVSerializer
    est = Estimator.attach(a["job_name"], sagemaker_session=sess)
    predictor = est.deploy(initial_instance_count=1, instance_type="ml.m5.large", endpoint_name=a["name"],
                           serializer=CSVSerializer(), deserializer=JSONDeserializer())
    out = {"endpoint_name": predictor.endpoint_name, "model_data": est.model_data,
           "json": predictor.predict(a["rows"])}
    sm = sess.sagemaker_client
    config = sm.describe_endpoint_config(
        EndpointConfigName=sm.describe_endpoint(EndpointName=a["name"])["EndpointConfigName"])
    out["model"] = sm.describe_model(ModelName=config["ProductionVariants"][0]["ModelName"])
    predictor.delete_model()
    predictor.delete_endpoint()
    return out


def deploy_json_csv(sess, a):
    """Model(image_uri="local:...", model_data=...).deploy() with the default 30 s polling; a
    Predictor with the JSON serializer/deserializer and one with CSV; delete_model and
    delete_endpoint."""
    from sagemaker.deserializers import CSVDeserializer, JSONDeserializer
    from sagemaker.model import Model
    from sagemaker.predictor import Predictor
    from sagemaker.serializers import CSVSerializer, JSONSerializer
    name, rows = a["name"], a["rows"]
    model = Model(image_uri=LINEAR_IMAGE, model_data=a["model_data"], role=ROLE, name=name,
                  predictor_cls=Predictor, sagemaker_session=sess)
    t0 = time.monotonic()
    predictor = model.deploy(initial_instance_count=1, instance_type="ml.m5.large", endpoint_name=name,
                             serializer=JSONSerializer(), deserializer=JSONDeserializer())
    out = {"deploy_seconds": time.monotonic() - t0, "endpoint_name": predictor.endpoint_name}
    out["describe"] = sess.sagemaker_client.describe_endpoint(EndpointName=name)
    out["json"] = predictor.predict({"instances": rows})
    csv_predictor = Predictor(name, sagemaker_session=sess, serializer=CSVSerializer(),
                              deserializer=CSVDeserializer())
    out["csv"] = csv_predictor.predict(rows)
    import numpy
    out["csv_numpy_json"] = Predictor(name, sagemaker_session=sess, serializer=CSVSerializer(),
                                      deserializer=JSONDeserializer()).predict(numpy.array(rows))
    predictor.delete_model()
    predictor.delete_endpoint()
    return out


def deploy_repack(sess, a):
    """Model(..., entry_point=, source_dir=): deploy() repacks model.tar.gz with code/ (root member
    named "/"); endpoint_logging=True polls every 10 s and tails the endpoint's log group with
    FilterLogEvents."""
    from sagemaker.deserializers import JSONDeserializer
    from sagemaker.model import Model
    from sagemaker.predictor import Predictor
    from sagemaker.serializers import JSONSerializer
    name, rows = a["name"], a["rows"]
    model = Model(image_uri=LINEAR_IMAGE, model_data=a["model_data"], role=ROLE, name=name,
                  entry_point="inference.py", source_dir=os.path.join(HERE, "inference_src"),
                  predictor_cls=Predictor, sagemaker_session=sess)
    t0 = time.monotonic()
    predictor = model.deploy(initial_instance_count=1, instance_type="ml.m5.large", endpoint_name=name,
                             serializer=JSONSerializer(), deserializer=JSONDeserializer(),
                             endpoint_logging=True)
    out = {"deploy_seconds": time.monotonic() - t0, "repacked_model_data": model.repacked_model_data,
           "env": dict(model.env)}
    out["model"] = sess.sagemaker_client.describe_model(ModelName=name)
    out["json"] = predictor.predict(rows)
    predictor.delete_model()
    predictor.delete_endpoint()
    return out


def main():
    name, result_path, args_path = sys.argv[1:4]
    # The SDK's own INFO lines (what it creates, waits for, deletes) go to the output a failing
    # test shows; botocore's per-client "Found endpoint ..." lines do not.
    logging.basicConfig(level=logging.INFO, format="%(levelname)s:%(name)s:%(message)s")
    logging.getLogger("botocore").setLevel(logging.WARNING)
    with open(args_path) as f:
        args = json.load(f)
    sess = sdk_helpers.session(args["bucket"])
    result = globals()[name](sess, args)
    result["scenario_seconds"] = time.monotonic() - STARTED  # the SDK's import included
    with open(result_path + ".tmp", "w") as f:
        json.dump(result, f, default=str, indent=1)
    os.replace(result_path + ".tmp", result_path)


if __name__ == "__main__":
    main()
