"""HTTP bodies of Python models' requests received straight into shared
memory the worker maps read-only (backend ABI 1.10, python_body.c "Request
bodies"), through the real binary: identities at 256 KiB and 4 MiB (binary
and JSON) answer right and read their inputs where the body landed; several
clients at once get their own answers; an input a model keeps past execute
never changes; a slow client reading a big reply keeps its bytes while new
requests take other regions; a worker killed mid-request is replaced and
the next requests work; compressed and chunked bodies take the old path;
fds and mappings stay flat over 1,000 requests; a worker cannot write a
region (mprotect, write, ftruncate, a writable mapping); forged references
and holds in a DONE end the worker with a reason."""
import gzip
import json
import os
import re
import signal
import socket
import threading
import time

import numpy as np
import pytest
import requests

from conftest import BUILD, Server
from http_helpers import build_infer, infer, output_array, split_response

IDENT = """
import os, time
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def initialize(self, args):
        self.flag = os.path.join(args["model_repository"], "sleeping")

    def execute(self, requests):
        out = []
        for r in requests:
            x = pb_utils.get_input_tensor_by_name(r, "INPUT0").as_numpy()
            if x.size and x[0] == -1:  # the test kills the worker meanwhile
                open(self.flag, "w").close()
                time.sleep(60)
            out.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", x)]))
        return out
"""

# Keeps the input of the first request (and a slice of it, a view the
# model made) and answers every request with what they hold now.
KEEP = """
import numpy as np
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def initialize(self, args):
        self.kept = self.tail = None

    def execute(self, requests):
        out = []
        for r in requests:
            x = pb_utils.get_input_tensor_by_name(r, "INPUT0").as_numpy()
            if self.kept is None:
                self.kept, self.tail = x, x[16:]
            now = np.concatenate([self.kept, self.tail])
            out.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", now)]))
        return out
"""

# Tries every way into the body region its input lies in and reports what
# happened to each (RESULT, JSON); answers OUTPUT0 = the input.
WRITER = """
import ctypes, errno, json, mmap, os
import numpy as np
import triton_python_backend_utils as pb_utils

def attempt(fn):
    try:
        fn()
        return "allowed"
    except (OSError, ValueError) as e:
        return "refused: " + type(e).__name__

class TritonPythonModel:
    def execute(self, requests):
        out = []
        for r in requests:
            x = pb_utils.get_input_tensor_by_name(r, "INPUT0").as_numpy()
            addr = x.__array_interface__["data"][0]
            res = {"writeable": bool(x.flags.writeable)}
            res["setflags"] = attempt(lambda: x.setflags(write=True))
            span = None
            with open("/proc/self/maps") as f:
                for line in f:
                    lo, hi = (int(v, 16) for v in line.split()[0].split("-"))
                    if lo <= addr < hi:
                        span, res["maps"] = (lo, hi), line.split(None, 5)[-1].strip()
                        res["perms"] = line.split()[1]
            libc = ctypes.CDLL(None, use_errno=True)
            libc.mprotect.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
            def protect():
                if libc.mprotect(span[0], span[1] - span[0], 3) != 0:
                    raise OSError(ctypes.get_errno(), "mprotect")
            res["mprotect"] = attempt(protect)
            path = "/proc/self/map_files/%x-%x" % span
            try:
                fd = os.open(path, os.O_RDWR)
            except OSError as e:
                res["open"] = "refused: " + type(e).__name__
            else:
                res["open"] = "allowed"
                try:
                    res["write"] = attempt(lambda: os.pwrite(fd, b"x", 0))
                    res["mmap_write"] = attempt(lambda: mmap.mmap(fd, span[1] - span[0]))
                    res["ftruncate"] = attempt(lambda: os.ftruncate(fd, 0))
                    res["grow"] = attempt(lambda: os.ftruncate(fd, (span[1] - span[0]) * 2))
                finally:
                    os.close(fd)
            out.append(pb_utils.InferenceResponse([
                pb_utils.Tensor("OUTPUT0", x),
                pb_utils.Tensor("RESULT", np.array([json.dumps(res).encode()], dtype=object))]))
        return out
"""

