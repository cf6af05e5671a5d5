"""Model repositories on object storage (issue 40), against real servers the
tests start: s3rver (S3) and azurite (Azure Blob), from tools/storage-emulators
(scripts/setup.sh installs them). Objects are uploaded, replaced and deleted
with the AWS and Azure SDKs (tools/storage-emulators/client.mjs). The cases
follow Triton's qa/L0_storage_S3_local and qa/L0_storage_azure: serve and
infer, credentials (environment, connection string, credential file), bad
credentials, missing bucket, unreachable server (start-up and load), key
traversal, poll (added, changed by ETag, removed), explicit load re-reading
its prefix, a download that fails never replacing a served model, local and
remote repositories mixed. An emulator that does not start fails the test.
"""
import glob
import json
import os
import shutil
import signal
import socket
import subprocess
import threading
import time

import numpy as np
import pytest
import requests

from conftest import EXAMPLES, NEREID, ROOT, free_port

EMU = os.path.join(ROOT, "tools", "storage-emulators")
CLIENT = os.path.join(EMU, "client.mjs")
S3_KEY, S3_SECRET = "S3RVER", "S3RVER"  # s3rver's built-in account
AZ_ACCOUNT = "devstoreaccount1"
AZ_KEY = ("Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/"
          "K1SZFPTOtr/KBHBeksoGMGw==")

F2 = 'data_type: TYPE_FP32 dims: [ 2 ]'


def make_config(mbs=8, extra=""):
    return (f'backend: "testing" max_batch_size: {mbs} {extra}\n'
            f'input [ {{ name: "INPUT0" {F2} }} ]\noutput [ {{ name: "OUTPUT0" {F2} }} ]\n')


def write_model(root, name, config, versions=(1,)):
    d = os.path.join(root, name)
    os.makedirs(d, exist_ok=True)
    for v in versions:
        # Object storage has no empty directories: a version needs a file.
        os.makedirs(os.path.join(d, str(v)), exist_ok=True)
        open(os.path.join(d, str(v), ".keep"), "w").close()
    with open(os.path.join(d, "config.pbtxt"), "w") as f:
        f.write(config)
    return d


def _wait_port(proc, port, log, what):
    deadline = time.time() + 60
    while time.time() < deadline:
        if proc.poll() is not None:
            pytest.fail(f"{what} exited with {proc.returncode}:\n{open(log).read()}")
        with socket.socket() as s:
            s.settimeout(0.2)
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.1)
    pytest.fail(f"{what} did not listen on port {port}:\n{open(log).read()}")


class Emulator:
    """One emulator process on a free port; fails the test if it cannot start."""

    def __init__(self, kind, workdir):
        bin_dir = os.path.join(EMU, "node_modules", ".bin")
        if not os.path.exists(os.path.join(bin_dir, "s3rver")):
            pytest.fail("tools/storage-emulators is not installed: run scripts/setup.sh")
        self.kind = kind
        self.port = free_port()
        data = os.path.join(workdir, f"{kind}-data")
        os.makedirs(data, exist_ok=True)
        self.log = os.path.join(workdir, f"{kind}.log")
        if kind == "s3":
            cmd = [os.path.join(bin_dir, "s3rver"), "--directory", data, "--address",
                   "127.0.0.1", "--port", str(self.port), "--silent"]
        else:
            cmd = [os.path.join(bin_dir, "azurite-blob"), "--location", data, "--blobHost",
                   "127.0.0.1", "--blobPort", str(self.port), "--silent", "--skipApiVersionCheck",
                   "--loose", "--disableTelemetry"]
        self.proc = subprocess.Popen(cmd, stdout=open(self.log, "w"), stderr=subprocess.STDOUT,
                                     start_new_session=True)
        _wait_port(self.proc, self.port, self.log, kind)

    @property
    def endpoint(self):
        return f"http://127.0.0.1:{self.port}"

    @property
    def connection_string(self):
        return (f"DefaultEndpointsProtocol=http;AccountName={AZ_ACCOUNT};AccountKey={AZ_KEY};"
                f"BlobEndpoint={self.endpoint}/{AZ_ACCOUNT};")

    def client(self, *args):
        if self.kind == "s3":
            cmd = ["node", CLIENT, "s3", self.endpoint, S3_KEY, S3_SECRET, *args]
        else:
            cmd = ["node", CLIENT, "as", self.connection_string, *args]
        env = dict(os.environ, NODE_NO_WARNINGS="1")  # the SDK's node-version notice
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=120, env=env)
        assert r.returncode == 0, r.stderr

    def stop(self):
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()


