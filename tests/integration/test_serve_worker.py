"""The model server's Python worker (python/kiln_toolkit/serve_worker.py) driven directly over a
socketpair with frames (src/modelserver/README.md, "Worker protocol"): no server or C++ needed.

Run: /usr/bin/python3 -m pytest tests/integration/test_serve_worker.py -q -p no:cacheprovider
"""

import io
import json
import os
import signal
import socket
import struct
import subprocess
import tarfile
import textwrap
import time
import zipfile

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
WORKER = os.path.join(ROOT, "python", "kiln_toolkit", "serve_worker.py")
PYTHON = os.environ.get("KILN_MODEL_SERVER_PYTHON", "/usr/bin/python3")

READY, LOAD_FAILED, INVOKE, RESULT = 1, 2, 3, 4


# --------------------------------------------------------------------------------------------
# The server's end of the protocol, written here from the README (independent of the worker's
# kiln_serve_frames module).

def frame(ftype, meta, payload=b""):
    m = json.dumps(meta).encode()
    return struct.pack(">IBI", 5 + len(m) + len(payload), ftype, len(m)) + m + payload


def recv_exact(sock, n):
    buf = b""
    while len(buf) < n:
        chunk = sock.recv(n - len(buf))
        if not chunk:
            raise EOFError("EOF after %d of %d bytes" % (len(buf), n))
        buf += chunk
    return buf


def read_frame(sock):
    rest, ftype, meta_len = struct.unpack(">IBI", recv_exact(sock, 9))
    body = recv_exact(sock, rest - 5)
    return ftype, json.loads(body[:meta_len]), body[meta_len:]


class Worker:
    def __init__(self, proc, sock, first):
        self.proc, self.sock, self.first = proc, sock, first
        self.next_id = 1

    def invoke(self, *items):
        """items: (body bytes, headers dict); returns [(meta, body), ...]."""
        metas, payload = [], b""
        for body, headers in items:
            metas.append(dict(headers, size=len(body)))
            payload += body
        rid = self.next_id
        self.next_id += 1
        self.sock.sendall(frame(INVOKE, {"id": rid, "items": metas}, payload))
        ftype, meta, body = read_frame(self.sock)
        assert ftype == RESULT and meta["id"] == rid
        out, off = [], 0
        for m in meta["items"]:
            out.append((m, body[off:off + m["size"]]))
            off += m["size"]
        assert off == len(body)
        return out

    def one(self, body, **headers):
        return self.invoke((body, headers))[0]

    def close(self):
        self.sock.close()
        try:
            return self.proc.wait(timeout=20)
        finally:
            if self.proc.poll() is None:
                self.proc.kill()
                self.proc.wait()


@pytest.fixture
def start(tmp_path):
    workers = []

    def _start(code=None, framework="", env=None, model_files=None, expect_ready=True,
               model_dir=None, name="m"):
        model_dir = model_dir or str(tmp_path / "model")
        os.makedirs(os.path.join(model_dir, "code"), exist_ok=True)
        for fname, src in (code or {}).items():
            with open(os.path.join(model_dir, "code", fname), "w") as f:
                f.write(textwrap.dedent(src))
        for fname, data in (model_files or {}).items():
            with open(os.path.join(model_dir, fname), "wb") as f:
                f.write(data)
        a, b = socket.socketpair()
        e = dict(os.environ)
        for k in ("SAGEMAKER_PROGRAM", "SAGEMAKER_SUBMIT_DIRECTORY",
                  "SAGEMAKER_DEFAULT_INVOCATIONS_ACCEPT", "KILN_PIP_TARGET"):
            e.pop(k, None)
        e["SAGEMAKER_BASE_DIR"] = str(tmp_path / "base")
        e.update(env or {})
        cmd = [PYTHON, "-u", WORKER, "work", "--fd", str(b.fileno()), "--model-dir", model_dir,
               "--model-name", name]
        if framework:
            cmd += ["--framework", framework]
        proc = subprocess.Popen(cmd, pass_fds=[b.fileno()], env=e, stderr=subprocess.PIPE)
        b.close()
        a.settimeout(60)
        first = read_frame(a)
        w = Worker(proc, a, first)
        workers.append(w)
        if expect_ready:
            assert first[0] == READY, (first, proc.stderr.read1(65536) if first[0] != READY
                                        else None)
            assert first[1]["pid"] == proc.pid and isinstance(first[1]["load_ms"], int)
        return w

    yield _start
    for w in workers:
        if w.proc.poll() is None:
            w.proc.kill()
            w.proc.wait()
        w.proc.stderr.close()
        w.sock.close()


