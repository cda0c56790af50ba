"""Kiln's remote launch for MPI jobs: mpirun's `plm_rsh_agent` (this file run as a script) and
the server MPI workers run instead of sshd (`serve`, called by train.py).

Open MPI starts its daemon on each remote host by running `<agent> <host> <command words...>`,
as it would run `ssh <host> <command words...>`. The agent connects to `<host>:<port>`, proves
it knows the job's KILN_RSH_TOKEN, sends the command line (the words joined by spaces, as ssh
sends them), relays the remote command's stdout and stderr and its own stdin, and exits with
the remote exit status (255 when the session could not be set up, as ssh does). The worker runs
the command with `/bin/sh -c` in its own environment; when the agent goes away (mpirun killed
it, or the master died) the command's process group gets SIGTERM, then SIGKILL 5 s later.

Port: KILN_RSH_PORT (default 7022). When every host of the job resolves to a loopback address
(Kiln's host network mode: all hosts share the node's network, so they cannot all listen on one
port), host i of SM_HOSTS (0-based) uses port + i.

Protocol (TCP; every message a frame: 1 type byte, 4-byte big-endian length, payload):
  worker -> agent  'h' 32 random bytes (nonce_w)
  agent  -> worker 'A' nonce_a (32 bytes) + HMAC-SHA256(token, "kiln-rsh agent" nonce_w nonce_a)
  worker -> agent  'a' HMAC-SHA256(token, "kiln-rsh worker" nonce_w nonce_a), or 'f' + reason
  agent  -> worker 'C' the command line (UTF-8)
  agent  -> worker 'I' stdin bytes, 'D' end of stdin
  worker -> agent  'o' stdout bytes, 'e' stderr bytes, 'x' exit status (ASCII decimal; 128+N
                   for signal N), 'f' + reason when the command could not be started
The token itself never crosses the network, and each side proves it knows it. Frames are not
authenticated beyond that: the job's network is private to the job (the traffic does not leave
the node's bridge), as ssh's would be on SageMaker's.

Standard library only, and no import of the toolkit's other modules: mpirun runs this file with
the user's environment (PYTHONPATH included), so it is started with -I (isolated mode).
"""

import hashlib
import hmac
import os
import select
import signal
import socket
import struct
import sys
import threading
import time

DEFAULT_PORT = 7022
MAX_FRAME = 1 << 20
NONCE_BYTES = 32
HANDSHAKE_SECONDS = 30.0  # a connection that does not authenticate in time is dropped
KILL_GRACE_SECONDS = 5.0  # SIGTERM, then SIGKILL, when the agent goes away
MAX_SESSIONS = 64
EXIT_SETUP_FAILED = 255  # ssh's status when the session could not be set up

_HEADER = struct.Struct(">cI")


class ProtocolError(Exception):
    pass


# --------------------------------------------------------------------------------------------
# Frames and authentication (both sides).

def send_frame(sock, kind, payload=b"", lock=None):
    data = _HEADER.pack(kind, len(payload)) + payload
    if lock is None:
        sock.sendall(data)
    else:
        with lock:
            sock.sendall(data)


def _recv_exact(sock, n):
    buf = bytearray()
    while len(buf) < n:
        chunk = sock.recv(min(n - len(buf), 65536))
        if not chunk:
            raise ProtocolError("connection closed")
        buf += chunk
    return bytes(buf)


def recv_frame(sock):
    """(type, payload); ProtocolError at end of stream or on an oversized frame."""
    kind, length = _HEADER.unpack(_recv_exact(sock, _HEADER.size))
    if length > MAX_FRAME:
        raise ProtocolError("frame of %d bytes exceeds %d" % (length, MAX_FRAME))
    return kind, _recv_exact(sock, length) if length else b""


def _mac(token, role, nonce_w, nonce_a):
    return hmac.new(token, role + nonce_w + nonce_a, hashlib.sha256).digest()


def token_from(environ):
    """The job's shared secret as bytes, or None when KILN_RSH_TOKEN is unset or empty."""
    token = environ.get("KILN_RSH_TOKEN", "")
    return token.encode("utf-8") if token else None


# --------------------------------------------------------------------------------------------
# Ports.

def _is_loopback(host):
    try:
        infos = socket.getaddrinfo(host, None, type=socket.SOCK_STREAM)
    except OSError:
        return False
    for info in infos:
        addr = info[4][0]
        if not (addr.startswith("127.") or addr == "::1"):
            return False
    return bool(infos)


def hosts_share_loopback(hosts):
    """True when the job has several hosts and every one resolves to a loopback address: they
    share one network (Kiln's host network mode)."""
    return len(hosts) > 1 and all(_is_loopback(h) for h in hosts)


