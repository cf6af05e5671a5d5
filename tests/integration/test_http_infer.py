"""HTTP inference: every datatype in JSON and binary, mixed JSON/binary, raw
binary requests, output selection, classification, compression."""
import gzip
import json
import zlib

import numpy as np
import pytest
import requests

from http_helpers import (DATATYPES, LABELS, build_infer, http_server, infer,  # noqa: F401
                          output_array, split_response, tensor_bytes)


def sample(dt, shape=(2, 3)):
    n = int(np.prod(shape))
    if dt == "BOOL":
        return (np.arange(n) % 2 == 0).reshape(shape)
    if dt == "BYTES":
        return np.array([f"s{i}\"\\\n\u00e9".encode() for i in range(n)], dtype=object).reshape(shape)
    if dt == "BF16":
        return np.array([0x3f80 + i for i in range(n)], dtype=np.uint16).reshape(shape)
    np_t = DATATYPES[dt][0]
    if np.issubdtype(np_t, np.floating):
        return (np.arange(n, dtype=np.float64) * 1.25 - 2.5).astype(np_t).reshape(shape)
    if np.issubdtype(np_t, np.signedinteger):
        info = np.iinfo(np_t)
        vals = [info.min, -1, 0, 1, 7, info.max][:n] + list(range(n - 6))
        return np.array(vals[:n], dtype=np_t).reshape(shape)
    info = np.iinfo(np_t)
    vals = [0, 1, 2, info.max if dt != "UINT64" else 2**62, 5, 9]
    return np.array(vals[:n], dtype=np_t).reshape(shape)


JSON_TYPES = [dt for dt in DATATYPES if dt not in ("FP16", "BF16")]


@pytest.mark.parametrize("dt", JSON_TYPES)
def test_json_every_datatype(http_server, dt):
    data = sample(dt)
    body, headers = build_infer([{"name": "INPUT0", "datatype": dt, "data": data}],
                                request_id=f"req-{dt}")
    r = infer(http_server, f"id_{dt.lower()}", body, headers)
    assert r.status_code == 200, r.text
    assert r.headers["Content-Type"] == "application/json"
    doc, raw = split_response(r)
    assert doc["id"] == f"req-{dt}"
    assert doc["model_name"] == f"id_{dt.lower()}"
    assert doc["model_version"] == "1"
    assert list(doc) == ["id", "model_name", "model_version", "parameters", "outputs"]
    # Triton's identity backend attaches four example response parameters
    assert doc["parameters"] == {"param0": "an example string parameter", "param1": 42,
                                 "param2": False, "param3": 123.123}
    out = doc["outputs"][0]
    assert out["name"] == "OUTPUT0" and out["datatype"] == dt and out["shape"] == [2, 3]
    assert raw == {}
    got = output_array(doc, raw, "OUTPUT0")
    if dt == "BOOL":
        assert out["data"] == [True, False, True, False, True, False]
    np.testing.assert_array_equal(got, data)


@pytest.mark.parametrize("dt", list(DATATYPES))
def test_binary_every_datatype(http_server, dt):
    data = sample(dt)
    body, headers = build_infer([{"name": "INPUT0", "datatype": dt, "data": data,
                                  "binary": True}],
                                outputs=[{"name": "OUTPUT0", "parameters": {"binary_data": True}}])
    r = infer(http_server, f"id_{dt.lower()}", body, headers)
    assert r.status_code == 200, r.text
    assert r.headers["Content-Type"] == "application/octet-stream"
    doc, raw = split_response(r)
    out = doc["outputs"][0]
    assert "data" not in out
    assert out["parameters"] == {"binary_data_size": len(tensor_bytes(dt, data))}
    assert raw["OUTPUT0"] == tensor_bytes(dt, data)


