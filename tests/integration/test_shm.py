"""System shared memory extension through the real binary: register,
unregister and status over HTTP and gRPC, inputs read from and outputs
written into POSIX shared memory regions (Python's multiprocessing
shared_memory, the same objects tritonclient.utils.shared_memory makes), the
bounds checks and texts of Triton's shared_memory_manager.cc, the
--allow-client-shm switch (off by default since Triton 26.05), and a region
unregistered while a request that uses it waits in the queue.
"""
import os
import re
import threading
import time
from multiprocessing import shared_memory

import grpc
import numpy as np
import pytest
import requests

from conftest import EXAMPLES
from grpc_util import stubs

DISABLED = ("Client shared memory is disabled. Start the server with "
            "'--allow-client-shm=true' to enable.")
_count = [0]


@pytest.fixture
def regions():
    """make(size) -> (key, SharedMemory); every region is unlinked at the end."""
    made = []

    def make(size):
        _count[0] += 1
        name = f"nereid_test_{os.getpid()}_{_count[0]}"
        seg = shared_memory.SharedMemory(name=name, create=True, size=size)
        made.append(seg)
        return "/" + name, seg

    yield make
    for seg in made:
        seg.close()
        seg.unlink()


def write_repo(tmp_path):
    repo = tmp_path / "models"
    repo.mkdir()
    os.symlink(os.path.join(EXAMPLES, "add_sub"), repo / "add_sub")
    os.symlink(os.path.join(EXAMPLES, "identity_fp32"), repo / "identity_fp32")
    # Requests wait in the queue (up to a minute) until 8 are there: a
    # request is known to be submitted, and held, while pending == 1.
    d = repo / "queued"
    (d / "1").mkdir(parents=True)
    (d / "config.pbtxt").write_text("""
name: "queued"
backend: "identity"
max_batch_size: 8
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 16 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 16 ] } ]
dynamic_batching { preferred_batch_size: [ 8 ] max_queue_delay_microseconds: 60000000 }
""")
    return str(repo)


@pytest.fixture
def server(nereid_server, tmp_path):
    return nereid_server(write_repo(tmp_path), "--allow-client-shm=true")


def post(server, path, body=None):
    return requests.post(server.http_url + path, json=body, timeout=30)


def register(server, name, key, byte_size, offset=None):
    body = {"key": key, "byte_size": byte_size}
    if offset is not None:
        body["offset"] = offset
    return post(server, f"/v2/systemsharedmemory/region/{name}/register", body)


def status(server, name=None):
    path = "/v2/systemsharedmemory" + (f"/region/{name}" if name else "") + "/status"
    return requests.get(server.http_url + path, timeout=30)


def shm_params(region, byte_size, offset=None):
    p = {"shared_memory_region": region, "shared_memory_byte_size": byte_size}
    if offset is not None:
        p["shared_memory_offset"] = offset
    return p


def add_sub_body(in0, in1, out0=None, out1=None):
    """in*: a shm parameter dict or a list of 16 numbers; out*: a shm
    parameter dict, or None for a JSON output."""
    inputs = []
    for name, v in (("INPUT0", in0), ("INPUT1", in1)):
        t = {"name": name, "datatype": "FP32", "shape": [1, 16]}
        if isinstance(v, dict):
            t["parameters"] = v
        else:
            t["data"] = v
        inputs.append(t)
    outputs = []
    for name, v in (("OUTPUT0", out0), ("OUTPUT1", out1)):
        outputs.append({"name": name, "parameters": v} if v else {"name": name})
    return {"inputs": inputs, "outputs": outputs}


A = np.arange(16, dtype=np.float32)
B = np.full(16, 2.5, dtype=np.float32)


def view(seg, offset=0, n=16):
    return np.frombuffer(seg.buf, dtype=np.float32, count=n, offset=offset)


def put(seg, arr, offset=0):
    seg.buf[offset:offset + arr.nbytes] = arr.tobytes()


