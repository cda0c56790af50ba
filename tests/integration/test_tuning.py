"""Hyperparameter tuning jobs (issue 17; control-plane-api.md §8.7, training-contract.md §18) against
a real server: the SageMaker SDK's HyperparameterTuner unmodified, boto3 and the AWS CLI.

One server for the module (ml.m5.large declared 1 vCPU, so two trials run at once on a 2-core
host). Every trial runs data/tuning/src/objective.py: Branin (or a loss curve picked by a
categorical `optimizer`) printed once per short "epoch" as `objective=<value>`, which the
MetricDefinitions turn into the objective. The boto3 jobs run it as a `local:` image, the SDK as a
PyTorch script-mode entry point.

  * SDK (data/tuning/sdk_tuning.py, its own process): Bayesian search over Branin's (x1, x2) with
    fit(); best_training_job() is the trial with the lowest final objective, which equals
    Branin at the trial's tuned values; analytics().dataframe() has a row per trial;
    HyperparameterTuner.attach and best_estimator(); warm starts IdenticalDataAndAlgorithm
    (identical_dataset_and_algorithm_tuner(), which drops metric_definitions: refused until they
    are set again) and TransferLearning (WarmStartConfig, two parents); OverallBestTrainingJob =
    the best over the parents' and its own trials.
  * Grid: the trials' TunedHyperParameters are exactly the Cartesian product, in order; trials are
    training jobs named <tuning>-NNN-xxxxxxxx with TuningJobArn, in ListTrainingJobs; the CLI.
  * TrainingJobEarlyStoppingType Auto: the trial whose `optimizer` diverges is Stopped early by
    the median rule, the others complete.
  * Hyperband: poor trials are Stopped after fewer epochs than MaxResource.
  * TuningJobCompletionCriteria.TargetObjectiveMetricValue ends the job after the first trial.
  * StopHyperParameterTuningJob stops every running trial; DeleteHyperParameterTuningJob.
  * kill -9 of a server (one of its own) mid-job: the restarted server finishes the job.
  * Bad input: exact __type and what the message names.

The boto3 jobs are created up front (the stop test's first, so that its trials get the slots at
once) and the SDK scenario starts with them, so jobs overlap and the file takes about the time of
its longest chain.
"""

import itertools
import json
import math
import os
import re
import time
import uuid

import pytest
from botocore.exceptions import ClientError

import kiln_harness as kh
import sdk_helpers
import training_helpers as th
from training_helpers import sm, s3, logs  # noqa: F401 (module-scoped client fixtures)

KILN_CONFIG = {
    "scheduler": {"policy": "shrink", "allow_cpu_fallback": True},
    "instance_types": [{"type": "ml.m5.large", "vcpus": 1}],
    "training": {"stop_grace_seconds": 3},
}

HERE = os.path.dirname(os.path.abspath(__file__))
DATA = os.path.join(HERE, "data", "tuning")
OBJECTIVE = os.path.join(DATA, "src", "objective.py")
IMAGE = "local:" + OBJECTIVE
SDK_SCENARIOS = os.path.join(DATA, "sdk_tuning.py")
ROLE = th.ROLE_ARN
METRIC = "objective"
METRIC_DEFINITIONS = [{"Name": METRIC, "Regex": "objective=([0-9.]+)"}]
EPOCH_LINE = re.compile(r"^epoch=(\d+) objective=([0-9.]+)$")
TERMINAL = ("Completed", "Failed", "Stopped")
PYTORCH_IMAGE = "763104351884.dkr.ecr.us-east-1.amazonaws.com/pytorch-training:2.1-cpu-py310"

GRID = [("optimizer", ["sgd", "adam"]), ("layers", ["1", "2", "3"])]
MEDIAN_VALUES = ["sgd", "momentum", "adam", "nesterov", "broken"]
MEDIAN_EPOCHS = 12
HYPERBAND_MAX = 9
SDK_TRIALS = 6


def branin(x1, x2):
    a, b, c = 1.0, 5.1 / (4 * math.pi ** 2), 5 / math.pi
    r, s, t = 6.0, 10.0, 1 / (8 * math.pi)
    return a * (x2 - b * x1 ** 2 + c * x1 - r) ** 2 + s * (1 - t) * math.cos(x1) + s


def unique(prefix):
    name = "%s-%s" % (prefix, uuid.uuid4().hex[:8])
    assert len(name) <= 32
    return name


def selected_tests(request):
    return {item.name for item in request.session.items if item.module is request.module}


# ---------------------------------------------------------------------------------------------
# Requests and polling


def definition(bucket, static, max_runtime=300):
    """A TrainingJobDefinition running objective.py as a `local:` image."""
    return {
        "AlgorithmSpecification": {"TrainingImage": IMAGE, "TrainingInputMode": "File",
                                   "MetricDefinitions": [dict(m) for m in METRIC_DEFINITIONS]},
        "RoleArn": ROLE,
        "OutputDataConfig": {"S3OutputPath": "s3://%s/tuning/output" % bucket},
        "ResourceConfig": {"InstanceType": "ml.m5.large", "InstanceCount": 1, "VolumeSizeInGB": 1},
        "StoppingCondition": {"MaxRuntimeInSeconds": max_runtime},
        "StaticHyperParameters": {k: str(v) for k, v in static.items()},
    }


def branin_ranges():
    return {"ContinuousParameterRanges": [{"Name": "x1", "MinValue": "-5", "MaxValue": "10"},
                                          {"Name": "x2", "MinValue": "0", "MaxValue": "15"}]}


