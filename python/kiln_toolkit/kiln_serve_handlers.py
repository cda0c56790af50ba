"""The user's handlers with the SageMaker inference toolkit's semantics (serving contract §6;
sagemaker_inference.transformer.Transformer), the frameworks' defaults (DefaultPytorchInference
Handler, the scikit-learn and XGBoost containers' serving modules) and dynamic batching
(src/modelserver/README.md, "Worker protocol").

Standard library at import; numpy / torch / joblib / xgboost are imported while loading, and only
when a default in use needs them. Everything a request needs (functions, whether each takes a
context, the default accept) is resolved once in Handlers.load(); invoke() keeps nothing.
"""

import importlib
import inspect
import json
import logging
import os
import pickle
import sys
import traceback

import kiln_serve_codecs as codecs
from kiln_serve_codecs import (
    BadRequestError, InferenceError, message_of, status_of)
from kiln_serve_frames import RESULT, ProtocolError, encode_frame

log = logging.getLogger("kiln.serve_worker")

FRAMEWORKS = ("", "generic", "pytorch", "sklearn", "xgboost", "tensorflow", "huggingface", "mxnet")

_PROVIDE_MODEL_FN = ("Please provide a model_fn implementation: define model_fn(model_dir) in %s "
                     "(SAGEMAKER_PROGRAM names the file). See documentation for model_fn at "
                     "https://github.com/aws/sagemaker-python-sdk")


class LoadError(Exception):
    """The model cannot be served as configured (message says what to change)."""


# --------------------------------------------------------------------------------------------
# Context: the subset of the MMS / TorchServe Context that handlers taking a trailing `context`
# argument use (system_properties, request headers, response status and headers).

HEADER_NAMES = (("content_type", "Content-Type"), ("accept", "Accept"),
                ("custom_attributes", "X-Amzn-SageMaker-Custom-Attributes"),
                ("inference_id", "X-Amzn-SageMaker-Inference-Id"),
                ("target_model", "X-Amzn-SageMaker-Target-Model"))


class _RequestProcessor:
    __slots__ = ("_item",)

    def __init__(self, item):
        self._item = item

    def get_request_properties(self):
        return {h: self._item[k] for k, h in HEADER_NAMES if k in self._item}

    def get_request_property(self, key):
        key = key.lower()
        for k, v in self.get_request_properties().items():
            if k.lower() == key:
                return v
        return None


class Context:
    """Per request (or per batch for a batched predict_fn): model_name, system_properties,
    request_ids, request_processor[idx].get_request_properties(), get_request_header(idx, name),
    set_response_status(code, phrase, idx), set_response_header(idx, name, value) (the custom
    attributes header reaches the client), plus custom_attributes / inference_id of item 0."""

    def __init__(self, shared, items, responses, invoke_id=None):
        self.model_name = shared.model_name
        self.system_properties = shared.system_properties
        self.manifest = {"model": {"modelName": shared.model_name}}
        self._items = items
        self._responses = responses
        self._invoke_id = invoke_id

    @property
    def request_processor(self):
        return [_RequestProcessor(i) for i in self._items]

    @property
    def request_ids(self):
        return {i: self.get_request_id(i) for i in range(len(self._items))}

    def get_request_id(self, idx=0):
        item = self._items[idx]
        return item.get("inference_id") or "%s-%d" % (self._invoke_id, idx)

    def get_request_header(self, idx, key):
        return _RequestProcessor(self._items[idx]).get_request_property(key)

    def get_all_request_header(self, idx):
        return _RequestProcessor(self._items[idx]).get_request_properties()

    @property
    def custom_attributes(self):
        return self._items[0].get("custom_attributes") if self._items else None

    @property
    def inference_id(self):
        return self._items[0].get("inference_id") if self._items else None

    def set_response_status(self, code=200, phrase="", idx=0):
        self._responses[idx]["status"] = int(code)

    def set_response_content_type(self, idx, value):
        pass  # the transformer sets it after the handler (toolkit behaviour): accept or tuple

    def set_response_header(self, idx, key, value):
        if key.lower() == "x-amzn-sagemaker-custom-attributes":
            self._responses[idx]["custom_attributes"] = str(value)

    def get_response_status(self, idx=0):
        return self._responses[idx].get("status", 200)


