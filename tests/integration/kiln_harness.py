"""Helpers shared by the integration tests and the benchmarks: start/stop a real `kiln server`,
sign raw requests with SigV4 (an independent implementation, checked against botocore in
test_harness_selfcheck.py), speak raw HTTP, and build boto3 clients pointed at a server.

Only the Python standard library, botocore/boto3 and (optionally) requests are used, so this
module runs under Debian's /usr/bin/python3 (boto3 1.26) and newer interpreters alike.
"""

import datetime
import hashlib
import hmac
import http.client
import json
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import urllib.parse
import urllib.request

REPO_ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
EMPTY_SHA256 = hashlib.sha256(b"").hexdigest()


# ---------------------------------------------------------------------------------------------
# Locating binaries


def kiln_bin():
    """The kiln binary: $KILN_BIN, else build/src/cli/kiln under the repo root."""
    path = os.environ.get("KILN_BIN") or os.path.join(REPO_ROOT, "build", "src", "cli", "kiln")
    return os.path.abspath(path)


def build_dir():
    """$KILN_BUILD_DIR, else the build dir the kiln binary came from (<build>/src/cli/kiln)."""
    env = os.environ.get("KILN_BUILD_DIR")
    if env:
        return os.path.abspath(env)
    return os.path.dirname(os.path.dirname(os.path.dirname(kiln_bin())))


def aws_cli():
    """The AWS CLI to drive: $KILN_AWS_CLI, else Debian's /usr/bin/aws (v2), else `aws` on PATH."""
    env = os.environ.get("KILN_AWS_CLI")
    if env:
        return env
    if os.path.exists("/usr/bin/aws"):
        return "/usr/bin/aws"
    return shutil.which("aws")


def free_port():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# ---------------------------------------------------------------------------------------------
# Server process