# Answers with a forged DONE, as the request's "forge" parameter says: a
# record in a body slot the execute does not read, one outside the body,
# one larger than it, or a hold on a slot the worker was never given.
FORGER = """
import json, sys
import triton_python_backend_utils as pb_utils

from nereid_stub import wire as stub
from nereid_stub.host import Worker

class TritonPythonModel:
    def initialize(self, args):
        self.orig = Worker.send_done
        self.forge = None
        model = self
        def send_done(worker, meta, views=(), blob_len=0):
            forge, model.forge = model.forge, None
            if forge is None:
                return model.orig(worker, meta, views, blob_len)
            slot, off, n = forge["slot"], forge["off"], forge["n"]
            shape = (max(n // 4, 1),)
            kind = stub.DONE_RESPONSES | forge.get("hold", 0) << 16
            rec = stub.tensor_record("OUTPUT0", "FP32", shape, stub.BODY_WHERE + slot, off, n)
            d = (stub.DONE_HEAD.pack(kind, 1) + stub.DONE_RESP.pack(stub.RESP_OUTPUTS, 1, 0, 0, 0)
                 + rec)
            worker.body_exec, worker.body_live = [], []
            return model.orig(worker, d)
        Worker.send_done = send_done

    def execute(self, requests):
        out = []
        for r in requests:
            x = pb_utils.get_input_tensor_by_name(r, "INPUT0").as_numpy()
            p = json.loads(r.parameters())
            if "forge" in p:
                slot = next(s for s, ref in stub_worker_slots())
                self.forge = {"slot": slot, "off": 0, "n": x.nbytes}
                self.forge.update(json.loads(p["forge"]))
            out.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", x)]))
        return out

def stub_worker_slots():
    import gc
    w = next(o for o in gc.get_objects() if isinstance(o, Worker))
    return w.body_exec
"""


def config(name, outputs=(("OUTPUT0", "TYPE_FP32", "[ -1 ]"),)):
    outs = ", ".join(f'{{ name: "{n}" data_type: {t} dims: {d} }}' for n, t, d in outputs)
    return (f'name: "{name}"\nbackend: "python"\nmax_batch_size: 0\n'
            'input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ -1 ] } ]\n'
            f'output [ {outs} ]\ninstance_group [ {{ count: 1 kind: KIND_CPU }} ]\n')


def write(repo, name, cfg, model_py):
    os.makedirs(os.path.join(repo, name, "1"), exist_ok=True)
    with open(os.path.join(repo, name, "config.pbtxt"), "w") as f:
        f.write(cfg)
    with open(os.path.join(repo, name, "1", "model.py"), "w") as f:
        f.write(model_py)


def make_repo(root):
    repo = str(root / "models")
    write(repo, "ident", config("ident"), IDENT)
    write(repo, "keep", config("keep"), KEEP)
    write(repo, "writer", config("writer", (("OUTPUT0", "TYPE_FP32", "[ -1 ]"),
                                            ("RESULT", "TYPE_STRING", "[ 1 ]"))), WRITER)
    write(repo, "forger", config("forger"), FORGER)
    return repo


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    repo = make_repo(tmp_path_factory.mktemp("bodies"))
    s = Server(repo, ["--log-verbose=1"], "http")
    s.repo = repo
    yield s
    rc = s.stop()
    assert rc == 0, s.output()


def request(x, binary=True, outputs=("OUTPUT0",), parameters=None):
    return build_infer([{"name": "INPUT0", "datatype": "FP32", "data": x, "binary": binary}],
                       [{"name": o, "parameters": {"binary_data": binary}} for o in outputs],
                       parameters)


def http_infer(server, model, x, binary=True, outputs=("OUTPUT0",), parameters=None):
    body, headers = request(x, binary, outputs, parameters)
    r = infer(server, model, body, headers)
    assert r.status_code == 200, r.text
    doc, raw = split_response(r)
    return {o: output_array(doc, raw, o) for o in outputs}


def worker_pid(instance):
    """The pid of the worker process of instance (its command line names it)."""
    stub = os.path.join(BUILD, "backends", "python", "nereid_python_stub.py").encode()
    for p in os.listdir("/proc"):
        if not p.isdigit():
            continue
        try:
            with open(f"/proc/{p}/cmdline", "rb") as f:
                cmd = f.read()
        except OSError:
            continue
        if b"triton_python_backend_stub" in cmd and instance.encode() in cmd and (
                stub in cmd or b"nereid_python_stub" in cmd):
            return int(p)
    return None


def body_maps(pid):
    """The worker's mappings of request body regions (their permissions)."""
    with open(f"/proc/{pid}/maps") as f:
        return [line.split()[1] for line in f if "nereid-body" in line]


@pytest.mark.parametrize("binary", [True, False], ids=["binary", "json"])
@pytest.mark.parametrize("n", [65536, 1 << 20], ids=["256KiB", "4MiB"])
def test_identity_sizes(server, n, binary):
    rng = np.random.default_rng(n)
    for _ in range(3):  # the later ones reuse regions
        x = rng.standard_normal(n).astype(np.float32)
        np.testing.assert_array_equal(http_infer(server, "ident", x, binary)["OUTPUT0"], x)
    if binary:
        # the inputs were read where the body landed: the worker maps a
        # body region, read-only and shared
        perms = body_maps(worker_pid("ident_0_0"))
        assert perms and all(p == "r--s" for p in perms), perms


