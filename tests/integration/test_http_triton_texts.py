"""Triton's texts and statuses for errors its QA suite (L0_http http_test.py)
and its example clients match: data nested too deep, a duplicate requested
output, shape overflows, the repository index body's JSON rules, a
malformed config override and an unwritable file override on load, and a raw
binary request for a one-element BYTES input (the whole body is the
element)."""
import json
import struct

import pytest
import requests

from conftest import Server
from http_helpers import identity_config, write_model


@pytest.fixture(scope="module")
def srv(tmp_path_factory):
    repo = str(tmp_path_factory.mktemp("texts"))
    write_model(repo, "id_fp32", identity_config("id_fp32", "TYPE_FP32"))
    write_model(repo, "id_int64", identity_config("id_int64", "TYPE_INT64"))
    write_model(repo, "id_bytes", identity_config("id_bytes", "TYPE_STRING"))
    write_model(repo, "bytes_one", identity_config("bytes_one", "TYPE_STRING", "[ 1 ]", 0))
    s = Server(repo, ["--model-control-mode=explicit", "--load-model=*"])
    yield s
    assert s.stop() == 0


def infer(srv, model, doc):
    return requests.post(f"{srv.http_url}/v2/models/{model}/infer", json=doc, timeout=30)


def nested(depth, leaf):
    text = leaf
    for _ in range(depth):
        text = f"[{text}]"
    return json.loads(text)


@pytest.mark.parametrize("model,dt,leaf", [("id_bytes", "BYTES", '"hello"'),
                                           ("id_int64", "INT64", "123")])
def test_data_nesting_depth(srv, model, dt, leaf):
    for depth, ok in ((99, True), (100, False), (120, False)):
        r = infer(srv, model, {"inputs": [{"name": "INPUT0", "datatype": dt, "shape": [1, 1],
                                           "data": nested(depth, leaf)}]})
        if ok:
            assert r.status_code == 200, r.text
        else:
            assert r.status_code == 400, r.text
            assert r.json()["error"] == "JSON nesting depth exceeds maximum allowed limit (100)"


def test_duplicate_output(srv):
    r = infer(srv, "id_fp32", {
        "inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1, 2], "data": [1, 2]}],
        "outputs": [{"name": "OUTPUT0"}, {"name": "OUTPUT0"}]})
    assert r.status_code == 400 and "output 'OUTPUT0' already exists in request" in r.text


def test_shape_overflow(srv):
    r = infer(srv, "id_fp32", {"inputs": [{"name": "INPUT0", "datatype": "FP32",
                                           "shape": [2**4, 2**60 + 2], "data": [1.0]}]})
    assert r.status_code == 400
    assert r.json()["error"] == (
        "invalid shape for input 'INPUT0': shape [16,1152921504606846978] causes total element "
        "count to exceed maximum size of 9223372036854775807")
    r = infer(srv, "id_fp32", {"inputs": [{"name": "INPUT0", "datatype": "FP32",
                                           "shape": [2**2, 2**60 + 2], "data": [1.0]}]})
    assert r.status_code == 400
    assert r.json()["error"] == (
        "byte size overflow for input 'INPUT0': element count (4611686018427387912) * data type "
        "size (4) exceeds maximum allowed size (9223372036854775807)")


def test_repository_index_body_same_json_rules(srv):
    """The index body is read as every other JSON body: checked at any depth
    (Triton parses iteratively), then its members' types; no shortcut that
    reads "ready" without checking the rest."""
    url = f"{srv.http_url}/v2/repository/index"
    depth = 250000  # Triton's L0_http test_repository_index_deeply_nested_json
    body = '{"ready":' + "[" * depth + "true" + "]" * depth + "}"
    r = requests.post(url, data=body, timeout=60)
    assert r.status_code == 400
    assert r.json()["error"] == "Invalid value for 'ready': expected a boolean"
    body = '{"x":' + "[" * 5000 + "]" * 5000 + ',"ready":true}'
    r = requests.post(url, data=body, timeout=60)
    assert r.status_code == 200 and all(m["state"] == "READY" for m in r.json())
    # Malformed after deep nesting: refused with rapidjson's text, the same
    # way by another endpoint.
    head = '{"x":' + "[" * 5000 + "]" * 4999 + ',"ready"'
    body = head + ':true}'
    want = ("failed to parse the request JSON buffer: Missing a comma or ']' after an array "
            f"element. at {len(head)}")
    for path in ("/v2/repository/index", "/v2/repository/models/id_fp32/load", "/v2/logging"):
        r = requests.post(f"{srv.http_url}{path}", data=body, timeout=60)
        assert (r.status_code, r.json()["error"]) == (500, want), path
    r = requests.post(url, data='{"ready":[true]}', timeout=60)
    assert r.status_code == 400
    assert r.json()["error"] == "Invalid value for 'ready': expected a boolean"
    r = requests.post(url, data='{"ready":true} x', timeout=60)
    assert r.status_code == 500
    assert r.json()["error"] == (
        "failed to parse the request JSON buffer: The document root must not be followed by "
        "other values. at 15")


