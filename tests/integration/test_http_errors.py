"""Malformed and invalid inference requests: each gets Triton's status code
and message, and the server keeps serving afterwards."""
import gzip
import json
import socket
import struct
import time

import numpy as np
import pytest
import requests

from http_helpers import http_server, infer, make_repo  # noqa: F401

P = "[request id: <id_unknown>] "


def j(inputs, **extra):
    doc = dict(extra)
    doc["inputs"] = inputs
    return json.dumps(doc).encode()


def fp32(shape=(1, 2), data=(1.0, 2.0), **kw):
    d = {"name": "INPUT0", "datatype": "FP32", "shape": None if shape is None else list(shape),
         "data": list(data)}
    d.update(kw)
    return d


def binary(header, tail):
    h = json.dumps(header).encode()
    return h + tail, {"Inference-Header-Content-Length": str(len(h))}


F4 = struct.pack("<4f", 1, 2, 3, 4)

# (id, model, body, headers, status, exact message or ("prefix", text) / ("contains", text))
CASES = [
    ("bad-json", "id_fp32", b"{", {}, 500, ("prefix", "failed to parse the request JSON buffer: ")),
    ("empty-body", "id_fp32", b"", {}, 500, ("prefix", "failed to parse the request JSON buffer")),
    ("not-object", "id_fp32", b"[1]", {}, 500, ("prefix", "Unable to parse the request JSON")),
    ("no-inputs", "id_fp32", b"{}", {}, 500, ("prefix", "Unable to parse 'inputs'")),
    ("inputs-not-array", "id_fp32", b'{"inputs":5}', {}, 500,
     "Unable to parse 'inputs': attempt to access JSON non-array as array"),
    ("input-not-object", "id_fp32", b'{"inputs":[5]}', {}, 500, ("prefix", "Unable to parse 'inputs'")),
    ("no-name", "id_fp32", j([{"datatype": "FP32", "shape": [1], "data": [1]}]), {}, 500,
     ("prefix", "Unable to parse 'name'")),
    ("name-not-string", "id_fp32", j([fp32(name=3)]), {}, 500,
     "Unable to parse 'name': attempt to access JSON non-string as string"),
    ("no-datatype", "id_fp32", j([{"name": "INPUT0", "shape": [1], "data": [1]}]), {}, 500,
     ("prefix", "Unable to parse 'datatype'")),
    ("unknown-datatype", "id_fp32", j([fp32(datatype="FP33")]), {}, 400,
     "invalid datatype 'FP33' for input 'INPUT0' for model 'id_fp32'"),
    ("no-shape", "id_fp32", j([{"name": "INPUT0", "datatype": "FP32", "data": [1]}]), {}, 500,
     ("prefix", "Unable to parse 'shape'")),
    ("negative-dim", "id_fp32", j([fp32(shape=(1, -2))]), {}, 500,
     "Unable to parse 'shape': attempt to access JSON non-unsigned-integer as unsigned-integer"),
    ("shape-not-array", "id_fp32", j([fp32(shape=None)]), {}, 500,
     "Unable to parse 'shape': attempt to access JSON non-array as array"),
    ("no-data", "id_fp32", j([{"name": "INPUT0", "datatype": "FP32", "shape": [1, 1]}]), {}, 400,
     "Input must set only one of the following fields: 'data', 'binary_data_size' in "
     "'parameters', 'shared_memory_region' in 'parameters'. But no field is set"),
    ("data-and-binary", "id_fp32", j([fp32(parameters={"binary_data_size": 8})]), {}, 400,
     "Input must set only one of the following fields: 'data', 'binary_data_size' in "
     "'parameters', 'shared_memory_region' in 'parameters'. But set 'data' 'binary_data_size'"),
    ("too-many-leaves", "id_fp32", j([fp32(data=(1, 2, 3))]), {}, 500,
     "Unable to parse 'data': Shape does not match true shape of 'data' field"),
    ("too-few-leaves", "id_fp32", j([fp32(data=(1,))]), {}, 500,
     "Failed to parse 'data' field: shape does not match true shape"),
    ("string-in-fp32", "id_fp32", j([fp32(data=("a", 1))]), {}, 500,
     ("prefix", "Unable to parse 'data': attempt to access JSON non-")),
    ("bool-in-int32", "id_int32", j([fp32(datatype="INT32", data=(True, 1))]), {}, 500,
     "Unable to parse 'data': attempt to access JSON non-signed-integer as signed-integer"),
    ("number-in-bytes", "id_bytes", j([fp32(datatype="BYTES", data=(1, 2))]), {}, 500,
     "Unable to parse 'data': attempt to access JSON non-string as string"),
    ("fp16-json", "id_fp16", j([fp32(datatype="FP16")]), {}, 400,
     "receiving FP16 data via JSON is not supported. Please use the binary data format for "
     "input INPUT0"),
    ("too-deep", "id_fp32", j([fp32(shape=(1,), data=(json.loads("[" * 150 + "1" + "]" * 150),))]),
     {}, 400, "JSON nesting depth exceeds maximum allowed limit (100)"),
    ("unknown-model", "nope", j([fp32()]), {}, 404, "Request for unknown model: 'nope' is not found"),
    ("unknown-input", "id_fp32", j([fp32(name="BOGUS")]), {}, 400,
     "unexpected inference input 'BOGUS' for model 'id_fp32'"),
    ("unknown-output", "id_fp32", j([fp32()], outputs=[{"name": "NOPE"}]), {}, 400,
     ("contains", "unexpected inference output 'NOPE' for model 'id_fp32'")),
    # Triton checks the requested outputs first (L0_output_name)
    ("unknown-output-and-input", "id_fp32", j([fp32(name="BOGUS")], outputs=[{"name": "NOPE"}]),
     {}, 400, ("contains", "unexpected inference output 'NOPE' for model 'id_fp32'")),
    ("datatype-mismatch", "id_fp32", j([fp32(datatype="INT32", data=(1, 2))]), {}, 400,
     P + "inference input 'INPUT0' data-type is 'INT32', but model 'id_fp32' expects 'FP32'"),
    ("id-in-prefix", "id_fp32", j([fp32(datatype="INT32", data=(1, 2))], id="abc"), {}, 400,
     "[request id: abc] inference input 'INPUT0' data-type is 'INT32', but model 'id_fp32' "
     "expects 'FP32'"),
    ("shape-mismatch", "add_sub", j([fp32(shape=(1, 2)), fp32(name="INPUT1", shape=(1, 2))]), {},
     400, ("prefix", P + "unexpected shape for input 'INPUT0' for model 'add_sub'. Expected "
                         "[-1,16], got [1,2]. ")),
    ("batch-too-large", "id_fp32", j([fp32(shape=(9, 1), data=[0] * 9)]), {}, 400,
     P + "inference request batch-size must be <= 8 for 'id_fp32'"),
    ("binary-short", "id_fp32", *binary({"inputs": [{"name": "INPUT0", "datatype": "FP32",
                                                    "shape": [1, 4],
                                                    "parameters": {"binary_data_size": 16}}]},
                                        F4[:8]), 400,
     "unexpected size for input 'INPUT0', expecting 16 additional bytes for model 'id_fp32'"),
    ("binary-long", "id_fp32", *binary({"inputs": [{"name": "INPUT0", "datatype": "FP32",
                                                   "shape": [1, 4],
                                                   "parameters": {"binary_data_size": 16}}]},
                                       F4 + b"xx"), 400,
     "unexpected additional input data for model 'id_fp32'"),
    ("binary-size-vs-shape", "id_fp32", *binary({"inputs": [{"name": "INPUT0", "datatype": "FP32",
                                                            "shape": [1, 3],
                                                            "parameters": {"binary_data_size": 16}}]},
                                                F4), 400,
     P + "input byte size mismatch for input 'INPUT0' for model 'id_fp32'. Expected 12, got 16"),
    ("binary-without-header", "id_fp32",
     json.dumps({"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1, 4],
                             "parameters": {"binary_data_size": 16}}]}).encode(), {}, 400,
     "unexpected size for input 'INPUT0', expecting 16 additional bytes for model 'id_fp32'"),
    ("huge-binary-size", "id_fp32", *binary({"inputs": [{"name": "INPUT0", "datatype": "FP32",
                                                        "shape": [1, 4],
                                                        "parameters": {"binary_data_size":
                                                                       10**15}}]}, F4), 400,
     "unexpected size for input 'INPUT0', expecting 1000000000000000 additional bytes for model "
     "'id_fp32'"),
    ("huge-json-shape", "id_fp32", j([fp32(shape=(1, 10**11), data=(1,))]), {}, 400,
     "JSON input 'INPUT0' has a byte_size (400000000000 bytes) that exceeds the maximum allowed "
     "value of 67108864 bytes. Use --http-max-input-size to increase the limit."),
    ("header-longer-than-body", "id_fp32", j([fp32()]),
     {"Inference-Header-Content-Length": "5000"}, 400, ("prefix", "Inference-Header-Content-Length")),
    ("header-length-not-number", "id_fp32", j([fp32()]),
     {"Inference-Header-Content-Length": "abc"}, 400,
     ("prefix", "Unable to parse Inference-Header-Content-Length")),
    ("header-length-negative", "id_fp32", j([fp32()]),
     {"Inference-Header-Content-Length": "-4"}, 400,
     ("prefix", "Unable to parse Inference-Header-Content-Length")),
    ("id-not-string", "id_fp32", j([fp32()], id=5), {}, 500,
     "Unable to parse 'id': attempt to access JSON non-string as string"),
    ("parameters-not-object", "id_fp32", j([fp32()], parameters=[1]), {}, 500,
     "Unable to parse 'parameters': attempt to access JSON non-object as object"),
    ("triton-parameter", "id_fp32", j([fp32()], parameters={"triton_x": 1}), {}, 400,
     "parameter keys starting with 'triton_' are reserved for Triton usage and should not be "
     "specified."),
    ("parameter-bad-type", "id_fp32", j([fp32()], parameters={"p": [1]}), {}, 400,
     "parameter 'p' has invalid type. It should be either 'int', 'bool', or 'string'."),
    ("sequence-start-not-bool", "id_fp32", j([fp32()], parameters={"sequence_start": 1}), {}, 500,
     "Unable to parse 'sequence_start': attempt to access JSON non-boolean as boolean"),
    ("long-string-sequence-id", "id_fp32", j([fp32()], parameters={"sequence_id": "x" * 200}),
     {}, 501, ("contains", "cannot be longer than 128 characters")),
    ("outputs-not-array", "id_fp32", j([fp32()], outputs={"name": "OUTPUT0"}), {}, 500,
     "Unable to parse 'outputs': attempt to access JSON non-array as array"),
    ("classification-negative", "id_fp32",
     j([fp32()], outputs=[{"name": "OUTPUT0", "parameters": {"classification": -1}}]), {}, 500,
     "Unable to parse 'classification': attempt to access JSON non-unsigned-integer as "
     "unsigned-integer"),
    ("shm-input", "id_fp32",
     j([{"name": "INPUT0", "datatype": "FP32", "shape": [1, 1],
         "parameters": {"shared_memory_region": "r0"}}]), {}, 404,
     "Unable to find shared memory region: 'r0'"),
    ("unsupported-encoding", "id_fp32", j([fp32()]), {"Content-Encoding": "br"}, 501,
     "Unsupported compression type"),
    ("corrupt-gzip", "id_fp32", b"\x1f\x8b\x08\x00garbage", {"Content-Encoding": "gzip"}, 400,
     ("prefix", "failed to decompress the data")),
    ("empty-gzip", "id_fp32", b"", {"Content-Encoding": "gzip"}, 400,
     "nothing to be decompressed"),
    ("bad-version-string", "id_fp32", j([fp32()]), "v99999999999999999999", 400,
     ("prefix", "failed to get model version from specified version string")),
]


