"""Kiln's training launcher: the `train` entry of images that map to a Python environment.

Plays the part of sagemaker-training-toolkit + sagemaker-pytorch-training-toolkit inside a Kiln
instance (training contract sections 5.2, 7, 12.2). Run it by path with the environment's own
interpreter, cwd /opt/ml/code:

    <interpreter> /path/to/python/kiln_toolkit/train.py

Standard library only (Debian's /usr/bin/python3 3.11 must do). It never puts its own directory
on the user's PYTHONPATH. See python/README.md for the rules it follows and where it deviates
from the real toolkit (and why).

Exit codes (contract 7.2): 0 success; 1 for client errors (user script failed, bad module, pip
failure, bad code archive); otherwise the errno of an unexpected error, else 1; 128+15 when
stopped before the user code started.
"""

import json
import os
import signal
import sys
import time

LOGGER_NAME = "sagemaker-training-toolkit"
REGION_PARAM = "sagemaker_region"
JOB_NAME_PARAM = "sagemaker_job_name"
PROGRAM_PARAM = "sagemaker_program"
SUBMIT_DIR_PARAM = "sagemaker_submit_directory"
LOG_LEVEL_PARAM = "sagemaker_container_log_level"
S3_OUTPUT_PARAM = "sagemaker_s3_output"
MPI_PROCESSES_PER_HOST = "sagemaker_mpi_num_of_processes_per_host"
MPI_NUM_PROCESSES = "sagemaker_mpi_num_processes"
MPI_CUSTOM_OPTIONS = "sagemaker_mpi_custom_mpi_options"
SMDDP_CUSTOM_OPTIONS = "sagemaker_distributed_dataparallel_custom_mpi_options"

# Keys the toolkit treats as platform keys (params.SAGEMAKER_HYPERPARAMETERS). Every key with
# the sagemaker_ prefix is removed from the user hyperparameters too; the ones listed here are
# additionally kept out of SM_FRAMEWORK_PARAMS.
SAGEMAKER_HYPERPARAMETERS = (
    PROGRAM_PARAM,
    SUBMIT_DIR_PARAM,
    "sagemaker_enable_cloudwatch_metrics",
    REGION_PARAM,
    LOG_LEVEL_PARAM,
    JOB_NAME_PARAM,
    "default_user_module_name",
    "_tuning_objective_metric",
    S3_OUTPUT_PARAM,
)
SAGEMAKER_PREFIX = "sagemaker_"

# Launchers that put the current instance group into distribution_instance_groups
# (environment.get_distribution_instance_groups_from_resource_config).
DISTRIBUTION_FLAGS = (
    "sagemaker_mpi_enabled",
    "sagemaker_parameter_server_enabled",
    "sagemaker_distributed_dataparallel_enabled",
    "sagemaker_pytorch_ddp_enabled",
    "sagemaker_pytorch_xla_multi_worker_enabled",
    "sagemaker_multi_worker_mirrored_strategy_enabled",
    "sagemaker_torch_distributed_enabled",
)

# Substrings that start the ErrorMessage capture in the failure file (sagemaker_training's
# _PYTHON_ERRORS_ + _MPI_ERRORS_ + the error class the PyTorch toolkit watches for).
_ERROR_MARKERS = (
    "BaseException", "Exception", "ArithmeticError", "AssertionError", "AttributeError",
    "BlockingIOError", "BrokenPipeError", "BufferError", "ChildProcessError",
    "ConnectionAbortedError", "ConnectionError", "ConnectionRefusedError",
    "ConnectionResetError", "EOFError", "EnvironmentError", "FileExistsError",
    "FileNotFoundError", "FloatingPointError", "IOError", "ImportError", "IndentationError",
    "IndexError", "InterruptedError", "IsADirectoryError", "KeyError", "LookupError",
    "MemoryError", "ModuleNotFoundError", "NameError", "NotADirectoryError",
    "NotImplementedError", "OSError", "OverflowError", "PermissionError",
    "ProcessLookupError", "RecursionError", "ReferenceError", "RuntimeError", "SyntaxError",
    "SystemError", "TabError", "TimeoutError", "TypeError", "UnboundLocalError",
    "UnicodeDecodeError", "UnicodeEncodeError", "UnicodeError", "UnicodeTranslateError",
    "ValueError", "ZeroDivisionError", "Invalid requirement", "ResourceExhaustedError",
    "OutOfRangeError", "InvalidArgumentError", "mpirun.real", "ORTE", "ExecuteUserScriptError",
)

MASTER_PORT = "7777"
SMDDP_SERVER_PORT = "7592"
OOM_INFO = "OutOfMemory: Process killed by SIGKILL (signal 9)"
PIP_HINT = (
    "Kiln: this environment could not install the job's requirements. Kiln environments can be "
    "configured with a prepared interpreter that already has the dependencies (then set "
    "KILN_SKIP_REQUIREMENTS=1 in the job's Environment to skip the install)."
)


# --------------------------------------------------------------------------------------------
# Logging in the toolkit's format ("%(asctime)s %(name)-12s %(levelname)-8s %(message)s").

_log_level = 20


def log(level, msg):
    if level < _log_level:
        return
    name = {10: "DEBUG", 20: "INFO", 30: "WARNING", 40: "ERROR"}.get(level, "INFO")
    now = time.time()
    stamp = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(now)) + ",%03d" % (
        int(now * 1000) % 1000)
    try:
        sys.stderr.write("%s %-12s %-8s %s\n" % (stamp, LOGGER_NAME, name, msg))
        sys.stderr.flush()
    except (OSError, ValueError):
        pass


