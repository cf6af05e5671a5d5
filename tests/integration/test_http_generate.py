"""Triton's generate extension over HTTP: POST .../generate (one JSON object)
and .../generate_stream (one server-sent event per response of a decoupled
model), Triton's mapping of members to input tensors or request parameters,
the "parameters" object, shape fitting, response objects in name order, error
objects and events, and a client that leaves mid-stream."""
import json
import os
import shutil
import time

import pytest
import requests

from conftest import EXAMPLES

TEXT = """name: "gen_text"
backend: "identity"
max_batch_size: 0
input [ { name: "text_input" data_type: TYPE_STRING dims: [ -1 ] },
        { name: "scale" data_type: TYPE_FP32 dims: [ -1 ] } ]
output [ { name: "text_output" data_type: TYPE_STRING dims: [ -1 ] },
         { name: "scale_out" data_type: TYPE_FP32 dims: [ -1 ] } ]
"""

BATCH = """name: "gen_batch"
backend: "identity"
max_batch_size: 8
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 2 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 2 ] } ]
"""

ECHO = """name: "gen_echo"
backend: "testing"
max_batch_size: 0
parameters { key: "echo_parameters" value { string_value: "PARAMS" } }
input [ { name: "INPUT0" data_type: TYPE_INT32 dims: [ -1 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_INT32 dims: [ -1 ] },
         { name: "PARAMS" data_type: TYPE_STRING dims: [ -1 ] } ]
"""


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    from conftest import Server
    repo = str(tmp_path_factory.mktemp("gen") / "models")
    shutil.copytree(os.path.join(EXAMPLES, "repeat_int32"), os.path.join(repo, "repeat_int32"))
    for name, cfg in (("gen_text", TEXT), ("gen_batch", BATCH), ("gen_echo", ECHO)):
        os.makedirs(os.path.join(repo, name, "1"))
        with open(os.path.join(repo, name, "config.pbtxt"), "w") as f:
            f.write(cfg)
    s = Server(repo, ())
    yield s
    assert s.stop() == 0, s.output()


def gen(s, model, body, stream=False, version=None, **kw):
    path = f"/v2/models/{model}" + (f"/versions/{version}" if version else "")
    path += "/generate_stream" if stream else "/generate"
    data = body if isinstance(body, str) else json.dumps(body)
    return requests.post(s.http_url + path, data=data, timeout=60, **kw)


def events(r):
    """The SSE events of a reply: each 'data: <json>' block."""
    assert r.headers["Content-Type"] == "text/event-stream; charset=utf-8"
    blocks = r.text.split("\n\n")
    assert blocks[-1] == "", r.text
    out = []
    for b in blocks[:-1]:
        assert b.startswith("data: "), r.text
        out.append(json.loads(b[len("data: "):]))
    return out


def error_of(r, status):
    assert r.status_code == status, r.text
    assert r.headers["Content-Type"] == "application/json"
    return r.json()["error"]


def test_generate_one_object_in_name_order(server):
    r = gen(server, "gen_text", {"id": "42", "text_input": "hello", "scale": [1.5, 2],
                                 "parameters": {"temperature": 0.5, "stream": False}})
    assert r.status_code == 200, r.text
    assert r.headers["Content-Type"] == "application/json"
    assert r.text == ('{"id":"42","model_name":"gen_text","model_version":"1",'
                      '"scale_out":[1.5,2.0],"text_output":"hello"}')
    r = gen(server, "gen_text", {"text_input": "hi", "scale": 3}, version=1)
    assert r.json() == {"model_name": "gen_text", "model_version": "1", "scale_out": 3.0,
                        "text_output": "hi"}
    r = gen(server, "gen_text", {"text_input": ["a", "b"], "scale": 1, "id": ""})
    assert r.json()["text_output"] == ["a", "b"] and "id" not in r.json()


def test_generate_stream_of_a_non_decoupled_model(server):
    r = gen(server, "gen_text", {"text_input": "hello", "scale": 1}, stream=True)
    assert r.status_code == 200
    assert events(r) == [{"model_name": "gen_text", "model_version": "1", "scale_out": 1.0,
                          "text_output": "hello"}]


def test_shape_fitting(server):
    r = gen(server, "gen_batch", {"INPUT0": [1, 2, 3, 4]})
    assert r.status_code == 200 and r.json()["OUTPUT0"] == [1.0, 2.0, 3.0, 4.0]
    assert error_of(gen(server, "gen_batch", {"INPUT0": [1, 2, 3]}), 400) == (
        "The schema can not convert input 'INPUT0' to tensor with proper shape")


def test_members_that_are_not_inputs_are_parameters(server):
    r = gen(server, "gen_echo", {"INPUT0": [1, 2], "s": "x", "i": -3, "b": True, "d": 0.25,
                                 "parameters": {"nested_int": 7, "INPUT0": 9}}, stream=True)
    # "INPUT0" inside "parameters" is the input too: a second one is refused.
    assert r.status_code == 400
    assert "input 'INPUT0' already exists in request" in r.json()["error"]
    r = gen(server, "gen_echo", {"INPUT0": [1, 2], "s": "x", "i": -3, "b": True, "d": 0.25,
                                 "parameters": {"nested_int": 7}})
    assert r.status_code == 200, r.text
    assert r.json()["PARAMS"] == ["s=x", "i=-3", "b=true", "d=0.25", "nested_int=7"]
    assert r.json()["OUTPUT0"] == [1, 2]


