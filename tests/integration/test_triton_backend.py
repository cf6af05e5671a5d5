"""Triton backends (libtriton_<name>.so) served by build/nereid through
libtritonserver.so: the test backends of tests/tritonbackends/ (written
against Nereid's include/triton/core headers) over HTTP and gRPC, every
datatype, batching, decoupled streaming, the backend-contract errors and the
load errors; and, when an out dir of /work/shared/compat/tritonbackends/
build.sh is given (NEREID_TRITON_COMPAT_DIR), Triton's own backends."""
import concurrent.futures
import json
import os
import shutil
import struct

import grpc
import numpy as np
import pytest
import requests

from conftest import BUILD
from grpc_util import stubs
from http_helpers import DATATYPES, write_model

pb, pbg, _, _ = stubs()

TB = os.path.join(BUILD, "tritonbackends")


def lib(name):
    return os.path.join(TB, name, f"libtriton_{name}.so")


def identity_config(name, cfg, backend="tidentity", extra=""):
    return f"""
name: "{name}"
backend: "{backend}"
max_batch_size: 0
input [ {{ name: "INPUT0" data_type: {cfg} dims: [ -1 ] }} ]
output [ {{ name: "OUTPUT0" data_type: {cfg} dims: [ -1 ] }} ]
{extra}
"""


