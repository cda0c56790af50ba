#!/usr/bin/python3
"""SageMaker Python SDK scenarios of test_serverless.py, run as a process with the SDK bundle first on
sys.path (see sdk_helpers.py): `serverless_scenarios.py NAME RESULT.json ARGS.json`.

serverless_predictor: Model(image_uri="local:<serve_app.py>").deploy(serverless_inference_config=
ServerlessInferenceConfig(memory_size_in_mb=1024, max_concurrency=2)) with wait=False, then
Session.wait_for_endpoint(poll=1) (deploy()'s poll is 30 s); predict() (a cold start: the pool is at 0);
the model and endpoint are deleted again."""

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


def serverless_predictor(sess, a):
    from sagemaker.deserializers import JSONDeserializer
    from sagemaker.model import Model
    from sagemaker.predictor import Predictor
    from sagemaker.serializers import JSONSerializer
    from sagemaker.serverless import ServerlessInferenceConfig
    name = a["name"]
    model = Model(image_uri=SERVE_IMAGE, role=ROLE, name=name, sagemaker_session=sess, predictor_cls=Predictor)
    t0 = time.monotonic()
    predictor = model.deploy(endpoint_name=name, serializer=JSONSerializer(), deserializer=JSONDeserializer(),
                             serverless_inference_config=ServerlessInferenceConfig(memory_size_in_mb=1024,
                                                                                    max_concurrency=2),
                             wait=False)
    sess.wait_for_endpoint(name, poll=1)
    out = {"deploy_seconds": time.monotonic() - t0, "predictor_class": type(predictor).__name__}
    client = sess.sagemaker_client
    config_name = client.describe_endpoint(EndpointName=name)["EndpointConfigName"]
    out["endpoint_config"] = client.describe_endpoint_config(EndpointConfigName=config_name)
    t0 = time.monotonic()
    out["result"] = predictor.predict(data={"hello": "serverless"})
    out["cold_predict_seconds"] = time.monotonic() - t0
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
