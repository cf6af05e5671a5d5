"""TLS on both frontends with certificates made at test time by openssl (a
CA, a server certificate for 127.0.0.1/localhost, a client certificate it
signs, and a client certificate from another CA): gRPC with Triton's flags
(--grpc-use-ssl, --grpc-use-ssl-mutual, --grpc-server-cert/key,
--grpc-root-cert) through grpcio, HTTPS with the same flags under --http-*
through requests and curl; plaintext clients, clients without a
certificate and clients with a foreign one are refused."""
import os
import shutil
import socket
import ssl
import subprocess

import grpc
import numpy as np
import pytest
import requests

from conftest import EXAMPLES, NEREID
from grpc_util import identity_repo, infer_request, stubs

pb, pbg, hpb, hpbg = stubs()

INFER = {"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [3], "data": [1, 2, 3]}]}


def openssl(*args, cwd):
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True)


def make_ca(d, name):
    openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2",
            "-subj", f"/CN={name}", "-keyout", f"{name}.key", "-out", f"{name}.crt", cwd=d)


def make_cert(d, name, ca, server):
    openssl("req", "-newkey", "rsa:2048", "-nodes", "-subj", f"/CN={name}",
            "-keyout", f"{name}.key", "-out", f"{name}.csr", cwd=d)
    ext = os.path.join(d, f"{name}.ext")
    with open(ext, "w") as f:
        f.write("subjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage=serverAuth\n"
                if server else "extendedKeyUsage=clientAuth\n")
    openssl("x509", "-req", "-in", f"{name}.csr", "-CA", f"{ca}.crt", "-CAkey", f"{ca}.key",
            "-CAcreateserial", "-days", "2", "-extfile", ext, "-out", f"{name}.crt", cwd=d)


@pytest.fixture(scope="module")
def certs(tmp_path_factory):
    d = str(tmp_path_factory.mktemp("certs"))
    make_ca(d, "ca")
    make_ca(d, "rogue_ca")
    make_cert(d, "server", "ca", server=True)
    make_cert(d, "client", "ca", server=False)
    make_cert(d, "rogue", "rogue_ca", server=False)
    return lambda name: os.path.join(d, name)


def read(path):
    with open(path, "rb") as f:
        return f.read()


def tls_flags(proto, certs, mutual=False):
    flags = [f"--{proto}-server-cert={certs('server.crt')}",
             f"--{proto}-server-key={certs('server.key')}"]
    if mutual:
        return flags + [f"--{proto}-use-ssl-mutual=true", f"--{proto}-root-cert={certs('ca.crt')}"]
    return flags + [f"--{proto}-use-ssl=true"]


def grpc_creds(certs, client=None):
    if client is None:
        return grpc.ssl_channel_credentials(root_certificates=read(certs("ca.crt")))
    return grpc.ssl_channel_credentials(root_certificates=read(certs("ca.crt")),
                                        private_key=read(certs(f"{client}.key")),
                                        certificate_chain=read(certs(f"{client}.crt")))


def grpc_live(addr, creds=None):
    ch = grpc.secure_channel(addr, creds) if creds else grpc.insecure_channel(addr)
    with ch:
        return pbg.GRPCInferenceServiceStub(ch).ServerLive(pb.ServerLiveRequest(), timeout=10).live


def grpc_refused(addr, creds=None):
    with pytest.raises(grpc.RpcError) as e:
        grpc_live(addr, creds)
    assert e.value.code() == grpc.StatusCode.UNAVAILABLE


def test_grpc_tls(nereid_server, tmp_path, certs):
    s = nereid_server(identity_repo(str(tmp_path / "models")), *tls_flags("grpc", certs),
                      wait_port="grpc")
    creds = grpc_creds(certs)
    assert grpc_live(s.grpc_addr, creds) is True
    with grpc.secure_channel(s.grpc_addr, creds) as ch:
        stub = pbg.GRPCInferenceServiceStub(ch)
        req = infer_request(pb, "id_fp32", [("INPUT0", "FP32", [3], np.ones(3, np.float32))])
        r = stub.ModelInfer(req, timeout=10)
        assert np.frombuffer(r.raw_output_contents[0], np.float32).tolist() == [1, 1, 1]
    grpc_refused(s.grpc_addr)  # plaintext
    # a client that does not trust the server's CA
    grpc_refused(s.grpc_addr, grpc.ssl_channel_credentials(
        root_certificates=read(certs("rogue_ca.crt"))))
    # HTTP stays plaintext
    assert requests.get(s.http_url + "/v2/health/live").status_code == 200