class _Shared:
    def __init__(self, model_name, model_dir, system_properties):
        self.model_name = model_name
        self.model_dir = model_dir
        self.system_properties = system_properties


# --------------------------------------------------------------------------------------------
# Framework defaults. Each output_fn returns (bytes, content_type).

class GenericDefaults:
    """sagemaker_inference.DefaultInferenceHandler: codecs only; no model_fn, no predict_fn."""
    name = "generic"
    has_model_fn = False
    has_predict_fn = False

    def __init__(self, model_dir, gpu_id=None):
        self.model_dir = model_dir
        self.gpu_id = gpu_id

    def setup(self, need_codecs):
        if need_codecs:
            try:
                codecs.load_numpy()
            except ImportError:
                raise LoadError("The default input_fn/output_fn need numpy, which this "
                                "interpreter cannot import: define input_fn and output_fn (or "
                                "transform_fn), or use an environment with numpy.")

    def model_fn(self, model_dir):
        raise LoadError(_PROVIDE_MODEL_FN % "inference.py")

    def input_fn(self, data, content_type):
        return codecs.decode(data, content_type)

    def predict_fn(self, data, model):
        raise NotImplementedError("Please provide a predict_fn implementation.")

    def output_fn(self, prediction, accept):
        return codecs.encode(prediction, accept, "the default output_fn")


def worker_gpu(environ):
    """The GPU this worker uses, as TorchServe assigns them: worker i of a model gets GPU
    i mod (GPUs visible), so N workers spread over the instance's GPUs instead of all sharing the
    first. The pool numbers its workers in KILN_MODEL_SERVER_WORKER_INDEX; the instance's GPUs are
    the entries of NVIDIA_VISIBLE_DEVICES (serving contract §2: indices or UUIDs, "void"/"none"
    for none; the sandbox shows only those, numbered from 0). None without GPUs."""
    visible = (environ.get("NVIDIA_VISIBLE_DEVICES") or "").strip()
    if visible in ("", "void", "none", "all"):
        # "all" names no count: the default PyTorch model_fn then asks torch, and uses the first.
        return None
    count = len([d for d in visible.split(",") if d.strip()])
    try:
        index = int(environ.get("KILN_MODEL_SERVER_WORKER_INDEX") or 0)
    except ValueError:
        index = 0
    return index % count if count else None


class PytorchDefaults(GenericDefaults):
    """DefaultPytorchInferenceHandler: TorchScript model.pt (or the only .pt/.pth file), inputs as
    tensors on the device, predict under no_grad, tensors encoded through numpy."""
    name = "pytorch"
    has_model_fn = True
    has_predict_fn = True

    def setup(self, need_codecs):
        super().setup(need_codecs)
        import torch
        self.torch = torch
        if not torch.cuda.is_available():
            self.device = torch.device("cpu")
        else:
            self.device = torch.device("cuda:%d" % ((self.gpu_id or 0) % torch.cuda.device_count()))

    def model_fn(self, model_dir):
        path = os.path.join(model_dir, "model.pt")
        if not os.path.exists(path):
            files = sorted(f for f in os.listdir(model_dir)
                           if os.path.isfile(os.path.join(model_dir, f))
                           and os.path.splitext(f)[1] in (".pt", ".pth"))
            if len(files) != 1:
                raise LoadError(
                    "The default PyTorch model_fn needs a TorchScript model.pt (or exactly one "
                    ".pt/.pth file) in %s, found %s. Save the model with torch.jit.save, or "
                    "define model_fn(model_dir) in inference.py." % (model_dir, files))
            path = os.path.join(model_dir, files[0])
        try:
            model = self.torch.jit.load(path, map_location=self.device)
        except RuntimeError as e:
            raise LoadError("Failed to load %s. Please ensure model is saved using torchscript "
                            "(torch.jit.save), or define model_fn: %s" % (path, e))
        return model.eval()

    def prepare_model(self, model):
        """The default predict_fn runs the model on the device in eval mode (the toolkit does
        both on every request; once here)."""
        if isinstance(model, self.torch.nn.Module):
            model = model.to(self.device)
            model.eval()
        return model

    def input_fn(self, data, content_type):
        arr = codecs.decode(data, content_type)
        torch = self.torch
        if codecs.media_type(content_type) in codecs.UTF8_TYPES:
            try:
                t = torch.FloatTensor(arr)
            except (TypeError, ValueError) as e:
                raise BadRequestError("Could not convert the request to a float32 tensor: %s" % e)
        else:
            if not arr.flags.writeable:
                arr = arr.copy()  # np.load over bytes is read-only; torch must own its memory
            t = torch.from_numpy(arr)
        return t.to(self.device)

    def predict_fn(self, data, model):
        with self.torch.no_grad():
            if isinstance(data, self.torch.Tensor):
                data = data.to(self.device)
            return model(data)

    def output_fn(self, prediction, accept):
        if isinstance(prediction, self.torch.Tensor):
            prediction = prediction.detach().cpu().numpy()
        return codecs.encode(prediction, accept, "the default output_fn")


