"""HTTP endpoints other than inference: server/model metadata, health,
readiness, config, repository index, load/unload, shared memory, routing."""
import base64
import json
import time

import pytest
import requests

from http_helpers import http_server, make_repo  # noqa: F401


def get(server, path, **kw):
    return requests.get(server.http_url + path, timeout=10, **kw)


def post(server, path, body=b"", **kw):
    return requests.post(server.http_url + path, data=body, timeout=10, **kw)


def test_server_metadata(http_server):
    r = get(http_server, "/v2")
    assert r.status_code == 200
    assert r.headers["Content-Type"] == "application/json"
    doc = r.json()
    assert doc["name"] == "triton"
    assert isinstance(doc["version"], str)
    for ext in ("classification", "binary_tensor_data", "statistics", "model_repository"):
        assert ext in doc["extensions"]


def test_health(http_server):
    for path in ("/v2/health/live", "/v2/health/ready"):
        r = get(http_server, path)
        assert r.status_code == 200 and r.content == b""


def test_model_metadata(http_server):
    for path in ("/v2/models/id_fp32", "/v2/models/id_fp32/versions/1"):
        r = get(http_server, path)
        assert r.status_code == 200, r.text
        doc = r.json()
        assert doc["name"] == "id_fp32" and doc["versions"] == ["1"]
        assert doc["inputs"] == [{"name": "INPUT0", "datatype": "FP32", "shape": [-1, -1]}]
        assert doc["outputs"] == [{"name": "OUTPUT0", "datatype": "FP32", "shape": [-1, -1]}]


def test_model_metadata_unknown(http_server):
    r = get(http_server, "/v2/models/nope")
    assert r.status_code == 404
    assert r.json() == {"error": "Request for unknown model: 'nope' is not found"}
    r = get(http_server, "/v2/models/id_fp32/versions/7")
    assert r.status_code == 404
    assert r.json() == {"error": "Request for unknown model: 'id_fp32' version 7 is not found"}


def test_model_ready(http_server):
    for path in ("/v2/models/id_fp32/ready", "/v2/models/id_fp32/versions/1/ready"):
        r = get(http_server, path)
        assert r.status_code == 200 and r.content == b""
    for path in ("/v2/models/nope/ready", "/v2/models/id_fp32/versions/3/ready"):
        r = get(http_server, path)
        assert r.status_code == 400
        assert r.json() == {"error": "Model version not ready"}


def test_model_config(http_server):
    for path in ("/v2/models/add_sub/config", "/v2/models/add_sub/versions/1/config"):
        r = get(http_server, path)
        assert r.status_code == 200
        doc = r.json()
        assert doc["name"] == "add_sub" and doc["max_batch_size"] == 8
        assert [i["name"] for i in doc["input"]] == ["INPUT0", "INPUT1"]
        assert doc["input"][0]["dims"] == [16]
    r = get(http_server, "/v2/models/nope/config")
    assert r.status_code == 404


def test_repository_index(http_server):
    r = post(http_server, "/v2/repository/index")
    assert r.status_code == 200, r.text
    index = r.json()
    names = {m["name"] for m in index}
    assert {"id_fp32", "add_sub", "id_labels"} <= names
    entry = next(m for m in index if m["name"] == "add_sub")
    assert entry["version"] == "1" and entry["state"] == "READY"
    r = post(http_server, "/v2/repository/index", json.dumps({"ready": True}))
    assert r.status_code == 200 and {m["name"] for m in r.json()} == names
    r = post(http_server, "/v2/repository/myrepo/index")
    assert r.status_code == 200 and {m["name"] for m in r.json()} == names
    r = post(http_server, "/v2/repository/index", json.dumps({"ready": "yes"}))
    assert r.status_code == 400
    assert r.json() == {"error": "Invalid value for 'ready': expected a boolean"}


def test_load_unload_not_explicit_mode(http_server):
    for action in ("load", "unload"):
        r = post(http_server, f"/v2/repository/models/id_fp32/{action}")
        assert r.status_code == 503
        assert r.json() == {"error": "explicit model load / unload is not allowed if polling is "
                                     "enabled"}
    r = post(http_server, "/v2/repository/named/models/id_fp32/load")
    assert r.status_code == 501
    assert r.json() == {"error": "'repository_name' specification is not supported"}