@pytest.fixture(scope="module")
def layout(tmp_path_factory):
    root = tmp_path_factory.mktemp("triton")
    backends = root / "backends"
    for name in ("tidentity", "trepeat", "tbadversion", "tnoexecute", "taccumulate", "titerate"):
        os.makedirs(backends / name)
        os.symlink(lib(name), backends / name / f"libtriton_{name}.so")
    # Nereid's own identity backend, in the same backend directory
    os.symlink(os.path.join(BUILD, "backends", "libnereid_identity.so"),
               backends / "libnereid_identity.so")
    repo = str(root / "models")
    os.makedirs(repo)
    for dt, (_, cfg) in DATATYPES.items():
        write_model(repo, f"t_{dt.lower()}", identity_config(f"t_{dt.lower()}", cfg))
    write_model(repo, "t_batch", """
name: "t_batch"
backend: "tidentity"
max_batch_size: 8
dynamic_batching { max_queue_delay_microseconds: 20000 }
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 2 ] }, { name: "INPUT1" data_type: TYPE_INT64 dims: [ 1 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 2 ] }, { name: "OUTPUT1" data_type: TYPE_INT64 dims: [ 1 ] } ]
instance_group [ { count: 2 kind: KIND_CPU } ]
""")
    write_model(repo, "t_seq", """
name: "t_seq"
backend: "tidentity"
max_batch_size: 0
sequence_batching { }
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ -1 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ -1 ] },
         { name: "CORRID" data_type: TYPE_UINT64 dims: [ 1 ] },
         { name: "FLAGS" data_type: TYPE_UINT32 dims: [ 1 ] } ]
""")
    write_model(repo, "t_state", """
name: "t_state"
backend: "taccumulate"
max_batch_size: 0
sequence_batching {
  state [ { input_name: "INPUT_STATE" output_name: "OUTPUT_STATE" data_type: TYPE_INT32
            dims: [ 1 ] initial_state { data_type: TYPE_INT32 dims: [ 1 ] zero_data: true
            name: "zero" } } ]
}
input [ { name: "INPUT" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [ { name: "OUTPUT" data_type: TYPE_INT32 dims: [ 1 ] } ]
""")
    write_model(repo, "t_state_single", """
name: "t_state_single"
backend: "taccumulate"
max_batch_size: 0
sequence_batching {
  state [ { input_name: "INPUT_STATE" output_name: "OUTPUT_STATE" data_type: TYPE_INT32
            dims: [ 1 ] use_same_buffer_for_input_output: true } ]
}
input [ { name: "INPUT" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [ { name: "OUTPUT" data_type: TYPE_INT32 dims: [ 1 ] },
         { name: "SAME" data_type: TYPE_INT32 dims: [ 1 ] },
         { name: "MEMTYPE" data_type: TYPE_INT32 dims: [ 1 ] } ]
""")
    for name, sched in (("t_iterate", "sequence_batching { iterative_sequence: true }"),
                        ("t_iterate_direct", "sequence_batching { direct { } }"),
                        ("t_iterate_dynamic", "dynamic_batching { }")):
        write_model(repo, name, f"""
name: "{name}"
backend: "titerate"
max_batch_size: 0
model_transaction_policy {{ decoupled: true }}
{sched}
input [ {{ name: "INPUT" data_type: TYPE_INT32 dims: [ 1 ] }} ]
output [ {{ name: "OUTPUT" data_type: TYPE_INT32 dims: [ 1 ] }},
         {{ name: "FLAGS" data_type: TYPE_INT32 dims: [ 1 ] }} ]
""")
    write_model(repo, "t_ragged_seq", """
name: "t_ragged_seq"
backend: "tidentity"
max_batch_size: 4
sequence_batching { oldest { max_candidate_sequences: 4 preferred_batch_size: [ 2 ]
                             max_queue_delay_microseconds: 30000000 } }
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ -1 ] allow_ragged_batch: true } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ -1 ] } ]
""")
    write_model(repo, "t_ensemble", """
name: "t_ensemble"
platform: "ensemble"
max_batch_size: 0
input [ { name: "IN" data_type: TYPE_FP32 dims: [ -1 ] } ]
output [ { name: "OUT" data_type: TYPE_FP32 dims: [ -1 ] } ]
ensemble_scheduling { step [
  { model_name: "t_fp32" model_version: -1
    input_map { key: "INPUT0" value: "IN" } output_map { key: "OUTPUT0" value: "MID" } },
  { model_name: "t_batch_free" model_version: -1
    input_map { key: "INPUT0" value: "MID" } output_map { key: "OUTPUT0" value: "OUT" } } ] }
""")
    write_model(repo, "t_batch_free", identity_config("t_batch_free", "TYPE_FP32"))
    write_model(repo, "t_passive", identity_config(
        "t_passive", "TYPE_FP32", extra="instance_group [ { count: 1 kind: KIND_CPU }, "
        "{ count: 2 kind: KIND_CPU passive: true } ]"))
    write_model(repo, "t_fail_model", identity_config(
        "t_fail_model", "TYPE_FP32",
        extra='parameters { key: "fail" value: { string_value: "model_init" } }'))
    write_model(repo, "t_fail_instance", identity_config(
        "t_fail_instance", "TYPE_FP32",
        extra='parameters { key: "fail" value: { string_value: "instance_init" } }'))
    write_model(repo, "t_badversion", identity_config("t_badversion", "TYPE_FP32", "tbadversion"))
    write_model(repo, "t_noexecute", identity_config("t_noexecute", "TYPE_FP32", "tnoexecute"))
    write_model(repo, "t_missing", identity_config("t_missing", "TYPE_FP32", "nosuchbackend"))
    # found in the model directory through `runtime`, and in the version directory
    d = write_model(repo, "t_runtime", identity_config(
        "t_runtime", "TYPE_INT32", "custom", 'runtime: "libtriton_tidentity.so"'))
    shutil.copy(lib("tidentity"), os.path.join(repo, "t_runtime", "libtriton_tidentity.so"))
    write_model(repo, "t_versiondir", identity_config("t_versiondir", "TYPE_INT32", "vonly"))
    shutil.copy(lib("tidentity"), os.path.join(repo, "t_versiondir", "1", "libtriton_vonly.so"))
    write_model(repo, "nereid_identity", identity_config("nereid_identity", "TYPE_FP32", "identity"))
    write_model(repo, "t_repeat", """
name: "t_repeat"
backend: "trepeat"
max_batch_size: 0
model_transaction_policy { decoupled: true }
input [ { name: "IN" data_type: TYPE_INT32 dims: [ -1 ] } ]
output [ { name: "OUT" data_type: TYPE_INT32 dims: [ 1 ] } ]
""")
    write_model(repo, "t_repeat_coupled", """
name: "t_repeat_coupled"
backend: "trepeat"
max_batch_size: 0
input [ { name: "IN" data_type: TYPE_INT32 dims: [ -1 ] } ]
output [ { name: "OUT" data_type: TYPE_INT32 dims: [ 1 ] } ]
""")
    del d
    return str(backends), repo


@pytest.fixture(scope="module")
def server(layout):
    from conftest import Server
    backends, repo = layout
    s = Server(repo, [f"--backend-directory={backends}", "--exit-on-error=false",
                      "--backend-config=tidentity,greeting=hello"])
    yield s
    assert s.stop() == 0, s.output()


@pytest.fixture
def stub(server):
    with grpc.insecure_channel(server.grpc_addr) as ch:
        yield pbg.GRPCInferenceServiceStub(ch)


def infer_json(server, model, inputs, parameters=None):
    body = {"inputs": inputs}
    if parameters:
        body["parameters"] = parameters
    return requests.post(f"{server.http_url}/v2/models/{model}/infer", json=body, timeout=30)


