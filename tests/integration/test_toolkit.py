"""Kiln's script-mode training launcher (python/kiln_toolkit/train.py), run as a subprocess.

No Kiln server is needed: every test builds a temporary /opt/ml tree and points
SAGEMAKER_BASE_DIR at it, as the real toolkit allows. Expected values are written out by hand
from the training contract (sections 4, 5.2, 7 and 12.2).
"""

import io
import json
import os
import signal
import subprocess
import sys
import tarfile
import time

import pytest

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
TRAIN_PY = os.path.join(REPO, "python", "kiln_toolkit", "train.py")
PYTHON = "/usr/bin/python3" if os.path.exists("/usr/bin/python3") else sys.executable

# Contract 4.1's example (with sagemaker_torch_distributed_enabled removed; launched below).
SDK_HPS = {
    "epochs": "25",
    "batch-size": "64",
    "lr": "0.001",
    "use-amp": "true",
    "sagemaker_program": "\"train.py\"",
    "sagemaker_submit_directory":
        "\"s3://my-bucket/pt-job-2024-05-01-10-00-00-000/source/sourcedir.tar.gz\"",
    "sagemaker_container_log_level": "20",
    "sagemaker_job_name": "\"pt-job-2024-05-01-10-00-00-000\"",
    "sagemaker_region": "\"us-east-1\"",
    "sagemaker_instance_type": "\"ml.g5.12xlarge\"",
}

# Contract 4.2's example.
INPUT_DATA_CONFIG = {
    "train": {"ContentType": "text/csv", "TrainingInputMode": "File",
              "S3DistributionType": "ShardedByS3Key", "RecordWrapperType": "None"},
    "validation": {"TrainingInputMode": "FastFile",
                   "S3DistributionType": "FullyReplicated", "RecordWrapperType": "None"},
    "images": {"ContentType": "application/x-recordio", "TrainingInputMode": "Pipe",
               "S3DistributionType": "FullyReplicated", "RecordWrapperType": "RecordIO",
               "CompressionType": "Gzip"},
}

# Contract 4.3's example: host 2 of a homogeneous 3-host job.
RESOURCE_CONFIG_3 = {
    "current_host": "algo-2",
    "hosts": ["algo-1", "algo-2", "algo-3"],
    "network_interface_name": "eth0",
    "current_instance_type": "ml.g5.12xlarge",
    "current_group_name": "homogeneousCluster",
    "instance_groups": [{"instance_group_name": "homogeneousCluster",
                         "instance_type": "ml.g5.12xlarge",
                         "hosts": ["algo-1", "algo-2", "algo-3"]}],
}

RESOURCE_CONFIG_1 = {
    "current_host": "algo-1",
    "hosts": ["algo-1"],
    "network_interface_name": "eth0",
    "current_instance_type": "ml.m5.xlarge",
    "current_group_name": "homogeneousCluster",
    "instance_groups": [{"instance_group_name": "homogeneousCluster",
                         "instance_type": "ml.m5.xlarge", "hosts": ["algo-1"]}],
}

# A user script that records argv and the environment it was given.
DUMP_SCRIPT = """\
import json, os, sys
with open(os.path.join(os.environ["SM_OUTPUT_DATA_DIR"], "seen.json"), "w") as f:
    json.dump({"argv": sys.argv, "env": dict(os.environ), "cwd": os.getcwd(),
               "path": sys.path}, f)
print("user script ran")
"""


class Job:
    """A temporary /opt/ml tree and a way to run the launcher over it."""

    def __init__(self, root, hps=None, input_data_config=None, resource_config=None):
        self.base = str(root / "opt" / "ml")
        for d in ("input/config", "input/data", "code", "model", "output/data"):
            os.makedirs(os.path.join(self.base, d), exist_ok=True)
        self.root = root
        self.bin = str(root / "bin")
        os.makedirs(self.bin)
        self.write_config("hyperparameters.json", hps if hps is not None else {})
        self.write_config("inputdataconfig.json",
                          input_data_config if input_data_config is not None else {})
        self.write_config("resourceconfig.json", resource_config or RESOURCE_CONFIG_1)

    def path(self, *parts):
        return os.path.join(self.base, *parts)

    def write_config(self, name, obj):
        with open(self.path("input", "config", name), "w") as f:
            json.dump(obj, f)

    def write_code(self, name, text, mode=0o644):
        p = self.path("code", name)
        with open(p, "w") as f:
            f.write(text)
        os.chmod(p, mode)

    def fake_tool(self, name, script):
        """A stand-in for nvidia-smi/torchrun/... found first on PATH."""
        p = os.path.join(self.bin, name)
        with open(p, "w") as f:
            f.write(script)
        os.chmod(p, 0o755)

    def env(self, extra=None, keep_path=True):
        env = {
            "SAGEMAKER_BASE_DIR": self.base,
            "TRAINING_JOB_NAME": "pt-job-2024-05-01-10-00-00-000",
            "TRAINING_JOB_ARN": "arn:aws:sagemaker:us-east-1:000000000000:training-job/x",
            "AWS_REGION": "us-east-1",
            "AWS_DEFAULT_REGION": "us-east-1",
            "PATH": self.bin + ":" + (os.environ.get("PATH", "/usr/bin:/bin")
                                      if keep_path else "/usr/bin:/bin"),
            "HOME": str(self.root),
            "LANG": "C.UTF-8",
        }
        if extra:
            env.update(extra)
        return env

    def lone_python(self):
        """The interpreter through a symlink in a directory of its own, so that nothing sits
        "beside the interpreter" (the toolkit's fallback for tools not on PATH, e.g. Debian's
        /usr/bin/mpirun beside /usr/bin/python3) unless the test puts it there."""
        d = os.path.join(str(self.root), "lone-python")
        p = os.path.join(d, "python3")
        if not os.path.exists(p):
            os.makedirs(d, exist_ok=True)
            os.symlink(os.path.realpath(PYTHON), p)
        return p

    def start(self, extra_env=None, python=PYTHON, **kw):
        return subprocess.Popen([python, TRAIN_PY], cwd=self.path("code"),
                                env=self.env(extra_env), stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, **kw)

    def run(self, extra_env=None, timeout=60, python=PYTHON):
        proc = self.start(extra_env, python=python)
        out, err = proc.communicate(timeout=timeout)
        return proc.returncode, out.decode(), err.decode()

    def seen(self):
        with open(self.path("output", "data", "seen.json")) as f:
            return json.load(f)

    def failure(self):
        p = self.path("output", "failure")
        if not os.path.exists(p):
            return None
        with open(p) as f:
            return f.read()

    def success(self):
        return os.path.exists(self.path("output", "success"))


