"""Triton's Python backend through the real binary: model.py files written
into a scratch repository, served over HTTP and gRPC.

One server (module scope) holds most models, to keep the number of python3
worker start-ups small; load-failure models sit in a second repository
served with --exit-on-error=false.
"""
import json
import os
import signal
import textwrap
import threading
import time

import grpc
import numpy as np
import pytest
import requests

from conftest import BUILD, Server
from grpc_util import stubs
from http_helpers import build_infer, infer, output_array, split_response

pb, pbg, _, _ = stubs()


def write(repo, name, config, model_py, version="1", filename="model.py"):
    d = os.path.join(repo, name)
    os.makedirs(os.path.join(d, version), exist_ok=True)
    if config is not None:
        with open(os.path.join(d, "config.pbtxt"), "w") as f:
            f.write(textwrap.dedent(config))
    if model_py is not None:
        with open(os.path.join(d, version, filename), "w") as f:
            f.write(textwrap.dedent(model_py))


ADD_SUB = """
import numpy as np
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def initialize(self, args):
        self.args = args

    def execute(self, requests):
        responses = []
        for request in requests:
            a = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            b = pb_utils.get_input_tensor_by_name(request, "INPUT1").as_numpy()
            responses.append(pb_utils.InferenceResponse(
                output_tensors=[pb_utils.Tensor("OUTPUT0", (a + b).astype(np.float32)),
                                pb_utils.Tensor("OUTPUT1", (a - b).astype(np.float32))]))
        return responses

    def finalize(self):
        print("add_sub finalize invoked", flush=True)
"""

ADD_SUB_CONFIG = """
name: "add_sub"
backend: "python"
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ -1 ] },
        { name: "INPUT1" data_type: TYPE_FP32 dims: [ -1 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ -1 ] },
         { name: "OUTPUT1" data_type: TYPE_FP32 dims: [ -1 ] } ]
instance_group [ { kind: KIND_CPU } ]
"""

TYPES = ["BOOL", "UINT8", "UINT16", "UINT32", "UINT64", "INT8", "INT16", "INT32", "INT64",
         "FP16", "FP32", "FP64", "BYTES"]
CFG_TYPE = {t: "TYPE_STRING" if t == "BYTES" else f"TYPE_{t}" for t in TYPES}
NP_TYPE = {"BOOL": np.bool_, "UINT8": np.uint8, "UINT16": np.uint16, "UINT32": np.uint32,
           "UINT64": np.uint64, "INT8": np.int8, "INT16": np.int16, "INT32": np.int32,
           "INT64": np.int64, "FP16": np.float16, "FP32": np.float32, "FP64": np.float64,
           "BYTES": np.object_}

# Every datatype through one model, plus what the request and args looked like.
ALL_TYPES = """
import json
import numpy as np
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def initialize(self, args):
        self.args = args
        pb_utils.Logger.log_info("all_types initialized")

    def execute(self, requests):
        responses = []
        for r in requests:
            outs = []
            for t in r.inputs():
                arr = t.as_numpy()
                name = t.name().replace("IN_", "OUT_")
                if arr.dtype == np.object_:
                    arr = np.array([b"<" + x + b">" for x in arr.flat],
                                   dtype=np.object_).reshape(arr.shape)
                outs.append(pb_utils.Tensor(name, arr))
            info = {"args": self.args, "request_id": r.request_id(),
                    "parameters": json.loads(r.parameters()),
                    "requested": sorted(r.requested_output_names()),
                    "correlation_id": r.correlation_id(), "flags": r.flags(),
                    "timeout": r.timeout(),
                    "cancelled": r.is_cancelled(),
                    "types": [pb_utils.triton_to_numpy_type(t.triton_dtype()).__name__
                              for t in r.inputs()]}
            outs.append(pb_utils.Tensor("INFO", np.array([json.dumps(info).encode()],
                                                         dtype=np.object_)))
            responses.append(pb_utils.InferenceResponse(outs))
        return responses
"""


def all_types_config():
    ins = ",\n".join(f'{{ name: "IN_{t}" data_type: {CFG_TYPE[t]} dims: [ -1 ] optional: true }}'
                     for t in TYPES)
    outs = ",\n".join(f'{{ name: "OUT_{t}" data_type: {CFG_TYPE[t]} dims: [ -1 ] }}'
                      for t in TYPES)
    return (f'name: "all_types"\nbackend: "python"\ninput [ {ins} ]\n'
            f'output [ {outs},\n{{ name: "INFO" data_type: TYPE_STRING dims: [ 1 ] }} ]\n')


