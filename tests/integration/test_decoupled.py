"""Decoupled models (model_transaction_policy { decoupled: true }) through the
real binary: the repeat backend (Triton's repeat_int32 QA model) answers a
request with 0, 1 or N responses over gRPC ModelStreamInfer, with
triton_final_response and the optional empty final response as Triton sends
them; HTTP /infer and unary ModelInfer refuse decoupled models with Triton's
texts; response_stats count each response index."""
import os
import queue
import shutil
import threading
import time

import grpc
import numpy as np
import pytest
import requests

from conftest import EXAMPLES
from grpc_util import stubs
from http_helpers import write_model

pb, pbg, _, _ = stubs()

HTTP_REFUSAL = "HTTP end point doesn't support models with decoupled transaction policy"
UNARY_REFUSAL = "ModelInfer RPC doesn't support models with decoupled transaction policy"


@pytest.fixture
def repo(tmp_path):
    path = str(tmp_path / "models")
    os.makedirs(path)
    shutil.copytree(os.path.join(EXAMPLES, "repeat_int32"), os.path.join(path, "repeat_int32"))
    # the same model, not decoupled: one response per request
    src = os.path.join(EXAMPLES, "repeat_int32", "config.pbtxt")
    dst = os.path.join(path, "repeat_coupled")
    os.makedirs(os.path.join(dst, "1"))
    with open(src) as f:
        text = f.read().replace('name: "repeat_int32"', 'name: "repeat_coupled"')
    with open(os.path.join(dst, "config.pbtxt"), "w") as f:
        f.write(text.replace("decoupled: true", "decoupled: false"))
    return path


@pytest.fixture
def server(nereid_server, repo):
    return nereid_server(repo)


@pytest.fixture
def stub(server):
    with grpc.insecure_channel(server.grpc_addr) as ch:
        yield pbg.GRPCInferenceServiceStub(ch)


def repeat(values, delays=None, wait=0, id="", model="repeat_int32", empty_final=None,
           fail_at=None):
    delays = [0] * len(values) if delays is None else delays
    req = pb.ModelInferRequest(model_name=model, id=id)
    for name, dt, arr in (("IN", "INT32", np.array(values, np.int32)),
                          ("DELAY", "UINT32", np.array(delays, np.uint32)),
                          ("WAIT", "UINT32", np.array([wait], np.uint32))):
        t = req.inputs.add()
        t.name, t.datatype = name, dt
        t.shape.extend([len(arr)])
        req.raw_input_contents.append(arr.tobytes())
    if empty_final is not None:
        req.parameters["triton_enable_empty_final_response"].bool_param = empty_final
    if fail_at is not None:
        req.parameters["repeat_fail_at"].int64_param = fail_at
    return req


def final(r):
    p = r.infer_response.parameters.get("triton_final_response")
    return None if p is None else p.bool_param


def out_idx(r):
    ir = r.infer_response
    outs = {o.name: ir.raw_output_contents[i] for i, o in enumerate(ir.outputs)}
    return (int(np.frombuffer(outs["OUT"], np.int32)[0]),
            int(np.frombuffer(outs["IDX"], np.uint32)[0]))


def stream(stub, reqs, metadata=None):
    return list(stub.ModelStreamInfer(iter(reqs), timeout=30, metadata=metadata))


def by_id(responses):
    d = {}
    for r in responses:
        d.setdefault(r.infer_response.id, []).append(r)
    return d


def test_one_to_many(stub):
    rs = stream(stub, [repeat([5, 6, 7], [5, 5, 5], wait=1, id="many")])
    assert [out_idx(r) for r in rs] == [(5, 0), (6, 1), (7, 2)]
    assert all(r.error_message == "" and final(r) is False for r in rs)
    ir = rs[0].infer_response
    assert (ir.model_name, ir.model_version, ir.id) == ("repeat_int32", "1", "many")
    assert [(o.name, o.datatype, list(o.shape)) for o in ir.outputs] == [
        ("OUT", "INT32", [1]), ("IDX", "UINT32", [1])]