@pytest.fixture
def make_job(tmp_path):
    counter = [0]

    def make(**kw):
        counter[0] += 1
        root = tmp_path / ("job%d" % counter[0])
        root.mkdir()
        return Job(root, **kw)
    return make


def no_gpus(job):
    job.fake_tool("nvidia-smi", "#!/bin/sh\necho 'NVIDIA-SMI has failed' >&2\nexit 9\n")


# ---------------------------------------------------------------------------------------------
# SM_* environment (contract 5.2)

def test_sm_environment_matches_contract_examples(make_job):
    hps = dict(SDK_HPS)
    hps["sagemaker_submit_directory"] = "\"/opt/ml/code\""
    hps["mp_parameters"] = "{\"partitions\": 2, \"microbatches\": 4}"
    hps["_tuning_objective_metric"] = "\"loss\""
    hps["sagemaker_mpi_custom_mpi_options"] = "\"-x FOO\""
    hps["notjson"] = "plain text"
    job = make_job(hps=hps, input_data_config=INPUT_DATA_CONFIG)
    no_gpus(job)
    job.write_code("train.py", DUMP_SCRIPT)
    rc, out, err = job.run()
    assert rc == 0, err
    assert "user script ran" in out
    seen = job.seen()
    env = seen["env"]
    b = job.base

    expected = {
        "SM_MODEL_DIR": b + "/model",
        "SM_CHANNELS": '["images","train","validation"]',
        "SM_CHANNEL_TRAIN": b + "/input/data/train",
        "SM_CHANNEL_VALIDATION": b + "/input/data/validation",
        "SM_CHANNEL_IMAGES": b + "/input/data/images",
        "SM_HPS": '{"batch-size":64,"epochs":25,"lr":0.001,'
                  '"mp_parameters":{"microbatches":4,"partitions":2},'
                  '"notjson":"plain text","use-amp":true}',
        "SM_HP_EPOCHS": "25",
        "SM_HP_BATCH-SIZE": "64",
        "SM_HP_LR": "0.001",
        "SM_HP_USE-AMP": "true",
        "SM_HP_MP_PARAMETERS": '{"microbatches":4,"partitions":2}',
        "SM_HP_NOTJSON": "plain text",
        "SM_CURRENT_HOST": "algo-1",
        "SM_HOSTS": '["algo-1"]',
        "SM_NETWORK_INTERFACE_NAME": "eth0",
        "SM_CURRENT_INSTANCE_TYPE": "ml.m5.xlarge",
        "SM_CURRENT_INSTANCE_GROUP": "homogeneousCluster",
        "SM_CURRENT_INSTANCE_GROUP_HOSTS": '["algo-1"]',
        "SM_INSTANCE_GROUPS": '["homogeneousCluster"]',
        "SM_INSTANCE_GROUPS_DICT": '{"homogeneousCluster":{"hosts":["algo-1"],'
                                   '"instance_group_name":"homogeneousCluster",'
                                   '"instance_type":"ml.m5.xlarge"}}',
        "SM_DISTRIBUTION_INSTANCE_GROUPS": "[]",
        "SM_IS_HETERO": "false",
        "SM_NUM_GPUS": "0",
        "SM_NUM_CPUS": str(len(os.sched_getaffinity(0))),
        "SM_NUM_NEURONS": "0",
        "SM_LOG_LEVEL": "20",
        "SM_INPUT_DIR": b + "/input",
        "SM_INPUT_CONFIG_DIR": b + "/input/config",
        "SM_OUTPUT_DIR": b + "/output",
        "SM_OUTPUT_DATA_DIR": b + "/output/data",
        "SM_OUTPUT_INTERMEDIATE_DIR": b + "/output/intermediate",
        "SM_RESOURCE_CONFIG": json.dumps(RESOURCE_CONFIG_1, sort_keys=True,
                                         separators=(",", ":")),
        "SM_INPUT_DATA_CONFIG": json.dumps(INPUT_DATA_CONFIG, sort_keys=True,
                                           separators=(",", ":")),
        "SM_USER_ENTRY_POINT": "train.py",
        "SM_MODULE_NAME": "train",
        "SM_MODULE_DIR": "/opt/ml/code",
        "SM_USER_ARGS": '["--batch-size","64","--epochs","25","--lr","0.001",'
                        '"--mp_parameters","microbatches=4,partitions=2",'
                        '"--notjson","plain text","--use-amp","True"]',
        "SM_FRAMEWORK_PARAMS": '{"sagemaker_instance_type":"ml.g5.12xlarge",'
                               '"sagemaker_mpi_custom_mpi_options":"-x FOO"}',
        "SM_FRAMEWORK_MODULE": "",
        "SAGEMAKER_JOB_NAME": "pt-job-2024-05-01-10-00-00-000",
        "CURRENT_HOST": "algo-1",
        "SAGEMAKER_REGION": "us-east-1",
        "MASTER_ADDR": "algo-1",
        "MASTER_PORT": "7777",
    }
    for k, v in expected.items():
        assert env.get(k) == v, k
    # Nothing reserved leaks into SM_HP_*.
    assert not [k for k in env if k.startswith("SM_HP_SAGEMAKER") or k == "SM_HP__TUNING_OBJECTIVE_METRIC"]

    training_env = json.loads(env["SM_TRAINING_ENV"])
    assert env["SM_TRAINING_ENV"] == json.dumps(training_env, sort_keys=True,
                                                separators=(",", ":"))
    assert sorted(training_env) == sorted([
        "additional_framework_parameters", "channel_input_dirs", "current_host",
        "current_instance_group", "current_instance_group_hosts", "current_instance_type",
        "distribution_hosts", "distribution_instance_groups", "framework_module", "hosts",
        "hyperparameters", "input_config_dir", "input_data_config", "input_dir",
        "instance_groups", "instance_groups_dict", "is_hetero", "is_master",
        "is_modelparallel_enabled", "is_smddpmprun_installed", "job_name", "log_level",
        "master_hostname", "model_dir", "module_dir", "module_name", "network_interface_name",
        "num_cpus", "num_gpus", "num_neurons", "output_data_dir", "output_dir",
        "output_intermediate_dir", "resource_config", "user_entry_point"])
    assert training_env["job_name"] == "pt-job-2024-05-01-10-00-00-000"
    assert training_env["hyperparameters"]["use-amp"] is True
    assert training_env["channel_input_dirs"]["train"] == b + "/input/data/train"
    assert training_env["is_master"] is True and training_env["master_hostname"] == "algo-1"
    assert training_env["framework_module"] is None

    # The code dir is on PYTHONPATH; the launcher's own directory is not, anywhere.
    toolkit_dir = os.path.dirname(TRAIN_PY)
    assert env["PYTHONPATH"].split(":")[0] == b + "/code"
    assert toolkit_dir not in env["PYTHONPATH"].split(":")
    assert toolkit_dir not in seen["path"]
    assert seen["cwd"] == b + "/code"
    assert seen["argv"][1:] == ["--batch-size", "64", "--epochs", "25", "--lr", "0.001",
                                "--mp_parameters", "microbatches=4,partitions=2",
                                "--notjson", "plain text", "--use-amp", "True"]
    assert job.success() and job.failure() is None


