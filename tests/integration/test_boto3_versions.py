"""The same S3 client logic (s3_client_logic.py) under Debian's boto3 1.26 and, when available,
a boto3 >= 1.36 (CRC32 checksums by default; aws-chunked trailers)."""

import json
import os
import shutil
import subprocess

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
SCRIPT = os.path.join(HERE, "s3_client_logic.py")


def _boto3_version(python):
    try:
        out = subprocess.run([python, "-c", "import boto3; print(boto3.__version__)"], capture_output=True,
                             text=True, timeout=60)
    except OSError:
        return None
    if out.returncode != 0:
        return None
    return tuple(int(x) for x in out.stdout.strip().split(".")[:3])


def _find_new_boto3_python():
    candidates = [os.environ.get("KILN_NEW_BOTO3_PYTHON"), "/root/.pyenv/shims/python3", shutil.which("python3"),
                  os.path.expanduser("~/.pyenv/shims/python3")]
    seen = set()
    for c in candidates:
        if not c or c in seen or not os.path.exists(c):
            continue
        seen.add(c)
        v = _boto3_version(c)
        if v and v >= (1, 36, 0):
            return c, v
    return None, None


NEW_PY, NEW_VER = _find_new_boto3_python()


def _run(python, kiln, bucket, *extra):
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    env["AWS_CONFIG_FILE"] = os.devnull
    env["AWS_SHARED_CREDENTIALS_FILE"] = os.devnull
    p = subprocess.run([python, SCRIPT, kiln.endpoint, kiln.access_key, kiln.secret_key, bucket] + list(extra),
                       capture_output=True, text=True, timeout=300, env=env)
    assert p.returncode == 0, "client logic failed under %s:\n%s\n%s" % (python, p.stdout, p.stderr[-5000:])
    return json.loads(p.stdout.strip().splitlines()[-1])


@pytest.mark.skipif(not os.path.exists("/usr/bin/python3"), reason="no Debian /usr/bin/python3")
def test_system_boto3(kiln):
    out = _run("/usr/bin/python3", kiln, "logic-system")
    assert "multipart_roundtrip" in out["checks"]


@pytest.mark.skipif(NEW_PY is None, reason="no interpreter with boto3 >= 1.36 found "
                    "(set KILN_NEW_BOTO3_PYTHON, or install one under pyenv)")
def test_new_boto3_header_checksums(kiln):
    out = _run(NEW_PY, kiln, "logic-new-header")
    assert tuple(map(int, out["boto3"].split(".")[:2])) >= (1, 36)
    assert "delete_objects" in out["checks"]


@pytest.mark.skipif(NEW_PY is None, reason="no interpreter with boto3 >= 1.36 found "
                    "(set KILN_NEW_BOTO3_PYTHON, or install one under pyenv)")
def test_new_boto3_aws_chunked_trailer(kiln):
    out = _run(NEW_PY, kiln, "logic-new-trailer", "--force-trailer")
    assert out["force_trailer"] and "multipart_roundtrip" in out["checks"]