def test_one_to_many_with_empty_final(stub):
    rs = stream(stub, [repeat([1, 2], id="e", empty_final=True)])
    assert [out_idx(r) for r in rs[:2]] == [(1, 0), (2, 1)]
    assert [final(r) for r in rs] == [False, False, True]
    last = rs[2].infer_response
    assert (last.id, last.model_name, last.model_version) == ("e", "repeat_int32", "")
    assert list(last.outputs) == [] and list(last.raw_output_contents) == []
    assert rs[2].error_message == ""


def test_one_to_one(stub):
    rs = stream(stub, [repeat([42], id="one")])
    assert [out_idx(r) for r in rs] == [(42, 0)] and final(rs[0]) is False
    rs = stream(stub, [repeat([42], id="one", empty_final=True)])
    assert [final(r) for r in rs] == [False, True]


def test_one_to_none(stub):
    # no response at all; the stream still completes (half-close, nothing in flight)
    assert stream(stub, [repeat([], id="none")]) == []
    rs = stream(stub, [repeat([], id="none", empty_final=True)])
    assert len(rs) == 1 and final(rs[0]) is True and rs[0].infer_response.id == "none"
    assert stream(stub, [repeat([], id="none", empty_final=False)]) == []


def test_many_requests_interleave_on_one_stream(stub):
    reqs = [repeat(list(range(k * 10, k * 10 + k)), [k % 3] * k, id=f"r{k}", empty_final=True)
            for k in range(8)]
    got = by_id(stream(stub, reqs))
    assert set(got) == {f"r{k}" for k in range(8)}
    for k in range(8):
        rs = got[f"r{k}"]
        assert [final(r) for r in rs] == [False] * k + [True]
        assert [out_idx(r) for r in rs[:-1]] == [(k * 10 + i, i) for i in range(k)]


def test_wait_shorter_than_delays_keeps_instance_free(stub):
    # execute returns after WAIT while the first request still sends: the
    # second request (same single instance) runs meanwhile
    reqs = [repeat([1, 2, 3], [100, 100, 100], wait=0, id="slow"),
            repeat([9], [0], wait=0, id="quick")]
    got = by_id(stream(stub, reqs))
    assert [out_idx(r) for r in got["slow"]] == [(1, 0), (2, 1), (3, 2)]
    assert [out_idx(r) for r in got["quick"]] == [(9, 0)]


def test_error_mid_stream(stub):
    rs = stream(stub, [repeat([1, 2, 3, 4], id="f", fail_at=2)])
    assert [out_idx(r) for r in rs[:2]] == [(1, 0), (2, 1)]
    assert len(rs) == 3
    assert rs[2].error_message == "repeat: response 2 failed as the request asked"
    assert final(rs[2]) is True and rs[2].infer_response.id == "f"
    # named after the request as the client wrote it (no version given)
    assert (rs[2].infer_response.model_name, rs[2].infer_response.model_version) == (
        "repeat_int32", "")
    # the stream goes on: a later request on another stream is served
    assert [out_idx(r) for r in stream(stub, [repeat([8])])] == [(8, 0)]


def test_error_mid_stream_with_triton_grpc_error(stub):
    call = stub.ModelStreamInfer(iter([repeat([1, 2, 3], id="g", fail_at=1)]), timeout=30,
                                 metadata=(("triton_grpc_error", "true"),))
    first = next(call)
    assert out_idx(first) == (1, 0)
    with pytest.raises(grpc.RpcError) as e:
        list(call)
    assert e.value.code() == grpc.StatusCode.INTERNAL
    assert e.value.details() == "repeat: response 1 failed as the request asked"


def test_shape_mismatch_is_one_final_error(stub):
    req = repeat([1, 2], [0, 0, 0], id="bad")
    rs = stream(stub, [req])
    assert len(rs) == 1 and final(rs[0]) is True
    assert rs[0].error_message == "expected IN and DELAY shape to match, got [2] and [3]"


