#!/usr/bin/python3
"""SageMaker Python SDK scenarios of test_async_inference.py, run as a process with the SDK bundle
first on sys.path (see sdk_helpers.py): `async_scenarios.py NAME RESULT.json ARGS.json`.

async_predictor: Model(image_uri="local:<serve_app.py>").deploy(async_inference_config=
AsyncInferenceConfig(...)) returns an AsyncPredictor; predict() uploads the input, calls
InvokeEndpointAsync and waits for the output object (WaiterConfig delay 1 s instead of 15 s; the
endpoint is awaited with Session.wait_for_endpoint(poll=1) instead of deploy()'s 30 s poll);
predict_async() of a model error gives an AsyncInferenceResponse whose get_result() finds the
failure object (AsyncInferenceModelError); the model and endpoint are deleted again."""

import json
import logging
import os
import sys
import time

STARTED = time.monotonic()
HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
import sdk_helpers  # noqa: E402

SERVE_IMAGE = "local:" + os.path.join(os.path.dirname(HERE), "endpoints", "serve_app.py")
ROLE = sdk_helpers.ROLE_ARN


def async_predictor(sess, a):
    from sagemaker.async_inference import AsyncInferenceConfig, WaiterConfig
    from sagemaker.deserializers import JSONDeserializer
    from sagemaker.model import Model
    from sagemaker.predictor import Predictor
    from sagemaker.serializers import JSONSerializer
    bucket, name = a["bucket"], a["name"]
    model = Model(image_uri=SERVE_IMAGE, role=ROLE, name=name, sagemaker_session=sess, predictor_cls=Predictor)
    config = AsyncInferenceConfig(output_path="s3://%s/sdk-async/out" % bucket,
                                  failure_path="s3://%s/sdk-async/err" % bucket,
                                  max_concurrent_invocations_per_instance=2)
    t0 = time.monotonic()
    # wait=False, then the session's own waiter with a 1 s poll (deploy()'s is 30 s).
    predictor = model.deploy(initial_instance_count=1, instance_type="ml.m5.large", endpoint_name=name,
                             async_inference_config=config, serializer=JSONSerializer(),
                             deserializer=JSONDeserializer(), wait=False)
    sess.wait_for_endpoint(name, poll=1)
    out = {"deploy_seconds": time.monotonic() - t0, "predictor_class": type(predictor).__name__}
    # Few attempts: with a failure path the SDK waits for both objects in two non-daemon threads,
    # and the one that finds nothing keeps the process alive until its attempts are spent.
    out["result"] = predictor.predict(data={"hello": "sdk"}, waiter_config=WaiterConfig(max_attempts=5, delay=1))
    # The failure object is the container's answer, which the predictor's JSON deserializer reads.
    response = predictor.predict_async(data={"status": 500, "message": json.dumps({"error": "sdk boom"})})
    out["output_path"], out["failure_path"] = response.output_path, response.failure_path
    try:
        response.get_result(waiter_config=WaiterConfig(max_attempts=3, delay=1))
        out["failure"] = None
    except Exception as e:  # noqa: BLE001 (the SDK's AsyncInferenceModelError is what we expect)
        out["failure"] = "%s: %s" % (type(e).__name__, e)
    predictor.delete_model()
    predictor.delete_endpoint()
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
