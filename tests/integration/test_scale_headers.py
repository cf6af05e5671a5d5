"""The sequence id and flags in request headers (a Nereid extension,
docs/deploy.md): HTTP Nereid-Sequence-Id/-Start/-End and gRPC metadata
nereid-sequence-id/-start/-end drive the sequence batcher like the body
parameters do, must agree with the body when both are given (400 /
INVALID_ARGUMENT otherwise), and the id is echoed in the reply."""
import http.client
import json

import grpc
import numpy as np
import pytest
import requests

from conftest import EXAMPLES
from grpc_util import infer_request, stubs

pb, pbg, _, _ = stubs()
MODEL = "accumulator_direct"


def http_step(server, value, params=None, headers=None):
    body = {"inputs": [{"name": "INPUT", "datatype": "INT32", "shape": [1, 1],
                        "data": [value]}]}
    if params:
        body["parameters"] = params
    return requests.post(f"{server.http_url}/v2/models/{MODEL}/infer", json=body,
                         headers=headers or {}, timeout=30)


def out(resp):
    assert resp.status_code == 200, resp.text
    return resp.json()["outputs"][0]["data"][0]


def seq_headers(seq_id, start=None, end=None):
    h = {"Nereid-Sequence-Id": str(seq_id)}
    if start is not None:
        h["Nereid-Sequence-Start"] = "true" if start else "false"
    if end is not None:
        h["Nereid-Sequence-End"] = "true" if end else "false"
    return h


@pytest.fixture
def server(nereid_server):
    return nereid_server(EXAMPLES)


def test_http_header_only_sequences(server):
    # two interleaved sequences driven only by headers: exact running sums
    totals = {71: 0, 72: 0}
    for k in range(4):
        for sid in totals:
            v = sid * 10 + k
            totals[sid] += v
            r = http_step(server, v, headers=seq_headers(sid, start=k == 0, end=k == 3))
            assert out(r) == totals[sid]
            assert r.headers["Nereid-Sequence-Id"] == str(sid)


def test_http_header_start_resets_state(server):
    # the start flag in the header really reaches the batcher: a second
    # START on the same id restarts the sum (a missing flag would add on)
    assert out(http_step(server, 5, headers=seq_headers(81, start=True))) == 5
    assert out(http_step(server, 7, headers=seq_headers(81))) == 12
    assert out(http_step(server, 3, headers=seq_headers(81, start=True))) == 3
    assert out(http_step(server, 1, headers=seq_headers(81, end=True))) == 4


def test_http_body_only_still_works_and_is_echoed(server):
    r = http_step(server, 4, params={"sequence_id": 91, "sequence_start": True})
    assert out(r) == 4
    assert r.headers["Nereid-Sequence-Id"] == "91"
    r = http_step(server, 6, params={"sequence_id": 91, "sequence_end": True})
    assert out(r) == 10


def test_http_header_and_body_agree(server):
    r = http_step(server, 2, params={"sequence_id": 101, "sequence_start": True},
                  headers=seq_headers(101, start=True))
    assert out(r) == 2
    # the body gives the id, the header only the end flag
    r = http_step(server, 3, params={"sequence_id": 101},
                  headers={"Nereid-Sequence-End": "true"})
    assert out(r) == 5


def test_http_header_and_body_disagree(server):
    r = http_step(server, 1, params={"sequence_id": 111, "sequence_start": True},
                  headers=seq_headers(112))
    assert r.status_code == 400
    assert r.json()["error"] == ("header 'Nereid-Sequence-Id' ('112') does not agree with the "
                                 "'sequence_id' parameter ('111')")
    r = http_step(server, 1, params={"sequence_id": 111, "sequence_start": True},
                  headers={"Nereid-Sequence-Start": "false"})
    assert r.status_code == 400
    assert r.json()["error"] == ("header 'Nereid-Sequence-Start' (false) does not agree with "
                                 "the 'sequence_start' parameter (true)")
    r = http_step(server, 1, headers={"Nereid-Sequence-Id": "5", "Nereid-Sequence-End": "maybe"})
    assert r.status_code == 400
    assert r.json()["error"] == ("invalid value 'maybe' for header 'Nereid-Sequence-End', "
                                 "expected 'true' or 'false'")