def test_command_line_example_of_contract_7_3(make_job):
    job = make_job(hps={"epochs": "25", "lr": "0.001", "k": "3", "opt": "\"adam\"",
                        "sagemaker_program": "\"train.py\""})
    job.write_code("train.py", DUMP_SCRIPT)
    rc, out, err = job.run()
    assert rc == 0, err
    assert job.seen()["argv"][1:] == ["--epochs", "25", "-k", "3", "--lr", "0.001",
                                      "--opt", "adam"]
    assert ("%s train.py --epochs 25 -k 3 --lr 0.001 --opt adam" % PYTHON) in err


def test_value_stringification(make_job):
    job = make_job(hps={"list": "[1, 2]", "none": "null", "flag": "false", "f": "1.5e3",
                        "s": "\"x y\"", "sagemaker_program": "\"train.py\""})
    job.write_code("train.py", DUMP_SCRIPT)
    rc, _, err = job.run()
    assert rc == 0, err
    seen = job.seen()
    assert seen["argv"][1:] == ["-f", "1500.0", "--flag", "False", "--list", "[1, 2]",
                                "--none", "", "-s", "x y"]
    env = seen["env"]
    assert env["SM_HP_LIST"] == "[1,2]"
    assert env["SM_HP_NONE"] == ""
    assert env["SM_HP_FLAG"] == "false"
    assert env["SM_HP_S"] == "x y"


