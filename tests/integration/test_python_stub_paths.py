"""The Python worker's fast path against its general path.

A worker (build/backends/python/'s nereid_stub package) runs on a socket
pair with bench/bench_python_stub.py playing the server; the same messages
go to one worker with the fast path (nereid_stub.FAST_PATH: the main
thread reads its EXECUTE itself, EXECUTE descriptions and DONE records
remembered) and to one without it. Every answer must be the same bytes, and
right: the fast path may only skip work, never change an answer.
"""
import json
import os
import struct
import sys

import numpy as np
import pytest

from conftest import BUILD

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__)))), "bench"))
import bench_python_stub as wire  # noqa: E402

STUB_DIR = os.path.join(BUILD, "backends", "python")
M_CANCEL_ANSWER, M_RESPONSE, M_CANCEL_QUERY = 5, 104, 106

# Echoes its first input as OUTPUT0 and what it saw of each request as INFO
# (BYTES JSON); inputs named RAISE, WRONG, ERR, BG and JOIN make it fail,
# answer the wrong number of responses, answer an error, start a thread
# that asks whether its request is cancelled, and join that thread.
MODEL = '''
import json, threading, time
import numpy as np
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def initialize(self, args):
        self.bg, self.bg_said = None, None

    def ask(self, request):
        time.sleep(0.05)  # the main thread is back reading by then (either way works)
        self.bg_said = request.is_cancelled()

    def execute(self, requests):
        out = []
        for r in requests:
            names = [t.name() for t in r.inputs()]
            if "RAISE" in names:
                raise ValueError("asked to raise")
            if "WRONG" in names:
                return []
            if "ERR" in names:
                out.append(pb_utils.InferenceResponse(
                    error=pb_utils.TritonError("asked to fail", pb_utils.TritonError.INVALID_ARG)))
                continue
            if "BG" in names:
                self.bg = threading.Thread(target=self.ask, args=(r,))
                self.bg.start()
            if "JOIN" in names:
                self.bg.join()
            info = {"id": r.request_id(), "corr": r.correlation_id(), "flags": r.flags(),
                    "timeout": r.timeout(), "params": r.parameters(),
                    "requested": sorted(r.requested_output_names()), "bg": self.bg_said,
                    "inputs": [[t.name(), t.triton_dtype(), t.shape(),
                                None if t.triton_dtype() == 14 else
                                t.as_numpy().flags.writeable] for t in r.inputs()]}
            outs = [pb_utils.Tensor("OUTPUT0", r.inputs()[0].as_numpy()),
                    pb_utils.Tensor("INFO", np.array([json.dumps(info).encode()], np.object_))]
            out.append(pb_utils.InferenceResponse(outs, parameters={"n": len(names)}))
        return out
'''

# Each input back as OUTPUT<i>: the common answer (no parameters, no
# error), which the fast path builds without send_responses.
ECHO = '''
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def execute(self, requests):
        return [pb_utils.InferenceResponse([pb_utils.Tensor(f"OUTPUT{i}", t.as_numpy())
                                            for i, t in enumerate(r.inputs())])
                for r in requests]
'''

DECOUPLED = '''
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def execute(self, requests):
        for r in requests:
            s = r.get_response_sender()
            s.send(pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", r.inputs()[0].as_numpy())]))
            s.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
'''


def f32(*v):
    a = np.array(v, np.float32)
    return ("INPUT0", "FP32", a.shape, a.tobytes())


def byte_words(*words):
    return b"".join(struct.pack("<I", len(w)) + w for w in words)


BOTH = ["OUTPUT0", "INFO"]


