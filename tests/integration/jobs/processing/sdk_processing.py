"""The SageMaker Python SDK side of test_processing.py, run as its own process:

    /usr/bin/python3 sdk_processing.py NAME RESULT.json ARGS.json

with the SDK bundle's lib/ first on the path and AWS_ENDPOINT_URL + keys of the server under test
(sdk_helpers.ScenarioRunner.env; why a process of its own: sdk_helpers.py). The SDK is used
unmodified, as a notebook uses it (one scenario, `processors`, runs both):

  * `SKLearnProcessor` (the SDK resolves the scikit-learn image; Kiln's built-in
    environments run it with Debian's python3), two hosts, shard_continuous.py over a
    ShardedByS3Key input, a Continuous output; run(wait=True, logs=True) tails both hosts' logs.
  * `PyTorchProcessor` (a FrameworkProcessor: the SDK uploads source_dir as sourcedir.tar.gz and
    runs its own runproc.sh with /bin/bash, which unpacks it and calls `python process.py`).
  * `ScriptProcessor` with command ["python3"] and an image the module's
    `environments` entry maps, two hosts, arguments, an input uploaded by the SDK from a local
    directory, an output without a destination (the SDK fills its default one); layout_probe.py
    reports what the container sees.

What the scenario observed goes to RESULT.json; the checks live in test_processing.py.
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


def processors(sess, a):
    """Both processors in one process (the SDK's import costs seconds of a 2-core machine's CPU):
    the ScriptProcessor job is submitted first without waiting, then the SKLearnProcessor's runs
    with wait=True, logs=True, then the first is waited for."""
    from sagemaker.processing import ProcessingInput, ProcessingOutput, ScriptProcessor
    from sagemaker.pytorch.processing import PyTorchProcessor
    from sagemaker.sklearn.processing import SKLearnProcessor

    script = ScriptProcessor(role=ROLE, image_uri=a["image"], command=["python3"], instance_type="ml.m5.large",
                             instance_count=2, max_runtime_in_seconds=300, sagemaker_session=sess,
                             env={"PROBE_GREETING": "hello processing"})
    script.run(code=os.path.join(HERE, "layout_probe.py"),
               inputs=[ProcessingInput(source=a["data_dir"], destination="/opt/ml/processing/input/data",
                                       input_name="data")],
               outputs=[ProcessingOutput(source="/opt/ml/processing/output/layout", output_name="layout")],
               arguments=a["arguments"], job_name=a["script_job"], wait=False)

    framework = PyTorchProcessor(framework_version="2.1", py_version="py310", role=ROLE, instance_type="ml.m5.large",
                                 instance_count=1, max_runtime_in_seconds=300, sagemaker_session=sess)
    framework.run(code="process.py", source_dir=os.path.join(HERE, "framework_src"),
                  outputs=[ProcessingOutput(source="/opt/ml/processing/output/framework", output_name="framework")],
                  arguments=["--mode", "framework"], job_name=a["framework_job"], wait=False)

    sklearn = SKLearnProcessor(framework_version="1.2-1", role=ROLE, instance_type="ml.m5.large",
                               instance_count=2, max_runtime_in_seconds=300, sagemaker_session=sess,
                               env={"MARKER_BUCKET": a["bucket"], "MARKER_KEY": a["marker_key"]})
    sklearn.run(code=os.path.join(HERE, "shard_continuous.py"),
                inputs=[ProcessingInput(source=a["input_uri"], destination="/opt/ml/processing/input/data",
                                        input_name="shards", s3_data_distribution_type="ShardedByS3Key")],
                outputs=[ProcessingOutput(source="/opt/ml/processing/output", destination=a["output_uri"],
                                          output_name="results", s3_upload_mode="Continuous")],
                arguments=["--shards", "7"], job_name=a["sklearn_job"], wait=True, logs=True)

    script.latest_job.wait(logs=False)
    framework.latest_job.wait(logs=False)
    out = {}
    for key, processor in (("sklearn", sklearn), ("script", script), ("framework", framework)):
        job = processor.latest_job
        out[key] = {"job_name": job.job_name, "image_uri": processor.image_uri, "describe": job.describe(),
                    "inputs": [i.source for i in job.inputs], "outputs": [o.destination for o in job.outputs]}
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