def check_message(err, expected):
    if isinstance(expected, tuple):
        kind, text = expected
        if kind == "prefix":
            assert err.startswith(text), err
        else:
            assert text in err, err
    else:
        assert err == expected


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_malformed_request(http_server, case):
    _, model, body, headers, status, expected = case
    if isinstance(headers, str):  # a version route
        r = requests.post(f"{http_server.http_url}/v2/models/{model}/versions/"
                          f"{headers[1:]}/infer", data=body, timeout=10)
    else:
        r = infer(http_server, model, body, headers)
    assert r.status_code == status, r.text
    assert r.headers["Content-Type"] == "application/json"
    check_message(r.json()["error"], expected)
    if status == 501 and "compression" in r.text:
        assert r.headers["Accept-Encoding"] == "gzip, deflate"
    # the server keeps serving
    ok = infer(http_server, "id_fp32", j([fp32()]))
    assert ok.status_code == 200, ok.text


def test_at_least_30_cases():
    assert len(CASES) >= 30


@pytest.fixture(scope="module")
def small_server(tmp_path_factory):
    from conftest import Server
    s = Server(make_repo(tmp_path_factory.mktemp("small")), ["--http-max-input-size=1024"])
    yield s
    assert s.stop() == 0, s.output()


def test_max_input_size_json(small_server):
    body = j([fp32(shape=(1, 300), data=[0.5] * 300)])
    r = infer(small_server, "id_fp32", body)
    assert r.status_code == 400
    assert r.json()["error"] == (f"request JSON size of {len(body)} bytes exceeds the maximum "
                                 "allowed input size of 1024 bytes. Use --http-max-input-size to "
                                 "increase the limit.")