def f32(values):
    return {"name": "INPUT0", "datatype": "FP32", "shape": [len(values)], "data": values}


# ---- Loading ----

def test_models_load_with_triton_lifecycle(server):
    index = requests.post(f"{server.http_url}/v2/repository/index", timeout=10).json()
    state = {m["name"]: (m["state"], m.get("reason", "")) for m in index}
    for dt in DATATYPES:
        assert state[f"t_{dt.lower()}"][0] == "READY"
    for name in ("t_batch", "t_seq", "t_state", "t_runtime", "t_versiondir", "nereid_identity", "t_repeat"):
        assert state[name][0] == "READY", state[name]
    assert state["t_fail_model"] == (
        "UNAVAILABLE", "Invalid argument: tidentity: model initialization failed as configured")
    assert state["t_fail_instance"][0] == "UNAVAILABLE"
    assert "tidentity: instance initialization failed as configured" in state["t_fail_instance"][1]
    assert state["t_badversion"][0] == "UNAVAILABLE"
    assert ("backend 'tbadversion' failed to initialize: triton backend API version does not "
            "support this backend") in state["t_badversion"][1]
    assert state["t_noexecute"][0] == "UNAVAILABLE"
    assert "does not export TRITONBACKEND_ModelInstanceExecute" in state["t_noexecute"][1]
    assert state["t_missing"] == (
        "UNAVAILABLE", "Invalid argument: unable to find backend library for backend "
        "'nosuchbackend', try specifying runtime on the model configuration.")
    out = server.output()
    # TRITONBACKEND_Initialize ran once, logged through TRITONSERVER_LogMessage
    assert out.count("tidentity initialized: backend tidentity, API 1.19") == 1
    # TRITONBACKEND_BackendConfig: --backend-config for this backend as Triton's JSON
    # (log messages are JSON strings, as Triton writes them: quotes escaped)
    assert '\\"greeting\\":\\"hello\\"' in out and '{\\"cmdline\\":{' in out
    assert "tidentity.c:" in out


# ---- Every datatype, HTTP and gRPC ----

def test_http_json_datatypes(server):
    cases = {"BOOL": [True, False, True], "UINT8": [0, 7, 255], "INT16": [-3, 0, 3],
             "UINT64": [0, 2**64 - 1], "INT64": [-(2**63), 5], "FP32": [1.5, -2.0],
             "FP64": [0.1, 1e300], "BYTES": ["", "abc", "hello world"]}
    for dt, values in cases.items():
        r = infer_json(server, f"t_{dt.lower()}",
                       [{"name": "INPUT0", "datatype": dt, "shape": [len(values)], "data": values}])
        assert r.status_code == 200, r.text
        out = r.json()["outputs"][0]
        assert out["name"] == "OUTPUT0" and out["datatype"] == dt
        assert out["shape"] == [len(values)] and out["data"] == values


def raw(dt, n):
    if dt == "BYTES":
        items = [b"", b"x" * 3, bytes(range(256))][:n]
        return b"".join(struct.pack("<I", len(b)) + b for b in items), len(items)
    if dt == "BF16":
        return np.arange(n, dtype=np.uint16).tobytes(), n
    arr = (np.arange(n) % 2).astype(DATATYPES[dt][0]) if dt == "BOOL" else \
        np.arange(n).astype(DATATYPES[dt][0])
    return arr.tobytes(), n


def grpc_f32(model):
    req = pb.ModelInferRequest(model_name=model)
    t = req.inputs.add()
    t.name, t.datatype = "INPUT0", "FP32"
    t.shape.extend([1])
    req.raw_input_contents.append(np.array([1], np.float32).tobytes())
    return req


PARAMS = {"param0": "an example", "param1": 42, "param2": False, "param3": 0.5}


def test_response_parameters_http(server):
    r = infer_json(server, "t_fp32", [f32([1.0])])
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["parameters"] == PARAMS
    # Triton's order: model_name, model_version, parameters, outputs
    assert list(body) == ["model_name", "model_version", "parameters", "outputs"]
    # a Nereid backend's responses carry what it sets: the identity
    # backend, Triton's example parameters
    r = infer_json(server, "nereid_identity", [f32([1.0])])
    assert r.json()["parameters"] == {"param0": "an example string parameter", "param1": 42,
                                      "param2": False, "param3": 123.123}


def test_response_parameters_grpc(stub):
    req = grpc_f32("t_fp32")
    resp = stub.ModelInfer(req, timeout=30)
    p = resp.parameters
    assert (p["param0"].string_param, p["param1"].int64_param, p["param2"].bool_param,
            p["param3"].double_param) == ("an example", 42, False, 0.5)
    assert len(p) == 4


