"""SageMaker Python SDK scenarios of test_sdk_deploy.py (framework inference images served by
Kiln's model server), each run as its own process like sdk/scenarios.py:

    /usr/bin/python3 sdk_scenarios.py NAME RESULT.json ARGS.json

with the SDK bundle's lib/ first on the path and the server's AWS_ENDPOINT_URL + keys. A scenario
drives Kiln only through the SDK's public API and writes what it observed to RESULT.json; the
checks live in test_sdk_deploy.py. Endpoints are left running: the test invokes them with boto3
and deletes every endpoint at the end.
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
INSTANCE = "ml.m5.large"


def _model_of(sess, endpoint):
    sm = sess.sagemaker_client
    config = sm.describe_endpoint_config(
        EndpointConfigName=sm.describe_endpoint(EndpointName=endpoint)["EndpointConfigName"])
    return sm.describe_model(ModelName=config["ProductionVariants"][0]["ModelName"])


def _json_predictor_args():
    from sagemaker.deserializers import JSONDeserializer
    from sagemaker.serializers import JSONSerializer
    return {"serializer": JSONSerializer(), "deserializer": JSONDeserializer()}


def pytorch_fit_deploy(sess, a):
    """PyTorch estimator fit() on a Kiln training job, then estimator.deploy() with an inference.py
    (the framework's pytorch-inference image), predictor.predict()."""
    from sagemaker.pytorch import PyTorch
    train_uri = sess.upload_data(a["data_dir"], key_prefix="sdk-deploy/pytorch/train")
    est = PyTorch(entry_point="train.py", source_dir=os.path.join(HERE, "sdk_pytorch_train"), role=ROLE,
                  framework_version="2.1", py_version="py310", instance_type=INSTANCE, instance_count=1,
                  hyperparameters={"epochs": a["epochs"], "lr": 0.1}, base_job_name="sdk-deploy-pt",
                  sagemaker_session=sess)
    est.fit({"train": train_uri}, logs=True)
    with open(a["fitted_marker"], "w") as f:  # the test starts the other deploys now
        f.write(est.latest_training_job.name)
    t0 = time.monotonic()
    predictor = est.deploy(initial_instance_count=1, instance_type=INSTANCE, endpoint_name=a["name"],
                           entry_point="inference.py", source_dir=os.path.join(HERE, "sdk_pytorch_serve"),
                           **_json_predictor_args())
    out = {"job_name": est.latest_training_job.name, "model_data": est.model_data,
           "deploy_seconds": time.monotonic() - t0, "endpoint_name": predictor.endpoint_name}
    out["predictions"] = predictor.predict(a["rows"])
    out["model"] = _model_of(sess, a["name"])
    return out


def pytorch_model_deploy(sess, a):
    """PyTorchModel(model_data=, entry_point=, source_dir=, framework_version=, py_version=)
    .deploy() -> predict()."""
    from sagemaker.pytorch import PyTorchModel
    model = PyTorchModel(model_data=a["model_data"], role=ROLE, entry_point="inference.py",
                         source_dir=os.path.join(HERE, "sdk_pytorch_serve"), framework_version="2.1",
                         py_version="py310", sagemaker_session=sess)
    t0 = time.monotonic()
    predictor = model.deploy(initial_instance_count=1, instance_type=INSTANCE, endpoint_name=a["name"],
                             **_json_predictor_args())
    out = {"deploy_seconds": time.monotonic() - t0, "endpoint_name": predictor.endpoint_name}
    out["predictions"] = predictor.predict(a["rows"])
    out["model"] = _model_of(sess, a["name"])
    return out


def sklearn_model_deploy(sess, a):
    """SKLearnModel(model_data=, entry_point=, framework_version='1.2-1').deploy(): the SDK uploads
    sourcedir.tar.gz and sets SAGEMAKER_SUBMIT_DIRECTORY to its s3:// URI (no repack)."""
    from sagemaker.sklearn import SKLearnModel
    model = SKLearnModel(model_data=a["model_data"], role=ROLE,
                         entry_point=os.path.join(HERE, "sdk_sklearn_serve", "serve_ridge.py"),
                         framework_version="1.2-1", py_version="py3", sagemaker_session=sess)
    t0 = time.monotonic()
    predictor = model.deploy(initial_instance_count=1, instance_type=INSTANCE, endpoint_name=a["name"],
                             **_json_predictor_args())
    out = {"deploy_seconds": time.monotonic() - t0, "endpoint_name": predictor.endpoint_name}
    out["predictions"] = predictor.predict(a["rows"])
    out["model"] = _model_of(sess, a["name"])
    return out


def main():
    name, result_path, args_path = sys.argv[1:4]
    logging.basicConfig(level=logging.INFO, format="%(levelname)s:%(name)s:%(message)s")
    logging.getLogger("botocore").setLevel(logging.WARNING)
    with open(args_path) as f:
        args = json.load(f)
    sess = sdk_helpers.session(args["bucket"])
    result = globals()[name](sess, args)
    result["scenario_seconds"] = time.monotonic() - STARTED
    with open(result_path + ".tmp", "w") as f:
        json.dump(result, f, default=str, indent=1)
    os.replace(result_path + ".tmp", result_path)


if __name__ == "__main__":
    main()