JSONH = {"content_type": "application/json"}

NUMPY_MODEL = """
    import numpy as np
    def model_fn(model_dir):
        return 2
    def predict_fn(data, model):
        return data * model
"""


def err(item):
    meta, body = item
    assert meta["content_type"] == "application/json"
    e = json.loads(body)
    assert e["code"] == meta["status"]
    return meta["status"], e["type"], e["message"]


# --------------------------------------------------------------------------------------------
# Default codecs.

def test_json_round_trip_through_the_default_codecs(start):
    w = start({"inference.py": NUMPY_MODEL})
    meta, body = w.one(b"[[1, 2], [3, 4.5]]", **JSONH)
    assert meta["status"] == 200 and meta["content_type"] == "application/json"
    assert json.loads(body) == [[2, 4], [6, 9.0]]
    assert "custom_attributes" not in meta
    assert w.close() == 0  # EOF: exit 0


def test_csv_in_and_out_numeric_and_strings(start):
    w = start({"inference.py": """
        def model_fn(model_dir):
            return None
        def predict_fn(data, model):
            return data
        def output_fn(prediction, accept):
            import json
            return json.dumps({"dtype": prediction.dtype.kind, "shape": list(prediction.shape),
                               "v": prediction.tolist()})
    """})
    meta, body = w.one(b"1,2\n3,4\n", content_type="text/csv")
    assert json.loads(body) == {"dtype": "f", "shape": [2, 2], "v": [[1, 2], [3, 4]]}
    # One row stays 2-D (the toolkit squeezes it to 1-D; see python/README.md).
    assert json.loads(w.one(b"5,6,7", content_type="text/csv")[1])["shape"] == [1, 3]
    status, _, msg = err(w.one(b"1,2\n3", content_type="text/csv"))
    assert status == 400 and "every row" in msg
    # Not numeric: the strings (the toolkit keeps them when float conversion fails).
    assert json.loads(w.one(b"a,1\nb,2", content_type="text/csv")[1])["v"] == [["a", "1"],
                                                                               ["b", "2"]]


def test_csv_accept_and_npy_round_trip(start):
    import numpy as np
    w = start({"inference.py": NUMPY_MODEL})
    meta, body = w.one(b"[[1, 2], [3, 4]]", content_type="application/json", accept="text/csv")
    assert meta["content_type"] == "text/csv" and body == b"2,4\n6,8\n"
    buf = io.BytesIO()
    np.save(buf, np.arange(6, dtype=np.int16).reshape(2, 3))
    meta, body = w.one(buf.getvalue(), content_type="application/x-npy",
                       accept="application/x-npy")
    assert meta["status"] == 200 and meta["content_type"] == "application/x-npy"
    out = np.load(io.BytesIO(body))
    assert out.dtype == np.int16 and out.tolist() == [[0, 2, 4], [6, 8, 10]]


def test_npz_decodes_sparse_matrices_and_dense_archives(start):
    import numpy as np
    scipy_sparse = pytest.importorskip("scipy.sparse")
    w = start({"inference.py": """
        def model_fn(model_dir): return None
        def predict_fn(data, model):
            if isinstance(data, dict):
                return {k: v.tolist() for k, v in data.items()}
            return {"type": type(data).__name__, "dense": data.toarray().tolist()}
    """})
    buf = io.BytesIO()
    scipy_sparse.save_npz(buf, scipy_sparse.csr_matrix(np.array([[0, 2], [3, 0]])))
    meta, body = w.one(buf.getvalue(), content_type="application/x-npz")
    assert meta["status"] == 200, body
    out = json.loads(body)
    assert out["type"].endswith("_matrix") or out["type"].endswith("_array")
    assert out["dense"] == [[0, 2], [3, 0]]
    buf = io.BytesIO()
    np.savez(buf, a=np.arange(3))
    assert json.loads(w.one(buf.getvalue(), content_type="application/x-npz")[1]) == {
        "a": [0, 1, 2]}
    assert err(w.one(b"junk", content_type="application/x-npz"))[0] == 400