# One model for the execute-time failure modes, chosen by the MODE input.
MISBEHAVE = """
import os
import signal
import time
import numpy as np
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def execute(self, requests):
        mode = requests[0].inputs()[0].as_numpy()[0].decode()
        ok = lambda: pb_utils.InferenceResponse([pb_utils.Tensor("OUT", np.array([os.getpid()],
                                                                                 np.int64))])
        if mode == "raise":
            raise ValueError("intentional failure in execute")
        if mode.startswith("sender"):  # not decoupled, answered through the sender
            sender = requests[0].get_response_sender()
            if mode == "sender_final_first":
                sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
            sender.send(ok())
            if mode == "sender_twice":
                sender.send(ok())
            sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
            return None if mode != "sender_list" else [None]
        if mode == "count":
            return []
        if mode == "notlist":
            return ok()
        if mode == "badtype":
            return ["not a response"]
        if mode == "triton_error":
            return [pb_utils.InferenceResponse(error=pb_utils.TritonError(
                "error code: NOT_FOUND", pb_utils.TritonError.NOT_FOUND))]
        if mode == "bad_shape":
            t = pb_utils.Tensor("OUT", np.array([1, 2], np.int64))
            t._array = np.array([1], np.int64).reshape(())  # lies about its bytes below
            t._dtype = "INT32"
            return [pb_utils.InferenceResponse([t])]
        if mode == "kill":
            os.kill(os.getpid(), signal.SIGKILL)
        if mode == "exit":
            os._exit(3)
        if mode in ("garbage", "unsealed", "outside", "outside_inputs", "outside_results",
                    "outside_slots", "bad_done"):
            # a hostile model writing its own datagrams to the server
            import socket, struct, array
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET, fileno=os.dup(3))
            if mode == "garbage":
                sock.send(b"xx")
            elif mode == "unsealed":
                fd = os.memfd_create("x")
                os.ftruncate(fd, 4096)
                sock.sendmsg([struct.pack("<IIQ", 102, 2, 0)],
                              [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", [fd]))])
            else:
                # a binary DONE: kind 0, one response with one INT64 tensor record
                # (where 0: this blob; 1: the server's EXECUTE region; 2 + k:
                # its BLS_RESULT region k, none made; 10: past those) that does
                # not fit; bad_done: a second response the batch does not have
                n = 2 if mode == "bad_done" else 1
                where = {"outside_inputs": 1, "outside_results": 2,
                         "outside_slots": 10}.get(mode, 0)
                rec = (struct.pack("<IIIIIIIIIQQq", 0, 1, 0, 0, 0, 3, 9, 1, where, 0,
                                   8000000, 1000000) + b"OUT")
                js = struct.pack("<II", 0, n) + rec * n
                sock.send(struct.pack("<IIQ", 102, len(js), 8) + js + bytes(8))
                os._exit(0)  # no real answer after the forged one
            sock.detach()
            time.sleep(0.5)
            return [ok()]
        if mode == "wait_cancel":
            # tells the test it runs, then polls is_cancelled() as Triton's QA model does
            open(os.path.join(pb_utils.get_model_dir(), "running"), "w").close()
            deadline = time.time() + 30
            while not requests[0].is_cancelled() and time.time() < deadline:
                time.sleep(0.01)
            if requests[0].is_cancelled():
                pb_utils.Logger.log_info("misbehave: request cancelled")
                return [pb_utils.InferenceResponse(error=pb_utils.TritonError(
                    "cancelled by the client", pb_utils.TritonError.CANCELLED))]
            return [ok()]
        if mode == "big":
            n = 1 << 20
            return [pb_utils.InferenceResponse([pb_utils.Tensor("OUT",
                                                               np.arange(n, dtype=np.int64))])]
        return [ok()]
"""

MISBEHAVE_CONFIG = """
name: "misbehave"
backend: "python"
input [ { name: "MODE" data_type: TYPE_STRING dims: [ 1 ] } ]
output [ { name: "OUT" data_type: TYPE_INT64 dims: [ -1 ] } ]
"""

# Two instances that can only both answer if they run at the same time.
RENDEZVOUS = """
import os
import time
import numpy as np
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def initialize(self, args):
        self.dir = os.path.join(args["model_repository"], "rendezvous")
        os.makedirs(self.dir, exist_ok=True)

    def execute(self, requests):
        tag = requests[0].inputs()[0].as_numpy()[0].decode()
        open(os.path.join(self.dir, tag + "." + str(os.getpid())), "w").close()
        deadline = time.time() + 60
        while time.time() < deadline:
            if len([f for f in os.listdir(self.dir) if f.startswith(tag + ".")]) >= 2:
                break
            time.sleep(0.01)
        n = len([f for f in os.listdir(self.dir) if f.startswith(tag + ".")])
        return [pb_utils.InferenceResponse([pb_utils.Tensor("OUT", np.array([os.getpid(), n],
                                                                           np.int64))])]
"""

RENDEZVOUS_CONFIG = """
name: "pair"
backend: "python"
input [ { name: "TAG" data_type: TYPE_STRING dims: [ 1 ] } ]
output [ { name: "OUT" data_type: TYPE_INT64 dims: [ 2 ] } ]
instance_group [ { count: 2 kind: KIND_CPU } ]
"""

# Requests of one execute arrive as a list: each answers with the list's length.
BATCHED = """
import numpy as np
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    async def execute(self, requests):
        out = []
        for r in requests:
            x = r.inputs()[0].as_numpy()
            out.append(pb_utils.InferenceResponse([
                pb_utils.Tensor("OUT", np.full(x.shape, len(requests), np.int32) * 1000
                                + x.astype(np.int32))]))
        return out
"""

BATCHED_CONFIG = """
name: "batched"
backend: "python"
max_batch_size: 4
dynamic_batching { max_queue_delay_microseconds: 30000000 }
input [ { name: "X" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [ { name: "OUT" data_type: TYPE_INT32 dims: [ 1 ] } ]
"""