def test_grpc_mutual_tls(nereid_server, tmp_path, certs):
    s = nereid_server(identity_repo(str(tmp_path / "models")),
                      *tls_flags("grpc", certs, mutual=True), wait_port="grpc")
    assert grpc_live(s.grpc_addr, grpc_creds(certs, "client")) is True
    grpc_refused(s.grpc_addr, grpc_creds(certs))            # no client certificate
    grpc_refused(s.grpc_addr, grpc_creds(certs, "rogue"))   # signed by another CA
    grpc_refused(s.grpc_addr)                                # plaintext


def https(s):
    return s.http_url.replace("http://", "https://")


def plaintext_refused(s):
    with pytest.raises(requests.exceptions.ConnectionError):
        requests.get(s.http_url + "/v2/health/live", timeout=10)


def test_https(nereid_server, tmp_path, certs):
    s = nereid_server(identity_repo(str(tmp_path / "models")), *tls_flags("http", certs))
    ca = certs("ca.crt")
    assert requests.get(https(s) + "/v2/health/live", verify=ca, timeout=10).status_code == 200
    r = requests.post(https(s) + "/v2/models/id_fp32/infer", json=INFER, verify=ca, timeout=10)
    assert r.status_code == 200 and r.json()["outputs"][0]["data"] == [1, 2, 3]
    plaintext_refused(s)
    with pytest.raises(requests.exceptions.SSLError):  # the server's CA is not trusted
        requests.get(https(s) + "/v2/health/live", verify=certs("rogue_ca.crt"), timeout=10)
    # gRPC stays plaintext
    assert grpc_live(s.grpc_addr) is True
    if shutil.which("curl"):
        out = subprocess.run(["curl", "-sS", "--cacert", ca, https(s) + "/v2/models/id_fp32"],
                             capture_output=True, text=True, timeout=30)
        assert out.returncode == 0 and '"name":"id_fp32"' in out.stdout


def test_https_mutual(nereid_server, tmp_path, certs):
    s = nereid_server(identity_repo(str(tmp_path / "models")),
                      *tls_flags("http", certs, mutual=True))
    ca = certs("ca.crt")
    client = (certs("client.crt"), certs("client.key"))
    r = requests.post(https(s) + "/v2/models/id_fp32/infer", json=INFER, verify=ca,
                      cert=client, timeout=10)
    assert r.status_code == 200 and r.json()["outputs"][0]["data"] == [1, 2, 3]
    for cert in (None, (certs("rogue.crt"), certs("rogue.key"))):
        with pytest.raises((requests.exceptions.SSLError, requests.exceptions.ConnectionError)):
            requests.get(https(s) + "/v2/health/live", verify=ca, cert=cert, timeout=10)
    plaintext_refused(s)
    # the handshake itself fails without a client certificate
    ctx = ssl.create_default_context(cafile=ca)
    with socket.create_connection(("127.0.0.1", s.http_port), timeout=10) as raw:
        with pytest.raises((ssl.SSLError, ConnectionError)):
            with ctx.wrap_socket(raw, server_hostname="127.0.0.1") as tls:
                tls.sendall(b"GET /v2/health/live HTTP/1.1\r\nHost: x\r\n\r\n")
                if not tls.recv(100):  # TLS 1.3: the alert comes after the handshake
                    raise ConnectionError("closed")


@pytest.mark.parametrize("proto", ["http", "grpc"])
def test_tls_flag_errors(proto, tmp_path, certs):
    def run(*flags):
        return subprocess.run([NEREID, f"--model-repository={EXAMPLES}", "--http-port=0",
                               "--grpc-port=0", "--allow-metrics=false", *flags],
                              capture_output=True, text=True, timeout=60)
    r = run(f"--{proto}-use-ssl=true")
    assert r.returncode == 1
    assert f"--{proto}-use-ssl needs --{proto}-server-cert and --{proto}-server-key" in r.stderr
    r = run(f"--{proto}-use-ssl-mutual=true", f"--{proto}-server-cert={certs('server.crt')}",
            f"--{proto}-server-key={certs('server.key')}")
    assert r.returncode == 1
    assert f"--{proto}-use-ssl-mutual needs --{proto}-root-cert" in r.stderr
    missing = str(tmp_path / "missing.pem")
    r = run(f"--{proto}-use-ssl=true", f"--{proto}-server-cert={missing}",
            f"--{proto}-server-key={certs('server.key')}")
    assert r.returncode == 1
    assert f"--{proto}-server-cert: unable to read '{missing}'" in r.stderr