def test_heterogeneous_cluster_and_gpu_count(make_job):
    # Host names are opaque to the launcher, but it resolves every one before launching
    # (contract 7.1 step 4); loopback addresses stand in for algo-1..3 so they resolve here.
    h1, h2, h3 = "127.0.0.1", "127.0.0.2", "127.0.0.3"
    rc_cfg = {
        "current_host": h3,
        "hosts": [h1, h2, h3],
        "network_interface_name": "eth1",
        "current_instance_type": "ml.p4d.24xlarge",
        "current_group_name": "gpus",
        "instance_groups": [
            {"instance_group_name": "cpus", "instance_type": "ml.c5.xlarge",
             "hosts": [h1, h2]},
            {"instance_group_name": "gpus", "instance_type": "ml.p4d.24xlarge",
             "hosts": [h3]}],
    }
    job = make_job(hps={"sagemaker_program": "\"train.py\"",
                        "sagemaker_distribution_instance_groups": "[\"gpus\"]"},
                   resource_config=rc_cfg)
    job.fake_tool("nvidia-smi", "#!/bin/sh\nfor i in 0 1 2 3; do "
                  "echo \"GPU $i: NVIDIA A100 (UUID: GPU-$i)\"; done\necho 'not a gpu'\n")
    job.write_code("train.py", DUMP_SCRIPT)
    rc, _, err = job.run()
    assert rc == 0, err
    env = job.seen()["env"]
    assert env["SM_NUM_GPUS"] == "4"
    assert env["SM_IS_HETERO"] == "true"
    assert env["SM_CURRENT_HOST"] == h3
    assert env["SM_HOSTS"] == '["%s","%s","%s"]' % (h1, h2, h3)
    assert env["SM_CURRENT_INSTANCE_GROUP"] == "gpus"
    assert env["SM_CURRENT_INSTANCE_GROUP_HOSTS"] == '["%s"]' % h3
    assert env["SM_INSTANCE_GROUPS"] == '["cpus","gpus"]'
    assert env["SM_DISTRIBUTION_INSTANCE_GROUPS"] == '["gpus"]'
    assert env["SM_FRAMEWORK_PARAMS"] == '{"sagemaker_distribution_instance_groups":["gpus"]}'
    assert env["SM_NETWORK_INTERFACE_NAME"] == "eth1"
    assert env["SM_CURRENT_INSTANCE_TYPE"] == "ml.p4d.24xlarge"
    training_env = json.loads(env["SM_TRAINING_ENV"])
    assert training_env["distribution_hosts"] == [h3]
    assert training_env["master_hostname"] == h3 and training_env["is_master"] is True
    # The PyTorch toolkit's rendezvous address is the distribution master.
    assert env["MASTER_ADDR"] == h3


def test_gpu_count_and_defaults_single_host(make_job):
    # resourceconfig without the optional keys: the toolkit's defaults apply.
    job = make_job(hps={"sagemaker_program": "\"train.py\""},
                   resource_config={"current_host": "algo-1", "hosts": ["algo-1"]})
    job.fake_tool("nvidia-smi", "#!/bin/sh\necho 'GPU 0: H200 (UUID: GPU-a)'\n"
                  "echo 'GPU 1: H200 (UUID: GPU-b)'\n")
    job.write_code("train.py", DUMP_SCRIPT)
    rc, _, err = job.run()
    assert rc == 0, err
    env = job.seen()["env"]
    assert env["SM_NUM_GPUS"] == "2"
    assert env["SM_NETWORK_INTERFACE_NAME"] == "eth0"
    assert env["SM_CURRENT_INSTANCE_TYPE"] == "local"
    assert env["SM_CURRENT_INSTANCE_GROUP"] == "homogeneousCluster"
    assert env["SM_INSTANCE_GROUPS"] == "[]"
    assert env["SM_CURRENT_INSTANCE_GROUP_HOSTS"] == "[]"
    assert env["SM_CHANNELS"] == "[]"
    assert env["SM_HPS"] == "{}"


def test_num_cpus_follows_affinity(make_job):
    if len(os.sched_getaffinity(0)) < 2:
        pytest.skip("needs two CPUs")
    job = make_job(hps={"sagemaker_program": "\"train.py\""})
    job.write_code("train.py", DUMP_SCRIPT)
    first = sorted(os.sched_getaffinity(0))[0]
    proc = subprocess.Popen([PYTHON, TRAIN_PY], cwd=job.path("code"), env=job.env(),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            preexec_fn=lambda: os.sched_setaffinity(0, {first}))
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    assert job.seen()["env"]["SM_NUM_CPUS"] == "1"


def test_sagemaker_program_env_overrides(make_job):
    job = make_job(hps={"sagemaker_program": "\"other.py\""})
    job.write_code("train.py", DUMP_SCRIPT)
    rc, _, err = job.run(extra_env={"SAGEMAKER_PROGRAM": "train.py"})
    assert rc == 0, err
    assert job.seen()["env"]["SM_USER_ENTRY_POINT"] == "train.py"


# ---------------------------------------------------------------------------------------------
# Entry points (contract 7.2)