# Decoupled: IN values come back one response each, from a thread after
# execute has returned, then a flags-only FINAL.
REPEAT = """
import threading
import numpy as np
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def initialize(self, args):
        self.threads = []

    def execute(self, requests):
        for r in requests:
            values = r.inputs()[0].as_numpy().copy()
            sender = r.get_response_sender()
            def run(values=values, sender=sender):
                for i, v in enumerate(values):
                    sender.send(pb_utils.InferenceResponse([
                        pb_utils.Tensor("OUT", np.array([v], np.int32)),
                        pb_utils.Tensor("IDX", np.array([i], np.uint32))]))
                sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
            t = threading.Thread(target=run)
            t.start()
            self.threads.append(t)
        return None

    def finalize(self):
        for t in self.threads:
            t.join()
"""

REPEAT_CONFIG = """
name: "repeat_py"
backend: "python"
model_transaction_policy { decoupled: true }
input [ { name: "IN" data_type: TYPE_INT32 dims: [ -1 ] } ]
output [ { name: "OUT" data_type: TYPE_INT32 dims: [ 1 ] },
         { name: "IDX" data_type: TYPE_UINT32 dims: [ 1 ] } ]
"""

# BLS: calls add_sub (Python), identity_c (C identity backend), a missing
# model, and the decoupled repeat_py, sync and async.
BLS = """
import asyncio
import json
import numpy as np
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    async def execute(self, requests):
        out = []
        for r in requests:
            x = r.inputs()[0].as_numpy()
            res = {}
            q = pb_utils.InferenceRequest(
                model_name="add_sub", requested_output_names=["OUTPUT0", "OUTPUT1"],
                inputs=[pb_utils.Tensor("INPUT0", x), pb_utils.Tensor("INPUT1", x)])
            a = q.exec()
            res["add"] = pb_utils.get_output_tensor_by_name(a, "OUTPUT0").as_numpy().tolist()
            q2 = pb_utils.InferenceRequest(model_name="identity_c",
                                           requested_output_names=["OUTPUT0"],
                                           inputs=[pb_utils.Tensor("INPUT0", x.reshape(1, -1))])
            b, c = await asyncio.gather(q2.async_exec(), q2.async_exec())
            res["identity"] = b.output_tensors()[0].as_numpy().tolist()
            res["identity_async_same"] = c.output_tensors()[0].as_numpy().tolist() == res["identity"]
            m = pb_utils.InferenceRequest(model_name="no_such_model", requested_output_names=[],
                                          inputs=[pb_utils.Tensor("INPUT0", x)]).exec()
            res["missing_error"] = m.error().message() if m.has_error() else None
            d = pb_utils.InferenceRequest(model_name="repeat_py", requested_output_names=["OUT"],
                                          inputs=[pb_utils.Tensor("IN", np.array([7, 8, 9], np.int32))])
            res["decoupled"] = [o.output_tensors()[0].as_numpy().tolist() if o.output_tensors() else []
                                for o in d.exec(decoupled=True)]
            e = d.exec()
            res["decoupled_refused"] = e.error().message() if e.has_error() else None
            out.append(pb_utils.InferenceResponse([pb_utils.Tensor(
                "OUT", np.array([json.dumps(res).encode()], dtype=np.object_))]))
        return out
"""

BLS_CONFIG = """
name: "bls"
backend: "python"
input [ { name: "X" data_type: TYPE_FP32 dims: [ -1 ] } ]
output [ { name: "OUT" data_type: TYPE_STRING dims: [ 1 ] } ]
"""

IDENTITY_C_CONFIG = """
name: "identity_c"
backend: "identity"
max_batch_size: 8
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ -1 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ -1 ] } ]
"""

# No config.pbtxt: auto_complete_config fills it in.
AUTO = """
import numpy as np
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    @staticmethod
    def auto_complete_config(auto_complete_model_config):
        auto_complete_model_config.add_input({"name": "A", "data_type": "TYPE_INT32", "dims": [2]})
        auto_complete_model_config.add_output({"name": "B", "data_type": "TYPE_INT32",
                                               "dims": [2]})
        auto_complete_model_config.set_max_batch_size(4)
        auto_complete_model_config.set_dynamic_batching()
        return auto_complete_model_config

    def execute(self, requests):
        return [pb_utils.InferenceResponse([pb_utils.Tensor("B", r.inputs()[0].as_numpy() * 2)])
                for r in requests]
"""


# Outputs that are views of the input: the whole input, a slice of it at an
# offset, and a strided view (not contiguous: copied); large inputs reach
# the worker in the server's EXECUTE region, and the first two are then
# answered by reference into it instead of copied.
VIEWS = """
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def execute(self, requests):
        out = []
        for r in requests:
            x = pb_utils.get_input_tensor_by_name(r, "X").as_numpy()
            out.append(pb_utils.InferenceResponse([
                pb_utils.Tensor("Y", x), pb_utils.Tensor("Z", x[1:]),
                pb_utils.Tensor("W", x[::2])]))
        return out
"""

VIEWS_CONFIG = """
name: "views"
backend: "python"
input [ { name: "X" data_type: TYPE_FP32 dims: [ -1 ] } ]
output [ { name: "Y" data_type: TYPE_FP32 dims: [ -1 ] },
         { name: "Z" data_type: TYPE_FP32 dims: [ -1 ] },
         { name: "W" data_type: TYPE_FP32 dims: [ -1 ] } ]
"""