def test_accept_default_env_and_lists(start):
    w = start({"inference.py": NUMPY_MODEL},
              env={"SAGEMAKER_DEFAULT_INVOCATIONS_ACCEPT": "text/csv"})
    assert w.one(b"[1]", **JSONH)[0]["content_type"] == "text/csv"
    assert w.one(b"[1]", accept="*/*", **JSONH)[0]["content_type"] == "text/csv"
    meta, body = w.one(b"[[1]]", accept="text/html;q=1.0, application/json;q=0.5, text/csv",
                       **JSONH)
    assert meta["status"] == 200 and meta["content_type"] == "application/json"
    assert json.loads(body) == [[2]]
    # Content-Type parameters do not hide the media type.
    assert w.one(b"[3]", content_type="application/json; charset=utf-8",
                 accept="application/json")[1] == b"[6]"


def test_unsupported_types_are_415_and_bad_bodies_400(start):
    w = start({"inference.py": NUMPY_MODEL})
    status, typ, msg = err(w.one(b"\x89PNG", content_type="image/png"))
    assert status == 415 and typ == "UnsupportedFormatError"
    assert "Content type image/png is not supported" in msg and "input_fn" in msg
    status, _, msg = err(w.one(b"[1]", accept="image/png", **JSONH))
    assert status == 415 and "image/png" in msg
    status, _, msg = err(w.one(b"{not json", **JSONH))
    assert status == 400 and "JSON" in msg
    status, _, msg = err(w.one(b"\xff\xfe[1]", **JSONH))
    assert status == 400 and "UTF-8" in msg
    status, _, _ = err(w.one(b"not npy", content_type="application/x-npy"))
    assert status == 400
    # The worker is still serving.
    assert w.one(b"[1]", **JSONH)[1] == b"[2]"


# --------------------------------------------------------------------------------------------
# Handler semantics.

def test_transform_fn_gets_str_for_utf8_types_and_bytes_otherwise(start):
    w = start({"inference.py": """
        def model_fn(model_dir):
            return "M"
        def transform_fn(model, data, content_type, accept):
            return ("%s|%s|%s|%s|%r" % (model, type(data).__name__, content_type, accept, data),
                    "text/plain")
    """})
    meta, body = w.one("[\"é\"]".encode(), **JSONH)
    assert meta["content_type"] == "text/plain"
    assert body.decode() == "M|str|application/json|application/json|'[\"é\"]'"
    meta, body = w.one(b"\x00\x01", content_type="application/octet-stream", accept="x/y")
    assert body == b"M|bytes|application/octet-stream|x/y|b'\\x00\\x01'"
    meta, body = w.one(b"a,b", content_type="text/csv")
    assert body.startswith(b"M|str|text/csv")


def test_transform_fn_with_input_fn_fails_to_load(start):
    w = start({"inference.py": """
        def model_fn(model_dir): return 1
        def transform_fn(model, data, content_type, accept): return b""
        def input_fn(data, content_type): return data
    """}, expect_ready=False)
    ftype, meta, _ = w.first
    assert ftype == LOAD_FAILED and meta["status"] == 500
    assert "Cannot use transform_fn" in meta["message"]
    assert w.proc.wait(timeout=20) == 1


def test_context_argument_and_output_tuples(start, tmp_path):
    w = start({"inference.py": """
        import json
        SEEN = {}
        def pre_model_fn(model_dir, context):
            SEEN["pre"] = context.model_name
        def model_fn(model_dir, context):
            return {"dir": model_dir, "name": context.model_name}
        def model_warmup_fn(model_dir, model):
            SEEN["warm"] = model["name"]
        def input_fn(data, content_type, context):
            return {"data": data,
                    "attrs": context.get_request_header(0, "x-amzn-sagemaker-custom-attributes"),
                    "props": context.request_processor[0].get_request_properties(),
                    "id": context.get_request_id(0)}
        def predict_fn(data, model):
            return dict(data, model=model, seen=SEEN)
        def output_fn(prediction, accept, context):
            context.set_response_header(0, "X-Amzn-SageMaker-Custom-Attributes", "done=1")
            return json.dumps(prediction).encode(), "application/vnd.kiln+json"
    """}, name="mymodel")
    meta, body = w.one(b"{}", content_type="application/json", accept="application/json",
                       custom_attributes="trace=7", inference_id="inf-1")
    assert meta["status"] == 200 and meta["content_type"] == "application/vnd.kiln+json"
    assert meta["custom_attributes"] == "done=1"
    out = json.loads(body)
    assert out["data"] == "{}" and out["attrs"] == "trace=7" and out["id"] == "inf-1"
    assert out["props"] == {"Content-Type": "application/json", "Accept": "application/json",
                            "X-Amzn-SageMaker-Custom-Attributes": "trace=7",
                            "X-Amzn-SageMaker-Inference-Id": "inf-1"}
    assert out["model"] == {"dir": str(tmp_path / "model"), "name": "mymodel"}
    assert out["seen"] == {"pre": "mymodel", "warm": "mymodel"}


