"""Issue 13 through Kiln endpoints: framework inference images (pytorch-inference,
sagemaker-scikit-learn) deployed with the SageMaker Python SDK 2.257.6, unmodified, are served by
Kiln's model server running the user's inference.py.

- a PyTorch estimator trained by a Kiln job, then estimator.deploy(entry_point="inference.py",
  source_dir=...): predictor.predict() equals what the job's model.pth computes here with torch;
- PyTorchModel(model_data=, entry_point=, source_dir=, framework_version=, py_version=).deploy();
- SKLearnModel(model_data=, entry_point=, framework_version="1.2-1").deploy() (the SDK uploads
  sourcedir.tar.gz and sets SAGEMAKER_SUBMIT_DIRECTORY to its s3:// URI);
- a handler that raises: boto3's invoke_endpoint gets ModelError (424) carrying the message.

Each SDK flow runs in its own process (model_server/sdk_scenarios.py, see sdk_helpers.py for why).
The training job runs alone first (on a 2-CPU host an endpoint instance would hold the capacity the
job waits for); the three deploys then overlap. Every endpoint is deleted at the end: instances
outlive a stopped server.
"""

import io
import json
import os
import random
import subprocess
import time
import uuid

import pytest

import endpoint_helpers as eh
import sdk_helpers
import training_helpers as th
from training_helpers import sm, s3  # noqa: F401 (module-scoped client fixtures)

KILN_CONFIG = {
    "scheduler": {"policy": "shrink", "allow_cpu_fallback": True},
    "training": {"stop_grace_seconds": 10},
    "endpoints": {"stop_grace_seconds": 5, "health_interval_seconds": 0.5},
}

HERE = os.path.dirname(os.path.abspath(__file__))
SCENARIOS = os.path.join(HERE, "model_server", "sdk_scenarios.py")
EPOCHS = 6
TRUE_W = (2.0, -3.0)
TRUE_B = 1.0
ROWS = [[0.5, -0.25], [1.0, 1.0], [-2.0, 0.0]]
MODEL_W = [[1.5, -0.5]]  # the PyTorchModel's weights (made here, no training)
MODEL_B = [0.25]
ERROR_TEXT = "kiln-sdk-test: -999 is not a valid feature value"


class Runner(sdk_helpers.ScenarioRunner):
    """sdk_helpers.ScenarioRunner running model_server/sdk_scenarios.py instead of sdk/scenarios.py."""

    def start(self, name, args, timeout=300):
        if name in self.scenarios:
            return self.scenarios[name]
        base = os.path.join(self.workdir, name)
        args_path, result_path, out_path = base + ".args.json", base + ".result.json", base + ".out"
        with open(args_path, "w") as f:
            json.dump(args, f)
        with open(out_path, "wb") as out:
            proc = subprocess.Popen([sdk_helpers.SDK_PYTHON, SCENARIOS, name, result_path, args_path],
                                    cwd=self.workdir, env=self.env(), stdin=subprocess.DEVNULL,
                                    stdout=out, stderr=subprocess.STDOUT)
        sc = sdk_helpers.Scenario(name, proc, result_path, out_path, time.monotonic(), timeout)
        self.scenarios[name] = sc
        return sc


@pytest.fixture(scope="module")
def sdk_lib():
    lib = sdk_helpers.sdk_lib_dir()
    if lib is None:
        pytest.skip("SageMaker Python SDK bundle not found (../shared/clients/sagemaker-python-sdk/lib "
                    "beside the repository, or $KILN_SAGEMAKER_SDK_LIB)")
    return lib


def linear_state_dict(w, b):
    import torch
    model = torch.nn.Linear(2, 1)
    with torch.no_grad():
        model.weight.copy_(torch.tensor(w))
        model.bias.copy_(torch.tensor(b))
    buf = io.BytesIO()
    torch.save(model.state_dict(), buf)
    return buf.getvalue()


def predict_with_state(state_bytes, rows):
    """What the Linear(2, 1) in `state_bytes` computes for `rows`, here with torch."""
    import torch
    model = torch.nn.Linear(2, 1)
    model.load_state_dict(torch.load(io.BytesIO(state_bytes), map_location="cpu"))
    with torch.no_grad():
        return model(torch.tensor(rows, dtype=torch.float32)).tolist()


@pytest.fixture(scope="module")
def inputs(module_kiln, s3, tmp_path_factory):
    """A bucket with a PyTorch model.tar.gz (model.pth) and a scikit-learn one (model.joblib, a
    Ridge fitted here), and the training data the estimator uploads."""
    import joblib
    import numpy as np
    from sklearn.linear_model import Ridge

    work = tmp_path_factory.mktemp("sdk-deploy")
    bucket = "kiln-sdk-deploy-" + uuid.uuid4().hex[:8]
    s3.create_bucket(Bucket=bucket)
    rnd = random.Random(13)
    rows = []
    for _ in range(60):
        x1, x2 = rnd.uniform(-1, 1), rnd.uniform(-1, 1)
        rows.append((TRUE_W[0] * x1 + TRUE_W[1] * x2 + TRUE_B + rnd.gauss(0, 0.01), x1, x2))
    data_dir = work / "data"
    data_dir.mkdir()
    (data_dir / "train.csv").write_text("".join("%.6f,%.6f,%.6f\n" % r for r in rows))

    state = linear_state_dict(MODEL_W, MODEL_B)
    s3.put_object(Bucket=bucket, Key="models/pytorch/model.tar.gz", Body=eh.model_tarball({"model.pth": state}))
    arr = np.array(rows)
    ridge = Ridge(alpha=0.001).fit(arr[:, 1:], arr[:, 0])
    buf = io.BytesIO()
    joblib.dump(ridge, buf)
    s3.put_object(Bucket=bucket, Key="models/sklearn/model.tar.gz",
                  Body=eh.model_tarball({"model.joblib": buf.getvalue()}))
    return {"bucket": bucket, "work": str(work), "data_dir": str(data_dir), "state": state, "ridge": ridge,
            "pytorch_model_data": "s3://%s/models/pytorch/model.tar.gz" % bucket,
            "sklearn_model_data": "s3://%s/models/sklearn/model.tar.gz" % bucket}


