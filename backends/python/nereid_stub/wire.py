"""The worker's side of the wire format: message types, sizes, region
slots and the binary layouts of EXECUTE, DONE, BLS_CALL and BLS_RESULT, as
backends/python/python_wire.h defines them (test_python_wire_sync fails
when the two differ), and the codec: tensors to bytes and records, an
EXECUTE's description to requests and inputs, DONE records (see
tensor_records for which outputs are referenced where they lie)."""
import fcntl
import json
import mmap
import os
import socket
import struct
import traceback

import numpy as np
import triton_python_backend_utils as pb_utils


HDR = struct.Struct("<IIQ")
# EXECUTE and DONE describe their tensors in binary (python_wire.h, "Binary
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
INLINE_MAX = 60 * 1024  # a whole message up to this size travels in the datagram
RECV_MAX = 64 * 1024
ALIGN = 64
ZEROS = bytes(ALIGN)  # padding between tensors (always < ALIGN bytes)
M_REGION = 0x80000000  # payload in the sender's persistent region (EXECUTE, DONE)
# An EXECUTE in a region names it by a slot in these bits of its type
# (python_wire.h's M_SLOT_SHIFT); a memfd sent with a slot replaces its mapping.
M_SLOT_SHIFT, M_SLOT_MASK = 16, 0xF << 16
# BLS messages past INLINE_MAX travel in persistent regions named by slot
# (python_bls.c, "BLS regions"): ours for BLS_CALL, the server's for BLS_RESULT
BLS_SLOTS = 8
BLS_REGION_MAX = 16 << 20  # a larger message travels in a memfd of its own
BLS_BUDGET = 64 << 20  # our BLS_CALL regions together, at most
RECORDS_MAX = 1024  # DONE tensor records remembered (likewise)

# C -> worker
M_INIT, M_EXECUTE, M_FINALIZE, M_BLS_RESULT, M_CANCEL_ANSWER = 1, 2, 3, 4, 5
M_READY_QUERY, M_READY_ANSWER = 6, 122  # the model's is_ready(): query, answer
M_SPIN_PAGE = 7  # a shared word: how many messages we sent (python_spin.c)
# A request body region's memfd for a slot (python_body.c, "Request bodies"): the
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
                   bodies=None, known=None):
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
    BODY_WHERE + slot). known: id(array) -> (array, offset, bytes, where) of
    the execute in flight's own numeric inputs (Worker.rx_views), or None:
    a large tensor that is one of those very arrays is referenced at its
    known place (where 1 or BODY_WHERE + slot) without its address being
    looked up."""
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
        if known is not None and n >= ALIAS_MIN:
            v = known.get(id(data))
            if v is not None and v[0] is data:
                recs.append(tensor_record(t._name, t._dtype, shape, v[3], v[1], n))
                continue
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
    """One binary tensor record (python_wire.h's layout)."""
    b = name.encode()
    return (TENSOR.pack(len(b), DT_CODES[dtype], len(shape), where, off, n) +
            struct.pack(f"<{len(shape)}q", *shape) + b)


def done_error(text):
    b = text.encode("utf-8", errors="replace")
    return U32.pack(DONE_ERROR) + U32.pack(len(b)) + b