def categorical(*pairs):
    return {"CategoricalParameterRanges": [{"Name": n, "Values": list(v)} for n, v in pairs]}


def tuning_request(name, bucket, strategy, ranges, static, max_parallel=2, max_jobs=None,
                   objective="Minimize", **config_extra):
    config = {"Strategy": strategy, "ResourceLimits": {"MaxParallelTrainingJobs": max_parallel},
              "ParameterRanges": ranges}
    if max_jobs is not None:
        config["ResourceLimits"]["MaxNumberOfTrainingJobs"] = max_jobs
    if objective:
        config["HyperParameterTuningJobObjective"] = {"Type": objective, "MetricName": METRIC}
    config.update(config_extra)
    return {"HyperParameterTuningJobName": name, "HyperParameterTuningJobConfig": config,
            "TrainingJobDefinition": definition(bucket, static),
            "Tags": [{"Key": "suite", "Value": "tuning"}]}


def describe(sm, name):
    return sm.describe_hyper_parameter_tuning_job(HyperParameterTuningJobName=name)


def wait_tuning(sm, name, statuses=TERMINAL, timeout=240, server=None):
    deadline = time.monotonic() + timeout
    while True:
        d = describe(sm, name)
        if d["HyperParameterTuningJobStatus"] in statuses:
            return d
        if time.monotonic() > deadline:
            raise AssertionError("tuning job %s still %s after %ss; counters %s; trials %s%s" % (
                name, d["HyperParameterTuningJobStatus"], timeout, d.get("TrainingJobStatusCounters"),
                [(t["TrainingJobName"], t["TrainingJobStatus"]) for t in trials(sm, name)],
                ("\nserver log tail:\n" + sdk_helpers.server_events(server)) if server else ""))
        time.sleep(0.25)


def trials(sm, name, **kwargs):
    """Every HyperParameterTrainingJobSummary of the job (all pages), in the order listed."""
    out, token = [], None
    while True:
        args = dict(HyperParameterTuningJobName=name, MaxResults=2, **kwargs)
        if token:
            args["NextToken"] = token
        page = sm.list_training_jobs_for_hyper_parameter_tuning_job(**args)
        out += page["TrainingJobSummaries"]
        token = page.get("NextToken")
        if not token:
            return out


def by_seq(summaries):
    return sorted(summaries, key=lambda t: t["TrainingJobName"])


def objective_of(t):
    return t.get("FinalHyperParameterTuningJobObjectiveMetric", {}).get("Value")


def epochs_reported(logs, job):
    return [int(m.group(1)) for m in (EPOCH_LINE.match(line.strip()) for line in th.job_log_lines(logs, job)) if m]


def trial_name_re(tuning):
    return re.compile(r"^%s-(\d{3})-[0-9a-f]{8}$" % re.escape(tuning))


def raw_call(server, operation, payload):
    """The JSON 1.1 answer as sent: (HTTP status, __type, message)."""
    status, _, body = kh.json_request(server, "SageMaker." + operation, payload)
    doc = json.loads(body) if body else {}
    return status, doc.get("__type"), doc.get("message") or doc.get("Message")


def trial_debug(sm, logs, name):
    """What each trial did, for assertion messages."""
    out = []
    for t in by_seq(trials(sm, name)):
        out.append((t["TrainingJobName"], t["TrainingJobStatus"], t.get("TunedHyperParameters"), objective_of(t),
                    len(epochs_reported(logs, t["TrainingJobName"])), t.get("FailureReason")))
    return out


# ---------------------------------------------------------------------------------------------
# Fixtures


@pytest.fixture(scope="module")
def bucket(module_kiln, s3):
    name = th.unique_name("tuning")
    s3.create_bucket(Bucket=name)
    return name


@pytest.fixture(scope="module")
def jobs(module_kiln, sm, bucket, request):
    """Creates the boto3 tuning jobs of the selected tests up front (the stop test's first);
    returns {key: request}. Anything still running at the end is stopped."""
    selected = selected_tests(request)
    made = {}
    plan = [
        ("stop", "test_stop_tuning_job_stops_every_running_trial",
         lambda n: tuning_request(n, bucket, "Random", branin_ranges(),
                                  {"epochs": 300, "epoch_seconds": 0.1}, max_parallel=2, max_jobs=4)),
        ("grid", ("test_grid_enumerates_exactly_the_product", "test_trials_are_training_jobs",
                  "test_aws_cli_lists_tuning_jobs"),
         lambda n: tuning_request(n, bucket, "Grid", categorical(*GRID),
                                  {"function": "optimizer", "epochs": 3, "epoch_seconds": 0.1}, max_parallel=2)),
        ("median", "test_early_stopping_auto_stops_the_diverging_trial",
         lambda n: tuning_request(n, bucket, "Grid", categorical(("optimizer", MEDIAN_VALUES)),
                                  {"function": "optimizer", "epochs": MEDIAN_EPOCHS, "epoch_seconds": 0.25},
                                  max_parallel=2, TrainingJobEarlyStoppingType="Auto")),
        ("hyperband", "test_hyperband_stops_poor_trials_early",
         lambda n: tuning_request(n, bucket, "Hyperband", branin_ranges(),
                                  {"epochs": HYPERBAND_MAX, "epoch_seconds": 0.25}, max_parallel=2, max_jobs=8,
                                  RandomSeed=3,
                                  StrategyConfig={"HyperbandStrategyConfig": {
                                      "MinResource": 1, "MaxResource": HYPERBAND_MAX}})),
        ("target", "test_completion_criterion_target_ends_the_job",
         lambda n: tuning_request(n, bucket, "Random", branin_ranges(), {"epochs": 2, "epoch_seconds": 0.1},
                                  max_parallel=1, max_jobs=10,
                                  TuningJobCompletionCriteria={"TargetObjectiveMetricValue": 400.0})),
    ]
    for key, tests, build in plan:
        tests = (tests,) if isinstance(tests, str) else tests
        if not selected.intersection(tests):
            continue
        req = build(unique(key))
        if "RandomSeed" in req["HyperParameterTuningJobConfig"]:
            # Newer than Debian's botocore model (it refuses the member client-side): sent raw.
            status, _, body = kh.json_request(module_kiln, "SageMaker.CreateHyperParameterTuningJob", req)
            assert status == 200, body
            arn = json.loads(body)["HyperParameterTuningJobArn"]
        else:
            arn = sm.create_hyper_parameter_tuning_job(**req)["HyperParameterTuningJobArn"]
        made[key] = dict(req, arn=arn)
    yield made
    for req in made.values():
        try:
            sm.stop_hyper_parameter_tuning_job(HyperParameterTuningJobName=req["HyperParameterTuningJobName"])
        except ClientError:
            pass  # ended already


