#!/usr/bin/python3
"""SageMaker Python SDK scenarios of test_multi_model.py, run as a process with the SDK bundle first on
sys.path (see sdk_helpers.py): `mme_scenarios.py NAME RESULT.json ARGS.json`.

multidatamodel: MultiDataModel(model=SKLearnModel(entry_point=mme_src/mme_inference.py,
framework_version="1.2-1", env=...)) deployed with wait=False then Session.wait_for_endpoint(poll=1)
(deploy()'s poll is 30 s); add_model() uploads every local archive under the prefix; list_models();
predict(target_model=...) for every model, twice round (the second round finds evicted models gone
from memory when they do not all fit). The endpoint is left for the test's boto3 checks."""

import json
import logging
import os
import sys
import time

STARTED = time.monotonic()
HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
import sdk_helpers  # noqa: E402

ROLE = sdk_helpers.ROLE_ARN


def multidatamodel(sess, a):
    from sagemaker.deserializers import JSONDeserializer
    from sagemaker.multidatamodel import MultiDataModel
    from sagemaker.serializers import JSONSerializer
    from sagemaker.sklearn import SKLearnModel
    prefix = a["prefix"]
    inner = SKLearnModel(model_data=prefix + "unused.tar.gz", role=ROLE,
                         entry_point=os.path.join(HERE, "mme_src", "mme_inference.py"), framework_version="1.2-1",
                         env=a["env"], sagemaker_session=sess)
    mdm = MultiDataModel(name=a["name"], model_data_prefix=prefix, model=inner, sagemaker_session=sess)
    t0 = time.monotonic()
    predictor = mdm.deploy(initial_instance_count=1, instance_type="ml.m5.large", endpoint_name=a["name"],
                           serializer=JSONSerializer(), deserializer=JSONDeserializer(), wait=False)
    sess.wait_for_endpoint(a["name"], poll=1)
    out = {"deploy_seconds": time.monotonic() - t0, "predictor_class": type(predictor).__name__}
    client = sess.sagemaker_client
    out["model"] = client.describe_model(ModelName=a["name"])
    out["added"] = [mdm.add_model(path) for path in a["archives"]]
    out["listed"] = sorted(mdm.list_models())
    predictions = []
    for _ in range(2):
        for path in a["archives"]:
            target = os.path.basename(path)
            t0 = time.monotonic()
            answer = predictor.predict(a["rows"], target_model=target)
            predictions.append({"target": target, "answer": answer, "seconds": time.monotonic() - t0})
    out["predictions"] = predictions
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
