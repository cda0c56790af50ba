"""The SageMaker Python SDK (unmodified) submits the two-host DDP job of
test_distributed_training.py, the way a user's notebook does:

    /usr/bin/python3 sdk_ddp.py RESULT.json ARGS.json

run by the test with the SDK bundle's lib/ first on the path and the server's AWS_ENDPOINT_URL and
keys (sdk_helpers.ScenarioRunner.env). ARGS: bucket, image_uri, instance_type. It fits
PyTorch(entry_point="ddp_train.py", instance_count=2, distribution={"torch_distributed": ...})
with logs, and writes the job's name, model_data and the SDK's hyperparameters to RESULT.json;
the checks live in the test."""
import json
import logging
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(os.path.dirname(HERE)))  # tests/integration: sdk_helpers
import sdk_helpers  # noqa: E402


def main():
    result_path, args_path = sys.argv[1:3]
    logging.basicConfig(level=logging.INFO, format="%(levelname)s:%(name)s:%(message)s")
    logging.getLogger("botocore").setLevel(logging.WARNING)
    with open(args_path) as f:
        a = json.load(f)
    sess = sdk_helpers.session(a["bucket"])
    from sagemaker.pytorch import PyTorch
    # image_uri: the SDK accepts torch_distributed on a CPU type only with an explicit image
    # (without one it insists on GPU or Trainium types); Kiln maps it to its default PyTorch
    # environment as it does for the resolved one.
    est = PyTorch(entry_point="ddp_train.py", source_dir=os.path.join(HERE, "ddp"),
                  role=sdk_helpers.ROLE_ARN, image_uri=a["image_uri"], framework_version="2.1.0",
                  py_version="py310", instance_type=a["instance_type"], instance_count=2,
                  distribution={"torch_distributed": {"enabled": True}},
                  base_job_name="sdk-ddp", max_run=600, sagemaker_session=sess)
    est.fit(wait=True, logs="All")
    name = est.latest_training_job.name
    result = {"job_name": name, "model_data": est.model_data, "hyperparameters": est.hyperparameters()}
    with open(result_path + ".tmp", "w") as f:
        json.dump(result, f, default=str, indent=1)
    os.replace(result_path + ".tmp", result_path)


if __name__ == "__main__":
    main()
