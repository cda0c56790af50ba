"""Multi-model handler (test_model_server.py): each model directory holds this file under code/ and
a name.txt; the answer says which model served and echoes the input."""
import json
import os


def model_fn(model_dir):
    with open(os.path.join(model_dir, "name.txt")) as f:
        return {"name": f.read().strip(), "dir": model_dir}


def input_fn(body, content_type):
    return json.loads(body)


def predict_fn(data, model):
    return {"model": model["name"], "input": data, "pid": os.getpid()}


def output_fn(prediction, accept):
    return json.dumps(prediction), "application/json"
