"""BLS_CALL and BLS_RESULT in binary (python_wire.h, "BLS_CALL and BLS_RESULT descriptions"),
through the real binary: every field of a BLS request reaches the called
model (request id, numeric and string correlation ids, sequence flags,
parameters, requested outputs) and every part of its answer comes back
(outputs of several datatypes, BYTES included, response parameters,
errors); tensors large enough to travel in a memfd both ways; and forged
BLS_CALL messages from a hostile model end its worker with a reason while
the server keeps serving.
"""
import json
import os
import time

import numpy as np
import pytest

from conftest import Server
from test_python_backend import post, write

# Returns its inputs as outputs, and what it saw of the request in META;
# response parameters from its request's.
ECHO = """
import json
import numpy as np
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def execute(self, requests):
        out = []
        for r in requests:
            meta = {"id": r.request_id(), "corr": r.correlation_id(), "flags": r.flags(),
                    "params": json.loads(r.parameters()),
                    "requested": sorted(r.requested_output_names())}
            ts = [pb_utils.Tensor(t.name().replace("IN", "OUT"), t.as_numpy())
                  for t in r.inputs()]
            ts.append(pb_utils.Tensor("META", np.array([json.dumps(meta).encode()],
                                                       dtype=np.object_)))
            out.append(pb_utils.InferenceResponse(ts, parameters={"echoed": True, "n": 3}))
        return out
"""

ECHO_CONFIG = """
name: "echo"
backend: "python"
input [ { name: "IN_F" data_type: TYPE_FP32 dims: [ -1 ] optional: true },
        { name: "IN_S" data_type: TYPE_STRING dims: [ -1 ] optional: true },
        { name: "IN_B" data_type: TYPE_BOOL dims: [ -1, -1 ] optional: true },
        { name: "IN_H" data_type: TYPE_FP16 dims: [ -1 ] optional: true } ]
output [ { name: "OUT_F" data_type: TYPE_FP32 dims: [ -1 ] },
         { name: "OUT_S" data_type: TYPE_STRING dims: [ -1 ] },
         { name: "OUT_B" data_type: TYPE_BOOL dims: [ -1, -1 ] },
         { name: "OUT_H" data_type: TYPE_FP16 dims: [ -1 ] },
         { name: "META" data_type: TYPE_STRING dims: [ 1 ] } ]
"""