class SklearnDefaults(GenericDefaults):
    """sagemaker_sklearn_container.serving: UTF-8 inputs as float32, model.predict. Kiln adds a
    default model_fn for model.joblib (the container has none)."""
    name = "sklearn"
    has_model_fn = True
    has_predict_fn = True

    def model_fn(self, model_dir):
        path = os.path.join(model_dir, "model.joblib")
        if not os.path.exists(path):
            raise LoadError("No model.joblib in %s and no model_fn. " % model_dir
                            + _PROVIDE_MODEL_FN % "inference.py")
        try:
            import joblib
        except ImportError:
            with open(path, "rb") as f:
                return pickle.load(f)
        return joblib.load(path)

    def input_fn(self, data, content_type):
        arr = codecs.decode(data, content_type)
        if codecs.media_type(content_type) in codecs.UTF8_TYPES:
            try:
                return arr.astype(codecs.np.float32)
            except (TypeError, ValueError) as e:
                raise BadRequestError("Could not convert the request to float32: %s" % e)
        return arr

    def predict_fn(self, data, model):
        return model.predict(data)


class XgboostDefaults(SklearnDefaults):
    """sagemaker_xgboost_container serving: the model file `xgboost-model` (native Booster or
    pickle; else the only file in the model directory), predictions through a DMatrix."""
    name = "xgboost"

    def setup(self, need_codecs):
        super().setup(need_codecs)
        import xgboost
        self.xgb = xgboost

    def model_fn(self, model_dir):
        path = os.path.join(model_dir, "xgboost-model")
        if not os.path.exists(path):
            files = sorted(f for f in os.listdir(model_dir)
                           if os.path.isfile(os.path.join(model_dir, f)))
            if len(files) != 1:
                raise LoadError("The default XGBoost model_fn needs %s (a Booster saved with "
                                "save_model, or a pickle), found %s; or define model_fn."
                                % (path, files))
            path = os.path.join(model_dir, files[0])
        try:
            booster = self.xgb.Booster()
            booster.load_model(path)
            return booster
        except Exception as native_error:  # noqa: BLE001 - any failure: try the pickle format
            try:
                with open(path, "rb") as f:
                    return pickle.load(f)
            except Exception as pickle_error:  # noqa: BLE001
                raise LoadError("Unable to load the XGBoost model %s: %s; as a pickle: %s"
                                % (path, native_error, pickle_error))

    def predict_fn(self, data, model):
        if isinstance(model, self.xgb.Booster):
            return model.predict(self.xgb.DMatrix(data), validate_features=False)
        return model.predict(data)


DEFAULTS = {"pytorch": PytorchDefaults, "sklearn": SklearnDefaults, "xgboost": XgboostDefaults}


# --------------------------------------------------------------------------------------------
# Handler functions, each with whether it takes the trailing context (cached at load).

