"""Dynamic batching probe (test_model_server.py): each request is {"x": <number>}; input_fn makes
it a (1, 1) array, predict_fn sees the stacked batch and answers, per row, [x, rows in the batch]
after a short sleep (so that later requests queue up and form the next batch)."""
import json
import time

import numpy as np


def model_fn(model_dir):
    return "batch-probe"


def input_fn(body, content_type):
    return np.array([[float(json.loads(body)["x"])]], dtype=np.float64)


def predict_fn(data, model):
    data = np.asarray(data).reshape(-1, 1)
    time.sleep(0.2)
    n = data.shape[0]
    return np.concatenate([data, np.full((n, 1), float(n))], axis=1)


def output_fn(prediction, accept):
    return json.dumps(np.asarray(prediction).tolist()), "application/json"
