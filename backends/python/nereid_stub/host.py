"""The model host: a Worker runs one model instance's model.py — INIT
(initialize, auto_complete_config), EXECUTE (requests built from the
description, the model's responses sent back as one DONE, or as RESPONSE
messages for a decoupled model), is_ready() and FINALIZE — on top of the
socket (channel.Channel) and BLS (bls.BlsClient). worker_main is a worker
process's start."""
import collections
import importlib
import inspect
import json
import mmap
import os
import queue
import signal
import socket
import struct
import sys
import threading
import traceback
import types
import weakref

import numpy as np
import triton_python_backend_utils as pb_utils

import nereid_stub
from nereid_stub.wire import (ALIAS_MIN, ALIGN, BLS_SLOTS, BODY_SLOTS, BODY_WHERE, DONE_DECOUPLED,
                              DONE_HEAD, DONE_RESP, DONE_RESPONSES, M_EXECUTE, M_FINALIZE,
                              M_FINALIZED, M_INIT, M_READY, M_READY_ANSWER, M_RESPONSE,
                              RECORDS_MAX, RESP_ERROR, RESP_OUTPUTS, RESP_RESCHEDULE, U32,
                              decode_inputs, done_error, error_text, input_plan, parse_execute,
                              tensor_record, tensor_records)
from nereid_stub.bls import BlsClient
from nereid_stub.channel import Channel

PLANS_MAX = 256  # EXECUTE descriptions remembered (all forgotten when full)
# simple_done's fixed pieces, packed once: a DONE's head for n responses and
# a response's head for k outputs, n, k < HEADS_MADE
HEADS_MADE = 16
DONE_HEADS = [DONE_HEAD.pack(DONE_RESPONSES, n) for n in range(HEADS_MADE)]
RESP_HEADS = [DONE_RESP.pack(RESP_OUTPUTS, k, 0, 0, 0) for k in range(HEADS_MADE)]
RELEASE_ALL, RELEASE_RESCHEDULE = 1, 2  # pb_utils.TRITONSERVER_REQUEST_RELEASE_*


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


def rescheduled(reqs):
    """Indices of the requests released with RESCHEDULE (decoupled DONE)."""
    return [i for i, q in enumerate(reqs)
            if q._release_flags == pb_utils.TRITONSERVER_REQUEST_RELEASE_RESCHEDULE]


class Worker(Channel, BlsClient):
    """One model instance's worker: its state, and the model's side of
    every message (INIT, EXECUTE, FINALIZE, is_ready(), decoupled
    responses)."""

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
        # request body regions (python_body.c, "Request bodies"): the server's
        # read-only mappings by slot (memoryviews), the uint8 arrays over
        # them that the execute in flight's inputs view (slot, weak
        # reference), and those of earlier executes that may still live (a
        # model kept an input): each DONE tells the server which slots we
        # may still read, so it does not reuse them
        self.body_maps = [None] * BODY_SLOTS
        self.body_exec = []
        self.body_live = []
        self.tx_map = None  # ours for DONE outputs (sealed against shrinking)
        # BLS regions (python_bls.c, "BLS regions"; all under cv but the mapping
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
        entry = self.plans.get(meta) if nereid_stub.FAST_PATH else None
        if entry is None:
            plans = self.request_plans(meta)
            body = any(p[6] >= 0 for _, plan, _ in plans for p in plan)
            entry = (plans, body)
            if nereid_stub.FAST_PATH and not self.decoupled:
                if len(self.plans) >= PLANS_MAX:
                    self.plans.clear()
                self.plans[meta] = entry
        plans, body = entry
        reqs = []
        # the inputs' places in our region or a request body region, so
        # that simple_done can answer with where=1 (or BODY_WHERE + slot)
        # records for outputs that are these very arrays
        views = ({} if nereid_stub.FAST_PATH and (self.rx_used is not None or body)
                 and not self.decoupled else None)
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
            if (self.rx_used is not None or self.body_exec) and nereid_stub.BLS_BY_REF:
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
        if nereid_stub.FAST_PATH and type(res) is list and len(res) == len(reqs):
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
        record of its place there. An output that is a BLS result (a view of
        the server's BLS_RESULT region in slot k, ALIAS_MIN bytes or more,
        C-contiguous) is answered with a where 2 + k record, as
        tensor_records would. None otherwise, and the general path
        answers."""
        inputs = self.rx_views
        self.rx_views = None  # the arrays are not kept past this answer
        if self.rx_used is not None and inputs is None:
            return None
        try:
            n = len(reqs)
            out = [DONE_HEADS[n] if n < HEADS_MADE else DONE_HEAD.pack(DONE_RESPONSES, n)]
            views, off = [], 0
            records = self.records
            view_records = self.view_records
            lent = None  # BLS result slots the DONE references (None: none so far)
            for q, r in zip(reqs, res):
                if (type(r) is not pb_utils.InferenceResponse or r._error is not None or
                        r._parameters != "{}" or q._release_flags != RELEASE_ALL):
                    return None
                outs = r._outputs
                requested = q._requested
                k = len(outs)
                out.append(RESP_HEADS[k] if k < HEADS_MADE else
                           DONE_RESP.pack(RESP_OUTPUTS, k, 0, 0, 0))
                for t in outs:
                    a = t._array
                    v = inputs.get(id(a)) if inputs is not None else None
                    if v is None and a.nbytes >= ALIAS_MIN:
                        rec = self.result_record(t, a, requested)
                        if rec is not None:
                            out.append(rec[0])
                            if lent is None:
                                lent = set()
                            lent.add(rec[1])
                            continue
                    if inputs is not None:
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
        if lent is not None or self.bls_lent:  # as send_responses
            with self.cv:
                self.bls_lent = tuple(lent) if lent is not None else ()
        return b"".join(out), views, off

    def result_record(self, t, a, requested):
        """simple_done's record of an output that is a BLS result: (where
        2 + k record, k) when a (requested, numeric, C-contiguous) lies in
        the server's BLS_RESULT region that slot k maps now, else None."""
        spans = self.bls_out_span
        if (not nereid_stub.BLS_BY_REF or spans.count(None) == BLS_SLOTS or
                t._dtype == "BYTES" or a.dtype == np.object_ or not a.flags.c_contiguous or
                t._name not in requested):
            return None
        n = a.nbytes
        addr = a.__array_interface__["data"][0]
        k = 0
        for sp in spans:
            if sp is not None and sp[0] <= addr and addr + n <= sp[0] + sp[1]:
                key = (t._name, t._dtype, a.shape, addr - sp[0], 2 + k)
                rec = self.view_records.get(key)
                if rec is None:
                    rec = tensor_record(t._name, t._dtype, a.shape, 2 + k, addr - sp[0], n)
                    if len(self.view_records) >= RECORDS_MAX:
                        self.view_records.clear()
                    self.view_records[key] = rec
                return rec, k
            k += 1
        return None

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
            records = self.records if nereid_stub.FAST_PATH else None
            results = (list(self.bls_out_span), []) if nereid_stub.BLS_BY_REF else None
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