@pytest.fixture(scope="module")
def runner(module_kiln, sm, sdk_lib, inputs):
    """Starts the fit+deploy scenario at once and the two model deploys once its training job has
    ended; kills leftovers and deletes every endpoint at the end."""
    r = Runner(module_kiln, os.path.join(inputs["work"], "scenarios"), sdk_lib)
    b = inputs["bucket"]
    marker = os.path.join(inputs["work"], "fitted")
    try:
        fit = r.start("pytorch_fit_deploy", dict(bucket=b, data_dir=inputs["data_dir"], epochs=EPOCHS,
                                                 rows=ROWS, name=eh.unique_name("sdk-pt-est"),
                                                 fitted_marker=marker), timeout=400)
        deadline = time.monotonic() + 300
        while not os.path.exists(marker) and fit.proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.5)
        r.start("pytorch_model_deploy", dict(bucket=b, model_data=inputs["pytorch_model_data"], rows=ROWS,
                                             name=eh.unique_name("sdk-pt-model")))
        r.start("sklearn_model_deploy", dict(bucket=b, model_data=inputs["sklearn_model_data"], rows=ROWS,
                                             name=eh.unique_name("sdk-sk-model")))
        yield r
    finally:
        r.stop_all()
        try:
            eh.delete_all_endpoints(sm)
        finally:
            for name, sc in sorted(r.scenarios.items()):
                seconds = sc.seconds()
                print("sdk scenario %-22s rc=%s %s" % (name, sc.proc.returncode,
                                                        "%.1f s" % seconds if seconds else "(no result)"))


def assert_close(got, expected, rtol=1e-5, atol=1e-5):
    """Nested lists equal in shape and within float32 rounding."""
    import numpy as np
    got, expected = np.asarray(got, dtype=np.float64), np.asarray(expected, dtype=np.float64)
    assert got.shape == expected.shape, (got.tolist(), expected.tolist())
    np.testing.assert_allclose(got, expected, rtol=rtol, atol=atol)


def container(result):
    return result["model"]["PrimaryContainer"]


# ---------------------------------------------------------------------------------------------


def test_estimator_fit_then_deploy_with_inference_py(runner, s3):
    r = runner.result("pytorch_fit_deploy")
    c = container(r)
    assert "pytorch-inference" in c["Image"], c["Image"]
    assert c["Environment"]["SAGEMAKER_PROGRAM"] == "inference.py", c["Environment"]
    files = th.untar(th.get_s3(s3, r["model_data"]))
    assert "model.pth" in files, sorted(files)
    expected = predict_with_state(files["model.pth"], ROWS)
    assert_close(r["predictions"], expected)
    # The job learned the data's line, so this is the trained model, not a fresh one.
    assert [p[0] for p in r["predictions"]] == pytest.approx(
        [TRUE_W[0] * a + TRUE_W[1] * b + TRUE_B for a, b in ROWS], abs=0.3)


def test_pytorch_model_deploy(runner, s3):
    r = runner.result("pytorch_model_deploy")
    c = container(r)
    assert "pytorch-inference" in c["Image"], c["Image"]
    assert c["Environment"]["SAGEMAKER_PROGRAM"] == "inference.py", c["Environment"]
    # framework_version >= 1.2: the SDK repacked model.tar.gz with code/.
    names = {n.lstrip("/") for n in th.untar(th.get_s3(s3, c["ModelDataUrl"]))}
    assert {"model.pth", "code/inference.py"} <= names, names
    expected = [[MODEL_W[0][0] * a + MODEL_W[0][1] * b + MODEL_B[0]] for a, b in ROWS]
    assert_close(r["predictions"], expected)


def test_sklearn_model_deploy(runner, inputs):
    r = runner.result("sklearn_model_deploy")
    c = container(r)
    assert "sagemaker-scikit-learn" in c["Image"], c["Image"]
    env = c["Environment"]
    assert env["SAGEMAKER_PROGRAM"] == "serve_ridge.py", env
    assert env["SAGEMAKER_SUBMIT_DIRECTORY"].startswith("s3://") and \
        env["SAGEMAKER_SUBMIT_DIRECTORY"].endswith("/sourcedir.tar.gz"), env
    expected = inputs["ridge"].predict(ROWS).tolist()
    assert_close(r["predictions"], expected)


def test_a_raising_handler_is_a_model_error(runner, module_kiln):
    r = runner.result("pytorch_model_deploy")
    rt = module_kiln.client("sagemaker-runtime")
    resp = eh.invoke_error(rt, r["endpoint_name"], body=json.dumps([[-999.0, 0.0]]).encode(),
                           ContentType="application/json", Accept="application/json")
    assert resp["Error"]["Code"] == "ModelError", resp
    assert resp["ResponseMetadata"]["HTTPStatusCode"] == 424, resp
    assert resp.get("OriginalStatusCode") == 500, resp
    assert ERROR_TEXT in resp["Error"]["Message"] or ERROR_TEXT in resp.get("OriginalMessage", ""), resp
    # The endpoint keeps serving.
    answer, _ = eh.invoke(rt, r["endpoint_name"], body=json.dumps(ROWS).encode(), Accept="application/json")
    assert_close(answer, [[MODEL_W[0][0] * a + MODEL_W[0][1] * b + MODEL_B[0]] for a, b in ROWS])