def test_cancel_mid_stream(server, stub):
    release = threading.Event()

    def reqs():
        yield repeat([1, 2, 3, 4, 5], [0, 60000, 60000, 60000, 60000], id="c")
        release.wait(30)  # keep the stream open until cancelled

    call = stub.ModelStreamInfer(reqs(), timeout=30)
    assert out_idx(next(call)) == (1, 0)
    call.cancel()
    release.set()
    with pytest.raises(grpc.RpcError) as e:
        list(call)
    assert e.value.code() == grpc.StatusCode.CANCELLED
    # The stream's cancel reaches the request: the repeat backend stops
    # before its next response and ends the request CANCELLED.
    deadline = time.time() + 20
    while time.time() < deadline:
        st = requests.get(f"{server.http_url}/v2/models/repeat_int32/stats", timeout=10).json()
        inf = st["model_stats"][0]["inference_stats"]
        if inf["success"]["count"] + inf["fail"]["count"] == 1:
            break
        time.sleep(0.05)
    rs = st["model_stats"][0]["response_stats"]
    assert inf["fail"]["count"] == 1 and inf["success"]["count"] == 0
    assert sorted(rs) == ["0", "1"], rs  # response 0, then the cancelled final
    assert rs["0"]["success"]["count"] == 1 and rs["1"]["cancel"]["count"] == 1
    assert [out_idx(r) for r in stream(stub, [repeat([7, 8])])] == [(7, 0), (8, 1)]
    assert server.proc.poll() is None


def test_shutdown_while_responses_pending(nereid_server, repo):
    s = nereid_server(repo)
    with grpc.insecure_channel(s.grpc_addr) as ch:
        stub = pbg.GRPCInferenceServiceStub(ch)
        release = threading.Event()

        def reqs():
            yield repeat([1, 2, 3, 4], [0, 200, 200, 200])
            release.wait(30)

        call = stub.ModelStreamInfer(reqs(), timeout=30)
        assert out_idx(next(call)) == (1, 0)
        assert s.stop() == 0  # the instance waits for its sending thread
        release.set()


def test_http_infer_refuses_decoupled(server):
    body = {"inputs": [{"name": "IN", "datatype": "INT32", "shape": [1], "data": [1]},
                       {"name": "DELAY", "datatype": "UINT32", "shape": [1], "data": [0]},
                       {"name": "WAIT", "datatype": "UINT32", "shape": [1], "data": [0]}]}
    for url in ("/v2/models/repeat_int32/infer", "/v2/models/repeat_int32/versions/1/infer"):
        r = requests.post(server.http_url + url, json=body, timeout=10)
        assert r.status_code == 501 and r.json() == {"error": HTTP_REFUSAL}
    # checked before the body is read, as in Triton
    r = requests.post(server.http_url + "/v2/models/repeat_int32/infer", data=b"{", timeout=10)
    assert r.status_code == 501 and r.json() == {"error": HTTP_REFUSAL}
    # the model that is not decoupled is served (one element: one response)
    r = requests.post(server.http_url + "/v2/models/repeat_coupled/infer", json=body, timeout=10)
    assert r.status_code == 200, r.text
    assert [o["data"] for o in r.json()["outputs"]] == [[1], [0]]


def test_grpc_unary_refuses_decoupled(stub):
    with pytest.raises(grpc.RpcError) as e:
        stub.ModelInfer(repeat([1]), timeout=10)
    assert e.value.code() == grpc.StatusCode.UNIMPLEMENTED
    assert e.value.details() == UNARY_REFUSAL
    bad = pb.ModelInferRequest(model_name="repeat_int32")  # no inputs: refused first anyway
    with pytest.raises(grpc.RpcError) as e:
        stub.ModelInfer(bad, timeout=10)
    assert e.value.details() == UNARY_REFUSAL


def test_model_not_decoupled_gives_one_response(stub):
    r = stub.ModelInfer(repeat([3], model="repeat_coupled"), timeout=10)
    assert [np.frombuffer(b, np.int32)[0] for b in r.raw_output_contents] == [3, 0]
    rs = stream(stub, [repeat([3], model="repeat_coupled", id="x", empty_final=True)])
    assert len(rs) == 1 and final(rs[0]) is True and out_idx(rs[0]) == (3, 0)
    # More elements: only the first response, as Triton's frontends keep
    # (L0_grpc_state_cleanup test_non_decoupled_streaming_multi_response).
    rs = stream(stub, [repeat([3, 4], model="repeat_coupled", id="y")])
    assert len(rs) == 1 and final(rs[0]) is True and not rs[0].error_message
    assert out_idx(rs[0]) == (3, 0)