def test_grpc_raw_every_datatype(stub):
    for dt in DATATYPES:
        data, n = raw(dt, 3)
        req = pb.ModelInferRequest(model_name=f"t_{dt.lower()}")
        t = req.inputs.add()
        t.name, t.datatype = "INPUT0", dt
        t.shape.extend([n])
        req.raw_input_contents.append(data)
        resp = stub.ModelInfer(req, timeout=30)
        assert resp.outputs[0].name == "OUTPUT0" and resp.outputs[0].datatype == dt
        assert list(resp.outputs[0].shape) == [n]
        assert resp.raw_output_contents[0] == data, dt


def test_runtime_and_version_directory_search(server):
    for model in ("t_runtime", "t_versiondir"):
        r = infer_json(server, model,
                       [{"name": "INPUT0", "datatype": "INT32", "shape": [2], "data": [4, 2]}])
        assert r.status_code == 200 and r.json()["outputs"][0]["data"] == [4, 2], r.text


def test_nereid_backend_beside_triton_backends(server):
    r = infer_json(server, "nereid_identity", [f32([1.0, 2.0])])
    assert r.status_code == 200 and r.json()["outputs"][0]["data"] == [1.0, 2.0], r.text


def test_sequence_id_and_flags(server):
    got = []
    for params in ({"sequence_id": 42, "sequence_start": True}, {"sequence_id": 42},
                   {"sequence_id": 42, "sequence_end": True}):
        r = infer_json(server, "t_seq", [f32([1.0])], parameters=params)
        assert r.status_code == 200, r.text
        outs = {o["name"]: o["data"] for o in r.json()["outputs"]}
        got.append((outs["CORRID"], outs["FLAGS"], outs["OUTPUT0"]))
    assert got == [([42], [1], [1.0]), ([42], [0], [1.0]), ([42], [2], [1.0])]
    # a request without a sequence id: 0, no error (Triton's bls relies on it)
    r = infer_json(server, "t_fp32", [f32([1.0])])
    assert r.status_code == 200


def test_implicit_state(server):
    def step(value, **params):
        r = infer_json(server, "t_state",
                       [{"name": "INPUT", "datatype": "INT32", "shape": [1], "data": [value]}],
                       parameters=dict(sequence_id=7, **params))
        assert r.status_code == 200, r.text
        return r.json()["outputs"][0]["data"][0]
    assert step(1, sequence_start=True) == 1
    assert step(2) == 3
    assert step(10, skip_update=True) == 13  # no StateNew: the state stays 3
    assert step(4, sequence_end=True) == 7
    assert step(5, sequence_start=True) == 5  # a new sequence starts from zero
    r = infer_json(server, "t_state",
                   [{"name": "INPUT", "datatype": "INT32", "shape": [1], "data": [1]}],
                   parameters={"sequence_id": 8, "sequence_start": True, "bad_state": True})
    assert r.status_code == 400 and r.json()["error"] == "state 'NOPE' is not a valid state name."


def state_step(server, model, seq, value, **params):
    r = infer_json(server, model,
                   [{"name": "INPUT", "datatype": "INT32", "shape": [1], "data": [value]}],
                   parameters=dict(sequence_id=seq, **params))
    assert r.status_code == 200, r.text
    return {o["name"]: o["data"][0] for o in r.json()["outputs"]}


def test_state_is_committed_by_state_update_only(server):
    assert state_step(server, "t_state", 9, 1, sequence_start=True)["OUTPUT"] == 1
    # buffer written, StateUpdate not called: the sequence keeps state 1 (Triton)
    assert state_step(server, "t_state", 9, 2, no_commit=True)["OUTPUT"] == 3
    assert state_step(server, "t_state", 9, 4)["OUTPUT"] == 5
    assert state_step(server, "t_state", 9, 1, sequence_end=True)["OUTPUT"] == 6


def test_single_buffer_state_is_written_in_place(server):
    out = state_step(server, "t_state_single", 11, 1, sequence_start=True, report_buffer=True)
    # the state buffer is the input state's own memory; GPU asked -> host memory as CPU_PINNED
    assert out == {"OUTPUT": 1, "SAME": 1, "MEMTYPE": 1}
    # no StateUpdate: with one buffer for input and output the write is the state
    assert state_step(server, "t_state_single", 11, 2, no_commit=True)["OUTPUT"] == 3
    out = state_step(server, "t_state_single", 11, 4, report_buffer=True)
    assert out["OUTPUT"] == 7 and out["SAME"] == 1
    assert state_step(server, "t_state_single", 11, 1, sequence_end=True)["OUTPUT"] == 8
    # a new sequence starts from the zero initial state, in a buffer of its own
    assert state_step(server, "t_state_single", 11, 5, sequence_start=True)["OUTPUT"] == 5


