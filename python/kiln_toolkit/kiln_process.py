"""Child processes of the launcher: one at a time, in their own process group, SIGTERM forwarded;
stderr copied through while the toolkit's ErrorMessage is captured for the failure file."""

import os
import signal

from kiln_errors import ExecuteUserScriptError, Stopped, log

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

OOM_INFO = "OutOfMemory: Process killed by SIGKILL (signal 9)"


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