def test_exceptions_with_a_status_and_without(start):
    w = start({"inference.py": """
        class Unprocessable(Exception):
            status_code = 422
        class Teapot(Exception):
            def __init__(self, msg):
                super().__init__(msg)
                self.http_status = 418
        def model_fn(model_dir): return None
        def transform_fn(model, data, content_type, accept):
            if data == "422": raise Unprocessable("bad input shape")
            if data == "418": raise Teapot("short and stout")
            if data == "500": raise KeyError("feature_x")
            return b"ok"
    """})
    assert err(w.one(b"422", **JSONH)) == (422, "Unprocessable", "bad input shape")
    assert err(w.one(b"418", **JSONH)) == (418, "Teapot", "short and stout")
    assert err(w.one(b"500", **JSONH)) == (500, "KeyError", "'feature_x'")
    assert w.one(b"1", **JSONH)[1] == b"ok"
    w.close()
    stderr = w.proc.stderr.read().decode()
    assert "Traceback" in stderr and "bad input shape" in stderr


def test_wrong_return_types_name_the_function(start):
    w = start({"inference.py": """
        def model_fn(model_dir): return None
        def input_fn(data, content_type): return data
        def predict_fn(data, model):
            return {1, 2} if data == "set" else data
        def output_fn(prediction, accept):
            if prediction == "int": return 5
            if prediction == "triple": return (b"", "a", "b")
            return prediction
    """})
    status, _, msg = err(w.one(b"int", **JSONH))
    assert status == 500 and "output_fn" in msg and "int" in msg
    status, _, msg = err(w.one(b"triple", **JSONH))
    assert status == 500 and "output_fn" in msg and "tuple" in msg
    status, _, msg = err(w.one(b"set", **JSONH))
    assert status == 500 and "output_fn" in msg and "set" in msg
    assert w.one(b"fine", **JSONH)[1] == b"fine"


def test_default_output_fn_cannot_encode_a_prediction(start):
    w = start({"inference.py": """
        def model_fn(model_dir): return None
        def predict_fn(data, model): return object()
    """})
    status, _, msg = err(w.one(b"[1]", **JSONH))
    assert status == 500 and "output_fn" in msg and "object" in msg


def test_only_the_standard_library_is_imported_without_defaults(start):
    w = start({"inference.py": """
        import sys
        def model_fn(model_dir): return None
        def transform_fn(model, data, content_type, accept):
            return ",".join(m for m in ("numpy", "torch", "scipy", "sklearn", "xgboost")
                            if m in sys.modules) or "none"
    """})
    assert w.one(b"[1]", **JSONH)[1] == b"none"


def test_a_batched_predict_fn_gets_a_context_over_all_items(start):
    w = start({"inference.py": """
        import json
        import numpy as np
        def model_fn(model_dir): return None
        def predict_fn(data, model, context):
            ids = [context.get_request_id(i) for i in range(len(context.request_processor))]
            return np.array([[len(ids)]] * data.shape[0])
        def output_fn(prediction, accept, context):
            return json.dumps([prediction.tolist(), context.get_request_id(0)])
    """})
    out = w.invoke((b"[[1]]", dict(JSONH, inference_id="a")), (b"[[2]]", JSONH))
    assert json.loads(out[0][1]) == [[[2]], "a"]
    assert json.loads(out[1][1])[0] == [[2]]


def test_unknown_framework_and_failing_pre_model_fn(start, tmp_path):
    w = start({"inference.py": NUMPY_MODEL}, framework="caffe", expect_ready=False)
    assert w.first[0] == LOAD_FAILED and "caffe" in w.first[1]["message"]
    w = start({"inference.py": textwrap.dedent(NUMPY_MODEL) + "def pre_model_fn(model_dir):\n"
                                                             "    raise RuntimeError('no licence')\n"},
              expect_ready=False, model_dir=str(tmp_path / "m2"))
    assert w.first[0] == LOAD_FAILED and w.first[1]["message"] == "no licence"
    assert w.first[1]["type"] == "RuntimeError"


# --------------------------------------------------------------------------------------------
# Load failures.