def test_shell_entry_point(make_job):
    job = make_job(hps={"sagemaker_program": "\"run.sh\"", "msg": "\"hello world\"",
                        "n": "2"})
    job.write_code("run.sh", "#!/bin/sh\nprintf '%s|' \"$@\" > \"$SM_OUTPUT_DATA_DIR/args\"\n"
                   "echo \"shell ran in $(pwd)\"\n")
    rc, out, err = job.run()
    assert rc == 0, err
    assert "shell ran in %s/code" % job.base in out
    with open(job.path("output", "data", "args")) as f:
        assert f.read() == "--msg|hello world|-n|2|"
    assert os.stat(job.path("code", "run.sh")).st_mode & 0o777 == 0o777
    assert "/bin/sh -c \"./run.sh --msg 'hello world' -n 2\"" in err


def test_other_executable_entry_point(make_job):
    job = make_job(hps={"sagemaker_program": "\"trainer\""})
    job.write_code("trainer", "#!/bin/sh\necho binary-ran \"$@\"\n")
    rc, out, err = job.run()
    assert rc == 0, err
    assert "binary-ran" in out


def test_setup_py_package_entry_point(make_job):
    job = make_job(hps={"sagemaker_program": "\"train.py\"", "x": "1"})
    job.write_code("setup.py", "raise SystemExit('not used: install skipped')\n")
    job.write_code("train.py", DUMP_SCRIPT + "print('as module', __name__, __spec__.name)\n")
    rc, out, err = job.run(extra_env={"KILN_SKIP_REQUIREMENTS": "1"})
    assert rc == 0, err
    assert "as module __main__ train" in out
    assert "%s -m train -x 1" % PYTHON in err


def test_setup_py_package_is_pip_installed(make_job):
    job = make_job(hps={"sagemaker_program": "\"train.py\""})
    job.write_code("setup.py", "raise SystemExit('not used')\n")
    job.write_code("train.py", DUMP_SCRIPT)
    # A stand-in interpreter-independent check: pip is run as `<python> -m pip install .`;
    # point it at an unreachable index so it fails fast, and look at the failure file.
    rc, _, err = job.run(extra_env={"PIP_INDEX_URL": "http://127.0.0.1:9/simple",
                                    "PIP_NO_BUILD_ISOLATION": "0", "PIP_RETRIES": "0",
                                    "PIP_TIMEOUT": "1",
                                    "PIP_TARGET": str(job.root / "target")})
    assert rc == 1
    failure = job.failure()
    assert failure.startswith("InstallModuleError:\nExitCode ")
    assert ('Command "%s -m pip install ."' % PYTHON) in failure
    assert "could not install the job's requirements" in failure


def test_module_without_entry_point_is_a_client_error(make_job):
    job = make_job(hps={})
    rc, _, _ = job.run()
    assert rc == 1
    assert "No entry point" in job.failure()


# ---------------------------------------------------------------------------------------------
# Failure and success files, exit codes

def test_failure_file_on_nonzero_exit(make_job):
    job = make_job(hps={"sagemaker_program": "\"train.py\"", "epochs": "1"})
    job.write_code("train.py", "import sys\nprint('working')\n"
                   "print('warming up', file=sys.stderr)\n"
                   "def f():\n    raise ValueError('boom')\nf()\n")
    rc, out, err = job.run()
    assert rc == 1
    assert "working" in out
    assert "ValueError: boom" in err  # passed through
    assert job.failure() == (
        'ExecuteUserScriptError:\nExitCode 1\nErrorMessage "raise ValueError(\'boom\')\n'
        ' ValueError: boom"\nCommand "%s train.py --epochs 1"' % PYTHON)
    assert not job.success()


def test_exit_code_and_tail_when_no_python_error(make_job):
    job = make_job(hps={"sagemaker_program": "\"train.py\""})
    job.write_code("train.py", "import sys\nprint('disk is full', file=sys.stderr)\n"
                   "sys.exit(3)\n")
    rc, _, _ = job.run()
    assert rc == 1  # toolkit: every user-script failure is a client error
    assert job.failure() == ('ExecuteUserScriptError:\nExitCode 3\nErrorMessage "disk is full"'
                             '\nCommand "%s train.py"' % PYTHON)


def test_sigkill_reported_as_out_of_memory(make_job):
    job = make_job(hps={"sagemaker_program": "\"train.py\""})
    job.write_code("train.py", "import os, signal\nos.kill(os.getpid(), signal.SIGKILL)\n")
    rc, _, _ = job.run()
    assert rc == 1
    failure = job.failure()
    assert failure.startswith("ExecuteUserScriptError:\nExitCode 137\n")
    assert 'ExtraInfo "OutOfMemory: Process killed by SIGKILL (signal 9)"' in failure


def test_existing_failure_file_is_kept(make_job):
    job = make_job(hps={"sagemaker_program": "\"train.py\""})
    job.write_code("train.py", "import os\nopen(os.path.join(os.environ['SM_OUTPUT_DIR'],"
                   " 'failure'), 'w').write('my own reason')\nraise SystemExit(2)\n")
    rc, _, _ = job.run()
    assert rc == 1
    assert job.failure() == "my own reason"


def test_success_file_is_empty(make_job):
    job = make_job(hps={"sagemaker_program": "\"train.py\""})
    job.write_code("train.py", "print('ok')\n")
    rc, out, err = job.run()
    assert rc == 0, err
    assert os.path.getsize(job.path("output", "success")) == 0
    assert job.failure() is None