def rsh_port(host, hosts, environ, shared_loopback=None):
    """The port `host` serves remote launches on (module docstring). `shared_loopback` is
    hosts_share_loopback(hosts), passed when the caller knows it."""
    try:
        base = int(environ.get("KILN_RSH_PORT") or DEFAULT_PORT)
    except ValueError:
        raise ValueError("KILN_RSH_PORT=%r is not a port number" % environ.get("KILN_RSH_PORT"))
    if shared_loopback is None:
        shared_loopback = hosts_share_loopback(hosts)
    if shared_loopback and host in hosts:
        return base + hosts.index(host)
    return base


def hosts_from_env(environ):
    import json
    try:
        hosts = json.loads(environ.get("SM_HOSTS") or "[]")
    except ValueError:
        return []
    return [str(h) for h in hosts] if isinstance(hosts, list) else []


# --------------------------------------------------------------------------------------------
# The agent (mpirun's plm_rsh_agent).

def parse_agent_args(argv):
    """(host, port or None, command line) from `[options] [user@]host word...`.

    ssh-style options before the host are accepted for plm_rsh_args compatibility: `-p PORT`
    sets the port, `-l USER` and `-o OPTION` take a value and are ignored, other single-letter
    flags (-x, -T, -n, -q, ...) are ignored."""
    port = None
    i = 0
    while i < len(argv) and argv[i].startswith("-") and len(argv[i]) > 1:
        opt = argv[i]
        if opt in ("-p", "-l", "-o"):
            if i + 1 >= len(argv):
                raise ValueError("option %s needs a value" % opt)
            if opt == "-p":
                port = int(argv[i + 1])
            i += 2
        elif opt.startswith("-p") and opt[2:].isdigit():
            port = int(opt[2:])
            i += 1
        else:
            i += 1
    if i >= len(argv):
        raise ValueError("usage: kiln_rsh.py [options] HOST COMMAND...")
    host = argv[i].rsplit("@", 1)[-1]
    words = argv[i + 1:]
    if not words:
        raise ValueError("no command for %s (interactive sessions are not supported)" % host)
    return host, port, " ".join(words)


def connect(host, port, token, deadline):
    """An authenticated connection to host:port, retrying refused or unreachable connections
    until `deadline` (the worker may still be installing the job's requirements).
    Raises ProtocolError when the worker refuses the token (not retried) or the deadline
    passes."""
    delay = 0.1
    last = None
    while True:
        sock = None
        try:
            sock = socket.create_connection((host, port), timeout=10)
            sock.settimeout(HANDSHAKE_SECONDS)
            kind, nonce_w = recv_frame(sock)
            if kind != b"h" or len(nonce_w) != NONCE_BYTES:
                raise ProtocolError("%s:%d is not a Kiln remote-launch server" % (host, port))
            nonce_a = os.urandom(NONCE_BYTES)
            send_frame(sock, b"A", nonce_a + _mac(token, b"kiln-rsh agent", nonce_w, nonce_a))
            kind, payload = recv_frame(sock)
            if kind == b"f":
                raise ProtocolError("%s:%d refused the session: %s"
                                    % (host, port, payload.decode("utf-8", "replace")))
            if kind != b"a" or not hmac.compare_digest(
                    payload, _mac(token, b"kiln-rsh worker", nonce_w, nonce_a)):
                raise ProtocolError("%s:%d did not prove it knows KILN_RSH_TOKEN" % (host, port))
            sock.settimeout(None)
            return sock
        except ProtocolError:
            if sock is not None:
                sock.close()
            raise
        except OSError as e:  # refused, unreachable, reset, unresolvable, timed out
            if sock is not None:
                sock.close()
            last = e
        if time.monotonic() + delay > deadline:
            raise ProtocolError("could not connect to %s:%d: %s" % (host, port, last))
        time.sleep(delay)
        delay = min(delay * 2, 2.0)


def _write_all(fd, data):
    while data:
        try:
            n = os.write(fd, data)
        except InterruptedError:
            continue
        data = data[n:]


