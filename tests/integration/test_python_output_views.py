"""Large outputs of Python models handed to the reply without a copy
(backend.h ABI 1.9, nereid_batch_request_output_view), through the real
binary: an output that is a view of an input, and a computed one the worker
writes after the inputs in the server's EXECUTE region, reach HTTP (binary
and JSON) and gRPC (unary and stream) clients intact; replies in flight at
the same time never share a region; outputs to client shared memory and
ensemble steps get copies; many requests leave the server's fds and RSS
where they were; a worker killed while a reply still reads its region
leaves that reply intact and the server serving."""
import os
import re
import signal
import socket
import threading
import time
from multiprocessing import shared_memory

import grpc
import numpy as np
import pytest
import requests

from conftest import BUILD, Server
from grpc_util import stubs
from http_helpers import build_infer, infer, output_array, split_response

pb, pbg, _, _ = stubs()

IDENT = """
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def execute(self, requests):
        return [pb_utils.InferenceResponse([pb_utils.Tensor(
            "OUTPUT0", pb_utils.get_input_tensor_by_name(r, "INPUT0").as_numpy())])
            for r in requests]
"""

DOUBLE = """
import numpy as np
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def execute(self, requests):
        out = []
        for r in requests:
            x = pb_utils.get_input_tensor_by_name(r, "INPUT0").as_numpy()
            out.append(pb_utils.InferenceResponse([
                pb_utils.Tensor("OUTPUT0", x * 2),
                pb_utils.Tensor("OUTPUT1", (x[:4] + 1).astype(np.float32))]))
        return out
"""

KEEP = """
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def execute(self, requests):
        out = []
        for r in requests:
            x = pb_utils.get_input_tensor_by_name(r, "INPUT0").as_numpy()
            if x.size > 1000:  # a view of the request's region, kept
                self.kept = x
            out.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", self.kept)]))
        return out
"""


def config(name, backend, outputs=("OUTPUT0",)):
    outs = ", ".join(f'{{ name: "{o}" data_type: TYPE_FP32 dims: [ -1 ] }}' for o in outputs)
    return (f'name: "{name}"\nbackend: "{backend}"\nmax_batch_size: 0\n'
            'input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ -1 ] } ]\n'
            f'output [ {outs} ]\ninstance_group [ {{ count: 1 kind: KIND_CPU }} ]\n')


ENSEMBLE = """
name: "ens"
platform: "ensemble"
max_batch_size: 0
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ -1 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ -1 ] } ]
ensemble_scheduling { step [
  { model_name: "double" model_version: -1
    input_map { key: "INPUT0" value: "INPUT0" } output_map { key: "OUTPUT0" value: "mid" } },
  { model_name: "ident_c" model_version: -1
    input_map { key: "INPUT0" value: "mid" } output_map { key: "OUTPUT0" value: "OUTPUT0" } }
] }
"""


def write(repo, name, cfg, model_py=None):
    os.makedirs(os.path.join(repo, name, "1"), exist_ok=True)
    with open(os.path.join(repo, name, "config.pbtxt"), "w") as f:
        f.write(cfg)
    if model_py is not None:
        with open(os.path.join(repo, name, "1", "model.py"), "w") as f:
            f.write(model_py)


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    repo = str(tmp_path_factory.mktemp("views") / "models")
    write(repo, "ident", config("ident", "python"), IDENT)
    write(repo, "double", config("double", "python", ("OUTPUT0", "OUTPUT1")), DOUBLE)
    write(repo, "ident_c", config("ident_c", "identity"))
    write(repo, "ens", ENSEMBLE)
    write(repo, "keep", config("keep", "python"), KEEP)
    s = Server(repo, ["--allow-client-shm=true"], "http")
    yield s
    rc = s.stop()
    assert rc == 0, s.output()


def expected(model, x):
    if model == "ident":
        return {"OUTPUT0": x}
    if model == "double":
        return {"OUTPUT0": x * 2, "OUTPUT1": x[:4] + 1}
    return {"OUTPUT0": x * 2}  # ens