def test_stdout_is_not_buffered_by_the_launcher(make_job):
    job = make_job(hps={"sagemaker_program": "\"train.py\""})
    job.write_code("train.py", "import time\nprint('first line', flush=True)\n"
                   "time.sleep(3)\nprint('done')\n")
    proc = job.start()
    t0 = time.monotonic()
    line = proc.stdout.readline()
    elapsed = time.monotonic() - t0
    proc.communicate(timeout=30)
    assert line == b"first line\n"
    assert elapsed < 2.5


# ---------------------------------------------------------------------------------------------
# Signals (contract 11)

def test_sigterm_is_forwarded_to_the_user_process(make_job):
    job = make_job(hps={"sagemaker_program": "\"train.py\""})
    job.write_code("train.py", """\
import os, signal, sys, time
def handler(signum, frame):
    open(os.path.join(os.environ["SM_MODEL_DIR"], "saved-on-sigterm"), "w").write(str(signum))
    sys.exit(0)
signal.signal(signal.SIGTERM, handler)
print("ready", flush=True)
time.sleep(60)
""")
    proc = job.start()
    assert proc.stdout.readline() == b"ready\n"
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=30)
    with open(job.path("model", "saved-on-sigterm")) as f:
        assert f.read() == str(int(signal.SIGTERM))
    assert proc.returncode == 0, err


def test_sigterm_reaches_the_whole_process_group(make_job):
    job = make_job(hps={"sagemaker_program": "\"train.py\""})
    job.write_code("train.py", """\
import os, subprocess, sys, time
child = subprocess.Popen([sys.executable, "-c", '''
import os, signal, sys, time
def h(s, f):
    open(os.path.join(os.environ["SM_MODEL_DIR"], "grandchild"), "w").write("x")
    sys.exit(0)
signal.signal(signal.SIGTERM, h)
print("grandchild ready", flush=True)
time.sleep(60)
'''])
import signal
signal.signal(signal.SIGTERM, lambda s, f: (child.wait(), sys.exit(0)))
time.sleep(60)
""")
    proc = job.start()
    assert proc.stdout.readline() == b"grandchild ready\n"
    proc.send_signal(signal.SIGTERM)
    proc.communicate(timeout=30)
    assert os.path.exists(job.path("model", "grandchild"))


def test_user_process_killed_by_sigterm_fails(make_job):
    job = make_job(hps={"sagemaker_program": "\"train.py\""})
    job.write_code("train.py", "import time\nprint('ready', flush=True)\ntime.sleep(60)\n")
    proc = job.start()
    assert proc.stdout.readline() == b"ready\n"
    proc.send_signal(signal.SIGTERM)
    proc.communicate(timeout=30)
    assert proc.returncode == 1
    assert job.failure().startswith("ExecuteUserScriptError:\nExitCode 143\n")


# ---------------------------------------------------------------------------------------------
# Code staging (contract 7.1)

def make_tarball(path, files, extra_members=()):
    with tarfile.open(path, "w:gz") as tar:
        for name, text in files.items():
            data = text.encode()
            info = tarfile.TarInfo(name)
            info.size = len(data)
            info.mode = 0o644
            tar.addfile(info, io.BytesIO(data))
        for info in extra_members:
            tar.addfile(info, io.BytesIO(b"x" * info.size) if info.isfile() else None)


def test_code_channel_tarball_is_extracted(make_job):
    job = make_job(hps={"sagemaker_program": "\"train.py\"",
                        "sagemaker_submit_directory":
                            "\"/opt/ml/input/data/code/sourcedir.tar.gz\""})
    # The hyperparameter names the real path; this tree lives elsewhere, so re-point it.
    tarball = job.path("input", "data", "code", "sourcedir.tar.gz")
    os.makedirs(os.path.dirname(tarball))
    make_tarball(tarball, {"train.py": DUMP_SCRIPT, "lib/helper.py": "X = 1\n"})
    job.write_config("hyperparameters.json", {
        "sagemaker_program": "\"train.py\"",
        "sagemaker_submit_directory": json.dumps(tarball)})
    rc, out, err = job.run()
    assert rc == 0, err
    assert os.path.exists(job.path("code", "lib", "helper.py"))
    assert job.seen()["env"]["SM_MODULE_DIR"] == tarball


def test_traversal_member_tarball_is_rejected(make_job, tmp_path):
    job = make_job()
    tarball = str(tmp_path / "evil.tar.gz")
    evil = tarfile.TarInfo("../../escaped.py")
    evil.size = 1
    make_tarball(tarball, {"train.py": DUMP_SCRIPT}, extra_members=[evil])
    job.write_config("hyperparameters.json", {
        "sagemaker_program": "\"train.py\"", "sagemaker_submit_directory": json.dumps(tarball)})
    rc, _, _ = job.run()
    assert rc == 1
    assert "outside" in job.failure()
    assert not os.path.exists(os.path.join(job.base, "escaped.py"))
    assert os.listdir(job.path("code")) == []