def run_agent(argv, environ):
    """The agent's main: returns the exit status (the remote command's, or 255)."""
    def fail(msg):
        sys.stderr.write("kiln_rsh: %s\n" % msg)
        sys.stderr.flush()
        return EXIT_SETUP_FAILED
    try:
        host, port, command = parse_agent_args(argv)
        if port is None:
            port = rsh_port(host, hosts_from_env(environ), environ)
    except ValueError as e:
        return fail(str(e))
    token = token_from(environ)
    if token is None:
        return fail("KILN_RSH_TOKEN is not set: Kiln gives every host of a multi-host training "
                    "job this variable; run the agent with the job's environment")
    try:
        wait = float(environ.get("KILN_RSH_CONNECT_SECONDS") or 300)
    except ValueError:
        return fail("KILN_RSH_CONNECT_SECONDS=%r is not a number"
                    % environ.get("KILN_RSH_CONNECT_SECONDS"))
    try:
        sock = connect(host, port, token, time.monotonic() + wait)
    except ProtocolError as e:
        return fail(str(e))
    try:
        send_frame(sock, b"C", command.encode("utf-8"))
    except OSError as e:
        return fail("%s:%d: could not send the command: %s" % (host, port, e))

    lock = threading.Lock()

    def pump_stdin():
        try:
            while True:
                try:
                    chunk = os.read(0, 65536)
                except InterruptedError:
                    continue
                if not chunk:
                    break
                send_frame(sock, b"I", chunk, lock)
            send_frame(sock, b"D", b"", lock)
        except OSError:
            pass  # stdin closed or unreadable, or the connection is gone: nothing more to send

    threading.Thread(target=pump_stdin, daemon=True).start()
    try:
        while True:
            kind, payload = recv_frame(sock)
            if kind == b"o":
                _write_all(1, payload)
            elif kind == b"e":
                _write_all(2, payload)
            elif kind == b"x":
                return int(payload.decode("ascii"))
            elif kind == b"f":
                return fail("%s: %s" % (host, payload.decode("utf-8", "replace")))
            else:
                return fail("%s: unexpected frame %r" % (host, kind))
    except (ProtocolError, OSError, ValueError) as e:
        return fail("%s: connection lost before the command ended (%s)" % (host, e))


# --------------------------------------------------------------------------------------------
# The worker's server.

def session_environment(environ):
    """The command's environment: the worker's own, plus what sshd gives a session (USER,
    LOGNAME, HOME, SHELL) where it is missing."""
    env = dict(environ)
    try:
        import pwd
        pw = pwd.getpwuid(os.getuid())
        name, home, shell = pw.pw_name, pw.pw_dir, pw.pw_shell
    except (ImportError, KeyError):
        name, home, shell = str(os.getuid()), "/", "/bin/sh"
    env.setdefault("USER", name)
    env.setdefault("LOGNAME", name)
    env.setdefault("HOME", home or "/")
    env.setdefault("SHELL", shell or "/bin/sh")
    env.setdefault("PATH", os.defpath)
    return env


