#!/usr/bin/python3
"""SageMaker Python SDK scenarios of test_transform.py, run as a process with the SDK bundle first on
sys.path (see sdk_helpers.py): `transform_scenarios.py NAME RESULT.json ARGS.json`.

transformer_join: sagemaker.transformer.Transformer(model_name=..., instance_count=2,
strategy="MultiRecord", assemble_with="Line", accept="text/csv", max_payload=1,
max_concurrent_transforms=2).transform(data=<prefix>, content_type="text/csv", split_type="Line",
input_filter="$[1:]", join_source="Input", wait=False), then Session.wait_for_transform_job(poll=1)
(transform(wait=True) polls every 5 s); returns the DescribeTransformJob answer and the output path."""

import json
import logging
import os
import sys
import time

STARTED = time.monotonic()
HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
import sdk_helpers  # noqa: E402


def transformer_join(sess, a):
    from sagemaker.transformer import Transformer
    transformer = Transformer(model_name=a["model"], instance_count=2, instance_type="ml.m5.large",
                              strategy="MultiRecord", assemble_with="Line", accept="text/csv",
                              output_path=a["output"], max_payload=1, max_concurrent_transforms=2,
                              sagemaker_session=sess)
    t0 = time.monotonic()
    transformer.transform(data=a["input"], data_type="S3Prefix", content_type="text/csv", split_type="Line",
                          input_filter="$[1:]", join_source="Input", job_name=a["name"], wait=False)
    described = sess.wait_for_transform_job(a["name"], poll=1)
    return {"seconds": time.monotonic() - t0, "describe": described, "output_path": transformer.output_path,
            "job_name": transformer.latest_transform_job.name}


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