def test_ensemble_of_triton_models(server):
    r = infer_json(server, "t_ensemble",
                   [{"name": "IN", "datatype": "FP32", "shape": [3], "data": [1.5, 2.5, 3.5]}])
    assert r.status_code == 200, r.text
    assert r.json()["outputs"][0]["data"] == [1.5, 2.5, 3.5]


# ---- Batching, instances, statistics ----

def test_dynamic_batches_answer_each_request(server):
    def one(i):
        r = infer_json(server, "t_batch", [
            {"name": "INPUT0", "datatype": "FP32", "shape": [1, 2], "data": [i, -i]},
            {"name": "INPUT1", "datatype": "INT64", "shape": [1, 1], "data": [i * 10]}])
        assert r.status_code == 200, r.text
        outs = {o["name"]: o for o in r.json()["outputs"]}
        assert outs["OUTPUT0"]["data"] == [i, -i] and outs["OUTPUT0"]["shape"] == [1, 2]
        assert outs["OUTPUT1"]["data"] == [i * 10]
    with concurrent.futures.ThreadPoolExecutor(16) as pool:
        list(pool.map(one, range(64)))
    stats = requests.get(f"{server.http_url}/v2/models/t_batch/stats", timeout=10).json()
    s = stats["model_stats"][0]
    # counted once per request by the core, not again from the backend's reports
    assert s["inference_count"] == 64
    assert s["inference_stats"]["success"]["count"] == 64
    assert sum(b["batch_size"] * b["compute_infer"]["count"] for b in s["batch_stats"]) == 64


def test_statistics_count_each_request_once(server):
    before = requests.get(f"{server.http_url}/v2/models/t_fp64/stats", timeout=10).json()
    n0 = before["model_stats"][0]["inference_stats"]["success"]["count"]
    for _ in range(3):
        assert infer_json(server, "t_fp64", [
            {"name": "INPUT0", "datatype": "FP64", "shape": [1], "data": [1.0]}]).status_code == 200
    after = requests.get(f"{server.http_url}/v2/models/t_fp64/stats", timeout=10).json()
    s = after["model_stats"][0]
    assert s["inference_stats"]["success"]["count"] == n0 + 3
    assert s["execution_count"] == before["model_stats"][0]["execution_count"] + 3


def test_passive_instances_are_never_given_requests(server):
    """instance_group passive: true (Triton's L0_passive_instance): the
    instances are initialized (TRITONBACKEND_ModelInstanceIsPassive says
    so) but no request reaches them; tidentity fails any execute on one."""
    def one(i):
        return infer_json(server, "t_passive", [
            {"name": "INPUT0", "datatype": "FP32", "shape": [1], "data": [float(i)]}])
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        replies = list(pool.map(one, range(40)))
    assert [r.status_code for r in replies] == [200] * 40, [r.text for r in replies][:3]
    stats = requests.get(f"{server.http_url}/v2/models/t_passive/stats", timeout=10).json()
    assert stats["model_stats"][0]["inference_stats"]["success"]["count"] == 40
    out = server.output()
    assert out.count("tidentity: passive instance t_passive_1_") == 2
    assert "tidentity: passive instance t_passive_0_" not in out


def test_custom_metrics_on_metrics_page(server):
    line = 'tidentity_input_bytes{model="t_int16",version="1"} '

    def value():
        text = requests.get(f"{server.metrics_url}/metrics", timeout=10).text
        assert "# HELP tidentity_input_bytes Input bytes received by tidentity" in text
        assert "# TYPE tidentity_input_bytes counter" in text
        return float(next(x for x in text.splitlines() if x.startswith(line))[len(line):])

    before = value()
    for _ in range(2):
        assert infer_json(server, "t_int16", [
            {"name": "INPUT0", "datatype": "INT16", "shape": [3], "data": [1, 2, 3]}]).status_code == 200
    assert value() == before + 12


# ---- The backend contract broken on purpose ----