# --------------------------------------------------------------------------------------------
# Errors. ClientError subclasses end the launcher with exit 1 and str(e) as the failure file.

class ClientError(Exception):
    pass


class CalledProcessError(ClientError):
    """_CalledProcessError of the toolkit: its str() is the failure-file text."""

    def __init__(self, cmd, return_code=None, output=None, info=None):
        super().__init__()
        self.return_code = str(return_code)
        self.cmd = cmd
        self.output = output
        self.extra_info = info

    def __str__(self):
        error_msg = self.output or ""
        if self.extra_info is None:
            message = '%s:\nExitCode %s\nErrorMessage "%s"\nCommand "%s"' % (
                type(self).__name__, self.return_code, error_msg, self.cmd)
        else:
            message = '%s:\nExitCode %s\nErrorMessage "%s"\nExtraInfo "%s"\nCommand "%s"' % (
                type(self).__name__, self.return_code, error_msg, self.extra_info, self.cmd)
        return message.strip()


class InstallModuleError(CalledProcessError):
    pass


class InstallRequirementsError(CalledProcessError):
    pass


class ExecuteUserScriptError(CalledProcessError):
    pass


class ImportModuleError(ClientError):
    pass


class Stopped(Exception):
    """SIGTERM arrived before the user code started."""


# --------------------------------------------------------------------------------------------
# Paths (environment.py: everything hangs off SAGEMAKER_BASE_DIR, default /opt/ml).

class Paths:
    def __init__(self, base):
        self.base_dir = base
        self.code_dir = os.path.join(base, "code")
        self.model_dir = os.path.join(base, "model")
        self.input_dir = os.path.join(base, "input")
        self.input_data_dir = os.path.join(self.input_dir, "data")
        self.input_config_dir = os.path.join(self.input_dir, "config")
        self.output_dir = os.path.join(base, "output")
        self.output_data_dir = os.path.join(self.output_dir, "data")
        self.output_intermediate_dir = os.path.join(self.output_dir, "intermediate")


def read_json(path):
    with open(path, "r", encoding="utf-8") as f:
        return json.load(f)


def decode_hyperparameters(raw):
    """Each value JSON-decoded, the raw string kept when that fails (read_hyperparameters)."""
    out = {}
    for k, v in raw.items():
        try:
            v = json.loads(v)
        except (ValueError, TypeError):
            pass
        out[k] = v
    return out


def num_gpus():
    """Lines starting with "GPU " in `nvidia-smi --list-gpus`; 0 when the command fails.

    Kiln's process runtime hides unassigned /dev/nvidia<N> nodes so nvidia-smi lists exactly
    the instance's GPUs (contract 13); CUDA_VISIBLE_DEVICES is not consulted, as in the toolkit.
    """
    import subprocess
    try:
        out = subprocess.check_output(["nvidia-smi", "--list-gpus"],
                                      stderr=subprocess.DEVNULL).decode("utf-8", "replace")
        return sum(1 for x in out.split("\n") if x.startswith("GPU "))
    except (OSError, subprocess.CalledProcessError):
        return 0


def num_neurons():
    """Sum of nc_count over `neuron-ls -j`; 0 when neuron-ls is missing or fails."""
    import subprocess
    try:
        out = subprocess.check_output(["neuron-ls", "-j"], stderr=subprocess.STDOUT)
        return sum(int(item.get("nc_count", 0)) for item in json.loads(out.decode("utf-8")))
    except (OSError, subprocess.CalledProcessError, ValueError, TypeError, AttributeError):
        return 0


def num_cpus():
    """CPUs this process may run on.

    The toolkit uses multiprocessing.cpu_count(), which inside a container equals the cpuset.
    Kiln's process runtime pins the instance with sched_setaffinity instead, and in Python 3.11
    cpu_count() ignores affinity (it reports every CPU of the node), so the affinity mask is
    what gives the same number as the container's cpuset (contract 5.2).
    """
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def which(name):
    """shutil.which without importing shutil (start-up time is on the job's critical path)."""
    for d in os.environ.get("PATH", os.defpath).split(os.pathsep):
        p = os.path.join(d or ".", name)
        if os.access(p, os.X_OK) and not os.path.isdir(p):
            return p
    return None


# --------------------------------------------------------------------------------------------
# mapping.py: to_env_vars / to_cmd_args.

def _decode(obj):
    if obj is None:
        return ""
    if isinstance(obj, bytes):
        return obj.decode("latin1")
    return str(obj)


def to_cmd_args(mapping):
    """Keys sorted; --key (or -k for one character), then str() of the decoded value;
    dicts as k1=v1,k2=v2 with keys sorted."""
    args = []
    for key in sorted(mapping.keys()):
        name = _decode(key)
        args.append(("--%s" % name if len(name) > 1 else "-%s" % name) if name else "")
        value = mapping[key]
        if hasattr(value, "items"):
            args.append(",".join("%s=%s" % (k, v) for k, v in sorted(value.items())))
        else:
            args.append(_decode(value))
    return args


def env_value(value):
    if isinstance(value, bytes):
        return value.decode("latin1")
    if value is None:
        return ""
    if isinstance(value, str):
        return value
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=True)