def test_load_texts(srv):
    url = f"{srv.http_url}/v2/repository/models/id_fp32/load"
    r = requests.post(url, json={"parameters": {"config": '"parameters": {"config": {{}}}'}},
                      timeout=30)
    assert r.status_code == 400 and "failed to load 'id_fp32'" in r.json()["error"], r.text
    r = requests.post(url, json={"parameters": {"file:" + "A" * 256: "YQ==", "config": "{}"}},
                      timeout=30)
    assert r.status_code == 500, r.text
    assert "failed to poll from model repository" in r.json()["error"]
    assert requests.get(f"{srv.http_url}/v2/health/ready", timeout=30).status_code == 200


def test_raw_binary_one_bytes_element(srv):
    r = requests.post(f"{srv.http_url}/v2/models/bytes_one/infer", data=b"427",
                      headers={"Inference-Header-Content-Length": "0"}, timeout=30)
    assert r.status_code == 200, r.text
    n = int(r.headers["Inference-Header-Content-Length"])
    assert r.content[n:] == struct.pack("<I", 3) + b"427"
    r = requests.post(f"{srv.http_url}/v2/models/id_bytes/infer", data=b"427",
                      headers={"Inference-Header-Content-Length": "0"}, timeout=30)
    assert r.status_code == 400
    assert "For BYTE datatype raw input 'INPUT0', the model must have input shape [1]" in r.text


@pytest.fixture(scope="module")
def small(tmp_path_factory):
    repo = str(tmp_path_factory.mktemp("small"))
    write_model(repo, "id_fp32", identity_config("id_fp32", "TYPE_FP32"))
    s = Server(repo, ["--model-control-mode=explicit", "--load-model=*",
                      "--http-max-input-size=1024"])
    yield s
    assert s.stop() == 0


def test_json_body_size_text(small):
    text = ("request JSON size of {} bytes exceeds the maximum allowed input size of 1024 bytes. "
            "Use --http-max-input-size to increase the limit.")
    body = json.dumps({"parameters": {"config": "{}", "file:1/x": "A" * 2000}}).encode()
    for path in ("/v2/repository/models/id_fp32/load", "/v2/models/id_fp32/generate"):
        r = requests.post(small.http_url + path, data=body, timeout=30)
        assert r.status_code == 400 and r.json()["error"] == text.format(len(body)), r.text
    # chunked: no declared size, the bytes read when the limit was crossed
    r = requests.post(small.http_url + "/v2/repository/models/id_fp32/load",
                      data=iter([body[:1000], body[1000:]]), timeout=30)
    assert r.status_code == 400 and r.json()["error"] == text.format(len(body)), r.text


def test_generate_routes(srv):
    """The generate routes look the model up first (404 unknown), then map
    the body (test_http_generate.py has the rest)."""
    r = requests.post(f"{srv.http_url}/v2/models/nope/generate", json={}, timeout=30)
    assert r.status_code == 404 and "nope" in r.json()["error"]
    for path in ("generate", "generate_stream", "versions/1/generate"):
        r = requests.post(f"{srv.http_url}/v2/models/id_fp32/{path}", json={}, timeout=30)
        assert r.status_code == 400, r.text
        assert "expected 1 inputs but got 0 inputs for model 'id_fp32'" in r.json()["error"]