@pytest.mark.parametrize("mode,status,text", [
    ("execute_error", 503, "tidentity: execute failed as requested"),
    ("no_release", 500, "backend 'tidentity' did not release a request to model 't_fp32' "
     "(TRITONBACKEND_RequestRelease) before TRITONBACKEND_ModelInstanceExecute returned"),
    ("double_release", 400, "request was already released"),
    ("double_send", 400, "a response was already sent with the final flag for this request"),
    ("no_final", 500, "backend 'tidentity' did not send a final response "
     "(TRITONSERVER_RESPONSE_COMPLETE_FINAL) for a request to model 't_fp32' before "
     "TRITONBACKEND_ModelInstanceExecute returned"),
    ("no_response", 500, "did not send a final response"),
    ("error_response", 400, "requested error"),
])
def test_contract_errors_fail_the_request(server, mode, status, text):
    r = infer_json(server, "t_fp32", [f32([1.0])], parameters={"mode": mode})
    assert r.status_code == status, r.text
    assert text in r.json()["error"]
    # the model keeps serving
    ok = infer_json(server, "t_fp32", [f32([3.0])])
    assert ok.status_code == 200 and ok.json()["outputs"][0]["data"] == [3.0]


def test_extra_responses_of_a_model_that_is_not_decoupled_are_dropped(server, stub):
    # Triton's frontends send the first response of a model that is not
    # decoupled and drop the others (its repeat backend on such a model:
    # L0_grpc_state_cleanup test_non_decoupled_streaming_multi_response).
    r = infer_json(server, "t_fp32", [f32([5.0])], parameters={"mode": "two_responses"})
    assert r.status_code == 200, r.text
    assert r.json()["outputs"][0]["data"] == [5.0]
    req = grpc_f32("t_fp32")
    req.parameters["mode"].string_param = "two_responses"
    out = list(stub.ModelStreamInfer(iter([req]), timeout=30))
    assert len(out) == 1 and not out[0].error_message, out


def test_model_that_is_not_decoupled_answers_from_its_own_thread(server, stub):
    # trepeat releases the request inside Execute and answers later from its
    # own thread through a response factory, as Triton's repeat backend: on
    # a model that is not decoupled the request completes at the final flag
    # with the first response (L0_grpc_state_cleanup's repeat_int32_non_decoupled).
    for _ in range(3):
        out = list(stub.ModelStreamInfer(iter([repeat_req([7, 8, 9], model="t_repeat_coupled")]),
                                         timeout=30))
        assert len(out) == 1 and not out[0].error_message, out
        r = out[0].infer_response
        assert np.frombuffer(r.raw_output_contents[0], np.int32).tolist() == [7]
    r = infer_json(server, "t_repeat_coupled", [{"name": "IN", "datatype": "INT32", "shape": [1],
                                                 "data": [4]}])
    assert r.status_code == 200 and r.json()["outputs"][0]["data"] == [4], r.text


def test_grpc_error_texts(stub):
    req = grpc_f32("t_fp32")
    req.parameters["mode"].string_param = "error_response"
    with pytest.raises(grpc.RpcError) as e:
        stub.ModelInfer(req, timeout=30)
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert e.value.details() == "requested error"


# ---- Decoupled ----

def repeat_req(values, id="", mode=None, model="t_repeat"):
    req = pb.ModelInferRequest(model_name=model, id=id)
    t = req.inputs.add()
    t.name, t.datatype = "IN", "INT32"
    t.shape.extend([len(values)])
    req.raw_input_contents.append(np.array(values, np.int32).tobytes())
    if mode:
        req.parameters["mode"].string_param = mode
    return req


def test_decoupled_responses_after_execute(stub):
    out = list(stub.ModelStreamInfer(iter([repeat_req([7, 8, 9], id="a")]), timeout=30))
    assert [r.error_message for r in out] == ["", "", ""]
    assert [np.frombuffer(r.infer_response.raw_output_contents[0], np.int32).tolist()
            for r in out] == [[7], [8], [9]]
    assert all(r.infer_response.id == "a" for r in out)
    assert [r.infer_response.parameters["index"].int64_param for r in out] == [0, 1, 2]


def test_response_statistics_come_from_the_backends_reports(stub, server):
    """As in Triton (L0_response_statistics), a Triton backend's
    response_stats are what it reports: t_repeat reports a success per
    response and an empty response for its final flag; the core adds none."""
    def stats():
        r = requests.get(f"{server.http_url}/v2/models/t_repeat/stats", timeout=10).json()
        return r["model_stats"][0]["response_stats"]
    before = stats()
    out = list(stub.ModelStreamInfer(iter([repeat_req([1, 2, 3], id="s")]), timeout=30))
    assert [r.error_message for r in out] == ["", "", ""]
    after = stats()

    def count(idx, kind):
        return int(after.get(idx, {}).get(kind, {}).get("count", 0)) - int(
            before.get(idx, {}).get(kind, {}).get("count", 0))
    for idx in ("0", "1", "2"):
        assert (count(idx, "success"), count(idx, "empty_response"), count(idx, "fail")) == (1, 0, 0)
    assert (count("3", "success"), count("3", "empty_response")) == (0, 1)
    assert count("4", "empty_response") == 0