@pytest.fixture(scope="module")
def sdk_lib():
    lib = sdk_helpers.sdk_lib_dir()
    if lib is None:
        pytest.skip("SageMaker Python SDK bundle not found (../shared/clients/sagemaker-python-sdk/lib "
                    "beside the repository, or $KILN_SAGEMAKER_SDK_LIB)")
    return lib


class TuningScenarios(sdk_helpers.ScenarioRunner):
    """sdk_helpers.ScenarioRunner for data/tuning/sdk_tuning.py instead of sdk/scenarios.py."""

    script = SDK_SCENARIOS


SDK_TESTS = ("test_sdk_bayesian_fit_best_and_analytics", "test_sdk_attach_and_best_estimator",
             "test_sdk_warm_start_identical_data_and_algorithm", "test_sdk_warm_start_transfer_learning")


@pytest.fixture(scope="module")
def sdk(module_kiln, bucket, jobs, tmp_path_factory, request):
    """Starts the SDK scenario (after the boto3 jobs were created) when an SDK test is selected;
    yields (runner, args)."""
    if not set(SDK_TESTS) & selected_tests(request):
        yield None
        return
    lib = sdk_helpers.sdk_lib_dir()
    if lib is None:
        yield None
        return
    runner = TuningScenarios(module_kiln, str(tmp_path_factory.mktemp("sdk-tuning")), lib)
    args = {"bucket": bucket, "bayes": unique("sdk-bayes"), "identical": unique("sdk-ident"),
            "transfer": unique("sdk-tl"), "epochs": 4, "epoch_seconds": 0.1, "max_jobs": SDK_TRIALS}
    runner.start("bayesian_warm_start", args, timeout=420)
    try:
        yield runner, args
    finally:
        runner.stop_all()
        for name, sc in sorted(runner.scenarios.items()):
            seconds = sc.seconds()
            print("sdk tuning scenario %s rc=%s %s" % (name, sc.proc.returncode,
                                                       "%.1f s" % seconds if seconds else "(no result)"))


@pytest.fixture(scope="module", autouse=True)
def _everything_started(jobs, sdk):
    """The boto3 jobs and the SDK scenario start before the first test, whichever it is."""
    return jobs, sdk


@pytest.fixture(scope="module")
def sdk_result(sdk, sdk_lib, module_kiln):
    if sdk is None:
        pytest.skip("SDK scenario not started")
    runner, args = sdk
    return runner.result("bayesian_warm_start"), args


# ---------------------------------------------------------------------------------------------
# StopHyperParameterTuningJob (first: its long trials hold both slots until it stops them)


def test_stop_tuning_job_stops_every_running_trial(module_kiln, sm, logs, jobs):
    req = jobs["stop"]
    name = req["HyperParameterTuningJobName"]

    def both_training():
        ts = trials(sm, name)
        if len(ts) < 2:
            return False
        ds = [sm.describe_training_job(TrainingJobName=t["TrainingJobName"]) for t in ts]
        return all(d["TrainingJobStatus"] == "InProgress" and d.get("SecondaryStatus") == "Training" for d in ds)

    th.wait_until(both_training, timeout=120, what="two trials of %s training" % name)
    # Stop is refused by Delete while InProgress (terminal jobs only).
    status, code, message = raw_call(module_kiln, "DeleteHyperParameterTuningJob",
                                     {"HyperParameterTuningJobName": name})
    assert (status, code) == (400, "ValidationException"), (status, code, message)

    sm.stop_hyper_parameter_tuning_job(HyperParameterTuningJobName=name)
    assert describe(sm, name)["HyperParameterTuningJobStatus"] in ("Stopping", "Stopped")
    d = wait_tuning(sm, name, timeout=60, server=module_kiln)
    assert d["HyperParameterTuningJobStatus"] == "Stopped", d
    ts = trials(sm, name)
    assert len(ts) == 2, [t["TrainingJobName"] for t in ts]  # nothing launched after the stop
    for t in ts:
        assert t["TrainingJobStatus"] == "Stopped", t
        job = sm.describe_training_job(TrainingJobName=t["TrainingJobName"])
        assert job["TrainingJobStatus"] == "Stopped", job.get("FailureReason")
        assert len(epochs_reported(logs, t["TrainingJobName"])) < 300
    counters = d["TrainingJobStatusCounters"]
    assert counters["Stopped"] == 2 and counters["InProgress"] == 0 and counters["Completed"] == 0, counters
    assert "HyperParameterTuningEndTime" in d

    # A stopped job cannot be stopped again; it can be deleted, its trials stay.
    status, code, message = raw_call(module_kiln, "StopHyperParameterTuningJob",
                                     {"HyperParameterTuningJobName": name})
    assert (status, code) == (400, "ValidationException"), (status, code, message)
    # (DeleteHyperParameterTuningJob is newer than Debian's botocore: sent raw.)
    status, code, message = raw_call(module_kiln, "DeleteHyperParameterTuningJob",
                                     {"HyperParameterTuningJobName": name})
    assert status == 200, (status, code, message)

    def gone():
        try:
            describe(sm, name)
        except ClientError as e:
            return e.response["Error"]["Code"] == "ResourceNotFound"
        return False

    th.wait_until(gone, timeout=30, what="tuning job %s deleted" % name)
    for t in ts:
        assert sm.describe_training_job(TrainingJobName=t["TrainingJobName"])["TrainingJobStatus"] == "Stopped"