@pytest.fixture(scope="module")
def emulators(tmp_path_factory):
    work = str(tmp_path_factory.mktemp("emulators"))
    s3 = Emulator("s3", work)
    az = Emulator("as", work)
    s3.client("mkbucket", "models")
    az.client("mkbucket", "models")
    yield {"s3": s3, "as": az}
    s3.stop()
    az.stop()


@pytest.fixture
def s3_env(monkeypatch):
    for v in ("TRITON_CLOUD_CREDENTIAL_PATH", "AWS_SESSION_TOKEN", "AWS_PROFILE",
              "AZURE_STORAGE_CONNECTION_STRING", "AZURE_STORAGE_ACCOUNT", "AZURE_STORAGE_KEY"):
        monkeypatch.delenv(v, raising=False)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", S3_KEY)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", S3_SECRET)
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    return monkeypatch


def upload(emu, prefix, models_dir):
    emu.client("put-dir", "models", prefix, models_dir)


def s3_url(emu, prefix):
    return f"s3://127.0.0.1:{emu.port}/models/{prefix.rstrip('/')}"


def post(s, path, body=None):
    return requests.post(s.http_url + path, data=json.dumps(body) if body else b"", timeout=60)


def infer_testing(s, model):
    body = {"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1, 2],
                        "data": [1.0, 2.0]}]}
    return requests.post(f"{s.http_url}/v2/models/{model}/infer", json=body, timeout=30)


def infer_add_sub_onnx(s):
    a = np.arange(16, dtype=np.float32)
    b = np.full(16, 2.0, dtype=np.float32)
    body = {"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1, 16],
                        "data": a.tolist()},
                       {"name": "INPUT1", "datatype": "FP32", "shape": [1, 16],
                        "data": b.tolist()}]}
    r = requests.post(f"{s.http_url}/v2/models/add_sub_onnx/infer", json=body, timeout=30)
    assert r.status_code == 200, r.text
    out = {o["name"]: o["data"] for o in r.json()["outputs"]}
    assert out["OUTPUT0"] == (a + b).tolist() and out["OUTPUT1"] == (a - b).tolist()


def max_batch(s, model):
    r = requests.get(f"{s.http_url}/v2/models/{model}/config", timeout=10)
    return r.json().get("max_batch_size") if r.status_code == 200 else None


def ready(s, model):
    return requests.get(f"{s.http_url}/v2/models/{model}/ready", timeout=10).status_code == 200


def wait_for(cond, timeout=30):
    deadline = time.time() + timeout
    while time.time() < deadline:
        if cond():
            return True
        time.sleep(0.1)
    return False


def start_fails(*args, timeout=60):
    """Runs nereid expecting it to stop at start-up; its exit code and output."""
    cmd = [NEREID, *args, f"--http-port={free_port()}", f"--grpc-port={free_port()}",
           f"--metrics-port={free_port()}", "--http-address=127.0.0.1", "--grpc-address=127.0.0.1"]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    return r.returncode, r.stdout + r.stderr


def example_repo(tmp_path, *names):
    d = str(tmp_path / "upload")
    for n in names:
        shutil.copytree(os.path.join(EXAMPLES, n), os.path.join(d, n))
    return d


@pytest.fixture(scope="module")
def onnx_model():
    path = os.path.join(EXAMPLES, "add_sub_onnx", "1", "model.onnx")
    if not os.path.exists(path):
        pytest.fail("examples/models lacks add_sub_onnx/1/model.onnx: run `make models`")
    return path


