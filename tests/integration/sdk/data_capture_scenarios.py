#!/usr/bin/python3
"""SageMaker Python SDK scenarios of test_data_capture.py, run as a process with the SDK bundle first on
sys.path (see sdk_helpers.py): `data_capture_scenarios.py NAME RESULT.json ARGS.json`.

capture_predictor: Model(image_uri="local:<serve_app.py>").deploy(data_capture_config=DataCaptureConfig(
enable_capture=True, sampling_percentage=100, destination_s3_uri=s3://<bucket>/sdk-capture)) with wait=False,
then Session.wait_for_endpoint(poll=1) (deploy()'s poll is 30 s); predict() a few JSON bodies (some with
inference_id=); returns what each call sent and got back, and the endpoint's Describe. The pytest side reads
the capture files and deletes the endpoint."""

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


def capture_predictor(sess, a):
    from sagemaker.deserializers import BytesDeserializer
    from sagemaker.model import Model
    from sagemaker.model_monitor import DataCaptureConfig
    from sagemaker.predictor import Predictor
    from sagemaker.serializers import JSONSerializer
    name = a["name"]
    capture = DataCaptureConfig(enable_capture=True, sampling_percentage=100,
                                destination_s3_uri="s3://%s/sdk-capture" % a["bucket"], sagemaker_session=sess)
    model = Model(image_uri=SERVE_IMAGE, role=ROLE, name=name, sagemaker_session=sess, predictor_cls=Predictor)
    t0 = time.monotonic()
    predictor = model.deploy(initial_instance_count=1, instance_type="ml.m5.large", endpoint_name=name,
                             serializer=JSONSerializer(), deserializer=BytesDeserializer(),
                             data_capture_config=capture, wait=False)
    sess.wait_for_endpoint(name, poll=1)
    out = {"deploy_seconds": time.monotonic() - t0, "calls": []}
    client = sess.sagemaker_client
    out["describe"] = client.describe_endpoint(EndpointName=name)
    out["endpoint_config"] = client.describe_endpoint_config(EndpointConfigName=out["describe"]["EndpointConfigName"])
    for i in range(4):
        data = {"row": i, "text": "caf\u00e9 %d" % i}
        kwargs = {"inference_id": "sdk-%d" % i} if i % 2 == 0 else {}
        answer = predictor.predict(data=data, **kwargs)
        out["calls"].append({"sent": json.dumps(data), "inference_id": kwargs.get("inference_id"),
                             "answer": answer.decode()})
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