# ---------------------------------------------------------------------------------------------
# Grid, and the trials as training jobs


@pytest.fixture(scope="module")
def grid_done(module_kiln, sm, jobs):
    req = jobs["grid"]
    d = wait_tuning(sm, req["HyperParameterTuningJobName"], server=module_kiln)
    return req, d


def test_grid_enumerates_exactly_the_product(sm, logs, grid_done):
    req, d = grid_done
    name = req["HyperParameterTuningJobName"]
    assert d["HyperParameterTuningJobStatus"] == "Completed", (d.get("FailureReason"), trial_debug(sm, logs, name))
    product = [dict(zip([n for n, _ in GRID], values)) for values in itertools.product(*[v for _, v in GRID])]
    ts = by_seq(trials(sm, name))
    # Exactly the product, each point once, in order (first range slowest), every one completed.
    assert [t["TunedHyperParameters"] for t in ts] == product, trial_debug(sm, logs, name)
    assert all(t["TrainingJobStatus"] == "Completed" for t in ts), trial_debug(sm, logs, name)
    config = d["HyperParameterTuningJobConfig"]
    assert config["Strategy"] == "Grid"
    assert config["ResourceLimits"]["MaxNumberOfTrainingJobs"] == len(product)  # Grid fills it
    assert config["TrainingJobEarlyStoppingType"] == "Off"
    assert d["TrainingJobStatusCounters"] == {"Completed": 6, "InProgress": 0, "RetryableError": 0,
                                              "NonRetryableError": 0, "Stopped": 0}
    assert d["ObjectiveStatusCounters"] == {"Succeeded": 6, "Pending": 0, "Failed": 0}
    # The objective: base(optimizer) + 0.01 * layers + 1/epochs, the last value printed.
    for t in ts:
        hp = t["TunedHyperParameters"]
        expected = {"sgd": 0.30, "adam": 0.20}[hp["optimizer"]] + 0.01 * int(hp["layers"]) + 1.0 / 3
        assert objective_of(t) == pytest.approx(expected, abs=1e-5), t
        assert t["FinalHyperParameterTuningJobObjectiveMetric"]["MetricName"] == METRIC
        assert t["ObjectiveStatus"] == "Succeeded"
    best = d["BestTrainingJob"]
    assert best["TunedHyperParameters"] == {"optimizer": "adam", "layers": "1"}, best
    assert objective_of(best) == pytest.approx(0.21 + 1.0 / 3, abs=1e-5)
    assert "OverallBestTrainingJob" not in d  # only with a warm start
    # FinalObjectiveMetricValue sorting, best (lowest) first when ascending.
    values = [objective_of(t) for t in trials(sm, name, SortBy="FinalObjectiveMetricValue", SortOrder="Ascending")]
    assert values == sorted(values) and values[0] == pytest.approx(objective_of(best))


def test_trials_are_training_jobs(module_kiln, sm, grid_done):
    req, d = grid_done
    name = req["HyperParameterTuningJobName"]
    arn = d["HyperParameterTuningJobArn"]
    assert arn == req["arn"]
    assert arn == "arn:aws:sagemaker:us-east-1:%s:hyper-parameter-tuning-job/%s" % (
        module_kiln.account_id or "000000000000", name)
    ts = by_seq(trials(sm, name))
    pattern = trial_name_re(name)
    assert [int(pattern.match(t["TrainingJobName"]).group(1)) for t in ts] == list(range(1, len(ts) + 1)), \
        [t["TrainingJobName"] for t in ts]
    listed = sm.list_training_jobs(NameContains=name, MaxResults=100)["TrainingJobSummaries"]
    assert sorted(j["TrainingJobName"] for j in listed) == [t["TrainingJobName"] for t in ts]
    for t in ts:
        job = sm.describe_training_job(TrainingJobName=t["TrainingJobName"])
        assert t["TrainingJobArn"] == job["TrainingJobArn"]
        assert job["TuningJobArn"] == arn
        hps = job["HyperParameters"]
        assert hps["_tuning_objective_metric"] == METRIC
        assert {k: hps[k] for k in t["TunedHyperParameters"]} == t["TunedHyperParameters"]
        assert hps["function"] == "optimizer" and hps["epochs"] == "3"
        assert job["AlgorithmSpecification"]["TrainingImage"] == IMAGE
        final = {m["MetricName"]: m["Value"] for m in job["FinalMetricDataList"]}
        assert final[METRIC] == pytest.approx(objective_of(t), abs=1e-6)
        tags = sm.list_tags(ResourceArn=job["TrainingJobArn"])["Tags"]
        assert {"Key": "suite", "Value": "tuning"} in tags, tags
    # ListHyperParameterTuningJobs: a summary with the counters.
    summaries = sm.list_hyper_parameter_tuning_jobs(NameContains=name)["HyperParameterTuningJobSummaries"]
    assert [s["HyperParameterTuningJobName"] for s in summaries] == [name]
    s = summaries[0]
    assert s["HyperParameterTuningJobStatus"] == "Completed" and s["Strategy"] == "Grid"
    assert s["TrainingJobStatusCounters"]["Completed"] == 6
    assert s["ObjectiveStatusCounters"]["Succeeded"] == 6
    # Name already taken (any case): ResourceInUse.
    status, code, message = raw_call(module_kiln, "CreateHyperParameterTuningJob",
                                     dict({k: v for k, v in req.items() if k != "arn"},
                                          HyperParameterTuningJobName=name.upper()))
    assert (status, code) == (400, "ResourceInUse"), (status, code, message)