def test_small_bodies_stay_in_frontend_memory(server):
    x = np.arange(16, dtype=np.float32)
    np.testing.assert_array_equal(http_infer(server, "ident", x)["OUTPUT0"], x)


def test_concurrent_clients(server):
    errors = []

    def client(k):
        try:
            for i in range(25):
                n = 65536 + 1024 * ((k + i) % 5)
                x = np.full(n, k * 1000 + i, np.float32)
                x[:8] = np.arange(8)
                y = http_infer(server, "ident", x)["OUTPUT0"]
                if not np.array_equal(x, y):
                    errors.append((k, i))
        except Exception as e:  # noqa: BLE001 -- reported below
            errors.append(repr(e))

    threads = [threading.Thread(target=client, args=(k,)) for k in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors


def test_kept_input_never_changes(server):
    first = np.arange(65536, dtype=np.float32)
    want = np.concatenate([first, first[16:]])
    np.testing.assert_array_equal(http_infer(server, "keep", first)["OUTPUT0"], want)
    for k in range(12):  # later bodies take the other regions, again and again
        x = np.full(65536 + 512 * (k % 3), -k - 1, np.float32)
        np.testing.assert_array_equal(http_infer(server, "keep", x)["OUTPUT0"], want)
    assert body_maps(worker_pid("keep_0_0"))


def start_unread_reply(server, model, x):
    """Sends x over a raw connection and returns the socket once the server
    finished the request: its reply is being sent and waits to be read."""
    st = f"{server.http_url}/v2/models/{model}/stats"

    def success():
        return requests.get(st, timeout=30).json()["model_stats"][0]["inference_stats"][
            "success"]["count"]

    before = success()
    body, headers = request(x)
    head = (f"POST /v2/models/{model}/infer HTTP/1.1\r\nHost: x\r\n"
            f"Content-Length: {len(body)}\r\n"
            + "".join(f"{k}: {v}\r\n" for k, v in headers.items()) + "\r\n").encode()
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 64 * 1024)
    sock.settimeout(60)
    sock.connect(("127.0.0.1", server.http_port))
    sock.sendall(head + body)
    deadline = time.time() + 60
    while success() == before:
        assert time.time() < deadline, "the request did not finish"
        time.sleep(0.01)
    return sock


def read_reply(sock):
    data = b""
    while b"\r\n\r\n" not in data:
        data += sock.recv(65536)
    head, rest = data.split(b"\r\n\r\n", 1)
    hdrs = dict(l.split(": ", 1) for l in head.decode().split("\r\n")[1:])
    n = int(hdrs["Content-Length"])
    while len(rest) < n:
        chunk = sock.recv(1 << 20)
        assert chunk
        rest += chunk
    sock.close()
    ihcl = int(hdrs["Inference-Header-Content-Length"])
    return np.frombuffer(rest[ihcl:n], np.float32)


def test_slow_client_keeps_its_bytes_while_regions_are_reused(server):
    big = np.arange(4 << 20, dtype=np.float32)  # 16 MiB: more than the socket buffers
    sock = start_unread_reply(server, "ident", big)
    for k in range(12):
        n = (1 << 20) if k % 3 == 0 else 65536
        x = np.full(n, k + 0.5, np.float32)
        np.testing.assert_array_equal(http_infer(server, "ident", x)["OUTPUT0"], x)
    np.testing.assert_array_equal(read_reply(sock), big)


def test_worker_killed_mid_request(server):
    pid = worker_pid("ident_0_0")
    assert pid
    x = np.full(65536, -1, np.float32)
    result = {}

    def slow():
        body, headers = request(x)
        result["r"] = infer(server, "ident", body, headers)

    flag = os.path.join(server.repo, "ident", "sleeping")
    t = threading.Thread(target=slow)
    t.start()
    deadline = time.time() + 60
    while not os.path.exists(flag):  # the worker is in execute, with the request
        assert time.time() < deadline
        time.sleep(0.01)
    os.kill(pid, signal.SIGKILL)
    t.join(60)
    assert result["r"].status_code != 200
    for k in range(5):  # a new worker, which gets the regions again
        y = np.full(65536, k, np.float32)
        np.testing.assert_array_equal(http_infer(server, "ident", y)["OUTPUT0"], y)
    assert worker_pid("ident_0_0") not in (None, pid)