def http_infer(server, model, x, binary=True):
    body, headers = build_infer([{"name": "INPUT0", "datatype": "FP32", "data": x,
                                  "binary": True}],
                                [{"name": o, "parameters": {"binary_data": binary}}
                                 for o in expected(model, x)])
    r = infer(server, model, body, headers)
    assert r.status_code == 200, r.text
    doc, raw = split_response(r)
    return {o: output_array(doc, raw, o) for o in expected(model, x)}


def grpc_request(model, x):
    req = pb.ModelInferRequest(model_name=model)
    t = req.inputs.add()
    t.name, t.datatype = "INPUT0", "FP32"
    t.shape.extend([len(x)])
    req.raw_input_contents.append(x.tobytes())
    return req


def grpc_outputs(resp):
    return {o.name: np.frombuffer(resp.raw_output_contents[i], np.float32)
            for i, o in enumerate(resp.outputs)}


BIG = [("grpc.max_receive_message_length", 64 << 20), ("grpc.max_send_message_length", 64 << 20)]


def grpc_infer(server, model, x):
    with grpc.insecure_channel(server.grpc_addr, options=BIG) as ch:
        resp = pbg.GRPCInferenceServiceStub(ch).ModelInfer(grpc_request(model, x), timeout=60)
    return grpc_outputs(resp)


def check(model, x, outs):
    want = expected(model, x)
    assert set(outs) == set(want)
    for name, arr in want.items():
        np.testing.assert_array_equal(np.asarray(outs[name]).reshape(-1), arr)


@pytest.mark.parametrize("n", [1, 10000, 65536, 300000])
@pytest.mark.parametrize("model", ["ident", "double"])
def test_values_over_http_and_grpc(server, model, n):
    rng = np.random.default_rng(n)
    for _ in range(2):  # the second request reuses (or switches) the EXECUTE region
        x = rng.standard_normal(n).astype(np.float32)
        check(model, x, http_infer(server, model, x))
        check(model, x, grpc_infer(server, model, x))
    if n <= 65536:
        check(model, x, http_infer(server, model, x, binary=False))


def test_grpc_stream(server):
    xs = [np.full(70000, i, np.float32) for i in range(6)]
    with grpc.insecure_channel(server.grpc_addr) as ch:
        stream = pbg.GRPCInferenceServiceStub(ch).ModelStreamInfer(
            iter([grpc_request("double", x) for x in xs]), timeout=60)
        got = [r for r in stream]
    assert len(got) == len(xs)
    for x, r in zip(xs, got):
        assert r.error_message == ""
        check("double", x, grpc_outputs(r.infer_response))


def test_replies_in_flight_never_share_a_region(server):
    """Several clients at once: a reply still being sent holds its region, so
    the next EXECUTE goes into another one; every answer is its own."""
    errors = []

    def client(k):
        try:
            for i in range(15):
                x = np.full(65536 + k, k * 1000 + i, np.float32)
                model = "ident" if i % 2 else "double"
                outs = http_infer(server, model, x) if k % 2 else grpc_infer(server, model, x)
                check(model, x, outs)
        except Exception as e:  # noqa: B902 - reported below
            errors.append(repr(e))

    th = [threading.Thread(target=client, args=(k,)) for k in range(6)]
    for t in th:
        t.start()
    for t in th:
        t.join()
    assert not errors, errors[:3]


def test_shared_memory_output_is_a_copy(server):
    n = 65536
    name = f"nereid_views_{os.getpid()}"
    seg = shared_memory.SharedMemory(name=name, create=True, size=4 * n)
    try:
        r = requests.post(server.http_url + "/v2/systemsharedmemory/region/out/register",
                          json={"key": "/" + name, "byte_size": 4 * n}, timeout=30)
        assert r.status_code == 200, r.text
        for k in range(2):
            x = np.arange(n, dtype=np.float32) + k
            body = {"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [n],
                                "data": x.tolist()}],
                    "outputs": [{"name": "OUTPUT0", "parameters": {
                        "shared_memory_region": "out", "shared_memory_byte_size": 4 * n}}]}
            r = requests.post(server.http_url + "/v2/models/ident/infer", json=body, timeout=30)
            assert r.status_code == 200, r.text
            np.testing.assert_array_equal(np.frombuffer(seg.buf, np.float32, n), x)
        requests.post(server.http_url + "/v2/systemsharedmemory/region/out/unregister",
                      timeout=30)
    finally:
        seg.close()
        seg.unlink()