class Session:
    """One authenticated connection and the command it runs."""

    def __init__(self, server, sock, peer):
        self.server = server
        self.sock = sock
        self.peer = peer
        self.lock = threading.Lock()  # serialises frames sent to the agent
        self.proc = None
        self.command = None
        self.status = None            # shell-style exit status, once reaped
        self.exited = threading.Event()

    def run(self):
        try:
            self._run()
        except (ProtocolError, OSError) as e:
            self.server.log("remote launch from %s: %s" % (self.peer, e))
        finally:
            self.server.session_done(self)
            try:
                self.sock.shutdown(socket.SHUT_RDWR)  # wakes _watch_agent's recv
            except OSError:
                pass
            self.sock.close()

    def _authenticate(self):
        self.sock.settimeout(HANDSHAKE_SECONDS)
        nonce_w = os.urandom(NONCE_BYTES)
        send_frame(self.sock, b"h", nonce_w)
        kind, payload = recv_frame(self.sock)
        token = self.server.token
        if kind != b"A" or len(payload) != 2 * NONCE_BYTES or not hmac.compare_digest(
                payload[NONCE_BYTES:],
                _mac(token, b"kiln-rsh agent", nonce_w, payload[:NONCE_BYTES])):
            send_frame(self.sock, b"f", b"authentication failed: the agent's KILN_RSH_TOKEN "
                       b"is not this job's")
            raise ProtocolError("authentication failed")
        nonce_a = payload[:NONCE_BYTES]
        send_frame(self.sock, b"a", _mac(token, b"kiln-rsh worker", nonce_w, nonce_a))
        kind, payload = recv_frame(self.sock)
        if kind != b"C":
            raise ProtocolError("expected a command, got frame %r" % kind)
        self.sock.settimeout(None)
        return payload.decode("utf-8", "replace")

    def _run(self):
        import queue
        import subprocess
        command = self._authenticate()
        self.command = command
        self.server.log("remote launch from %s: /bin/sh -c %s" % (self.peer, command))
        try:
            self.proc = self.server.spawn(self, lambda: subprocess.Popen(
                ["/bin/sh", "-c", command], cwd=self.server.cwd, env=self.server.env,
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                start_new_session=True))
        except OSError as e:
            send_frame(self.sock, b"f", ("could not start /bin/sh: %s" % e).encode(), self.lock)
            return
        if self.proc is None:
            send_frame(self.sock, b"f", b"the worker is shutting down", self.lock)
            return

        stdin_queue = queue.Queue(maxsize=64)

        def feed_stdin():
            while True:
                data = stdin_queue.get()
                try:
                    if data is None:
                        self.proc.stdin.close()
                        return
                    self.proc.stdin.write(data)
                    self.proc.stdin.flush()
                except (OSError, ValueError):
                    pass  # the command closed its stdin; keep draining the queue

        def relay(stream, kind):
            fd = stream.fileno()
            while True:
                try:
                    chunk = os.read(fd, 65536)
                except InterruptedError:
                    continue
                except OSError:
                    break
                if not chunk:
                    break
                try:
                    send_frame(self.sock, kind, chunk, self.lock)
                except OSError:
                    pass  # the agent is gone; keep draining so the command never blocks
            stream.close()

        threads = [threading.Thread(target=relay, args=(self.proc.stdout, b"o"), daemon=True),
                   threading.Thread(target=relay, args=(self.proc.stderr, b"e"), daemon=True),
                   threading.Thread(target=feed_stdin, daemon=True)]
        for t in threads:
            t.start()
        watcher = threading.Thread(target=self._watch_agent, args=(stdin_queue,), daemon=True)
        watcher.start()
        self.exited.wait()
        for t in threads[:2]:
            t.join()
        try:
            stdin_queue.put_nowait(None)
        except queue.Full:
            pass
        try:
            send_frame(self.sock, b"x", str(self.status).encode("ascii"), self.lock)
        except OSError:
            pass

    def _watch_agent(self, stdin_queue):
        """Reads the agent's frames; the end of the connection before the command has exited
        means the agent was killed: the command's process group is terminated."""
        try:
            while True:
                kind, payload = recv_frame(self.sock)
                if kind == b"I":
                    stdin_queue.put(payload)
                elif kind == b"D":
                    stdin_queue.put(None)
                else:
                    raise ProtocolError("unexpected frame %r" % kind)
        except (ProtocolError, OSError):
            pass
        if not self.exited.is_set():
            self.server.log("remote launch from %s: the agent went away; terminating %s"
                            % (self.peer, self.command))
            self.terminate()

    def terminate(self, sig=signal.SIGTERM):
        proc = self.proc
        if proc is None or self.exited.is_set():
            return
        try:
            os.killpg(proc.pid, sig)
        except OSError:
            return
        if sig != signal.SIGKILL and not self.exited.wait(KILL_GRACE_SECONDS):
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except OSError:
                pass


