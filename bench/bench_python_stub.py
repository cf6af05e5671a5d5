#!/usr/bin/python3
"""The Python worker's per-request CPU, without the server.

    bench/bench_python_stub.py [--stub-dir DIR] [--compare DIR] [-n N] [--rounds R]
                               [--only CASE,...] [--general] [--prof]

Starts one worker (backends/python/'s nereid_stub package, or DIR's) on a
socket pair with an identity model.py, and plays the server: each round
trip sends an EXECUTE built here from python_wire.h's binary layout ("Binary
EXECUTE and DONE descriptions"; test_python_wire_sync checks this file's
copy of it) and reads the DONE back. The first DONE of
every case is checked (one response per request, OUTPUT0 equal to the
request's first input: name, datatype, shape and bytes). Then R rounds of
N round trips per case are timed; the worker's CPU per request comes from
/proc (user and system time, and its on-CPU time from schedstat: exact,
where the user/system split is sampled at each clock tick). Each figure is
the median over the rounds.

  --compare  a second worker from DIR's scripts (e.g. an older copy), its
             rounds alternating with the first's, printed below it.
             fp32_64k_switch alternates two regions per round trip: to the
             first worker by slot (its memfd sent once), to this one with
             the memfd every time and slot 0 (the protocol before slots).

  --general  the worker without its fast path (nereid_stub.FAST_PATH
             off: every message through the leader/follower wait, every
             EXECUTE parsed, every DONE record built), to compare.
  --prof     a cProfile of the worker's loop (inflated, but shows where).

The helpers (Worker, execute_message, parse_done) are the fake server that
tests/integration/test_python_stub_paths.py drives the worker with.
"""
import argparse
import json
import os
import socket
import statistics
import struct
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
HDR = struct.Struct("<IIQ")
U32 = struct.Struct("<I")
EXEC_REQ = struct.Struct("<IIIIiIQQq")
TENSOR = struct.Struct("<IIIIQQ")
DONE_RESP = struct.Struct("<IIIII")
M_INIT, M_EXECUTE, M_FINALIZE, M_READY, M_DONE = 1, 2, 3, 101, 102
M_BODY_MAP = 8  # a request body region's memfd for a slot (python.c, "Request bodies")
BODY_WHERE = 16  # a tensor record's where for body slot s: BODY_WHERE + s
M_REGION = 0x80000000
M_SLOT_SHIFT = 16  # an EXECUTE's region slot (python.c)
DT_NAMES = ("INVALID", "BOOL", "UINT8", "UINT16", "UINT32", "UINT64", "INT8", "INT16", "INT32",
            "INT64", "FP16", "FP32", "FP64", "BYTES", "BF16")
DT_CODES = {n: i for i, n in enumerate(DT_NAMES)}
ALIGN = 64

IDENTITY_PY = '''
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def execute(self, requests):
        return [pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", r.inputs()[0].as_numpy())])
                for r in requests]
'''

# The worker's side: the stub's own loop, on fd 3 like a started worker.
CHILD = r'''
import os, socket, sys
fd, stub_dir, mode = int(sys.argv[1]), sys.argv[2], sys.argv[3]
os.dup2(fd, 3)
os.close(fd)
sys.path.insert(0, stub_dir)
try:  # the nereid_stub package; an older DIR (--compare) has one script
    import nereid_stub as flags
    from nereid_stub.host import Worker
except ImportError:
    import nereid_python_stub as flags
    Worker = flags.Worker
import triton_python_backend_utils as pb_utils
if "general" in mode:
    flags.FAST_PATH = False
w = Worker(socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET, fileno=3))
pb_utils._worker = w
if "prof" in mode:
    import cProfile, pstats
    def bye(code=0):
        raise SystemExit(code)
    os._exit = bye
    pr = cProfile.Profile()
    try:
        pr.runcall(w.run, False)
    except SystemExit:
        pass
    pstats.Stats(pr, stream=sys.stderr).sort_stats("tottime").print_stats(30)
    sys.stderr.flush()
    os.abort()
w.run(watch=False)
'''