def error(r):
    return r.json()["error"]


# ---- Registration ----------------------------------------------------------


def test_disabled_by_default(nereid_server, tmp_path, regions):
    s = nereid_server(write_repo(tmp_path))
    key, seg = regions(64)
    assert status(s).json() == []
    r = register(s, "r", key, 64)
    assert r.status_code == 501 and error(r) == DISABLED
    for path in ("/v2/systemsharedmemory/unregister", "/v2/systemsharedmemory/region/r/unregister",
                 "/v2/cudasharedmemory/unregister", "/v2/cudasharedmemory/region/r/register"):
        r = post(s, path)
        assert r.status_code == 501 and error(r) == DISABLED, path
    assert status(s).json() == []
    r = post(s, "/v2/models/add_sub/infer", add_sub_body(shm_params("r", 64), list(range(16))))
    assert r.status_code == 404
    assert error(r) == "Unable to find shared memory region: 'r'"
    pb, pb_grpc, _, _ = stubs()
    with grpc.insecure_channel(s.grpc_addr) as ch:
        stub = pb_grpc.GRPCInferenceServiceStub(ch)
        assert len(stub.SystemSharedMemoryStatus(pb.SystemSharedMemoryStatusRequest()).regions) == 0
        for call, req in ((stub.SystemSharedMemoryRegister,
                           pb.SystemSharedMemoryRegisterRequest(name="r", key=key, byte_size=64)),
                          (stub.SystemSharedMemoryUnregister,
                           pb.SystemSharedMemoryUnregisterRequest(name="r"))):
            with pytest.raises(grpc.RpcError) as e:
                call(req, timeout=10)
            assert e.value.code() == grpc.StatusCode.UNIMPLEMENTED
            assert e.value.details() == DISABLED
    # the server metadata names the extension either way
    assert "system_shared_memory" in requests.get(s.http_url + "/v2", timeout=10).json()[
        "extensions"]


def test_register_status_unregister(server, regions):
    k1, _ = regions(4096 + 128)
    k2, _ = regions(64)
    assert register(server, "b", k1, 128, offset=4096).status_code == 200
    assert register(server, "a", k2, 64).status_code == 200
    assert status(server).json() == [
        {"name": "a", "key": k2, "offset": 0, "byte_size": 64},
        {"name": "b", "key": k1, "offset": 4096, "byte_size": 128}]
    assert status(server, "b").json() == [{"name": "b", "key": k1, "offset": 4096,
                                           "byte_size": 128}]
    r = status(server, "zz")
    assert r.status_code == 404
    assert error(r) == "Unable to find system shared memory region: 'zz'"
    r = register(server, "a", k1, 8)
    assert r.status_code == 400 and error(r) == "shared memory region 'a' already in manager"
    assert post(server, "/v2/systemsharedmemory/region/zz/unregister").status_code == 200
    assert post(server, "/v2/systemsharedmemory/region/a/unregister").status_code == 200
    assert [x["name"] for x in status(server).json()] == ["b"]
    assert register(server, "a", k2, 64).status_code == 200
    assert post(server, "/v2/systemsharedmemory/unregister").status_code == 200
    assert status(server).json() == []
    # CUDA shared memory: Triton's answers when built without GPU support
    r = post(server, "/v2/cudasharedmemory/region/c/register",
             {"raw_handle": {"b64": ""}, "device_id": 0, "byte_size": 8})
    assert r.status_code == 400
    assert error(r) == "failed to register CUDA shared memory region: 'c', GPUs not supported"
    assert requests.get(server.http_url + "/v2/cudasharedmemory/status", timeout=10).json() == []
    r = requests.get(server.http_url + "/v2/cudasharedmemory/region/c/status", timeout=10)
    assert r.status_code == 404 and error(r) == "Unable to find cuda shared memory region: 'c'"
    assert post(server, "/v2/cudasharedmemory/unregister").status_code == 200