class WorkerServer:
    """Serves remote launches on `port` until the launched commands, and whatever they left
    running as children of this process (orted daemonizes), have ended.

    This process must be the one that reaps: it is PID 1 of its sandbox, or it makes itself a
    child subreaper (PR_SET_CHILD_SUBREAPER), so that a daemonized orted is re-parented to it
    and its exit is seen. Every child is reaped here (waitpid(-1)): call serve_forever from the
    main thread, with no other children running."""

    def __init__(self, port, token, env, cwd, log, bind_address="0.0.0.0"):
        self.port = port
        self.token = token
        self.env = env
        self.cwd = cwd
        self.log = log
        self.bind_address = bind_address
        self.lock = threading.Lock()
        self.sessions = set()       # authenticated sessions not yet finished
        self.by_pid = {}            # pid of a session's shell -> session
        self.launched = 0           # commands started
        self.failures = []          # (what, status) of commands and adopted children that failed
        self.stopping = False
        self.listener = None

    # Session bookkeeping (called from session threads).
    def spawn(self, session, start):
        """Runs start() (which forks the session's shell) and registers the child under the
        lock: _reap looks a reaped pid up under the same lock, so a shell that exits at once is
        still matched to its session. None when the server is stopping or full."""
        with self.lock:
            if self.stopping or len(self.sessions) >= MAX_SESSIONS:
                return None
            try:
                proc = start()
            except OSError:
                self.failures.append(("/bin/sh -c %s" % session.command, 127))
                raise
            self.sessions.add(session)
            self.by_pid[proc.pid] = session
            self.launched += 1
            return proc

    def session_done(self, session):
        with self.lock:
            self.sessions.discard(session)

    def bind(self):
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((self.bind_address, self.port))
        sock.listen(16)
        sock.setblocking(False)
        self.listener = sock

    def _reap(self):
        """Reaps every exited child; False once this process has no children at all."""
        while True:
            try:
                # Peek first (WNOWAIT): a zombie still has its name, for the failure message.
                info = os.waitid(os.P_ALL, 0, os.WEXITED | os.WNOHANG | os.WNOWAIT)
            except ChildProcessError:
                return False
            if info is None or info.si_pid == 0:
                return True
            pid = info.si_pid
            name = _process_name(pid)
            try:
                _, status = os.waitpid(pid, 0)
            except ChildProcessError:
                continue
            code = os.waitstatus_to_exitcode(status)
            code = 128 - code if code < 0 else code
            with self.lock:
                session = self.by_pid.pop(pid, None)
            if session is not None:
                session.proc.returncode = code  # reaped here: Popen must not wait for it
                session.status = code
                session.exited.set()
                if code != 0:
                    with self.lock:
                        self.failures.append(("/bin/sh -c %s" % session.command, code))
            elif code != 0:
                with self.lock:
                    self.failures.append(("%s (pid %d, left running by a launched command)"
                                          % (name, pid), code))

    def _children(self):
        """Pids of this process's children (adopted ones included), from /proc."""
        me = os.getpid()
        found = []
        for name in os.listdir("/proc"):
            if not name.isdigit():
                continue
            try:
                with open("/proc/%s/stat" % name, "rb") as f:
                    stat = f.read()
            except OSError:
                continue
            fields = stat[stat.rfind(b")") + 2:].split()
            if len(fields) > 1 and int(fields[1]) == me:
                found.append(int(name))
        return found

    def stop_all(self, sig):
        """Signals every session's process group and every child (orted's own group)."""
        with self.lock:
            self.stopping = True
            sessions = list(self.sessions)
        for s in sessions:
            if s.proc is not None and not s.exited.is_set():
                try:
                    os.killpg(s.proc.pid, sig)
                except OSError:
                    pass
        for pid in self._children():
            for kill in (os.killpg, os.kill):
                try:
                    kill(pid, sig)
                    break
                except OSError:
                    pass

    def serve_forever(self, stopped, first_wait_seconds):
        """Returns None when everything launched has ended; the list of failures otherwise.
        `stopped()` is polled: when it returns true, everything is terminated and "stopped" is
        returned. Raises TimeoutError when nothing connects within first_wait_seconds."""
        become_subreaper()
        if self.listener is None:
            self.bind()
        start = time.monotonic()
        try:
            while True:
                if stopped():
                    self.stop_all(signal.SIGTERM)
                    deadline = time.monotonic() + KILL_GRACE_SECONDS
                    while self._reap() and time.monotonic() < deadline:
                        time.sleep(0.05)
                    self.stop_all(signal.SIGKILL)
                    # Let the sessions tell their agents the exit status (128+15).
                    while time.monotonic() < deadline + 1.0:
                        self._reap()
                        with self.lock:
                            if not self.sessions:
                                break
                        time.sleep(0.05)
                    return "stopped"
                try:
                    ready, _, _ = select.select([self.listener], [], [], 0.2)
                except InterruptedError:
                    ready = []
                if ready:
                    try:
                        conn, peer = self.listener.accept()
                    except (BlockingIOError, InterruptedError):
                        conn = None
                    if conn is not None:
                        conn.setblocking(True)
                        session = Session(self, conn, "%s:%d" % peer[:2])
                        threading.Thread(target=session.run, daemon=True).start()
                has_children = self._reap()
                with self.lock:
                    busy = bool(self.sessions)
                    launched = self.launched
                    failures = list(self.failures)
                if launched and not busy and not has_children:
                    return failures or None
                if not launched and time.monotonic() - start > first_wait_seconds:
                    raise TimeoutError()
        finally:
            self.listener.close()


def _process_name(pid):
    try:
        with open("/proc/%d/comm" % pid) as f:
            return f.read().strip() or "process"
    except OSError:
        return "process"


def become_subreaper():
    """Makes orphaned descendants (a daemonized orted) children of this process. True when it
    worked or when this process is PID 1 (which is the reaper of its namespace anyway)."""
    if os.getpid() == 1:
        return True
    try:
        import ctypes
        libc = ctypes.CDLL(None, use_errno=True)
        PR_SET_CHILD_SUBREAPER = 36
        return libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0
    except (ImportError, OSError, AttributeError):
        return False


if __name__ == "__main__":
    sys.exit(run_agent(sys.argv[1:], os.environ))