def test_aws_cli_lists_tuning_jobs(module_kiln, grid_done, tmp_path):
    req, _ = grid_done
    name = req["HyperParameterTuningJobName"]
    aws = th.aws_runner(module_kiln, str(tmp_path / "awshome"))
    if aws is None:
        pytest.skip("no AWS CLI found (/usr/bin/aws or aws on PATH)")
    out = json.loads(aws("sagemaker", "list-hyper-parameter-tuning-jobs", "--name-contains", name,
                         "--output", "json").stdout)
    summaries = out["HyperParameterTuningJobSummaries"]
    assert [s["HyperParameterTuningJobName"] for s in summaries] == [name], summaries
    assert summaries[0]["HyperParameterTuningJobStatus"] == "Completed"
    assert summaries[0]["ResourceLimits"]["MaxNumberOfTrainingJobs"] == 6


# ---------------------------------------------------------------------------------------------
# Early stopping (median rule) and Hyperband


def test_early_stopping_auto_stops_the_diverging_trial(module_kiln, sm, logs, jobs):
    req = jobs["median"]
    name = req["HyperParameterTuningJobName"]
    d = wait_tuning(sm, name, server=module_kiln)
    debug = trial_debug(sm, logs, name)
    assert d["HyperParameterTuningJobStatus"] == "Completed", (d.get("FailureReason"), debug)
    assert d["HyperParameterTuningJobConfig"]["TrainingJobEarlyStoppingType"] == "Auto"
    ts = {t["TunedHyperParameters"]["optimizer"]: t for t in trials(sm, name)}
    assert sorted(ts) == sorted(MEDIAN_VALUES), debug
    broken = ts.pop("broken")
    assert broken["TrainingJobStatus"] == "Stopped", debug
    reported = epochs_reported(logs, broken["TrainingJobName"])
    assert 2 <= len(reported) < MEDIAN_EPOCHS, debug  # judged once it had reported enough, then stopped
    assert objective_of(broken) == pytest.approx(5 + 0.1 * reported[-1], abs=1e-5), debug
    for opt, t in ts.items():
        assert t["TrainingJobStatus"] == "Completed", debug
        assert len(epochs_reported(logs, t["TrainingJobName"])) == MEDIAN_EPOCHS, debug
    assert d["TrainingJobStatusCounters"]["Completed"] == 4 and d["TrainingJobStatusCounters"]["Stopped"] == 1, d
    # A trial stopped with an objective counts as Succeeded (it reported the metric).
    assert d["ObjectiveStatusCounters"]["Succeeded"] == 5, d
    stopped = trials(sm, name, StatusEquals="Stopped")
    assert [t["TrainingJobName"] for t in stopped] == [broken["TrainingJobName"]]
    assert d["BestTrainingJob"]["TunedHyperParameters"] == {"optimizer": "adam"}


def test_hyperband_stops_poor_trials_early(module_kiln, sm, logs, jobs):
    req = jobs["hyperband"]
    name = req["HyperParameterTuningJobName"]
    d = wait_tuning(sm, name, server=module_kiln)
    debug = trial_debug(sm, logs, name)
    assert d["HyperParameterTuningJobStatus"] == "Completed", (d.get("FailureReason"), debug)
    config = d["HyperParameterTuningJobConfig"]
    assert config["Strategy"] == "Hyperband"
    assert config["StrategyConfig"]["HyperbandStrategyConfig"] == {"MinResource": 1, "MaxResource": HYPERBAND_MAX}
    ts = trials(sm, name)
    assert len(ts) == 8, debug
    reported = {t["TrainingJobName"]: epochs_reported(logs, t["TrainingJobName"]) for t in ts}
    epochs = {n: len(r) for n, r in reported.items()}
    early = [t for t in ts if t["TrainingJobStatus"] == "Stopped" and epochs[t["TrainingJobName"]] < HYPERBAND_MAX]
    full = [t for t in ts if epochs[t["TrainingJobName"]] == HYPERBAND_MAX]
    assert early, debug  # poor trials stopped before MaxResource epochs
    assert full, debug  # and the promising ones trained to MaxResource
    for t in ts:
        assert t["TrainingJobStatus"] in ("Completed", "Stopped"), debug
        if t["TrainingJobStatus"] == "Completed":
            assert len(reported[t["TrainingJobName"]]) == HYPERBAND_MAX, debug
        # Every trial reported its objective (the last printed value), stopped ones included.
        assert t["ObjectiveStatus"] == "Succeeded", debug
        values = reported[t["TrainingJobName"]]
        assert values and values == list(range(1, len(values) + 1)), debug
    # Each objective is the last value the trial reported: Branin's curve at its last epoch,
    # f + (f + 1) * (9 - e) / 9, which is f itself for a trial that trained to MaxResource.
    for t in ts:
        hp = t["TunedHyperParameters"]
        f = branin(float(hp["x1"]), float(hp["x2"]))
        e = reported[t["TrainingJobName"]][-1]
        assert objective_of(t) == pytest.approx(f + (f + 1) * (HYPERBAND_MAX - e) / HYPERBAND_MAX, abs=1e-4), \
            (t, debug)
    best = d["BestTrainingJob"]
    assert best["TrainingJobName"] == min(ts, key=objective_of)["TrainingJobName"], (best, debug)