def test_register_errors(server, regions):
    key, _ = regions(64)
    cases = [
        (("r", "/", 8), 400, "cannot register shared memory region 'r' - invalid shm key '/'"),
        (("r", "///", 8), 400, "cannot register shared memory region 'r' - invalid shm key '///'"),
        (("r", "//triton_python_backend_shm_region_x", 8), 400,
         "cannot register shared memory region 'r' with key '//triton_python_backend_shm_region_x'"
         " as the key contains the reserved prefix 'triton_python_backend_shm_region_'"),
        # only names under /dev/shm: no path, no traversal
        (("r", "/../../etc/passwd", 8), 500, "Unable to open shared memory region: "
         "'/../../etc/passwd'"),
        (("r", key + "/x", 8), 500, f"Unable to open shared memory region: '{key}/x'"),
        (("r", "/..", 8), 500, "Unable to open shared memory region: '/..'"),
        (("r", "/nereid_no_such_region", 8), 500,
         "Unable to open shared memory region: '/nereid_no_such_region'"),
        (("r", key, 65), 400, "failed to register shared memory region 'r': invalid args"),
        (("r", key, 64, 1), 400, "failed to register shared memory region 'r': invalid args"),
        (("r", key, 1, 64), 400, "failed to register shared memory region 'r': invalid args"),
        (("r", key, 0, 65), 400, "failed to register shared memory region 'r': invalid args"),
        (("r", key, 0), 400,
         "failed to register shared memory region 'r': unable to process address space"
         "Invalid argument"),
    ]
    for args, code, text in cases:
        r = register(server, *args)
        assert (r.status_code, error(r)) == (code, text), args
    r = post(server, "/v2/systemsharedmemory/region/r/register", {"byte_size": 8})
    assert (r.status_code, error(r)) == (400, "Shared memory register request has no 'key' field")
    r = post(server, "/v2/systemsharedmemory/region/r/register", {"key": key})
    assert (r.status_code, error(r)) == (
        400, "Shared memory register request has no 'byte_size' field")
    r = post(server, "/v2/systemsharedmemory/region/r/register", {"key": 3, "byte_size": 8})
    assert (r.status_code, error(r)) == (500, "attempt to access JSON non-string as string")
    r = post(server, "/v2/systemsharedmemory/region/r/register", {"key": key, "byte_size": -1})
    assert r.status_code == 500
    assert status(server).json() == []
    # an unaligned offset works (Triton's mmap would refuse it)
    assert register(server, "r", key, 8, offset=3).status_code == 200


# ---- Inference over HTTP -----------------------------------------------------