def test_response_stats_per_index(server, stub):
    stream(stub, [repeat([1, 2, 3], id="a"), repeat([4], id="b"), repeat([], id="c"),
                  repeat([5, 6], id="d", fail_at=1)])
    st = requests.get(f"{server.http_url}/v2/models/repeat_int32/stats", timeout=10).json()
    m = st["model_stats"][0]
    rs = m["response_stats"]
    assert list(rs) == ["0", "1", "2"]
    assert [rs[k]["success"]["count"] for k in rs] == [3, 1, 1]
    assert [rs[k]["fail"]["count"] for k in rs] == [0, 1, 0]
    assert [rs[k]["empty_response"]["count"] for k in rs] == [0, 0, 0]
    for k in rs:
        e = rs[k]
        assert e["compute_infer"]["count"] == e["success"]["count"] + e["fail"]["count"]
        assert e["compute_output"]["count"] == e["success"]["count"]
    assert m["inference_stats"]["success"]["count"] == 3
    assert m["inference_stats"]["fail"]["count"] == 1
    assert m["execution_count"] == 4 and m["inference_count"] == 4
    # the same map over gRPC
    g = stub.ModelStatistics(pb.ModelStatisticsRequest(name="repeat_int32"), timeout=10)
    grs = g.model_stats[0].response_stats
    assert sorted(grs) == ["0", "1", "2"] and grs["1"].fail.count == 1
    assert grs["0"].success.count == 3


def test_response_stats_keys_sort_as_text(server, stub):
    stream(stub, [repeat(list(range(11)))])
    st = requests.get(f"{server.http_url}/v2/models/repeat_int32/stats", timeout=10).json()
    keys = list(st["model_stats"][0]["response_stats"])
    assert keys == ["0", "1", "10", "2", "3", "4", "5", "6", "7", "8", "9"]


IDENTITY2 = """name: "id2"
backend: "identity"
max_batch_size: 0
input [ { name: "INPUT0" data_type: TYPE_INT32 dims: [ 1 ] },
        { name: "INPUT1" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_INT32 dims: [ 1 ] },
         { name: "OUTPUT1" data_type: TYPE_INT32 dims: [ 1 ] } ]
"""

REPEAT_STEP = """{{ model_name: "repeat_int32" model_version: -1
      input_map {{ key: "IN" value: "IN" }} input_map {{ key: "DELAY" value: "DELAY" }}
      input_map {{ key: "WAIT" value: "WAIT" }} output_map {{ key: "{out}" value: "{to}" }} }}"""

ENSEMBLE_IO = """input [ { name: "IN" data_type: TYPE_INT32 dims: [ -1 ] },
        { name: "DELAY" data_type: TYPE_UINT32 dims: [ -1 ] },
        { name: "WAIT" data_type: TYPE_UINT32 dims: [ 1 ] } ]
"""