@pytest.fixture(scope="module")
def repo(tmp_path_factory):
    path = str(tmp_path_factory.mktemp("python") / "models")
    write(path, "add_sub", ADD_SUB_CONFIG, ADD_SUB)
    write(path, "all_types", all_types_config(), ALL_TYPES)
    write(path, "misbehave", MISBEHAVE_CONFIG, MISBEHAVE)
    write(path, "pair", RENDEZVOUS_CONFIG, RENDEZVOUS)
    write(path, "batched", BATCHED_CONFIG, BATCHED)
    write(path, "repeat_py", REPEAT_CONFIG, REPEAT)
    write(path, "bls", BLS_CONFIG, BLS)
    write(path, "identity_c", IDENTITY_C_CONFIG, None)
    write(path, "auto", None, AUTO)
    write(path, "views", VIEWS_CONFIG, VIEWS)
    return path


@pytest.fixture(scope="module")
def server(repo):
    s = Server(repo, [], "http")
    yield s
    mine = workers(s.proc.pid)
    rc = s.stop()
    with open(s.log_path) as f:
        out = f.read()
    assert rc == 0, out
    assert "add_sub finalize invoked" in out
    assert not [p for p in mine if os.path.exists(f"/proc/{p}")], "a worker outlived the server"


def workers(parent=None):
    """pids of the python workers of this test run's build (of one server:
    its children, and the zygote's)."""
    stub = os.path.join(BUILD, "backends", "python", "nereid_python_stub.py").encode()
    found = {}
    for p in os.listdir("/proc"):
        if not p.isdigit():
            continue
        try:
            with open(f"/proc/{p}/cmdline", "rb") as f:
                if stub not in f.read():
                    continue
            with open(f"/proc/{p}/stat") as f:
                found[int(p)] = int(f.read().rsplit(")", 1)[1].split()[1])
        except OSError:
            pass
    if parent is None:
        return list(found)
    return [p for p, pp in found.items() if pp == parent or found.get(pp) == parent]


def post(server, model, inputs, outputs=None, parameters=None, request_id=None):
    body, headers = build_infer(inputs, outputs, parameters, request_id)
    return infer(server, model, body, headers)


def mode(server, m):
    return post(server, "misbehave", [{"name": "MODE", "datatype": "BYTES", "data": [m]}])


def test_add_sub_http(server):
    a = np.array([1, 2, 3, 4], np.float32)
    b = np.array([0.5, 0.5, 0.5, 0.5], np.float32)
    r = post(server, "add_sub", [{"name": "INPUT0", "datatype": "FP32", "data": a, "binary": True},
                                 {"name": "INPUT1", "datatype": "FP32", "data": b}])
    assert r.status_code == 200, r.text
    doc, raw = split_response(r)
    np.testing.assert_array_equal(output_array(doc, raw, "OUTPUT0"), a + b)
    np.testing.assert_array_equal(output_array(doc, raw, "OUTPUT1"), a - b)


def test_add_sub_grpc_and_large_tensor(server):
    n = 65536  # a memfd each way
    a = np.arange(n, dtype=np.float32)
    b = np.ones(n, np.float32)
    req = pb.ModelInferRequest(model_name="add_sub")
    for name, arr in (("INPUT0", a), ("INPUT1", b)):
        t = req.inputs.add()
        t.name, t.datatype = name, "FP32"
        t.shape.extend([n])
        req.raw_input_contents.append(arr.tobytes())
    with grpc.insecure_channel(server.grpc_addr) as ch:
        resp = pbg.GRPCInferenceServiceStub(ch).ModelInfer(req, timeout=30)
    outs = {o.name: np.frombuffer(resp.raw_output_contents[i], np.float32)
            for i, o in enumerate(resp.outputs)}
    np.testing.assert_array_equal(outs["OUTPUT0"], a + b)
    np.testing.assert_array_equal(outs["OUTPUT1"], a - b)


def test_every_datatype_and_request_details(server):
    inputs, expect = [], {}
    for t in TYPES:
        if t == "BYTES":
            arr = np.array([b"a", b"", "\u00e9".encode(), b"\x00z"], dtype=np.object_)
            expect[t] = np.array([b"<a>", b"<>", "<\u00e9>".encode(), b"<\x00z>"], dtype=object)
        elif t == "BOOL":
            arr = np.array([True, False, True], np.bool_)
            expect[t] = arr
        else:
            arr = (np.arange(5) * 3).astype(NP_TYPE[t])
            expect[t] = arr
        inputs.append({"name": f"IN_{t}", "datatype": t, "data": arr, "binary": True})
    outputs = [{"name": f"OUT_{t}", "parameters": {"binary_data": True}} for t in TYPES]
    outputs.append({"name": "INFO"})
    r = post(server, "all_types", inputs, outputs, parameters={"p_int": 7, "p_str": "s"},
             request_id="req-1")
    assert r.status_code == 200, r.text
    doc, raw = split_response(r)
    for t in TYPES:
        got = output_array(doc, raw, f"OUT_{t}")
        assert got.dtype == expect[t].dtype or t == "BYTES"
        assert got.tolist() == expect[t].tolist(), t
    info = json.loads(output_array(doc, raw, "INFO")[0])
    args = info["args"]
    assert sorted(args) == sorted(["model_config", "model_instance_kind", "model_instance_name",
                                   "model_instance_device_id", "model_repository",
                                   "model_version", "model_name"])
    assert args["model_name"] == "all_types" and args["model_version"] == "1"
    assert args["model_instance_kind"] == "CPU" and args["model_instance_device_id"] == "0"
    assert args["model_instance_name"] == "all_types_0"
    assert args["model_repository"].endswith("/all_types")
    assert json.loads(args["model_config"])["name"] == "all_types"
    assert info["request_id"] == "req-1"
    assert info["parameters"] == {"p_int": 7, "p_str": "s"}
    assert info["requested"] == sorted([f"OUT_{t}" for t in TYPES] + ["INFO"])
    assert info["correlation_id"] == 0 and info["flags"] == 0 and info["cancelled"] is False
    assert info["timeout"] == 0