def to_env_vars(mapping):
    return {("SM_%s" % str(k).upper() if k else ""): env_value(v) for k, v in mapping.items()}


# --------------------------------------------------------------------------------------------
# environment.Environment, reduced to the values it exports.

class TrainingEnv:
    def __init__(self, paths, environ):
        self.paths = paths
        resource_config = read_json(os.path.join(paths.input_config_dir, "resourceconfig.json"))
        input_data_config = read_json(
            os.path.join(paths.input_config_dir, "inputdataconfig.json"))
        all_hps = decode_hyperparameters(
            read_json(os.path.join(paths.input_config_dir, "hyperparameters.json")))

        self.num_gpus = num_gpus()
        self.num_cpus = num_cpus()
        self.num_neurons = num_neurons()

        self.resource_config = resource_config
        self.input_data_config = input_data_config
        self.hosts = resource_config["hosts"]
        self.current_host = resource_config["current_host"]
        self.current_instance_type = resource_config.get("current_instance_type", "local")
        self.current_instance_group = resource_config.get("current_group_name",
                                                          "homogeneousCluster")
        self.network_interface_name = resource_config.get("network_interface_name", "eth0")

        sm_hps = {k: v for k, v in all_hps.items()
                  if k in SAGEMAKER_HYPERPARAMETERS or k.startswith(SAGEMAKER_PREFIX)}
        self.hyperparameters = {k: v for k, v in all_hps.items() if k not in sm_hps}
        self.additional_framework_parameters = {
            k: v for k, v in sm_hps.items() if k not in SAGEMAKER_HYPERPARAMETERS}

        region = sm_hps.get(REGION_PARAM,
                            environ.get("AWS_DEFAULT_REGION") or environ.get("AWS_REGION"))
        # Exported for the user process, exactly as Environment.__init__ does.
        self.exports = {
            "SAGEMAKER_JOB_NAME": _decode(sm_hps.get(JOB_NAME_PARAM, "")),
            "CURRENT_HOST": self.current_host,
            "SAGEMAKER_REGION": _decode(region or ""),
        }

        program_env = environ.get("SAGEMAKER_PROGRAM")
        module_name = program_env
        if module_name is None:
            module_name = str(sm_hps.get(PROGRAM_PARAM, None))
        self._module_name = module_name
        self.user_entry_point = program_env or sm_hps.get(PROGRAM_PARAM)
        # The toolkit reads SAGEMAKER_SUBMIT_DIRECTORY and then overwrites it with the
        # hyperparameter or code_dir; Kiln lets the variable stand in for a missing
        # hyperparameter (images bake it in with ENV), which is what the contract describes.
        self.module_dir = str(sm_hps.get(SUBMIT_DIR_PARAM,
                                         environ.get("SAGEMAKER_SUBMIT_DIRECTORY",
                                                     paths.code_dir)))
        self.log_level = sm_hps.get(LOG_LEVEL_PARAM, 20)
        self.sagemaker_s3_output = sm_hps.get(S3_OUTPUT_PARAM)
        self.framework_module = environ.get("SAGEMAKER_TRAINING_MODULE")
        self.job_name = environ.get("TRAINING_JOB_NAME")
        self.channel_input_dirs = {ch: os.path.join(paths.input_data_dir, ch)
                                   for ch in input_data_config}

        groups = resource_config.get("instance_groups", [])
        self.current_instance_group_hosts = []
        for group in groups:
            if group["instance_group_name"] == self.current_instance_group:
                self.current_instance_group_hosts = group["hosts"]
                break
        self.instance_groups = [g["instance_group_name"] for g in groups]
        self.instance_groups_dict = {g["instance_group_name"]: g for g in groups}

        default_groups = []
        if any(self.additional_framework_parameters.get(f, False) for f in DISTRIBUTION_FLAGS):
            default_groups.append(resource_config.get("current_group_name",
                                                      "homogeneousCluster"))
        self.distribution_instance_groups = self.additional_framework_parameters.get(
            "sagemaker_distribution_instance_groups", default_groups)
        if groups:
            self.distribution_hosts = []
            for g in groups:
                if g["instance_group_name"] in self.distribution_instance_groups:
                    self.distribution_hosts.extend(g["hosts"])
        else:
            self.distribution_hosts = list(self.hosts)
        self.is_hetero = len(self.instance_groups) > 1
        self.master_hostname = (list(self.distribution_hosts)[0] if self.distribution_hosts
                                else list(self.hosts)[0])
        self.is_master = self.current_host == self.master_hostname
        mp = environ.get("SM_HP_MP_PARAMETERS")
        self.is_modelparallel_enabled = mp and mp != "{}"
        self.is_smddpmprun_installed = which("smddpmprun") is not None

    @property
    def module_name(self):
        name = self._module_name
        if name and name.endswith(".py"):
            return name[:-3]
        return name

    def properties(self):
        """dict(Environment): every public property, the content of SM_TRAINING_ENV."""
        p = self.paths
        return {
            "additional_framework_parameters": self.additional_framework_parameters,
            "channel_input_dirs": self.channel_input_dirs,
            "current_host": self.current_host,
            "current_instance_group": self.current_instance_group,
            "current_instance_group_hosts": self.current_instance_group_hosts,
            "current_instance_type": self.current_instance_type,
            "distribution_hosts": self.distribution_hosts,
            "distribution_instance_groups": self.distribution_instance_groups,
            "framework_module": self.framework_module,
            "hosts": self.hosts,
            "hyperparameters": self.hyperparameters,
            "input_config_dir": p.input_config_dir,
            "input_data_config": self.input_data_config,
            "input_dir": p.input_dir,
            "instance_groups": self.instance_groups,
            "instance_groups_dict": self.instance_groups_dict,
            "is_hetero": self.is_hetero,
            "is_master": self.is_master,
            "is_modelparallel_enabled": self.is_modelparallel_enabled,
            "is_smddpmprun_installed": self.is_smddpmprun_installed,
            "job_name": self.job_name,
            "log_level": self.log_level,
            "master_hostname": self.master_hostname,
            "model_dir": p.model_dir,
            "module_dir": self.module_dir,
            "module_name": self.module_name,
            "network_interface_name": self.network_interface_name,
            "num_cpus": self.num_cpus,
            "num_gpus": self.num_gpus,
            "num_neurons": self.num_neurons,
            "output_data_dir": p.output_data_dir,
            "output_dir": p.output_dir,
            "output_intermediate_dir": p.output_intermediate_dir,
            "resource_config": self.resource_config,
            "user_entry_point": self.user_entry_point,
        }

    def to_cmd_args(self):
        return to_cmd_args(self.hyperparameters)

    def to_env_vars(self):
        p = self.paths
        env = {
            "hosts": self.hosts,
            "network_interface_name": self.network_interface_name,
            "hps": self.hyperparameters,
            "user_entry_point": self.user_entry_point,
            "framework_params": self.additional_framework_parameters,
            "resource_config": self.resource_config,
            "input_data_config": self.input_data_config,
            "output_data_dir": p.output_data_dir,
            "channels": sorted(self.channel_input_dirs.keys()),
            "current_host": self.current_host,
            "current_instance_type": self.current_instance_type,
            "current_instance_group": self.current_instance_group,
            "current_instance_group_hosts": self.current_instance_group_hosts,
            "instance_groups": self.instance_groups,
            "instance_groups_dict": self.instance_groups_dict,
            "distribution_instance_groups": self.distribution_instance_groups,
            "is_hetero": self.is_hetero,
            "module_name": self.module_name,
            "log_level": self.log_level,
            "framework_module": self.framework_module,
            "input_dir": p.input_dir,
            "input_config_dir": p.input_config_dir,
            "output_dir": p.output_dir,
            "num_cpus": self.num_cpus,
            "num_gpus": self.num_gpus,
            "num_neurons": self.num_neurons,
            "model_dir": p.model_dir,
            "module_dir": self.module_dir,
            "training_env": self.properties(),
            "user_args": self.to_cmd_args(),
            "output_intermediate_dir": p.output_intermediate_dir,
        }
        for name, path in self.channel_input_dirs.items():
            env["channel_%s" % name] = path
        for key, value in self.hyperparameters.items():
            env["hp_%s" % key] = value
        return to_env_vars(env)