def test_s3_serves_and_infers(emulators, s3_env, nereid_server, tmp_path, onnx_model):
    s3 = emulators["s3"]
    src = example_repo(tmp_path, "add_sub_onnx")
    write_model(src, "plain", make_config())
    upload(s3, "serve/", src)
    mount = tmp_path / "mount"
    mount.mkdir()
    s3_env.setenv("TRITON_AWS_MOUNT_DIRECTORY", str(mount))
    s = nereid_server(s3_url(s3, "serve/"))
    infer_add_sub_onnx(s)  # a binary model file arrived whole
    assert infer_testing(s, "plain").status_code == 200
    names = sorted(m["name"] for m in post(s, "/v2/repository/index").json())
    assert names == ["add_sub_onnx", "plain"]
    # The mirror is under TRITON_AWS_MOUNT_DIRECTORY, private, and removed at exit.
    mirrors = glob.glob(str(mount / "nereid-s3-*"))
    assert len(mirrors) == 1 and os.stat(mirrors[0]).st_mode & 0o777 == 0o700
    with open(os.path.join(mirrors[0], "add_sub_onnx", "1", "model.onnx"), "rb") as f:
        assert f.read() == open(onnx_model, "rb").read()
    assert s.stop() == 0
    assert not os.path.exists(mirrors[0])


def test_s3_https_prefix_and_credential_file(emulators, s3_env, nereid_server, tmp_path):
    """TRITON_CLOUD_CREDENTIAL_PATH: the longest matching name wins; its
    entry, not the environment, gives the keys."""
    s3 = emulators["s3"]
    src = str(tmp_path / "src")
    write_model(src, "plain", make_config())
    upload(s3, "credfile/", src)
    # s3://http://host:port/... is Triton's spelling of the scheme.
    url = s3_url(s3, "credfile/").replace("s3://", "s3://http://")
    bucket_url = url[:url.index("/models") + 7]
    creds = {"s3": {"": {"key_id": "WRONG", "secret_key": "WRONG"},
                    bucket_url: {"key_id": S3_KEY, "secret_key": S3_SECRET,
                                 "region": "us-east-1"}}}
    path = tmp_path / "creds.json"
    path.write_text(json.dumps(creds))
    s3_env.setenv("TRITON_CLOUD_CREDENTIAL_PATH", str(path))
    s3_env.setenv("AWS_ACCESS_KEY_ID", "WRONG")
    s = nereid_server(url)
    assert infer_testing(s, "plain").status_code == 200
    # No name matches: Triton's text.
    creds["s3"].pop("")
    creds["s3"]["s3://elsewhere"] = creds["s3"].pop(bucket_url)
    path.write_text(json.dumps(creds))
    rc, out = start_fails(f"--model-repository={url}")
    assert rc != 0 and f"Cannot match credential for path  {url}" in out, out


def test_azure_serves_and_infers(emulators, s3_env, nereid_server, tmp_path, onnx_model):
    az = emulators["as"]
    src = example_repo(tmp_path, "add_sub_onnx")
    write_model(src, "plain", make_config())
    upload(az, "serve/", src)
    url = f"as://{AZ_ACCOUNT}/models/serve"
    # The SDKs' connection string (its BlobEndpoint is the emulator).
    s3_env.setenv("AZURE_STORAGE_CONNECTION_STRING", az.connection_string)
    s = nereid_server(url)
    infer_add_sub_onnx(s)
    assert infer_testing(s, "plain").status_code == 200
    assert s.stop() == 0
    # Triton's AZURE_STORAGE_ACCOUNT / AZURE_STORAGE_KEY, with only the
    # endpoint from a connection string.
    s3_env.setenv("AZURE_STORAGE_CONNECTION_STRING", f"BlobEndpoint={az.endpoint}/{AZ_ACCOUNT}")
    s3_env.setenv("AZURE_STORAGE_ACCOUNT", AZ_ACCOUNT)
    s3_env.setenv("AZURE_STORAGE_KEY", AZ_KEY)
    s = nereid_server(url)
    infer_add_sub_onnx(s)


