"""Content types, the inference toolkit's errors and its default codecs (sagemaker_inference's
content_types, errors, decoder, encoder, utils.parse_accept), for the model server's worker.

Standard library at import; numpy (and scipy for sparse .npz) are imported by load_numpy(), which
the worker calls at load time only when a default codec is in use.
"""

import csv
import io
import json

JSON = "application/json"
CSV = "text/csv"
NPY = "application/x-npy"
NPZ = "application/x-npz"
OCTET_STREAM = "application/octet-stream"
ANY = "*/*"
UTF8_TYPES = frozenset((JSON, CSV))
DECODABLE = (JSON, CSV, NPY, NPZ)
ENCODABLE = (JSON, CSV, NPY)

np = None  # numpy, once load_numpy() ran


def load_numpy():
    global np
    if np is None:
        import numpy
        np = numpy
    return np


# --------------------------------------------------------------------------------------------
# Errors. Any exception with an integer HTTP status in `status_code` (the toolkit's
# BaseInferenceToolkitError), `http_status` or `status` answers with that status.

class InferenceError(Exception):
    """An error with an HTTP status (BaseInferenceToolkitError of the toolkit)."""
    status_code = 500

    def __init__(self, message, status_code=None):
        super().__init__(message)
        self.message = message
        if status_code is not None:
            self.status_code = status_code


class UnsupportedFormatError(InferenceError):
    """415: no default codec for the request's content type or for any accepted type."""
    status_code = 415

    def __init__(self, content_type):
        super().__init__(
            "Content type %s is not supported by this framework. Please implement input_fn to "
            "deserialize the request data or an output_fn to serialize the response. For more "
            "information, see the SageMaker Python SDK README." % content_type)


class BadRequestError(InferenceError):
    """400: the body does not parse as its content type says."""
    status_code = 400


def status_of(exc):
    for attr in ("status_code", "http_status", "status"):
        v = getattr(exc, attr, None)
        if isinstance(v, int) and not isinstance(v, bool) and 400 <= v <= 599:
            return v
    return 500


def message_of(exc):
    m = getattr(exc, "message", None)
    if not isinstance(m, str) or not m:
        m = str(exc)
    return m or type(exc).__name__


# --------------------------------------------------------------------------------------------
# Header parsing, memoised: the same few header values repeat on every request.

_media_cache = {}
_accept_cache = {}


def media_type(content_type):
    """'Application/JSON; charset=utf-8' → 'application/json' (None stays None)."""
    if content_type is None:
        return None
    m = _media_cache.get(content_type)
    if m is None:
        m = content_type.split(";", 1)[0].strip().lower()
        if len(_media_cache) < 256:
            _media_cache[content_type] = m
    return m


def parse_accept(accept):
    """The media types of an Accept value in the order given (utils.parse_accept; parameters
    such as q-values are dropped, the client's order is kept as the toolkit keeps it)."""
    r = _accept_cache.get(accept)
    if r is None:
        r = tuple(t.split(";", 1)[0].strip().lower() for t in accept.split(","))
        r = tuple(t for t in r if t)
        if len(_accept_cache) < 256:
            _accept_cache[accept] = r
    return r


def first_supported(accept, supported=ENCODABLE):
    """The first media type of accept that is in supported ('*/*' picks the first supported);
    None when there is none."""
    for t in parse_accept(accept):
        if t in supported:
            return t
        if t == ANY:
            return supported[0]
    return None


# --------------------------------------------------------------------------------------------
# Decoders (decoder.py). UTF-8 types arrive as str, others as bytes.

def _json_to_numpy(data, dtype=None):
    try:
        obj = json.loads(data)
    except ValueError as e:
        raise BadRequestError("Could not parse the request body as JSON: %s" % e)
    try:
        return np.array(obj, dtype=dtype)
    except (ValueError, TypeError) as e:
        raise BadRequestError("Could not convert the JSON request body to an array: %s" % e)


def _csv_to_numpy(data, dtype=None):
    """The rows of the CSV as a 2-D array (the toolkit squeezes: one row or one column became 1-D,
    which models given samples as rows reject, and batching needs the row dimension); float64
    when every cell is a number, else the strings, as the toolkit keeps them."""
    try:
        rows = [r for r in csv.reader(io.StringIO(data), delimiter=",", quotechar='"',
                                      doublequote=True, strict=True) if r]
        if not rows or any(len(r) != len(rows[0]) for r in rows):
            raise BadRequestError("The CSV request body must have the same number of cells in "
                                  "every row (and at least one row)")
        array = np.array(rows)
    except (csv.Error, ValueError) as e:
        raise BadRequestError("Could not parse the request body as CSV: %s" % e)
    try:
        return array.astype(dtype if dtype is not None else np.float64)
    except ValueError:
        if dtype is not None:
            raise BadRequestError("Could not convert the CSV request body to %s" % dtype)
        return array


def _npy_to_numpy(data, dtype=None):
    try:
        array = np.load(io.BytesIO(data), allow_pickle=False)
    except (ValueError, OSError, EOFError) as e:
        raise BadRequestError("Could not parse the request body as .npy: %s" % e)
    return array if dtype is None else array.astype(dtype)


def _npz_to_sparse(data, dtype=None):
    try:
        import scipy.sparse
    except ImportError:
        scipy = None
    try:
        if scipy is not None:
            try:
                return scipy.sparse.load_npz(io.BytesIO(data))
            except (ValueError, KeyError):
                pass  # not a sparse matrix archive: the arrays as a dict below
        with np.load(io.BytesIO(data), allow_pickle=False) as z:
            return {k: z[k] for k in z.files}
    except (ValueError, OSError, EOFError) as e:
        raise BadRequestError("Could not parse the request body as .npz: %s" % e)


_DECODERS = {JSON: _json_to_numpy, CSV: _csv_to_numpy, NPY: _npy_to_numpy, NPZ: _npz_to_sparse}


def decode(data, content_type, dtype=None):
    """decoder.decode: the body as an array by its media type; 415 for any other type."""
    d = _DECODERS.get(media_type(content_type))
    if d is None:
        raise UnsupportedFormatError(content_type)
    return d(data, dtype)


# --------------------------------------------------------------------------------------------
# Encoders (encoder.py). Each returns bytes.

def _json_default(obj):
    if hasattr(obj, "tolist"):
        return obj.tolist()
    raise TypeError("Object of type %s is not JSON serializable" % type(obj).__name__)


_json_dumps = json.JSONEncoder(default=_json_default).encode


def _array_to_json(obj):
    if hasattr(obj, "tolist") and not isinstance(obj, (list, tuple, dict)):
        obj = obj.tolist()
    return _json_dumps(obj).encode()


def _array_to_csv(obj):
    stream = io.StringIO()
    np.savetxt(stream, obj, delimiter=",", fmt="%s")
    return stream.getvalue().encode()


def _array_to_npy(obj):
    buf = io.BytesIO()
    np.save(buf, obj, allow_pickle=False)
    return buf.getvalue()


_ENCODERS = {JSON: _array_to_json, CSV: _array_to_csv, NPY: _array_to_npy}


def encode(prediction, accept, fn_name="output_fn"):
    """(body, content_type) for the first type of accept with an encoder; 415 when none. A
    prediction the encoder cannot represent is a 500 naming the function and the type."""
    t = first_supported(accept)
    if t is None:
        raise UnsupportedFormatError(accept)
    try:
        return _ENCODERS[t](prediction), t
    except (TypeError, ValueError, AttributeError, IndexError) as e:
        raise InferenceError("%s could not encode a prediction of type %s as %s: %s"
                             % (fn_name, type(prediction).__name__, t, e))
