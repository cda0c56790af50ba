"""Entry point of the multi-model test models (test_multi_model.py), served by Kiln's model server in
multi-model mode: one process per loaded model. Each model archive holds weights.npy (a linear
model's coefficients) and info.json: {"ballast_mb": N} is memory the model holds while loaded (so
that only a few fit under the container's memory limit), {"load_seconds": S} a slow load."""
import json
import os
import time

import numpy as np


def model_fn(model_dir):
    with open(os.path.join(model_dir, "info.json")) as f:
        info = json.load(f)
    time.sleep(info.get("load_seconds", 0))
    return {
        "weights": np.load(os.path.join(model_dir, "weights.npy")),
        "name": info["name"],
        # Written, not just reserved: it counts in the worker's resident memory.
        "ballast": b"\x01" * (info.get("ballast_mb", 0) << 20),
    }


def input_fn(body, content_type):
    return np.asarray(json.loads(body), dtype=np.float64)


def predict_fn(data, model):
    return {"model": model["name"], "pid": os.getpid(), "prediction": (data @ model["weights"]).tolist()}


def output_fn(prediction, accept):
    return json.dumps(prediction), "application/json"