def test_completion_criterion_target_ends_the_job(module_kiln, sm, logs, jobs):
    """Branin stays below 400 on its domain, so the first trial reaches the target and no second
    one is launched (one at a time)."""
    req = jobs["target"]
    name = req["HyperParameterTuningJobName"]
    d = wait_tuning(sm, name, server=module_kiln)
    debug = trial_debug(sm, logs, name)
    assert d["HyperParameterTuningJobStatus"] == "Completed", (d.get("FailureReason"), debug)
    ts = trials(sm, name)
    assert len(ts) == 1 and ts[0]["TrainingJobStatus"] == "Completed", debug
    assert d["HyperParameterTuningJobConfig"]["TuningJobCompletionCriteria"] == {"TargetObjectiveMetricValue": 400.0}
    # Members newer than Debian's botocore, read from the raw answer.
    status, _, body = kh.json_request(module_kiln, "SageMaker.DescribeHyperParameterTuningJob",
                                      {"HyperParameterTuningJobName": name})
    doc = json.loads(body)
    assert status == 200, doc
    assert isinstance(doc.get("TuningJobCompletionDetails"), dict), doc
    assert doc["ConsumedResources"]["RuntimeInSeconds"] >= 0, doc


# ---------------------------------------------------------------------------------------------
# Restart


def test_kill_and_restart_resumes_the_tuning_job(kiln_factory, tmp_path):
    """kill -9 of a server while a tuning job's first two trials run: the restarted server adopts
    them and launches the rest; every sequence number once, all four trials completed."""
    srv = kiln_factory("restart", config=KILN_CONFIG)
    sm_ = srv.client("sagemaker")
    srv.client("s3").create_bucket(Bucket="tuning-restart")
    name = unique("restart")
    sm_.create_hyper_parameter_tuning_job(**tuning_request(
        name, "tuning-restart", "Random", branin_ranges(), {"epochs": 8, "epoch_seconds": 0.25},
        max_parallel=2, max_jobs=4))

    def two_training():
        ts = trials(sm_, name)
        return len(ts) == 2 and all(
            sm_.describe_training_job(TrainingJobName=t["TrainingJobName"]).get("SecondaryStatus") == "Training"
            for t in ts)

    th.wait_until(two_training, timeout=60, what="two trials of %s training" % name)
    srv.kill()
    srv.start()
    d = wait_tuning(sm_, name, timeout=120, server=srv)
    ts = by_seq(trials(sm_, name))
    assert d["HyperParameterTuningJobStatus"] == "Completed", (d.get("FailureReason"), ts)
    pattern = trial_name_re(name)
    assert [int(pattern.match(t["TrainingJobName"]).group(1)) for t in ts] == [1, 2, 3, 4], ts
    assert all(t["TrainingJobStatus"] == "Completed" for t in ts), ts
    assert d["TrainingJobStatusCounters"]["Completed"] == 4
    assert len(sm_.list_training_jobs(NameContains=name)["TrainingJobSummaries"]) == 4


# ---------------------------------------------------------------------------------------------
# Bad input


def _base(bucket, name, **config_extra):
    return tuning_request(name, bucket, "Random", branin_ranges(), {"epochs": 1}, max_jobs=2, **config_extra)


def _with(req, path, value):
    """A copy of `req` with the member at `path` (keys) set."""
    req = json.loads(json.dumps(req))
    node = req
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = value
    return req