@pytest.mark.parametrize("raise_, status, typ", [
    ("raise ValueError('weights missing')", 500, "ValueError"),
    ("raise MemoryError('no room')", 507, "MemoryError"),
    ("import not_a_module_kiln", 500, "ModuleNotFoundError"),
])
def test_load_failures(start, raise_, status, typ):
    w = start({"inference.py": "def predict_fn(data, model): return data\n"
                               "def model_fn(model_dir):\n    %s\n" % raise_},
              expect_ready=False)
    ftype, meta, _ = w.first
    assert ftype == LOAD_FAILED and meta["status"] == status and meta["type"] == typ
    assert w.proc.wait(timeout=20) == 1
    assert "Traceback" in w.proc.stderr.read().decode()


def test_generic_without_a_program_or_predict_fn_fails_clearly(start, tmp_path):
    w = start({}, expect_ready=False)
    ftype, meta, _ = w.first
    assert ftype == LOAD_FAILED and "model_fn" in meta["message"]
    assert "inference.py" in meta["message"]
    w2 = start({"inference.py": "def model_fn(d): return 1\n"}, expect_ready=False,
               model_dir=str(tmp_path / "m2"))
    assert w2.first[0] == LOAD_FAILED and "predict_fn" in w2.first[1]["message"]


def test_handler_arity_mismatch_fails_to_load(start):
    w = start({"inference.py": """
        def model_fn(model_dir): return 1
        def predict_fn(data): return data
    """}, expect_ready=False)
    assert w.first[0] == LOAD_FAILED and "predict_fn takes 1 arguments" in w.first[1]["message"]


# --------------------------------------------------------------------------------------------
# Dynamic batching.

BATCH_MODEL = """
    import json
    import numpy as np
    CALLS = []
    def model_fn(model_dir): return None
    def predict_fn(data, model):
        CALLS.append(data.shape[0])
        return data * 10
    def output_fn(prediction, accept):
        return json.dumps({"rows": prediction.tolist(), "calls": CALLS})
"""


def test_batch_is_stacked_into_one_predict_and_split_by_rows(start):
    w = start({"inference.py": BATCH_MODEL})
    out = w.invoke((b"[[1, 2]]", JSONH), (b"[[3, 4], [5, 6]]", JSONH), (b"[[7, 8]]", JSONH))
    assert [m["status"] for m, _ in out] == [200, 200, 200]
    res = [json.loads(b) for _, b in out]
    assert [r["rows"] for r in res] == [[[10, 20]], [[30, 40], [50, 60]], [[70, 80]]]
    assert res[0]["calls"] == [4]  # one predict_fn call over the 4 stacked rows


def test_batch_isolates_item_errors_and_predicts_unstackable_one_by_one(start):
    w = start({"inference.py": BATCH_MODEL})
    out = w.invoke((b"[[1, 2]]", JSONH), (b"{broken", JSONH), (b"[[3, 4]]", JSONH))
    assert out[1][0]["status"] == 400
    assert json.loads(out[0][1]) == {"rows": [[10, 20]], "calls": [2]}
    assert json.loads(out[2][1])["rows"] == [[30, 40]]
    # Different trailing shapes: predicted one by one.
    out = w.invoke((b"[[1, 2]]", JSONH), (b"[[3, 4, 5]]", JSONH))
    assert [json.loads(b)["rows"] for _, b in out] == [[[10, 20]], [[30, 40, 50]]]
    assert json.loads(out[1][1])["calls"] == [2, 1, 1]


def test_batch_with_a_failing_stacked_predict_answers_each_item(start):
    w = start({"inference.py": """
        import numpy as np
        def model_fn(model_dir): return None
        def predict_fn(data, model):
            if (data < 0).any():
                raise ValueError("negative input")
            return data + 1
    """})
    out = w.invoke((b"[[1]]", JSONH), (b"[[-1]]", JSONH))
    assert out[0][1] == b"[[2]]"
    assert err(out[1]) == (500, "ValueError", "negative input")


# --------------------------------------------------------------------------------------------
# Framework defaults.

