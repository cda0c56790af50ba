"""A handler whose predict_fn has a fixed per-call cost: where dynamic batching pays.

predict_fn spins for PER_CALL_SECONDS of CPU (standing in for what a framework or an accelerator
costs per call whatever the batch: a kernel launch, a session run, a remote call), then multiplies
the (rows, 16) input by a 16x4 matrix. With SAGEMAKER_TS_BATCH_SIZE > 1 the worker stacks the
requests' arrays into one call and splits the result by rows, so the fixed cost is paid once per
batch. (A matmul-heavy model does not show this with Debian's torch: its generic BLAS costs ~8x for
8 rows, so batching saves nothing there.)
"""

import json
import time

import numpy as np

PER_CALL_SECONDS = 0.001


def model_fn(model_dir):
    return np.random.default_rng(0).standard_normal((16, 4)).astype(np.float32)


def input_fn(input_data, content_type):
    return np.asarray(json.loads(input_data), dtype=np.float32).reshape(-1, 16)


def predict_fn(data, model):
    end = time.perf_counter() + PER_CALL_SECONDS
    while time.perf_counter() < end:
        pass
    return data @ model


def output_fn(prediction, accept):
    return json.dumps(np.asarray(prediction).tolist())