# --------------------------------------------------------------------------------------------
# Child processes: one at a time, in their own process group, SIGTERM forwarded.

class Supervisor:
    """Runs children and forwards SIGTERM/SIGINT to the current child's process group.

    The launcher is PID 1 of the instance's sandbox: the kernel drops signals PID 1 has no
    handler for, and orphans are re-parented to it, so it installs handlers and reaps every
    child while it waits.
    """

    def __init__(self):
        self.child = None
        self.stop_signal = None

    def install(self):
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, self._on_signal)

    def _on_signal(self, signum, frame):
        self.stop_signal = signum
        child = self.child
        if child is not None:
            log(20, "Received signal %d, forwarding it to process group %d" % (signum, child.pid))
            try:
                os.killpg(child.pid, signum)
            except OSError:
                try:
                    os.kill(child.pid, signum)
                except OSError:
                    pass

    def check_stopped(self):
        if self.stop_signal is not None:
            raise Stopped()

    def run(self, cmd, cwd, env, capture_stderr):
        """Runs cmd to completion; returns (exit code as a shell reports it, error text).

        stdout is inherited (no relaying, so log timestamps stay accurate). With capture_stderr
        stderr passes through a thread that copies every chunk to our stderr at once and keeps
        the error text the toolkit reports (its process.watch rules).
        """
        import subprocess
        watcher = None
        self.check_stopped()
        try:
            proc = subprocess.Popen(cmd, cwd=cwd, env=env, process_group=0,
                                    stdin=subprocess.DEVNULL,
                                    stderr=subprocess.PIPE if capture_stderr else None)
        except OSError as e:
            raise ExecuteUserScriptError(" ".join(cmd), return_code=1, output=str(e))
        self.child = proc
        if self.stop_signal is not None:  # arrived between the check and Popen
            self._on_signal(self.stop_signal, None)
        if capture_stderr:
            import threading
            watcher = StderrWatcher(proc.stderr)
            thread = threading.Thread(target=watcher.pump, daemon=True)
            thread.start()
        status = self._reap(proc.pid)
        proc.returncode = os.waitstatus_to_exitcode(status)
        self.child = None
        if watcher is not None:
            thread.join()
            proc.stderr.close()
        rc = proc.returncode
        if rc < 0:
            rc = 128 - rc  # killed by a signal: report it the way a shell (and docker) does
        return rc, (watcher.message() if watcher else None), (
            watcher.tail() if watcher else "")

    @staticmethod
    def _reap(pid):
        while True:
            try:
                got, status = os.waitpid(-1, 0)
            except ChildProcessError:
                # Someone else reaped it (cannot happen here); treat as a clean exit.
                return 0
            if got == pid:
                return status