def test_pytorch_default_model_fn_with_torchscript(start, tmp_path):
    import numpy as np
    import torch
    lin = torch.nn.Linear(2, 1)
    with torch.no_grad():
        lin.weight.copy_(torch.tensor([[1.0, 2.0]]))
        lin.bias.fill_(0.5)
    path = str(tmp_path / "model.pt")
    torch.jit.save(torch.jit.script(lin), path)
    with open(path, "rb") as f:
        w = start(framework="pytorch", model_files={"model.pt": f.read()})
    meta, body = w.one(b"[[1, 1], [2, 0]]", **JSONH)
    assert meta["status"] == 200 and json.loads(body) == [[3.5], [2.5]]
    buf = io.BytesIO()
    np.save(buf, np.array([[0, 1]], dtype=np.float32))
    meta, body = w.one(buf.getvalue(), content_type="application/x-npy",
                       accept="application/x-npy")
    assert np.load(io.BytesIO(body)).tolist() == [[2.5]]
    out = w.invoke((b"[[1, 0]]", JSONH), (b"0,1\n1,1\n", {"content_type": "text/csv"}))
    assert json.loads(out[0][1]) == [[1.5]]
    assert json.loads(out[1][1]) == [[2.5], [3.5]]


def test_sklearn_default_with_model_joblib(start, tmp_path):
    import joblib
    from sklearn.linear_model import LinearRegression
    model = LinearRegression().fit([[0.0], [1.0], [2.0]], [1.0, 3.0, 5.0])
    path = str(tmp_path / "model.joblib")
    joblib.dump(model, path)
    with open(path, "rb") as f:
        w = start(framework="sklearn", model_files={"model.joblib": f.read()})
    meta, body = w.one(b"3\n4\n", content_type="text/csv", accept="text/csv")
    assert meta["status"] == 200 and meta["content_type"] == "text/csv"
    assert [round(float(x), 4) for x in body.split()] == [7.0, 9.0]
    w2 = start(framework="sklearn", expect_ready=False, model_dir=str(tmp_path / "empty"))
    assert w2.first[0] == LOAD_FAILED and "model_fn" in w2.first[1]["message"]


def test_xgboost_default_with_a_native_booster(start, tmp_path):
    xgb = pytest.importorskip("xgboost")
    import numpy as np
    x = np.array([[0.0], [1.0], [2.0], [3.0]])
    booster = xgb.train({"max_depth": 1, "eta": 1.0}, xgb.DMatrix(x, label=[0, 0, 1, 1]),
                        num_boost_round=1)
    path = str(tmp_path / "b.json")
    booster.save_model(path)
    with open(path, "rb") as f:
        w = start(framework="xgboost", model_files={"xgboost-model": f.read()})
    meta, body = w.one(b"0\n3\n", content_type="text/csv")
    assert meta["status"] == 200
    got = json.loads(body)
    assert len(got) == 2 and got[0] < got[1]


# --------------------------------------------------------------------------------------------
# Code location and prepare.

def _tarball(path, files):
    with tarfile.open(path, "w:gz") as tar:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))


def _prepare(tmp_path, env, name="m"):
    e = dict(os.environ, SAGEMAKER_BASE_DIR=str(tmp_path / "base"), **env)
    return subprocess.run([PYTHON, WORKER, "prepare", "--model-dir", str(tmp_path / "model"),
                           "--model-name", name], env=e, capture_output=True, text=True,
                          timeout=120)


def test_submit_directory_tarball_is_staged_by_prepare(start, tmp_path):
    tar = str(tmp_path / "sourcedir.tar.gz")
    _tarball(tar, {"serve.py": b"import helper\ndef model_fn(d): return helper.K\n"
                                b"def transform_fn(m, data, ct, acc): return str(m)\n",
                   "helper.py": b"K = 41\n"})
    env = {"SAGEMAKER_SUBMIT_DIRECTORY": tar, "SAGEMAKER_PROGRAM": "serve.py"}
    os.makedirs(tmp_path / "model", exist_ok=True)
    # Without prepare the worker says what is missing.
    w = start(env=env, expect_ready=False)
    assert w.first[0] == LOAD_FAILED and "prepare" in w.first[1]["message"]
    r = _prepare(tmp_path, env)
    assert r.returncode == 0, r.stderr
    assert os.path.isfile(tmp_path / "base" / ".kiln" / "submit-code" / "m" / "serve.py")
    w = start(env=env)
    assert w.one(b"x", **JSONH)[1] == b"41"