def pad(n):
    return (n + ALIGN - 1) // ALIGN * ALIGN


def tensor_record(name, dt, shape, offset, size, where=0):
    nb = name.encode()
    return (TENSOR.pack(len(nb), DT_CODES[dt], len(shape), where, offset, size) +
            struct.pack(f"<{len(shape)}q", *shape) + nb)


def execute_message(requests):
    """An inline EXECUTE for requests, each a dict: inputs [(name,
    datatype, shape, raw bytes)], and optionally outputs [names], id (str),
    corr (int or str), flags, timeout, sender (-1: none), params (JSON
    text)."""
    meta = [U32.pack(len(requests))]
    blob = bytearray()
    for r in requests:
        rid = r.get("id", "").encode()
        corr = r.get("corr", 0)
        cs = corr.encode() if isinstance(corr, str) else b""
        params = r.get("params", "").encode()
        outputs = r.get("outputs", ["OUTPUT0"])
        meta.append(EXEC_REQ.pack(len(r["inputs"]), len(outputs), r.get("flags", 0), len(rid),
                                  len(cs) if isinstance(corr, str) else -1, len(params),
                                  0 if isinstance(corr, str) else corr, r.get("timeout", 0),
                                  r.get("sender", -1)))
        meta += [rid, cs, params]
        for o in outputs:
            ob = o.encode()
            meta += [U32.pack(len(ob)), ob]
        for name, dt, shape, raw in r["inputs"]:
            if isinstance(raw, Body):  # referenced in a request body region
                meta.append(tensor_record(name, dt, shape, raw.offset, raw.size,
                                          BODY_WHERE + raw.slot))
                continue
            off = pad(len(blob))
            blob += bytes(off - len(blob)) + raw
            meta.append(tensor_record(name, dt, shape, off, len(raw)))
    m = b"".join(meta)
    return HDR.pack(M_EXECUTE, len(m), len(blob)) + m + bytes(blob)


def execute_parts(requests):
    """The description and blob of an EXECUTE for requests (see
    execute_message)."""
    msg = execute_message(requests)
    _, jlen, blen = HDR.unpack_from(msg, 0)
    return msg[HDR.size:HDR.size + jlen], msg[HDR.size + jlen:]


