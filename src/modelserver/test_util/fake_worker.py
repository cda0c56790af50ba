#!/usr/bin/env python3
"""A fake model-server worker for worker_pool_test.cc (stdlib only).

Speaks the frame protocol of src/modelserver/README.md ("Worker protocol") like serve_worker.py:

  fake_worker.py prepare --model-dir D --model-name N [--framework F]
  fake_worker.py work --fd 3 --model-dir D --model-name N [--framework F]

Loading is steered by the environment:
  FAKE_PREPARE_FAIL=<msg>    prepare prints some lines and <msg> to stderr, exits 1
  FAKE_PREPARE_MARK=<path>   prepare writes its argv there
  FAKE_PREPARE_SLEEP=<secs>  prepare sleeps first
  FAKE_LOAD_DELAY=<seconds>  sleep before `ready`
  FAKE_LOAD_FAIL=<msg>       send load_failed {"status": FAKE_LOAD_STATUS or 500, "message": msg,
                             "type": "ValueError"} and exit 1
  FAKE_LOAD_EXIT=<code>      exit with <code> before `ready`, sending nothing
  FAKE_LOAD_FAIL_IF_EXISTS=<path>  load_failed while that file exists (replacement failures)
  FAKE_ENV_PROBE=<name>      the `env` command answers that variable's value

Each request item is steered by its body:
  sleep:<seconds>  sleep, then echo
  exit             exit 3 in the middle of the request
  status:<n>       answer status n with a JSON error body
  garbage          answer with a result whose id is wrong
  badsizes         answer with item sizes that do not add up to the payload
  answer-then-exit echo, then exit 5 at once
  pid              answer this process's pid
  info             answer JSON {"pid", "batch", "index", "accept", "inference_id", "target_model",
                   "argv", "fds"}
  env              answer the value of $FAKE_ENV_PROBE
  anything else    echo: same body, content type and custom attributes
"""

import json
import os
import signal
import struct
import sys
import time

READY, LOAD_FAILED, INVOKE, RESULT = 1, 2, 3, 4


def read_exact(sock_fd, n):
    chunks = []
    while n > 0:
        chunk = os.read(sock_fd, min(n, 1 << 20))
        if not chunk:
            return None
        chunks.append(chunk)
        n -= len(chunk)
    return b"".join(chunks)


def read_frame(fd):
    prefix = read_exact(fd, 4)
    if prefix is None:
        return None
    (rest,) = struct.unpack(">I", prefix)
    data = read_exact(fd, rest)
    if data is None:
        return None
    ftype = data[0]
    (meta_len,) = struct.unpack(">I", data[1:5])
    meta = json.loads(data[5 : 5 + meta_len].decode("utf-8"))
    return ftype, meta, data[5 + meta_len :]


def write_frame(fd, ftype, meta, payload=b""):
    meta_bytes = json.dumps(meta).encode("utf-8")
    head = struct.pack(">IBI", 5 + len(meta_bytes) + len(payload), ftype, len(meta_bytes))
    data = head + meta_bytes + payload
    while data:
        n = os.write(fd, data)
        data = data[n:]


def open_fds():
    """The descriptors this process holds (without those the listing itself used, closed since)."""
    listed = [int(x) for x in os.listdir("/proc/self/fd")]
    return sorted(fd for fd in listed if fd_target(fd))


def fd_target(fd):
    try:
        return os.readlink(f"/proc/self/fd/{fd}")
    except OSError:
        return ""


def prepare():
    time.sleep(float(os.environ.get("FAKE_PREPARE_SLEEP", "0")))
    mark = os.environ.get("FAKE_PREPARE_MARK")
    if mark:
        with open(mark, "w") as f:
            f.write(" ".join(sys.argv[1:]))
    message = os.environ.get("FAKE_PREPARE_FAIL")
    if message:
        for i in range(30):
            sys.stderr.write(f"noise line {i}\n")
        sys.stderr.write(message + "\n")
        sys.stderr.flush()
        return 1
    sys.stderr.write("prepare: nothing to do\n")
    return 0


