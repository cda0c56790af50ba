"""Kiln's model-server worker: runs the user's inference.py handlers with the SageMaker inference
toolkit's semantics behind kiln-model-server (src/modelserver/README.md, serving contract §6).

    serve_worker.py prepare --model-dir D [--model-name N] [--framework F]
        once per model, before the workers: stages SAGEMAKER_SUBMIT_DIRECTORY when it is an s3://
        URI or a tarball (into <SAGEMAKER_BASE_DIR or /opt/ml>/.kiln/submit-code/<N>) and installs
        <code dir>/requirements.txt with pip when pip is importable. Exit 0, or 1 with the reason
        on stderr.
    serve_worker.py work --fd 3 --model-dir D [--model-name N] [--framework F]
        one worker: loads the model, sends `ready` (or `load_failed` and exits 1), then answers
        each `invoke` frame with a `result` frame until EOF (exit 0). SIGTERM: the request in
        progress is finished and answered, then exit 0.

Standard library only at import (run by path with the interpreter of the environment). Its
helpers are the kiln_serve_*.py modules beside it; this directory leaves sys.path before the
user's code is imported, so it shadows nothing.
"""

import os
import sys

# The helpers sit beside this file (not on sys.path under -I / PYTHONSAFEPATH, hence the insert).
# No bytecode is written beside them (the folder may be read-only or shared, as for train.py);
# the setting is restored for the user's code. work() takes the folder off sys.path again.
_DONT_WRITE_BYTECODE = sys.dont_write_bytecode
sys.dont_write_bytecode = True
_HERE = os.path.dirname(os.path.abspath(__file__))
if _HERE not in sys.path:
    sys.path.insert(0, _HERE)

import argparse  # noqa: E402
import logging  # noqa: E402
import signal  # noqa: E402
import socket  # noqa: E402
import time  # noqa: E402
import traceback  # noqa: E402

import kiln_serve_frames as frames  # noqa: E402
from kiln_serve_handlers import Handlers, LoadError  # noqa: E402

sys.dont_write_bytecode = _DONT_WRITE_BYTECODE

log = logging.getLogger("kiln.serve_worker")


def _setup_logging(environ):
    try:
        level = int(environ.get("SAGEMAKER_CONTAINER_LOG_LEVEL") or 20)
    except ValueError:
        level = 20
    logging.basicConfig(stream=sys.stderr, level=level,
                        format="%(asctime)s [%(levelname)s] %(name)s: %(message)s")


def _model_name(args):
    return args.model_name or os.path.basename(os.path.realpath(args.model_dir)) or "model"


def _staged_code_dir(environ, model_name):
    base = environ.get("SAGEMAKER_BASE_DIR") or "/opt/ml"
    safe = model_name.replace(os.sep, "_").replace("\0", "_")
    if safe in ("", ".", ".."):
        safe = "_" + safe
    return os.path.join(base, ".kiln", "submit-code", safe)


def _needs_staging(submit):
    return submit.startswith("s3://") or (os.path.isfile(submit))


def code_dir(environ, model_dir, model_name):
    """Where the user's code is: SAGEMAKER_SUBMIT_DIRECTORY as a local directory, the staging dir
    `prepare` extracted it to (s3:// or a tarball), else <model-dir>/code."""
    submit = environ.get("SAGEMAKER_SUBMIT_DIRECTORY") or ""
    if not submit:
        return os.path.join(model_dir, "code")
    if _needs_staging(submit):
        return _staged_code_dir(environ, model_name)
    if submit.startswith("file://"):
        submit = submit[len("file://"):]
    if not os.path.isdir(submit):
        # The SDK writes the container's paths (PyTorchModel: /opt/ml/model/code); Kiln's model
        # directory may live elsewhere (SAGEMAKER_BASE_DIR, multi-model directories).
        norm = os.path.normpath(submit)
        if norm == "/opt/ml/model" or norm.startswith("/opt/ml/model/"):
            return os.path.join(model_dir, norm[len("/opt/ml/model/"):])
        base = environ.get("SAGEMAKER_BASE_DIR")
        if base and norm.startswith("/opt/ml/"):
            return os.path.join(base, norm[len("/opt/ml/"):])
    return submit


# --------------------------------------------------------------------------------------------
# prepare