class KilnServer:
    """One `kiln server` process on 127.0.0.1:<port> with its own data dir.

    start() waits until /_kiln/health answers 200 and reads the generated credentials.
    stop() sends SIGTERM and returns the exit code; kill() sends SIGKILL. restart() keeps the
    port and the data dir.
    """

    def __init__(self, data_dir, port=None, config=None, extra_args=(), log_path=None,
                 listen_host="127.0.0.1", log_level="debug"):
        self.data_dir = os.path.abspath(data_dir)
        self.port = port or free_port()
        self.listen_host = listen_host
        self.log_level = log_level
        self.config = config
        self.extra_args = list(extra_args)
        self.log_path = log_path or (self.data_dir.rstrip("/") + ".log")
        self.proc = None
        self.credentials = None
        self.config_path = None
        self._log_file = None
        self.starts = 0

    @property
    def endpoint(self):
        return "http://127.0.0.1:%d" % self.port

    @property
    def access_key(self):
        return self.credentials["access_key_id"]

    @property
    def secret_key(self):
        return self.credentials["secret_access_key"]

    @property
    def account_id(self):
        return self.credentials.get("account_id")

    def command(self):
        cmd = [kiln_bin(), "server", "--listen", "%s:%d" % (self.listen_host, self.port),
               "--data-dir", self.data_dir, "--log-level", self.log_level]
        if self.config is not None:
            if self.config_path is None:
                self.config_path = self.data_dir.rstrip("/") + ".config.json"
                with open(self.config_path, "w") as f:
                    json.dump(self.config, f)
            cmd += ["--config", self.config_path]
        return cmd + self.extra_args

    def start(self, timeout=30.0):
        os.makedirs(self.data_dir, exist_ok=True)
        self._log_file = open(self.log_path, "ab")
        self._log_file.write(("\n===== start #%d: %s\n" % (self.starts, " ".join(self.command()))).encode())
        self._log_file.flush()
        self.proc = subprocess.Popen(self.command(), stdout=self._log_file, stderr=subprocess.STDOUT,
                                     stdin=subprocess.DEVNULL)
        self.starts += 1
        deadline = time.monotonic() + timeout
        last_error = None
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError("kiln server exited with %s during start; log tail:\n%s"
                                   % (self.proc.returncode, self.log_tail()))
            try:
                status, _, body = http_request("GET", self.endpoint + "/_kiln/health", timeout=2)
                if status == 200:
                    self.health = json.loads(body)
                    break
                last_error = "health answered %d: %r" % (status, body[:200])
            except (OSError, http.client.HTTPException) as e:
                last_error = repr(e)
            time.sleep(0.05)
        else:
            self.kill()
            raise RuntimeError("kiln server not healthy after %.0fs (%s); log tail:\n%s"
                               % (timeout, last_error, self.log_tail()))
        try:
            self.credentials = read_credentials(self.data_dir)
        except OSError:
            configured = (self.config or {}).get("credentials")
            if not configured:
                raise
            self.credentials = dict(configured[0])
        return self

    def stop(self, timeout=30.0):
        """SIGTERM, wait; returns the exit code (kills and raises on timeout)."""
        if self.proc is None:
            return None
        self.proc.send_signal(signal.SIGTERM)
        try:
            rc = self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            raise RuntimeError("kiln server ignored SIGTERM for %.0fs; log tail:\n%s" % (timeout, self.log_tail()))
        finally:
            self._close_log()
        self.proc = None
        return rc

    def kill(self):
        if self.proc is None:
            return
        self.proc.kill()
        self.proc.wait()
        self.proc = None
        self._close_log()

    def restart(self, timeout=30.0):
        rc = self.stop()
        if rc != 0:
            raise RuntimeError("kiln server exited %s on SIGTERM; log tail:\n%s" % (rc, self.log_tail()))
        return self.start(timeout)

    def alive(self):
        return self.proc is not None and self.proc.poll() is None

    def healthy(self):
        try:
            status, _, body = http_request("GET", self.endpoint + "/_kiln/health", timeout=5)
            return status == 200 and json.loads(body).get("status") == "ok"
        except Exception:
            return False

    def log_text(self):
        try:
            with open(self.log_path, "rb") as f:
                return f.read().decode("utf-8", "replace")
        except OSError:
            return ""

    def log_tail(self, n=60):
        return "\n".join(self.log_text().splitlines()[-n:])

    def _close_log(self):
        if self._log_file is not None:
            self._log_file.close()
            self._log_file = None

    # -- clients --------------------------------------------------------------------------------

    def creds(self):
        return Creds(self.access_key, self.secret_key)

    def client(self, service, access_key=None, secret_key=None, region="us-east-1", endpoint=None,
               retries=1, **config_kwargs):
        return make_client(service, endpoint or self.endpoint,
                           access_key or self.access_key, secret_key or self.secret_key,
                           region=region, retries=retries, **config_kwargs)

    def aws_env(self, home):
        """Environment for /usr/bin/aws: only these credentials, no user config."""
        env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
        env.update({
            "AWS_ACCESS_KEY_ID": self.access_key,
            "AWS_SECRET_ACCESS_KEY": self.secret_key,
            "AWS_DEFAULT_REGION": "us-east-1",
            "AWS_CONFIG_FILE": os.path.join(home, "config"),
            "AWS_SHARED_CREDENTIALS_FILE": os.path.join(home, "credentials"),
            "AWS_PAGER": "",
            "HOME": home,
        })
        return env


def read_credentials(data_dir):
    with open(os.path.join(data_dir, "credentials.json")) as f:
        doc = json.load(f)
    return doc["keys"][0]


def make_client(service, endpoint, access_key, secret_key, region="us-east-1", retries=1, **config_kwargs):
    import boto3
    from botocore.config import Config
    s3 = config_kwargs.pop("s3", {"addressing_style": "path"})
    config_kwargs.setdefault("connect_timeout", 10)
    config_kwargs.setdefault("read_timeout", 300)
    config = Config(retries={"max_attempts": retries, "mode": "standard"}, s3=s3, **config_kwargs)
    return boto3.session.Session().client(service, endpoint_url=endpoint, aws_access_key_id=access_key,
                                          aws_secret_access_key=secret_key, region_name=region,
                                          config=config)


# ---------------------------------------------------------------------------------------------
# SigV4 (independent implementation following spec/control-plane-api.md §3)


class Creds:
    def __init__(self, access_key, secret_key, token=None):
        self.access_key = access_key
        self.secret_key = secret_key
        self.token = token