def takes_context(fn, name, nargs):
    """Whether fn takes a trailing context argument: by its parameter count, as the toolkit's
    _run_handler_function decides (counted once, at load). LoadError for any other count."""
    try:
        params = list(inspect.signature(fn).parameters.values())
    except (TypeError, ValueError):
        return False
    if any(p.kind == p.VAR_POSITIONAL for p in params):
        return False
    if len(params) == nargs:
        return False
    if len(params) == nargs + 1:
        return True
    raise LoadError("%s takes %d arguments but %d were given (%d with the optional context)."
                    % (name, len(params), nargs, nargs + 1))


class Fn:
    __slots__ = ("fn", "ctx", "name")

    def __init__(self, fn, name, nargs, user):
        self.fn = fn
        self.name = name
        self.ctx = takes_context(fn, name, nargs) if user else False


def _error_item(exc):
    """(meta, body) of an error answer; the traceback goes to stderr."""
    traceback.print_exc()
    status = status_of(exc)
    body = json.dumps({"code": status, "type": type(exc).__name__,
                       "message": message_of(exc)}).encode()
    return {"status": status, "content_type": codecs.JSON, "size": len(body)}, body


def _body_of(result, accept, fn_name):
    """(bytes, content_type) of what output_fn / transform_fn returned."""
    content_type = accept
    if type(result) is tuple:
        if len(result) != 2:
            raise InferenceError("%s returned a tuple of %d elements; it must return bytes, str "
                                 "or a (body, content_type) tuple" % (fn_name, len(result)))
        result, content_type = result
        content_type = str(content_type)
    t = type(result)
    if t is bytes:
        return result, content_type
    if t is str:
        return result.encode(), content_type
    if isinstance(result, (bytes, bytearray, memoryview)):
        return bytes(result), content_type
    if isinstance(result, str):
        return str(result).encode(), content_type
    raise InferenceError("%s returned a body of type %s; it must return bytes, str or a "
                         "(body, content_type) tuple" % (fn_name, t.__name__))


