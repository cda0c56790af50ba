"""Logging in the toolkit's format, the launcher's errors and the failure/success files.

ClientError subclasses end the launcher with exit 1 and str(e) as the failure file (train.main).
"""

import os
import sys
import time

LOGGER_NAME = "sagemaker-training-toolkit"

# --------------------------------------------------------------------------------------------
# Logging in the toolkit's format ("%(asctime)s %(name)-12s %(levelname)-8s %(message)s").

_log_level = 20


def set_log_level(level):
    """Messages below `level` (10 DEBUG .. 40 ERROR) are dropped from now on."""
    global _log_level
    _log_level = level


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


def write_file(path, text, only_if_absent=False):
    if only_if_absent and os.path.exists(path):
        log(20, "Failure file exists. Skipping creation....")
        return
    try:
        with open(path, "w", encoding="utf-8") as f:
            f.write(text)
    except OSError as e:
        log(40, "Could not write %s: %s" % (path, e))
