"""The worker process of one Python model instance (Triton's "stub").

libnereid_python.so starts `python3 -u nereid_python_stub.py
triton_python_backend_stub <instance>` with a Unix SOCK_SEQPACKET socket on
fd 3. Each message is a 16-byte header (type, json_len, blob_len; little
endian) followed by a JSON object and a blob of tensor bytes, either inline
in the same datagram or, when large, in an anonymous shared-memory file
(memfd) passed with SCM_RIGHTS. Tensors are described in the JSON by name,
datatype, shape, offset and size within the blob. EXECUTE and DONE carry a
binary description (struct records, layout in python.c) in the JSON's place.

Threads: the socket is read by whichever thread is waiting for something
(leader/follower, Worker.wait_for): the main thread when it waits for work
(init, execute, finalize run on it), a model thread when it waits for its
BLS result or cancellation answer. The worker exits when the server closes
the socket; a watchdog thread blocked in poll() sees the hang-up even while
the model is busy.

Started as `nereid_python_stub.py nereid_python_zygote`, the script is the
pre-started "zygote" instead (zygote_main): it forks one worker per request,
so an instance starts without a new interpreter and a new numpy import.
"""
import os

# Pages a forked worker is known to write, made private in one madvise per
# range before anything else runs in the child (zygote_main, "Pre-faulting"):
# None, or (madvise, [(address, length, advice)]). Registered before the
# modules below register theirs, so it runs first among the after-fork hooks.
_prefault = None
_prefaulted = ()  # the ranges this worker was given (for tests)


def _prefault_child():
    global _prefault, _prefaulted
    p = _prefault
    if p is not None:
        madvise, ranges = p
        for r in ranges:
            madvise(*r)
        _prefault = None  # the model's own forks pre-fault nothing
        _prefaulted = ranges


os.register_at_fork(after_in_child=_prefault_child)

import array  # noqa: E402
import collections  # noqa: E402
import fcntl  # noqa: E402
import gc  # noqa: E402
import importlib  # noqa: E402
import inspect  # noqa: E402
import json  # noqa: E402
import mmap  # noqa: E402
import queue  # noqa: E402
import select  # noqa: E402
import signal  # noqa: E402
import socket  # noqa: E402
import struct  # noqa: E402
import sys  # noqa: E402
import threading  # noqa: E402
import time  # noqa: E402
import traceback  # noqa: E402
import types  # noqa: E402
import weakref  # noqa: E402

import numpy as np  # noqa: E402


class _LazyModule:
    """A module imported on first use: asyncio (with ssl and logging) is a
    quarter of the zygote's start and of the memory every fork copies page
    tables for, and only models with coroutines use it."""

    def __init__(self, name):
        self._name = name

    def __getattr__(self, attr):
        mod = importlib.import_module(self._name)
        globals()[self._name] = mod
        return getattr(mod, attr)


asyncio = _LazyModule("asyncio")

HDR = struct.Struct("<IIQ")
# EXECUTE and DONE describe their tensors in binary (python.c, "Binary
# EXECUTE and DONE descriptions"): no JSON per request.
U32 = struct.Struct("<I")
U64 = struct.Struct("<Q")
EXEC_REQ = struct.Struct("<IIIIiIQQq")  # inputs, outputs, flags, id, corr (-1), params, corr, timeout, sender
TENSOR = struct.Struct("<IIIIQQ")  # name_len, datatype, rank, where, offset, size
DONE_RESP = struct.Struct("<IIIII")  # status, n_outputs, params_len, error code, error_len
DONE_HEAD = struct.Struct("<II")  # kind, n
DONE_RESPONSES, DONE_ERROR, DONE_DECOUPLED = 0, 1, 2
# BLS_CALL: id, version, correlation id, timeout, flags, decoupled, corr_len
# (-1: numeric), model_len, id_len, params_len, n_outputs, n_inputs, reply
# slot (-1: none)
BLS_CALL = struct.Struct("<QqQQIIiIIIIIi")
# BLS_RESULT: id, status, final, error code, error_len, params_len, n_outputs
BLS_RES = struct.Struct("<QIIIIII")
# a BLS_RESULT in a region: the offsets of its blob and its description there
BLS_OFFSETS = struct.Struct("<QQ")
BLS_OUTPUTS, BLS_ERROR, BLS_EMPTY = 0, 1, 2
U64_MASK = (1 << 64) - 1
RESP_OUTPUTS, RESP_ERROR, RESP_RESCHEDULE = 0, 1, 2
# nereid_datatype_t's order
DT_NAMES = ("INVALID", "BOOL", "UINT8", "UINT16", "UINT32", "UINT64", "INT8", "INT16", "INT32",
            "INT64", "FP16", "FP32", "FP64", "BYTES", "BF16")
DT_CODES = {n: i for i, n in enumerate(DT_NAMES)}
ALIAS_MIN = 4096  # an output this large that is a view of an input is not copied
TAIL_MIN = 32 * 1024  # an output this large goes into the server's EXECUTE region (a view there)
CMSG_FD_SPACE = socket.CMSG_SPACE(4)
PR_SET_PDEATHSIG = 1
INLINE_MAX = 60 * 1024  # a whole message up to this size travels in the datagram
RECV_MAX = 64 * 1024
ALIGN = 64
SPIN_PREEMPTED_S = 50e-6  # a gap between two polls this long: the spin lost its CPU
SPIN_BUSY_CHECKS = 2  # checks in a row that saw threads waiting for a CPU: stop
SPIN_BACKOFF = 32  # requests that do not spin after threads were seen waiting for a CPU
N_CPUS = os.cpu_count() or 1  # what /proc/loadavg's runnable threads compete for
ZEROS = bytes(ALIGN)  # padding between tensors (always < ALIGN bytes)
M_REGION = 0x80000000  # payload in the sender's persistent region (EXECUTE, DONE)
# An EXECUTE in a region names it by a slot in these bits of its type
# (python.c's M_SLOT_SHIFT); a memfd sent with a slot replaces its mapping.
M_SLOT_SHIFT, M_SLOT_MASK = 16, 0xF << 16
# BLS messages past INLINE_MAX travel in persistent regions named by slot
# (python.c, "BLS regions"): ours for BLS_CALL, the server's for BLS_RESULT
BLS_SLOTS = 8
BLS_REGION_MAX = 16 << 20  # a larger message travels in a memfd of its own
BLS_BUDGET = 64 << 20  # our BLS_CALL regions together, at most
# The fast path (see Worker.next_work, Worker.build_requests, tensor_records):
# the main thread reads an EXECUTE itself when no other thread waits for a
# message, an EXECUTE description seen before reuses its parsed requests, a
# DONE record seen before its bytes. Off: every message goes through
# wait_for and everything is parsed and built anew (the general path, which
# tests compare it with).
FAST_PATH = True
# A BLS input that is a view of the EXECUTE in flight's region (the model
# passes its own input), and a DONE output that is a view of a BLS result,
# are referenced where they are, not copied (python.c, "BLS tensors by
# reference").
BLS_BY_REF = True
PLANS_MAX = 256  # EXECUTE descriptions remembered (all forgotten when full)
RECORDS_MAX = 1024  # DONE tensor records remembered (likewise)
RELEASE_ALL, RELEASE_RESCHEDULE = 1, 2  # pb_utils.TRITONSERVER_REQUEST_RELEASE_*

# C -> worker
M_INIT, M_EXECUTE, M_FINALIZE, M_BLS_RESULT, M_CANCEL_ANSWER = 1, 2, 3, 4, 5
M_READY_QUERY, M_READY_ANSWER = 6, 122  # the model's is_ready(): query, answer
M_SPIN_PAGE = 7  # a shared word: how many messages we sent (python.c, "spin-wait")
# A request body region's memfd for a slot (python.c, "Request bodies"): the
# HTTP body of a request, sealed so we map it read-only; an input that lies
# there has where = BODY_WHERE + slot, and so may an output that views it.
M_BODY_MAP = 8
BODY_WHERE, BODY_SLOTS = 16, 8
# worker -> C
M_READY, M_DONE, M_LOG, M_RESPONSE, M_BLS_CALL, M_CANCEL_QUERY, M_FINALIZED = (
    101, 102, 103, 104, 105, 106, 107)
# pb_utils calls besides inference (metrics, model control): call, answer
M_API_CALL, M_API_ANSWER = 120, 20
# a decoupled BLS call's ResponseIterator.cancel() (no answer)
M_BLS_CANCEL = 121

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import triton_python_backend_utils as pb_utils  # noqa: E402


MADV_POPULATE_READ, MADV_POPULATE_WRITE = 22, 23  # Linux 5.14


def populate(mm, advice):
    """Faults a fresh mapping's pages in with one call instead of one fault
    per page as they are touched (tens of µs each on a paravirtualized
    machine); best effort."""
    try:
        mm.madvise(advice)
    except (OSError, ValueError):
        pass


