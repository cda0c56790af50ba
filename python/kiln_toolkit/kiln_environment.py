"""The training environment the toolkit computes: paths, hyperparameters, resources and every
SM_* variable (environment.Environment and mapping.py of sagemaker-training-toolkit)."""

import json
import os

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
