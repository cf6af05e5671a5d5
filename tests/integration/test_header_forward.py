"""Header forwarding (--http-header-forward-pattern,
--grpc-header-forward-pattern) with Triton's semantics: an RE2 pattern,
case-insensitive, matched anywhere in a header (metadata) name; matching
headers become string parameters under the name as received, after the
body's parameters; reserved names are refused with Triton's text. The
testing backend echoes a request's parameters (ABI 1.3
nereid_batch_request_parameter) into its PARAMS output."""
import json
import subprocess

import grpc
import numpy as np
import pytest
import requests

from conftest import EXAMPLES, NEREID
from grpc_util import infer_request, stubs
from http_helpers import write_model

pb, pbg, hpb, hpbg = stubs()

ECHO = """name: "echo"
backend: "testing"
max_batch_size: 0
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ -1 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ -1 ] },
         { name: "PARAMS" data_type: TYPE_STRING dims: [ -1 ] } ]
parameters { key: "echo_parameters" value: { string_value: "PARAMS" } }
"""


@pytest.fixture
def server(nereid_server, tmp_path):
    repo = str(tmp_path / "models")
    write_model(repo, "echo", ECHO)
    return nereid_server(repo, "--http-header-forward-pattern=^x-fwd-|trace",
                         "--grpc-header-forward-pattern=^x-fwd-|trace", wait_port="http")


def http_params(s, headers=None, parameters=None):
    doc = {"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [2], "data": [1, 2]}],
           "outputs": [{"name": "PARAMS"}]}
    if parameters:
        doc["parameters"] = parameters
    r = requests.post(s.http_url + "/v2/models/echo/infer", data=json.dumps(doc),
                      headers=headers or {}, timeout=30)
    return r


def echoed(r):
    assert r.status_code == 200, r.text
    out = {o["name"]: o for o in r.json()["outputs"]}
    return out["PARAMS"]["data"]


def test_http_forwarding(server):
    # no matching header: only the body's parameters (Python requests sends
    # User-Agent etc., none of which match)
    assert echoed(http_params(server, parameters={"p": 7})) == ["p=7"]
    r = http_params(server, headers={"X-Fwd-Tenant": "acme", "x-fwd-empty": "",
                                     "My-Trace-Id": "t1", "X-Other": "no",
                                     "Fwd-Tenant": "no"},
                    parameters={"p": "body", "flag": True})
    got = echoed(r)
    assert got[:2] == ["p=body", "flag=true"]
    # names as received, in any case the pattern matches (Triton prefixes (?i))
    assert sorted(got[2:]) == ["My-Trace-Id=t1", "X-Fwd-Tenant=acme", "x-fwd-empty="]
    # a forwarded header replaces a body parameter of the same name
    got = echoed(http_params(server, headers={"x-fwd-a": "header"},
                             parameters={"x-fwd-a": "body"}))
    assert got == ["x-fwd-a=header"]


def test_http_reserved_names(server):
    r = http_params(server, headers={"triton_trace": "1"})
    assert r.status_code == 400
    assert r.json() == {"error": "Header 'triton_trace' is reserved for Triton usage and cannot "
                                 "be forwarded."}


def grpc_echo(s, metadata, stream=False):
    req = infer_request(pb, "echo", [("INPUT0", "FP32", [2], np.ones(2, np.float32))],
                        outputs=["PARAMS"])
    req.parameters["p"].int64_param = 5
    with grpc.insecure_channel(s.grpc_addr) as ch:
        stub = pbg.GRPCInferenceServiceStub(ch)
        if stream:
            replies = list(stub.ModelStreamInfer(iter([req, req]), metadata=metadata, timeout=30))
            assert len(replies) == 2
            for rep in replies:
                assert rep.error_message == ""
            r = replies[1].infer_response
        else:
            r = stub.ModelInfer(req, metadata=metadata, timeout=30)
    names = [o.name for o in r.outputs]
    raw = r.raw_output_contents[names.index("PARAMS")]
    items, i = [], 0
    while i < len(raw):
        n = int.from_bytes(raw[i:i + 4], "little")
        items.append(raw[i + 4:i + 4 + n].decode())
        i += 4 + n
    return items


