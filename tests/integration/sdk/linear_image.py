#!/usr/bin/python3
"""A bring-your-own-container image for the SDK tests (image `local:<this file>`): Kiln runs it as
`<this file> train` for a training job and `<this file> serve` for an endpoint instance, as
`docker run IMAGE train|serve`. Standard library only.

train: least squares y = w.x + b over /opt/ml/input/data/train/*.csv (rows "y,x1,...,xn");
  writes /opt/ml/model/model.json {"w": [w1, ...], "b": b} and prints "fitted w=[...] b=...".

serve: the model is /opt/ml/model/model.json; a prediction is w.x + b.
User code: when SAGEMAKER_PROGRAM is set (Model(entry_point=...) sets it, with
SAGEMAKER_SUBMIT_DIRECTORY=/opt/ml/model/code after the SDK repacked the model), that module is
imported from the submit directory, as the framework serving containers do, and its
predict_fn(rows, model) makes the predictions instead; "handler" in the answer names it.

POST /invocations
  Content-Type application/json: [[x1, ...], ...] or {"instances": [[x1, ...], ...]}
  Content-Type text/csv: one row per line, comma-separated
  Accept text/csv: one prediction per line; otherwise application/json
    {"predictions": [...], "handler": "default" | <program>, "content_type": <request's>,
     "model_files": [sorted paths under /opt/ml/model]}
GET /ping: 200. SIGTERM exits 0 at once.
"""
import glob
import importlib.util
import json
import os
import signal
import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

MODEL_DIR = "/opt/ml/model"


def load_model():
    with open(os.path.join(MODEL_DIR, "model.json")) as f:
        return json.load(f)


def load_handler():
    program = os.environ.get("SAGEMAKER_PROGRAM")
    if not program:
        return None, "default"
    directory = os.environ.get("SAGEMAKER_SUBMIT_DIRECTORY", os.path.join(MODEL_DIR, "code"))
    if directory.startswith("s3://"):
        directory = os.path.join(MODEL_DIR, "code")
    sys.path.insert(0, directory)
    spec = importlib.util.spec_from_file_location("user_module", os.path.join(directory, program))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.predict_fn, program


def model_files():
    out = []
    for dirpath, _, files in os.walk(MODEL_DIR):
        for fn in files:
            out.append(os.path.relpath(os.path.join(dirpath, fn), MODEL_DIR))
    return sorted(out)


def default_predict(rows, model):
    return [sum(w * x for w, x in zip(model["w"], row)) + model["b"] for row in rows]


MODEL, PREDICT, HANDLER = None, None, "default"


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, fmt, *args):
        sys.stdout.write("linear_image: " + (fmt % args) + "\n")
        sys.stdout.flush()

    def reply(self, status, body, content_type):
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self):
        if self.path == "/ping":
            self.reply(200, b"", "application/json")
        else:
            self.reply(404, b"not found", "text/plain")

    def do_POST(self):
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        if self.path != "/invocations":
            self.reply(404, b"not found", "text/plain")
            return
        content_type = (self.headers.get("Content-Type") or "").split(";")[0].strip()
        try:
            if content_type == "text/csv":
                rows = [[float(v) for v in line.split(",")] for line in body.decode().splitlines() if line.strip()]
            elif content_type == "application/json":
                doc = json.loads(body)
                rows = doc["instances"] if isinstance(doc, dict) else doc
            else:
                self.reply(415, ("unsupported content type %r" % content_type).encode(), "text/plain")
                return
            predictions = (PREDICT or default_predict)(rows, MODEL)
        except Exception as e:  # the client sees what was wrong with its request
            self.reply(400, ("bad request: %r" % e).encode(), "text/plain")
            return
        if "text/csv" in (self.headers.get("Accept") or ""):
            self.reply(200, "".join("%r\n" % p for p in predictions).encode(), "text/csv")
        else:
            answer = {"predictions": predictions, "handler": HANDLER, "content_type": content_type,
                      "model_files": model_files()}
            self.reply(200, json.dumps(answer).encode(), "application/json")


def solve(a, v):
    """x with a x = v (Gaussian elimination with partial pivoting; a is small and well posed)."""
    n = len(v)
    m = [list(row) + [v[i]] for i, row in enumerate(a)]
    for col in range(n):
        pivot = max(range(col, n), key=lambda r: abs(m[r][col]))
        m[col], m[pivot] = m[pivot], m[col]
        for r in range(n):
            if r != col:
                f = m[r][col] / m[col][col]
                m[r] = [x - f * y for x, y in zip(m[r], m[col])]
    return [m[i][n] / m[i][i] for i in range(n)]


def train():
    rows = []
    for path in sorted(glob.glob("/opt/ml/input/data/train/*.csv")):
        with open(path) as f:
            rows += [[float(v) for v in line.split(",")] for line in f if line.strip()]
    xs = [row[1:] + [1.0] for row in rows]  # the bias as a last feature of 1
    n = len(xs[0])
    xtx = [[sum(x[i] * x[j] for x in xs) for j in range(n)] for i in range(n)]
    xty = [sum(x[i] * row[0] for x, row in zip(xs, rows)) for i in range(n)]
    coef = solve(xtx, xty)
    model = {"w": coef[:-1], "b": coef[-1]}
    with open(os.path.join(MODEL_DIR, "model.json"), "w") as f:
        json.dump(model, f)
    print("fitted w=%s b=%.6f on %d rows" % (["%.6f" % w for w in model["w"]], model["b"], len(rows)), flush=True)


def serve():
    global MODEL, PREDICT, HANDLER
    MODEL = load_model()
    PREDICT, HANDLER = load_handler()
    signal.signal(signal.SIGTERM, lambda *_: os._exit(0))
    port = int(os.environ.get("SAGEMAKER_BIND_TO_PORT", "8080"))
    server = ThreadingHTTPServer(("0.0.0.0", port), Handler)
    print("linear_image ready on port %d (handler %s)" % (port, HANDLER), flush=True)
    server.serve_forever()


def main():
    if sys.argv[1:] == ["train"]:
        train()
    elif sys.argv[1:] == ["serve"]:
        serve()
    else:
        sys.exit("usage: %s train|serve" % sys.argv[0])


if __name__ == "__main__":
    main()