class Handlers:
    def __init__(self, model_dir, model_name, framework, code_dir, environ):
        self.model_dir = model_dir
        self.model_name = model_name
        self.framework = (framework or "").lower()
        if self.framework not in FRAMEWORKS:
            raise LoadError("Unknown framework %r: use one of %s"
                            % (framework, ", ".join(f for f in FRAMEWORKS if f)))
        self.code_dir = code_dir
        self.environ = environ
        self.default_accept = environ.get("SAGEMAKER_DEFAULT_INVOCATIONS_ACCEPT") or codecs.JSON
        program = environ.get("SAGEMAKER_PROGRAM") or "inference.py"
        self.program = program
        self.module_name = program[:-3] if program.endswith(".py") else program
        self.gpu_id = worker_gpu(environ)
        self.shared = _Shared(model_name, model_dir, {
            "model_dir": model_dir, "gpu_id": self.gpu_id, "batch_size": 1,
            "server_name": "kiln-model-server", "server_version": "1"})
        self.model = None

    # ---------------------------------------------------------------- load

    def _user_module(self):
        """The user module, or None when the code dir has no such program."""
        d = self.code_dir
        found = d and (os.path.isfile(os.path.join(d, self.module_name + ".py"))
                       or os.path.isfile(os.path.join(d, self.module_name, "__init__.py")))
        if not found:
            return None
        return importlib.import_module(self.module_name.replace("/", "."))

    def load(self):
        module = self._user_module()
        defaults = DEFAULTS.get(self.framework, GenericDefaults)(self.model_dir, self.gpu_id)
        where = os.path.join(self.code_dir or os.path.join(self.model_dir, "code"), self.program)
        if module is None:
            log.info("No %s: serving with the %s defaults", where, defaults.name)

        def user(name):
            return getattr(module, name, None) if module is not None else None

        transform_fn, input_fn = user("transform_fn"), user("input_fn")
        predict_fn, output_fn = user("predict_fn"), user("output_fn")
        model_fn = user("model_fn")
        if transform_fn and (input_fn or predict_fn or output_fn):
            raise LoadError("Cannot use transform_fn implementation in conjunction with input_fn, "
                            "predict_fn, and/or output_fn implementation")
        if model_fn is None and not defaults.has_model_fn:
            raise LoadError(_PROVIDE_MODEL_FN % where if module is not None else
                            "No %s found, and the %s framework has no default model_fn: provide "
                            "that file with model_fn(model_dir) and predict_fn (or transform_fn) "
                            "(SAGEMAKER_PROGRAM names the file, SAGEMAKER_SUBMIT_DIRECTORY the "
                            "code location)"
                            % (where, defaults.name))
        if not transform_fn and predict_fn is None and not defaults.has_predict_fn:
            raise LoadError("The %s framework has no default predict_fn: define predict_fn(data, "
                            "model) or transform_fn(model, data, content_type, accept) in %s"
                            % (defaults.name, where))
        need_codecs = not transform_fn and (input_fn is None or output_fn is None)
        need_framework = (model_fn is None or (not transform_fn and (
            input_fn is None or predict_fn is None or output_fn is None)))
        if need_framework or need_codecs:
            defaults.setup(need_codecs)

        self.transform_fn = Fn(transform_fn, "transform_fn", 4, True) if transform_fn else None
        self.input_fn = Fn(input_fn or defaults.input_fn, "input_fn", 2, input_fn is not None)
        self.predict_fn = Fn(predict_fn or defaults.predict_fn, "predict_fn", 2,
                             predict_fn is not None)
        self.output_fn = Fn(output_fn or defaults.output_fn, "output_fn", 2,
                            output_fn is not None)
        self.default_output = output_fn is None
        fns = [self.input_fn, self.predict_fn, self.output_fn, self.transform_fn]
        self.needs_context = any(f is not None and f.ctx for f in fns)

        load_ctx = Context(self.shared, [], [])
        pre = user("pre_model_fn")
        if pre:
            self._call(Fn(pre, "pre_model_fn", 1, True), load_ctx, self.model_dir)
        mf = Fn(model_fn or defaults.model_fn, "model_fn", 1, model_fn is not None)
        model = self._call(mf, load_ctx, self.model_dir)
        if predict_fn is None and not transform_fn and hasattr(defaults, "prepare_model"):
            model = defaults.prepare_model(model)
        warm = user("model_warmup_fn")
        if warm:
            self._call(Fn(warm, "model_warmup_fn", 2, True), load_ctx, self.model_dir, model)
        self.model = model

    @staticmethod
    def _call(f, ctx, *args):
        if f.ctx:
            return f.fn(*args, ctx)
        return f.fn(*args)

    # ---------------------------------------------------------------- requests

    def invoke(self, meta, payload):
        """The result frame (bytes) for one invoke frame."""
        items = meta.get("items")
        if not isinstance(items, list) or not items:
            raise ProtocolError("invoke without items")
        views, off = [], 0
        for item in items:
            size = item.get("size", 0)
            views.append(payload[off:off + size])
            off += size
        if off != len(payload):
            raise ProtocolError("invoke item sizes add up to %d, payload has %d bytes"
                                % (off, len(payload)))
        invoke_id = meta.get("id")
        if len(items) == 1:
            answers = [self._one(items[0], views[0], invoke_id)]
        else:
            answers = self._batch(items, views, invoke_id)
        metas, bodies = [], []
        for m, b in answers:
            metas.append(m)
            bodies.append(b)
        return encode_frame(RESULT, {"id": invoke_id, "items": metas}, bodies)

    def _request(self, item, view):
        """(body as str or bytes, content_type, accept) of one item."""
        content_type = item.get("content_type")
        accept = item.get("accept")
        if not accept or accept == codecs.ANY:
            accept = self.default_accept
        if codecs.media_type(content_type) in codecs.UTF8_TYPES:
            try:
                data = str(view, "utf-8")
            except UnicodeDecodeError as e:
                raise BadRequestError("The request body is not UTF-8 (%s): %s"
                                      % (content_type, e))
        else:
            data = bytes(view)
        return data, content_type, accept

    def _answer(self, result, accept, fn_name, response):
        body, content_type = _body_of(result, accept, fn_name)
        meta = {"status": response.get("status", 200) if response else 200,
                "content_type": content_type, "size": len(body)}
        if response and "custom_attributes" in response:
            meta["custom_attributes"] = response["custom_attributes"]
        return meta, body

    def _one(self, item, view, invoke_id):
        response = {} if self.needs_context else None
        ctx = Context(self.shared, [item], [response], invoke_id) if response is not None else None
        call = self._call
        try:
            data, content_type, accept = self._request(item, view)
            if self.transform_fn is not None:
                result = call(self.transform_fn, ctx, self.model, data, content_type, accept)
                return self._answer(result, accept, "transform_fn", response)
            decoded = call(self.input_fn, ctx, data, content_type)
            prediction = call(self.predict_fn, ctx, decoded, self.model)
            result = call(self.output_fn, ctx, prediction, accept)
            return self._answer(result, accept, "output_fn", response)
        except Exception as e:  # noqa: BLE001 - every handler error is an answer
            return _error_item(e)

    # ---------------------------------------------------------------- dynamic batching

    def _batch(self, items, views, invoke_id):
        if self.transform_fn is not None:
            return [self._one(i, v, invoke_id) for i, v in zip(items, views)]
        n = len(items)
        answers = [None] * n
        responses = [{} for _ in range(n)] if self.needs_context else [None] * n
        ctxs = [Context(self.shared, [items[i]], [responses[i]], invoke_id)
                if self.needs_context else None for i in range(n)]
        call = self._call
        ok = []  # (index, decoded input, accept)
        for i in range(n):
            try:
                data, content_type, accept = self._request(items[i], views[i])
                ok.append((i, call(self.input_fn, ctxs[i], data, content_type), accept))
            except Exception as e:  # noqa: BLE001 - this item only
                answers[i] = _error_item(e)
        parts = None
        if len(ok) > 1:
            stacked = _stack([d for _, d, _ in ok])
            if stacked is not None:
                batch, counts = stacked
                bctx = (Context(self.shared, [items[i] for i, _, _ in ok],
                                [responses[i] for i, _, _ in ok], invoke_id)
                        if self.needs_context else None)
                try:
                    parts = _split(call(self.predict_fn, bctx, batch, self.model), counts)
                    if parts is None:
                        log.warning("predict_fn returned a batch that does not split into %d "
                                    "rows; predicting the %d requests one by one",
                                    sum(counts), len(counts))
                except Exception:  # noqa: BLE001 - retried per item, each gets its own answer
                    log.warning("batched predict_fn failed; predicting the %d requests one by "
                                "one:\n%s", len(counts), traceback.format_exc())
        for k, (i, decoded, accept) in enumerate(ok):
            try:
                if parts is not None:
                    prediction = parts[k]
                else:
                    prediction = call(self.predict_fn, ctxs[i], decoded, self.model)
                result = call(self.output_fn, ctxs[i], prediction, accept)
                answers[i] = self._answer(result, accept, "output_fn", responses[i])
            except Exception as e:  # noqa: BLE001
                answers[i] = _error_item(e)
        return answers