CALLER = """
import json
import os
import socket
import struct
import threading
import time
import numpy as np
import triton_python_backend_utils as pb_utils

def call(inputs, outputs, **kw):
    return pb_utils.InferenceRequest(model_name="echo", inputs=inputs,
                                     requested_output_names=outputs, **kw).exec()

def forge(body, blob=b"", mtype=105):
    # a hostile model writing its own BLS_CALL to the server
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET, fileno=os.dup(3))
    sock.send(struct.pack("<IIQ", mtype, len(body), len(blob)) + body + blob)
    os._exit(0)

def forge_region(slot, jlen, blen):
    # a BLS_CALL naming a region slot of ours (header only)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET, fileno=os.dup(3))
    sock.send(struct.pack("<IIQ", 105 | 0x80000000 | slot << 16, jlen, blen))
    os._exit(0)

def bls_head(n_out, n_in, model=b"echo", corr_len=-1, reply=-1):
    return struct.pack("<QqQQIIiIIIIIi", 1, -1, 0, 0, 0, 0, corr_len, len(model), 0, 0,
                       n_out, n_in, reply) + model

class TritonPythonModel:
    def execute(self, requests):
        out = []
        for r in requests:
            mode = r.inputs()[0].as_numpy()[0].decode()
            res = {}
            if mode == "fields":
                f = np.arange(5, dtype=np.float32)
                s = np.array([b"a", b"", "\\u00e9t\\u00e9".encode()], dtype=np.object_)
                b = np.array([[True, False], [False, True]])
                h = np.array([1.5, -2], np.float16)
                a = call([pb_utils.Tensor("IN_F", f), pb_utils.Tensor("IN_S", s),
                          pb_utils.Tensor("IN_B", b), pb_utils.Tensor("IN_H", h)],
                         ["OUT_F", "OUT_S", "OUT_B", "OUT_H", "META"], request_id="rid-1",
                         correlation_id=12345678901234, parameters={"k": "v", "i": 7, "b": True})
                res["error"] = a.error().message() if a.has_error() else None
                o = {t.name(): t.as_numpy() for t in a.output_tensors()}
                res["same"] = [bool(np.array_equal(o["OUT_F"], f)),
                               o["OUT_S"].tolist() == s.tolist(),
                               bool(np.array_equal(o["OUT_B"], b)),
                               bool(np.array_equal(o["OUT_H"], h))]
                res["dtypes"] = [str(o[k].dtype) for k in ("OUT_F", "OUT_B", "OUT_H")]
                res["meta"] = json.loads(o["META"][0])
                res["resp_params"] = json.loads(a.parameters())
                c = call([pb_utils.Tensor("IN_F", f)], ["META"], correlation_id="seq-\\u00e9")
                res["corr_str"] = json.loads(c.output_tensors()[0].as_numpy()[0])["corr"]
                res["only_meta"] = [t.name() for t in c.output_tensors()]
            elif mode == "large":
                f = np.random.default_rng(1).random(300000).astype(np.float32)
                s = np.array([bytes([i % 251]) * 300 for i in range(400)], dtype=np.object_)
                a = call([pb_utils.Tensor("IN_F", f), pb_utils.Tensor("IN_S", s)],
                         ["OUT_F", "OUT_S"])
                o = {t.name(): t.as_numpy() for t in a.output_tensors()}
                res["same"] = [bool(np.array_equal(o["OUT_F"], f)),
                               o["OUT_S"].tolist() == s.tolist()]
            elif mode == "errors":
                e = pb_utils.InferenceRequest(model_name="echo", inputs=[pb_utils.Tensor(
                    "NOPE", np.zeros(1, np.float32))], requested_output_names=[]).exec()
                res["unknown_input"] = (e.error().code(), e.error().message())
                p = call([pb_utils.Tensor("IN_F", np.zeros(1, np.float32))], [],
                         parameters="[1, 2]")
                res["list_params"] = (p.error().code(), p.error().message())
                u = pb_utils.InferenceRequest(model_name="non_existent_model", inputs=[],
                                              requested_output_names=[]).exec()
                res["unknown_model"] = (u.error().code(), u.error().message())
            elif mode == "truncated":
                forge(bls_head(1, 0)[:-3])
            elif mode == "where":  # an inline EXECUTE: no region to name
                rec = struct.pack("<IIIIQQq", 4, 11, 1, 1, 0, 4, 1) + b"IN_F"
                forge(bls_head(0, 1) + rec, bytes(64))
            elif mode == "where_past":  # past the end of the EXECUTE region
                rec = struct.pack("<IIIIQQq", 4, 11, 1, 1, 1 << 40, 4, 1) + b"IN_F"
                forge(bls_head(0, 1) + rec)
            elif mode == "where_body":  # a request body slot the execute does not read
                rec = struct.pack("<IIIIQQq", 4, 11, 1, 16 + 5, 0, 4, 1) + b"IN_F"
                forge(bls_head(0, 1) + rec)
            elif mode == "where_bytes":  # BYTES are never taken by reference
                rec = struct.pack("<IIIIQQq", 4, 13, 1, 1, 0, 8, 1) + b"IN_S"
                forge(bls_head(0, 1) + rec)
            elif mode.startswith("where_late:"):  # after the execute's DONE
                d = mode.split(":", 1)[1]
                def late():
                    for _ in range(3000):
                        if os.path.exists(os.path.join(d, "go")):
                            break
                        time.sleep(0.01)
                    rec = struct.pack("<IIIIQQq", 4, 11, 1, 1, 0, 4, 1) + b"IN_F"
                    forge(bls_head(0, 1) + rec)
                threading.Thread(target=late).start()
            elif mode == "reply_slot":
                forge(bls_head(0, 0, reply=8))
            elif mode == "region_slot":
                forge_region(9, 100, 0)
            elif mode == "region_unsent":
                forge_region(3, 100, 0)
            elif mode == "bytes":
                rec = struct.pack("<IIIIQQq", 4, 13, 1, 0, 0, 8, 3) + b"IN_S"
                forge(bls_head(0, 1) + rec, struct.pack("<I", 4) + b"abcd" + bytes(56))
            out.append(pb_utils.InferenceResponse([pb_utils.Tensor(
                "OUT", np.array([json.dumps(res).encode()], dtype=np.object_))]))
        return out
"""