def new_region(size):
    """(fd, mapping) of a new memfd of size bytes, sealed against shrinking
    (the server maps it too): a region of ours that lives across messages."""
    fd = os.memfd_create("nereid-python", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
    try:
        os.ftruncate(fd, size)
        fcntl.fcntl(fd, fcntl.F_ADD_SEALS, fcntl.F_SEAL_SHRINK)
        return fd, mmap.mmap(fd, size)
    except BaseException:
        os.close(fd)
        raise


def fill_region(mm, js, views):
    """A message's description at the start of mm, its tensors after it at
    their blob offsets."""
    mv = memoryview(mm)
    try:
        mv[0:len(js)] = js
        for off, data in views:
            mv[len(js) + off:len(js) + off + data.nbytes] = as_bytes(data)
    finally:
        mv.release()


def error_text(e):
    """An exception as Triton's stub prints it: '<Type>: <msg>' and the frames."""
    lines = [f"{type(e).__name__}: {e}", "", "At:"]
    for fs in reversed(traceback.extract_tb(e.__traceback__)):
        lines.append(f"  {fs.filename}({fs.lineno}): {fs.name}")
    return "\n".join(lines)


_JSON_NAMES = {}  # tensor name -> its JSON string (names repeat on every request)


def json_name(name):
    j = _JSON_NAMES.get(name)
    if j is None:
        j = json.dumps(name)
        if len(_JSON_NAMES) < 4096:
            _JSON_NAMES[name] = j
    return j


def tensor_bytes(t):
    """The bytes a pb_utils.Tensor sends: BYTES serialized, other types as a
    C-contiguous array (the array itself when it already is one)."""
    arr = t._array
    if t._dtype == "BYTES":
        ser = pb_utils.serialize_byte_tensor(arr)
        return np.asarray(ser, dtype=np.uint8) if len(ser) else np.empty(0, np.uint8)
    return arr if arr.flags.c_contiguous else np.ascontiguousarray(arr)


def encode_tensors(tensors):
    """Descriptors (JSON text) and the byte views of a list of pb_utils.Tensor."""
    descs, views, off = [], [], 0
    for t in tensors:
        arr = t._array
        data = tensor_bytes(t)
        n = data.nbytes
        descs.append(f'{{"name":{json_name(t._name)},"datatype":"{t._dtype}","shape":['
                     f'{",".join(map(str, arr.shape))}],"offset":{off},"size":{n}}}')
        views.append((off, data))
        off = (off + n + ALIGN - 1) // ALIGN * ALIGN
    return descs, views, off


def as_bytes(arr):
    """A C-contiguous array as a flat byte view (no copy)."""
    return memoryview(arr).cast("B") if arr.ndim else memoryview(arr.reshape(1)).cast("B")


_NUMPY_DTYPE = {n: np.dtype(t) for n, t in pb_utils._NAME_TO_NUMPY.items()
                if t is not None and t is not np.object_}
_NUMPY_DTYPE["BF16"] = np.dtype(np.uint16)


_NAMES = {}  # name bytes -> str (names repeat on every request)


def name_str(b):
    n = _NAMES.get(b)
    if n is None:
        n = b.decode("utf-8", errors="replace")
        if len(_NAMES) < 4096:
            _NAMES[b] = n
    return n


def parse_execute(meta):
    """The requests of a binary EXECUTE description: a list of
    (n_in..sender fields, id, corr, params, outputs, inputs) where inputs
    are (name, datatype, shape, offset, size)."""
    (n,) = U32.unpack_from(meta, 0)
    pos = 4
    out = []
    for _ in range(n):
        n_in, n_out, flags, id_len, corr_len, params_len, corr, timeout, sender = \
            EXEC_REQ.unpack_from(meta, pos)
        pos += EXEC_REQ.size
        rid = meta[pos:pos + id_len].decode("utf-8", errors="replace")
        pos += id_len
        if corr_len >= 0:
            corr = meta[pos:pos + corr_len].decode("utf-8", errors="replace")
            pos += corr_len
        params = meta[pos:pos + params_len]
        pos += params_len
        outputs = []
        for _ in range(n_out):
            (ln,) = U32.unpack_from(meta, pos)
            outputs.append(name_str(meta[pos + 4:pos + 4 + ln]))
            pos += 4 + ln
        inputs, pos = read_records(meta, pos, n_in)
        out.append((flags, rid, corr, timeout, sender, params, outputs, inputs))
    return out


def read_records(meta, pos, n):
    """n tensor records from meta[pos:]: a list of (name, datatype, shape,
    offset, size, where), and the position after them."""
    recs = []
    for _ in range(n):
        ln, dt, rank, where, off, size = TENSOR.unpack_from(meta, pos)
        pos += TENSOR.size
        shape = struct.unpack_from(f"<{rank}q", meta, pos) if rank else ()
        pos += 8 * rank
        recs.append((name_str(meta[pos:pos + ln]), DT_NAMES[dt], shape, off, size, where))
        pos += ln
    return recs, pos


def input_plan(inputs):
    """Tensor records as decode_inputs takes them: (name, datatype, numpy
    dtype (None: BYTES), shape, offset, size, body slot (-1: in the blob)),
    checked here once, and the end of the last one in the blob."""
    plan, end = [], 0
    for name, dt, shape, off, size, where in inputs:
        npdt = None
        if dt != "BYTES":
            npdt = _NUMPY_DTYPE[dt]
            count = 1
            for d in shape:
                count *= d
            if size // npdt.itemsize != count:
                raise ValueError(f"{size} bytes of {dt} do not make the shape {shape}")
        if BODY_WHERE <= where < BODY_WHERE + BODY_SLOTS:
            plan.append((name, dt, npdt, shape, off, size, where - BODY_WHERE))
        else:
            plan.append((name, dt, npdt, shape, off, size, -1))
            end = max(end, off + size)
    return plan, end


def decode_inputs(plan, blob, bodies=None, body_view=None):
    """The pb_utils.Tensor of each input_plan entry: numpy arrays over blob
    (no copy), BYTES deserialized. An input in a request body region views
    bodies[slot], a read-only uint8 array over that region's mapping made
    here by body_view(slot) for the first input there; every array of such
    an input keeps it alive, so whether it lives tells whether the model
    kept an input."""
    out = []
    for name, dt, npdt, shape, off, size, slot in plan:
        buf = blob
        if slot >= 0:
            buf = bodies.get(slot)
            if buf is None:
                buf = bodies[slot] = body_view(slot)
        if npdt is None:
            arr = pb_utils.deserialize_bytes_tensor(buf[off:off + size]).reshape(shape)
        else:
            arr = np.ndarray(shape, npdt, buf, off)
        # without the checks of Tensor's constructor (the server checked)
        t = object.__new__(pb_utils.Tensor)
        t._name, t._array, t._dtype = name, arr, dt
        out.append(t)
    return out


def tensor_records(tensors, region, off, recs, views, tail=None, cache=None, results=None,
                   bodies=None):
    """Appends to recs the binary records of tensors for a DONE, and to
    views their blob views from offset off; returns the blob's new end.
    region: (base address, length) of the server's EXECUTE region, or None:
    a large output lying in it (a view of an input) is referenced there
    instead of copied. tail: [memoryview of that region, first free offset,
    end], or None: a large numeric output is copied there, after the
    EXECUTE's payload, so the server can hand it to the reply as a view
    (it does not reuse a region a reply still reads); else into our DONE
    region. cache: a dict that keeps the record of a small numeric output by
    (name, datatype, shape, offset), or None. results: (spans, lent), spans
    the (base address, length) of the server's BLS_RESULT regions by slot
    (None: none there), or None: a large numeric output lying in one (a BLS
    result returned) is referenced there (where 2 + slot), its slot
    appended to the list lent. bodies: (slot, base address, length) of the
    request body regions the execute's inputs lie in, or None: a large
    output lying in one (a view of an input) is referenced there (where
    BODY_WHERE + slot)."""
    for t in tensors:
        arr = t._array
        if cache is not None and t._dtype != "BYTES":
            data = arr if arr.flags.c_contiguous else np.ascontiguousarray(arr)
            n = data.nbytes
            if n < ALIAS_MIN:
                key = (t._name, t._dtype, arr.shape, off)
                rec = cache.get(key)
                if rec is None:
                    rec = tensor_record(t._name, t._dtype, arr.shape, 0, off, n)
                    if len(cache) >= RECORDS_MAX:
                        cache.clear()
                    cache[key] = rec
                recs.append(rec)
                views.append((off, data))
                off = (off + n + ALIGN - 1) // ALIGN * ALIGN
                continue
        else:
            data = tensor_bytes(t)
            n = data.nbytes
        shape = arr.shape
        if region is not None and n >= ALIAS_MIN and data.dtype != np.object_:
            addr = data.__array_interface__["data"][0]
            if region[0] <= addr and addr + n <= region[0] + region[1]:
                recs.append(tensor_record(t._name, t._dtype, shape, 1, addr - region[0], n))
                continue
        if bodies and n >= ALIAS_MIN and data.dtype != np.object_ and t._dtype != "BYTES":
            addr = data.__array_interface__["data"][0]
            k = next((b for b in bodies if b[1] <= addr and addr + n <= b[1] + b[2]), None)
            if k is not None:
                recs.append(tensor_record(t._name, t._dtype, shape, BODY_WHERE + k[0],
                                          addr - k[1], n))
                continue
        if (results is not None and n >= ALIAS_MIN and data.dtype != np.object_ and
                t._dtype != "BYTES"):
            addr = data.__array_interface__["data"][0]
            spans = results[0]
            k = next((k for k, sp in enumerate(spans)
                      if sp is not None and sp[0] <= addr and addr + n <= sp[0] + sp[1]), -1)
            if k >= 0:
                recs.append(tensor_record(t._name, t._dtype, shape, 2 + k, addr - spans[k][0], n))
                results[1].append(k)
                continue
        if (tail is not None and n >= TAIL_MIN and data.dtype != np.object_ and
                t._dtype != "BYTES" and tail[1] + n <= tail[2]):
            pos = tail[1]
            tail[0][pos:pos + n] = as_bytes(data)
            tail[1] = (pos + n + ALIGN - 1) // ALIGN * ALIGN
            recs.append(tensor_record(t._name, t._dtype, shape, 1, pos, n))
            continue
        recs.append(tensor_record(t._name, t._dtype, shape, 0, off, n))
        views.append((off, data))
        off = (off + n + ALIGN - 1) // ALIGN * ALIGN
    return off


def tensor_record(name, dtype, shape, where, off, n):
    """One binary tensor record (python.c's layout)."""
    b = name.encode()
    return (TENSOR.pack(len(b), DT_CODES[dtype], len(shape), where, off, n) +
            struct.pack(f"<{len(shape)}q", *shape) + b)


def done_error(text):
    b = text.encode("utf-8", errors="replace")
    return U32.pack(DONE_ERROR) + U32.pack(len(b)) + b


def rescheduled(reqs):
    """Indices of the requests released with RESCHEDULE (decoupled DONE)."""
    return [i for i, q in enumerate(reqs)
            if q._release_flags == pb_utils.TRITONSERVER_REQUEST_RELEASE_RESCHEDULE]

def bls_call_parts(request, decoupled, region=None, bodies=None):
    """A BLS request's binary description (python.c, "BLS: a worker's
    request"), without its call id: (fixed fields, the rest), and the views
    and length of its blob. region: (base address, length) of the server's
    EXECUTE region while that execute is in flight, or None: a large numeric
    input lying in it (the model's own input) is referenced there (where 1)
    instead of copied. bodies: the same for the request body regions of
    that execute (tensor_records), where BODY_WHERE + slot."""
    model = request._model_name.encode()
    rid = request._request_id.encode()
    corr = request._correlation_id
    if isinstance(corr, str):
        cs = corr.encode()
        corr_len, corr = len(cs), 0
    else:
        cs, corr_len = b"", -1
    params = request._parameters
    params = b"" if params == "{}" else params.encode()
    parts = [model, rid, cs, params]
    for n in request._requested:
        b = n.encode()
        parts.append(U32.pack(len(b)))
        parts.append(b)
    views = []
    ins = request._inputs
    if (region is not None or bodies) and any(t._dtype == "BYTES" for t in ins):
        region = bodies = None  # the server copies BYTES and takes them from the blob only
    blob_len = tensor_records(ins, region, 0, parts, views, bodies=bodies)
    head = (request._model_version, corr & U64_MASK, request._timeout & U64_MASK,
            request._flags & 0xFFFFFFFF, 1 if decoupled else 0, corr_len, len(model), len(rid),
            len(params), len(request._requested), len(request._inputs))
    return head, b"".join(parts), views, blob_len


def bls_response(meta, blob, decoupled):
    """One BLS_RESULT message (its binary description and blob) as an
    InferenceResponse whose outputs are views of the blob (None: a
    flags-only final of a model that is not decoupled)."""
    _, status, _, code, elen, plen, n = BLS_RES.unpack_from(meta, 0)
    pos = BLS_RES.size
    if status == BLS_EMPTY:
        return pb_utils.InferenceResponse() if decoupled else None
    if status == BLS_ERROR:
        text = meta[pos:pos + elen].decode("utf-8", errors="replace")
        return pb_utils.InferenceResponse(error=pb_utils.TritonError(text, code))
    pos += elen
    params = meta[pos:pos + plen].decode("utf-8", errors="replace") if plen else "{}"
    outs, _ = read_records(meta, pos + plen, n)
    plan, end = input_plan(outs)
    if end > len(blob):
        raise pb_utils.TritonModelException("tensor outside its message")
    r = object.__new__(pb_utils.InferenceResponse)  # checked by the server
    r._outputs, r._error, r._parameters = decode_inputs(plan, blob), None, params
    return r


class BlsStream:
    """A decoupled BLS call in flight: its responses in order as they arrive
    (ResponseIterator reads them by index, waiting for the next), and
    cancel(), which asks the server to cancel the request."""

    def __init__(self, worker, head, rest, views, blob_len):
        self.w = worker
        self.got = []
        self.cid, self.slot = worker.register()
        try:
            worker.send_bls_call(self.cid, head, rest, views, blob_len)
        except BaseException:
            self.drop()
            raise

    def get(self, i):
        """Response i, or None after the last one."""
        while i >= len(self.got):
            slot = self.slot
            self.w.wait_for(lambda: len(slot[1]) > len(self.got) or slot[0])
            with self.w.cv:
                fresh = slot[1][len(self.got):]
            if not fresh:
                self.drop()
                return None
            self.got.extend(bls_response(res, blob, True) for res, blob in fresh)
        return self.got[i]

    def finished(self):
        """Whether the call has ended and every response it sent was read."""
        with self.w.cv:
            return bool(self.slot[0]) and len(self.slot[1]) == len(self.got)

    def cancel(self):
        with self.w.cv:
            live = not self.slot[0]
        if live:
            self.w.send(M_BLS_CANCEL, {"call": self.cid})

    def drop(self):
        with self.w.cv:
            self.w.pending.pop(self.cid, None)

    def __del__(self):
        try:
            self.drop()
        except Exception:
            pass


class Worker:
    def __init__(self, sock):
        self.sock = sock
        self.send_lock = threading.Lock()
        self.sent = 0  # messages sent (under send_lock)
        self.spin = None  # the server's word for self.sent (M_SPIN_PAGE), or None
        self.spin_s = 0.0  # spin-wait-us: how long the main thread polls for work
        self.last_wait = 0.0  # how long it last waited for a message (s)
        self.spin_caught = 0  # messages its spin found (no sleep, no wake-up)
        self.spin_hint = None  # the server's word: may we spin after this execute (µs)
        self.spin_skip = 0  # requests left that do not spin (back-off)
        self.spin_n = 0  # spins begun
        self.spin_stopped = 0  # spins stopped because another thread wanted a CPU
        self.loadavg_fd = -1  # /proc/loadavg, for the machine's runnable threads
        self.work = collections.deque()
        self.pending = {}  # call id -> [done, results]
        self.cv = threading.Condition()  # guards work, pending, reading, n_waiting
        self.reading = False
        self.n_waiting = 0  # threads in wait_for waiting for the reader
        self.next_id = 1
        self.model = None
        self.model_dir = ""
        self.instance = ""
        self.decoupled = False
        self.initialized = False  # BLS is allowed from initialize's end to finalize's start
        self.finalizing = False
        self.bg_loop = None
        self.rx_map = None  # the server's region for EXECUTE inputs
        # slot -> (mapping, (address, length), memoryview) of the server's regions
        self.rx_slots = {}
        self.rx_used = None  # end of the last EXECUTE in rx_map (aligned), None: it was inline
        self.rx_region = None  # its (address, length), for outputs that are views of inputs
        self.rx_view = None  # a memoryview of rx_map
        self.rx_base = 0  # where the last region EXECUTE's blob starts in rx_map
        # the last region EXECUTE's numeric inputs: id(array) -> (array, offset
        # in rx_map, bytes), for simple_done (None: inline, decoupled, or off)
        self.rx_views = None
        # the thread running a (non-decoupled) execute that came in the
        # server's region, until the execute returns; else None (BLS inputs
        # by reference)
        self.exec_ident = None
        self.view_records = {}  # DONE records of outputs that are input views (fast path)
        # request body regions (python.c, "Request bodies"): the server's
        # read-only mappings by slot (memoryviews), the uint8 arrays over
        # them that the execute in flight's inputs view (slot, weak
        # reference), and those of earlier executes that may still live (a
        # model kept an input): each DONE tells the server which slots we
        # may still read, so it does not reuse them
        self.body_maps = [None] * BODY_SLOTS
        self.body_exec = []
        self.body_live = []
        self.tx_map = None  # ours for DONE outputs (sealed against shrinking)
        # BLS regions (python.c, "BLS regions"; all under cv but the mapping
        # a reader adds): our BLS_CALL regions by slot and whether a call in
        # flight uses each; the server's BLS_RESULT regions by slot, whether
        # a call in flight may write each, and weak references to the
        # arrays (every result array is a view of one) that still view each
        self.bls_in = [None] * BLS_SLOTS
        self.bls_in_busy = [False] * BLS_SLOTS
        self.bls_out = [None] * BLS_SLOTS
        # (base address, length) of each bls_out mapping: a DONE output that
        # is a view of a BLS result there is referenced (where 2 + slot)
        self.bls_out_span = [None] * BLS_SLOTS
        # slots the last DONE referenced: offered last (a reply may still
        # read them; the server would then make a new region)
        self.bls_lent = ()
        self.bls_out_busy = [False] * BLS_SLOTS
        self.bls_out_refs = [[] for _ in range(BLS_SLOTS)]
        self.bls_calls = {}  # call id -> (BLS_CALL slot, reply slot), until its final result
        self.req_proto = None
        self.plans = {}  # EXECUTE description -> request_plans() (fast path)
        self.records = {}  # DONE tensor records (fast path; see tensor_records)
        self.ready_q = None  # is_ready() queries for the readiness thread
        self._loop = None  # made on first use: most models never need one
        # processes the model forks (multiprocessing's fork start method):
        # see after_fork_child
        self.forked = False
        self.fork_lock = -1  # a memfd they take turns on (POSIX record lock)
        self.fork_turns = 0  # this process's calls holding the turn
        self.fork_turn_lock = threading.Lock()

    @property
    def loop(self):
        if self._loop is None:
            self._loop = asyncio.new_event_loop()
        return self._loop

    # ---- transport ----
    def send(self, mtype, obj, tensors=(), region=False):
        """Sends obj (a dict, or its JSON text) with tensors in the blob."""
        descs, views, blob_len = encode_tensors(tensors)
        js = obj if isinstance(obj, str) else json.dumps(obj)
        if descs:
            js = f'{js[:-1]}{"," if len(js) > 2 else ""}"tensors":[{",".join(descs)}]}}'
        self.send_parts(mtype, js.encode(), views, blob_len, region)

    def send_done(self, meta, views=(), blob_len=0):
        """A DONE: its binary description, tensors in our region; the body
        slots we hold in bits 16-23 of its kind."""
        if self.body_exec or self.body_live:
            meta = U32.pack(U32.unpack_from(meta, 0)[0] | self.body_holds() << 16) + meta[4:]
        self.send_parts(M_DONE, meta, views, blob_len, True)

    def body_holds(self):
        """The body slots the execute just answered read (held until a later
        DONE leaves them out), and those an array of an earlier execute
        still views."""
        live = [b for b in self.body_live if b[1]() is not None]
        mask = 0
        for slot, _ in live:
            mask |= 1 << slot
        for slot, _ in self.body_exec:
            mask |= 1 << slot
        self.body_live = live + self.body_exec
        self.body_exec = []
        return mask

    def exec_bodies(self):
        """(slot, base address, length) of the request body regions the
        execute in flight's inputs are in, or None."""
        if not self.body_exec:
            return None
        return [(slot, h.__array_interface__["data"][0], h.nbytes)
                for slot, h in ((slot, ref()) for slot, ref in self.body_exec) if h is not None]

    def body_view(self, slot):
        """A new read-only uint8 array over body region slot (the inputs of
        one request view it)."""
        mv = self.body_maps[slot]
        if mv is None:
            raise ValueError(f"an input in request body slot {slot}, never sent")
        return np.frombuffer(mv, np.uint8)

    def map_body(self, slot, fds):
        """M_BODY_MAP: the server's new request body region for slot (our
        old mapping lives on in the arrays that view it)."""
        try:
            if not fds or slot >= BODY_SLOTS:
                raise ValueError("a request body region without its memfd")
            size = os.fstat(fds[0]).st_size
            self.body_maps[slot] = memoryview(mmap.mmap(fds[0], size, prot=mmap.PROT_READ))
        finally:
            for f in fds:
                os.close(f)

    def send_parts(self, mtype, js, views, blob_len, region):
        total = len(js) + blob_len
        if HDR.size + total <= INLINE_MAX:
            # one datagram gathered from the pieces: no copy into a buffer here
            parts = [HDR.pack(mtype, len(js), blob_len), js]
            pos = 0
            for off, data in views:
                if off > pos:
                    parts.append(ZEROS[:off - pos])
                parts.append(data)  # a C-contiguous array: sendmsg reads its buffer
                pos = off + data.nbytes
            if blob_len > pos:
                parts.append(ZEROS[:blob_len - pos])
            lock = self.send_lock  # not `with`: a fifth of a microsecond less
            lock.acquire()
            try:
                self.sendmsg(parts)
            finally:
                lock.release()
            return
        if region:
            return self.send_region(mtype, js, views, blob_len)
        fd = os.memfd_create("nereid-python", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
        try:
            os.ftruncate(fd, total)
            with mmap.mmap(fd, total) as mm:
                populate(mm, MADV_POPULATE_WRITE)
                fill_region(mm, js, views)
            fcntl.fcntl(fd, fcntl.F_ADD_SEALS,
                        fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW | fcntl.F_SEAL_SEAL)
            with self.send_lock:
                self.sendmsg([HDR.pack(mtype, len(js), blob_len)],
                                  [(socket.SOL_SOCKET, socket.SCM_RIGHTS,
                                    array.array("i", [fd]))])
        finally:
            os.close(fd)

    def sendmsg(self, *args):
        """sock.sendmsg, then the count in the server's word (send_lock held):
        a server thread spinning for our answer sees it without a wake-up."""
        self.sock.sendmsg(*args)
        self.sent += 1
        if self.spin is not None:
            U64.pack_into(self.spin, 0, self.sent)

    def send_region(self, mtype, js, views, blob_len):
        total = len(js) + blob_len
        fd = -1
        if self.tx_map is None or len(self.tx_map) < total:
            size = max(total, 1 << 20, 2 * len(self.tx_map) if self.tx_map else 0)
            fd, mm = new_region(size)
            if self.tx_map is not None:
                self.tx_map.close()
            self.tx_map = mm
        self.send_in_region(self.tx_map, fd, mtype | M_REGION, js, views, blob_len)

    def send_in_region(self, mm, fd, mtype, js, views, blob_len):
        """Writes a message at the start of region mm and sends its header,
        with fd (the region's memfd, closed here) when the server has not
        got it yet (-1 otherwise)."""
        try:
            fill_region(mm, js, views)
            anc = [] if fd < 0 else [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", [fd]))]
            with self.send_lock:
                self.sendmsg([HDR.pack(mtype, len(js), blob_len)], anc)
        finally:
            if fd >= 0:
                os.close(fd)

    def recv(self, spin=False):
        # a fresh bytes object per datagram: the arrays of an execute are
        # views of it and outlive the next recv
        if spin:
            data, anc = self.spin_recv()
        else:
            data, anc, _, _ = self.sock.recvmsg(RECV_MAX, CMSG_FD_SPACE)
        n = len(data)
        if n == 0:
            return None
        if not anc and n >= HDR.size:  # the common case: a whole message inline
            mtype, jlen, blen = HDR.unpack_from(data, 0)
            if mtype & ~M_SLOT_MASK == M_EXECUTE | M_REGION:
                # the common large one: in a region we have mapped
                slot = self.rx_slots.get(mtype >> M_SLOT_SHIFT & 0xF)
                if slot is not None:
                    if slot[0] is not self.rx_map:
                        self.rx_map, self.rx_region, self.rx_view = slot
                    mv = self.rx_view
                    self.rx_used = (jlen + blen + ALIGN - 1) // ALIGN * ALIGN
                    self.rx_base = jlen
                    return M_EXECUTE, bytes(mv[:jlen]), mv[jlen:jlen + blen]
            if not mtype & M_REGION:
                end = HDR.size + jlen
                if mtype == M_EXECUTE or mtype == M_BLS_RESULT:  # binary
                    if mtype == M_EXECUTE:  # parsed by build_requests
                        self.rx_used = None
                    return mtype, data[HDR.size:end], memoryview(data)[end:end + blen]
                return (mtype, json.loads(str(data[HDR.size:end], "utf-8")),
                        memoryview(data)[end:end + blen])
        fds = []
        for level, kind, cdata in anc:
            if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
                fds.extend(array.array("i", cdata[:len(cdata) - len(cdata) % 4]))
        mtype, jlen, blen = HDR.unpack_from(data, 0)
        in_region = mtype & M_REGION
        slot_no = (mtype & M_SLOT_MASK) >> M_SLOT_SHIFT
        mtype &= ~(M_REGION | M_SLOT_MASK)
        if mtype == M_BODY_MAP:
            self.map_body(slot_no, fds)
            return self.recv()
        if in_region and mtype == M_BLS_RESULT:
            return self.recv_bls_result(slot_no, fds, data, jlen, blen)
        if in_region and fds:
            # A new region of the server's (it switches between a few: one
            # a reply still reads is not written), kept in its slot: later
            # EXECUTEs name the slot only.
            fd = fds[0]
            try:
                mm = mmap.mmap(fd, os.fstat(fd).st_size)
            finally:
                for f in fds:
                    os.close(f)
            self.rx_slots[slot_no] = (mm, (np.frombuffer(mm, np.uint8, 1).ctypes.data, len(mm)),
                                      memoryview(mm))
            self.rx_map, self.rx_region, self.rx_view = self.rx_slots[slot_no]
            payload = self.rx_view
        elif in_region:
            slot = self.rx_slots.get(slot_no)
            if slot is None:
                raise ValueError(f"a message in region slot {slot_no}, never sent")
            self.rx_map, self.rx_region, self.rx_view = slot
            payload = self.rx_view
        elif fds:
            fd = fds[0]
            try:
                size = os.fstat(fd).st_size
                mm = mmap.mmap(fd, size) if size else b""
                if size:
                    populate(mm, MADV_POPULATE_READ)
            finally:
                for f in fds:
                    os.close(f)
            payload = memoryview(mm)
        else:
            payload = memoryview(data)[HDR.size:]
        meta = bytes(payload[:jlen])
        obj = meta if mtype == M_EXECUTE or mtype == M_BLS_RESULT else json.loads(meta)
        if mtype == M_EXECUTE:
            self.rx_used = ((jlen + blen + ALIGN - 1) // ALIGN * ALIGN) if in_region else None
            self.rx_base = jlen
        return mtype, obj, payload[jlen:jlen + blen]

    def recv_bls_result(self, slot_no, fds, data, jlen, blen):
        """A BLS_RESULT in the server's region slot_no (a new one when a memfd
        comes along): after the header, the offsets of its blob and of its
        description there (the blob first when the called model wrote its
        outputs in place, python.c "BLS results in place"). Its blob is an
        array over the region that every output array views; while one of
        them lives, the slot is not offered to the server again (bls_slots)."""
        if fds:
            try:
                mm = mmap.mmap(fds[0], os.fstat(fds[0]).st_size)
            finally:
                for f in fds:
                    os.close(f)
            if slot_no < BLS_SLOTS:
                self.bls_out[slot_no] = mm  # the old one lives on in its arrays
                self.bls_out_span[slot_no] = (np.frombuffer(mm, np.uint8, 1).ctypes.data,
                                              len(mm))
        mm = self.bls_out[slot_no] if slot_no < BLS_SLOTS else None
        if mm is None or len(data) != HDR.size + 16:
            raise ValueError(f"a BLS result in region slot {slot_no}, never sent")
        blob_off, meta_off = BLS_OFFSETS.unpack_from(data, HDR.size)
        if blob_off + blen > len(mm) or meta_off + jlen > len(mm):
            raise ValueError("a BLS result outside its region")
        meta = mm[meta_off:meta_off + jlen]
        blob = np.frombuffer(mm, np.uint8, blen, blob_off)
        self.bls_out_refs[slot_no].append(weakref.ref(blob))
        return M_BLS_RESULT, meta, blob

    def bls_slots(self, cid, region_bytes):
        """Takes the slots of BLS call cid (cv held): (our BLS_CALL region,
        the server's reply region), each -1 when none is free; region_bytes:
        the message's size when it leaves the datagram, else 0."""
        in_slot = out_slot = -1
        if self.forked:
            return in_slot, out_slot
        if region_bytes and region_bytes <= BLS_REGION_MAX:
            for k in range(BLS_SLOTS):
                if not self.bls_in_busy[k]:
                    in_slot = k
                    self.bls_in_busy[k] = True
                    break
        lent = self.bls_lent
        for k in [k for k in range(BLS_SLOTS) if k not in lent] + list(lent):
            if not self.bls_out_busy[k]:
                refs = self.bls_out_refs[k]
                if refs:
                    refs[:] = [r for r in refs if r() is not None]
                if not refs:
                    out_slot = k
                    self.bls_out_busy[k] = True
                    break
        if in_slot >= 0 or out_slot >= 0:
            self.bls_calls[cid] = (in_slot, out_slot)
        return in_slot, out_slot

    def bls_release(self, cid):
        """Frees the slots of call cid (cv held): its final result came, or
        it was never sent."""
        slots = self.bls_calls.pop(cid, None)
        if slots is not None:
            if slots[0] >= 0:
                self.bls_in_busy[slots[0]] = False
            if slots[1] >= 0:
                self.bls_out_busy[slots[1]] = False

    def send_bls_call(self, cid, head, rest, views, blob_len):
        """Registers BLS call cid and sends it: in our BLS_CALL region when
        one is free and the message leaves the datagram. The slot it
        answers in (pending) is the caller's."""
        js_len = BLS_CALL.size + len(rest)
        total = js_len + blob_len
        with self.cv:
            in_slot, out_slot = self.bls_slots(
                cid, total if HDR.size + total > INLINE_MAX else 0)
        js = BLS_CALL.pack(cid, *head, out_slot) + rest
        try:
            if in_slot < 0 or not self.send_bls_region(in_slot, js, views, blob_len):
                self.send_parts(M_BLS_CALL, js, views, blob_len, False)
        except BaseException:
            with self.cv:
                self.bls_release(cid)
            raise

    def send_bls_region(self, k, js, views, blob_len):
        """Writes a BLS_CALL at the start of our region k (a new one, its
        memfd sent along, when there is none or it is too small) and sends
        its header; False when a new region would pass BLS_BUDGET."""
        total = len(js) + blob_len
        mm, fd = self.bls_in[k], -1
        if mm is None or len(mm) < total:
            size = min(max(1 << 20, 2 * total), BLS_REGION_MAX)
            with self.cv:
                used = sum(len(m) for m in self.bls_in if m is not None)
            if used - (len(mm) if mm is not None else 0) + size > BLS_BUDGET:
                return False
            fd, mm = new_region(size)
            populate(mm, MADV_POPULATE_WRITE)
            old, self.bls_in[k] = self.bls_in[k], mm
            if old is not None:
                old.close()
        self.send_in_region(mm, fd, M_BLS_CALL | M_REGION | k << M_SLOT_SHIFT, js, views,
                            blob_len)
        return True

    def wait_for(self, ready):
        """Returns when ready() is true. Whichever waiting thread finds nobody
        reading the socket reads it (leader/follower): the main thread waiting
        for work, or a thread waiting for its BLS result, so an EXECUTE reaches
        the main thread without a hop through another thread."""
        with self.cv:
            while not ready():
                if self.reading:
                    self.n_waiting += 1
                    try:
                        self.cv.wait()
                    finally:
                        self.n_waiting -= 1
                    continue
                self.reading = True
                self.cv.release()
                try:
                    msg = self.recv()
                except OSError:
                    msg = None
                finally:
                    self.cv.acquire()
                    self.reading = False
                if msg is None:  # the server is gone (or closed our socket)
                    os._exit(0)
                self.dispatch(msg)

    def dispatch(self, msg):
        """Puts a message where its reader finds it (cv held): an answer in
        its call's slot, work in the main thread's queue; wakes the waiters
        (one of them reads next)."""
        mtype, obj, blob = msg
        if mtype == M_BLS_RESULT:
            cid, _, final = BLS_RES.unpack_from(obj, 0)[:3]
            slot = self.pending.get(cid)
            if slot is not None:
                slot[1].append((obj, blob))
                if final:
                    slot[0] = True
            if final and self.bls_calls:
                self.bls_release(cid)
        elif mtype in (M_CANCEL_ANSWER, M_API_ANSWER):
            slot = self.pending.get(obj.get("id"))
            if slot is not None:
                slot[1].append((obj, blob))
                slot[0] = True
        elif mtype == M_READY_QUERY:  # on its own thread: executes go on
            self.ready_query()
        elif mtype == M_SPIN_PAGE:
            self.spin_s = min(max(float(obj.get("spin_us", 0)), 0.0), 10000.0) / 1e6
            if self.spin_s and self.loadavg_fd < 0:
                try:
                    self.loadavg_fd = os.open("/proc/loadavg", os.O_RDONLY | os.O_CLOEXEC)
                except OSError:
                    pass
            with self.send_lock:
                self.spin = blob[0:8]
                self.spin_hint = blob[8:16] if len(blob) >= 16 else None
                U64.pack_into(self.spin, 0, self.sent)
        else:
            self.work.append(msg)
        self.cv.notify_all()

    def spin_hint_us(self):
        """The server's hint for the execute it sent last: how long (µs) we
        may spin for the next one after answering it (0: not at all)."""
        return U64.unpack_from(self.spin_hint, 0)[0] if self.spin_hint is not None else 0

    def others_runnable(self):
        """Whether threads wait for a CPU: more are runnable on the machine
        (the 4th field of /proc/loadavg, this one included) than it has
        CPUs plus two (two are tolerated: along the request's own path the
        client, the server's thread and this spin overlap for a few µs;
        with one, the spin lost most of its gain at 1 connection:
        docs/performance.md, "Merged main, session 12"). Then a spin takes
        a CPU that others want. ~3 µs."""
        try:
            return int(os.pread(self.loadavg_fd, 64, 0).split()[3].split(b"/")[0]) > N_CPUS + 2
        except (OSError, ValueError, IndexError):
            return False

    def spin_recv(self):
        """spin-wait-us on the worker's side: the main thread polls for its
        next message before it blocks, so a request that follows soon finds
        it awake (no wake-up of a sleeping process; on this 2-vCPU VM a
        wake-up is ~20 µs of latency). It spins at most the server's hint
        for the execute it answered (python.c, spin_hint_set: 0 unless that
        was the only Python execute in flight), only while messages keep
        coming within that (its last wait was shorter), and stops when
        another thread wants a CPU: a gap between two polls (it lost its
        CPU: this spin ends), or threads waiting for a CPU on two checks in
        a row (others_runnable: no spin for the next SPIN_BACKOFF
        requests)."""
        sock, clock = self.sock, time.monotonic
        t0 = now = clock()
        wait = min(self.spin_s, self.spin_hint_us() / 1e6)
        if self.last_wait > wait:
            wait = 0.0
        if self.spin_skip:
            self.spin_skip -= 1
            wait = 0.0
        until = t0 + wait
        self.spin_n += wait > 0
        check = self.loadavg_fd >= 0
        polls = busy = 0
        while now < until:
            try:
                data, anc, _, _ = sock.recvmsg(RECV_MAX, CMSG_FD_SPACE, socket.MSG_DONTWAIT)
                self.last_wait = clock() - t0
                self.spin_caught += 1
                return data, anc
            except BlockingIOError:
                pass
            polls += 1
            if check and polls % 2 == 0:
                busy = busy + 1 if self.others_runnable() else 0
            t = clock()
            if busy >= SPIN_BUSY_CHECKS:  # others wait for a CPU: back off
                self.spin_skip = SPIN_BACKOFF
                self.spin_stopped += 1
                break
            if t - now > SPIN_PREEMPTED_S:  # lost the CPU once: stop this spin only
                self.spin_stopped += 1
                break
            now = t
        data, anc, _, _ = sock.recvmsg(RECV_MAX, CMSG_FD_SPACE)
        self.last_wait = clock() - t0
        return data, anc

    def next_work(self):
        """The main thread's next message (INIT, EXECUTE, FINALIZE). The
        fast path: with nothing queued and no other thread reading or
        waiting to, the main thread reads the socket itself and keeps an
        EXECUTE without queueing it or waking anyone; any other message, or
        another thread waiting, takes the leader/follower way (wait_for)."""
        cv = self.cv
        if FAST_PATH:
            cv.acquire()
            if self.work or self.reading or self.n_waiting:
                cv.release()
            else:
                self.reading = True
                cv.release()
                try:
                    msg = self.recv(self.spin_s > 0)
                except OSError:
                    msg = None
                cv.acquire()
                self.reading = False
                if msg is None:  # the server is gone (or closed our socket)
                    os._exit(0)
                if msg[0] in (M_EXECUTE, M_INIT, M_FINALIZE):
                    if self.n_waiting:  # one of them reads next
                        cv.notify_all()
                    cv.release()
                    return msg
                self.dispatch(msg)
                cv.release()
        self.wait_for(self.has_work)
        with cv:
            return self.work.popleft()

    def has_work(self):
        return bool(self.work)

    def watch_parent(self):
        """Exits when the server dies (or drops us), even while the model is
        busy: the socket hangs up when the server's end closes. Blocks in
        poll, so an idle worker is never woken."""
        p = select.poll()
        p.register(self.sock.fileno(), 0)  # POLLHUP and POLLERR are always reported
        while True:
            if p.poll():
                os._exit(0)

    def register(self):
        """A new call id and the slot its answers arrive in."""
        slot = [False, []]
        with self.cv:
            cid = self.next_id
            self.next_id += 1
            self.pending[cid] = slot
        return cid, slot

    # ---- processes the model forks ----
    # A model may fork (multiprocessing.Pool with the fork start method,
    # Triton's L0_backend_python bls test_multiprocess) and make BLS calls
    # from the children. Each child has a copy of this Worker and the same
    # socket to the server. Left alone, the children would read each other's
    # answers off that socket (and wait forever for the one a sibling took),
    # number their calls alike and write into the same regions. So a child
    # starts with fresh locks, call ids of its own (its pid in the high
    # bits), no regions (its calls and their results travel inline or in
    # memfds of their own) and no inputs by reference; and the children
    # take turns: a child holds a POSIX record lock on a memfd the parent
    # made before the first fork from its call's send to its last answer,
    # so one child at a time reads the socket. The parent itself is meant
    # to wait for them (pool.map in execute): a thread of the parent
    # reading the socket meanwhile could still take a child's answer.

    def before_fork(self):
        """In the process about to fork: the turn lock's memfd, made once."""
        if self.fork_lock < 0:
            try:
                self.fork_lock = os.memfd_create("nereid-python-forks", os.MFD_CLOEXEC)
            except OSError:
                pass

    def after_fork_child(self):
        """In a process the model forked (see above)."""
        self.forked = True
        self.send_lock = threading.Lock()
        self.cv = threading.Condition()
        self.fork_turn_lock = threading.Lock()
        self.fork_turns = 0
        self.reading = False
        self.n_waiting = 0
        self.pending = {}
        self.work = collections.deque()
        self.next_id = (os.getpid() << 32) + 1
        self.spin = None  # the server's word for the parent's messages
        self.spin_s = 0.0
        self.exec_ident = None
        self.bls_calls = {}

    def fork_turn(self, take):
        """A forked child's turn on the socket (take) or its end; nested
        and concurrent calls of one process share one turn."""
        if not self.forked or self.fork_lock < 0:
            return
        with self.fork_turn_lock:
            if take:
                if self.fork_turns == 0:
                    fcntl.lockf(self.fork_lock, fcntl.LOCK_EX)
                self.fork_turns += 1
            else:
                self.fork_turns -= 1
                if self.fork_turns == 0:
                    fcntl.lockf(self.fork_lock, fcntl.LOCK_UN)

    def call(self, mtype, obj, tensors=()):
        if self.forked:
            self.fork_turn(True)
            try:
                return self.call_now(mtype, obj, tensors)
            finally:
                self.fork_turn(False)
        return self.call_now(mtype, obj, tensors)

    def call_now(self, mtype, obj, tensors=()):
        cid, slot = self.register()
        obj["id"] = cid
        try:
            self.send(mtype, obj, tensors)
            self.wait_for(lambda: slot[0])
        finally:
            with self.cv:
                del self.pending[cid]
        return slot[1]

    # ---- services for pb_utils ----
    def log(self, level, message, filename, line):
        self.send(M_LOG, {"level": level, "message": message, "file": filename, "line": line})

    def is_cancelled(self, token):
        res = self.call(M_CANCEL_QUERY, {"token": token})
        return bool(res[0][0].get("cancelled"))

    def api(self, obj, tensors=()):
        """A metric or model control call; the answer, or TritonModelException."""
        res = self.call(M_API_CALL, obj, tensors)[0][0]
        err = res.get("error")
        if err:
            raise pb_utils.TritonModelException(err["message"])
        return res

    def api_noreply(self, obj):
        """A metric update the server cannot refuse: sent, not answered."""
        obj["noreply"] = True
        self.send(M_API_CALL, obj)

    def send_response(self, sender_id, response, flags, requested):
        obj = {"sender": sender_id, "flags": flags}
        tensors = []
        if response is not None:
            if response.has_error():
                obj["error"] = {"message": response.error().message(),
                                "code": response.error().code()}
            else:
                tensors = [t for t in response.output_tensors() if t.name() in requested]
                if response._parameters != "{}":
                    obj["parameters"] = json.loads(response._parameters)
        else:
            obj["empty"] = True
        self.send(M_RESPONSE, obj, tensors)

    def bls(self, request, decoupled):
        if not self.forked:
            return self.bls_now(request, decoupled)
        self.fork_turn(True)
        try:
            res = self.bls_now(request, decoupled)
            if decoupled:  # every response read before the turn ends
                stream, i = res._stream, 0
                while stream.get(i) is not None:
                    i += 1
            return res
        finally:
            self.fork_turn(False)

    def bls_now(self, request, decoupled):
        # Triton's rule: BLS from the end of initialize to the start of
        # finalize (a decoupled model's threads and async execute included)
        if not self.initialized or self.finalizing:
            raise pb_utils.TritonModelException(
                "BLS is only supported during the 'execute' function.")
        # Inputs by reference only from the thread running execute, before
        # its DONE: the server holds the region for the call, and refuses a
        # reference after DONE (a thread may outlive execute: it copies).
        region = bodies = None
        if threading.get_ident() == self.exec_ident:
            # the EXECUTE region only when this execute came in it
            region = self.rx_region if self.rx_used is not None else None
            bodies = self.exec_bodies()
        head, rest, views, blob_len = bls_call_parts(request, decoupled, region, bodies)
        if decoupled:
            # Responses reach the iterator as they arrive; the call returns
            # once the first came, as Triton's: async_exec() then waits in
            # its executor thread, not in the event loop's next(), so other
            # coroutines of an async execute run meanwhile.
            stream = BlsStream(self, head, rest, views, blob_len)
            stream.get(0)
            return pb_utils.ResponseIterator(stream)
        cid, slot = self.register()
        try:
            self.send_bls_call(cid, head, rest, views, blob_len)
            self.wait_for(lambda: slot[0])
        finally:
            with self.cv:
                del self.pending[cid]
        results = slot[1]
        responses = [r for r in (bls_response(res, blob, False) for res, blob in results) if r]
        return responses[0] if responses else pb_utils.InferenceResponse(
            error=pb_utils.TritonError("BLS call ended without a response"))

    # ---- the model's life ----
    def load_model(self, obj):
        path = obj["model_file"]
        if not os.path.isfile(path):
            raise FileNotFoundError(f"Python model file not found in '{path}'")
        version_dir = os.path.dirname(path)
        model_dir = os.path.dirname(version_dir)
        # Triton's get_model_dir(): the directory of the version's model file
        self.model_dir = obj.get("model_dir") or version_dir
        for p in (version_dir, model_dir):
            if p not in sys.path:
                sys.path.append(p)
        stem = os.path.splitext(os.path.basename(path))[0]
        module = importlib.import_module(f"{os.path.basename(version_dir)}.{stem}")
        return module.TritonPythonModel

    def handle_init(self, obj):
        self.instance = obj.get("instance", "")
        self.decoupled = bool(obj.get("decoupled"))
        try:
            cls = self.load_model(obj)
            if obj.get("auto_complete"):
                config = None
                if hasattr(cls, "auto_complete_config"):
                    res = cls.auto_complete_config(pb_utils.ModelConfig(obj["config"]))
                    if not isinstance(res, pb_utils.ModelConfig):
                        raise pb_utils.TritonModelException(
                            f"auto_complete_config function in model '{obj['args']['model_name']}'"
                            " must return a valid pb.ModelConfig object.")
                    config = res.as_dict()
                self.send(M_READY, {"config": config})
                return
            self.model = cls()
            if hasattr(self.model, "initialize"):
                r = self.model.initialize(obj["args"])
                if inspect.iscoroutine(r):
                    self.loop.run_until_complete(r)
            self.initialized = True
            has_is_ready = callable(getattr(self.model, "is_ready", None))
            if inspect.iscoroutinefunction(getattr(self.model, "execute", None)):
                self.bg_loop = asyncio.new_event_loop()
                threading.Thread(target=self.bg_loop.run_forever, daemon=True).start()
            self.send(M_READY, {"is_ready": True} if has_is_ready else {})
        except BaseException as e:  # noqa: B902 - SystemExit from model code included
            self.send(M_READY, {"error": error_text(e)})

    def request_plans(self, meta):
        """What build_requests needs of an EXECUTE description, per request:
        the attributes of its InferenceRequest but the inputs, its
        input_plan and the end of its inputs in the blob."""
        if self.req_proto is None:  # the attributes of a request, set below or defaults
            self.req_proto = pb_utils.InferenceRequest("", [], []).__dict__
        plans = []
        for i, (flags, rid, corr, timeout, sender, params, outputs, ins) in enumerate(
                parse_execute(meta)):
            attrs = dict(self.req_proto)
            attrs["_requested"] = outputs
            attrs["_request_id"] = rid
            attrs["_correlation_id"] = corr
            attrs["_flags"] = flags
            attrs["_timeout"] = timeout
            # the server's compact JSON text of a non-empty parameter object
            attrs["_parameters"] = params.decode() if params else "{}"
            if self.decoupled:
                attrs["_sender_id"] = sender
                attrs["_token"] = {"sender": sender}
            else:
                attrs["_token"] = {"request": i}
            plan, end = input_plan(ins)
            plans.append((attrs, plan, end))
        return plans

    def build_requests(self, meta, blob):
        """The InferenceRequests of an EXECUTE. Fast path: a description
        seen before (the same requests' names, shapes and fields; a
        decoupled model's never repeat, each has its sender) is not parsed
        again."""
        entry = self.plans.get(meta) if FAST_PATH else None
        if entry is None:
            plans = self.request_plans(meta)
            body = any(p[6] >= 0 for _, plan, _ in plans for p in plan)
            entry = (plans, body)
            if FAST_PATH and not self.decoupled:
                if len(self.plans) >= PLANS_MAX:
                    self.plans.clear()
                self.plans[meta] = entry
        plans, body = entry
        reqs = []
        # the inputs' places in our region or a request body region, so
        # that simple_done can answer with where=1 (or BODY_WHERE + slot)
        # records for outputs that are these very arrays
        views = ({} if FAST_PATH and (self.rx_used is not None or body) and not self.decoupled
                 else None)
        self.rx_views = views
        base = self.rx_base
        for attrs, plan, end in plans:
            if end > len(blob):
                raise pb_utils.TritonModelException("tensor outside its message")
            if body:
                bodies = {}
                inputs = decode_inputs(plan, blob, bodies, self.body_view)
                for slot, h in bodies.items():
                    self.body_exec.append((slot, weakref.ref(h)))
            else:
                inputs = decode_inputs(plan, blob)
            if views is not None:
                for t, p in zip(inputs, plan):
                    if p[2] is not None:  # numeric (a BYTES input is deserialized)
                        if p[6] >= 0:
                            views[id(t._array)] = (t._array, p[4], p[5], BODY_WHERE + p[6])
                        else:
                            views[id(t._array)] = (t._array, base + p[4], p[5], 1)
            if self.decoupled:  # kept past execute: not views of the reused region
                for t in inputs:
                    if t._array.dtype != np.object_:
                        t._array = t._array.copy()
            req = object.__new__(pb_utils.InferenceRequest)
            d = req.__dict__
            d.update(attrs)
            d["_inputs"] = inputs
            reqs.append(req)
        return reqs

    def execute_decoupled(self, reqs):
        def close_all(e):
            text = (f"Failed to process the request(s) for model '{self.instance}', "
                    f"message: {error_text(e)}")
            for q in reqs:
                q.get_response_sender()._close_with_error(pb_utils.TritonError(text))

        try:
            res = self.model.execute(reqs)
            if inspect.iscoroutine(res):
                fut = asyncio.run_coroutine_threadsafe(res, self.bg_loop)

                def done(f):
                    if f.exception() is not None:
                        traceback.print_exception(f.exception())
                fut.add_done_callback(done)
                res = None
            if res is not None:
                close_all(pb_utils.TritonModelException(
                    f"Python model '{self.instance}' is using the decoupled mode and the "
                    "execute function must return None."))
        except Exception as e:
            close_all(e)
        again = rescheduled(reqs)
        self.send_done(U32.pack(DONE_DECOUPLED) + U32.pack(len(again)) +
                       struct.pack(f"<{len(again)}I", *again))

    def handle_execute(self, obj, blob):
        reqs = self.build_requests(obj, blob)
        if self.decoupled:
            return self.execute_decoupled(reqs)
        try:
            if (self.rx_used is not None or self.body_exec) and BLS_BY_REF:
                self.exec_ident = threading.get_ident()
            try:
                res = self.model.execute(reqs)
                if isinstance(res, types.CoroutineType):  # inspect.iscoroutine
                    if self.bg_loop is not None:  # tasks it starts keep running after it
                        res = asyncio.run_coroutine_threadsafe(res, self.bg_loop).result()
                    else:
                        res = self.loop.run_until_complete(res)
            finally:
                self.exec_ident = None
            for q in reqs:
                if q._sender is not None:  # the model took a response sender
                    res = self.collect_sent(reqs, res)
                    break
        except Exception as e:
            text = (f"Failed to process the request(s) for model '{self.instance}', "
                    f"message: {error_text(e)}")
            if not self.answer_sent(reqs, text):
                self.send_done(done_error(text))
            return
        if FAST_PATH and type(res) is list and len(res) == len(reqs):
            done = self.simple_done(reqs, res)
            if done is not None:
                return self.send_done(*done)
        err = None
        if not isinstance(res, list):
            err = f"Expected a list in the execute return, found type '{type(res)}'."
        elif len(res) != len(reqs):
            err = ("Number of InferenceResponse objects do not match the number of "
                   f"InferenceRequest objects. InferenceRequest(s) size is:{len(reqs)}, and "
                   f"InferenceResponse(s) size is:{len(res)}")
        else:
            for q, r in zip(reqs, res):
                if q._release_flags == RELEASE_RESCHEDULE:
                    if r is None:
                        continue
                    # Triton's check: the request is not rescheduled, all fail
                    err = ("Expected a None object in the execute function return list for "
                           f"reschduled request, found type '{type(r)}'.")
                    break
                if not isinstance(r, pb_utils.InferenceResponse):
                    err = ("Expected an 'InferenceResponse' object in the execute function "
                           f"return list, found type '{type(r)}'.")
                    break
        if err:
            self.send_done(done_error(err))
            return
        self.send_responses(reqs, res)

    def simple_done(self, reqs, res):
        """The fast path's DONE for the common answer: what send_responses
        would send, built without its checks and branches, when every
        response is a plain InferenceResponse without error or parameters,
        every request is released (not rescheduled) and each output is
        requested, C-contiguous and, after an inline EXECUTE, has a remembered
        record (send_responses made it the first time); after an EXECUTE in
        the server's region, each output must be one of the input arrays
        themselves (of ALIAS_MIN bytes or more), answered with a where=1
        record of its place there. None otherwise, and the general path
        answers."""
        inputs = self.rx_views
        self.rx_views = None  # the arrays are not kept past this answer
        if self.rx_used is not None and inputs is None:
            return None
        try:
            out, views, off = [DONE_HEAD.pack(DONE_RESPONSES, len(reqs))], [], 0
            records = self.records
            view_records = self.view_records
            for q, r in zip(reqs, res):
                if (type(r) is not pb_utils.InferenceResponse or r._error is not None or
                        r._parameters != "{}" or q._release_flags != RELEASE_ALL):
                    return None
                outs = r._outputs
                requested = q._requested
                out.append(DONE_RESP.pack(RESP_OUTPUTS, len(outs), 0, 0, 0))
                for t in outs:
                    a = t._array
                    if inputs is not None:
                        v = inputs.get(id(a))
                        if v is None or v[0] is not a or t._name not in requested:
                            return None
                        key = (t._name, t._dtype, a.shape, v[1], v[3])
                        rec = view_records.get(key)
                        if rec is None:
                            if v[2] < ALIAS_MIN:
                                return None
                            rec = tensor_record(t._name, t._dtype, a.shape, v[3], v[1], v[2])
                            if len(view_records) >= RECORDS_MAX:
                                view_records.clear()
                            view_records[key] = rec
                        out.append(rec)
                        continue
                    rec = records.get((t._name, t._dtype, a.shape, off))
                    if rec is None or t._name not in requested or not a.flags.c_contiguous:
                        return None
                    out.append(rec)
                    views.append((off, a))
                    off = (off + a.nbytes + ALIGN - 1) // ALIGN * ALIGN
        except Exception:  # whatever is odd about it, send_responses says
            return None
        return b"".join(out), views, off

    def send_responses(self, reqs, res):
        """DONE with one response per request (binary records, outputs in
        the region); a response that cannot be written fails them all."""
        try:
            out, views, off = [DONE_HEAD.pack(DONE_RESPONSES, len(reqs))], [], 0
            # Only an EXECUTE that came in the server's region tells which
            # region the server reads DONE's where=1 records from (after an
            # inline one it may have switched regions without telling us).
            region = tail = None
            if self.rx_used is not None:
                region = self.rx_region
                tail = [memoryview(self.rx_map), self.rx_used, len(self.rx_map)]
            records = self.records if FAST_PATH else None
            results = (list(self.bls_out_span), []) if BLS_BY_REF else None
            bodies = self.exec_bodies()
            for req, resp in zip(reqs, res):
                if req._release_flags == RELEASE_RESCHEDULE:
                    out.append(DONE_RESP.pack(RESP_RESCHEDULE, 0, 0, 0, 0))  # response dropped
                    continue
                e = resp._error  # the attributes, as Triton's stub reads the C++ object's
                if e is not None:
                    text = str(e.message()).encode("utf-8", errors="replace")
                    out.append(DONE_RESP.pack(RESP_ERROR, 0, 0, e.code(), len(text)))
                    out.append(text)
                    continue
                requested = req._requested
                mine = resp._outputs
                if len(mine) != 1 or mine[0]._name not in requested:
                    mine = [t for t in mine if t._name in requested]
                params = resp._parameters.encode() if resp._parameters != "{}" else b""
                out.append(DONE_RESP.pack(RESP_OUTPUTS, len(mine), len(params), 0, 0))
                out.append(params)
                off = tensor_records(mine, region, off, out, views, tail, records, results,
                                     bodies)
            if results is not None and (results[1] or self.bls_lent):
                with self.cv:
                    self.bls_lent = tuple(set(results[1]))
            self.send_done(b"".join(out), views, off)
        except Exception as e:  # e.g. a BYTES element that cannot be encoded
            self.send_done(done_error(f"Failed to process the request(s) for model "
                                      f"'{self.instance}', message: {error_text(e)}"))

    def ready_query(self):
        """Runs is_ready() on the worker's readiness thread (started on the
        first query; the server has one query in flight at a time)."""
        if self.ready_q is None:
            self.ready_q = queue.SimpleQueue()
            threading.Thread(target=self.ready_loop, daemon=True).start()
        self.ready_q.put(None)

    def ready_loop(self):
        while True:
            self.ready_q.get()
            self.answer_ready()

    def answer_ready(self):
        """The model's is_ready() for a model-ready check (Triton's rules: a
        bool, or not ready with the exception's text)."""
        try:
            r = self.model.is_ready()
            if inspect.iscoroutine(r):
                r = asyncio.new_event_loop().run_until_complete(r)
            if not isinstance(r, bool):
                raise pb_utils.TritonModelException("is_ready() must return a boolean value")
            ans = {"ready": r}
        except pb_utils.TritonModelException as e:
            ans = {"error": str(e)}
        except Exception as e:
            ans = {"error": f"{type(e).__name__}: {e}"}
        self.send(M_READY_ANSWER, ans)

    # ---- response senders of a model that is not decoupled ----
    def sender_progress(self):
        """A sender got a response or its final flag: wake collect_sent."""
        with self.cv:
            self.cv.notify_all()

    def collect_sent(self, reqs, res):
        """execute's return with the senders' responses put in: an entry
        (or the whole return) None for a request whose sender was taken is
        that sender's response, waited for until its final flag (the model
        may send from another thread after execute returned). Triton's
        errors for a request answered twice."""
        senders = [r._sender for r in reqs]
        if not any(senders):
            return res
        if res is None:
            res = [None] * len(reqs)
        if not isinstance(res, list) or len(res) != len(reqs):
            return res  # refused by the checks after this
        for s, r in zip(senders, res):
            if s is not None and r is not None and not s._answered():
                raise pb_utils.TritonModelException(
                    "Unable to send response. Non-decoupled model cannot send more than one "
                    "response.")
        waiting = [s for q, s, r in zip(reqs, senders, res) if s is not None and r is None and
                   q._release_flags != pb_utils.TRITONSERVER_REQUEST_RELEASE_RESCHEDULE]
        # not as the socket's reader: the final flag comes from a model
        # thread, not in a message (that thread reads for its own BLS calls)
        with self.cv:
            while not all(s._closed for s in waiting):
                self.cv.wait()
        for i, s in enumerate(senders):
            if s is not None:
                s._close()
                if res[i] is None and s._response is not None:
                    res[i] = s._response
        return res

    def answer_sent(self, reqs, text):
        """execute failed: requests whose sender already sent a response get
        it, the others the error (Triton drops the error of a request that
        was answered). False when no sender sent anything."""
        senders = [r._sender for r in reqs]
        for s in senders:
            if s is not None:
                s._close()
        if not any(s is not None and s._response is not None for s in senders):
            return False
        err = pb_utils.InferenceResponse(error=pb_utils.TritonError(text))
        res = [s._response if s is not None and s._response is not None else err
               for s in senders]
        self.send_responses(reqs, res)
        return True

    def handle_finalize(self):
        self.finalizing = True
        if self.bg_loop is not None:
            self.bg_loop.call_soon_threadsafe(self.bg_loop.stop)
        if self.model is not None and hasattr(self.model, "finalize"):
            try:
                r = self.model.finalize()
                if inspect.iscoroutine(r):
                    self.loop.run_until_complete(r)
            except Exception as e:
                print(error_text(e), file=sys.stderr, flush=True)
        self.send(M_FINALIZED, {})

    def run(self, watch=True):
        # A worker forked by the zygote needs no watcher: it dies with the
        # zygote (PR_SET_PDEATHSIG), which exits when the server's end of
        # its control socket closes; and the server kills a worker whose
        # socket it drops. A thread less to start per worker.
        if watch:
            threading.Thread(target=self.watch_parent, daemon=True).start()
        while True:
            mtype, obj, blob = self.next_work()
            if mtype == M_INIT:
                self.handle_init(obj)
            elif mtype == M_EXECUTE:
                self.handle_execute(obj, blob)
            elif mtype == M_FINALIZE:
                self.handle_finalize()
                sys.stdout.flush()
                sys.stderr.flush()
                os._exit(0)


def _skip_signal(signum, frame):
    """SIGINT and SIGTERM in a worker: nothing (see worker_main)."""


def worker_main(forked=False):
    # Shutdown is driven by the server (finalize, then the socket closes):
    # SIGINT and SIGTERM do nothing, as in Triton's stub (whose handler
    # skips them). A handler, not SIG_IGN: a program the model starts
    # (subprocess) gets the default actions back at exec, as under Triton,
    # where an ignored SIGTERM would be inherited and Popen.terminate()
    # would not end it. The server blocks both in its threads (it waits
    # for them with sigtimedwait) and the mask survives posix_spawn, fork
    # and exec: unblocked here, so those programs start with Triton's.
    signal.signal(signal.SIGINT, _skip_signal)
    signal.signal(signal.SIGTERM, _skip_signal)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT, signal.SIGTERM})
    os.set_inheritable(3, False)  # programs the model starts must not hold our socket
    # Triton's stub embeds Python with an empty argv: model code that parses
    # it (unittest.main() in Triton's QA models) must not see our arguments
    sys.argv = [""]
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET, fileno=3)
    w = Worker(sock)
    pb_utils._worker = w
    os.register_at_fork(before=w.before_fork, after_in_child=w.after_fork_child)
    w.run(watch=not forked)


def cmdline_room():
    """Where this process's command line after its third argument (the
    script) lies: (address, length), or None. A forked child has the same
    addresses, so the zygote finds them once."""
    import ctypes
    try:
        with open("/proc/self/stat", "rb") as f:
            fields = f.read().rsplit(b")", 1)[1].split()
        start, end = int(fields[45]), int(fields[46])  # arg_start, arg_end
        area = ctypes.string_at(start, end - start)
        at = 0
        for _ in range(3):  # interpreter, -u, script
            at = area.index(b"\0", at) + 1
        return start + at, end - start - at
    except (OSError, ValueError, IndexError):
        return None  # only the name shown by ps is at stake


def set_cmdline(room, tail):
    """Rewrites the command line after the script (room: cmdline_room())
    with tail, as a spawned worker's reads ('... nereid_python_stub.py
    triton_python_backend_stub <instance>', what pgrep -f looks for). The
    zygote's command line ends in a blank argument that makes room; a tail
    longer than the room is cut."""
    if room is None:
        return
    import ctypes
    at, size = room
    new = b"\0".join(a.encode(errors="replace") for a in tail)[:size - 1]
    ctypes.memmove(at, new + bytes(size - len(new)), size)


# ---- Pre-faulting ----
# A forked worker writes a few hundred pages it shares with the zygote
# (reference counts, allocator pools, interpreter state) and reads code pages
# that fork does not map for it; every one of them is a page fault, which
# costs tens of microseconds on virtual machines that trap each one (25-60
# us on the project's 2-core test machine). The zygote learns once,
# from a probe child that starts a worker on a tiny model, which pages a
# worker touches; each later child has the kernel copy or map them in one
# madvise(MADV_POPULATE_WRITE / _READ) per run of pages instead of one fault
# per page (Linux 5.14; on older kernels madvise fails and nothing changes).
PM_PRESENT, PM_FILE, PM_EXCLUSIVE = 1 << 63, 1 << 61, 1 << 56
MADV_POPULATE_READ, MADV_POPULATE_WRITE = 22, 23
PREFAULT_GAP = 0  # runs this many pages apart are made one madvise
PROBE_WAIT_S = 10
KERNEL_MAPS = ("[vvar]", "[vvar_vclock]", "[vdso]", "[vsyscall]")


def private_maps():
    """This process's private readable mappings: (start, end, writable)."""
    out = []
    with open("/proc/self/maps") as f:
        for line in f:
            fields = line.split()
            perms = fields[1]
            if perms[0] != "r" or perms[3] != "p" or fields[-1] in KERNEL_MAPS:
                continue
            start, end = (int(x, 16) for x in fields[0].split("-"))
            out.append((start, end, perms[1] == "w"))
    return out


def touched_ranges(pid, maps):
    """The runs of pages of this process's mappings (maps) that its child
    pid made its own (written: anonymous and mapped only there) or mapped
    to read (file pages present), as (address, length, advice). Plain
    Python on the raw entries: numpy here would touch more pages than it
    saves time."""
    page = mmap.PAGESIZE
    fd = os.open(f"/proc/{pid}/pagemap", os.O_RDONLY)
    try:
        raw = [os.pread(fd, (end - start) // page * 8, start // page * 8)
               for start, end, _ in maps]
    finally:
        os.close(fd)
    written = PM_PRESENT | PM_EXCLUSIVE
    ranges = []
    for (start, _end, writable), data in zip(maps, raw):
        mask, want = (PM_PRESENT | PM_FILE | PM_EXCLUSIVE, written) if writable else (
            PM_PRESENT, PM_PRESENT)
        advice = MADV_POPULATE_WRITE if writable else MADV_POPULATE_READ
        first = last = -1
        for i, e in enumerate(array.array("Q", data)):
            if e & mask != want:
                continue
            if i - last > PREFAULT_GAP + 1 and first >= 0:
                ranges.append((start + first * page, (last - first + 1) * page, advice))
                first = -1
            if first < 0:
                first = i
            last = i
        if first >= 0:
            ranges.append((start + first * page, (last - first + 1) * page, advice))
    return ranges


PROBE_MODEL = "nereid_python_probe_model.py"


def probe_child(out, prctl):
    """The probe: a worker started as a forked one is (zygote_main), fed an
    INIT for the probe model through a socket pair. Then writes a byte to
    out and waits to be killed: the zygote reads what it touched."""
    prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    try:
        os.close(3)  # the server's control socket is the zygote's alone
    except OSError:
        pass
    gc.enable()
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    server, sock = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    w = Worker(sock)
    pb_utils._worker = w
    here = os.path.dirname(os.path.abspath(__file__))
    cfg = {"name": "nereid_probe", "backend": "python", "max_batch_size": 0}
    init = json.dumps({
        "model_file": os.path.join(here, PROBE_MODEL), "instance": "nereid_probe_0",
        "decoupled": False, "auto_complete": False, "config": cfg, "model_dir": here,
        "args": {"model_config": json.dumps(cfg), "model_instance_kind": "CPU",
                 "model_instance_name": "nereid_probe_0", "model_instance_device_id": "0",
                 "model_repository": here, "model_version": "1", "model_name": "nereid_probe"},
    }).encode()
    server.sendmsg([HDR.pack(M_INIT, len(init), 0), init])
    w.wait_for(lambda: w.work)
    _mtype, obj, _blob = w.work.popleft()
    w.handle_init(obj)
    server.recv(RECV_MAX)
    os.write(out, b"1")
    select.select([], [], [], PROBE_WAIT_S)


def learn_prefault(prctl):
    """Forks the probe and returns the ranges it touched, or [] when it
    fails (children then take their faults one by one, as before)."""
    try:
        maps = private_maps()
        r, w = os.pipe()
    except OSError:
        return []
    gc.freeze()
    try:
        pid = os.fork()
    except OSError:
        os.close(r)
        os.close(w)
        return []
    if pid == 0:
        try:
            os.close(r)
            probe_child(w, prctl)
        finally:
            os._exit(0)
    os.close(w)
    try:
        if not select.select([r], [], [], PROBE_WAIT_S)[0] or os.read(r, 1) != b"1":
            return []
        return touched_ranges(pid, maps)
    except OSError:
        return []
    finally:
        os.close(r)
        try:
            os.kill(pid, signal.SIGKILL)  # ours and not reaped yet: the pid is its
            os.waitpid(pid, 0)  # reaped here: its CPU time counts as the zygote's children's
        except OSError:
            pass


def zygote_main():
    """The pre-started worker: numpy and pb_utils are imported once, then
    each FORK request (the instance name, with the worker's socket end as
    SCM_RIGHTS) forks a child that becomes that instance's worker. The answer
    is the child's pid (4 bytes, little endian) with a pidfd for it, through
    which the server signals and watches the child. Children are reaped by
    the kernel (SIGCHLD ignored here) and die with the zygote
    (PR_SET_PDEATHSIG). Single-threaded, so fork is safe;
    exits when the server closes the control socket (fd 3)."""
    global _prefault
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    os.set_inheritable(3, False)
    import ctypes
    libc = ctypes.CDLL(None, use_errno=True)
    prctl = libc.prctl  # looked up once: a child only calls it
    room = cmdline_room()
    # Nothing here becomes garbage; frozen objects are never touched by a
    # child's collector, so their pages stay shared (no copy-on-write).
    gc.disable()
    if os.environ.get("NEREID_PYTHON_PREFAULT", "1") != "0":
        ranges = learn_prefault(prctl)
        if ranges:
            madvise = libc.madvise
            madvise.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int)
            _prefault = (madvise, ranges)
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # workers are reaped by the kernel
    ctl = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET, fileno=3)
    while True:
        try:
            data, anc, _, _ = ctl.recvmsg(4096, socket.CMSG_SPACE(4 * 4))
        except OSError:
            os._exit(0)
        if not data and not anc:
            os._exit(0)
        fds = []
        for level, kind, d in anc:
            if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
                fds.extend(array.array("i", d[:len(d) - len(d) % 4]))
        pid, pidfd = -1, -1
        if len(fds) == 1:
            gc.freeze()
            zygote = os.getpid()
            pid = os.fork()
            if pid == 0:
                try:
                    # Dies with the zygote: killing the server's child
                    # processes ends every worker, as with spawned ones.
                    prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
                    if os.getppid() != zygote:
                        os._exit(1)
                    gc.enable()
                    ctl.close()
                    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
                    os.dup2(fds[0], 3)
                    os.close(fds[0])
                    sys.argv[1:] = ["triton_python_backend_stub",
                                    data.decode(errors="replace")]
                    set_cmdline(room, sys.argv[1:])
                    worker_main(forked=True)
                finally:
                    os._exit(1)
            try:
                pidfd = os.pidfd_open(pid)
            except OSError:  # it already ended
                pid = -1
        for f in fds:
            os.close(f)
        try:
            ctl.sendmsg([struct.pack("<i", pid)],
                        [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", [pidfd]))]
                        if pidfd >= 0 else [])
        except OSError:
            os._exit(0)
        finally:
            if pidfd >= 0:
                os.close(pidfd)


def main():
    if sys.argv[1:2] == ["nereid_python_zygote"]:
        zygote_main()
    else:
        worker_main()


if __name__ == "__main__":
    main()