def test_load_unload_explicit_mode(nereid_server, tmp_path):
    repo = make_repo(tmp_path)
    s = nereid_server(repo, "--model-control-mode=explicit")
    r = post(s, "/v2/repository/models/id_fp32/load")
    if r.status_code == 501:
        pytest.skip(f"core: {r.json()['error']}")
    assert r.status_code == 200 and r.content == b""
    assert get(s, "/v2/models/id_fp32/ready").status_code == 200
    bad = post(s, "/v2/repository/models/id_fp32/load",
               json.dumps({"parameters": {"config": 5}}))
    assert bad.status_code == 500
    assert bad.json() == {"error": "unexpected error on creating Triton parameter"}
    cfg = json.dumps({"name": "id_fp32", "backend": "identity", "max_batch_size": 4,
                      "input": [{"name": "INPUT0", "data_type": "TYPE_FP32", "dims": [-1]}],
                      "output": [{"name": "OUTPUT0", "data_type": "TYPE_FP32", "dims": [-1]}]})
    r = post(s, "/v2/repository/models/id_fp32/load",
             json.dumps({"parameters": {"config": cfg,
                                        "file:1/note.txt": base64.b64encode(b"hi").decode()}}))
    assert r.status_code == 200, r.text
    r = post(s, "/v2/repository/models/id_fp32/unload",
             json.dumps({"parameters": {"unload_dependents": True}}))
    assert r.status_code == 200 and r.content == b""
    assert get(s, "/v2/models/id_fp32/ready").status_code == 400


def test_unload_bad_parameter(http_server):
    r = post(http_server, "/v2/repository/models/id_fp32/unload",
             json.dumps({"parameters": {"unload_dependents": "yes"}}))
    assert r.status_code == 500
    assert r.json()["error"].startswith("Unable to parse 'unload_dependents'")


def test_shared_memory_disabled(http_server):
    for kind in ("systemsharedmemory", "cudasharedmemory"):
        r = get(http_server, f"/v2/{kind}/status")
        assert r.status_code == 200 and r.json() == []
        r = get(http_server, f"/v2/{kind}/region/r0/status")
        assert r.status_code == 404
        what = "system" if kind.startswith("system") else "cuda"
        assert r.json() == {"error": f"Unable to find {what} shared memory region: 'r0'"}
        for path in (f"/v2/{kind}/region/r0/register", f"/v2/{kind}/unregister",
                     f"/v2/{kind}/region/r0/unregister"):
            r = post(http_server, path, "{}")
            assert r.status_code == 501
            assert r.json() == {"error": "Client shared memory is disabled. Start the server "
                                         "with '--allow-client-shm=true' to enable."}


@pytest.mark.parametrize("path", ["/", "/v1", "/v2/", "/v2/health", "/v2/models",
                                  "/v2/models/id_fp32/versions/x", "/v2/models//ready",
                                  "/v2/models/id_fp32/versions/1/bogus", "/v2/health/live/x"])
def test_unknown_route_404(http_server, path):
    r = get(http_server, path)
    assert r.status_code == 404
    assert r.json() == {"error": "Not Found"}


@pytest.mark.parametrize("method,path", [
    ("POST", "/v2"), ("POST", "/v2/health/live"), ("DELETE", "/v2/health/ready"),
    ("GET", "/v2/models/id_fp32/infer"), ("PUT", "/v2/models/id_fp32/infer"),
    ("POST", "/v2/models/id_fp32"), ("POST", "/v2/models/stats"),
    ("GET", "/v2/repository/index"), ("GET", "/v2/repository/models/id_fp32/load"),
    ("POST", "/v2/models/id_fp32/config")])
def test_wrong_method_405(http_server, method, path):
    r = requests.request(method, http_server.http_url + path, timeout=10)
    assert r.status_code == 405
    assert r.json() == {"error": "Method Not Allowed"}


def test_keep_alive_reused(http_server):
    with requests.Session() as sess:
        for _ in range(20):
            r = sess.get(http_server.http_url + "/v2/health/live")
            assert r.status_code == 200
            assert r.headers.get("Connection", "").lower() != "close"


def wait_output(s, text):
    deadline = time.time() + 30
    while text not in s.output():
        assert s.proc.poll() is None, s.output()
        assert time.time() < deadline, s.output()
        time.sleep(0.02)
    return s.output()


def test_allow_http_false(nereid_server, tmp_path):
    repo = make_repo(tmp_path)
    s = nereid_server(repo, "--allow-http=false", "--allow-metrics=false", wait_port=None)
    out = wait_output(s, "nereid ready")  # printed after the frontends started
    assert "Started HTTPService" not in out and "Started Metrics Service" not in out
    with pytest.raises(requests.ConnectionError):
        requests.get(s.http_url + "/v2", timeout=2)


def test_started_lines(nereid_server, tmp_path):
    repo = make_repo(tmp_path)
    s = nereid_server(repo)
    out = wait_output(s, "Started Metrics Service")
    assert f"Started HTTPService at 127.0.0.1:{s.http_port}" in out
    assert f"Started Metrics Service at 127.0.0.1:{s.metrics_port}" in out
