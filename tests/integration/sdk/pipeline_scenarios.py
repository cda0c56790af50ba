#!/usr/bin/python3
"""SageMaker Python SDK scenarios of test_multi_container.py, run as a process with the SDK bundle first on
sys.path (see sdk_helpers.py): `pipeline_scenarios.py NAME RESULT.json ARGS.json`.

pipeline_predictor: PipelineModel(models=[Model(image_uri="local:<pipeline_app.py>", env ROLE=pre),
Model(image_uri=..., model_data=<scale archive>, env ROLE=model)]).deploy() with wait=False, then
Session.wait_for_endpoint(poll=1) (deploy()'s poll is 30 s); Predictor(CSVSerializer) predicts CSV rows (the
preprocessing container's JSON feeds the model, whose CSV comes back), one with accept JSON; returns the answers,
DescribeModel and DescribeEndpoint. The pytest side deletes the endpoint."""

import json
import logging
import os
import sys
import time

STARTED = time.monotonic()
HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
import sdk_helpers  # noqa: E402

IMAGE = "local:" + os.path.join(os.path.dirname(HERE), "endpoints", "pipeline_app.py")
ROLE = sdk_helpers.ROLE_ARN


def pipeline_predictor(sess, a):
    from sagemaker.deserializers import BytesDeserializer
    from sagemaker.model import Model
    from sagemaker.pipeline import PipelineModel
    from sagemaker.predictor import Predictor
    from sagemaker.serializers import CSVSerializer
    name = a["name"]
    pre = Model(image_uri=IMAGE, role=ROLE, env={"ROLE": "pre"}, sagemaker_session=sess)
    model = Model(image_uri=IMAGE, role=ROLE, env={"ROLE": "model"}, model_data=a["model_data"],
                  sagemaker_session=sess)
    pipeline = PipelineModel(models=[pre, model], role=ROLE, name=name, sagemaker_session=sess,
                             predictor_cls=Predictor)
    t0 = time.monotonic()
    pipeline.deploy(initial_instance_count=1, instance_type="ml.m5.large", endpoint_name=name, wait=False)
    sess.wait_for_endpoint(name, poll=1)
    out = {"deploy_seconds": time.monotonic() - t0, "answers": []}
    predictor = Predictor(name, sagemaker_session=sess, serializer=CSVSerializer(),
                          deserializer=BytesDeserializer())
    for row in ([1, 2, 3], [10, 20, 30.5], [0]):
        out["answers"].append({"row": row, "answer": predictor.predict(row).decode()})
    predictor.deserializer = BytesDeserializer(accept="application/json")
    out["json_answer"] = json.loads(predictor.predict([4, 5]).decode())
    client = sess.sagemaker_client
    out["describe"] = client.describe_endpoint(EndpointName=name)
    out["model"] = client.describe_model(ModelName=name)
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