def test_symlink_escaping_tarball_is_rejected(make_job, tmp_path):
    job = make_job()
    tarball = str(tmp_path / "link.tar.gz")
    link = tarfile.TarInfo("data")
    link.type = tarfile.SYMTYPE
    link.linkname = "/etc"
    make_tarball(tarball, {"train.py": DUMP_SCRIPT}, extra_members=[link])
    job.write_config("hyperparameters.json", {
        "sagemaker_program": "\"train.py\"", "sagemaker_submit_directory": json.dumps(tarball)})
    rc, _, _ = job.run()
    assert rc == 1
    assert "outside" in job.failure()


def test_prestaged_code_is_not_replaced(make_job, tmp_path):
    job = make_job()
    job.write_code("train.py", DUMP_SCRIPT)
    job.write_config("hyperparameters.json", {
        "sagemaker_program": "\"train.py\"",
        "sagemaker_submit_directory": "\"s3://bucket/job/source/sourcedir.tar.gz\""})
    rc, _, err = job.run()
    assert rc == 0, err  # no download attempted: /opt/ml/code already has the code


def test_local_directory_is_copied(make_job, tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    (src / "train.py").write_text(DUMP_SCRIPT)
    job = make_job(hps={"sagemaker_program": "\"train.py\"",
                        "sagemaker_submit_directory": json.dumps(str(src))})
    rc, _, err = job.run()
    assert rc == 0, err
    assert job.seen()["cwd"] == job.path("code")


# ---------------------------------------------------------------------------------------------
# Dependencies

def test_requirements_offline_fails_with_message(make_job):
    job = make_job(hps={"sagemaker_program": "\"train.py\""})
    job.write_code("train.py", DUMP_SCRIPT)
    job.write_code("requirements.txt", "definitely-not-a-real-package-kiln==1.0\n")
    rc, _, err = job.run(extra_env={"PIP_INDEX_URL": "http://127.0.0.1:9/simple",
                                    "PIP_RETRIES": "0", "PIP_TIMEOUT": "1",
                                    "PIP_TARGET": str(job.root / "target")})
    assert rc == 1
    failure = job.failure()
    assert failure.startswith("InstallRequirementsError:\nExitCode ")
    assert ('Command "%s -m pip install -r requirements.txt"' % PYTHON) in failure
    assert "could not install the job's requirements" in failure
    assert "prepared interpreter" in failure
    assert not os.path.exists(job.path("output", "data", "seen.json"))


def test_requirements_without_pip_fails_with_message(make_job, tmp_path):
    # An interpreter without pip: Python's isolated mode (-I) with a sitecustomize would be
    # heavy; instead run the launcher with -S -I so site-packages (and pip in dist-packages)
    # are not importable. /usr/lib/python3/dist-packages holds Debian's pip.
    job = make_job(hps={"sagemaker_program": "\"train.py\""})
    job.write_code("train.py", DUMP_SCRIPT)
    job.write_code("requirements.txt", "numpy\n")
    proc = subprocess.run([PYTHON, "-S", "-I", TRAIN_PY], cwd=job.path("code"), env=job.env(),
                          capture_output=True, timeout=60)
    probe = subprocess.run([PYTHON, "-S", "-I", "-c", "import pip"], capture_output=True)
    if probe.returncode == 0:
        pytest.skip("pip is importable even without site-packages here")
    assert proc.returncode == 1
    failure = job.failure()
    assert failure.startswith('InstallRequirementsError:\nExitCode 1\nErrorMessage "')
    assert "No module named pip" in failure
    assert "prepared interpreter" in failure


def test_skip_requirements(make_job):
    job = make_job(hps={"sagemaker_program": "\"train.py\""})
    job.write_code("train.py", DUMP_SCRIPT)
    job.write_code("requirements.txt", "definitely-not-a-real-package-kiln==1.0\n")
    rc, _, err = job.run(extra_env={"KILN_SKIP_REQUIREMENTS": "1"})
    assert rc == 0, err
    assert "KILN_SKIP_REQUIREMENTS=1" in err


# ---------------------------------------------------------------------------------------------
# Distribution (contract 12.2), with stand-in launchers on PATH that record what they got

RECORDER = """#!/bin/sh
python3 - "$@" <<'EOF'
import json, os, sys
with open(os.path.join(os.environ["SM_OUTPUT_DATA_DIR"], "launcher.json"), "w") as f:
    json.dump({"argv": sys.argv[1:], "env": dict(os.environ)}, f)
EOF
"""


def test_torch_distributed_single_host(make_job):
    hps = dict(SDK_HPS)
    hps["sagemaker_submit_directory"] = "\"/opt/ml/code\""
    hps["sagemaker_torch_distributed_enabled"] = "true"
    job = make_job(hps=hps)
    job.fake_tool("nvidia-smi", "#!/bin/sh\nfor i in 0 1 2 3; do echo \"GPU $i: x\"; done\n")
    job.fake_tool("torchrun", RECORDER)
    job.write_code("train.py", DUMP_SCRIPT)
    rc, _, err = job.run(extra_env={"PATH": job.bin + ":/usr/bin:/bin"})
    assert rc == 0, err
    with open(job.path("output", "data", "launcher.json")) as f:
        got = json.load(f)
    assert got["argv"] == ["--nnodes", "1", "--nproc_per_node", "4", "train.py",
                           "--batch-size", "64", "--epochs", "25", "--lr", "0.001",
                           "--use-amp", "True"]
    assert got["env"]["MASTER_ADDR"] == "algo-1"
    assert got["env"]["MASTER_PORT"] == "7777"
    assert got["env"]["NCCL_SOCKET_IFNAME"] == "eth0"
    assert got["env"]["SM_DISTRIBUTION_INSTANCE_GROUPS"] == '["homogeneousCluster"]'
    assert "torchrun --nnodes 1 --nproc_per_node 4 train.py" in err


def test_torch_distributed_multi_host_flags(make_job):
    hps = {"sagemaker_program": "\"train.py\"", "sagemaker_torch_distributed_enabled": "true",
           "epochs": "2"}
    hosts = ["127.0.0.1", "127.0.0.2", "127.0.0.3"]  # resolvable stand-ins for algo-1..3
    job = make_job(hps=hps, resource_config=dict(
        RESOURCE_CONFIG_3, hosts=hosts, current_host=hosts[1],
        instance_groups=[dict(RESOURCE_CONFIG_3["instance_groups"][0], hosts=hosts)]))
    no_gpus(job)
    job.fake_tool("torchrun", RECORDER)
    job.write_code("train.py", DUMP_SCRIPT)
    rc, _, err = job.run(extra_env={"PATH": job.bin + ":/usr/bin:/bin"})
    assert rc == 0, err
    with open(job.path("output", "data", "launcher.json")) as f:
        got = json.load(f)
    assert got["argv"] == ["--nnodes", "3", "--nproc_per_node", "1", "--master_addr",
                           hosts[0], "--master_port", "7777", "--node_rank", "1", "train.py",
                           "--epochs", "2"]
    assert got["env"]["MASTER_ADDR"] == hosts[0]


def test_dns_wait_failure_is_reported(make_job):
    job = make_job(hps={"sagemaker_program": "\"train.py\""},
                   resource_config=dict(RESOURCE_CONFIG_3, hosts=[
                       "algo-1.kiln-does-not-exist.invalid", "algo-2"]))
    job.write_code("train.py", DUMP_SCRIPT)
    rc, _, _ = job.run(extra_env={"KILN_DNS_WAIT_SECONDS": "0"})
    assert rc == 1
    assert "Could not resolve host algo-1.kiln-does-not-exist.invalid" in job.failure()


def test_mpi_without_mpirun_fails_clearly(make_job):
    job = make_job(hps={"sagemaker_program": "\"train.py\"", "sagemaker_mpi_enabled": "true",
                        "sagemaker_mpi_num_of_processes_per_host": "2"})
    no_gpus(job)
    job.write_code("train.py", DUMP_SCRIPT)
    env_path = job.bin + ":/nonexistent"
    rc, _, _ = job.run(extra_env={"PATH": env_path}, python=job.lone_python())
    assert rc == 1
    assert "mpirun is not installed" in job.failure()


def test_mpi_single_host_command(make_job):
    job = make_job(hps={"sagemaker_program": "\"train.py\"", "sagemaker_mpi_enabled": "true",
                        "sagemaker_mpi_num_of_processes_per_host": "2",
                        "sagemaker_mpi_custom_mpi_options": "\"-x FOO=1 --verbose\"",
                        "lr": "0.1"})
    no_gpus(job)
    job.fake_tool("mpirun", RECORDER)
    job.write_code("train.py", DUMP_SCRIPT)
    python = job.lone_python()
    rc, _, err = job.run(extra_env={"PATH": job.bin + ":/usr/bin:/bin"}, python=python)
    assert rc == 0, err
    with open(job.path("output", "data", "launcher.json")) as f:
        argv = json.load(f)["argv"]
    assert argv[:6] == ["--host", "algo-1:2", "-np", "2", "--allow-run-as-root",
                        "--tag-output"]
    joined = " ".join(argv)
    assert "-mca btl_tcp_if_include eth0 -mca oob_tcp_if_include eth0" in joined
    assert "-mca orte_abort_on_non_zero_status 1" in joined
    assert "-x NCCL_SOCKET_IFNAME=eth0" in joined
    assert "-x SM_HPS" in joined
    assert argv[-9:] == ["-x", "FOO=1", "--verbose", python, "-m", "mpi4py", "train.py",
                         "--lr", "0.1"]
    assert argv[-2:] == ["--lr", "0.1"]


# ---------------------------------------------------------------------------------------------
# Start-up cost

def test_launcher_overhead_is_small(make_job):
    job = make_job(hps={"sagemaker_program": "\"train.py\""})
    no_gpus(job)
    job.write_code("train.py", "print('hi')\n")
    best = None
    for _ in range(3):
        t0 = time.monotonic()
        rc, _, err = job.run()
        dt = time.monotonic() - t0
        assert rc == 0, err
        os.unlink(job.path("output", "success"))
        best = dt if best is None else min(best, dt)
    # Two interpreter start-ups plus the launcher's work; generous bound for loaded CI.
    assert best < 2.0