def amz_date(when=None):
    when = when or datetime.datetime.now(datetime.timezone.utc)
    return when.strftime("%Y%m%dT%H%M%SZ")


def uri_encode(s, safe="-_.~"):
    if isinstance(s, str):
        s = s.encode("utf-8")
    return urllib.parse.quote(s, safe=safe)


def canonical_query(query):
    """`query`: the raw query string as sent (already percent-encoded)."""
    if not query:
        return ""
    pairs = []
    for part in query.split("&"):
        if not part:
            continue
        name, _, value = part.partition("=")
        name = urllib.parse.unquote(name)
        value = urllib.parse.unquote(value)
        if name == "X-Amz-Signature":
            continue
        pairs.append((uri_encode(name), uri_encode(value)))
    pairs.sort()
    return "&".join("%s=%s" % p for p in pairs)


def _normalize_path(raw_path):
    segs = []
    for seg in raw_path.split("/"):
        if seg in ("", "."):
            continue
        if seg == "..":
            if segs:
                segs.pop()
            continue
        segs.append(seg)
    path = "/" + "/".join(segs)
    if raw_path.endswith("/") and path != "/":
        path += "/"
    return path


def canonical_uri(raw_path, service):
    if not raw_path:
        return "/"
    if service == "s3":
        # S3: not normalised; each segment as the key's bytes encoded once (decode what was sent,
        # encode again: "%2E%2E" signs as "..", an escaped slash stays escaped).
        return "/".join(uri_encode(urllib.parse.unquote_to_bytes(seg)) for seg in raw_path.split("/"))
    # Others: normalised, each segment encoded again.
    return uri_encode(_normalize_path(raw_path), safe="/-_.~")


def signing_key(secret, date, region, service):
    k = hmac.new(("AWS4" + secret).encode(), date.encode(), hashlib.sha256).digest()
    for part in (region, service, "aws4_request"):
        k = hmac.new(k, part.encode(), hashlib.sha256).digest()
    return k


def sign_request(method, url, headers, creds, service, region="us-east-1", payload_hash=None,
                 body=b"", when=None, signed_headers=None, add_content_sha256=True):
    """Adds X-Amz-Date (and x-amz-content-sha256 for S3) and Authorization to `headers` (a dict).

    `url` is the exact URL to send (its path/query are used as they appear on the wire); a
    `Host` entry in headers overrides the URL's host. `payload_hash` defaults to the SHA-256 of
    `body`. Returns (headers, signature, context) where context has what chunk signing needs.
    """
    parts = urllib.parse.urlsplit(url)
    ts = amz_date(when)
    headers = dict(headers)
    if not any(k.lower() == "host" for k in headers):
        headers["Host"] = parts.netloc
    headers["X-Amz-Date"] = ts
    if payload_hash is None:
        payload_hash = hashlib.sha256(body).hexdigest()
    if service == "s3" and add_content_sha256:
        headers["x-amz-content-sha256"] = payload_hash
    if creds.token:
        headers["X-Amz-Security-Token"] = creds.token
    lower = {}
    for k, v in headers.items():
        lower.setdefault(k.lower(), []).append(" ".join(str(v).split()))
    names = sorted(signed_headers or [n for n in lower if n in ("host", "content-type", "content-md5")
                                      or n.startswith("x-amz-")])
    canon_headers = "".join("%s:%s\n" % (n, ",".join(lower.get(n, [""]))) for n in names)
    signed = ";".join(names)
    creq = "\n".join([method, canonical_uri(parts.path, service), canonical_query(parts.query),
                      canon_headers, signed, payload_hash])
    scope = "%s/%s/%s/aws4_request" % (ts[:8], region, service)
    sts = "\n".join(["AWS4-HMAC-SHA256", ts, scope, hashlib.sha256(creq.encode()).hexdigest()])
    key = signing_key(creds.secret_key, ts[:8], region, service)
    sig = hmac.new(key, sts.encode(), hashlib.sha256).hexdigest()
    headers["Authorization"] = ("AWS4-HMAC-SHA256 Credential=%s/%s, SignedHeaders=%s, Signature=%s"
                                % (creds.access_key, scope, signed, sig))
    return headers, sig, {"key": key, "ts": ts, "scope": scope, "canonical_request": creq}