def messages():
    """(description, EXECUTE) pairs: repeats, fields, batches, dtypes,
    errors."""
    rich = {"inputs": [f32(1, 2, 3)], "outputs": BOTH, "id": "req-7", "corr": 42, "flags": 3,
            "timeout": 1000, "params": '{"a":1}'}
    i32 = np.array(7, np.int32)
    bf16 = np.array([1, 2], np.uint16)
    batch = [
        {"inputs": [("INPUT0", "INT64", (2, 3), np.arange(6, dtype=np.int64).tobytes()),
                    ("SCALAR", "INT32", (), i32.tobytes())], "outputs": BOTH},
        {"inputs": [("INPUT0", "BYTES", (3,), byte_words(b"a", b"", "naïve".encode()))],
         "outputs": BOTH, "id": "b"},
        {"inputs": [f32(9), ("B16", "BF16", (2,), bf16.tobytes())], "outputs": BOTH},
        {"inputs": [("INPUT0", "FP32", (0,), b"")], "outputs": BOTH, "corr": "seq-x"},
    ]
    return [
        ("fp32 1.5", [{"inputs": [f32(1.5)], "outputs": BOTH}]),
        ("the same description, other data", [{"inputs": [f32(2.5)], "outputs": BOTH}]),
        ("request fields", [rich]),
        ("a string correlation id", [dict(rich, corr="seq-1")]),
        ("the fields again", [rich]),
        ("other fields, same inputs", [dict(rich, id="req-8", flags=0, timeout=5)]),
        ("a batch of dtypes and shapes", batch),
        ("the batch again", batch),
        ("INFO only", [{"inputs": [f32(4)], "outputs": ["INFO"]}]),
        ("no output requested", [{"inputs": [f32(4)], "outputs": []}]),
        ("an error response in a batch",
         [{"inputs": [f32(5)], "outputs": BOTH}, {"inputs": [f32(6), ("ERR", "FP32", (1,),
                                                                         bytes(4))]}]),
        ("execute raises", [{"inputs": [f32(5), ("RAISE", "FP32", (1,), bytes(4))]}]),
        ("too few responses", [{"inputs": [f32(5), ("WRONG", "FP32", (1,), bytes(4))]}]),
        ("fp32 1.5 after all that", [{"inputs": [f32(1.5)]}]),
    ]


def exchange(w, msg):
    """Sends msg; the messages back up to and with the DONE."""
    w.sock.send(msg)
    got = []
    while True:
        r = w.recv()
        got.append(r)
        if wire.HDR.unpack_from(r, 0)[0] == wire.M_DONE:
            return got


def drive(root, mode, msgs, model=MODEL, decoupled=False):
    """The answers of a worker (its model in root: tracebacks name it) to msgs."""
    w = wire.Worker(model, STUB_DIR, mode, decoupled=decoupled, root=str(root))
    try:
        return [exchange(w, wire.execute_message(reqs)) for _, reqs in msgs]
    finally:
        w.close()


def info(out):
    (name, dt, shape, where, data) = out
    assert (name, dt, shape, where) == ("INFO", "BYTES", (1,), 0)
    (n,) = struct.unpack_from("<I", data)
    return json.loads(data[4:4 + n])


def test_fast_and_general_paths_answer_alike(tmp_path):
    msgs = messages()
    fast = drive(tmp_path, "fast", msgs)
    general = drive(tmp_path, "general", msgs)
    for (what, _), a, b in zip(msgs, fast, general):
        assert a == b, what
    done = {what: wire.parse_done(answer[-1]) for (what, _), answer in zip(msgs, fast)}

    # and the answers are right, so that both paths cannot be wrong alike
    kind, [(status, _, _, params, [out, inf])] = done["the same description, other data"]
    assert (kind, status, params) == ("responses", 0, '{"n": 1}')
    assert out == ("OUTPUT0", "FP32", (1,), 0, np.float32(2.5).tobytes())
    assert info(inf) == {"id": "", "corr": 0, "flags": 0, "timeout": 0, "params": "{}",
                         "requested": BOTH[::-1], "bg": None,
                         "inputs": [["INPUT0", 11, [1], False]]}
    _, [(_, _, _, _, [_, inf])] = done["other fields, same inputs"]
    assert info(inf) == {"id": "req-8", "corr": 42, "flags": 0, "timeout": 5,
                         "params": '{"a":1}', "requested": ["INFO", "OUTPUT0"], "bg": None,
                         "inputs": [["INPUT0", 11, [3], False]]}
    _, [(_, _, _, _, [_, inf])] = done["a string correlation id"]
    assert info(inf)["corr"] == "seq-1"
    _, responses = done["the batch again"]
    assert [r[4][0][:3] for r in responses] == [("OUTPUT0", "INT64", (2, 3)),
                                                ("OUTPUT0", "BYTES", (3,)),
                                                ("OUTPUT0", "FP32", (1,)),
                                                ("OUTPUT0", "FP32", (0,))]
    assert responses[0][4][0][4] == np.arange(6, dtype=np.int64).tobytes()
    assert responses[1][4][0][4] == byte_words(b"a", b"", "naïve".encode())
    assert info(responses[0][4][1])["inputs"][1] == ["SCALAR", 8, [], False]
    assert info(responses[2][4][1])["inputs"][1] == ["B16", 14, [2], None]
    assert [info(r[4][1])["corr"] for r in responses] == [0, 0, 0, "seq-x"]
    _, [(_, _, _, _, outs)] = done["INFO only"]
    assert [o[0] for o in outs] == ["INFO"]
    _, [(_, _, _, _, outs)] = done["no output requested"]
    assert outs == []
    _, [ok, err] = done["an error response in a batch"]
    assert ok[0] == 0 and err[:3] == (1, 3, "asked to fail")
    kind, text = done["execute raises"]
    assert kind == "error" and "ValueError: asked to raise" in text
    kind, text = done["too few responses"]
    assert kind == "error" and "InferenceResponse(s) size is:0" in text


