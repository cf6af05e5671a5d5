"""Bodies over --http-max-input-size: the client gets Triton's status and
text even while it is still sending (a Content-Length body refused from its
headers, a chunked body refused when it grows past the limit), the server
then discards what the client still sends for a bounded time and byte count
(lingering close) instead of resetting the connection, a stalled client is
closed, and other clients are served meanwhile."""
import http.client
import json
import socket
import threading
import time

import numpy as np
import pytest

from http_helpers import infer, make_repo  # noqa: F401
from test_tls import certs  # noqa: F401 (fixture)

LIMIT = 4096
BIG = 32 << 20  # far beyond the socket buffers: a reset would break the upload
URL = "/v2/models/id_fp32/infer"
JSON_TEXT = ("request JSON size of {n} bytes exceeds the maximum allowed input size of 4096 "
             "bytes. Use --http-max-input-size to increase the limit.")
RAW_TEXT = ("Raw input has a byte_size ({n} bytes) that exceeds the maximum allowed value of "
            "4096 bytes. Use --http-max-input-size to increase the limit.")
CHUNKED_TEXT = ("request size exceeds the maximum allowed input size of 4096 bytes. Use "
                "--http-max-input-size to increase the limit.")
SMALL = json.dumps({"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1, 2],
                                "data": [1.0, 2.0]}]}).encode()


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    from conftest import Server
    s = Server(make_repo(tmp_path_factory.mktemp("limit")), [f"--http-max-input-size={LIMIT}"])
    yield s
    assert s.stop() == 0, s.output()


def served(s):
    r = infer(s, "id_fp32", SMALL)
    return r.status_code == 200 and r.json()["outputs"][0]["data"] == [1.0, 2.0]


def post(s, body, headers=None):
    """POSTs with http.client, which sends the whole body before it reads the
    reply and, unlike requests, does not read a reply after a broken pipe
    (as tritonclient's HTTP client). Returns (status, JSON body)."""
    conn = http.client.HTTPConnection("127.0.0.1", s.http_port, timeout=60)
    try:
        conn.request("POST", URL, body=body, headers=headers or {})
        r = conn.getresponse()
        return r.status, json.loads(r.read())
    finally:
        conn.close()


def head(s, extra=b"", length=None):
    h = b"POST " + URL.encode() + b" HTTP/1.1\r\nHost: x\r\n" + extra
    if length is not None:
        h += b"Content-Length: %d\r\n" % length
    return h + b"\r\n"


def read_reply(sock):
    """Reads until the server's end of stream; returns (status, JSON body)."""
    data = b""
    while True:
        d = sock.recv(65536)
        if not d:
            break
        data += d
    top, _, body = data.partition(b"\r\n\r\n")
    return int(top.split(b" ")[1]), json.loads(body)


@pytest.mark.parametrize("kind", ["json", "raw"])
def test_content_length_over_limit_while_client_writes(server, kind):
    """A client that sends its whole body before it reads (as the Python
    clients do) reads the refusal: no broken pipe, no reset."""
    headers = {"Inference-Header-Content-Length": "0"} if kind == "raw" else {}
    status, body = post(server, b" " * BIG, headers)
    assert status == 400
    text = RAW_TEXT if kind == "raw" else JSON_TEXT
    assert body["error"] == text.format(n=BIG)
    assert served(server)