def test_decoupled_zero_responses_then_final(stub):
    req = repeat_req([], id="z")
    req.parameters["triton_enable_empty_final_response"].bool_param = True
    out = list(stub.ModelStreamInfer(iter([req]), timeout=30))
    assert len(out) == 1
    assert out[0].infer_response.parameters["triton_final_response"].bool_param


def test_decoupled_missing_final_flag_is_an_error(stub):
    out = list(stub.ModelStreamInfer(iter([repeat_req([1, 2], id="m", mode="drop_final")]),
                                     timeout=30))
    assert [r.error_message for r in out[:2]] == ["", ""]
    assert len(out) == 3
    assert "did not send the final response (TRITONSERVER_RESPONSE_COMPLETE_FINAL)" in \
        out[2].error_message


def test_decoupled_refused_over_http(server):
    r = infer_json(server, "t_repeat",
                   [{"name": "IN", "datatype": "INT32", "shape": [1], "data": [1]}])
    assert r.status_code == 501
    assert "doesn't support models with decoupled transaction policy" in r.json()["error"]


# ---- Triton's own backends (manual: needs build.sh's out dir) ----

COMPAT = os.environ.get("NEREID_TRITON_COMPAT_DIR")


@pytest.mark.skipif(not COMPAT or not os.path.isdir(os.path.join(COMPAT or "", "backends")),
                    reason="set NEREID_TRITON_COMPAT_DIR to an out dir of "
                    "/work/shared/compat/tritonbackends/build.sh (needs Triton's repositories)")
@pytest.mark.skipif(bool(os.environ.get("NEREID_SANITIZE")),
                    reason="Triton's repeat backend frees new[] memory with delete "
                    "(ASan alloc-dealloc-mismatch in upstream code)")
def test_tritons_own_backends(nereid_server):
    s = nereid_server(os.path.join(COMPAT, "models"),
                      f"--backend-directory={os.path.join(COMPAT, 'backends')}",
                      "--exit-on-error=false")
    index = {m["name"]: m["state"] for m in
             requests.post(f"{s.http_url}/v2/repository/index", timeout=10).json()}
    for name in ("identity_fp32", "nonbatching", "batching", "repeat_int32", "square_int32",
                 "bls_fp32", "identity_bytes_batch", "identity_multi"):
        assert index[name] == "READY", index
    r = infer_json(s, "identity_fp32", [{"name": "INPUT0", "datatype": "FP32", "shape": [1, 3],
                                        "data": [1, 2, 3]}])
    assert r.json()["outputs"][0]["data"] == [1.0, 2.0, 3.0], r.text
    r = infer_json(s, "nonbatching", [{"name": "IN0", "datatype": "INT32", "shape": [4],
                                      "data": [1, 2, 3, 4]}])
    assert r.json()["outputs"][0]["data"] == [1, 2, 3, 4], r.text
    with grpc.insecure_channel(s.grpc_addr) as ch:
        st = pbg.GRPCInferenceServiceStub(ch)
        req = pb.ModelInferRequest(model_name="repeat_int32", id="r")
        for name, dt, arr in (("IN", "INT32", np.array([4, 5, 6], np.int32)),
                              ("DELAY", "UINT32", np.array([1, 1, 1], np.uint32)),
                              ("WAIT", "UINT32", np.array([1], np.uint32))):
            t = req.inputs.add()
            t.name, t.datatype = name, dt
            t.shape.extend([len(arr)])
            req.raw_input_contents.append(arr.tobytes())
        out = list(st.ModelStreamInfer(iter([req]), timeout=30))
        assert [np.frombuffer(r.infer_response.raw_output_contents[0], np.int32).tolist()
                for r in out] == [[4], [5], [6]]


# ---- Request release with TRITONSERVER_REQUEST_RELEASE_RESCHEDULE ----

def iterate_req(model, n, id="", seq=0):
    req = pb.ModelInferRequest(model_name=model, id=id)
    t = req.inputs.add()
    t.name, t.datatype = "INPUT", "INT32"
    t.shape.extend([1])
    req.raw_input_contents.append(np.array([n], np.int32).tobytes())
    if seq:
        req.parameters["sequence_id"].int64_param = seq
        req.parameters["sequence_start"].bool_param = True
    return req