def test_ensemble_step_gets_a_copy(server):
    x = np.linspace(0, 1, 100000, dtype=np.float32)
    check("ens", x, http_infer(server, "ens", x))
    check("ens", x, grpc_infer(server, "ens", x))


def fd_count(pid):
    return len(os.listdir(f"/proc/{pid}/fd"))


def rss_kib(pid):
    with open(f"/proc/{pid}/status") as f:
        return next(int(l.split()[1]) for l in f if l.startswith("VmRSS:"))


def test_no_fd_or_rss_growth(server):
    pid = server.proc.pid

    def burst(n_requests):
        def client(k):
            for i in range(n_requests):
                x = np.full(65536, i, np.float32)
                model = "ident" if (i + k) % 2 else "double"
                check(model, x, http_infer(server, model, x) if k % 2 else
                      grpc_infer(server, model, x))
        th = [threading.Thread(target=client, args=(k,)) for k in range(4)]
        for t in th:
            t.start()
        for t in th:
            t.join()

    def settled_fds():
        """The fd count once the clients' closed connections are gone from
        the server (it closes them on its own threads)."""
        seen, deadline = [], time.time() + 10
        while time.time() < deadline:
            seen.append(fd_count(pid))
            if len(seen) >= 5 and len(set(seen[-5:])) == 1:
                break
            time.sleep(0.05)
        return seen[-1]

    burst(30)  # warm-up: regions, spares, caches and arenas reach their size
    fds, rss = settled_fds(), rss_kib(pid)
    burst(60)
    # At most the spare EXECUTE regions (2 per Python instance) that the
    # warm-up did not need yet; a leak would grow with the 240 requests.
    assert settled_fds() <= fds + 4, fds
    if not os.environ.get("NEREID_SANITIZE"):  # ASan's quarantine keeps freed memory
        assert rss_kib(pid) - rss < 16 * 1024, (rss, rss_kib(pid))


def stats_success(server, model):
    st = requests.get(f"{server.http_url}/v2/models/{model}/stats", timeout=30).json()
    return st["model_stats"][0]["inference_stats"]["success"]["count"]


def worker_pid(server, instance_word):
    stub = os.path.join(BUILD, "backends", "python", "nereid_python_stub.py").encode()
    for p in os.listdir("/proc"):
        if not p.isdigit():
            continue
        try:
            with open(f"/proc/{p}/cmdline", "rb") as f:
                cmd = f.read()
        except OSError:
            continue
        if stub in cmd and b"zygote" not in cmd and instance_word in cmd:
            return int(p)
    return None


def start_unread_reply(server, model, x, chunked=False):
    """Sends x to model over a raw connection and returns the socket once
    the server has finished the request (its statistics say so): the reply
    (binary, len(x) floats) is then being sent, and blocks until read.
    chunked: the body goes as one HTTP chunk (its size unknown up front, it
    is not received into a request body region: the inputs travel in the
    EXECUTE region)."""
    before = stats_success(server, model)
    body, headers = build_infer([{"name": "INPUT0", "datatype": "FP32", "data": x,
                                  "binary": True}],
                                [{"name": "OUTPUT0", "parameters": {"binary_data": True}}])
    framing = "Transfer-Encoding: chunked" if chunked else f"Content-Length: {len(body)}"
    if chunked:
        body = f"{len(body):x}\r\n".encode() + body + b"\r\n0\r\n\r\n"
    head = (f"POST /v2/models/{model}/infer HTTP/1.1\r\nHost: x\r\n{framing}\r\n"
            + "".join(f"{k}: {v}\r\n" for k, v in headers.items()) + "\r\n").encode()
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 64 * 1024)
    sock.settimeout(60)
    sock.connect(("127.0.0.1", server.http_port))
    sock.sendall(head + body)
    deadline = time.time() + 60
    while stats_success(server, model) == before:
        assert time.time() < deadline, "the request did not finish"
        time.sleep(0.01)
    return sock


