"""The script-mode launcher as installed: python/kiln_toolkit is a folder of modules that
train.py imports from beside itself (scripts/install-service.sh copies the folder to
<prefix>/lib/kiln/python). Run from a read-only copy, in isolated mode (-I: the script's
directory is not on sys.path) and with PYTHONSAFEPATH, it must still find its modules, write
nothing beside them, and keep its directory away from the user's code. No server needed."""

import json
import os
import shutil
import stat
import subprocess
import sys

import pytest

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
TOOLKIT = os.path.join(REPO, "python", "kiln_toolkit")
PYTHON = "/usr/bin/python3" if os.path.exists("/usr/bin/python3") else sys.executable

USER_SCRIPT = """
import json, os, sys
with open(os.path.join(os.environ["SM_OUTPUT_DATA_DIR"], "seen.json"), "w") as f:
    json.dump({"path": sys.path, "modules": sorted(m for m in sys.modules if m.startswith("kiln_"))}, f)
"""


def make_tree(root):
    base = root / "opt" / "ml"
    for d in ("input/config", "input/data", "code", "model", "output/data"):
        (base / d).mkdir(parents=True, exist_ok=True)
    config = base / "input" / "config"
    (config / "hyperparameters.json").write_text(json.dumps({"sagemaker_program": "\"train.py\""}))
    (config / "inputdataconfig.json").write_text("{}")
    (config / "resourceconfig.json").write_text(json.dumps({
        "current_host": "algo-1", "hosts": ["algo-1"], "network_interface_name": "eth0",
        "current_instance_type": "ml.m5.large", "current_group_name": "homogeneousCluster",
        "instance_groups": [{"instance_group_name": "homogeneousCluster",
                             "instance_type": "ml.m5.large", "hosts": ["algo-1"]}]}))
    (base / "code" / "train.py").write_text(USER_SCRIPT)
    return base


def read_only_copy(tmp_path):
    dest = tmp_path / "prefix" / "lib" / "kiln" / "python" / "kiln_toolkit"
    shutil.copytree(TOOLKIT, dest, ignore=shutil.ignore_patterns("__pycache__"))
    for p in dest.iterdir():
        p.chmod(stat.S_IRUSR | stat.S_IRGRP | stat.S_IROTH)
    dest.chmod(stat.S_IRUSR | stat.S_IXUSR | stat.S_IRGRP | stat.S_IXGRP | stat.S_IROTH | stat.S_IXOTH)
    return dest


@pytest.mark.parametrize("flags,extra_env", [([], {}), (["-I"], {}), ([], {"PYTHONSAFEPATH": "1"})],
                         ids=["plain", "isolated", "safepath"])
def test_installed_copy_runs_from_its_folder(tmp_path, flags, extra_env):
    toolkit = read_only_copy(tmp_path)
    base = make_tree(tmp_path)
    env = {"SAGEMAKER_BASE_DIR": str(base), "PATH": "/usr/bin:/bin", "HOME": str(tmp_path),
           "LANG": "C.UTF-8", "TRAINING_JOB_NAME": "layout-job", "AWS_REGION": "us-east-1"}
    env.update(extra_env)
    try:
        proc = subprocess.run([PYTHON] + flags + [str(toolkit / "train.py")], cwd=str(base / "code"),
                              env=env, capture_output=True, timeout=60)
    finally:
        toolkit.chmod(stat.S_IRWXU)  # let tmp_path be cleaned up
    assert proc.returncode == 0, proc.stderr.decode()
    assert (base / "output" / "success").exists()
    assert not (toolkit / "__pycache__").exists()
    seen = json.loads((base / "output" / "data" / "seen.json").read_text())
    assert str(toolkit) not in seen["path"]
    assert seen["modules"] == []  # the launcher's modules stay in the launcher's process
