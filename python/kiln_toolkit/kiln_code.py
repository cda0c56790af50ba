"""The user's code: staging it (files.download_and_extract), the entry point's kind and installing
its dependencies (entry_point.install, modules.install)."""

import os
import sys

from kiln_errors import (
    CalledProcessError, ClientError, InstallModuleError, InstallRequirementsError, log)
from kiln_process import check_error

PIP_HINT = (
    "Kiln: this environment could not install the job's requirements. Kiln environments can be "
    "configured with a prepared interpreter that already has the dependencies (then set "
    "KILN_SKIP_REQUIREMENTS=1 in the job's Environment to skip the install)."
)


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