def test_ensemble_mixing_decoupled_models_is_refused(nereid_server, repo):
    # Triton's ensemble check: a step (or the ensemble's outputs) must not
    # take inputs that come from different decoupled models.
    write_model(repo, "id2", IDENTITY2)
    write_model(repo, "mix_step", 'name: "mix_step"\nplatform: "ensemble"\nmax_batch_size: 0\n'
                "ensemble_scheduling { step [ "
                + REPEAT_STEP.format(out="OUT", to="r1") + ", "
                + REPEAT_STEP.format(out="OUT", to="r2") + """,
      { model_name: "id2" model_version: -1
        input_map { key: "INPUT0" value: "r1" } input_map { key: "INPUT1" value: "r2" }
        output_map { key: "OUTPUT0" value: "m0" } output_map { key: "OUTPUT1" value: "m1" } },
      { model_name: "id2" model_version: -1
        input_map { key: "INPUT0" value: "m0" } input_map { key: "INPUT1" value: "m1" }
        output_map { key: "OUTPUT0" value: "OUT" } } ] }
""" + ENSEMBLE_IO + 'output [ { name: "OUT" data_type: TYPE_INT32 dims: [ 1 ] } ]\n')
    write_model(repo, "mix_outputs", 'name: "mix_outputs"\nplatform: "ensemble"\n'
                "max_batch_size: 0\nensemble_scheduling { step [ "
                + REPEAT_STEP.format(out="OUT", to="OUT") + ", "
                + REPEAT_STEP.format(out="IDX", to="IDX") + " ] }\n" + ENSEMBLE_IO
                + 'output [ { name: "OUT" data_type: TYPE_INT32 dims: [ 1 ] },\n'
                '         { name: "IDX" data_type: TYPE_UINT32 dims: [ 1 ] } ]\n')
    # one decoupled model feeding a step is fine
    write_model(repo, "one_source", 'name: "one_source"\nplatform: "ensemble"\n'
                "max_batch_size: 0\nensemble_scheduling { step [ "
                + REPEAT_STEP.format(out="OUT", to="OUT") + " ] }\n" + ENSEMBLE_IO
                + 'output [ { name: "OUT" data_type: TYPE_INT32 dims: [ 1 ] } ]\n')
    s = nereid_server(repo, "--exit-on-error=false", "--strict-readiness=false")
    index = requests.post(f"{s.http_url}/v2/repository/index", json={}, timeout=10).json()
    by_name = {m["name"]: m for m in index}
    assert by_name["mix_step"]["state"] == "UNAVAILABLE"
    assert by_name["mix_step"]["reason"].endswith(
        "in ensemble mix_step, step of model 'id2' receives inputs originated from "
        "different decoupled models")
    assert by_name["mix_outputs"]["state"] == "UNAVAILABLE"
    assert by_name["mix_outputs"]["reason"].endswith(
        "in ensemble mix_outputs, step of model 'mix_outputs' receives inputs originated "
        "from different decoupled models")
    assert by_name["one_source"]["state"] == "READY"


# IDENTITY2 less its second input and output
IDENTITY1 = "\n".join(line.replace(",", " ]") for line in IDENTITY2.replace(
    '"id2"', '"id1"').splitlines() if "INPUT1" not in line and "OUTPUT1" not in line) + "\n"

# repeat_int32, then an identity step on each of its responses: Triton's
# L0_decoupled simple_repeat shape (the ensemble is decoupled itself).
REPEAT_THEN_IDENTITY = """name: "rep_ens"
platform: "ensemble"
max_batch_size: 0
ensemble_scheduling { step [
  { model_name: "repeat_int32" model_version: -1
    input_map { key: "IN" value: "IN" } input_map { key: "DELAY" value: "DELAY" }
    input_map { key: "WAIT" value: "WAIT" }
    output_map { key: "OUT" value: "r" } output_map { key: "IDX" value: "IDX" } },
  { model_name: "id1" model_version: -1
    input_map { key: "INPUT0" value: "r" } output_map { key: "OUTPUT0" value: "OUT" } } ] }
""" + ENSEMBLE_IO + """output [ { name: "OUT" data_type: TYPE_INT32 dims: [ 1 ] },
         { name: "IDX" data_type: TYPE_UINT32 dims: [ 1 ] } ]
"""


@pytest.fixture
def ens_stub(nereid_server, repo):
    write_model(repo, "id1", IDENTITY1)
    write_model(repo, "rep_ens", REPEAT_THEN_IDENTITY)
    s = nereid_server(repo)
    with grpc.insecure_channel(s.grpc_addr) as ch:
        yield s, pbg.GRPCInferenceServiceStub(ch)