def test_bad_credentials_fail_the_start(emulators, s3_env, tmp_path):
    s3, az = emulators["s3"], emulators["as"]
    src = str(tmp_path / "src")
    write_model(src, "plain", make_config())
    upload(s3, "creds/", src)
    upload(az, "creds/", src)
    # s3rver checks the key id (it does not verify SigV4 signatures).
    s3_env.setenv("AWS_ACCESS_KEY_ID", "NOT-A-KEY")
    url = s3_url(s3, "creds/")
    rc, out = start_fails(f"--model-repository={url}")
    assert rc != 0, out
    assert f"failed to read model repository '{url}': HTTP 403 InvalidAccessKeyId" in out, out
    # azurite verifies the Shared Key signature: a wrong key is refused.
    s3_env.setenv("AZURE_STORAGE_CONNECTION_STRING", f"BlobEndpoint={az.endpoint}/{AZ_ACCOUNT}")
    s3_env.setenv("AZURE_STORAGE_ACCOUNT", AZ_ACCOUNT)
    s3_env.setenv("AZURE_STORAGE_KEY", "d3Jvbmcga2V5")
    rc, out = start_fails(f"--model-repository=as://{AZ_ACCOUNT}/models/creds")
    assert rc != 0 and "HTTP 403 AuthorizationFailure" in out, out
    s3_env.setenv("AZURE_STORAGE_KEY", "not base64!")
    rc, out = start_fails(f"--model-repository=as://{AZ_ACCOUNT}/models/creds")
    assert rc != 0 and "the Azure storage account key is not base64" in out, out


def test_missing_bucket_and_gs(emulators, s3_env):
    s3, az = emulators["s3"], emulators["as"]
    rc, out = start_fails(f"--model-repository=s3://127.0.0.1:{s3.port}/no-such-bucket/x")
    assert rc != 0 and "HTTP 404 NoSuchBucket: The specified bucket does not exist" in out, out
    s3_env.setenv("AZURE_STORAGE_CONNECTION_STRING", az.connection_string)
    rc, out = start_fails(f"--model-repository=as://{AZ_ACCOUNT}/no-such-container")
    assert rc != 0 and "HTTP 404 ContainerNotFound" in out, out
    rc, out = start_fails("--model-repository=gs://bucket/models")
    assert rc != 0 and "gs:// model repositories are not supported" in out, out
    rc, out = start_fails("--model-repository=as://account-only")
    assert rc != 0 and "Invalid azure storage path: as://account-only" in out, out


def test_unreachable_server_and_mixed_repositories(s3_env, nereid_server, tmp_path):
    """Nothing listens on the port: a clear error at start-up; with
    --exit-on-error=false the local repository still serves."""
    port = free_port()
    url = f"s3://127.0.0.1:{port}/models/repo"
    rc, out = start_fails(f"--model-repository={url}")
    assert rc != 0 and f"failed to read model repository '{url}': Couldn't connect" in out, out
    local = str(tmp_path / "local")
    write_model(local, "local_model", make_config())
    s = nereid_server([local, url], "--exit-on-error=false")
    assert infer_testing(s, "local_model").status_code == 200
    assert f"failed to read model repository '{url}'" in s.output()


def test_mixed_local_and_remote(emulators, s3_env, nereid_server, tmp_path):
    s3, az = emulators["s3"], emulators["as"]
    src = str(tmp_path / "src")
    write_model(src, "from_s3", make_config())
    upload(s3, "mixed/", src)
    src2 = str(tmp_path / "src2")
    write_model(src2, "from_azure", make_config())
    upload(az, "mixed/", src2)
    local = str(tmp_path / "local")
    write_model(local, "from_disk", make_config())
    s3_env.setenv("AZURE_STORAGE_CONNECTION_STRING", az.connection_string)
    s = nereid_server([local, s3_url(s3, "mixed/"), f"as://{AZ_ACCOUNT}/models/mixed"])
    for m in ("from_disk", "from_s3", "from_azure"):
        assert infer_testing(s, m).status_code == 200, m