def test_submit_directory_s3_uri_is_fetched_from_the_configured_endpoint(start, tmp_path):
    """prepare downloads sourcedir.tar.gz with boto3 from AWS_ENDPOINT_URL_S3 (Debian's boto3 1.26
    does not read it itself); a stdlib HTTP server stands in for S3."""
    pytest.importorskip("boto3")
    import http.server
    import threading
    tar = str(tmp_path / "sourcedir.tar.gz")
    _tarball(tar, {"inference.py": b"def model_fn(d): return 'from s3'\n"
                                   b"def transform_fn(m, data, ct, acc): return m\n"})
    with open(tar, "rb") as f:
        blob = f.read()
    paths = []

    class S3(http.server.BaseHTTPRequestHandler):
        def _head(self):
            paths.append((self.command, self.path))
            ok = self.path.split("?")[0] == "/bucket/jobs/sourcedir.tar.gz"
            self.send_response(200 if ok else 404)
            self.send_header("Content-Length", str(len(blob) if ok else 0))
            self.send_header("ETag", '"0123456789abcdef0123456789abcdef"')
            self.send_header("Last-Modified", "Wed, 02 Dec 2026 00:00:00 GMT")
            self.end_headers()
            return ok

        def do_HEAD(self):
            self._head()

        def do_GET(self):
            if self._head():
                self.wfile.write(blob)

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), S3)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        env = {"SAGEMAKER_SUBMIT_DIRECTORY": "s3://bucket/jobs/sourcedir.tar.gz",
               "AWS_ENDPOINT_URL_S3": "http://127.0.0.1:%d" % server.server_address[1],
               "AWS_ACCESS_KEY_ID": "AKIDEXAMPLE", "AWS_SECRET_ACCESS_KEY": "secret",
               "AWS_REGION": "us-east-1", "AWS_CONFIG_FILE": os.devnull,
               "AWS_SHARED_CREDENTIALS_FILE": os.devnull}
        os.makedirs(tmp_path / "model", exist_ok=True)
        r = _prepare(tmp_path, env)
        assert r.returncode == 0, r.stderr
        assert ("GET", "/bucket/jobs/sourcedir.tar.gz") in paths
        w = start(env=env)
        assert w.one(b"", **JSONH)[1] == b"from s3"
        # A missing object: exit 1 with the reason.
        env["SAGEMAKER_SUBMIT_DIRECTORY"] = "s3://bucket/missing.tar.gz"
        r = _prepare(tmp_path, env, name="other")
        assert r.returncode == 1 and "s3://bucket/missing.tar.gz" in r.stderr
    finally:
        server.shutdown()
        server.server_close()


def test_prepare_refuses_a_tarball_escaping_its_directory(tmp_path):
    tar = str(tmp_path / "evil.tar.gz")
    _tarball(tar, {"../../escaped.py": b"x = 1\n"})
    r = _prepare(tmp_path, {"SAGEMAKER_SUBMIT_DIRECTORY": tar})
    assert r.returncode == 1 and "outside" in r.stderr
    assert not os.path.exists(tmp_path / "base" / "escaped.py")
    assert not os.path.exists(tmp_path / "escaped.py")


