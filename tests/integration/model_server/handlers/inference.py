"""Handlers driven by the request (test_model_server.py): the JSON body {"op": ...} says what to do.

  {"op": "echo", "value": v}                 -> {"value": v, "pid": <worker pid>}
  {"op": "raise", "message": m}              -> ValueError(m) from predict_fn (500, message in body)
  {"op": "sleep", "seconds": s, "mark": p}   -> writes the worker's pid to p, sleeps s, answers
  {"op": "wrong_type"}                       -> output_fn returns an object() (not bytes/str)

model_fn sleeps MODEL_FN_SECONDS (a file beside this one, default 0) so /ping can be seen 503
before the model is loaded.
"""
import json
import os
import time

HERE = os.path.dirname(os.path.abspath(__file__))


def model_fn(model_dir):
    delay = 0.0
    path = os.path.join(model_dir, "model_fn_seconds.txt")
    if os.path.exists(path):
        with open(path) as f:
            delay = float(f.read().strip() or 0)
    time.sleep(delay)
    return {"loaded_from": model_dir}


def input_fn(body, content_type):
    if content_type != "application/json":
        raise ValueError("this handler only reads application/json, not %r" % content_type)
    return json.loads(body)


def predict_fn(data, model):
    op = data.get("op")
    if op == "raise":
        raise ValueError(data["message"])
    if op == "sleep":
        if data.get("mark"):
            with open(data["mark"] + ".tmp", "w") as f:
                f.write(str(os.getpid()))
            os.replace(data["mark"] + ".tmp", data["mark"])
        time.sleep(float(data["seconds"]))
        return {"slept": data["seconds"], "pid": os.getpid()}
    if op == "wrong_type":
        return {"wrong_type": True}
    return {"value": data.get("value"), "pid": os.getpid()}


def output_fn(prediction, accept):
    if prediction.get("wrong_type"):
        return object()
    return json.dumps(prediction), "application/json"