def _stack(inputs):
    """(one input, rows per item) when every input is a NumPy array (or every one a torch tensor)
    with at least 2 dimensions, one dtype (and device) and equal trailing shape; else None."""
    first = inputs[0]
    np = sys.modules.get("numpy")
    if np is not None and type(first) is np.ndarray:
        if first.ndim < 2:
            return None
        for x in inputs:
            if type(x) is not np.ndarray or x.dtype != first.dtype or x.shape[1:] != first.shape[1:]:
                return None
        return np.concatenate(inputs), [x.shape[0] for x in inputs]
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(first, torch.Tensor):
        if first.dim() < 2:
            return None
        for x in inputs:
            if (not isinstance(x, torch.Tensor) or x.dtype != first.dtype
                    or x.device != first.device or x.shape[1:] != first.shape[1:]):
                return None
        return torch.cat(inputs), [x.shape[0] for x in inputs]
    return None


def _split(prediction, counts):
    """The prediction cut into consecutive row ranges of counts; None when it has another number
    of rows (or no rows to cut)."""
    total = sum(counts)
    try:
        if len(prediction) != total:
            return None
    except TypeError:
        return None
    if isinstance(prediction, (str, bytes, dict)):
        return None
    parts, off = [], 0
    for c in counts:
        parts.append(prediction[off:off + c])
        off += c
    return parts