def test_ensemble_forwards_every_response_of_a_decoupled_step(ens_stub):
    # Triton runs the rest of the ensemble once per response of a decoupled
    # step and sends each result as one response of the ensemble.
    s, stub = ens_stub
    rs = stream(stub, [repeat([5, 6, 7], [5, 5, 5], id="e1", model="rep_ens",
                              empty_final=True)])
    assert all(r.error_message == "" for r in rs)
    data = [r for r in rs if r.infer_response.outputs]
    assert sorted(out_idx(r) for r in data) == [(5, 0), (6, 1), (7, 2)]
    # the final flag rides on the last response when the step that made it
    # was the last in flight (Triton's FinishEnsemble), else it comes alone
    assert [final(r) for r in rs] in ([False, False, False, True], [False, False, True])
    if len(rs) == 4:
        assert list(rs[3].infer_response.outputs) == []
    ir = data[0].infer_response
    assert (ir.model_name, ir.id) == ("rep_ens", "e1")
    assert [(o.name, o.datatype, list(o.shape)) for o in ir.outputs] == [
        ("OUT", "INT32", [1]), ("IDX", "UINT32", [1])]
    # the ensemble is decoupled itself, as Triton marks it
    cfg = requests.get(f"{s.http_url}/v2/models/rep_ens/config", timeout=10).json()
    assert cfg["model_transaction_policy"] == {"decoupled": True}
    r = requests.post(f"{s.http_url}/v2/models/rep_ens/infer", json={"inputs": [
        {"name": "IN", "datatype": "INT32", "shape": [1], "data": [1]},
        {"name": "DELAY", "datatype": "UINT32", "shape": [1], "data": [0]},
        {"name": "WAIT", "datatype": "UINT32", "shape": [1], "data": [0]}]}, timeout=10)
    assert r.status_code == 501 and HTTP_REFUSAL in r.json()["error"]
    # every response was counted for the composing models
    stats = requests.get(f"{s.http_url}/v2/models/id1/stats", timeout=10).json()
    assert stats["model_stats"][0]["inference_count"] == 3


def test_ensemble_with_decoupled_step_many_requests_and_none(ens_stub):
    _, stub = ens_stub
    reqs = [repeat(list(range(k * 10, k * 10 + k)), [k % 3] * k, id=f"r{k}", model="rep_ens",
                   empty_final=True) for k in range(6)]
    got = by_id(stream(stub, reqs))
    assert set(got) == {f"r{k}" for k in range(6)}
    for k in range(6):
        rs = got[f"r{k}"]
        data = [r for r in rs if r.infer_response.outputs]
        assert sorted(out_idx(r) for r in data) == [(k * 10 + i, i) for i in range(k)]
        assert [final(r) for r in rs][-1] is True and not any(final(r) for r in rs[:-1])
        assert len(rs) in (k, k + 1)
    # no response of the decoupled step: no response of the ensemble, and
    # without the empty final the stream just ends
    assert stream(stub, [repeat([], id="none", model="rep_ens", empty_final=False)]) == []


def test_ensemble_decoupled_step_error_ends_the_request(ens_stub):
    _, stub = ens_stub
    # response 1 of the step is a final error: response 0 went through the
    # ensemble, then the request ends with the error, named after the ensemble
    # (300 ms apart: a lane still running when the error comes is dropped, as
    # in Triton, whose ensemble sends nothing more once it failed)
    rs = stream(stub, [repeat([1, 2, 3], [5, 300, 5], id="f", model="rep_ens", fail_at=1)])
    ok = [r for r in rs if r.error_message == ""]
    bad = [r for r in rs if r.error_message != ""]
    assert [out_idx(r) for r in ok] == [(1, 0)]
    assert len(bad) == 1 and bad[0].error_message.startswith("in ensemble 'rep_ens', ")


def test_ensemble_final_flag_rides_on_the_last_response(nereid_server, repo):
    # Triton's FinishEnsemble: a response made when no other step is in
    # flight carries the final flag. The step after repeat_int32 takes
    # 300 ms, so repeat's final flag has long arrived when the last one ends.
    write_model(repo, "id1", IDENTITY1.replace('backend: "identity"', 'backend: "testing"')
                + 'parameters { key: "execute_delay_ms" value { string_value: "300" } }\n')
    write_model(repo, "rep_ens", REPEAT_THEN_IDENTITY)
    s = nereid_server(repo)
    with grpc.insecure_channel(s.grpc_addr) as ch:
        rs = stream(pbg.GRPCInferenceServiceStub(ch),
                    [repeat([5, 6], id="f", model="rep_ens", empty_final=True)])
    assert [final(r) for r in rs] == [False, True]
    assert sorted(out_idx(r) for r in rs) == [(5, 0), (6, 1)]