@pytest.mark.parametrize("dt", ["FP32", "BF16"])
def test_empty_binary_output_is_json_data(http_server, dt):
    # An output of zero bytes asked for in binary comes back as "data": [],
    # which Triton's clients read with the output's datatype (L0_backend_identity)
    body = json.dumps({"inputs": [{"name": "INPUT0", "datatype": dt, "shape": [1, 0],
                                   "parameters": {"binary_data_size": 0}}],
                       "parameters": {"binary_data_output": True}}).encode()
    r = infer(http_server, f"id_{dt.lower()}", body,
              {"Inference-Header-Content-Length": str(len(body))})
    assert r.status_code == 200, r.text
    out = r.json()["outputs"][0]
    assert out == {"name": "OUTPUT0", "datatype": dt, "shape": [1, 0], "data": []}


def test_fp16_in_binary_out_json_is_refused(http_server):
    data = sample("FP16")
    body, headers = build_infer([{"name": "INPUT0", "datatype": "FP16", "data": data,
                                  "binary": True}])
    r = infer(http_server, "id_fp16", body, headers)
    assert r.status_code == 400
    assert r.json() == {"error": "sending FP16 data via JSON is not supported. Please use the "
                                 "binary data format for output"}


def test_nested_and_flat_json_data(http_server):
    for data in ([[1, 2, 3], [4, 5, 6]], [1, 2, 3, 4, 5, 6]):
        body = json.dumps({"inputs": [{"name": "INPUT0", "datatype": "INT32", "shape": [2, 3],
                                       "data": data}]})
        r = infer(http_server, "id_int32", body)
        assert r.status_code == 200, r.text
        assert r.json()["outputs"][0]["data"] == [1, 2, 3, 4, 5, 6]


def test_fp32_json_values_widened(http_server):
    body = json.dumps({"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1, 3],
                                   "data": [0.1, 1, -2.5]}]})
    r = infer(http_server, "id_fp32", body)
    assert r.status_code == 200
    assert b'"data":[0.10000000149011612,1.0,-2.5]' in r.content


def test_mixed_json_and_binary(http_server):
    x = np.array([1.5, -2.0, 3.25], dtype=np.float32)
    y = np.array([7, -8, 9], dtype=np.int32)
    s = np.array([b"ab", b"", b"xyz"], dtype=object)
    body, headers = build_infer(
        [{"name": "INPUT0", "datatype": "FP32", "data": x, "binary": True},
         {"name": "INPUT1", "datatype": "INT32", "data": y},
         {"name": "INPUT2", "datatype": "BYTES", "data": s, "binary": True}],
        outputs=[{"name": "OUTPUT2", "parameters": {"binary_data": True}},
                 {"name": "OUTPUT1"},
                 {"name": "OUTPUT0", "parameters": {"binary_data": True}}])
    r = infer(http_server, "id_multi", body, headers)
    assert r.status_code == 200, r.text
    doc, raw = split_response(r)
    assert [o["name"] for o in doc["outputs"]] == ["OUTPUT2", "OUTPUT1", "OUTPUT0"]
    assert list(raw) == ["OUTPUT2", "OUTPUT0"]
    assert doc["outputs"][1]["data"] == [7, -8, 9]
    np.testing.assert_array_equal(output_array(doc, raw, "OUTPUT0"), x)
    assert list(output_array(doc, raw, "OUTPUT2")) == [b"ab", b"", b"xyz"]


def test_outputs_subset_and_binary_data_output(http_server):
    x = np.array([1, 2], dtype=np.float32)
    y = np.array([3, 4], dtype=np.int32)
    s = np.array([b"q", b"r"], dtype=object)
    ins = [{"name": "INPUT0", "datatype": "FP32", "data": x},
           {"name": "INPUT1", "datatype": "INT32", "data": y},
           {"name": "INPUT2", "datatype": "BYTES", "data": s}]
    body, headers = build_infer(ins, outputs=[{"name": "OUTPUT1"}])
    doc, raw = split_response(infer(http_server, "id_multi", body, headers))
    assert [o["name"] for o in doc["outputs"]] == ["OUTPUT1"] and raw == {}
    # binary_data_output makes every output binary unless an output says otherwise
    body, headers = build_infer(ins, parameters={"binary_data_output": True},
                                outputs=[{"name": "OUTPUT0"},
                                         {"name": "OUTPUT1", "parameters": {"binary_data": False}}])
    doc, raw = split_response(infer(http_server, "id_multi", body, headers))
    assert list(raw) == ["OUTPUT0"] and doc["outputs"][1]["data"] == [3, 4]
    body, headers = build_infer(ins, parameters={"binary_data_output": True})
    doc, raw = split_response(infer(http_server, "id_multi", body, headers))
    assert sorted(raw) == ["OUTPUT0", "OUTPUT1", "OUTPUT2"]