def test_http_raw_binary_request_with_header(server):
    # a raw binary request has no JSON parameters: the header is its only way in
    h = {"Inference-Header-Content-Length": "0", "Content-Type": "application/octet-stream"}
    for v, want, flags in ((8, 8, {"start": True}), (9, 17, {"end": True})):
        r = requests.post(f"{server.http_url}/v2/models/{MODEL}/infer",
                          data=np.array([[v]], np.int32).tobytes(),
                          headers={**h, **seq_headers(121, **flags)}, timeout=30)
        assert r.status_code == 200, r.text
        n = int(r.headers["Inference-Header-Content-Length"])
        assert int(np.frombuffer(r.content[n:], np.int32)[0]) == want
        assert r.headers["Nereid-Sequence-Id"] == "121"


def test_http_no_sequence_no_echo(server):
    r = requests.post(f"{server.http_url}/v2/models/add_sub/infer", json={"inputs": [
        {"name": "INPUT0", "datatype": "FP32", "shape": [1, 16], "data": [1] * 16},
        {"name": "INPUT1", "datatype": "FP32", "shape": [1, 16], "data": [2] * 16}]},
        timeout=30)
    assert r.status_code == 200, r.text
    assert "Nereid-Sequence-Id" not in r.headers


# ---- gRPC ------------------------------------------------------------------


@pytest.fixture
def stub(nereid_server):
    s = nereid_server(EXAMPLES, wait_port="grpc")
    with grpc.insecure_channel(s.grpc_addr) as ch:
        yield pbg.GRPCInferenceServiceStub(ch)


def grpc_step(stub, value, params=None, md=()):
    req = infer_request(pb, MODEL, [("INPUT", "INT32", [1, 1], np.array([value], np.int32))])
    for k, v in (params or {}).items():
        if isinstance(v, bool):
            req.parameters[k].bool_param = v
        else:
            req.parameters[k].int64_param = v
    resp, call = stub.ModelInfer.with_call(req, metadata=list(md), timeout=30)
    return int(np.frombuffer(resp.raw_output_contents[0], np.int32)[0]), dict(
        call.initial_metadata())


def grpc_md(seq_id, start=None, end=None):
    md = [("nereid-sequence-id", str(seq_id))]
    if start is not None:
        md.append(("nereid-sequence-start", "true" if start else "false"))
    if end is not None:
        md.append(("nereid-sequence-end", "true" if end else "false"))
    return md


def test_grpc_metadata_only_sequences(stub):
    totals = {131: 0, 132: 0}
    for k in range(3):
        for sid in totals:
            v = sid + k
            totals[sid] += v
            got, md = grpc_step(stub, v, md=grpc_md(sid, start=k == 0, end=k == 2))
            assert got == totals[sid]
            assert md["nereid-sequence-id"] == str(sid)


def test_grpc_body_only_and_agreeing(stub):
    got, md = grpc_step(stub, 5, params={"sequence_id": 141, "sequence_start": True})
    assert (got, md["nereid-sequence-id"]) == (5, "141")
    got, _ = grpc_step(stub, 6, params={"sequence_id": 141}, md=grpc_md(141, end=True))
    assert got == 11


def test_grpc_metadata_and_body_disagree(stub):
    with pytest.raises(grpc.RpcError) as e:
        grpc_step(stub, 1, params={"sequence_id": 151, "sequence_start": True},
                  md=grpc_md(152))
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert e.value.details() == ("header 'nereid-sequence-id' ('152') does not agree with the "
                                 "'sequence_id' parameter ('151')")
    with pytest.raises(grpc.RpcError) as e:
        grpc_step(stub, 1, params={"sequence_id": 151, "sequence_end": True},
                  md=[("nereid-sequence-end", "false")])
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT


def test_http_kept_connection_starts_each_request_clean(server):
    # A connection's next request starts from a clean state: the sequence
    # id echoed for one request is not sent again with the next one.
    conn = http.client.HTTPConnection("127.0.0.1", server.http_port, timeout=30)
    body = {"inputs": [{"name": "INPUT", "datatype": "INT32", "shape": [1, 1], "data": [5]}]}
    conn.request("POST", f"/v2/models/{MODEL}/infer", json.dumps(body),
                 seq_headers(95, start=True, end=True))
    r = conn.getresponse()
    r.read()
    assert r.status == 200 and r.getheader("Nereid-Sequence-Id") == "95"
    sock = conn.sock
    ident = {"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1, 1], "data": [1.5]}]}
    conn.request("POST", "/v2/models/identity_fp32/infer", json.dumps(ident))
    r = conn.getresponse()
    doc = json.loads(r.read())
    assert conn.sock is sock  # the same connection
    assert r.status == 200 and doc["outputs"][0]["data"] == [1.5]
    assert r.getheader("Nereid-Sequence-Id") is None
    conn.close()