@pytest.mark.parametrize("stream", [False, True])
def test_grpc_forwarding(server, stream):
    assert grpc_echo(server, [], stream) == ["p=5"]
    got = grpc_echo(server, [("x-fwd-tenant", "acme"), ("my-trace", "t2"), ("x-other", "no")],
                    stream)
    assert got[0] == "p=5" and sorted(got[1:]) == ["my-trace=t2", "x-fwd-tenant=acme"]


def test_grpc_reserved_names(server):
    req = infer_request(pb, "echo", [("INPUT0", "FP32", [2], np.ones(2, np.float32))])
    with grpc.insecure_channel(server.grpc_addr) as ch:
        stub = pbg.GRPCInferenceServiceStub(ch)
        with pytest.raises(grpc.RpcError) as e:
            stub.ModelInfer(req, metadata=[("triton_trace", "x")], timeout=30)
        assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert e.value.details() == ("Header 'triton_trace' is reserved for Triton usage and "
                                     "cannot be forwarded.")
        replies = list(stub.ModelStreamInfer(iter([req]), metadata=[("triton_trace", "x")],
                                             timeout=30))
        assert len(replies) == 1
        assert replies[0].error_message == ("Header 'triton_trace' is reserved for Triton "
                                            "usage and cannot be forwarded.")


def test_off_by_default(nereid_server, tmp_path):
    repo = str(tmp_path / "models")
    write_model(repo, "echo", ECHO)
    s = nereid_server(repo)
    assert echoed(http_params(s, headers={"X-Fwd-Tenant": "acme", "triton_x": "y"})) == []
    assert grpc_echo(s, [("x-fwd-tenant", "acme")]) == ["p=5"]


@pytest.mark.parametrize("proto", ["http", "grpc"])
def test_bad_pattern(proto):
    p = subprocess.run([NEREID, f"--model-repository={EXAMPLES}", "--http-port=0",
                        "--grpc-port=0", "--allow-metrics=false",
                        f"--{proto}-header-forward-pattern=x-(fwd"],
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 1
    assert f"invalid --{proto}-header-forward-pattern 'x-(fwd': missing )" in p.stderr


# Triton's kReservedParameterKeys (server #8763): never forwarded, the
# request fails, whatever the pattern.
RESERVED = ("sequence_id", "sequence_start", "sequence_end", "priority", "timeout", "headers",
            "binary_data_output")


def test_every_reserved_name_is_refused(nereid_server, tmp_path):
    repo = str(tmp_path / "models")
    write_model(repo, "echo", ECHO)
    pattern = "^(" + "|".join(RESERVED) + "|x-ok)$"
    s = nereid_server(repo, f"--http-header-forward-pattern={pattern}",
                      f"--grpc-header-forward-pattern={pattern}")
    assert http_params(s, headers={"x-ok": "1"}).status_code == 200
    req = infer_request(pb, "echo", [("INPUT0", "FP32", [2], np.ones(2, np.float32))])
    with grpc.insecure_channel(s.grpc_addr) as ch:
        stub = pbg.GRPCInferenceServiceStub(ch)
        for key in RESERVED:
            text = f"Header '{key}' is reserved for Triton usage and cannot be forwarded."
            r = http_params(s, headers={key: "1"})
            assert (r.status_code, r.json()) == (400, {"error": text}), key
            with pytest.raises(grpc.RpcError) as e:
                stub.ModelInfer(req, metadata=[(key, "1")], timeout=30)
            assert (e.value.code(), e.value.details()) == (grpc.StatusCode.INVALID_ARGUMENT, text)
