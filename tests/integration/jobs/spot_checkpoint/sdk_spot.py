"""The SageMaker Python SDK side of test_spot.py, run as its own process:

    /usr/bin/python3 sdk_spot.py NAME RESULT.json ARGS.json

with the SDK bundle's lib/ first on the path and AWS_ENDPOINT_URL + keys of the server under test
(sdk_helpers.ScenarioRunner.env; why a process of its own: sdk_helpers.py). The SDK is used
unmodified, as a notebook uses it: two `sagemaker.pytorch.PyTorch` estimators over train.py (this
folder) with the same seed, one on demand (fit(wait=False)), one managed spot
(use_spot_instances, max_run, max_wait, checkpoint_s3_uri; fit(logs=True) waits, streams the log
and prints the savings). What it observed goes to RESULT.json; the checks live in test_spot.py.
"""

import json
import logging
import os
import sys
import time

STARTED = time.monotonic()
HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.abspath(os.path.join(HERE, "..", "..")))
import sdk_helpers  # noqa: E402

ROLE = sdk_helpers.ROLE_ARN
TRAIN = os.path.join(HERE, "train.py")


def _estimator(sess, a, **extra):
    from sagemaker.pytorch import PyTorch
    return PyTorch(entry_point=TRAIN, role=ROLE, framework_version="2.1", py_version="py310",
                   instance_type="ml.m5.large", instance_count=1, max_run=a["max_run"],
                   hyperparameters={"epochs": a["epochs"], "seed": a["seed"], "step-seconds": a["step_seconds"]},
                   output_path="s3://%s/spot-sdk/output" % a["bucket"], sagemaker_session=sess, **extra)


def spot_and_reference(sess, a):
    """The on-demand reference first (it runs beside the spot job: the server has room for two),
    then the spot job, whose fit() blocks until it ends."""
    reference = _estimator(sess, a)
    reference.fit(job_name=a["reference"], wait=False)
    spot = _estimator(sess, a, use_spot_instances=True, max_wait=a["max_wait"],
                      checkpoint_s3_uri=a["checkpoint_uri"])
    t0 = time.monotonic()
    spot.fit(job_name=a["spot"], logs=True)
    out = {"spot_fit_seconds": time.monotonic() - t0}
    reference.latest_training_job.wait(logs=False)
    out.update({"spot_model_data": spot.model_data, "reference_model_data": reference.model_data,
                "spot_checkpoint_s3_uri": spot.checkpoint_s3_uri})
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