def int_outputs(resp):
    r = resp.infer_response
    return {o.name: int(np.frombuffer(r.raw_output_contents[i], np.int32)[0])
            for i, o in enumerate(r.outputs)}


def test_rescheduled_request_runs_again_in_its_iterative_sequence(stub):
    out = list(stub.ModelStreamInfer(iter([iterate_req("t_iterate", 3, id="it")]), timeout=30))
    assert [r.error_message for r in out] == ["", "", ""]
    assert [r.infer_response.id for r in out] == ["it"] * 3
    # one request, executed three times: START only the first time
    assert [int_outputs(r) for r in out] == [{"OUTPUT": 2, "FLAGS": 1}, {"OUTPUT": 1, "FLAGS": 0},
                                              {"OUTPUT": 0, "FLAGS": 0}]


def test_iterative_sequences_each_get_their_own_id(stub):
    reqs = [iterate_req("t_iterate", 2, id="a"), iterate_req("t_iterate", 3, id="b")]
    out = list(stub.ModelStreamInfer(iter(reqs), timeout=30))
    assert all(r.error_message == "" for r in out)
    got = {}
    for r in out:
        got.setdefault(r.infer_response.id, []).append(int_outputs(r)["OUTPUT"])
    assert got == {"a": [1, 0], "b": [2, 1, 0]}


@pytest.mark.parametrize("model,seq", [("t_iterate_dynamic", 0), ("t_iterate_direct", 21)])
def test_reschedule_refused_outside_iterative_sequences(stub, model, seq):
    out = list(stub.ModelStreamInfer(iter([iterate_req(model, 2, seq=seq)]), timeout=30))
    assert len(out) == 1
    assert out[0].error_message == (
        "Request is released with TRITONSERVER_REQUEST_RELEASE_RESCHEDULE, while the model is "
        "not configured to handle such a flag.")


# ---- Tracing: TRITONBACKEND_RequestTrace, TRITONSERVER_InferenceTrace* ----

def test_backend_reports_activity_into_the_request_trace(layout, tmp_path):
    from conftest import Server
    backends, repo = layout
    f = str(tmp_path / "trace.json")
    s = Server(repo, [f"--backend-directory={backends}", "--exit-on-error=false",
                      "--trace-config", f"triton,file={f}", "--trace-config", "level=TIMESTAMPS",
                      "--trace-config", "rate=1"])
    try:
        body = {"id": "req-7", "inputs": [f32([1.0])],
                "parameters": {"trace_activity": "CUSTOM_STEP"}}
        r = requests.post(f"{s.http_url}/v2/models/t_fp32/infer", json=body, timeout=30)
        assert r.status_code == 200, r.text
        p = r.json()["parameters"]
    finally:
        assert s.stop() == 0, s.output()
    assert p["trace_id"] > 0 and p["trace_parent_id"] == 0
    assert (p["trace_model"], p["trace_version"], p["trace_request_id"]) == ("t_fp32", 1, "req-7")
    with open(f) as fh:
        entries = [e for e in json.load(fh) if e["id"] == p["trace_id"]]
    stamps = {t["name"]: t["ns"] for e in entries for t in e.get("timestamps", [])}
    # reported during execution, on the trace's own id
    assert stamps["COMPUTE_START"] <= stamps["CUSTOM_STEP"] <= stamps["COMPUTE_END"]


def test_untraced_request_has_no_trace(server):
    r = infer_json(server, "t_fp32", [f32([1.0])], parameters={"trace_activity": "X"})
    assert r.status_code == 200, r.text
    assert r.json()["parameters"]["trace_id"] == 0


def test_sequences_with_ragged_inputs_share_a_batch(server):
    # oldest strategy waits for its preferred batch of 2 (30 s delay): the two
    # sequences' requests differ in shape, and allow_ragged_batch lets them
    # share one execution (as Triton's L0_dyna_sequence_batcher expects)
    def one(seq, n):
        body = {"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1, n],
                            "data": [float(seq)] * n}],
                "parameters": {"sequence_id": seq, "sequence_start": True, "sequence_end": True}}
        return requests.post(f"{server.http_url}/v2/models/t_ragged_seq/infer", json=body,
                             timeout=60)
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        rs = list(pool.map(one, (31, 32), (2, 3)))
    assert [r.status_code for r in rs] == [200, 200], [r.text for r in rs]
    assert [r.json()["outputs"][0]["data"] for r in rs] == [[31.0] * 2, [32.0] * 3]
    st = requests.get(f"{server.http_url}/v2/models/t_ragged_seq/stats",
                      timeout=10).json()["model_stats"][0]
    assert (st["execution_count"], st["inference_count"]) == (1, 2)