class StderrWatcher:
    """Copies the child's stderr to ours and keeps what the toolkit puts in ErrorMessage:
    every distinct line from the first one that names a known error class on."""

    MAX_LINES = 256
    TAIL_LINES = 10

    def __init__(self, stream):
        self.stream = stream
        self.lines = []
        self.seen = set()
        self.started = False
        self.recent = []

    def pump(self):
        fd = self.stream.fileno()
        pending = b""
        while True:
            try:
                chunk = os.read(fd, 65536)
            except InterruptedError:
                continue
            except OSError:
                break
            if not chunk:
                break
            _write_all(2, chunk)
            pending += chunk
            *complete, pending = pending.split(b"\n")
            for raw in complete:
                self._line(raw.decode("utf-8", "replace"))
        if pending:
            self._line(pending.decode("utf-8", "replace"))

    def _line(self, line):
        line = line.rstrip("\r")
        if line.strip():
            self.recent.append(line)
            if len(self.recent) > self.TAIL_LINES:
                del self.recent[0]
        if not self.started:
            if any(m in line for m in _ERROR_MARKERS):
                self.started = True
            else:
                return
        entry = line.strip(" :\n")
        if entry in self.seen or len(self.lines) >= self.MAX_LINES:
            return
        self.seen.add(entry)
        self.lines.append(entry)

    def message(self):
        # " ".join of "line\n" entries, then duplicate lines dropped and the whole stripped,
        # as process.check_error does; hence the leading space on every line but the first.
        text = " " + " ".join(x + "\n" for x in self.lines)
        return "\n".join(dict.fromkeys(text.split("\n"))).strip()

    def tail(self):
        return "\n".join(self.recent)


def _write_all(fd, data):
    while data:
        try:
            n = os.write(fd, data)
        except InterruptedError:
            continue
        except OSError:
            return
        data = data[n:]


def check_error(sup, cmd, error_class, cwd, env, display_cmd=None, fallback_tail=False):
    rc, message, tail = sup.run(cmd, cwd, env, capture_stderr=True)
    if rc:
        info = OOM_INFO if rc == 137 else None
        if not message and fallback_tail:
            message = tail
        raise error_class(display_cmd or " ".join(cmd), return_code=rc, output=message,
                          info=info)


# --------------------------------------------------------------------------------------------
# Code: files.download_and_extract.

def safe_extract(archive, dest):
    """Extracts a tar archive into dest; refuses the whole archive when any member would land
    outside dest (absolute names, '..', links leaving dest) or is a device/FIFO."""
    import tarfile
    try:
        tar = tarfile.open(name=archive, mode="r:*")
    except (tarfile.TarError, OSError) as e:
        raise ClientError("Could not open the code archive %s: %s" % (archive, e))
    with tar:
        root = os.path.realpath(dest)
        members = tar.getmembers()
        for m in members:
            name = m.name
            target = os.path.realpath(os.path.join(root, name))
            bad = (os.path.isabs(name) or ".." in name.replace("\\", "/").split("/")
                   or not (target == root or target.startswith(root + os.sep)))
            if not bad and (m.issym() or m.islnk()):
                base = root if m.islnk() else os.path.dirname(target)
                if os.path.isabs(m.linkname):
                    bad = True
                else:
                    link = os.path.realpath(os.path.join(base, m.linkname))
                    bad = not (link == root or link.startswith(root + os.sep))
            if not bad and (m.ischr() or m.isblk() or m.isfifo()):
                bad = True
            if bad:
                raise ClientError(
                    "Refusing the code archive %s: member %r would be extracted outside %s"
                    % (archive, name, dest))
        tar.extractall(path=dest, members=members)


def s3_download(url, dst, environ):
    from urllib.parse import urlparse
    parsed = urlparse(url)
    bucket, key = parsed.netloc, parsed.path.lstrip("/")
    try:
        import boto3  # only when Kiln did not pre-stage the code
    except ImportError:
        raise ClientError(
            "Kiln toolkit: the code at %s was not pre-staged into /opt/ml/code and boto3 is not "
            "importable in this interpreter, so it cannot be downloaded. Install boto3 in the "
            "environment or let Kiln stage the code." % url)
    region = environ.get("AWS_REGION", environ.get("SAGEMAKER_REGION"))
    endpoint = environ.get("S3_ENDPOINT_URL") or environ.get("AWS_ENDPOINT_URL_S3") or \
        environ.get("AWS_ENDPOINT_URL")
    s3 = boto3.resource("s3", region_name=region, endpoint_url=endpoint)
    s3.Bucket(bucket).download_file(key, dst)