BAD = {
    "continuous bound not a number": (
        lambda r: _with(r, ["HyperParameterTuningJobConfig", "ParameterRanges"],
                        {"ContinuousParameterRanges": [{"Name": "x1", "MinValue": "low", "MaxValue": "10"}]}),
        "ValidationException", ["ContinuousParameterRanges[0].MinValue", "low"]),
    "integer bound not an integer": (
        lambda r: _with(r, ["HyperParameterTuningJobConfig", "ParameterRanges"],
                        {"IntegerParameterRanges": [{"Name": "num_layers", "MinValue": "1.5", "MaxValue": "4"}]}),
        "ValidationException", ["IntegerParameterRanges[0].MinValue", "1.5", "integer"]),
    "min above max": (
        lambda r: _with(r, ["HyperParameterTuningJobConfig", "ParameterRanges"],
                        {"ContinuousParameterRanges": [{"Name": "x1", "MinValue": "10", "MaxValue": "-5"}]}),
        "ValidationException", ["x1", "MinValue", "MaxValue"]),
    "logarithmic from zero": (
        lambda r: _with(r, ["HyperParameterTuningJobConfig", "ParameterRanges"],
                        {"ContinuousParameterRanges": [{"Name": "learning_rate", "MinValue": "0", "MaxValue": "1",
                                                        "ScalingType": "Logarithmic"}]}),
        "ValidationException", ["learning_rate", "Logarithmic"]),
    "objective metric not defined": (
        lambda r: _with(r, ["HyperParameterTuningJobConfig", "HyperParameterTuningJobObjective"],
                        {"Type": "Minimize", "MetricName": "validation:rmse"}),
        "ValidationException", ["validation:rmse", METRIC]),
    "grid over a continuous range": (
        lambda r: _with(r, ["HyperParameterTuningJobConfig", "Strategy"], "Grid"),
        "ValidationException", ["Grid", "ategorical"]),
    "hyperband with early stopping": (
        lambda r: _with(_with(_with(r, ["HyperParameterTuningJobConfig", "Strategy"], "Hyperband"),
                              ["HyperParameterTuningJobConfig", "TrainingJobEarlyStoppingType"], "Auto"),
                        ["HyperParameterTuningJobConfig", "StrategyConfig"],
                        {"HyperbandStrategyConfig": {"MinResource": 1, "MaxResource": 9}}),
        "ValidationException", ["TrainingJobEarlyStoppingType"]),
    "max parallel above the limit": (
        lambda r: _with(r, ["HyperParameterTuningJobConfig", "ResourceLimits", "MaxParallelTrainingJobs"], 101),
        "ResourceLimitExceeded", ["MaxParallelTrainingJobs", "101", "100"]),
    "max jobs above the limit": (
        lambda r: _with(r, ["HyperParameterTuningJobConfig", "ResourceLimits", "MaxNumberOfTrainingJobs"], 501),
        "ResourceLimitExceeded", ["MaxNumberOfTrainingJobs", "501", "500"]),
    "missing warm-start parent": (
        lambda r: dict(r, WarmStartConfig={"ParentHyperParameterTuningJobs": [
            {"HyperParameterTuningJobName": "no-such-parent-job"}], "WarmStartType": "TransferLearning"}),
        "ValidationException", ["no-such-parent-job", "not found"]),
    "both definition forms": (
        lambda r: dict(r, TrainingJobDefinitions=[dict(r["TrainingJobDefinition"], DefinitionName="d1")]),
        "ValidationException", ["TrainingJobDefinition"]),
}


@pytest.mark.parametrize("case", sorted(BAD), ids=lambda case: case.replace(" ", "-"))
def test_bad_input_is_refused_with_the_exact_error(module_kiln, sm, bucket, case):
    build, expected_type, words = BAD[case]
    name = unique("bad")
    status, code, message = raw_call(module_kiln, "CreateHyperParameterTuningJob", build(_base(bucket, name)))
    assert (status, code) == (400, expected_type), (status, code, message)
    for w in words:
        assert w in message, (w, message)
    # Nothing was created.
    status, code, _ = raw_call(module_kiln, "DescribeHyperParameterTuningJob", {"HyperParameterTuningJobName": name})
    assert (status, code) == (400, "ResourceNotFound")
    assert sm.list_training_jobs(NameContains=name)["TrainingJobSummaries"] == []


def test_unknown_tuning_job_is_resource_not_found(module_kiln):
    for op in ("DescribeHyperParameterTuningJob", "StopHyperParameterTuningJob", "DeleteHyperParameterTuningJob",
               "ListTrainingJobsForHyperParameterTuningJob"):
        status, code, message = raw_call(module_kiln, op, {"HyperParameterTuningJobName": "no-such-tuning-job"})
        assert (status, code) == (400, "ResourceNotFound"), (op, status, code, message)
        assert "no-such-tuning-job" in message, (op, message)


# ---------------------------------------------------------------------------------------------
# The SageMaker SDK (its own process; started by the `sdk` fixture with the boto3 jobs)


def _sdk_trials(sm, name):
    return by_seq(trials(sm, name))


def test_sdk_bayesian_fit_best_and_analytics(sm, logs, sdk_result):
    r, args = sdk_result
    name = args["bayes"]
    d = r["describe"]
    debug = trial_debug(sm, logs, name)
    assert d["HyperParameterTuningJobStatus"] == "Completed", (d.get("FailureReason"), debug)
    config = d["HyperParameterTuningJobConfig"]
    assert config["Strategy"] == "Bayesian"
    assert config["HyperParameterTuningJobObjective"] == {"Type": "Minimize", "MetricName": "branin"}
    assert config["ResourceLimits"]["MaxNumberOfTrainingJobs"] == SDK_TRIALS
    assert config["ResourceLimits"]["MaxParallelTrainingJobs"] == 2
    definition_ = d["TrainingJobDefinition"]
    assert definition_["AlgorithmSpecification"]["TrainingImage"] == PYTORCH_IMAGE
    assert definition_["StaticHyperParameters"]["sagemaker_program"] == '"objective.py"'

    ts = _sdk_trials(sm, name)
    assert len(ts) == SDK_TRIALS, debug
    assert all(t["TrainingJobStatus"] == "Completed" for t in ts), debug
    points = set()
    for t in ts:
        hp = t["TunedHyperParameters"]
        x1, x2 = float(hp["x1"]), float(hp["x2"])
        assert -5 <= x1 <= 10 and 0 <= x2 <= 15, hp
        points.add((x1, x2))
        # The objective is Branin at the tuned values: the value reached the script and the metric
        # came back through the MetricDefinition.
        assert objective_of(t) == pytest.approx(branin(x1, x2), abs=1e-4), (t, debug)
    assert len(points) == SDK_TRIALS  # no configuration proposed twice

    # best_training_job(): the lowest final objective.
    best = min(ts, key=objective_of)
    assert r["best_training_job"] == best["TrainingJobName"] == d["BestTrainingJob"]["TrainingJobName"]

    # analytics().dataframe(): a row per trial with the tuned values and the final objective.
    frame = r["analytics"]
    assert {"x1", "x2", "TrainingJobName", "TrainingJobStatus", "FinalObjectiveValue",
            "TrainingStartTime", "TrainingEndTime", "TrainingElapsedTimeSeconds"} <= set(frame["columns"]), frame
    rows = {row["TrainingJobName"]: row for row in frame["rows"]}
    assert sorted(rows) == [t["TrainingJobName"] for t in ts]
    for t in ts:
        row = rows[t["TrainingJobName"]]
        assert row["FinalObjectiveValue"] == pytest.approx(objective_of(t))
        assert row["x1"] == pytest.approx(float(t["TunedHyperParameters"]["x1"]))
        assert row["TrainingJobStatus"] == "Completed"
        assert row["TrainingElapsedTimeSeconds"] >= 0

    # The trials are script-mode training jobs of the tuning job.
    for t in ts:
        job = sm.describe_training_job(TrainingJobName=t["TrainingJobName"])
        assert job["TuningJobArn"] == d["HyperParameterTuningJobArn"]
        assert job["HyperParameters"]["_tuning_objective_metric"] == "branin"
        assert trial_name_re(name).match(t["TrainingJobName"])