def test_add_sub(http_server):
    a = np.arange(16, dtype=np.float32).reshape(1, 16)
    b = np.full((1, 16), 2, dtype=np.float32)
    body, headers = build_infer([{"name": "INPUT0", "datatype": "FP32", "data": a, "binary": True},
                                 {"name": "INPUT1", "datatype": "FP32", "data": b}],
                                parameters={"binary_data_output": True})
    doc, raw = split_response(infer(http_server, "add_sub", body, headers))
    np.testing.assert_array_equal(output_array(doc, raw, "OUTPUT0"), a + b)
    np.testing.assert_array_equal(output_array(doc, raw, "OUTPUT1"), a - b)


def test_version_route(http_server):
    body, headers = build_infer([{"name": "INPUT0", "datatype": "FP32",
                                  "data": np.ones((1, 2), np.float32)}])
    r = infer(http_server, "id_fp32", body, headers, version=1)
    assert r.status_code == 200 and r.json()["model_version"] == "1"


def test_request_parameters_accepted(http_server):
    body = json.dumps({"id": "p", "parameters": {"priority": 1, "timeout": 1000000,
                                                 "custom_s": "x", "custom_i": 3,
                                                 "custom_b": True, "custom_d": 0.5},
                       "inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1, 1],
                                   "data": [1]}]})
    r = infer(http_server, "id_fp32", body)
    assert r.status_code == 200, r.text


def test_raw_binary_request(http_server):
    x = np.array([1, 2, 3, 4], dtype=np.float32)
    r = infer(http_server, "id_nobatch", x.tobytes(), {"Inference-Header-Content-Length": "0"})
    assert r.status_code == 200, r.text
    doc, raw = split_response(r)
    assert doc["outputs"][0]["shape"] == [4]
    assert raw["OUTPUT0"] == x.tobytes()
    # batching model with a variable dimension: batch-1, dim deduced
    y = np.arange(5, dtype=np.float32)
    r = infer(http_server, "id_fp32", y.tobytes(), {"Inference-Header-Content-Length": "0"})
    assert r.status_code == 200, r.text
    doc, raw = split_response(r)
    assert doc["outputs"][0]["shape"] == [1, 5] and raw["OUTPUT0"] == y.tobytes()


def test_raw_binary_request_errors(http_server):
    r = infer(http_server, "id_multi", b"\0" * 8, {"Inference-Header-Content-Length": "0"})
    assert r.status_code == 400
    assert r.json()["error"] == ("[request id: <id_unknown>] Raw request must only have 1 input "
                                 "(found 1) to be deduced but got 3 inputs in 'id_multi' model "
                                 "configuration")
    r = infer(http_server, "id_var2", b"\0" * 8, {"Inference-Header-Content-Length": "0"})
    assert r.status_code == 400
    assert "can not be deduced because there are more than one variable-sized dimension" in \
        r.json()["error"]