def download_and_extract(uri, path, environ):
    if not os.path.exists(path):
        os.makedirs(path)
    if os.listdir(path):
        return  # pre-staged by Kiln's agent (the usual case): nothing to import or copy
    import shutil
    import tarfile
    import tempfile
    if uri.startswith("s3://"):
        tmp = tempfile.mkdtemp()
        try:
            dst = os.path.join(tmp, "tar_file")
            s3_download(uri, dst, environ)
            safe_extract(dst, path)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    elif os.path.isdir(uri):
        if os.path.realpath(uri) == os.path.realpath(path):
            return
        shutil.rmtree(path)
        shutil.copytree(uri, path)
    elif os.path.isfile(uri) and tarfile.is_tarfile(uri):
        safe_extract(uri, path)
    elif os.path.exists(uri):
        shutil.copy2(uri, path)
    else:
        raise ClientError("Code location %s does not exist" % uri)


# --------------------------------------------------------------------------------------------
# Entry point kinds (_entry_point_type) and installation (entry_point.install, modules.install).

PYTHON_PACKAGE, PYTHON_PROGRAM, COMMAND = "PYTHON_PACKAGE", "PYTHON_PROGRAM", "COMMAND"


def entry_point_type(path, name):
    if name.endswith(".sh"):
        return COMMAND
    if os.path.exists(os.path.join(path, "setup.py")):
        return PYTHON_PACKAGE
    if name.endswith(".py"):
        return PYTHON_PROGRAM
    return COMMAND


def _pip_available():
    import importlib.util
    return importlib.util.find_spec("pip") is not None


def install(sup, name, path, env):
    kind = entry_point_type(path, name)
    has_req = os.path.exists(os.path.join(path, "requirements.txt"))
    needs_pip = kind == PYTHON_PACKAGE or (kind == PYTHON_PROGRAM and has_req)
    if needs_pip and env.get("KILN_SKIP_REQUIREMENTS") == "1":
        log(20, "KILN_SKIP_REQUIREMENTS=1: not installing %s"
            % ("the package" if kind == PYTHON_PACKAGE else "requirements.txt"))
        needs_pip = False
    if needs_pip:
        py = sys.executable
        if kind == PYTHON_PACKAGE:
            cmd = [py, "-m", "pip", "install", "."] + (["-r", "requirements.txt"] if has_req
                                                      else [])
            err = InstallModuleError
            log(20, "Installing module with the following command:\n%s" % " ".join(cmd))
        else:
            cmd = [py, "-m", "pip", "install", "-r", "requirements.txt"]
            err = InstallRequirementsError
            log(20, "Installing dependencies from requirements.txt:\n%s" % " ".join(cmd))
        target = env.get("KILN_PIP_TARGET")
        if target:
            cmd[4:4] = ["--target", target]
            env["PYTHONPATH"] = target + ":" + env["PYTHONPATH"]
        if not _pip_available():
            raise err(" ".join(cmd), return_code=1,
                      output="%s: No module named pip" % py, info=PIP_HINT)
        try:
            check_error(sup, cmd, err, cwd=path, env=env, fallback_tail=True)
        except CalledProcessError as e:
            if e.extra_info is None:
                e.extra_info = PIP_HINT
            raise
    if kind == COMMAND:
        os.chmod(os.path.join(path, name), 0o777)
    return kind


def wait_hostname_resolution(hosts, current_host, environ):
    """Resolves every host, retrying with exponential back-off (100 ms doubling, at most 30 s
    between tries) for up to 15 minutes, as entry_point._wait_hostname_resolution does.

    Kiln: a single-host job talks to no other host, so nothing is looked up there.
    KILN_DNS_WAIT_SECONDS overrides the 15 minutes (tests)."""
    import socket
    if len(hosts) <= 1 and (not hosts or hosts[0] == current_host):
        return
    deadline = time.monotonic() + float(environ.get("KILN_DNS_WAIT_SECONDS", 900))
    for host in hosts:
        attempt = 0
        while True:
            try:
                socket.gethostbyname(host)
                break
            except OSError:
                attempt += 1
                delay = min(0.1 * (2 ** attempt), 30.0)
                if time.monotonic() + delay > deadline:
                    raise ClientError("Could not resolve host %s (DNS lookups for 15 minutes)"
                                      % host)
                time.sleep(delay)


# --------------------------------------------------------------------------------------------
# Launchers (ProcessRunner, TorchDistributedRunner, MPI / SMDataParallel master).

def _tool(name):
    """The tool on PATH (the toolkit runs it through a shell), else the one installed beside
    this interpreter (a venv's bin/ that is not on PATH)."""
    found = which(name)
    if found:
        return found
    beside = os.path.join(os.path.dirname(sys.executable), name)
    return beside if os.access(beside, os.X_OK) else None


def process_command(kind, name, args):
    py = sys.executable
    if kind == PYTHON_PACKAGE:
        return [py, "-m", name.replace(".py", "")] + args, None
    if kind == PYTHON_PROGRAM:
        return [py, name] + args, None
    import shlex
    inner = "./%s %s" % (name, " ".join(shlex.quote(a) for a in args))
    # The toolkit shows the command with the quotes it hands to its shell.
    return ["/bin/sh", "-c", inner], '/bin/sh -c "%s"' % inner


def torchrun_command(tenv, kind, name, args, processes_per_host):
    if kind == PYTHON_PACKAGE:
        raise ClientError("Python packages are not supported for torch_distributed. "
                          "Please use a python script as the entry-point")
    if kind != PYTHON_PROGRAM:
        raise ClientError("Unsupported entry point type for torch_distributed")
    hosts = tenv.distribution_hosts
    torchrun = _tool("torchrun")
    if torchrun:
        cmd, shown = [torchrun], ["torchrun"]
    else:
        cmd, shown = [sys.executable, "-m", "torch.distributed.run"], ["torchrun"]
    opts = ["--nnodes", str(len(hosts)), "--nproc_per_node", str(processes_per_host)]
    if len(hosts) > 1:
        opts += ["--master_addr", str(tenv.master_hostname), "--master_port", MASTER_PORT,
                 "--node_rank", str(hosts.index(tenv.current_host))]
    tail = opts + [str(name)] + args
    return cmd + tail, " ".join(shown + tail)