def presign_url(method, url, creds, service="s3", region="us-east-1", expires=3600, when=None):
    parts = urllib.parse.urlsplit(url)
    ts = amz_date(when)
    scope = "%s/%s/%s/aws4_request" % (ts[:8], region, service)
    params = [("X-Amz-Algorithm", "AWS4-HMAC-SHA256"), ("X-Amz-Credential", "%s/%s" % (creds.access_key, scope)),
              ("X-Amz-Date", ts), ("X-Amz-Expires", str(expires)), ("X-Amz-SignedHeaders", "host")]
    query = parts.query + ("&" if parts.query else "") + "&".join(
        "%s=%s" % (uri_encode(k), uri_encode(v)) for k, v in params)
    creq = "\n".join([method, canonical_uri(parts.path, service), canonical_query(query),
                      "host:%s\n" % parts.netloc, "host", "UNSIGNED-PAYLOAD"])
    sts = "\n".join(["AWS4-HMAC-SHA256", ts, scope, hashlib.sha256(creq.encode()).hexdigest()])
    sig = hmac.new(signing_key(creds.secret_key, ts[:8], region, service), sts.encode(), hashlib.sha256).hexdigest()
    return urllib.parse.urlunsplit((parts.scheme, parts.netloc, parts.path,
                                    query + "&X-Amz-Signature=" + sig, ""))


def chunk_signature(ctx, previous, data):
    sts = "\n".join(["AWS4-HMAC-SHA256-PAYLOAD", ctx["ts"], ctx["scope"], previous, EMPTY_SHA256,
                     hashlib.sha256(data).hexdigest()])
    return hmac.new(ctx["key"], sts.encode(), hashlib.sha256).hexdigest()


def aws_chunked_signed_body(ctx, seed_signature, data, chunk_size=64 * 1024):
    out = []
    prev = seed_signature
    chunks = [data[i:i + chunk_size] for i in range(0, len(data), chunk_size)] + [b""]
    for c in chunks:
        sig = chunk_signature(ctx, prev, c)
        out.append(b"%x;chunk-signature=%s\r\n" % (len(c), sig.encode()) + c + b"\r\n")
        prev = sig
    return b"".join(out)


def aws_chunked_unsigned_trailer_body(data, trailer_name, trailer_value, chunk_size=64 * 1024):
    out = []
    for i in range(0, len(data), chunk_size):
        c = data[i:i + chunk_size]
        out.append(b"%x\r\n" % len(c) + c + b"\r\n")
    out.append(b"0\r\n%s:%s\r\n\r\n" % (trailer_name.encode(), trailer_value.encode()))
    return b"".join(out)


# ---------------------------------------------------------------------------------------------
# Raw HTTP


def http_request(method, url, headers=None, body=b"", timeout=60):
    """One request on a fresh connection: returns (status, headers dict lower-cased, body)."""
    parts = urllib.parse.urlsplit(url)
    conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=timeout)
    try:
        target = parts.path or "/"
        if parts.query:
            target += "?" + parts.query
        conn.putrequest(method, target, skip_host=True, skip_accept_encoding=True)
        hdrs = dict(headers or {})
        if not any(k.lower() == "host" for k in hdrs):
            hdrs["Host"] = parts.netloc
        if body is not None and not any(k.lower() in ("content-length", "transfer-encoding") for k in hdrs):
            if body or method in ("PUT", "POST"):
                hdrs["Content-Length"] = str(len(body))
        for k, v in hdrs.items():
            conn.putheader(k, v)
        conn.endheaders()
        if body:
            conn.send(body)
        resp = conn.getresponse()
        data = resp.read()
        return resp.status, {k.lower(): v for k, v in resp.getheaders()}, data
    finally:
        conn.close()


def signed_request(server, method, path_and_query, service="s3", body=b"", headers=None, creds=None,
                   region="us-east-1", payload_hash=None, when=None, host=None):
    url = server.endpoint + path_and_query
    hdrs = dict(headers or {})
    if host:
        hdrs["Host"] = host
    hdrs, _, _ = sign_request(method, url, hdrs, creds or server.creds(), service, region=region,
                              payload_hash=payload_hash, body=body, when=when)
    return http_request(method, url, hdrs, body)