def answer_item(item, body, batch, index):
    """(status, content_type, custom_attributes, body bytes) for one item."""
    text = body.decode("utf-8", "replace")
    if text.startswith("sleep:"):
        time.sleep(float(text.split(":", 1)[1]))
    elif text == "exit":
        sys.stderr.write("fake worker: exiting mid-request\n")
        os._exit(3)
    elif text.startswith("status:"):
        status = int(text.split(":", 1)[1])
        err = {"code": status, "type": "HandlerError", "message": "asked for " + str(status)}
        return status, "application/json", "", json.dumps(err).encode()
    elif text == "pid":
        return 200, "text/plain", "", str(os.getpid()).encode()
    elif text == "info":
        info = {
            "pid": os.getpid(),
            "batch": batch,
            "index": index,
            "accept": item.get("accept"),
            "inference_id": item.get("inference_id"),
            "target_model": item.get("target_model"),
            "argv": sys.argv[1:],
            "fds": open_fds(),
        }
        return 200, "application/json", "", json.dumps(info).encode()
    elif text == "env":
        value = os.environ.get(os.environ.get("FAKE_ENV_PROBE", ""), "")
        return 200, "text/plain", "", value.encode()
    return 200, item.get("content_type", ""), item.get("custom_attributes", ""), body


def work(fd):
    delay = float(os.environ.get("FAKE_LOAD_DELAY", "0"))
    if delay:
        time.sleep(delay)
    if os.environ.get("FAKE_LOAD_EXIT"):
        sys.stderr.write("fake worker: exiting before ready\n")
        return int(os.environ["FAKE_LOAD_EXIT"])
    fail_file = os.environ.get("FAKE_LOAD_FAIL_IF_EXISTS")
    message = os.environ.get("FAKE_LOAD_FAIL")
    if not message and fail_file and os.path.exists(fail_file):
        message = "the fail file exists"
    if message:
        status = int(os.environ.get("FAKE_LOAD_STATUS", "500"))
        write_frame(fd, LOAD_FAILED, {"status": status, "message": message, "type": "ValueError"})
        return 1
    write_frame(fd, READY, {"pid": os.getpid(), "load_ms": int(delay * 1000)})
    while True:
        frame = read_frame(fd)
        if frame is None:
            return 0
        ftype, meta, payload = frame
        if ftype != INVOKE:
            sys.stderr.write(f"fake worker: unexpected frame type {ftype}\n")
            return 2
        items = meta["items"]
        answers = []
        offset = 0
        for index, item in enumerate(items):
            body = payload[offset : offset + item["size"]]
            offset += item["size"]
            answers.append(answer_item(item, body, len(items), index))
        result_items = []
        for status, ctype, attrs, body in answers:
            entry = {"status": status, "size": len(body)}
            if ctype:
                entry["content_type"] = ctype
            if attrs:
                entry["custom_attributes"] = attrs
            result_items.append(entry)
        out = b"".join(a[3] for a in answers)
        bodies = [a[3] for a in answers]
        result_id = meta["id"]
        if b"garbage" in bodies:
            result_id += 1000
        if b"badsizes" in bodies:
            result_items[0]["size"] += 1
        write_frame(fd, RESULT, {"id": result_id, "items": result_items}, out)
        if b"answer-then-exit" in bodies:
            os._exit(5)


def main():
    signal.signal(signal.SIGPIPE, signal.SIG_DFL)
    if len(sys.argv) < 2:
        sys.stderr.write("usage: fake_worker.py prepare|work ...\n")
        return 2
    command = sys.argv[1]
    args = sys.argv[2:]
    if command == "prepare":
        return prepare()
    if command == "work":
        fd = int(args[args.index("--fd") + 1])
        return work(fd)
    sys.stderr.write(f"unknown command {command}\n")
    return 2


if __name__ == "__main__":
    sys.exit(main())