def test_http_infer_inputs_and_outputs(server, regions):
    kin, sin = regions(128)
    kout, sout = regions(4096 + 128)
    put(sin, A)
    put(sin, B, 64)
    assert register(server, "in", kin, 128).status_code == 200
    assert register(server, "out", kout, 128, offset=4096).status_code == 200
    body = add_sub_body(shm_params("in", 64), shm_params("in", 64, 64),
                        shm_params("out", 64), shm_params("out", 64, 64))
    body["outputs"][1]["parameters"]["binary_data"] = False
    r = post(server, "/v2/models/add_sub/infer", body)
    assert r.status_code == 200, r.text
    assert r.headers["Content-Type"] == "application/json"
    # Triton: name, datatype and shape only; no data, no parameters
    assert r.json()["outputs"] == [
        {"name": "OUTPUT0", "datatype": "FP32", "shape": [1, 16]},
        {"name": "OUTPUT1", "datatype": "FP32", "shape": [1, 16]}]
    assert (view(sout, 4096) == A + B).all()
    assert (view(sout, 4096 + 64) == A - B).all()

    # mixed: one input in the body, one output as JSON
    put(sout, np.zeros(32, dtype=np.float32), 4096)
    body = add_sub_body(shm_params("in", 64), B.tolist(), None, shm_params("out", 64, 64))
    r = post(server, "/v2/models/add_sub/infer", body)
    assert r.status_code == 200, r.text
    outs = r.json()["outputs"]
    assert outs[0]["data"] == (A + B).tolist()
    assert outs[1] == {"name": "OUTPUT1", "datatype": "FP32", "shape": [1, 16]}
    assert (view(sout, 4096 + 64) == A - B).all()
    assert (view(sout, 4096) == 0).all()

    # the input is read where it is: a change to the region shows in the next result
    put(sin, B)
    r = post(server, "/v2/models/add_sub/infer",
             add_sub_body(shm_params("in", 64), shm_params("in", 64, 64)))
    assert r.json()["outputs"][0]["data"] == (B + B).tolist()

    # an unaligned place in the region, for an input and an output
    kodd, sodd = regions(256)
    put(sodd, A, 1)
    assert register(server, "odd", kodd, 256).status_code == 200
    r = post(server, "/v2/models/add_sub/infer",
             add_sub_body(shm_params("odd", 64, 1), B.tolist(), shm_params("odd", 64, 129)))
    assert r.status_code == 200, r.text
    assert (np.frombuffer(bytes(sodd.buf[129:193]), dtype=np.float32) == A + B).all()


def test_http_infer_errors(server, regions):
    kin, sin = regions(4096 + 64)
    kout, _ = regions(64)
    assert register(server, "in", kin, 64, offset=4096).status_code == 200
    assert register(server, "out", kout, 64).status_code == 200
    base = (shm_params("in", 64), A.tolist())
    cases = [
        (add_sub_body(shm_params("nope", 64), A.tolist()), 404,
         "Unable to find shared memory region: 'nope'"),
        (add_sub_body(*base, shm_params("out", 64, 64)), 400,
         "Invalid offset for shared memory region: 'out'"),
        (add_sub_body(*base, shm_params("out", 64, 2**64 - 32)), 400,
         "Invalid offset for shared memory region: 'out'"),
        (add_sub_body(*base, shm_params("out", 64, 1)), 400,
         "Invalid offset + byte size for shared memory region: 'out'"),
        (add_sub_body(*base, shm_params("out", 2**64 - 32, 32)), 400,
         "Integer overflow detected: byte_size (18446744073709551584) + offset (32) exceeds "
         "maximum value (18446744073709551615) for region 'out'"),
        (add_sub_body(shm_params("in", 60), A.tolist()), 400,
         "input byte size mismatch for input 'INPUT0' for model 'add_sub'. Expected 64, got 60"),
        (add_sub_body(*base, shm_params("out", 32)), 500,
         "shared memory size specified with the request for output 'OUTPUT0' (32 bytes) should "
         "be at least 64 bytes to hold the results"),
        (add_sub_body({"shared_memory_region": 3}, A.tolist()), 500,
         "Unable to parse 'shared_memory_region': attempt to access JSON non-string as string"),
        (add_sub_body({"shared_memory_region": "in", "shared_memory_offset": -1}, A.tolist()),
         500, "Unable to parse 'shared_memory_offset': attempt to access JSON "
         "non-unsigned-integer as unsigned-integer"),
    ]
    for body, code, text in cases:
        r = post(server, "/v2/models/add_sub/infer", body)
        assert r.status_code == code and text in error(r), (body, r.text)
    body = add_sub_body(*base, shm_params("out", 64))
    body["outputs"][0]["parameters"]["binary_data"] = True
    r = post(server, "/v2/models/add_sub/infer", body)
    assert (r.status_code, error(r)) == (
        400, "Output can't set both 'shared_memory_region' and 'binary_data'")
    body["outputs"][0]["parameters"] = dict(shm_params("out", 64), classification=2)
    r = post(server, "/v2/models/add_sub/infer", body)
    assert (r.status_code, error(r)) == (
        400, "Output can't set both 'shared_memory_region' and 'classification'")
    body = add_sub_body(shm_params("in", 64), A.tolist())
    body["inputs"][0]["data"] = A.tolist()
    r = post(server, "/v2/models/add_sub/infer", body)
    assert r.status_code == 400 and error(r).endswith("But set 'data' 'shared_memory_region'")


