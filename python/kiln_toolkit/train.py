"""Kiln's training launcher: the `train` entry of images that map to a Python environment.

Plays the part of sagemaker-training-toolkit + sagemaker-pytorch-training-toolkit inside a Kiln
instance (training contract sections 5.2, 7, 12.2). Run it by path with the environment's own
interpreter, cwd /opt/ml/code:

    <interpreter> /path/to/python/kiln_toolkit/train.py

Standard library only (Debian's /usr/bin/python3 3.11 must do). It never puts its own directory
on the user's PYTHONPATH. See python/README.md for the rules it follows and where it deviates
from the real toolkit (and why).

Modules, beside this file: kiln_errors (log, errors, failure file), kiln_environment (paths,
hyperparameters, SM_* variables), kiln_process (children, stderr capture), kiln_code (staging
and installing the user's code), kiln_launch (host resolution and the runners' commands),
kiln_rsh (MPI's remote launch: mpirun's agent, and the server MPI workers run). This file is
the main flow.

Exit codes (contract 7.2): 0 success; 1 for client errors (user script failed, bad module, pip
failure, bad code archive); otherwise the errno of an unexpected error, else 1; 128+15 when
stopped before the user code started.
"""

import json
import os
import signal
import sys

# The launcher's own modules sit beside this file. A script's directory is normally sys.path[0],
# but not under -I / -P or PYTHONSAFEPATH, so it is added for these imports only and sys.path is
# left as it was (the user's code, in child processes, never sees it either way). They are named
# kiln_* so that none can shadow a framework module run_framework_module imports. No bytecode is
# written beside them (the toolkit's directory may be read-only or shared, an installed prefix);
# the setting is restored after, for whatever else this process imports.
_DONT_WRITE_BYTECODE = sys.dont_write_bytecode
sys.dont_write_bytecode = True
_HERE = os.path.dirname(os.path.abspath(__file__))
_ADDED = _HERE not in sys.path
if _ADDED:
    sys.path.insert(0, _HERE)
from kiln_errors import (  # noqa: E402 - after the sys.path set-up
    ClientError, ExecuteUserScriptError, ImportModuleError, Stopped, log, set_log_level,
    write_file)
from kiln_environment import MPI_PROCESSES_PER_HOST, Paths, TrainingEnv  # noqa: E402
from kiln_process import Supervisor, check_error  # noqa: E402
from kiln_code import download_and_extract, install  # noqa: E402
from kiln_launch import (  # noqa: E402
    MASTER_PORT, SMDDP_SERVER_PORT, mpi_command, mpi_worker_serve, process_command,
    torchrun_command, wait_hostname_resolution)
if _ADDED:
    sys.path.remove(_HERE)
sys.dont_write_bytecode = _DONT_WRITE_BYTECODE


# --------------------------------------------------------------------------------------------
# Main flow (trainer.train + sagemaker_pytorch_container.training.train).

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
            return mpi_worker_serve(sup, tenv, env, paths.code_dir)
        cmd, shown = mpi_command(tenv, kind, name, args, processes_per_host, env, smddp=False)
    elif distributed and (params.get("sagemaker_pytorch_ddp_enabled")
                          or params.get("sagemaker_distributed_dataparallel_enabled")):
        if not tenv.is_master:
            return mpi_worker_serve(sup, tenv, env, paths.code_dir)
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
    base = os.environ.get("SAGEMAKER_BASE_DIR", os.path.join("/opt", "ml"))
    paths = Paths(base)
    sup = Supervisor()
    sup.install()
    exit_code = 0
    failure_path = os.path.join(paths.output_dir, "failure")
    try:
        tenv = TrainingEnv(paths, os.environ)
        try:
            set_log_level(int(tenv.log_level))
        except (TypeError, ValueError):
            set_log_level(20)
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
