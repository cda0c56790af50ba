"""SageMaker Python SDK tuning scenarios, each run as its own process by test_tuning.py:

    /usr/bin/python3 sdk_tuning.py NAME RESULT.json ARGS.json

with the SDK bundle's lib/ first on the path and AWS_ENDPOINT_URL + keys of the server under test
(sdk_helpers.ScenarioRunner.env; why a process of its own: sdk_helpers.py). The SDK is used
unmodified, the way a notebook uses it: HyperparameterTuner over a PyTorch script-mode estimator
whose entry point is src/objective.py (Branin), then best_training_job(), analytics().dataframe(),
HyperparameterTuner.attach, best_estimator(), identical_dataset_and_algorithm_tuner() and a
TransferLearning WarmStartConfig. What it observed goes
to RESULT.json (datetimes as strings); the checks live in test_tuning.py.
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
SRC = os.path.join(HERE, "src")
METRICS = [{"Name": "branin", "Regex": "objective=([0-9.]+)"}]


def _estimator(sess, a, **extra_hps):
    from sagemaker.pytorch import PyTorch
    hps = {"epochs": a["epochs"], "epoch_seconds": a["epoch_seconds"]}
    hps.update(extra_hps)
    return PyTorch(entry_point="objective.py", source_dir=SRC, role=ROLE, framework_version="2.1",
                   py_version="py310", instance_type="ml.m5.large", instance_count=1, max_run=600,
                   hyperparameters=hps, output_path="s3://%s/tuning-sdk/output" % a["bucket"],
                   sagemaker_session=sess)


def _frame(df):
    return {"columns": sorted(df.columns), "rows": df.to_dict(orient="records")}


def _attempt(out, key, fn):
    """A step whose failure is recorded (and checked by its own test) rather than ending the
    scenario."""
    try:
        out[key] = fn()
    except Exception as e:  # noqa: BLE001 (the test shows what the SDK raised)
        out[key + "_error"] = "%s: %s" % (type(e).__name__, e)


def bayesian_warm_start(sess, a):
    """Bayesian search over Branin's (x1, x2); then IdenticalDataAndAlgorithm and TransferLearning
    warm starts from it (the second with both earlier jobs as parents)."""
    from sagemaker.tuner import ContinuousParameter, HyperparameterTuner, WarmStartConfig, WarmStartTypes
    tuner = HyperparameterTuner(
        _estimator(sess, a), objective_metric_name="branin", objective_type="Minimize",
        hyperparameter_ranges={"x1": ContinuousParameter(-5, 10), "x2": ContinuousParameter(0, 15)},
        metric_definitions=METRICS, strategy="Bayesian", max_jobs=a["max_jobs"], max_parallel_jobs=2,
        random_seed=17)
    out = {}
    t0 = time.monotonic()
    tuner.fit(job_name=a["bayes"], wait=True)
    out["fit_seconds"] = time.monotonic() - t0
    out["best_training_job"] = tuner.best_training_job()
    out["describe"] = tuner.describe()
    out["analytics"] = _frame(tuner.analytics().dataframe())
    _attempt(out, "attached", lambda: _attached(sess, a["bayes"]))
    _attempt(out, "best_estimator", lambda: _best_estimator(tuner))

    # The SDK's warm-start tuners copy everything but the tuner's metric_definitions, so for a
    # framework estimator the request has no MetricDefinitions and is refused (the objective
    # must be one); users set them again.
    identical = tuner.identical_dataset_and_algorithm_tuner()
    identical.max_jobs = 2
    from botocore.exceptions import ClientError
    try:
        identical.fit(job_name=a["identical"], wait=False)
        out["no_metric_definitions_error"] = None
    except ClientError as e:
        out["no_metric_definitions_error"] = [e.response["Error"]["Code"], e.response["Error"]["Message"]]
    identical.metric_definitions = METRICS
    t0 = time.monotonic()
    identical.fit(job_name=a["identical"], wait=True)
    out["identical_fit_seconds"] = time.monotonic() - t0
    out["identical_describe"] = identical.describe()
    out["identical_analytics"] = _frame(identical.analytics().dataframe())

    # TransferLearning through the constructor's WarmStartConfig, with both jobs as parents and
    # an estimator whose static hyperparameters differ.
    transfer = HyperparameterTuner(
        _estimator(sess, a, shift=0.0), objective_metric_name="branin", objective_type="Minimize",
        hyperparameter_ranges={"x1": ContinuousParameter(-5, 10), "x2": ContinuousParameter(0, 15)},
        metric_definitions=METRICS, strategy="Bayesian", max_jobs=2, max_parallel_jobs=2,
        warm_start_config=WarmStartConfig(WarmStartTypes.TRANSFER_LEARNING, parents={a["bayes"], a["identical"]}))
    t0 = time.monotonic()
    transfer.fit(job_name=a["transfer"], wait=True)
    out["transfer_fit_seconds"] = time.monotonic() - t0
    out["transfer_describe"] = transfer.describe()
    out["transfer_best_training_job"] = transfer.best_training_job()
    return out


def _attached(sess, name):
    """HyperparameterTuner.attach: the estimator and ranges rebuilt from Describe (the SDK deletes
    `_tuning_objective_metric` from the static hyperparameters it reads back)."""
    from sagemaker.tuner import HyperparameterTuner
    t = HyperparameterTuner.attach(name, sagemaker_session=sess)
    return {"objective_metric_name": t.objective_metric_name, "objective_type": t.objective_type,
            "strategy": t.strategy, "max_jobs": t.max_jobs, "max_parallel_jobs": t.max_parallel_jobs,
            "ranges": sorted(t._hyperparameter_ranges), "estimator_class": type(t.estimator).__name__,
            "static": t.estimator.hyperparameters()}


def _best_estimator(tuner):
    est = tuner.best_estimator()
    return {"job": est.latest_training_job.name, "model_data": est.model_data}


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
