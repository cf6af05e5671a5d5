"""BLS from the worker: a pb_utils.InferenceRequest.exec() becomes a
BLS_CALL (its description and inputs, in a region of ours when large) and
its BLS_RESULTs become InferenceResponses (arrays that view the server's
region; the slot stays taken while any of them lives). A decoupled call's
responses arrive in a BlsStream. The server's side is python_bls.c."""
import mmap
import os
import threading
import weakref

import numpy as np
import triton_python_backend_utils as pb_utils

from nereid_stub.wire import (BLS_BUDGET, BLS_CALL, BLS_EMPTY, BLS_ERROR, BLS_OFFSETS,
                              BLS_REGION_MAX, BLS_RES, BLS_SLOTS, HDR, INLINE_MAX,
                              MADV_POPULATE_WRITE, M_BLS_CALL, M_BLS_CANCEL, M_BLS_RESULT,
                              M_REGION, M_SLOT_SHIFT, U32, U64_MASK, decode_inputs, input_plan,
                              new_region, populate, read_records, tensor_records)

_NOT_KNOWN = (None,)  # bls_now: an input that is none of the execute's own


def bls_call_parts(request, decoupled, region=None, bodies=None, known=None):
    """A BLS request's binary description (python_wire.h, "BLS_CALL and BLS_RESULT
    request"), without its call id: (fixed fields, the rest), and the views
    and length of its blob. region: (base address, length) of the server's
    EXECUTE region while that execute is in flight, or None: a large numeric
    input lying in it (the model's own input) is referenced there (where 1)
    instead of copied. bodies: the same for the request body regions of
    that execute (tensor_records), where BODY_WHERE + slot. known: that
    execute's own numeric inputs by id (Worker.rx_views), or None: an input
    that is one of those arrays is referenced where it is known to lie."""
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
    if (region is not None or bodies or known) and any(t._dtype == "BYTES" for t in ins):
        region = bodies = known = None  # the server copies BYTES and takes them from the blob only
    blob_len = tensor_records(ins, region, 0, parts, views, bodies=bodies, known=known)
    head = (request._model_version, corr & U64_MASK, request._timeout & U64_MASK,
            request._flags & 0xFFFFFFFF, 1 if decoupled else 0, corr_len, len(model), len(rid),
            len(params), len(request._requested), len(request._inputs))
    return head, b"".join(parts), views, blob_len


# BLS_RESULT descriptions seen before, but for their call id (the first
# field): (parameters, input_plan's plan, its end). Calls that repeat (the
# same model, outputs, shapes and places in the region) are not parsed again.
_RES_PLANS = {}
RES_PLANS_MAX = 256  # all forgotten when full
BLS_CID_BYTES = 8


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
    key = meta[BLS_CID_BYTES:]  # what the plan depends on: all but the call id
    got = _RES_PLANS.get(key)
    if got is None:
        pos += elen
        params = meta[pos:pos + plen].decode("utf-8", errors="replace") if plen else "{}"
        outs, _ = read_records(meta, pos + plen, n)
        got = (params,) + input_plan(outs)
        if len(_RES_PLANS) >= RES_PLANS_MAX:
            _RES_PLANS.clear()
        _RES_PLANS[key] = got
    params, plan, end = got
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


class BlsClient:
    """The Worker's BLS calls: their regions in both directions, sending a
    BLS_CALL and receiving its BLS_RESULTs."""

    def recv_bls_result(self, slot_no, fds, data, jlen, blen):
        """A BLS_RESULT in the server's region slot_no (a new one when a memfd
        comes along): after the header, the offsets of its blob and of its
        description there (the blob first when the called model wrote its
        outputs in place, python_bls.c "BLS results in place"). Its blob is an
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
        region = bodies = known = None
        if threading.get_ident() == self.exec_ident:
            # the EXECUTE region only when this execute came in it
            region = self.rx_region if self.rx_used is not None else None
            # the execute's own inputs given on as they are (the common
            # case: inputs=request.inputs()) are referenced where they are
            # known to lie; the regions' spans only for any other input
            known = self.rx_views
            if not known or any(known.get(id(t._array), _NOT_KNOWN)[0] is not t._array
                                for t in request._inputs):
                bodies = self.exec_bodies()
        head, rest, views, blob_len = bls_call_parts(request, decoupled, region, bodies, known)
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