def test_classification(http_server):
    x = np.array([[0.1, 0.9, 0.5, 0.3], [4, 3, 2, 1]], dtype=np.float32)
    body, headers = build_infer([{"name": "INPUT0", "datatype": "FP32", "data": x}],
                                outputs=[{"name": "OUTPUT0", "parameters": {"classification": 2}}])
    r = infer(http_server, "id_labels", body, headers)
    assert r.status_code == 200, r.text
    out = r.json()["outputs"][0]
    assert out["datatype"] == "BYTES" and out["shape"] == [2, 2]
    assert out["data"] == ["0.900000:1:dog", "0.500000:2:bird", "4.000000:0:cat",
                           "3.000000:1:dog"]
    # binary classification output
    body, headers = build_infer([{"name": "INPUT0", "datatype": "FP32", "data": x[:1]}],
                                outputs=[{"name": "OUTPUT0",
                                          "parameters": {"classification": 1,
                                                         "binary_data": True}}])
    doc, raw = split_response(infer(http_server, "id_labels", body, headers))
    assert list(output_array(doc, raw, "OUTPUT0").flatten()) == [b"0.900000:1:dog"]
    # integer classification without labels: "value:index"
    y = np.array([[3, 9, 1]], dtype=np.int32)
    body, headers = build_infer([{"name": "INPUT0", "datatype": "INT32", "data": y}],
                                outputs=[{"name": "OUTPUT0", "parameters": {"classification": 5}}])
    out = infer(http_server, "id_int32", body, headers).json()["outputs"][0]
    assert out["shape"] == [1, 3] and out["data"] == ["9:1", "3:0", "1:2"]


def test_classification_of_too_many_elements(http_server):
    # Triton ranks at most 1,000,000 elements per batch item (L0_parameters'
    # class_count_test.py): one more is INVALID_ARG, the limit itself works.
    for n, status in ((1_000_001, 400), (1_000_000, 200)):
        x = np.ones((1, n), dtype=np.float32)
        body, headers = build_infer([{"name": "INPUT0", "datatype": "FP32", "data": x,
                                      "binary": True}],
                                    outputs=[{"name": "OUTPUT0",
                                              "parameters": {"classification": 5}}])
        r = infer(http_server, "id_fp32", body, headers)
        assert r.status_code == status, r.text[:200]
        if status == 400:
            assert "classification output tensor too large" in r.json()["error"]
        else:
            assert r.json()["outputs"][0]["shape"] == [1, 5]


@pytest.mark.parametrize("encoding", ["gzip", "deflate"])
def test_compressed_request(http_server, encoding):
    x = np.arange(64, dtype=np.float32).reshape(1, 64)
    body, headers = build_infer([{"name": "INPUT0", "datatype": "FP32", "data": x,
                                  "binary": True}], parameters={"binary_data_output": True})
    z = gzip.compress(body) if encoding == "gzip" else zlib.compress(body)
    headers["Content-Encoding"] = encoding
    r = infer(http_server, "id_fp32", z, headers)
    assert r.status_code == 200, r.text
    doc, raw = split_response(r)
    assert raw["OUTPUT0"] == x.tobytes()


@pytest.mark.parametrize("accept,expected", [("gzip", "gzip"), ("deflate", "deflate"),
                                             ("gzip;q=0.5, deflate;q=0.8", "deflate"),
                                             ("identity", None), ("br", None)])
def test_compressed_response(http_server, accept, expected):
    x = np.arange(32, dtype=np.float32).reshape(1, 32)
    body, headers = build_infer([{"name": "INPUT0", "datatype": "FP32", "data": x}],
                                parameters={"binary_data_output": True})
    headers["Accept-Encoding"] = accept
    r = requests.post(http_server.http_url + "/v2/models/id_fp32/infer", data=body,
                      headers=headers, stream=True)
    raw_body = r.raw.read()
    assert r.status_code == 200
    assert r.headers.get("Content-Encoding") == expected
    if expected == "gzip":
        raw_body = gzip.decompress(raw_body)
    elif expected == "deflate":
        raw_body = zlib.decompress(raw_body)
    n = int(r.headers["Inference-Header-Content-Length"])
    assert json.loads(raw_body[:n])["outputs"][0]["parameters"]["binary_data_size"] == 128
    assert raw_body[n:] == x.tobytes()


def test_large_tensor_json_and_binary(http_server):
    x = np.random.default_rng(1).standard_normal((1, 65536)).astype(np.float32)
    for binary in (False, True):
        body, headers = build_infer([{"name": "INPUT0", "datatype": "FP32", "data": x,
                                      "binary": binary}],
                                    parameters={"binary_data_output": binary})
        doc, raw = split_response(infer(http_server, "id_fp32", body, headers))
        np.testing.assert_array_equal(output_array(doc, raw, "OUTPUT0"), x)