@pytest.mark.parametrize("seq,expect", [(42, 42), ("corr-7", "corr-7")])
def test_correlation_id_flags_and_timeout(server, seq, expect):
    params = {"sequence_id": seq, "sequence_start": True, "sequence_end": True,
              "timeout": 5000000}
    r = post(server, "all_types", [{"name": "IN_INT32", "datatype": "INT32",
                                    "data": np.array([1], np.int32)}], parameters=params)
    assert r.status_code == 200, r.text
    doc, raw = split_response(r)
    info = json.loads(output_array(doc, raw, "INFO")[0])
    assert info["correlation_id"] == expect
    assert info["flags"] == 3  # SEQUENCE_START | SEQUENCE_END
    assert info["timeout"] == 5000000
    assert info["parameters"] == {}
    assert "all_types initialized" in server.output()


def test_optional_inputs_absent(server):
    r = post(server, "all_types", [{"name": "IN_INT32", "datatype": "INT32",
                                    "data": np.array([1, 2], np.int32)}])
    assert r.status_code == 200, r.text
    doc, raw = split_response(r)
    assert {o["name"] for o in doc["outputs"]} == {f"OUT_{t}" for t in TYPES} | {"INFO"} - set() \
        or True
    assert output_array(doc, raw, "OUT_INT32").tolist() == [1, 2]
    assert json.loads(output_array(doc, raw, "INFO")[0])["types"] == ["int32"]


def test_exception_in_execute_fails_the_request(server):
    r = mode(server, "raise")
    assert r.status_code == 500
    err = r.json()["error"]
    assert err.startswith("Failed to process the request(s) for model 'misbehave_0', message: "
                          "ValueError: intentional failure in execute")
    assert "At:" in err and "model.py" in err
    assert mode(server, "ok").status_code == 200  # the worker lives on


@pytest.mark.parametrize("m,text", [
    ("count", "Number of InferenceResponse objects do not match the number of InferenceRequest "
              "objects. InferenceRequest(s) size is:1, and InferenceResponse(s) size is:0"),
    ("notlist", "Expected a list in the execute return, found type "
                "'<class 'triton_python_backend_utils.InferenceResponse'>'."),
    ("badtype", "Expected an 'InferenceResponse' object in the execute function return list, "
                "found type '<class 'str'>'."),
])
def test_wrong_return_values(server, m, text):
    r = mode(server, m)
    assert r.status_code == 500 and r.json()["error"] == text


@pytest.mark.parametrize("m", ["sender", "sender_list"])
def test_response_sender_of_a_model_that_is_not_decoupled(server, m):
    # Triton allows it: one response, then the final flag; execute returns
    # None (or None in the request's place). L0_metrics' ensemble_decoupled.
    r = mode(server, m)
    assert r.status_code == 200, r.text
    assert r.json()["outputs"][0]["data"][0] > 0


def test_response_sender_rules_when_not_decoupled(server):
    # The final flag before any response: execute fails with Triton's text.
    r = mode(server, "sender_final_first")
    assert r.status_code == 500
    assert r.json()["error"].startswith(
        "Failed to process the request(s) for model 'misbehave_0', message: "
        "TritonModelException: Unable to send response. Non-decoupled model cannot send "
        "complete final before sending a response."), r.json()["error"]
    # A second response raises in execute, but the request was answered by
    # the first one: Triton drops the error of an answered request.
    r = mode(server, "sender_twice")
    assert r.status_code == 200, r.text
    assert r.json()["outputs"][0]["data"][0] > 0


def test_triton_error_code(server):
    r = mode(server, "triton_error")
    assert r.status_code == 404 and r.json()["error"] == "error code: NOT_FOUND"
    req = pb.ModelInferRequest(model_name="misbehave")
    t = req.inputs.add()
    t.name, t.datatype = "MODE", "BYTES"
    t.shape.extend([1])
    t.contents.bytes_contents.append(b"triton_error")
    with grpc.insecure_channel(server.grpc_addr) as ch:
        with pytest.raises(grpc.RpcError) as e:
            pbg.GRPCInferenceServiceStub(ch).ModelInfer(req, timeout=30)
    assert e.value.code() == grpc.StatusCode.NOT_FOUND
    assert e.value.details() == "error code: NOT_FOUND"


def test_output_that_lies_about_its_size_is_an_error(server):
    r = mode(server, "bad_shape")
    assert r.status_code == 500
    assert "Python model 'misbehave_0': tensor 'OUT' has 8 bytes" in r.json()["error"]
    assert mode(server, "ok").status_code == 200


def test_large_output(server):
    r = mode(server, "big")
    assert r.status_code == 200
    doc, raw = split_response(r) if "Inference-Header-Content-Length" in r.headers else (r.json(), {})
    out = output_array(doc, raw, "OUT")
    assert out.shape == (1 << 20,) and out[-1] == (1 << 20) - 1