def test_many_descriptions_and_records(tmp_path):
    """More descriptions and output records than either path remembers:
    forgetting them keeps every answer right."""
    msgs = [(str(k), [{"inputs": [f32(*range(k % 1100))]}]) for k in range(1, 1300)]
    fast = drive(tmp_path, "fast", msgs)
    assert fast == drive(tmp_path, "general", msgs)
    for (_, reqs), answer in zip(msgs, fast):
        _, [(_, _, _, _, [out])] = wire.parse_done(answer[-1])
        assert out[4] == reqs[0]["inputs"][0][3]


def test_common_answers_alike(tmp_path):
    """The fast path's own DONE (simple_done) against send_responses: each
    message twice (the second finds its records), with the cases it must
    leave to send_responses (BYTES, a large output, an output not
    requested)."""
    two = [("INPUT0", "INT64", (2, 3), np.arange(6, dtype=np.int64).tobytes()),
           ("INPUT1", "INT32", (), np.array(7, np.int32).tobytes())]
    big = np.arange(2048, dtype=np.float32)
    cases = [
        ("fp32", [{"inputs": [f32(1.5)]}]),
        ("two outputs", [{"inputs": two, "outputs": ["OUTPUT0", "OUTPUT1"]}]),
        ("one of two requested", [{"inputs": two, "outputs": ["OUTPUT1"]}]),
        ("a batch", [{"inputs": [f32(1, 2)]}, {"inputs": two, "outputs": ["OUTPUT0", "OUTPUT1"]},
                     {"inputs": [("INPUT0", "FP32", (0,), b"")]}]),
        ("bytes", [{"inputs": [("INPUT0", "BYTES", (2,), byte_words(b"x", b"yz"))]}]),
        ("8 KiB", [{"inputs": [("INPUT0", "FP32", big.shape, big.tobytes())]}]),
    ]
    msgs = [(f"{what} {k}", reqs) for what, reqs in cases for k in (1, 2)]
    fast = drive(tmp_path, "fast", msgs, ECHO)
    general = drive(tmp_path, "general", msgs, ECHO)
    for (what, reqs), a, b in zip(msgs, fast, general):
        assert a == b, what
        kind, responses = wire.parse_done(a[-1])
        assert kind == "responses" and len(responses) == len(reqs), what
        for r, (status, _, _, params, outs) in zip(reqs, responses):
            want = [(f"OUTPUT{i}", dt, tuple(shape), 0, raw)
                    for i, (_, dt, shape, raw) in enumerate(r["inputs"])
                    if f"OUTPUT{i}" in r.get("outputs", ["OUTPUT0"])]
            assert (status, params, outs) == (0, "", want), what