def test_submit_directory_as_a_local_directory(start, tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    (src / "inference.py").write_text(
        "def model_fn(d): return 'local'\ndef transform_fn(m, d, c, a): return m\n")
    w = start(env={"SAGEMAKER_SUBMIT_DIRECTORY": str(src)})
    assert w.one(b"", **JSONH)[1] == b"local"


def test_submit_directory_in_the_containers_model_path_means_this_model(start):
    # PyTorchModel repacks the code into model.tar.gz and sets /opt/ml/model/code.
    w = start({"inference.py": "def model_fn(d): return 'repacked'\n"
                               "def transform_fn(m, d, c, a): return m\n"},
              env={"SAGEMAKER_SUBMIT_DIRECTORY": "/opt/ml/model/code"})
    assert w.one(b"", **JSONH)[1] == b"repacked"


def _wheel(path, module, source):
    """A minimal pure-Python wheel (pip installs it offline)."""
    dist = "%s-1.0.dist-info" % module
    files = {
        "%s.py" % module: source,
        "%s/METADATA" % dist: "Metadata-Version: 2.1\nName: %s\nVersion: 1.0\n" % module,
        "%s/WHEEL" % dist: "Wheel-Version: 1.0\nGenerator: kiln-test\nRoot-Is-Purelib: true\n"
                           "Tag: py3-none-any\n",
    }
    files["%s/RECORD" % dist] = "".join("%s,,\n" % n for n in list(files) + ["%s/RECORD" % dist])
    with zipfile.ZipFile(path, "w") as z:
        for n, data in files.items():
            z.writestr(n, data)


def test_prepare_installs_requirements_into_kiln_pip_target(start, tmp_path):
    pytest.importorskip("pip")
    whl = tmp_path / "kilnreqpkg-1.0-py3-none-any.whl"
    _wheel(str(whl), "kilnreqpkg", "VALUE = 'from requirements'\n")
    target = tmp_path / "site"
    code = tmp_path / "model" / "code"
    code.mkdir(parents=True)
    (code / "requirements.txt").write_text("--no-index\n%s\n" % whl)
    (code / "inference.py").write_text(
        "import kilnreqpkg\ndef model_fn(d): return kilnreqpkg.VALUE\n"
        "def transform_fn(m, d, c, a): return m\n")
    env = {"KILN_PIP_TARGET": str(target), "PIP_DISABLE_PIP_VERSION_CHECK": "1"}
    r = _prepare(tmp_path, env)
    assert r.returncode == 0, r.stderr
    assert (target / "kilnreqpkg.py").exists()
    w = start(env=env)
    assert w.one(b"", **JSONH)[1] == b"from requirements"


def test_prepare_without_pip_logs_the_skip(tmp_path):
    code = tmp_path / "model" / "code"
    code.mkdir(parents=True)
    (code / "requirements.txt").write_text("some-package==1.0\n")
    # -S: no site-packages, so Debian's pip is not importable.
    r = subprocess.run([PYTHON, "-S", WORKER, "prepare", "--model-dir", str(tmp_path / "model")],
                       env=dict(os.environ, SAGEMAKER_BASE_DIR=str(tmp_path / "base")),
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert "pip is not importable" in r.stderr and "requirements.txt was not installed" in r.stderr


# --------------------------------------------------------------------------------------------
# Process lifecycle.

def test_sigterm_finishes_the_request_in_progress(start):
    w = start({"inference.py": """
        import time
        def model_fn(model_dir): return None
        def transform_fn(model, data, content_type, accept):
            time.sleep(0.5)
            return b"finished"
    """})
    w.sock.sendall(frame(INVOKE, {"id": 1, "items": [dict(JSONH, size=1)]}, b"x"))
    time.sleep(0.2)
    w.proc.send_signal(signal.SIGTERM)
    ftype, meta, body = read_frame(w.sock)
    assert ftype == RESULT and body == b"finished"
    assert w.proc.wait(timeout=20) == 0


def test_sigterm_while_idle_exits_0(start):
    w = start({"inference.py": NUMPY_MODEL})
    w.proc.send_signal(signal.SIGTERM)
    assert w.proc.wait(timeout=20) == 0


def test_a_protocol_error_ends_the_worker_with_1(start):
    w = start({"inference.py": NUMPY_MODEL})
    w.sock.sendall(frame(9, {}))  # no such frame type
    assert w.proc.wait(timeout=20) == 1
    assert "protocol error" in w.proc.stderr.read().decode()


def test_result_frame_bytes_are_exact(start):
    w = start({"inference.py": """
        def model_fn(model_dir): return None
        def transform_fn(model, data, content_type, accept): return data.upper(), "text/x"
    """})
    w.sock.sendall(frame(INVOKE, {"id": 9, "items": [{"content_type": "text/csv", "size": 3}]},
                         b"a,b"))
    head = recv_exact(w.sock, 9)
    rest, ftype, meta_len = struct.unpack(">IBI", head)
    rest_bytes = recv_exact(w.sock, rest - 5)
    assert ftype == RESULT and rest == 5 + meta_len + 3 and rest_bytes[meta_len:] == b"A,B"
    assert json.loads(rest_bytes[:meta_len]) == {
        "id": 9, "items": [{"status": 200, "content_type": "text/x", "size": 3}]}


@pytest.mark.parametrize("visible,index,gpu", [("void", "3", None), ("0,1", "3", 1), ("GPU-a,GPU-b,GPU-c", "4", 1),
                                                ("2", "0", 0), ("all", "1", None)])
def test_workers_spread_over_the_instances_gpus(start, visible, index, gpu):
    # Worker i of a model gets GPU i mod (GPUs in NVIDIA_VISIBLE_DEVICES), as TorchServe's workers do;
    # the handler sees it as context.system_properties["gpu_id"].
    w = start({"inference.py": """
        import json
        def model_fn(model_dir):
            return None
        def transform_fn(model, data, content_type, accept, context):
            return json.dumps(context.system_properties["gpu_id"])
    """}, env={"NVIDIA_VISIBLE_DEVICES": visible, "KILN_MODEL_SERVER_WORKER_INDEX": index})
    meta, body = w.one(b"{}", content_type="application/json", accept="application/json")
    assert meta["status"] == 200 and json.loads(body) == gpu