def mpi_command(tenv, kind, name, args, processes_per_host, env, smddp):
    """mpirun on the master with the toolkit's options (contract 12.2)."""
    mpirun = _tool("mpirun")
    if not mpirun:
        raise ClientError(
            "Kiln toolkit: this job asks for an MPI launch (%s) but mpirun is not installed "
            "in this environment. Install Open MPI (and mpi4py) in the environment, or use "
            "distribution={'torch_distributed': {'enabled': True}}."
            % ("pytorchddp/smdistributed" if smddp else "mpi"))
    iface = tenv.network_interface_name
    hosts = tenv.distribution_hosts
    num_processes = tenv.additional_framework_parameters.get(MPI_NUM_PROCESSES) or \
        len(hosts) * processes_per_host
    cmd = [mpirun, "--host", ",".join("%s:%s" % (h, processes_per_host) for h in hosts),
           "-np", str(num_processes), "--allow-run-as-root", "--tag-output",
           "-mca", "btl_tcp_if_include", iface, "-mca", "oob_tcp_if_include", iface,
           "-mca", "plm_rsh_no_tree_spawn", "1", "-bind-to", "none", "-map-by", "slot",
           "-mca", "pml", "ob1", "-mca", "btl", "^openib",
           "-mca", "orte_abort_on_non_zero_status", "1"]
    agent = env.get("KILN_MPI_RSH_AGENT")
    if agent:
        cmd += ["-mca", "plm_rsh_agent", agent]
    cmd += ["-x", "NCCL_SOCKET_IFNAME=%s" % iface, "-x", "NCCL_DEBUG=%s"
            % env.get("NCCL_DEBUG", "INFO")]
    if env.get("LD_PRELOAD"):
        cmd += ["-x", "LD_PRELOAD=%s" % env["LD_PRELOAD"]]
    for key in sorted(env):
        if key not in ("NCCL_SOCKET_IFNAME", "NCCL_DEBUG", "LD_PRELOAD") and \
                not key.startswith("BASH_FUNC"):
            cmd += ["-x", key]
    import shlex
    custom = tenv.additional_framework_parameters.get(
        SMDDP_CUSTOM_OPTIONS if smddp else MPI_CUSTOM_OPTIONS, "")
    cmd += shlex.split(str(custom or ""))
    if kind == PYTHON_PACKAGE:
        prog = [sys.executable, "-m", name.replace(".py", "")]
    elif kind == PYTHON_PROGRAM:
        prog = [sys.executable, "-m", "mpi4py", name] if not smddp else [sys.executable, name]
    else:
        prog = ["./%s" % name]
    if smddp and _tool("smddprun"):
        prog = [_tool("smddprun")] + prog
    cmd += prog + args
    return cmd, None


def mpi_worker_wait(sup, tenv):
    """Workers of an MPI job run nothing themselves: the master's mpirun starts orted here
    (through Kiln's remote-launch agent). Wait until orted has come and gone."""
    def orted_running():
        for pid in os.listdir("/proc"):
            if pid.isdigit():
                try:
                    with open("/proc/%s/comm" % pid) as f:
                        if f.read().strip() in ("orted", "prted"):
                            return True
                except OSError:
                    pass
        return False
    log(20, "MPI worker %s waiting for the master %s to start orted"
        % (tenv.current_host, tenv.master_hostname))
    deadline = time.monotonic() + 3600
    while not orted_running():
        sup.check_stopped()
        if time.monotonic() > deadline:
            raise ClientError("MPI worker: orted was not started by the master within 1 hour")
        time.sleep(1)
    while orted_running():
        sup.check_stopped()
        time.sleep(1)
    log(20, "Orted process exited")


# --------------------------------------------------------------------------------------------
# Main flow (trainer.train + sagemaker_pytorch_container.training.train).

def write_file(path, text, only_if_absent=False):
    if only_if_absent and os.path.exists(path):
        log(20, "Failure file exists. Skipping creation....")
        return
    try:
        with open(path, "w", encoding="utf-8") as f:
            f.write(text)
    except OSError as e:
        log(40, "Could not write %s: %s" % (path, e))


def child_environment(tenv, paths, env_vars):
    env = dict(os.environ)
    env.update(tenv.exports)
    env.update(env_vars)
    # write_env_vars puts the code dir (entry_point.install adds it to sys.path) on PYTHONPATH;
    # the launcher's own directory stays out of it.
    old = env.get("PYTHONPATH")
    env["PYTHONPATH"] = paths.code_dir + (":" + old if old else "")
    # The DLC images set these with ENV; Kiln has no image, so the launcher supplies them.
    env.setdefault("PYTHONUNBUFFERED", "TRUE")
    env.setdefault("PYTHONDONTWRITEBYTECODE", "TRUE")
    return env