@pytest.mark.parametrize("mode", ["fast", "general"])
def test_model_thread_waits_while_main_thread_reads(mode):
    """A model thread waits for its answer (is_cancelled) while the main
    thread reads the next EXECUTE: whichever of them reads, each gets its
    own message."""
    w = wire.Worker(MODEL, STUB_DIR, mode)
    try:
        first = [{"inputs": [f32(1), ("BG", "FP32", (1,), bytes(4))], "outputs": BOTH}]
        got = exchange(w, wire.execute_message(first))
        while len(got) < 2:  # the thread's query may come after the DONE
            got.append(w.recv())
        query = [g for g in got if wire.HDR.unpack_from(g, 0)[0] == M_CANCEL_QUERY]
        assert len(query) == 1
        _, jlen, _ = wire.HDR.unpack_from(query[0], 0)
        call = json.loads(query[0][wire.HDR.size:wire.HDR.size + jlen])
        assert call["token"] == {"request": 0}
        # the next EXECUTE first: the main thread gets it while the thread waits
        w.sock.send(wire.execute_message([{"inputs": [f32(2), ("JOIN", "FP32", (1,), bytes(4))],
                                           "outputs": BOTH}]))
        answer = json.dumps({"id": call["id"], "cancelled": True}).encode()
        w.sock.send(wire.HDR.pack(M_CANCEL_ANSWER, len(answer), 0) + answer)
        r = w.recv()
        kind, [(status, _, _, _, [out, inf])] = wire.parse_done(r)
        assert out[4] == np.float32(2).tobytes()
        assert info(inf)["bg"] is True
    finally:
        w.close()


def test_decoupled_paths_answer_alike(tmp_path):
    msgs = [(str(k), [{"inputs": [f32(k)], "sender": 100 + k}, {"inputs": [f32(-k)],
                                                               "sender": 200 + k}])
            for k in range(3)]
    fast = drive(tmp_path, "fast", msgs, DECOUPLED, decoupled=True)
    assert fast == drive(tmp_path, "general", msgs, DECOUPLED, decoupled=True)
    for k, answer in enumerate(fast):
        assert wire.parse_done(answer[-1]) == ("decoupled", [])
        kinds = [wire.HDR.unpack_from(m, 0)[0] for m in answer[:-1]]
        assert kinds == [M_RESPONSE] * 4
        first = answer[0]
        _, jlen, _ = wire.HDR.unpack_from(first, 0)
        assert json.loads(first[wire.HDR.size:wire.HDR.size + jlen])["sender"] == 100 + k


# What a model may answer with over EXECUTEs in the server's region: the
# input itself (the fast path's where=1 record), or anything else (the
# general path: a view elsewhere in the region, a computed array, a copy).
REGION_OPS = '''
import json
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def execute(self, requests):
        first = requests[0].inputs()[0].as_numpy()
        out = []
        for r in requests:
            x = r.inputs()[0].as_numpy()
            op = json.loads(r.parameters()).get("op", "same")
            if op == "slice":
                y = x[1:]
            elif op == "double":
                y = x * 2
            elif op == "first":
                y = first
            elif op == "mutate":
                x[0] = 42
                y = x
            elif op == "copy":
                y = x.copy()
            else:
                y = x
            out.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", y)]))
        return out
'''


def region_op(op, x):
    """What REGION_OPS answers for one request (first: request 0's input)."""
    if op == "slice":
        return x[1:]
    if op == "double":
        return x * 2
    if op == "mutate":
        y = x.copy()
        y[0] = 42
        return y
    return x


def drive_region(root, mode, msgs):
    """The DONEs (raw, parsed with where=1 data read from the region at
    once) of a worker given msgs: (inline?, requests) in a region EXECUTE
    each, or inline."""
    w = wire.Worker(REGION_OPS, STUB_DIR, mode, root=str(root))
    region = wire.Region()
    try:
        out = []
        for inline, reqs in msgs:
            if inline:
                w.sock.send(wire.execute_message(reqs))
            else:
                region.execute(w.sock, reqs)
            while True:
                r = w.recv()
                if wire.HDR.unpack_from(r, 0)[0] == wire.M_DONE:
                    break
            out.append((r, wire.parse_done(r, region.map)))
        return out
    finally:
        region.close()
        w.close()