class Body:
    """A request body region (python.c, "Request bodies"): a sealed memfd
    holding data at offset (after a fake HTTP header), sent to the worker
    once with M_BODY_MAP for slot; an input record naming it has where =
    BODY_WHERE + slot, as the server sends inputs it received there."""

    def __init__(self, data, slot=0, offset=256):
        import fcntl
        import mmap
        self.slot, self.offset, self.size, self.data = slot, offset, len(data), data
        self.fd = os.memfd_create("nereid-test-body", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
        size = max(1 << 16, pad(offset + len(data)))
        os.ftruncate(self.fd, size)
        with mmap.mmap(self.fd, size) as mm:
            mm[offset:offset + len(data)] = data
        fcntl.fcntl(self.fd, fcntl.F_ADD_SEALS,
                    fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW | fcntl.F_SEAL_WRITE | fcntl.F_SEAL_SEAL)

    def send_map(self, sock):
        import array
        sock.sendmsg([HDR.pack(M_BODY_MAP | self.slot << M_SLOT_SHIFT, 0, 0)],
                     [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", [self.fd]))])

    def close(self):
        os.close(self.fd)


class Region:
    """The server's EXECUTE region (python.c's tx region): a memfd mapping
    that EXECUTEs are written into and sent as a header naming its slot
    only, its fd with the first one. DONE records with where=1 point into
    it."""

    def __init__(self, size=1 << 22, slot=0):
        import mmap
        self.fd = os.memfd_create("nereid-test-region", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
        os.ftruncate(self.fd, size)
        self.map = mmap.mmap(self.fd, size)
        self.sent = False
        self.slot = slot

    def execute(self, sock, requests):
        """Writes an EXECUTE for requests into the region and sends its header."""
        import array
        meta, blob = execute_parts(requests)
        self.map[0:len(meta)] = meta
        self.map[len(meta):len(meta) + len(blob)] = blob
        anc = [] if self.sent else [(socket.SOL_SOCKET, socket.SCM_RIGHTS,
                                     array.array("i", [self.fd]))]
        self.sent = True
        sock.sendmsg([HDR.pack(M_EXECUTE | M_REGION | self.slot << M_SLOT_SHIFT, len(meta),
                               len(blob))], anc)

    def close(self):
        self.map.close()
        os.close(self.fd)


def parse_done(msg, region=None):
    """An inline DONE: ("responses", [(status, code, text, params, [(name,
    datatype, shape, where, data)])]), ("error", text) or ("decoupled",
    [indices]). A where=1 record's data is read from region (a Region's
    map) when given, else None."""
    mtype, jlen, blen = HDR.unpack_from(msg, 0)
    if mtype != M_DONE:
        raise ValueError(f"not a DONE: type {mtype:#x}")
    meta = msg[HDR.size:HDR.size + jlen]
    blob = msg[HDR.size + jlen:HDR.size + jlen + blen]
    kind, n = struct.unpack_from("<II", meta, 0)
    if kind == 1:
        return "error", meta[8:8 + n].decode()
    if kind == 2:
        return "decoupled", list(struct.unpack_from(f"<{n}I", meta, 8))
    pos, out = 8, []
    for _ in range(n):
        status, n_out, plen, code, elen = DONE_RESP.unpack_from(meta, pos)
        pos += DONE_RESP.size
        text = meta[pos:pos + elen].decode()
        pos += elen
        params = meta[pos:pos + plen].decode()
        pos += plen
        outs = []
        for _ in range(n_out):
            ln, dt, rank, where, off, size = TENSOR.unpack_from(meta, pos)
            pos += TENSOR.size
            shape = struct.unpack_from(f"<{rank}q", meta, pos)
            pos += 8 * rank
            name = meta[pos:pos + ln].decode()
            pos += ln
            data = blob[off:off + size] if where == 0 else None
            if where >= BODY_WHERE:
                data = (off, size)
            if where == 1 and region is not None:
                if off + size > len(region):
                    raise ValueError("where=1 record outside the region")
                data = bytes(region[off:off + size])
            outs.append((name, DT_NAMES[dt], shape, where, data))
        out.append((status, code, text, params, outs))
    if pos != len(meta):
        raise ValueError("DONE description longer than its records")
    return "responses", out


class Worker:
    """A worker process on one end of a socket pair, initialized with
    model_src as its model.py (in root/m, default a new temporary
    directory); mode "fast", "general", and/or "prof"."""

    def __init__(self, model_src=IDENTITY_PY, stub_dir=None, mode="fast", decoupled=False,
                 config=None, root=None):
        self.tmp = tempfile.TemporaryDirectory(prefix="nereid-stub-") if root is None else None
        model_dir = os.path.join(root or self.tmp.name, "m")
        os.makedirs(os.path.join(model_dir, "1"), exist_ok=True)
        path = os.path.join(model_dir, "1", "model.py")
        with open(path, "w") as f:
            f.write(model_src)
        self.sock, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        stub_dir = stub_dir or os.path.join(ROOT, "backends", "python")
        self.proc = subprocess.Popen(
            [sys.executable, "-c", CHILD, str(theirs.fileno()), stub_dir, mode],
            pass_fds=(theirs.fileno(),))
        theirs.close()
        cfg = config or {"name": "m", "backend": "python", "max_batch_size": 0}
        init = json.dumps({
            "model_file": path, "instance": "m_0_0", "decoupled": decoupled,
            "auto_complete": False, "config": cfg, "model_dir": os.path.dirname(path),
            "args": {"model_config": json.dumps(cfg), "model_instance_kind": "CPU",
                     "model_instance_name": "m_0_0", "model_instance_device_id": "0",
                     "model_repository": model_dir, "model_version": "1", "model_name": "m"},
        }).encode()
        self.sock.sendmsg([HDR.pack(M_INIT, len(init), 0), init])
        ready = self.recv()
        mtype, jlen, _ = HDR.unpack_from(ready, 0)
        obj = json.loads(ready[HDR.size:HDR.size + jlen])
        if mtype != M_READY or "error" in obj:
            raise RuntimeError(f"worker not ready: {obj}")

    def recv(self):
        self.sock.settimeout(30)
        return self.sock.recv(1 << 16)

    def roundtrip(self, msg):
        """Sends msg, returns the next message that is not a log line."""
        self.sock.send(msg)
        while True:
            r = self.recv()
            if HDR.unpack_from(r, 0)[0] != 103:  # M_LOG
                return r

    def cpu(self):
        """(user s, system s, on-CPU s) of the worker so far."""
        with open(f"/proc/{self.proc.pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        tick = os.sysconf("SC_CLK_TCK")
        with open(f"/proc/{self.proc.pid}/schedstat") as f:
            on_cpu_ns = int(f.read().split()[0])
        return int(fields[11]) / tick, int(fields[12]) / tick, on_cpu_ns / 1e9

    def close(self):
        self.sock.close()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        if self.tmp is not None:
            self.tmp.cleanup()


def case_requests():
    """name -> the requests of one EXECUTE (identity model)."""
    import numpy as np
    rng = np.random.default_rng(1)

    def one(dt, arr):
        return {"inputs": [("INPUT0", dt, arr.shape, arr.tobytes())]}

    words = [b"a", b"", "naïve".encode(), b"x" * 40]
    ser = b"".join(struct.pack("<I", len(w)) + w for w in words)
    return {
        "fp32_1": [one("FP32", np.array([1.5], np.float32))],
        "int64_4x8": [one("INT64", rng.integers(-9, 9, (4, 8)))],
        "fp16_256": [one("FP16", rng.random(256).astype(np.float16))],
        "uint8_16k": [one("UINT8", rng.integers(0, 255, 16384, dtype=np.uint8))],
        "bytes_4": [{"inputs": [("INPUT0", "BYTES", (4,), ser)]}],
        "fp32_1_x4": [one("FP32", np.array([float(i)], np.float32)) for i in range(4)],
        # in the server's region (as python.c sends an EXECUTE over 60 KB)
        "fp32_64k_region": [one("FP32", rng.random(65536, np.float32))],
        "fp32_64k_switch": [one("FP32", rng.random(65536, np.float32))],  # two regions
        # in a request body region (as python.c sends an HTTP body's inputs)
        "fp32_64k_body": [{"inputs": [("INPUT0", "FP32", (65536,),
                                       Body(rng.random(65536, np.float32).tobytes()))]}],
    }


def check_identity(done, requests, region=None):
    kind, responses = parse_done(done, region)
    if kind != "responses" or len(responses) != len(requests):
        raise AssertionError(f"unexpected DONE: {kind} {responses}")
    for (status, _, text, _, outs), r in zip(responses, requests):
        name, dt, shape, raw = r["inputs"][0]
        want = [("OUTPUT0", dt, tuple(shape), 0 if region is None else 1, raw)]
        if isinstance(raw, Body):  # answered as a view of the body: where and place
            want = [("OUTPUT0", dt, tuple(shape), BODY_WHERE + raw.slot, (raw.offset, raw.size))]
        if status != 0 or outs != want:
            raise AssertionError(f"wrong response: {status} {text} {outs[:1]}")


def measure(w, msg, n):
    """(round trip, user, system, on-CPU) in us per request over n."""
    sock = w.sock
    c0 = w.cpu()
    t0 = time.perf_counter()
    for _ in range(n):
        sock.send(msg)
        sock.recv(1 << 16)
    t1 = time.perf_counter()
    c1 = w.cpu()
    return [(t1 - t0) / n * 1e6] + [(c1[i] - c0[i]) / n * 1e6 for i in range(3)]


def measure_switch(w, msgs, n):
    """measure() sending msgs ((header, ancillary data) pairs) in turn."""
    sock = w.sock
    c0 = w.cpu()
    t0 = time.perf_counter()
    for i in range(n):
        sock.sendmsg(*msgs[i % len(msgs)])
        sock.recv(1 << 16)
    t1 = time.perf_counter()
    c1 = w.cpu()
    return [(t1 - t0) / n * 1e6] + [(c1[i] - c0[i]) / n * 1e6 for i in range(3)]


def switch_messages(w, reqs, by_slot):
    """Two regions holding the EXECUTE for reqs and the header (with the
    memfd unless by_slot) that names each."""
    import array
    w.regions = [Region(slot=k if by_slot else 0) for k in range(2)]
    msgs = []
    for r in w.regions:
        r.execute(w.sock, reqs)
        check_identity(w.recv(), reqs, r.map)
        meta, blob = execute_parts(reqs)
        anc = [] if by_slot else [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", [r.fd]))]
        msgs.append(([HDR.pack(M_EXECUTE | M_REGION | r.slot << M_SLOT_SHIFT, len(meta),
                               len(blob))], anc))
    return msgs


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--stub-dir", default=os.path.join(ROOT, "backends", "python"))
    ap.add_argument("--compare", default=None)
    ap.add_argument("-n", type=int, default=20000, help="round trips for fp32_1 (others N/4)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--only", default="")
    ap.add_argument("--general", action="store_true")
    ap.add_argument("--prof", action="store_true")
    a = ap.parse_args()
    mode = ("general" if a.general else "fast") + (",prof" if a.prof else "")
    cases = case_requests()
    names = [c for c in a.only.split(",") if c] or list(cases)
    workers = []
    try:
        for d in [a.stub_dir] + ([a.compare] if a.compare else []):
            workers.append((d, Worker(stub_dir=d, mode=mode)))
            print(f"worker {len(workers)}: {d} ({mode})")
        print("per request, median of rounds: round trip, worker user / sys / on-CPU")
        for name in names:
            reqs = cases[name]
            msg = execute_message(reqs)
            n = a.n if name == "fp32_1" else max(a.n // 4, 1)
            if name.endswith("_switch"):
                msgs = [switch_messages(w, reqs, i == 0) for i, (_, w) in enumerate(workers)]
                res = [[] for _ in workers]
                for _ in range(a.rounds):
                    for i, (_, w) in enumerate(workers):
                        res[i].append(measure_switch(w, msgs[i], n))
                for i, r in enumerate(res):
                    rt, user, sys_, cpu = (statistics.median(x[k] for x in r) for k in range(4))
                    print(f"  {name:10s} worker {i + 1}: {rt:6.1f} us   user {user:5.1f} us  "
                          f"sys {sys_:5.1f} us  on-CPU {cpu:5.1f} us")
                continue
            for _, w in workers:
                if name.endswith("_region"):  # written once, then its header again
                    if not hasattr(w, "region"):
                        w.region = Region()
                    w.region.execute(w.sock, reqs)
                    check_identity(w.recv(), reqs, w.region.map)
                    meta, blob = execute_parts(reqs)
                    msg = HDR.pack(M_EXECUTE | M_REGION, len(meta), len(blob))
                else:
                    for _, _, _, raw in reqs[0]["inputs"]:
                        if isinstance(raw, Body):
                            raw.send_map(w.sock)
                    check_identity(w.roundtrip(msg), reqs)
                for _ in range(min(n, 500)):  # warm-up
                    w.roundtrip(msg)
            res = [[] for _ in workers]
            for _ in range(a.rounds):
                for i, (_, w) in enumerate(workers):
                    res[i].append(measure(w, msg, n))
            for i, r in enumerate(res):
                rt, user, sys_, cpu = (statistics.median(x[k] for x in r) for k in range(4))
                print(f"  {name:10s} worker {i + 1}: {rt:6.1f} us   user {user:5.1f} us  "
                      f"sys {sys_:5.1f} us  on-CPU {cpu:5.1f} us")
    finally:
        for _, w in workers:
            w.close()
            for r in [getattr(w, "region", None)] + getattr(w, "regions", []):
                if r is not None:
                    r.close()
        for reqs in cases.values():
            for r in reqs:
                for _, _, _, raw in r["inputs"]:
                    if isinstance(raw, Body):
                        raw.close()


if __name__ == "__main__":
    main()
