"""The `kiln` command itself: server start-up contract, `kiln env`, `kiln version`, refusal to
listen on a non-loopback address without configured credentials, config-file settings."""

import json
import os
import re
import stat
import subprocess

import pytest

import kiln_harness as kh


def test_startup_contract(kiln):
    # credentials.json: created with mode 0600, one key pair with the documented fields.
    path = os.path.join(kiln.data_dir, "credentials.json")
    mode = stat.S_IMODE(os.stat(path).st_mode)
    assert mode == 0o600, "credentials.json mode is %o" % mode
    with open(path) as f:
        doc = json.load(f)
    assert len(doc["keys"]) == 1
    key = doc["keys"][0]
    assert re.fullmatch(r"AKIA[A-Z0-9]{12,}", key["access_key_id"]), key["access_key_id"]
    assert len(key["secret_access_key"]) >= 30
    assert key["account_id"] == "000000000000"
    assert key["principal_arn"] == "arn:aws:iam::000000000000:user/kiln-admin"
    assert key["user_id"].startswith("AIDA")
    # The ready line.
    log = kiln.log_text()
    ready = [l for l in log.splitlines() if 'msg="listening"' in l or "msg=listening" in l]
    assert ready, "no listening line in log:\n" + kiln.log_tail()
    assert "address=127.0.0.1:%d" % kiln.port in ready[0], ready[0]
    # Health is unauthenticated JSON.
    status, headers, body = kh.http_request("GET", kiln.endpoint + "/_kiln/health")
    assert status == 200
    assert json.loads(body)["status"] == "ok"


def test_credentials_survive_restart(kiln_factory):
    srv = kiln_factory("restartcreds")
    before = dict(srv.credentials)
    srv.restart()
    assert srv.credentials == before
    srv.client("s3").list_buckets()


def test_sigint_exits_zero(kiln_factory):
    import signal
    srv = kiln_factory("sigint")
    srv.proc.send_signal(signal.SIGINT)
    assert srv.proc.wait(30) == 0
    srv.proc = None


def test_version(kiln_binary):
    p = subprocess.run([kiln_binary, "version"], capture_output=True, text=True, timeout=30)
    assert p.returncode == 0, p.stderr
    assert re.search(r"\d+\.\d+\.\d+", p.stdout), p.stdout


def _parse_exports(text):
    out = {}
    for line in text.splitlines():
        m = re.fullmatch(r"export ([A-Z_]+)=(.*)", line.strip())
        if m:
            val = m.group(2)
            if len(val) >= 2 and val[0] == val[-1] and val[0] in "'\"":
                val = val[1:-1]
            out[m.group(1)] = val
    return out


def test_env_output_sourced_in_shell(kiln, kiln_binary, tmp_path):
    p = subprocess.run([kiln_binary, "env", "--data-dir", kiln.data_dir, "--endpoint", kiln.endpoint],
                       capture_output=True, text=True, timeout=30)
    assert p.returncode == 0, p.stderr
    exports = _parse_exports(p.stdout)
    assert exports.get("AWS_ENDPOINT_URL") == kiln.endpoint, p.stdout
    assert exports.get("AWS_ACCESS_KEY_ID") == kiln.access_key
    assert exports.get("AWS_SECRET_ACCESS_KEY") == kiln.secret_key
    assert exports.get("AWS_DEFAULT_REGION") == "us-east-1"

    cli = kh.aws_cli()
    if not cli:
        pytest.skip("no AWS CLI")
    home = tmp_path / "home"
    home.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    env.update(HOME=str(home), AWS_CONFIG_FILE=str(home / "config"),
               AWS_SHARED_CREDENTIALS_FILE=str(home / "credentials"), AWS_PAGER="")
    script = """
set -e
eval "$("$KILN" env --data-dir "$DATA" --endpoint "$EP")"
"$AWS" --endpoint-url "$AWS_ENDPOINT_URL" sts get-caller-identity --output json
"$AWS" --endpoint-url "$AWS_ENDPOINT_URL" s3 mb s3://env-sourced-bucket
echo hello > "$HOME/f.txt"
"$AWS" --endpoint-url "$AWS_ENDPOINT_URL" s3 cp "$HOME/f.txt" s3://env-sourced-bucket/f.txt
"$AWS" --endpoint-url "$AWS_ENDPOINT_URL" s3 ls s3://env-sourced-bucket/
"""
    env.update(KILN=kiln_binary, DATA=kiln.data_dir, EP=kiln.endpoint, AWS=cli)
    r = subprocess.run(["bash", "-c", script], env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, "stdout:\n%s\nstderr:\n%s" % (r.stdout, r.stderr)
    ident = json.loads(r.stdout[:r.stdout.index("}") + 1])
    assert ident["Account"] == kiln.account_id
    assert "f.txt" in r.stdout


def test_env_default_endpoint(kiln, kiln_binary):
    p = subprocess.run([kiln_binary, "env", "--data-dir", kiln.data_dir], capture_output=True, text=True,
                       timeout=30)
    assert p.returncode == 0, p.stderr
    exports = _parse_exports(p.stdout)
    assert exports.get("AWS_ENDPOINT_URL", "").startswith("http"), p.stdout
    assert exports.get("AWS_ACCESS_KEY_ID") == kiln.access_key


def test_non_loopback_without_credentials_refused(kiln_binary, tmp_path):
    port = kh.free_port()
    p = subprocess.run([kiln_binary, "server", "--listen", "0.0.0.0:%d" % port, "--data-dir",
                        str(tmp_path / "data")], capture_output=True, text=True, timeout=30)
    assert p.returncode != 0
    assert "credential" in p.stderr.lower(), "stderr should explain why: %r" % p.stderr


def test_non_loopback_with_configured_credentials(kiln_binary, tmp_path):
    ak, sk = "AKIAKILNINTEGTEST001", "integration-test-secret-key-0123456789abcd"
    srv = kh.KilnServer(str(tmp_path / "data"), listen_host="0.0.0.0",
                        config={"credentials": [{"access_key_id": ak, "secret_access_key": sk}],
                                "account_id": "123456789012", "region": "eu-west-1"})
    srv.start()
    try:
        ident = srv.client("sts", access_key=ak, secret_key=sk, region="eu-west-1").get_caller_identity()
        assert ident["Account"] == "123456789012"
        assert ident["Arn"].startswith("arn:aws:iam::123456789012:")
        s3 = srv.client("s3", access_key=ak, secret_key=sk, region="eu-west-1")
        s3.create_bucket(Bucket="cfg-bucket", CreateBucketConfiguration={"LocationConstraint": "eu-west-1"})
        s3.put_object(Bucket="cfg-bucket", Key="k", Body=b"v")
        assert s3.get_object(Bucket="cfg-bucket", Key="k")["Body"].read() == b"v"
    finally:
        assert srv.stop() == 0
