"""The trivial handler of bench/model_server_bench.py: echoes the JSON body it gets.

The same file is the model's code/inference.py for Kiln's model server and the handler module the
gunicorn + Flask reference (byo/predictor.py) calls, so both servers run the same Python per request:
json.loads of the body (already a str: the toolkit decodes application/json before input_fn) and
json.dumps of the result.
"""

import json


def model_fn(model_dir):
    return {"model_dir": model_dir}


def input_fn(input_data, content_type):
    return json.loads(input_data)


def predict_fn(data, model):
    return data


def output_fn(prediction, accept):
    return json.dumps(prediction)
