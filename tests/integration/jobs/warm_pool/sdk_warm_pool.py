"""The SageMaker Python SDK side of test_warm_pools.py, run as its own process:

    /usr/bin/python3 sdk_warm_pool.py NAME RESULT.json ARGS.json

(sdk_helpers.ScenarioRunner: the bundle's boto3 in a process of its own). The SDK is used as a
notebook uses it: a `sagemaker.pytorch.PyTorch` estimator with keep_alive_period_in_seconds fits
train.py on a channel; a second estimator with the same resources and another hyperparameter fits
right after (it must land on the first job's warm pool); then Session.update_training_job sets the
second job's keep-alive period to 0 (its pool ends). What it observed goes to RESULT.json; the
checks live in test_warm_pools.py.
"""

import json
import logging
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.abspath(os.path.join(HERE, "..", "..")))
import sdk_helpers  # noqa: E402

ROLE = sdk_helpers.ROLE_ARN
TRAIN = os.path.join(HERE, "train.py")


def _estimator(sess, a, lr):
    from sagemaker.pytorch import PyTorch
    return PyTorch(entry_point=TRAIN, role=ROLE, framework_version="2.1", py_version="py310",
                   instance_type="ml.m5.large", instance_count=1, max_run=600,
                   keep_alive_period_in_seconds=a["keep_alive"], hyperparameters={"lr": lr},
                   output_path="s3://%s/warm-sdk/output" % a["bucket"], sagemaker_session=sess)


def reuse(sess, a):
    sm = sess.sagemaker_client
    out = {"fits": []}
    for job, lr in ((a["first"], "0.1"), (a["second"], "0.01")):
        estimator = _estimator(sess, a, lr)
        t0 = time.monotonic()
        estimator.fit(inputs={"train": a["channel"]}, job_name=job, logs=False)
        out["fits"].append({"job": job, "seconds": time.monotonic() - t0})
        out[job] = sm.describe_training_job(TrainingJobName=job)
    # The SDK's way to end a pool: the keep-alive period of an Available pool set to 0.
    sess.update_training_job(a["second"], resource_config={"KeepAlivePeriodInSeconds": 0})
    out["second_after_update"] = sm.describe_training_job(TrainingJobName=a["second"])
    out["first_final"] = sm.describe_training_job(TrainingJobName=a["first"])
    return out


def main():
    name, result_path, args_path = sys.argv[1:4]
    logging.basicConfig(level=logging.INFO, format="%(levelname)s:%(name)s:%(message)s")
    logging.getLogger("botocore").setLevel(logging.WARNING)
    with open(args_path) as f:
        args = json.load(f)
    sess = sdk_helpers.session(args["bucket"])
    result = globals()[name](sess, args)
    with open(result_path + ".tmp", "w") as f:
        json.dump(result, f, default=str, indent=1)
    os.replace(result_path + ".tmp", result_path)


if __name__ == "__main__":
    main()