def read_reply(sock):
    """The output of the reply on sock (closes it)."""
    data, hdrs, hdr_end = b"", {}, -1
    with sock:
        while True:
            chunk = sock.recv(1 << 20)
            if not chunk:
                break
            data += chunk
            if hdr_end < 0 and b"\r\n\r\n" in data:
                hdr_end = data.index(b"\r\n\r\n")
                lines = data[:hdr_end].decode().split("\r\n")[1:]
                hdrs = {k.strip().lower(): v.strip() for k, v in
                        (line.split(":", 1) for line in lines)}
            if hdr_end >= 0 and len(data) >= hdr_end + 4 + int(hdrs["content-length"]):
                break
    assert data.startswith(b"HTTP/1.1 200"), data[:2000]
    ihcl = int(hdrs["inference-header-content-length"])
    return np.frombuffer(data[hdr_end + 4 + ihcl:], np.float32)


def test_worker_killed_while_a_reply_reads_its_region(server):
    """A 16 MiB reply the client does not read yet: the server finished the
    request and is blocked sending it, its output a view of the request's
    region. Killing the worker must leave the reply whole."""
    x = np.arange(4 << 20, dtype=np.float32)
    http_infer(server, "ident", x[:10])  # the worker runs
    wpid = worker_pid(server, b"ident")
    assert wpid is not None
    sock = start_unread_reply(server, "ident", x)
    os.kill(wpid, signal.SIGKILL)
    deadline = time.time() + 30
    while os.path.exists(f"/proc/{wpid}") and time.time() < deadline:
        time.sleep(0.01)
    np.testing.assert_array_equal(read_reply(sock), x)
    assert server.proc.poll() is None
    # The next request starts a new worker.
    y = np.full(65536, 7, np.float32)
    check("ident", y, http_infer(server, "ident", y))


def test_kept_input_returned_after_a_region_switch(server):
    """The model returns an input array it kept from an earlier request
    while that request's reply still holds its region, and the new request
    came inline (no region): the output must be copied, not referenced in
    a region the server no longer reads DONE from."""
    x = np.arange(2 << 20, dtype=np.float32)
    sock = start_unread_reply(server, "keep", x)
    small = np.zeros(10, np.float32)
    body, headers = build_infer([{"name": "INPUT0", "datatype": "FP32", "data": small,
                                  "binary": True}],
                                [{"name": "OUTPUT0", "parameters": {"binary_data": True}}])
    r = infer(server, "keep", body, headers)
    assert r.status_code == 200, r.text
    doc, raw = split_response(r)
    np.testing.assert_array_equal(output_array(doc, raw, "OUTPUT0"), x)
    np.testing.assert_array_equal(read_reply(sock), x)


def test_region_switches_reuse_the_worker_mappings(tmp_path):
    """A reply being sent holds its EXECUTE region, so the next request
    takes another; back and forth between two regions, each is made (and
    its memfd sent) once, and later switches name the region's slot only.
    The model reads its input (x * 2): a worker reading the wrong region
    would answer wrong. The counts at shutdown say two regions (three if a
    reply's release came a moment after its last byte) served every
    switch. The bodies go chunked: received into a request body region, the
    inputs would not travel in the EXECUTE region at all
    (test_python_body_regions.py)."""
    repo = str(tmp_path / "models")
    write(repo, "double", config("double", "python", ("OUTPUT0", "OUTPUT1")), DOUBLE)
    s = Server(repo, ["--log-verbose=1"], "http")
    try:
        x0 = np.arange(4 << 20, dtype=np.float32)  # 16 MiB: more than the sockets buffer
        check("double", x0[:16], http_infer(s, "double", x0[:16]))  # inline: no region yet
        held, prev = start_unread_reply(s, "double", x0, True), x0  # region 1, held by its reply
        for k in range(1, 5):
            x = np.full(4 << 20, k, np.float32)
            nxt = start_unread_reply(s, "double", x, True)  # the other region
            np.testing.assert_array_equal(read_reply(held), prev * 2)
            held, prev = nxt, x
        np.testing.assert_array_equal(read_reply(held), prev * 2)
    finally:
        rc = s.stop()
    with open(s.log_path) as f:
        log = f.read()
    assert rc == 0, log
    counts = re.findall(r"'double_0_0' EXECUTE regions: (\d+) made, (\d+) switches", log)
    assert len(counts) == 1 and int(counts[0][0]) in (2, 3) and counts[0][1] == "4", log[-3000:]
