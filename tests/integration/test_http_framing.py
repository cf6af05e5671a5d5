"""HTTP framing (RFC 9112) and NUL bytes, over raw sockets: two different
Content-Lengths and a Transfer-Encoding other than "chunked" are refused with
a JSON error and the connection closed (no hang); a NUL byte in the URL or in
any JSON name, key or string outside tensor data is a 400 (one rule), while
BYTES tensor data keeps its NULs."""
import json
import socket
import struct

import pytest
import requests

from conftest import EXAMPLES

BODY = json.dumps({"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1, 3],
                               "data": [1, 2, 3]}]}).encode()
INFER = b"POST /v2/models/identity_fp32/infer HTTP/1.1\r\nHost: x\r\n"


@pytest.fixture(scope="module")
def srv(tmp_path_factory):
    from conftest import Server
    from http_helpers import identity_config, write_model
    repo = str(tmp_path_factory.mktemp("framing"))
    write_model(repo, "id_bytes", identity_config("id_bytes", "TYPE_STRING"))
    s = Server([EXAMPLES, repo], [])
    yield s
    assert s.stop() == 0


def exchange(srv, data):
    """Sends data and reads until the server closes (30 s at most)."""
    s = socket.create_connection(("127.0.0.1", srv.http_port), timeout=30)
    s.sendall(data)
    reply = b""
    try:
        while True:
            chunk = s.recv(65536)
            if not chunk:
                break
            reply += chunk
    except socket.timeout:
        pytest.fail(f"connection still open after the reply: {reply[:300]!r}")
    finally:
        s.close()
    return reply


def status_and_json(reply):
    head, _, body = reply.partition(b"\r\n\r\n")
    status = int(head.split(b" ")[1])
    return status, json.loads(body)


def test_two_different_content_lengths_refused(srv):
    reply = exchange(srv, INFER + b"Content-Length: %d\r\nContent-Length: 5\r\n\r\n" % len(BODY)
                     + BODY)
    status, doc = status_and_json(reply)
    assert status == 400 and "Content-Length" in doc["error"]


def test_same_content_length_twice_accepted(srv):
    reply = exchange(srv, INFER + b"Content-Length: %d\r\nContent-Length: %d\r\n"
                     b"Connection: close\r\n\r\n" % (len(BODY), len(BODY)) + BODY)
    status, doc = status_and_json(reply)
    assert status == 200 and doc["outputs"][0]["data"] == [1, 2, 3]


@pytest.mark.parametrize("te", [b"gzip, chunked", b"identity", b"xchunked", b"chunked, gzip"])
def test_transfer_encoding_other_than_chunked_refused(srv, te):
    reply = exchange(srv, INFER + b"Transfer-Encoding: " + te + b"\r\n\r\n"
                     + b"%x\r\n" % len(BODY) + BODY + b"\r\n0\r\n\r\n")
    status, doc = status_and_json(reply)
    assert status == 501 and "Transfer-Encoding" in doc["error"], doc
    assert b"\r\nConnection: close\r\n" in reply


def test_transfer_encoding_with_content_length_chunked_wins(srv):
    # RFC 9112 6.3 and Triton: the chunked framing is used, Content-Length ignored.
    reply = exchange(srv, INFER + b"Transfer-Encoding: chunked\r\nContent-Length: 5\r\n"
                     b"Connection: close\r\n\r\n" + b"%x\r\n" % len(BODY) + BODY + b"\r\n0\r\n\r\n")
    status, doc = status_and_json(reply)
    assert status == 200 and doc["outputs"][0]["data"] == [1, 2, 3]


def test_chunked_still_served(srv):
    reply = exchange(srv, INFER + b"Transfer-Encoding: chunked\r\nConnection: close\r\n\r\n"
                     + b"%x\r\n" % len(BODY) + BODY + b"\r\n0\r\n\r\n")
    status, doc = status_and_json(reply)
    assert status == 200 and doc["outputs"][0]["data"] == [1, 2, 3]