def test_chunked_over_limit_while_client_writes(server):
    def gen():
        for _ in range(BIG // 65536):
            yield b" " * 65536
    status, body = post(server, gen())  # an iterable: http.client sends it chunked
    assert status == 400
    assert body["error"] == CHUNKED_TEXT
    assert served(server)


def test_chunked_over_limit_answered_before_body_ends(server):
    """The refusal comes when the body grows past the limit, not at its end:
    the client here never ends its body and reads the reply."""
    with socket.create_connection(("127.0.0.1", server.http_port), timeout=30) as sock:
        sock.sendall(head(server, b"Transfer-Encoding: chunked\r\n"))
        piece = b" " * 1024
        for _ in range(2 * LIMIT // len(piece)):
            sock.sendall(b"%x\r\n" % len(piece) + piece + b"\r\n")
        status, body = read_reply(sock)  # socket timeout: a missing reply fails here
    assert status == 400
    assert body["error"] == CHUNKED_TEXT
    assert served(server)


def test_too_many_chunks_answered_before_body_ends(tmp_path):
    from conftest import Server
    s = Server(make_repo(tmp_path), [])
    try:
        with socket.create_connection(("127.0.0.1", s.http_port), timeout=30) as sock:
            sock.sendall(head(s, b"Transfer-Encoding: chunked\r\n"))
            sock.sendall(b"1\r\n \r\n" * 65537)
            status, body = read_reply(sock)
        assert status == 400
        assert body["error"] == ("Chunked request body exceeds maximum of 65536 non-empty "
                                 "chunks. Send fewer or larger HTTP chunks.")
        assert served(s)
    finally:
        assert s.stop() == 0, s.output()


def closed_by_server(sock, deadline_s=60):
    """Sends a byte after longer and longer pauses (each byte would restart
    an idle timer) until the server's close shows: a byte sent to a closed
    socket is answered with a reset, and the next send fails."""
    end = time.time() + deadline_s
    pause = 0.25
    while time.time() < end:
        try:
            sock.send(b" ")
            time.sleep(0.1)
            sock.send(b" ")
        except OSError:
            return True
        time.sleep(pause)
        pause *= 2
    return False


def test_stalled_client_closed_after_linger(server):
    """A huge declared body, a little of it sent, then nothing: the reply is
    readable at once, and the lingering socket is closed after its idle
    bound (the client's later bytes then meet a reset)."""
    sock = socket.create_connection(("127.0.0.1", server.http_port), timeout=30)
    sock.sendall(head(server, length=1 << 40) + b" " * 100000)
    status, body = read_reply(sock)
    assert status == 400 and body["error"] == JSON_TEXT.format(n=1 << 40)
    assert served(server)  # meanwhile
    assert closed_by_server(sock)
    sock.close()
    assert served(server)


def test_many_refused_uploads_and_others_served(server):
    """More stalled refused uploads than the lingering table holds (64), and
    writers refused while they send: everyone else is served meanwhile, and
    every refused client reads its reply."""
    stalled = []
    for _ in range(80):
        sock = socket.create_connection(("127.0.0.1", server.http_port), timeout=30)
        sock.sendall(head(server, length=1 << 30) + b" " * 1000)
        stalled.append(sock)
    for sock in stalled:
        status, _ = read_reply(sock)
        assert status == 400
    assert served(server)
    # their close ends their lingering (one over the table's size was
    # closed at once, as a table full of stalled clients makes it)
    for sock in stalled:
        sock.close()
    results = []

    def writer():
        try:
            results.append(post(server, b" " * (8 << 20))[0])
        except OSError as e:
            results.append(repr(e))

    threads = [threading.Thread(target=writer) for _ in range(6)]
    for t in threads:
        t.start()
    ok = [served(server) for _ in range(20)]
    for t in threads:
        t.join(timeout=120)
        assert not t.is_alive()
    assert ok == [True] * 20
    assert results == [400] * 6
    assert served(server)


def test_at_limit_still_served(server):
    """The lingering close changes nothing for bodies within the limit."""
    x = np.arange(64, dtype=np.float32)
    doc = json.dumps({"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1, 64],
                                  "data": x.tolist()}]}).encode()
    doc += b" " * (LIMIT - len(doc))
    assert len(doc) == LIMIT
    r = infer(server, "id_fp32", doc)
    assert r.status_code == 200 and r.json()["outputs"][0]["data"] == x.tolist()


def test_over_limit_over_tls(tmp_path, certs):  # noqa: F811
    """Over TLS: a declared body over the limit is refused at once and the
    rest discarded (lingering close under the TLS close); a chunked one is
    read to its end (dropped) and then refused (no byte can bypass MHD's
    TLS session)."""
    import ssl

    from conftest import Server
    from test_tls import tls_flags
    s = Server(make_repo(tmp_path), [f"--http-max-input-size={LIMIT}"] + tls_flags("http", certs))
    try:
        ctx = ssl.create_default_context(cafile=certs("ca.crt"))

        def post_tls(body):
            conn = http.client.HTTPSConnection("127.0.0.1", s.http_port, timeout=60, context=ctx)
            try:
                conn.request("POST", URL, body=body)
                r = conn.getresponse()
                return r.status, json.loads(r.read())
            finally:
                conn.close()

        status, body = post_tls(b" " * BIG)
        assert status == 400 and body["error"] == JSON_TEXT.format(n=BIG)
        status, body = post_tls(b" " * 65536 for _ in range(BIG // 65536))
        assert status == 400 and body["error"] == CHUNKED_TEXT
        status, body = post_tls(SMALL)
        assert status == 200
    finally:
        assert s.stop() == 0, s.output()


def binary_header(n_values):
    return json.dumps({"inputs": [{"name": "INPUT0", "datatype": "FP32",
                                   "shape": [1, n_values],
                                   "parameters": {"binary_data_size": 4 * n_values}}]}).encode()


def test_binary_data_over_limit_served(server):
    """As in Triton, the limit bounds the JSON header, not the binary tensor
    data after it (L0_large_payload's 1.9 GB tensor with the default 64 MiB
    limit): 1 MiB of data through a 4 KiB limit."""
    header, raw = binary_header(1 << 18), np.arange(1 << 18, dtype=np.float32).tobytes()
    status, body = post(server, header + raw,
                        {"Inference-Header-Content-Length": str(len(header))})
    assert status == 200, body
    assert body["outputs"][0]["shape"] == [1, 1 << 18]


def test_binary_body_over_cap_refused_at_once(server):
    """Binary bodies are bounded by the larger of the limit and INT32_MAX
    (Triton's largest gRPC message): a declared 3 GiB body (L0_large_payload's
    3 GB case) is refused from its headers, and the client reads why."""
    header = binary_header(3 << 28)
    total = len(header) + (3 << 30)
    with socket.create_connection(("127.0.0.1", server.http_port), timeout=30) as sock:
        sock.sendall(head(server, b"Inference-Header-Content-Length: %d\r\n" % len(header),
                          total) + header + b"\0" * 100000)
        status, body = read_reply(sock)
    assert status == 400
    assert body["error"] == (f"request size of {total} bytes exceeds the maximum allowed size "
                             "of 2147483647 bytes for a request with binary data. Use "
                             "--http-max-input-size to increase the limit.")
    assert served(server)