class HostileS3:
    """An S3 endpoint the test controls byte for byte (s3rver and azurite
    resolve '..' in keys, as S3's own clients do, so they cannot serve the
    keys a hostile or broken server could): ListObjectsV2 over `objects`
    (key -> body), GETs answering with the listed ETag unless `get_etag`
    says otherwise, or cut short for the keys in `truncate`."""

    def __init__(self, creds=None):
        import http.server
        import threading
        outer = self
        self.objects, self.get_etag, self.truncate = {}, {}, set()
        self.stall = set()  # keys whose GET sends part of the body, then waits for release
        self.stalled, self.release = threading.Event(), threading.Event()
        self.creds = creds  # (key id, secret, region): requests must carry a valid SigV4
        self.signed_headers = set()

        class Handler(http.server.BaseHTTPRequestHandler):
            def log_message(self, *a):
                pass

            def do_GET(self):
                from urllib.parse import unquote, urlsplit
                if outer.creds and not outer.signature_ok(self):
                    return self.reply(403, b"<Error><Code>SignatureDoesNotMatch</Code><Message>"
                                      b"The request signature we calculated does not match"
                                      b"</Message></Error>", "x")
                u = urlsplit(self.path)
                bucket, _, key = unquote(u.path).lstrip("/").partition("/")
                if not key:
                    items = "".join(
                        f"<Contents><Key>{escape(k)}</Key><ETag>&quot;{etag(v)}&quot;</ETag>"
                        f"<Size>{len(v)}</Size></Contents>" for k, v in sorted(outer.objects.items()))
                    body = (f"<ListBucketResult><Name>{bucket}</Name>{items}"
                            "<IsTruncated>false</IsTruncated></ListBucketResult>").encode()
                    return self.reply(200, body, "x")
                data = outer.objects.get(key)
                if data is None:
                    return self.reply(404, b"<Error><Code>NoSuchKey</Code></Error>", "x")
                tag = outer.get_etag.get(key, etag(data))
                if key in outer.stall:
                    self.send_response(200)
                    self.send_header("Content-Length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data[:1])
                    self.wfile.flush()
                    outer.stalled.set()
                    outer.release.wait(300)
                    return
                if key in outer.truncate:  # says more than it sends, then closes
                    self.send_response(200)
                    self.send_header("ETag", f'"{tag}"')
                    self.send_header("Content-Length", str(len(data) + 100))
                    self.end_headers()
                    self.wfile.write(data)
                    self.close_connection = True
                    return
                self.reply(200, data, tag)

            def reply(self, code, body, tag):
                self.send_response(code)
                self.send_header("ETag", f'"{tag}"')
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        from xml.sax.saxutils import escape
        import hashlib

        def etag(v):
            return hashlib.md5(v).hexdigest()

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.httpd.block_on_close = False
        self.port = self.httpd.server_address[1]
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    def signature_ok(self, req):
        """AWS Signature Version 4, computed here from the request as received."""
        import hashlib
        import hmac
        from urllib.parse import urlsplit
        key_id, secret, region = self.creds
        auth = req.headers.get("Authorization", "")
        prefix = "AWS4-HMAC-SHA256 "
        if not auth.startswith(prefix):
            return False
        fields = dict(kv.strip().split("=", 1) for kv in auth[len(prefix):].split(","))
        cred = fields["Credential"].split("/")
        if cred[0] != key_id or cred[2] != region or cred[3:] != ["s3", "aws4_request"]:
            return False
        names = fields["SignedHeaders"].split(";")
        self.signed_headers |= set(names)
        u = urlsplit(req.path)
        query = "&".join(sorted(q for q in u.query.split("&") if q))
        headers = "".join(f"{n}:{req.headers.get(n, '').strip()}\n" for n in names)
        canonical = "\n".join(["GET", u.path, query, headers, ";".join(names),
                               req.headers["x-amz-content-sha256"]])
        date = req.headers["x-amz-date"]
        scope = f"{date[:8]}/{region}/s3/aws4_request"
        to_sign = "\n".join(["AWS4-HMAC-SHA256", date, scope,
                             hashlib.sha256(canonical.encode()).hexdigest()])
        k = ("AWS4" + secret).encode()
        for part in (date[:8], region, "s3", "aws4_request"):
            k = hmac.new(k, part.encode(), hashlib.sha256).digest()
        want = hmac.new(k, to_sign.encode(), hashlib.sha256).hexdigest()
        return hmac.compare_digest(want, fields["Signature"])

    def put_model(self, prefix, name, config):
        self.objects[f"{prefix}{name}/config.pbtxt"] = config.encode()
        self.objects[f"{prefix}{name}/1/.keep"] = b""

    def stop(self):
        self.release.set()
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def hostile_s3():
    h = HostileS3()
    yield h
    h.stop()


def test_key_traversal_does_not_escape_s3(hostile_s3, s3_env, nereid_server, tmp_path):
    """Keys with '..', '.', empty or absolute components never write
    outside the mirror; the model's other objects are served."""
    h = hostile_s3
    h.put_model("r/", "evil", make_config())
    bad = ["r/evil/../../../../escaped_a", "r/evil/1/../../escaped_b", "r/../escaped_c",
           "r/evil/./escaped_e", "r//escaped_f", "r/evil//escaped_g", "r/../../escaped_h/x",
           "r/evil/1/..", "r/..evil/x"]
    for key in bad:
        h.objects[key] = b"escaped"
    mount = tmp_path / "mount"
    mount.mkdir()
    s3_env.setenv("TRITON_AWS_MOUNT_DIRECTORY", str(mount))
    s = nereid_server(f"s3://127.0.0.1:{h.port}/b/r")
    assert infer_testing(s, "evil").status_code == 200
    refused = [line for line in s.output().splitlines() if "refusing object key" in line]
    assert len(refused) == len(bad), s.output()
    assert sum("'..' path component" in line for line in refused) == 5, refused
    assert sum("'.' path component" in line for line in refused) == 1, refused
    assert sum("empty path component" in line for line in refused) == 1, refused
    assert sum("an absolute path" in line for line in refused) == 1, refused
    assert not glob.glob(str(tmp_path / "**" / "escaped_*"), recursive=True)
    mirror = glob.glob(str(mount / "nereid-*"))[0]
    files = sorted(os.path.relpath(os.path.join(d, f), mirror)
                   for d, _, fs in os.walk(mirror) for f in fs)
    assert files == ["evil/1/.keep", "evil/config.pbtxt"], files


def test_key_traversal_does_not_escape_azure(emulators, s3_env, nereid_server, tmp_path):
    """On azurite (whose SDK resolves dot segments): empty components."""
    az = emulators["as"]
    src = str(tmp_path / "src")
    write_model(src, "evil", make_config())
    upload(az, "trav/", src)
    payload = tmp_path / "payload"
    payload.write_text("escaped")
    bad = ["trav/evil//escaped_d", "trav//escaped_f", "trav/evil/1//x"]
    for key in bad:
        az.client("put", "models", key, str(payload))
    mount = tmp_path / "mount"
    mount.mkdir()
    s3_env.setenv("TRITON_AZURE_MOUNT_DIRECTORY", str(mount))
    s3_env.setenv("AZURE_STORAGE_CONNECTION_STRING", az.connection_string)
    s = nereid_server(f"as://{AZ_ACCOUNT}/models/trav")
    assert infer_testing(s, "evil").status_code == 200
    refused = [line for line in s.output().splitlines() if "refusing object key" in line]
    assert len(refused) == len(bad), s.output()
    mirror = glob.glob(str(mount / "nereid-*"))[0]
    files = sorted(os.path.relpath(os.path.join(d, f), mirror)
                   for d, _, fs in os.walk(mirror) for f in fs)
    assert files == ["evil/1/.keep", "evil/config.pbtxt"], files


def test_s3_signature_v4(s3_env, nereid_server):
    """s3rver checks only the key id; this endpoint checks the whole
    SigV4 signature (secret, region, session token header, query order and
    encoding of a key that needs it)."""
    h = HostileS3(creds=("AKID", "the secret", "eu-west-3"))
    try:
        h.put_model("repo dir/", "m", make_config())
        h.objects["repo dir/m/1/a file+(x)~.bin"] = b"payload"
        s3_env.setenv("AWS_ACCESS_KEY_ID", "AKID")
        s3_env.setenv("AWS_SECRET_ACCESS_KEY", "the secret")
        s3_env.setenv("AWS_DEFAULT_REGION", "eu-west-3")
        s3_env.setenv("AWS_SESSION_TOKEN", "token/with+chars=")
        url = f"s3://127.0.0.1:{h.port}/b/repo dir"
        s = nereid_server(url)
        assert infer_testing(s, "m").status_code == 200
        assert "x-amz-security-token" in h.signed_headers, h.signed_headers
        s.stop()
        s3_env.setenv("AWS_SECRET_ACCESS_KEY", "not the secret")
        rc, out = start_fails(f"--model-repository={url}")
        assert rc != 0 and "HTTP 403 SignatureDoesNotMatch" in out, out
        s3_env.setenv("AWS_SECRET_ACCESS_KEY", "the secret")
        s3_env.setenv("AWS_DEFAULT_REGION", "us-east-1")
        rc, out = start_fails(f"--model-repository={url}")
        assert rc != 0 and "HTTP 403 SignatureDoesNotMatch" in out, out
    finally:
        h.stop()


def test_stop_ends_a_stalled_download(hostile_s3, s3_env, nereid_server):
    """A poll's download that stalls (the server sends one byte and waits)
    does not hold up the shutdown: SIGINT ends the transfer (libcurl would
    otherwise wait out its 60 s low-speed limit)."""
    h = hostile_s3
    h.put_model("r/", "m", make_config())
    s = nereid_server(f"s3://127.0.0.1:{h.port}/b/r", "--model-control-mode=poll",
                      "--repository-poll-secs=1")
    h.objects["r/m/1/weights.bin"] = b"w" * 4096
    h.stall.add("r/m/1/weights.bin")
    assert h.stalled.wait(30), s.output()
    t0 = time.monotonic()
    assert s.stop() == 0, s.output()
    assert time.monotonic() - t0 < 30, s.output()


def test_incomplete_download_never_serves(hostile_s3, s3_env, nereid_server):
    """An object cut short, or changed between the listing and its GET
    (another ETag): the model is not put in place; a served copy stays
    until a poll gets the whole model."""
    h = hostile_s3
    h.put_model("r/", "cut", make_config())
    h.objects["r/cut/1/weights.bin"] = b"w" * 1000
    h.truncate.add("r/cut/1/weights.bin")
    h.put_model("r/", "changing", make_config(mbs=8))
    s = nereid_server(f"s3://127.0.0.1:{h.port}/b/r", "--model-control-mode=poll",
                      "--repository-poll-secs=1", "--exit-on-error=false")
    assert ready(s, "changing") and not ready(s, "cut")
    assert "failed to download model 'cut'" in s.output()
    names = [m["name"] for m in post(s, "/v2/repository/index").json()]
    assert "cut" not in names, names
    # The config changes, but its GET answers another ETag than the listing.
    h.objects["r/changing/config.pbtxt"] = make_config(mbs=4).encode()
    h.get_etag["r/changing/config.pbtxt"] = "not-the-listed-one"
    assert wait_for(lambda: "object 'r/changing/config.pbtxt' changed while it was downloaded"
                    in s.output()), s.output()
    assert max_batch(s, "changing") == 8 and infer_testing(s, "changing").status_code == 200
    # Both heal once the server answers whole, consistent objects.
    h.get_etag.clear()
    h.truncate.clear()
    assert wait_for(lambda: max_batch(s, "changing") == 4), s.output()
    assert wait_for(lambda: ready(s, "cut")), s.output()


@pytest.mark.parametrize("kind", ["s3", "as"])
def test_poll_added_changed_removed(emulators, s3_env, nereid_server, tmp_path, kind):
    emu = emulators[kind]
    prefix = f"poll-{kind}/"
    src = str(tmp_path / "src")
    write_model(src, "stays", make_config())
    write_model(src, "changes", make_config(mbs=8))
    write_model(src, "leaves", make_config())
    upload(emu, prefix, src)
    s3_env.setenv("AZURE_STORAGE_CONNECTION_STRING", emulators["as"].connection_string)
    url = s3_url(emu, prefix) if kind == "s3" else f"as://{AZ_ACCOUNT}/models/{prefix[:-1]}"
    s = nereid_server(url, "--model-control-mode=poll", "--repository-poll-secs=1",
                      "--log-verbose=1")
    assert max_batch(s, "changes") == 8 and ready(s, "leaves")
    # Changed: a new ETag for config.pbtxt; its unchanged object is reused.
    new = tmp_path / "config.pbtxt"
    new.write_text(make_config(mbs=4))
    emu.client("put", "models", prefix + "changes/config.pbtxt", str(new))
    assert wait_for(lambda: max_batch(s, "changes") == 4), s.output()
    assert "1 model(s) downloaded (2 objects, 1 of them already in the copy)" in s.output()
    # Added.
    add = str(tmp_path / "add")
    write_model(add, "added", make_config())
    upload(emu, prefix, add)
    assert wait_for(lambda: ready(s, "added")), s.output()
    # Removed: unloaded.
    emu.client("rm-prefix", "models", prefix + "leaves/")
    assert wait_for(lambda: not ready(s, "leaves")), s.output()
    assert infer_testing(s, "leaves").status_code in (400, 404)
    # A model whose new objects cannot all be downloaded (a file where its
    # version directory must be) keeps serving the copy it had.
    emu.client("put", "models", prefix + "changes/1", str(new))
    new.write_text(make_config(mbs=2))
    emu.client("put", "models", prefix + "changes/config.pbtxt", str(new))
    assert wait_for(lambda: "failed to download model 'changes'" in s.output()), s.output()
    assert max_batch(s, "changes") == 4 and infer_testing(s, "changes").status_code == 200
    assert ready(s, "stays")


def test_explicit_load_rereads_the_prefix(emulators, s3_env, nereid_server, tmp_path):
    s3 = emulators["s3"]
    prefix = "explicit/"
    src = str(tmp_path / "src")
    write_model(src, "m", make_config(mbs=8))
    upload(s3, prefix, src)
    s = nereid_server(s3_url(s3, prefix), "--model-control-mode=explicit")
    assert not ready(s, "m")
    assert post(s, "/v2/repository/models/m/load").status_code == 200
    assert max_batch(s, "m") == 8
    new = tmp_path / "config.pbtxt"
    new.write_text(make_config(mbs=4))
    s3.client("put", "models", prefix + "m/config.pbtxt", str(new))
    assert post(s, "/v2/repository/models/m/load").status_code == 200
    assert max_batch(s, "m") == 4
    # A model uploaded after the start is found by its load.
    add = str(tmp_path / "add")
    write_model(add, "late", make_config())
    upload(s3, prefix, add)
    assert post(s, "/v2/repository/models/late/load").status_code == 200
    assert infer_testing(s, "late").status_code == 200


def test_load_when_server_goes_away(s3_env, nereid_server, tmp_path):
    """The bucket's server stops: a load fails with a clear error and the
    loaded model keeps serving."""
    emu = Emulator("s3", str(tmp_path))
    try:
        emu.client("mkbucket", "models")
        src = str(tmp_path / "src")
        write_model(src, "m", make_config())
        upload(emu, "gone/", src)
        s = nereid_server(s3_url(emu, "gone/"), "--model-control-mode=explicit",
                          "--load-model=m")
        assert infer_testing(s, "m").status_code == 200
    finally:
        emu.stop()
    r = post(s, "/v2/repository/models/m/load")
    assert r.status_code == 500, r.text  # Triton's poll failure: INTERNAL
    err = r.json()["error"]
    assert err.startswith("failed to load 'm', failed to poll from model repository: "), err
    assert "Couldn't connect" in err, err
    assert infer_testing(s, "m").status_code == 200