def prepare(args, environ):
    import shutil
    import subprocess
    sys.dont_write_bytecode = True
    import kiln_code  # the training toolkit's staging (s3 with an explicit endpoint, safe tar)
    from kiln_errors import ClientError

    name = _model_name(args)
    submit = environ.get("SAGEMAKER_SUBMIT_DIRECTORY") or ""
    where = code_dir(environ, args.model_dir, name)
    if submit and _needs_staging(submit):
        shutil.rmtree(where, ignore_errors=True)
        os.makedirs(where)
        log.info("Staging the code %s into %s", submit, where)
        try:
            kiln_code.download_and_extract(submit, where, environ)
        except ClientError as e:
            shutil.rmtree(where, ignore_errors=True)
            sys.stderr.write("serve_worker prepare: %s\n" % e)
            return 1
        except Exception as e:  # noqa: BLE001 - boto3/network errors: the reason, exit 1
            shutil.rmtree(where, ignore_errors=True)
            sys.stderr.write("serve_worker prepare: could not fetch SAGEMAKER_SUBMIT_DIRECTORY "
                             "%s: %s: %s\n" % (submit, type(e).__name__, e))
            return 1
    elif submit and not os.path.isdir(where):
        sys.stderr.write("serve_worker prepare: SAGEMAKER_SUBMIT_DIRECTORY %s is neither a "
                         "directory, a tarball nor an s3:// URI\n" % submit)
        return 1
    req = os.path.join(where, "requirements.txt")
    if not os.path.isfile(req):
        return 0
    if environ.get("KILN_SKIP_REQUIREMENTS") == "1":
        log.info("KILN_SKIP_REQUIREMENTS=1: not installing %s", req)
        return 0
    if not kiln_code._pip_available():
        log.warning("pip is not importable in %s: %s was not installed. %s",
                    sys.executable, req, kiln_code.PIP_HINT)
        return 0
    cmd = [sys.executable, "-m", "pip", "install", "-r", req]
    target = environ.get("KILN_PIP_TARGET")
    if target:
        cmd[4:4] = ["--target", target]
    log.info("Installing dependencies from requirements.txt:\n%s", " ".join(cmd))
    rc = subprocess.call(cmd, cwd=where, stdout=sys.stderr)
    if rc != 0:
        sys.stderr.write("serve_worker prepare: installing %s failed (exit %d). %s\n"
                         % (req, rc, kiln_code.PIP_HINT))
        return 1
    return 0


# --------------------------------------------------------------------------------------------
# work

class _Stop(BaseException):
    """SIGTERM while idle: leave the read loop."""


class _Worker:
    def __init__(self):
        self.busy = False
        self.stopping = False

    def on_sigterm(self, signum, frame):
        self.stopping = True
        if not self.busy:
            raise _Stop()

    def mark_busy(self):
        self.busy = True


def _load_failure_status(exc):
    if isinstance(exc, MemoryError):
        return 507
    name = type(exc).__name__
    if name == "OutOfMemoryError" or "CUDA out of memory" in str(exc):
        return 507  # torch.cuda.OutOfMemoryError (a RuntimeError subclass in torch ≥ 1.13)
    return 500


def work(args, environ):
    sock = socket.socket(fileno=args.fd)
    worker = _Worker()
    signal.signal(signal.SIGTERM, worker.on_sigterm)
    name = _model_name(args)
    start = time.monotonic()
    try:
        where = code_dir(environ, args.model_dir, name)
        submit = environ.get("SAGEMAKER_SUBMIT_DIRECTORY") or ""
        if submit and _needs_staging(submit) and not os.path.isdir(where):
            raise LoadError("SAGEMAKER_SUBMIT_DIRECTORY %s has not been staged into %s: run "
                            "`serve_worker.py prepare` first" % (submit, where))
        # The user's code first, then KILN_PIP_TARGET; this file's directory never.
        while _HERE in sys.path:
            sys.path.remove(_HERE)
        target = environ.get("KILN_PIP_TARGET")
        if target:
            sys.path.insert(0, target)
        sys.path.insert(0, where)
        handlers = Handlers(args.model_dir, name, args.framework, where, environ)
        handlers.load()
    except _Stop:
        return 0
    except BaseException as e:  # noqa: BLE001 - SystemExit from the user module included
        traceback.print_exc()
        msg = str(e) or type(e).__name__
        worker.busy = True  # a SIGTERM now must not cut the answer short
        try:
            sock.sendall(frames.encode_frame(frames.LOAD_FAILED, {
                "status": _load_failure_status(e), "message": msg, "type": type(e).__name__}))
        except OSError:
            pass  # the server is gone; the exit status still says it
        return 1
    load_ms = int((time.monotonic() - start) * 1000)
    log.info("Model %s loaded in %d ms (pid %d)", name, load_ms, os.getpid())
    reader = frames.FrameReader(sock)
    invoke = handlers.invoke
    sendall = sock.sendall
    try:
        sendall(frames.encode_frame(frames.READY, {"pid": os.getpid(), "load_ms": load_ms}))
        while not worker.stopping:
            worker.busy = False
            if worker.stopping:
                break
            frame = reader.read(worker.mark_busy)
            if frame is None:
                return 0
            ftype, meta, payload = frame
            if ftype != frames.INVOKE:
                raise frames.ProtocolError("unexpected frame type %d" % ftype)
            out = invoke(meta, payload)
            del frame, meta, payload
            sendall(out)
            del out
    except _Stop:
        return 0
    except frames.ProtocolError as e:
        sys.stderr.write("serve_worker: protocol error: %s\n" % e)
        return 1
    except (BrokenPipeError, ConnectionResetError):
        return 0
    return 0


def main(argv=None):
    p = argparse.ArgumentParser(prog="serve_worker.py")
    sub = p.add_subparsers(dest="command", required=True)
    for name in ("prepare", "work"):
        s = sub.add_parser(name)
        s.add_argument("--model-dir", required=True)
        s.add_argument("--model-name", default="")
        s.add_argument("--framework", default=os.environ.get("KILN_MODEL_SERVER_FRAMEWORK", ""))
        if name == "work":
            s.add_argument("--fd", type=int, default=3)
    args = p.parse_args(argv)
    environ = os.environ
    _setup_logging(environ)
    if args.command == "prepare":
        return prepare(args, environ)
    return work(args, environ)


if __name__ == "__main__":
    sys.exit(main())