@pytest.mark.parametrize("stream", [False, True])
def test_request_errors_are_json_replies(server, stream):
    cases = [
        ({"text_input": "x"}, 400, "expected 2 inputs but got 1 inputs for model 'gen_text'"),
        ("", 400, "expected 2 inputs but got 0 inputs for model 'gen_text'"),
        ({"text_input": "x", "scale": 1, "PARAMS": {"a": 1}}, 400,
         "parameter 'PARAMS' has invalid type. It should be either 'int', 'bool', or 'string'."),
        ({"text_input": "x", "scale": 1, "parameters": 1}, 500,
         "Expected JSON object for keyword: 'parameters'"),
        ({"text_input": "x", "scale": 1, "parameters": {"nested": {"twice": 1}}}, 400,
         "Converting keyword: 'parameters': parameter 'nested' has invalid type."),
        ('{"text_input": "a", "scale": 1, "text_input": "b"}', 400,
         "input 'text_input' already exists in request"),
        ({"text_input": 123, "scale": 1}, 500, "attempt to access JSON non-string as string"),
        ({"text_input": "x", "scale": "1"}, 500, "attempt to access JSON non-float as float"),
        ({"text_input": "x", "scale": 1, "id": 5}, 500, "Unable to parse 'id'"),
        ('{"text_input": "x",', 500, "failed to parse the request JSON buffer"),
    ]
    for body, status, text in cases:
        assert text in error_of(gen(server, "gen_text", body, stream=stream), status), body
    assert "unknown model" in error_of(gen(server, "nope", {}, stream=stream), 404)
    r = gen(server, "repeat_int32", {"IN": [3000000000], "DELAY": [0], "WAIT": 0}, stream=stream)
    assert error_of(r, 400) == ("value 3000000000 of input 'IN' is out of range for datatype "
                                "INT32 (-2147483648 to 2147483647)")


def test_generate_stream_one_event_per_response(server):
    r = gen(server, "repeat_int32", {"IN": [5, 6, 7], "DELAY": [0, 0, 0], "WAIT": 0}, stream=True)
    assert r.status_code == 200
    assert r.text == "".join(
        'data: {"IDX":%d,"OUT":%d,"model_name":"repeat_int32","model_version":"1"}\n\n' % (i, v)
        for i, v in enumerate([5, 6, 7]))
    # An empty array is a zero-size input of rank 0, as Triton adds it.
    r = gen(server, "repeat_int32", {"IN": [], "DELAY": [], "WAIT": 0}, stream=True)
    assert "unexpected shape for input 'IN'" in error_of(r, 400)


def test_events_go_out_as_responses_come(server):
    """The second response comes 3 s after the first: the first event has
    reached the client long before the stream ends."""
    r = requests.post(server.http_url + "/v2/models/repeat_int32/generate_stream",
                      data=json.dumps({"IN": [1, 2], "DELAY": [0, 3000], "WAIT": 0}), stream=True,
                      timeout=60)
    lines = r.iter_lines()
    first = next(lines)
    t_first = time.monotonic()
    assert json.loads(first[len(b"data: "):])["OUT"] == 1
    rest = [line for line in lines if line]
    t_end = time.monotonic()
    assert [json.loads(x[len(b"data: "):])["OUT"] for x in rest] == [2]
    assert t_end - t_first > 1.0


def test_error_events(server):
    body = {"IN": [1, 2, 3], "DELAY": [0, 0, 0], "WAIT": 0, "parameters": {"repeat_fail_at": 1}}
    r = gen(server, "repeat_int32", body, stream=True)
    assert r.status_code == 200  # the first response set it
    ev = events(r)
    assert ev[0]["OUT"] == 1
    assert ev[1] == {"error": "repeat: response 1 failed as the request asked"}
    assert len(ev) == 2
    body["parameters"]["repeat_fail_at"] = 0
    r = gen(server, "repeat_int32", body, stream=True)
    assert r.status_code == 500
    assert events(r) == [{"error": "repeat: response 0 failed as the request asked"}]


def test_generate_takes_exactly_one_response(server):
    r = gen(server, "repeat_int32", {"IN": [4], "DELAY": [0], "WAIT": 0})
    assert r.status_code == 200
    assert r.json() == {"IDX": 0, "OUT": 4, "model_name": "repeat_int32", "model_version": "1"}
    for values in ([4, 5], [4, 5, 6]):
        r = gen(server, "repeat_int32", {"IN": values, "DELAY": [0] * len(values), "WAIT": 0})
        assert r.status_code == 200  # set by the first response, as in Triton
        assert r.json()["error"] == (
            "generate expects model to produce exactly 1 response, use generate stream for model "
            "that generates various number of responses")


def test_client_leaving_mid_stream(server):
    r = requests.post(server.http_url + "/v2/models/repeat_int32/generate_stream",
                      data=json.dumps({"IN": [1, 2, 3], "DELAY": [0, 5000, 5000], "WAIT": 0}),
                      stream=True, timeout=60)
    next(r.iter_lines())
    r.close()
    assert requests.get(server.http_url + "/v2/health/live", timeout=10).status_code == 200
    r = gen(server, "repeat_int32", {"IN": [8], "DELAY": [0], "WAIT": 0}, stream=True)
    assert events(r)[0]["OUT"] == 8
