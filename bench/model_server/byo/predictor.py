"""The Flask app of SageMaker's bring-your-own container example
(amazon-sagemaker-examples, advanced_functionality/scikit_bring_your_own/container/decision_trees:
predictor.py), the reference of bench/model_server_bench.py.

As in the example: a ScoringService class loads the model once per worker, GET /ping is 200 when it
loaded, POST /invocations decodes the request, predicts and answers. Instead of the example's
decision tree it calls the handler module <prefix>/model/code/inference.py with the SageMaker
inference toolkit's semantics (the same file Kiln's model server serves): application/json and
text/csv bodies are decoded to str, then input_fn -> predict_fn -> output_fn (or transform_fn);
an (body, content_type) tuple sets the content type, else the Accept value does.

Environment: BENCH_ML_PREFIX (default /opt/ml/, as the example's `prefix`).
"""

import importlib.util
import os

import flask

prefix = os.environ.get("BENCH_ML_PREFIX", "/opt/ml/")
model_path = os.path.join(prefix, "model")
TEXT_TYPES = ("application/json", "text/csv")


class ScoringService(object):
    model = None  # Where we keep the model when it's loaded
    handler = None  # The inference.py module

    @classmethod
    def get_model(cls):
        """Get the model object for this instance, loading it if it's not already loaded."""
        if cls.model is None:
            path = os.path.join(model_path, "code", "inference.py")
            spec = importlib.util.spec_from_file_location("inference", path)
            module = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(module)
            cls.handler = module
            cls.model = module.model_fn(model_path)
        return cls.model

    @classmethod
    def predict(cls, body, content_type, accept):
        """The toolkit's transform: input_fn -> predict_fn -> output_fn, or transform_fn."""
        model = cls.get_model()
        h = cls.handler
        if content_type in TEXT_TYPES:
            body = body.decode("utf-8")
        if hasattr(h, "transform_fn"):
            result = h.transform_fn(model, body, content_type, accept)
        else:
            result = h.output_fn(h.predict_fn(h.input_fn(body, content_type), model), accept)
        if isinstance(result, tuple):
            return result
        return result, accept


# The flask app for serving predictions
app = flask.Flask(__name__)


@app.route("/ping", methods=["GET"])
def ping():
    """Determine if the container is working and healthy. In this sample container, we declare
    it healthy if we can load the model successfully."""
    health = ScoringService.get_model() is not None
    status = 200 if health else 404
    return flask.Response(response="\n", status=status, mimetype="application/json")


@app.route("/invocations", methods=["POST"])
def transformation():
    """Do an inference on a single request."""
    content_type = flask.request.content_type or "application/json"
    accept = flask.request.headers.get("Accept") or "application/json"
    if accept == "*/*":
        accept = "application/json"
    body, out_type = ScoringService.predict(flask.request.data, content_type, accept)
    return flask.Response(response=body, status=200, mimetype=out_type)