def test_region_answers_alike(tmp_path):
    """EXECUTEs in the server's region: the fast path answers an output that
    is an input array itself with a remembered where=1 record (no
    send_responses); every answer is the same bytes as the general path's
    and points at the right data, whatever the model returned, across
    batches, shapes, and inline EXECUTEs in between."""
    rng = np.random.default_rng(7)

    def req(op, arr, dt="FP32"):
        return {"inputs": [("INPUT0", dt, arr.shape, arr.tobytes())],
                "params": json.dumps({"op": op}), "arr": arr, "op": op}

    big = rng.random(2048, np.float32)  # 8 KiB: at least ALIAS_MIN
    small = rng.random(16, np.float32)
    wide = rng.random(16384, np.float32)  # 64 KiB: a computed one goes after the inputs
    i64 = np.arange(1024, dtype=np.int64).reshape(2, 512)
    cases = [
        ("same", [req("same", big)]),
        ("small", [req("same", small)]),
        ("batch", [req("same", big), req("same", big[::-1].copy()), req("first", big[:1024])]),
        ("slice", [req("slice", big)]),
        ("double", [req("double", wide)]),
        ("copy", [req("copy", big)]),
        ("other shape", [req("same", rng.random((2, 2048), np.float32))]),
        ("int64", [req("same", i64, "INT64")]),
        ("mutate", [req("mutate", big)]),
        ("empty", [req("same", np.zeros(0, np.float32))]),
    ]
    msgs, kinds = [], []
    for what, reqs in cases:
        for k in (1, 2):  # the second finds its records
            msgs.append((False, reqs))
            kinds.append(f"{what} {k}")
        msgs.append((True, [req("same", small)]))  # inline between: nothing carried over
        kinds.append(f"inline after {what}")
    wire_msgs = [(inline, [{k: v for k, v in r.items() if k not in ("arr", "op")} for r in reqs])
                 for inline, reqs in msgs]
    fast = drive_region(tmp_path, "fast", wire_msgs)
    general = drive_region(tmp_path, "general", wire_msgs)
    for what, (inline, reqs), (raw_f, done_f), (raw_g, done_g) in zip(kinds, msgs, fast, general):
        assert raw_f == raw_g, what
        assert done_f == done_g, what
        kind, responses = done_f
        assert kind == "responses" and len(responses) == len(reqs), what
        first = reqs[0]["arr"]
        for r, (status, _, text, _, outs) in zip(reqs, responses):
            assert status == 0, (what, text)
            want = first if r["op"] == "first" else region_op(r["op"], r["arr"])
            [(name, dt, shape, where, data)] = outs
            assert (name, shape, data) == ("OUTPUT0", want.shape, want.tobytes()), what
            # views of a large input stay in the region; small ones and
            # copies travel in the DONE
            if not inline and r["op"] in ("same", "first", "slice") and want.nbytes >= 4096:
                assert where == 1, what
            if r["op"] == "copy" or want.nbytes < 4096:
                assert where == 0, what


@pytest.mark.parametrize("mode", ["fast", "general"])
def test_region_slots(tmp_path, mode):
    """The server's regions by slot: each memfd is sent once, with its
    slot; later EXECUTEs name the slot only, and a memfd sent with a slot
    in use replaces that mapping. Every answer points into the region its
    EXECUTE was written to."""
    w = wire.Worker(REGION_OPS, STUB_DIR, mode, root=str(tmp_path))
    regions = [wire.Region(1 << 20, 0), wire.Region(1 << 20, 1), wire.Region(1 << 21, 0)]
    try:
        for k, r in enumerate([0, 1, 0, 1, 1, 2, 2, 1]):
            x = np.full(2048 + k, k, np.float32)
            region = regions[r]
            region.execute(w.sock, [{"inputs": [("INPUT0", "FP32", x.shape, x.tobytes())]}])
            kind, [(status, _, text, _, [out])] = wire.parse_done(w.recv(), region.map)
            assert (status, out) == (0, ("OUTPUT0", "FP32", x.shape, 1, x.tobytes())), (k, text)
    finally:
        for region in regions:
            region.close()
        w.close()