@pytest.mark.parametrize("path", ["/v2/models/identity_fp32%00/ready",
                                  "/v2/models/identity_fp32%00junk",
                                  "/v2/models/identity_fp32/versions/1%00"])
def test_nul_in_url_refused(srv, path):
    r = requests.get(srv.http_url + path, timeout=30)
    assert r.status_code == 400 and "NUL" in r.json()["error"], r.text


def infer(srv, doc):
    return requests.post(f"{srv.http_url}/v2/models/identity_fp32/infer", data=json.dumps(doc),
                         timeout=30)


def test_nul_in_json_names_and_keys_refused(srv):
    good = {"name": "INPUT0", "datatype": "FP32", "shape": [1, 3], "data": [1, 2, 3]}
    cases = [
        {"inputs": [dict(good, name="INPUT0\u0000junk")]},
        {"inputs": [good], "outputs": [{"name": "OUTPUT0\u0000junk"}]},
        {"inputs": [good], "parameters": {"key\u0000junk": 1}},
        {"inputs": [dict(good, parameters={"binary_data_size\u0000": 1})]},
        {"inputs": [dict(good, datatype="FP32\u0000")]},
    ]
    for doc in cases:
        r = infer(srv, doc)
        assert r.status_code == 400 and "NUL" in r.json()["error"], (doc, r.text)
    r = requests.post(f"{srv.http_url}/v2/repository/models/identity_fp32/load", timeout=30,
                      data=json.dumps({"parameters": {"file:1/x\u0000y": "AAAA"}}))
    assert r.status_code == 400, r.text


def test_nul_in_bytes_data_kept(srv):
    # Tensor data is not a name: BYTES elements stay binary-safe.
    r = requests.post(f"{srv.http_url}/v2/models/id_bytes/infer", timeout=30, data=json.dumps(
        {"inputs": [{"name": "INPUT0", "datatype": "BYTES", "shape": [1, 2],
                     "data": ["a\u0000b", "\u0000"]}]}))
    assert r.status_code == 200, r.text
    assert r.json()["outputs"][0]["data"] == ["a\u0000b", "\u0000"]


def send_chunks(srv, n):
    s = socket.create_connection(("127.0.0.1", srv.http_port), timeout=60)
    s.sendall(b"POST /v2/models/identity_fp32/infer HTTP/1.1\r\nHost: x\r\n"
              b"Inference-Header-Content-Length: 0\r\nTransfer-Encoding: chunked\r\n"
              b"Connection: close\r\n\r\n" + b"1\r\nA\r\n" * n + b"0\r\n\r\n")
    reply = b""
    while True:
        chunk = s.recv(65536)
        if not chunk:
            break
        reply += chunk
    s.close()
    return reply


def test_chunk_cap(srv):
    # Triton's cap: 65536 non-empty chunks pass (a raw body of 16384 FP32
    # values, answered), one more is refused.
    reply = send_chunks(srv, 65536)
    assert reply.startswith(b"HTTP/1.1 200"), reply[:300]
    reply = send_chunks(srv, 65537)
    status, doc = status_and_json(reply)
    assert status == 400 and doc["error"] == (
        "Chunked request body exceeds maximum of 65536 non-empty chunks. Send fewer or larger "
        "HTTP chunks.")
    assert b"\r\nConnection: close\r\n" in reply


def test_chunked_with_content_length_and_binary_header(srv):
    # Triton's L0_http test_content_encoding_chunked_manually: requests sends
    # Content-Length (of the encoded body) beside Transfer-Encoding: chunked.
    x = struct.pack("<8f", *range(8))
    body = b"%X\r\n" % len(x) + x + b"\r\n0\r\n\r\n"
    r = requests.post(f"{srv.http_url}/v2/models/identity_fp32/infer", data=body, timeout=30,
                      headers={"Transfer-Encoding": "chunked",
                               "Inference-Header-Content-Length": "0"})
    assert r.status_code == 200, r.text
    n = int(r.headers["Inference-Header-Content-Length"])
    assert r.content[n:] == x
