"""torch_distributed launches of Kiln's toolkit (issue 14): Debian's torch 1.13 on Python 3.11
crashes in torchrun's to_map() unless --redirects and --tee are given, so the toolkit adds
`--redirects 1 --tee 1` exactly for torch < 2.0 on Python >= 3.11, found without importing torch.

No Kiln server: the toolkit runs directly (as in test_toolkit.py); the last test launches a real
1-node, 2-process gloo job on CPU through the environment's torchrun.
"""

import os
import subprocess
import sys

import pytest

from test_toolkit import PYTHON, make_job, no_gpus  # noqa: F401

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
TOOLKIT = os.path.join(REPO, "python", "kiln_toolkit")
sys.path.insert(0, TOOLKIT)
import kiln_launch  # noqa: E402


@pytest.mark.parametrize("python,torch,needed", [
    ((3, 11), "1.13.0a0+gitunknown", True),   # Debian 12's python3-torch
    ((3, 11), "1.13.1+cpu", True),
    ((3, 12), "1.9.0", True),
    ((3, 10), "1.13.1", False),               # the crash needs 3.11's enum
    ((3, 11), "2.0.0", False),                # fixed in torch 2.0
    ((3, 11), "2.3.1+cu121", False),
    ((3, 11), "10.0", False),
    ((3, 11), None, False),                   # no torch: nothing to work around
    ((3, 11), "unknown", False),
])
def test_workaround_rule(python, torch, needed):
    assert kiln_launch.torchrun_needs_workaround(python, torch) is needed


def test_torchrun_interpreter_from_its_shebang(tmp_path):
    def script(name, text):
        p = tmp_path / name
        p.write_text(text)
        return str(p)
    assert kiln_launch._torchrun_interpreter(
        script("a", "#!/usr/bin/python3.11\nimport re\n")) == "/usr/bin/python3.11"
    assert kiln_launch._torchrun_interpreter(
        script("b", "#!/opt/venv/bin/python -E\n")) == "/opt/venv/bin/python"
    env_python = kiln_launch._torchrun_interpreter(script("c", "#!/usr/bin/env python3\n"))
    assert env_python and os.path.basename(env_python) == "python3"
    assert kiln_launch._torchrun_interpreter(script("d", "#!/bin/sh\nexec x\n")) is None
    assert kiln_launch._torchrun_interpreter(script("e", "\x7fELF")) is None


def test_torch_version_without_import_metadata_or_version_py(tmp_path, monkeypatch):
    """Another interpreter is asked in a child process; without the distribution's metadata
    the version comes from torch/version.py (the package is never imported: its __init__
    would fail)."""
    pkg = tmp_path / "site" / "torch"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("raise SystemExit('torch must not be imported')\n")
    (pkg / "version.py").write_text("__version__ = '1.12.1+cpu'\ngit_version = 'x'\n")
    wrapper = tmp_path / "bin" / "python3"
    wrapper.parent.mkdir()
    wrapper.write_text("#!/bin/sh\nexec %s -S \"$@\"\n" % PYTHON)  # -S: no site-packages
    wrapper.chmod(0o755)
    monkeypatch.setenv("PYTHONPATH", str(tmp_path / "site"))
    version, torch = kiln_launch.torch_runtime(str(wrapper))
    assert torch == "1.12.1+cpu"
    assert version == tuple(int(x) for x in subprocess.run(
        [PYTHON, "-c", "import sys; print(sys.version_info[0], sys.version_info[1])"],
        capture_output=True, text=True).stdout.split())
    monkeypatch.setenv("PYTHONPATH", str(tmp_path / "nothing"))
    assert kiln_launch.torch_runtime(str(wrapper))[1] is None


def test_fake_torchrun_gets_no_workaround(make_job):
    """A torchrun that is not a Python script (test_toolkit.py's recorders) says nothing about
    its torch: the command stays the contract's."""
    job = make_job(hps={"sagemaker_program": "\"train.py\"",
                        "sagemaker_torch_distributed_enabled": "true"})
    no_gpus(job)
    job.fake_tool("torchrun", "#!/bin/sh\necho \"ARGS $*\"\n")
    job.write_code("train.py", "pass\n")
    rc, out, err = job.run(extra_env={"PATH": job.bin + ":/usr/bin:/bin"})
    assert rc == 0, err
    assert "ARGS --nnodes 1 --nproc_per_node 1 train.py" in out


DDP_SCRIPT = """\
import os
import torch
import torch.distributed as dist
dist.init_process_group("gloo")
rank = dist.get_rank()
t = torch.tensor([float(rank + 1)])
dist.all_reduce(t)
out = os.path.join(os.environ["SM_OUTPUT_DATA_DIR"], "rank%d" % rank)
with open(out, "w") as f:
    f.write("%d %d %d %s" % (rank, dist.get_world_size(), int(t.item()),
                             os.environ["LOCAL_RANK"]))
print("rank %d all-reduced %d" % (rank, int(t.item())), flush=True)
dist.destroy_process_group()
"""


def test_real_torchrun_two_processes_on_cpu(make_job):
    torch_check = subprocess.run([PYTHON, "-c", "import torch.distributed"], capture_output=True)
    if torch_check.returncode != 0:
        pytest.skip("needs torch for %s (python3-torch)" % PYTHON)
    runtime = kiln_launch.torch_runtime(PYTHON)
    needed = runtime is not None and kiln_launch.torchrun_needs_workaround(*runtime)
    job = make_job(hps={"sagemaker_program": "\"train.py\"",
                        "sagemaker_torch_distributed_enabled": "true",
                        "sagemaker_mpi_num_of_processes_per_host": "2"})
    no_gpus(job)
    job.write_code("train.py", DDP_SCRIPT)
    rc, out, err = job.run(extra_env={"PATH": job.bin + ":/usr/bin:/bin"}, timeout=180)
    assert rc == 0, out + err
    shown = "torchrun --nnodes 1 --nproc_per_node 2 %strain.py" % (
        "--redirects 1 --tee 1 " if needed else "")
    assert shown in err  # the logged command
    for rank in (0, 1):
        with open(job.path("output", "data", "rank%d" % rank)) as f:
            assert f.read() == "%d 2 3 %d" % (rank, rank)
    assert "rank 0 all-reduced 3" in out and "rank 1 all-reduced 3" in out
    assert job.success()