# ---- gRPC ------------------------------------------------------------------


def shm_tensor_params(t, region, byte_size, offset=None):
    t.parameters["shared_memory_region"].string_param = region
    t.parameters["shared_memory_byte_size"].int64_param = byte_size
    if offset is not None:
        t.parameters["shared_memory_offset"].int64_param = offset


def grpc_add_sub(pb, in0, in1, out0, out1):
    req = pb.ModelInferRequest(model_name="add_sub")
    for name, v in (("INPUT0", in0), ("INPUT1", in1)):
        t = req.inputs.add()
        t.name, t.datatype = name, "FP32"
        t.shape.extend([1, 16])
        if isinstance(v, tuple):
            shm_tensor_params(t, *v)
        else:
            req.raw_input_contents.append(v.tobytes())
    for name, v in (("OUTPUT0", out0), ("OUTPUT1", out1)):
        o = req.outputs.add()
        o.name = name
        if v:
            shm_tensor_params(o, *v)
    return req


def test_grpc(server, regions):
    pb, pb_grpc, _, _ = stubs()
    kin, sin = regions(128)
    kout, sout = regions(128)
    put(sin, A)
    put(sin, B, 64)
    with grpc.insecure_channel(server.grpc_addr) as ch:
        stub = pb_grpc.GRPCInferenceServiceStub(ch)
        stub.SystemSharedMemoryRegister(
            pb.SystemSharedMemoryRegisterRequest(name="in", key=kin, byte_size=128), timeout=10)
        stub.SystemSharedMemoryRegister(
            pb.SystemSharedMemoryRegisterRequest(name="out", key=kout, byte_size=128), timeout=10)
        st = stub.SystemSharedMemoryStatus(pb.SystemSharedMemoryStatusRequest(), timeout=10)
        assert sorted(st.regions) == ["in", "out"]
        assert (st.regions["in"].name, st.regions["in"].key, st.regions["in"].byte_size) == (
            "in", kin, 128)
        st = stub.SystemSharedMemoryStatus(pb.SystemSharedMemoryStatusRequest(name="out"))
        assert list(st.regions) == ["out"]

        resp = stub.ModelInfer(grpc_add_sub(pb, ("in", 64), ("in", 64, 64), ("out", 64),
                                            ("out", 64, 64)), timeout=30)
        assert [(o.name, o.datatype, list(o.shape), dict(o.parameters)) for o in resp.outputs] \
            == [("OUTPUT0", "FP32", [1, 16], {}), ("OUTPUT1", "FP32", [1, 16], {})]
        assert list(resp.raw_output_contents) == [b"", b""]
        assert (view(sout) == A + B).all() and (view(sout, 64) == A - B).all()

        # mixed: raw input, raw output
        put(sout, np.zeros(32, dtype=np.float32))
        resp = stub.ModelInfer(grpc_add_sub(pb, ("in", 64), B, None, ("out", 64, 64)))
        assert np.frombuffer(resp.raw_output_contents[0], dtype=np.float32).tolist() == \
            (A + B).tolist()
        assert resp.raw_output_contents[1] == b"" and (view(sout, 64) == A - B).all()

        # the same through ModelStreamInfer
        put(sout, np.zeros(32, dtype=np.float32))
        req = grpc_add_sub(pb, ("in", 64), ("in", 64, 64), ("out", 64), None)
        (sresp,) = list(stub.ModelStreamInfer(iter([req]), timeout=30))
        assert sresp.error_message == "" and sresp.infer_response.raw_output_contents[0] == b""
        assert (view(sout) == A + B).all()

        errors = [
            (grpc_add_sub(pb, ("nope", 64), B, None, None), grpc.StatusCode.NOT_FOUND,
             "Unable to find shared memory region: 'nope'"),
            (grpc_add_sub(pb, ("in", 64), B, ("out", 64, 128), None),
             grpc.StatusCode.INVALID_ARGUMENT, "Invalid offset for shared memory region: 'out'"),
            (grpc_add_sub(pb, ("in", 64), B, ("out", 64, -1), None),
             grpc.StatusCode.INVALID_ARGUMENT, "Invalid offset for shared memory region: 'out'"),
            (grpc_add_sub(pb, ("in", 64, 65), B, None, None), grpc.StatusCode.INVALID_ARGUMENT,
             "Invalid offset + byte size for shared memory region: 'in'"),
            (grpc_add_sub(pb, ("in", 128), B, None, None), grpc.StatusCode.INVALID_ARGUMENT,
             "input byte size mismatch for input 'INPUT0' for model 'add_sub'. "
             "Expected 64, got 128"),
            (grpc_add_sub(pb, ("in", 64), B, ("out", 16), None), grpc.StatusCode.INTERNAL,
             "shared memory size specified with the request for output 'OUTPUT0' (16 bytes) "
             "should be at least 64 bytes to hold the results"),
        ]
        req = grpc_add_sub(pb, ("in", 64), B, None, None)
        del req.inputs[0].parameters["shared_memory_byte_size"]
        errors.append((req, grpc.StatusCode.INVALID_ARGUMENT,
                       "'shared_memory_byte_size' must be specified along with "
                       "'shared_memory_region' parameter for tensor 'INPUT0'"))
        req = grpc_add_sub(pb, ("in", 64), B, None, None)
        req.inputs[0].contents.fp32_contents.extend(A.tolist())
        errors.append((req, grpc.StatusCode.INVALID_ARGUMENT,
                       "unexpected 'content' provided when using shared memory for input "
                       "tensor 'INPUT0' for model 'add_sub'"))
        req = grpc_add_sub(pb, ("in", 64), B, ("out", 64), None)
        req.outputs[0].parameters["classification"].int64_param = 1
        errors.append((req, grpc.StatusCode.INVALID_ARGUMENT,
                       "output can't set both 'shared_memory_region' and 'classification'"))
        for req, code, text in errors:
            with pytest.raises(grpc.RpcError) as e:
                stub.ModelInfer(req, timeout=30)
            assert (e.value.code(), text in e.value.details()) == (code, True), e.value.details()

        with pytest.raises(grpc.RpcError) as e:
            stub.SystemSharedMemoryRegister(
                pb.SystemSharedMemoryRegisterRequest(name="in", key=kin, byte_size=8))
        assert e.value.code() == grpc.StatusCode.ALREADY_EXISTS
        # offset + byte_size past 2**64 is out of the object, not a wrap-around
        with pytest.raises(grpc.RpcError) as e:
            stub.SystemSharedMemoryRegister(pb.SystemSharedMemoryRegisterRequest(
                name="big", key=kin, offset=2**64 - 8, byte_size=16))
        assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert e.value.details() == "failed to register shared memory region 'big': invalid args"
        with pytest.raises(grpc.RpcError) as e:
            stub.SystemSharedMemoryStatus(pb.SystemSharedMemoryStatusRequest(name="x"))
        assert e.value.code() == grpc.StatusCode.NOT_FOUND
        assert e.value.details() == "Unable to find system shared memory region: 'x'"
        with pytest.raises(grpc.RpcError) as e:
            stub.CudaSharedMemoryRegister(pb.CudaSharedMemoryRegisterRequest(name="c"))
        assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert e.value.details() == \
            "failed to register CUDA shared memory region: 'c', GPUs not supported"
        with pytest.raises(grpc.RpcError) as e:
            stub.CudaSharedMemoryStatus(pb.CudaSharedMemoryStatusRequest(name="in"))
        assert e.value.details() == \
            "The region named 'in' is registered as system shared memory, not CUDA shared memory"
        assert len(stub.CudaSharedMemoryStatus(pb.CudaSharedMemoryStatusRequest()).regions) == 0
        stub.CudaSharedMemoryUnregister(pb.CudaSharedMemoryUnregisterRequest())
        stub.SystemSharedMemoryUnregister(pb.SystemSharedMemoryUnregisterRequest(name="in"))
        stub.SystemSharedMemoryUnregister(pb.SystemSharedMemoryUnregisterRequest())
        assert len(stub.SystemSharedMemoryStatus(pb.SystemSharedMemoryStatusRequest()).regions) \
            == 0