CALLER_CONFIG = """
name: "caller"
backend: "python"
input [ { name: "MODE" data_type: TYPE_STRING dims: [ 1 ] },
        { name: "BIG" data_type: TYPE_FP32 dims: [ -1 ] optional: true } ]
output [ { name: "OUT" data_type: TYPE_STRING dims: [ 1 ] } ]
"""


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    repo = str(tmp_path_factory.mktemp("blsbin") / "models")
    write(repo, "echo", ECHO_CONFIG, ECHO)
    write(repo, "caller", CALLER_CONFIG, CALLER)
    s = Server(repo, [])
    yield s
    assert s.stop() == 0, s.output()


def run(server, mode, big=False):
    ins = [{"name": "MODE", "datatype": "BYTES", "data": [mode]}]
    if big:  # the EXECUTE then travels in the server's region (as JSON: a binary
        # tensor would be referenced where the body landed, python_body.c "Request bodies")
        ins.append({"name": "BIG", "datatype": "FP32", "data": np.zeros(100000, np.float32),
                    "binary": False})
    r = post(server, "caller", ins)
    return r, (json.loads(r.json()["outputs"][0]["data"][0]) if r.status_code == 200 else None)


def test_every_field_reaches_the_callee_and_comes_back(server):
    r, res = run(server, "fields")
    assert r.status_code == 200, r.text
    assert res["error"] is None
    assert res["same"] == [True, True, True, True]
    assert res["dtypes"] == ["float32", "bool", "float16"]
    assert res["meta"] == {"id": "rid-1", "corr": 12345678901234, "flags": 0,
                           "params": {"k": "v", "i": 7, "b": True},
                           "requested": ["META", "OUT_B", "OUT_F", "OUT_H", "OUT_S"]}
    assert res["resp_params"] == {"echoed": True, "n": 3}
    assert res["corr_str"] == "seq-\u00e9"
    assert res["only_meta"] == ["META"]


def test_large_tensors_through_memfds(server):
    # 1.2 MB of FP32 and 120 KB of BYTES: past the datagram, both ways
    r, res = run(server, "large")
    assert r.status_code == 200, r.text
    assert res["same"] == [True, True]


def test_errors_come_back_as_errors(server):
    r, res = run(server, "errors")
    assert r.status_code == 200, r.text
    code, text = res["unknown_input"]
    assert code == 3 and text.startswith("Model echo - Error when running inference: ")
    assert "NOPE" in text
    assert res["list_params"] == [3, "Model echo - Error when running inference: BLS request "
                                     "parameters must be a JSON object"]
    # Triton's text (L0_backend_python bls: test_bls_sync)
    assert res["unknown_model"][1] == ("Model non_existent_model - Error when running inference: "
                                       "Request for unknown model: 'non_existent_model' is not "
                                       "found")


@pytest.mark.parametrize("how,why", [
    ("truncated", "malformed BLS request"),
    # records pointing into the server's EXECUTE region: with none in flight,
    # past its end, BYTES
    ("where", "BLS input in the execute region while no execute is in flight"),
    ("where_past", "tensor 'IN_F' lies outside its message"),
    ("where_bytes", "malformed BLS request"),
    ("where_body", "BLS input in a request body region the execute in flight does not read"),
    ("reply_slot", "malformed BLS request"),  # a reply region past BLS_SLOTS
    ("region_slot", "unexpected region message"),  # a BLS_CALL region past BLS_SLOTS
    ("region_unsent", "message outside the shared-memory region"),  # a slot never sent
    ("bytes", "BYTES tensor 'IN_S' does not hold 3 serialized elements"),
])
def test_forged_bls_calls_end_the_worker(server, how, why):
    seen = len(server.output())
    r, _ = run(server, how, big=how in ("where_past", "where_bytes"))
    assert r.status_code == 500
    assert r.json()["error"].startswith("Stub process 'caller_0' is not healthy")
    assert why in server.output()[seen:]
    r, res = run(server, "fields")  # restarted, serving
    assert r.status_code == 200 and res["error"] is None


def test_a_reference_after_the_execute_ended_ends_the_worker(server, tmp_path):
    # a valid offset into the region the execute came in, sent by a thread
    # after the execute's DONE: the server's own state refuses it
    seen = len(server.output())
    r, _ = run(server, "where_late:" + str(tmp_path), big=True)
    assert r.status_code == 200, r.text
    open(os.path.join(str(tmp_path), "go"), "w").close()
    why = "BLS input in the execute region while no execute is in flight"
    deadline = time.time() + 60
    while why not in server.output()[seen:] and time.time() < deadline:
        time.sleep(0.02)
    assert why in server.output()[seen:]
    r, res = run(server, "fields")  # restarted, serving
    assert r.status_code == 200 and res["error"] is None