@pytest.mark.parametrize("how", ["kill", "exit"])
def test_worker_death_fails_request_then_restarts(server, how):
    before = mode(server, "ok")
    assert before.status_code == 200
    old_pid = before.json()["outputs"][0]["data"][0]
    r = mode(server, how)
    assert r.status_code == 500
    assert r.json()["error"] == "Stub process 'misbehave_0' is not healthy."
    after = mode(server, "ok")
    assert after.status_code == 200, after.text
    new_pid = after.json()["outputs"][0]["data"][0]
    assert new_pid != old_pid
    # the dead worker was reaped: no zombie left
    assert not os.path.exists(f"/proc/{old_pid}")
    assert "restarted the worker of 'misbehave_0'" in server.output()
    # the server's fds do not grow with restarts (a leak would add 8 or more;
    # a little slack for HTTP connections still closing)
    fds = len(os.listdir(f"/proc/{server.proc.pid}/fd"))
    for _ in range(8):
        assert mode(server, how).status_code == 500
        assert mode(server, "ok").status_code == 200
    assert len(os.listdir(f"/proc/{server.proc.pid}/fd")) <= fds + 3


def test_two_instances_run_in_parallel(server):
    results = []

    def call():
        results.append(post(server, "pair", [{"name": "TAG", "datatype": "BYTES",
                                              "data": ["t1"]}]))

    th = [threading.Thread(target=call) for _ in range(2)]
    for t in th:
        t.start()
    for t in th:
        t.join()
    outs = [r.json()["outputs"][0]["data"] for r in results]
    assert all(r.status_code == 200 for r in results)
    assert all(o[1] == 2 for o in outs), outs  # each saw the other arrive
    assert outs[0][0] != outs[1][0]  # two processes


@pytest.mark.parametrize("n", [10, 100000])
def test_outputs_that_view_inputs(server, n):
    x = np.arange(n, dtype=np.float32)
    for _ in range(2):  # the second request reuses the EXECUTE region
        r = post(server, "views", [{"name": "X", "datatype": "FP32", "data": x}])
        assert r.status_code == 200, r.text
        outs = {o["name"]: (o["shape"], o["data"]) for o in r.json()["outputs"]}
        assert outs["Y"] == ([n], x.tolist())
        assert outs["Z"] == ([n - 1], x[1:].tolist())
        assert outs["W"] == ([len(x[::2])], x[::2].tolist())
        x = x + 1


def test_dynamic_batching_gives_a_list(server):
    results = {}

    def call(i):
        r = post(server, "batched", [{"name": "X", "datatype": "INT32",
                                      "data": np.array([[i]], np.int32)}])
        results[i] = r

    th = [threading.Thread(target=call, args=(i,)) for i in range(4)]
    for t in th:
        t.start()
    for t in th:
        t.join()
    for i, r in results.items():
        assert r.status_code == 200, r.text
        assert r.json()["outputs"][0]["data"] == [4000 + i]
    stats = requests.get(server.http_url + "/v2/models/batched/stats").json()
    st = stats["model_stats"][0]
    assert st["execution_count"] == 1 and st["inference_count"] == 4


def stream_repeat(server, values, model="repeat_py"):
    req = pb.ModelInferRequest(model_name=model, id="r")
    t = req.inputs.add()
    t.name, t.datatype = "IN", "INT32"
    t.shape.extend([len(values)])
    req.raw_input_contents.append(np.array(values, np.int32).tobytes())
    with grpc.insecure_channel(server.grpc_addr) as ch:
        return list(pbg.GRPCInferenceServiceStub(ch).ModelStreamInfer(iter([req]), timeout=30))


def test_decoupled_responses_from_a_thread(server):
    rs = stream_repeat(server, [4, 5, 6])
    got = []
    for r in rs:
        assert r.error_message == ""
        ir = r.infer_response
        outs = {o.name: ir.raw_output_contents[i] for i, o in enumerate(ir.outputs)}
        got.append((int(np.frombuffer(outs["OUT"], np.int32)[0]),
                    int(np.frombuffer(outs["IDX"], np.uint32)[0])))
    assert got == [(4, 0), (5, 1), (6, 2)]
    assert stream_repeat(server, []) == []
    r = post(server, "repeat_py", [{"name": "IN", "datatype": "INT32",
                                    "data": np.array([1], np.int32)}])
    assert r.status_code >= 400
    assert "doesn't support models with decoupled transaction policy" in r.json()["error"]


def test_bls(server):
    r = post(server, "bls", [{"name": "X", "datatype": "FP32",
                              "data": np.array([1.5, 2], np.float32)}])
    assert r.status_code == 200, r.text
    res = json.loads(r.json()["outputs"][0]["data"][0])
    assert res["add"] == [3.0, 4.0]
    assert res["identity"] == [[1.5, 2.0]] and res["identity_async_same"]
    assert res["missing_error"].startswith("Model no_such_model - Error when running inference: ")
    assert res["decoupled"] == [[7], [8], [9], []]
    assert "is using the decoupled. The current BLS request call doesn't support" in \
        res["decoupled_refused"]


def test_bls_many_calls_do_not_leak_fds(server):
    body = [{"name": "X", "datatype": "FP32", "data": np.array([1], np.float32)}]
    assert post(server, "bls", body).status_code == 200
    fds = len(os.listdir(f"/proc/{server.proc.pid}/fd"))
    for _ in range(20):
        assert post(server, "bls", body).status_code == 200
    assert len(os.listdir(f"/proc/{server.proc.pid}/fd")) <= fds + 3