def test_worker_cannot_write_a_region(server):
    x = np.arange(65536, dtype=np.float32)
    outs = http_infer(server, "writer", x, outputs=("OUTPUT0", "RESULT"))
    np.testing.assert_array_equal(outs["OUTPUT0"], x)
    res = json.loads(outs["RESULT"].reshape(-1)[0])
    assert "nereid-body" in res["maps"] and res["perms"] == "r--s", res
    assert res["writeable"] is False
    for k in ("setflags", "mprotect", "write", "mmap_write", "ftruncate", "grow"):
        if k in ("write", "mmap_write", "ftruncate", "grow") and res["open"] != "allowed":
            continue  # not root: the region's file cannot even be opened
        assert res[k].startswith("refused"), (k, res)
    # the bytes the server parsed are still the client's
    np.testing.assert_array_equal(http_infer(server, "writer", x, outputs=("OUTPUT0", "RESULT"))[
        "OUTPUT0"], x)


@pytest.mark.parametrize("forge", [{"slot": 7}, {"off": 1 << 40}, {"n": 1 << 30},
                                   {"hold": 0x80}],
                         ids=["slot", "offset", "size", "hold"])
def test_forged_done_ends_the_worker(server, forge):
    x = np.arange(65536, dtype=np.float32)
    http_infer(server, "forger", x)  # the worker has the region mapped
    pid = worker_pid("forger_0_0")
    seen = len(server.output())
    body, headers = request(x, parameters={"forge": json.dumps(forge)})
    r = infer(server, "forger", body, headers)
    assert r.status_code != 200, r.text
    deadline = time.time() + 30
    while "malformed execute answer" not in server.output()[seen:]:
        assert time.time() < deadline, server.output()[-3000:]
        time.sleep(0.05)
    why = {"slot": "a request body region the execute does not read",
           "off": "lies outside its message", "n": "lies outside its message",
           "hold": "a hold on a request body region it was not given"}[next(iter(forge))]
    assert why in server.output()[seen:], server.output()[-3000:]
    # a new worker answers
    np.testing.assert_array_equal(http_infer(server, "forger", x)["OUTPUT0"], x)
    assert worker_pid("forger_0_0") != pid


def test_compressed_and_chunked_bodies_fall_back(tmp_path):
    """Bodies whose size is unknown up front (chunked) or that are not used
    as they arrive (gzip) are received as before; the counts at shutdown
    say only the plain ones went into body regions: two of them, as the
    worker holds the region of the execute it answered last until its next
    answer."""
    s = Server(make_repo(tmp_path), ["--log-verbose=1"], "http")
    try:
        x = np.arange(65536, dtype=np.float32)
        body, headers = request(x)
        for _ in range(3):
            r = requests.post(f"{s.http_url}/v2/models/ident/infer", data=gzip.compress(body),
                              headers={**headers, "Content-Encoding": "gzip"}, timeout=30)
            assert r.status_code == 200, r.text
            doc, raw = split_response(r)
            np.testing.assert_array_equal(output_array(doc, raw, "OUTPUT0"), x)
            r = requests.post(f"{s.http_url}/v2/models/ident/infer",
                              data=iter([body[:1000], body[1000:]]), headers=headers, timeout=30)
            assert r.status_code == 200, r.text
            doc, raw = split_response(r)
            np.testing.assert_array_equal(output_array(doc, raw, "OUTPUT0"), x)
        for _ in range(2):
            np.testing.assert_array_equal(http_infer(s, "ident", x)["OUTPUT0"], x)
    finally:
        rc = s.stop()
    with open(s.log_path) as f:
        log = f.read()
    assert rc == 0, log
    counts = re.findall(r"'ident' request body regions: (\d+) made, (\d+) bodies received in "
                        r"them, (\d+) offered none", log)
    assert counts == [("2", "2", "0")], log[-3000:]


def fd_count(pid):
    return len(os.listdir(f"/proc/{pid}/fd"))


def test_fds_and_maps_flat_over_1000_requests(server):
    pid = server.proc.pid
    x = np.arange(65536, dtype=np.float32)
    with requests.Session() as sess:
        body, headers = request(x)

        def burst(n):
            for _ in range(n):
                r = sess.post(f"{server.http_url}/v2/models/ident/infer", data=body,
                              headers=headers, timeout=30)
                assert r.status_code == 200, r.text

        burst(50)
        fds, maps = fd_count(pid), len(body_maps(worker_pid("ident_0_0")))
        burst(1000)
        assert fd_count(pid) <= fds + 2
        assert len(body_maps(worker_pid("ident_0_0"))) <= maps
        doc, raw = split_response(sess.post(f"{server.http_url}/v2/models/ident/infer",
                                            data=body, headers=headers, timeout=30))
        np.testing.assert_array_equal(output_array(doc, raw, "OUTPUT0"), x)