# ---- Unregistered while in use ------------------------------------------------


def pending(server, model):
    text = requests.get(server.metrics_url + "/metrics", timeout=10).text
    m = re.search(r'nv_inference_pending_request_count\{model="%s",version="1"\} (\d+)' % model,
                  text)
    return int(m.group(1)) if m else 0


def wait_pending(server, model, n):
    deadline = time.time() + 60
    while pending(server, model) != n:
        assert time.time() < deadline, f"pending never reached {n}"
        time.sleep(0.01)


@pytest.mark.parametrize("how", ["http-one", "http-all", "grpc"])
def test_unregister_while_in_use(server, regions, how):
    """The queued request holds its regions: unregistering them succeeds, they
    stay listed (Triton's rule) and mapped, and go when the request is done."""
    kin, sin = regions(64)
    kout, sout = regions(64)
    put(sin, A)
    assert register(server, "in", kin, 64).status_code == 200
    assert register(server, "out", kout, 64).status_code == 200
    body = {"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1, 16],
                        "parameters": shm_params("in", 64)}],
            "outputs": [{"name": "OUTPUT0", "parameters": shm_params("out", 64)}]}
    result = {}

    def run():
        if how == "grpc":
            pb, pb_grpc, _, _ = stubs()
            req = pb.ModelInferRequest(model_name="queued")
            t = req.inputs.add()
            t.name, t.datatype = "INPUT0", "FP32"
            t.shape.extend([1, 16])
            shm_tensor_params(t, "in", 64)
            o = req.outputs.add()
            o.name = "OUTPUT0"
            shm_tensor_params(o, "out", 64)
            with grpc.insecure_channel(server.grpc_addr) as ch:
                resp = pb_grpc.GRPCInferenceServiceStub(ch).ModelInfer(req, timeout=120)
                result["raw"] = list(resp.raw_output_contents)
        else:
            result["http"] = post(server, "/v2/models/queued/infer", body)

    th = threading.Thread(target=run)
    th.start()
    wait_pending(server, "queued", 1)
    if how == "http-one":
        assert post(server, "/v2/systemsharedmemory/region/in/unregister").status_code == 200
        assert post(server, "/v2/systemsharedmemory/region/out/unregister").status_code == 200
    else:
        assert post(server, "/v2/systemsharedmemory/unregister").status_code == 200
    assert [x["name"] for x in status(server).json()] == ["in", "out"]
    r = register(server, "in", kin, 64)
    assert (r.status_code, error(r)) == (400, "shared memory region 'in' already in manager")
    # fill the batch: the queued request runs now
    fill = {"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [7, 16],
                        "data": np.zeros(7 * 16).tolist()}]}
    assert post(server, "/v2/models/queued/infer", fill).status_code == 200
    th.join(120)
    assert not th.is_alive()
    if how == "grpc":
        assert result["raw"] == [b""]
    else:
        assert result["http"].status_code == 200, result["http"].text
    assert (view(sout) == A).all()
    assert status(server).json() == []
    assert status(server, "in").status_code == 404
    assert register(server, "in", kin, 64).status_code == 200