def run_user_code(sup, tenv, paths):
    params = tenv.additional_framework_parameters
    name = tenv.user_entry_point
    if not name:
        raise ClientError("No entry point: set the sagemaker_program hyperparameter or the "
                          "SAGEMAKER_PROGRAM environment variable")
    env_vars = tenv.to_env_vars()
    args = tenv.to_cmd_args()

    download_and_extract(tenv.module_dir, paths.code_dir, os.environ)
    sup.check_stopped()
    env = child_environment(tenv, paths, env_vars)
    kind = install(sup, name, paths.code_dir, env)
    sup.check_stopped()
    wait_hostname_resolution(tenv.hosts, tenv.current_host, os.environ)

    # sagemaker_pytorch_container.training: NCCL and rendezvous variables for every launch.
    env["MASTER_ADDR"] = tenv.master_hostname
    env["MASTER_PORT"] = MASTER_PORT
    env.setdefault("NCCL_SOCKET_IFNAME", tenv.network_interface_name)
    env.setdefault("NCCL_IB_DISABLE", "1")
    env.setdefault("NCCL_DEBUG", "WARN")

    default_pph = tenv.num_gpus if tenv.num_gpus > 0 else (
        tenv.num_neurons if tenv.num_neurons > 0 else 1)
    processes_per_host = int(params.get(MPI_PROCESSES_PER_HOST) or default_pph)
    distributed = tenv.current_instance_group in tenv.distribution_instance_groups
    shown = None
    if distributed and params.get("sagemaker_mpi_enabled"):
        if not tenv.is_master:
            return mpi_worker_wait(sup, tenv)
        cmd, shown = mpi_command(tenv, kind, name, args, processes_per_host, env, smddp=False)
    elif distributed and (params.get("sagemaker_pytorch_ddp_enabled")
                          or params.get("sagemaker_distributed_dataparallel_enabled")):
        if not tenv.is_master:
            return mpi_worker_wait(sup, tenv)
        if len(tenv.distribution_hosts) > 1:
            env.update({"SMDATAPARALLEL_USE_HOMOGENEOUS": "1",
                        "SMDATAPARALLEL_SERVER_ADDR": tenv.master_hostname,
                        "SMDATAPARALLEL_SERVER_PORT": SMDDP_SERVER_PORT})
        else:
            env["SMDATAPARALLEL_USE_SINGLENODE"] = "1"
        cmd, shown = mpi_command(tenv, kind, name, args, processes_per_host, env, smddp=True)
    elif params.get("sagemaker_torch_distributed_enabled"):
        env["NCCL_SOCKET_IFNAME"] = str(tenv.network_interface_name)
        cmd, shown = torchrun_command(tenv, kind, name, args, processes_per_host)
    else:
        cmd, shown = process_command(kind, name, args)

    log(20, "Invoking user script")
    log(20, "Training Env:\n\n%s\n" % json.dumps(tenv.properties(), indent=4, sort_keys=True))
    log(20, "Invoking script with the following command:\n\n%s\n" % (shown or " ".join(cmd)))
    check_error(sup, cmd, ExecuteUserScriptError, cwd=paths.code_dir, env=env,
                display_cmd=shown, fallback_tail=True)


def run_framework_module(tenv):
    """SAGEMAKER_TRAINING_MODULE=module:function (framework images): import it and call it."""
    import importlib
    module_name, function_name = tenv.framework_module.split(":")
    try:
        module = importlib.import_module(module_name)
    except Exception as e:  # noqa: BLE001 - reported as the toolkit does
        raise ImportModuleError("Could not import %s: %s" % (module_name, e))
    log(20, "Imported framework %s" % module_name)
    getattr(module, function_name)()


def main():
    global _log_level
    base = os.environ.get("SAGEMAKER_BASE_DIR", os.path.join("/opt", "ml"))
    paths = Paths(base)
    sup = Supervisor()
    sup.install()
    exit_code = 0
    failure_path = os.path.join(paths.output_dir, "failure")
    try:
        tenv = TrainingEnv(paths, os.environ)
        try:
            _log_level = int(tenv.log_level)
        except (TypeError, ValueError):
            _log_level = 20
        if tenv.framework_module and not tenv.user_entry_point:
            os.environ.update(tenv.exports)
            run_framework_module(tenv)
        else:
            run_user_code(sup, tenv, paths)
        log(20, "Reporting training SUCCESS")
        write_file(os.path.join(paths.output_dir, "success"), "")
    except Stopped:
        log(20, "Stopped by signal %s before the user code started" % sup.stop_signal)
        exit_code = 128 + int(sup.stop_signal or signal.SIGTERM)
    except ClientError as e:
        msg = str(e)
        write_file(failure_path, msg, only_if_absent=True)
        log(40, "Reporting training FAILURE")
        log(40, msg)
        exit_code = 1
    except Exception as e:  # noqa: BLE001 - any other error is a "Framework Error"
        import traceback
        msg = "Framework Error: \n%s\n%s" % (traceback.format_exc(), str(e))
        write_file(failure_path, msg, only_if_absent=True)
        log(40, "Reporting training FAILURE")
        log(40, msg)
        try:
            exit_code = int(getattr(e, "errno", 1) or 1)
        except (TypeError, ValueError):
            exit_code = 1
    if exit_code != 0:
        log(40, "Encountered exit_code %d" % exit_code)
    sys.stdout.flush()
    return exit_code


if __name__ == "__main__":
    sys.exit(main())