def test_max_input_size_raw(small_server):
    r = infer(small_server, "id_fp32", b"\0" * 2048, {"Inference-Header-Content-Length": "0"})
    assert r.status_code == 400
    assert r.json()["error"] == ("Raw input has a byte_size (2048 bytes) that exceeds the maximum "
                                 "allowed value of 1024 bytes. Use --http-max-input-size to "
                                 "increase the limit.")


def test_max_input_size_header(small_server):
    x = np.zeros(8, np.float32).tobytes()
    r = infer(small_server, "id_fp32", b"{}" + x, {"Inference-Header-Content-Length": "4096"})
    assert r.status_code == 400
    assert r.json()["error"].startswith("request JSON size of 4096 bytes exceeds the maximum")


def test_max_input_size_decompressed(small_server):
    body = gzip.compress(j([fp32()]) + b" " * 4096)
    r = infer(small_server, "id_fp32", body, {"Content-Encoding": "gzip"})
    assert r.status_code == 400
    assert r.json()["error"] == ("Decompressed data size exceeds the maximum allowed value of "
                                 "1024 bytes. Use --http-max-input-size to increase the limit.")


def test_max_input_size_chunked(small_server):
    def gen():
        for _ in range(8):
            yield b" " * 512
    r = requests.post(small_server.http_url + "/v2/models/id_fp32/infer", data=gen(), timeout=10)
    assert r.status_code == 400
    assert r.json()["error"].startswith("request size exceeds the maximum allowed input size of "
                                        "1024 bytes")


def test_max_input_size_answered_before_body(small_server):
    """A declared Content-Length over the limit is refused without reading the body."""
    with socket.create_connection(("127.0.0.1", small_server.http_port), timeout=10) as s:
        s.sendall(b"POST /v2/models/id_fp32/infer HTTP/1.1\r\nHost: x\r\n"
                  b"Content-Length: 1000000000\r\n\r\n{\"inputs\":")
        start = time.time()
        data = b""
        while b"\r\n\r\n" not in data or not data.endswith(b"}"):
            chunk = s.recv(4096)
            if not chunk:
                break
            data += chunk
        assert time.time() - start < 5
    assert data.startswith(b"HTTP/1.1 400"), data
    assert b"request JSON size of 1000000000 bytes exceeds the maximum allowed input size of " \
           b"1024 bytes" in data
    assert infer(small_server, "id_fp32", j([fp32()])).status_code == 200