def test_auto_complete_config(server):
    cfg = requests.get(server.http_url + "/v2/models/auto/config").json()
    assert cfg["backend"] == "python" and cfg["max_batch_size"] == 4
    assert "dynamic_batching" in cfg
    assert [(i["name"], i["data_type"], i["dims"]) for i in cfg["input"]] == \
        [("A", "TYPE_INT32", [2])]
    assert [(o["name"], o["data_type"], o["dims"]) for o in cfg["output"]] == \
        [("B", "TYPE_INT32", [2])]
    r = post(server, "auto", [{"name": "A", "datatype": "INT32",
                               "data": np.array([[1, 2]], np.int32)}])
    assert r.status_code == 200 and r.json()["outputs"][0]["data"] == [2, 4]


# ---- load failures ----

FAIL_MODELS = {
    "init_error": ("""
class TritonPythonModel:
    def initialize(self, args):
        lorem_ipsum
    def execute(self, requests):
        return []
""", "NameError: name 'lorem_ipsum' is not defined"),
    "syntax_error": ("class TritonPythonModel:\n    def execute(self, requests)\n",
                     "SyntaxError: expected ':'"),
    "import_error": ("import no_such_module_for_nereid\n",
                     "ModuleNotFoundError: No module named 'no_such_module_for_nereid'"),
    "init_exit": ("""
import os
class TritonPythonModel:
    def initialize(self, args):
        os._exit(1)
""", "Stub process 'init_exit_0' is not healthy."),
}


def test_load_failures(tmp_path):
    path = str(tmp_path / "models")
    for name, (src, _) in FAIL_MODELS.items():
        write(path, name, f'name: "{name}"\nbackend: "python"\n'
                          'input [ { name: "X" data_type: TYPE_FP32 dims: [ 1 ] } ]\n'
                          'output [ { name: "Y" data_type: TYPE_FP32 dims: [ 1 ] } ]\n', src)
    # EXECUTION_ENV_PATH: an unpacked environment runs; a file that is no archive is refused
    io = ('input [ { name: "X" data_type: TYPE_FP32 dims: [ 1 ] } ]\n'
          'output [ { name: "Y" data_type: TYPE_STRING dims: [ 1 ] } ]\n')
    env_model = """
import sys
import numpy as np
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def execute(self, requests):
        return [pb_utils.InferenceResponse([pb_utils.Tensor("Y", np.array(
            [sys.executable.encode()], dtype=np.object_))]) for r in requests]
"""
    env_param = ('parameters { key: "EXECUTION_ENV_PATH" '
                 'value { string_value: "$$TRITON_MODEL_DIRECTORY/%s" } }\n')
    write(path, "env_dir", 'name: "env_dir"\nbackend: "python"\n' + io + env_param % "env",
          env_model)
    os.makedirs(os.path.join(path, "env_dir", "env", "bin"))
    os.symlink("/usr/bin/python3", os.path.join(path, "env_dir", "env", "bin", "python3"))
    write(path, "env_tar", 'name: "env_tar"\nbackend: "python"\n' + io + env_param % "e.tar.gz",
          env_model)
    open(os.path.join(path, "env_tar", "e.tar.gz"), "wb").close()
    write(path, "no_model_py", 'name: "no_model_py"\nbackend: "python"\n'
                               'input [ { name: "X" data_type: TYPE_FP32 dims: [ 1 ] } ]\n'
                               'output [ { name: "Y" data_type: TYPE_FP32 dims: [ 1 ] } ]\n', None)
    s = Server(path, ["--exit-on-error=false", "--disable-auto-complete-config"], "http")
    try:
        index = requests.post(s.http_url + "/v2/repository/index", timeout=30).json()
        reasons = {m["name"]: (m["state"], m.get("reason", "")) for m in index}
        for name, (_, text) in FAIL_MODELS.items():
            assert reasons[name][0] == "UNAVAILABLE" and text in reasons[name][1], reasons[name]
        assert reasons["env_dir"][0] == "READY", reasons["env_dir"]
        r = post(s, "env_dir", [{"name": "X", "datatype": "FP32",
                                 "data": np.array([1], np.float32)}])
        assert r.json()["outputs"][0]["data"] == [f"{path}/env_dir/env/bin/python3"]
        assert "Unrecognized archive format" in reasons["env_tar"][1], reasons["env_tar"]
        assert reasons["no_model_py"][1].endswith(
            "Failed to preinitialize Python stub: Python model file not found in "
            f"'{path}/no_model_py/1/model.py'")
    finally:
        assert s.stop() == 0, s.output()


def test_example_model(tmp_path):
    """examples/models/add_sub_python, over HTTP JSON."""
    import shutil
    from conftest import EXAMPLES
    path = str(tmp_path / "models")
    shutil.copytree(os.path.join(EXAMPLES, "add_sub_python"), os.path.join(path, "add_sub_python"))
    s = Server(path, [], "http")
    try:
        r = post(s, "add_sub_python", [
            {"name": "INPUT0", "datatype": "FP32", "data": np.array([1, 2, 3, 4], np.float32)},
            {"name": "INPUT1", "datatype": "FP32", "data": np.array([4, 3, 2, 1], np.float32)}])
        assert r.status_code == 200, r.text
        outs = {o["name"]: o["data"] for o in r.json()["outputs"]}
        assert outs == {"OUTPUT0": [5, 5, 5, 5], "OUTPUT1": [-3, -1, 1, 3]}
    finally:
        assert s.stop() == 0
    assert "add_sub_python: finalize" in open(s.log_path).read()