def json_request(server, target, payload, service="sagemaker", creds=None, when=None, raw_body=None):
    body = raw_body if raw_body is not None else json.dumps(payload).encode()
    headers = {"X-Amz-Target": target, "Content-Type": "application/x-amz-json-1.1"}
    hdrs, _, _ = sign_request("POST", server.endpoint + "/", headers, creds or server.creds(), service,
                              body=body, when=when,
                              signed_headers=["content-type", "host", "x-amz-date", "x-amz-target"])
    return http_request("POST", server.endpoint + "/", hdrs, body)


def xml_error_code(body):
    import xml.etree.ElementTree as ET
    root = ET.fromstring(body)
    for el in root.iter():
        if el.tag.split("}")[-1] == "Code":
            return el.text
    return None


def xml_find(body, name):
    import xml.etree.ElementTree as ET
    root = ET.fromstring(body)
    return [el.text for el in root.iter() if el.tag.split("}")[-1] == name]


def raw_exchange(host, port, data, timeout=10, read_limit=1 << 20, half_close=False):
    """Sends `data` on a fresh socket and returns what came back until close/timeout."""
    s = socket.create_connection((host, port), timeout=timeout)
    try:
        s.sendall(data)
        if half_close:
            s.shutdown(socket.SHUT_WR)
        chunks = []
        total = 0
        while total < read_limit:
            try:
                c = s.recv(65536)
            except socket.timeout:
                break
            except ConnectionResetError:
                break
            if not c:
                break
            chunks.append(c)
            total += len(c)
            if b"\r\n\r\n" in b"".join(chunks) and not half_close:
                # Enough for a status line; give the server a moment to finish, then stop.
                s.settimeout(1.0)
        return b"".join(chunks)
    finally:
        s.close()


def status_of(raw):
    line = raw.split(b"\r\n", 1)[0]
    parts = line.split()
    if len(parts) >= 2 and parts[0].startswith(b"HTTP/"):
        return int(parts[1])
    return None


def sha256_file(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while True:
            b = f.read(8 << 20)
            if not b:
                break
            h.update(b)
    return h.hexdigest()


def make_random_file(path, size):
    with open(path, "wb") as f:
        left = size
        while left:
            n = min(left, 16 << 20)
            f.write(os.urandom(n))
            left -= n
    return sha256_file(path)


def new_tempdir(prefix="kiln-it-"):
    return tempfile.mkdtemp(prefix=prefix)


# ---------------------------------------------------------------------------------------------
# Container engine (issue 15)


def podman_socket():
    """(path, None) when Podman's API answers at $KILN_PODMAN_SOCKET, else (None, why).

    scripts/test.sh exports KILN_PODMAN_SOCKET only after scripts/podman-setup.sh got the service
    answering, and KILN_PODMAN_SKIP_REASON when it could not; run by hand without either, the
    default /run/podman/podman.sock is tried (as tests/integration/container_images.py does).
    Container tests skip with `why`."""
    path = os.environ.get("KILN_PODMAN_SOCKET", "")
    if path.startswith("unix://"):
        path = path[len("unix://"):]
    if not path:
        if os.environ.get("KILN_PODMAN_SKIP_REASON"):
            return None, os.environ["KILN_PODMAN_SKIP_REASON"]
        path = "/run/podman/podman.sock"
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
            s.settimeout(5)
            s.connect(path)
            s.sendall(b"GET /_ping HTTP/1.0\r\nHost: d\r\n\r\n")
            answer = s.recv(4096)
    except OSError as e:
        return None, "Podman's API does not answer at %s: %s (run scripts/podman-setup.sh)" % (path, e)
    if not answer.startswith(b"HTTP/1.") or b" 200 " not in answer.split(b"\r\n", 1)[0]:
        return None, "Podman's API at %s answered %r to /_ping" % (path, answer[:60])
    return path, None


def container_engine_config(socket_path, **settings):
    """A server config section running every image on the engine at `socket_path` (plus any
    container_engine `settings`, e.g. images=["localhost/*"]); pass as KilnServer(config=...)."""
    section = {"socket": "unix://" + socket_path}
    section.update(settings)
    return {"container_engine": section}