def test_sdk_attach_and_best_estimator(sdk_result):
    r, args = sdk_result
    assert "attached_error" not in r, r["attached_error"]
    a = r["attached"]
    assert a["objective_metric_name"] == "branin" and a["objective_type"] == "Minimize"
    assert a["strategy"] == "Bayesian" and a["max_jobs"] == SDK_TRIALS and a["max_parallel_jobs"] == 2
    assert a["ranges"] == ["x1", "x2"] and a["estimator_class"] == "PyTorch"
    assert "_tuning_objective_metric" not in a["static"]
    assert "best_estimator_error" not in r, r["best_estimator_error"]
    assert r["best_estimator"]["job"] == r["best_training_job"]
    assert r["best_estimator"]["model_data"].endswith("/output/model.tar.gz")


def _parent_names(d):
    return sorted(p["HyperParameterTuningJobName"] for p in d["WarmStartConfig"]["ParentHyperParameterTuningJobs"])


def test_sdk_warm_start_identical_data_and_algorithm(sm, logs, sdk_result):
    r, args = sdk_result
    d = r["identical_describe"]
    name = args["identical"]
    debug = trial_debug(sm, logs, name)
    assert d["HyperParameterTuningJobStatus"] == "Completed", (d.get("FailureReason"), debug)
    assert d["WarmStartConfig"]["WarmStartType"] == "IdenticalDataAndAlgorithm"
    # identical_dataset_and_algorithm_tuner() drops the tuner's metric_definitions: without them
    # the objective is no metric the trials report, refused as a ValidationException.
    code, message = r["no_metric_definitions_error"]
    assert code == "ValidationException" and "branin" in message and "MetricDefinitions" in message, message
    assert _parent_names(d) == [args["bayes"]]
    own = _sdk_trials(sm, name)
    parent = _sdk_trials(sm, args["bayes"])
    assert len(own) == 2 and all(t["TrainingJobStatus"] == "Completed" for t in own), debug
    assert sum(d["TrainingJobStatusCounters"].values()) == 2  # counters: its own trials only
    # BestTrainingJob is its own best; OverallBestTrainingJob the best over the parent's too.
    assert d["BestTrainingJob"]["TrainingJobName"] == min(own, key=objective_of)["TrainingJobName"]
    overall = min(own + parent, key=objective_of)
    assert d["OverallBestTrainingJob"]["TrainingJobName"] == overall["TrainingJobName"], (d["OverallBestTrainingJob"],
                                                                                           overall)
    assert objective_of(d["OverallBestTrainingJob"]) == pytest.approx(objective_of(overall))
    assert objective_of(d["OverallBestTrainingJob"]) <= objective_of(d["BestTrainingJob"])
    # No configuration of the parent proposed again.
    seen = {(t["TunedHyperParameters"]["x1"], t["TunedHyperParameters"]["x2"]) for t in parent}
    assert not seen & {(t["TunedHyperParameters"]["x1"], t["TunedHyperParameters"]["x2"]) for t in own}
    assert len(r["identical_analytics"]["rows"]) == 2


def test_sdk_warm_start_transfer_learning(sm, logs, sdk_result):
    r, args = sdk_result
    d = r["transfer_describe"]
    name = args["transfer"]
    debug = trial_debug(sm, logs, name)
    assert d["HyperParameterTuningJobStatus"] == "Completed", (d.get("FailureReason"), debug)
    assert d["WarmStartConfig"]["WarmStartType"] == "TransferLearning"
    assert _parent_names(d) == sorted([args["bayes"], args["identical"]])
    assert d["TrainingJobDefinition"]["StaticHyperParameters"]["shift"] == "0.0"  # the new estimator's
    own = _sdk_trials(sm, name)
    assert len(own) == 2 and all(t["TrainingJobStatus"] == "Completed" for t in own), debug
    everything = own + _sdk_trials(sm, args["bayes"]) + _sdk_trials(sm, args["identical"])
    overall = min(everything, key=objective_of)
    assert d["OverallBestTrainingJob"]["TrainingJobName"] == overall["TrainingJobName"]
    assert r["transfer_best_training_job"] == min(own, key=objective_of)["TrainingJobName"]