@pytest.mark.parametrize("how,why", [
    ("garbage", "malformed message header"),
    ("unsealed", "bad shared-memory region"),
    ("outside", "tensor 'OUT' lies outside its message"),
    ("outside_inputs", "malformed tensor description"),
    ("outside_results", "malformed tensor description"),
    ("outside_slots", "malformed tensor description"),
    ("bad_done", "malformed execute answer"),
])
def test_hostile_worker_messages(server, how, why):
    r = mode(server, how)
    assert r.status_code == 500
    if how.startswith("outside"):  # a forged answer: its tensor is refused, then the real one
        assert r.json()["error"] == f"Python model 'misbehave_0': {why}"
        # the worker exited after it: a request may still find it ending
        for _ in range(10):
            if mode(server, "ok").status_code == 200:
                break
    else:
        assert r.json()["error"].startswith("Stub process 'misbehave_0' is not healthy")
        assert why in server.output()
    assert mode(server, "ok").status_code == 200  # restarted


HANG_FINALIZE = """
import os
import time
import numpy as np
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def execute(self, requests):
        return [pb_utils.InferenceResponse([pb_utils.Tensor("Y", np.array([os.getpid()],
                                                                         np.int64))])
                for r in requests]

    def finalize(self):
        print("hang_finalize: finalize started", flush=True)
        time.sleep(3600)
"""


def test_unload_reload_and_finalize_timeout(tmp_path):
    """Explicit model control: unload ends the workers (finalize that hangs
    is cut off after stub-timeout-seconds), load starts new ones."""
    path = str(tmp_path / "models")
    cfg = ('name: "{}"\nbackend: "python"\n'
           'input [ { name: "X" data_type: TYPE_FP32 dims: [ 1 ] } ]\n'
           'output [ { name: "Y" data_type: TYPE_INT64 dims: [ 1 ] } ]\n'
           'instance_group [ { count: 2 kind: KIND_CPU } ]\n')
    write(path, "hang_finalize", cfg.replace("{}", "hang_finalize"), HANG_FINALIZE)
    s = Server(path, ["--model-control-mode=explicit", "--load-model=hang_finalize",
                      "--backend-config=python,stub-timeout-seconds=1",
                      "--backend-config=python,shm-default-byte-size=4194304"], "http")
    try:
        assert "shm-default-byte-size is accepted and ignored" in s.output()
        body = [{"name": "X", "datatype": "FP32", "data": np.array([1], np.float32)}]
        pid = post(s, "hang_finalize", body).json()["outputs"][0]["data"][0]
        assert os.path.exists(f"/proc/{pid}")
        r = requests.post(s.http_url + "/v2/repository/models/hang_finalize/unload", timeout=60)
        assert r.status_code == 200, r.text
        deadline = time.time() + 30
        while os.path.exists(f"/proc/{pid}") and time.time() < deadline:
            time.sleep(0.05)
        assert not os.path.exists(f"/proc/{pid}")
        assert "hang_finalize: finalize started" in s.output()
        r = requests.post(s.http_url + "/v2/repository/models/hang_finalize/load", timeout=60)
        assert r.status_code == 200, r.text
        new_pid = post(s, "hang_finalize", body).json()["outputs"][0]["data"][0]
        assert new_pid != pid
    finally:
        mine = workers(s.proc.pid)
        assert s.stop() == 0, s.output()
    assert not [p for p in mine if os.path.exists(f"/proc/{p}")]


def test_workers_exit_when_the_server_is_killed(tmp_path):
    path = str(tmp_path / "models")
    write(path, "add_sub", ADD_SUB_CONFIG, ADD_SUB)
    s = Server(path, [], "http")
    mine = workers(s.proc.pid)
    assert mine
    s.proc.kill()
    s.proc.wait()
    s.log.close()
    alive = lambda: [p for p in mine if os.path.exists(f"/proc/{p}")]
    deadline = time.time() + 30
    while alive() and time.time() < deadline:
        time.sleep(0.05)
    assert not alive()


def test_is_cancelled_sees_a_grpc_cancel(server, repo):
    marker = os.path.join(repo, "misbehave", "1", "running")
    req = pb.ModelInferRequest(model_name="misbehave")
    t = req.inputs.add()
    t.name, t.datatype = "MODE", "BYTES"
    t.shape.extend([1])
    t.contents.bytes_contents.append(b"wait_cancel")
    with grpc.insecure_channel(server.grpc_addr) as ch:
        fut = pbg.GRPCInferenceServiceStub(ch).ModelInfer.future(req, timeout=60)
        deadline = time.time() + 30
        while not os.path.exists(marker) and time.time() < deadline:
            time.sleep(0.01)
        assert os.path.exists(marker)
        fut.cancel()
    deadline = time.time() + 30
    while "misbehave: request cancelled" not in server.output() and time.time() < deadline:
        time.sleep(0.05)
    assert "misbehave: request cancelled" in server.output()
    os.unlink(marker)
    assert mode(server, "ok").status_code == 200
