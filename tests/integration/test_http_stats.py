"""Statistics extension and Prometheus metrics: exact counts after a known
sequence of requests, on a fresh server."""
import json
import os
import re

import numpy as np
import pytest
import requests

from http_helpers import build_infer, infer, make_repo

STAT_KEYS = ["success", "fail", "queue", "compute_input", "compute_infer", "compute_output",
             "cache_hit", "cache_miss"]


def run_sequence(s):
    """id_fp32: 3 requests of batch 1 and 1 of batch 4 (JSON and binary);
    add_sub: 2 requests of batch 2; plus rejected requests that never run."""
    for i in range(3):
        body, headers = build_infer([{"name": "INPUT0", "datatype": "FP32",
                                      "data": np.full((1, 4), i, np.float32), "binary": i == 1}])
        assert infer(s, "id_fp32", body, headers).status_code == 200
    body, headers = build_infer([{"name": "INPUT0", "datatype": "FP32",
                                  "data": np.ones((4, 4), np.float32)}])
    assert infer(s, "id_fp32", body, headers).status_code == 200
    for _ in range(2):
        x = np.ones((2, 16), np.float32)
        body, headers = build_infer([{"name": "INPUT0", "datatype": "FP32", "data": x},
                                     {"name": "INPUT1", "datatype": "FP32", "data": x}])
        assert infer(s, "add_sub", body, headers).status_code == 200
    bad = json.dumps({"inputs": [{"name": "INPUT0", "datatype": "INT32", "shape": [1, 1],
                                  "data": [1]}]})
    assert infer(s, "id_fp32", bad).status_code == 400
    assert infer(s, "id_fp32", b"{").status_code == 500


@pytest.fixture
def server(nereid_server, tmp_path):
    s = nereid_server(make_repo(tmp_path))
    run_sequence(s)
    return s


def model_stat(doc, name):
    entries = [m for m in doc["model_stats"] if m["name"] == name]
    assert len(entries) == 1
    return entries[0]


def test_statistics_exact(server):
    r = requests.get(server.http_url + "/v2/models/id_fp32/stats")
    assert r.status_code == 200 and r.headers["Content-Type"] == "application/json"
    doc = r.json()
    assert [m["name"] for m in doc["model_stats"]] == ["id_fp32"]
    st = doc["model_stats"][0]
    assert list(st) == ["name", "version", "last_inference", "inference_count", "execution_count",
                        "inference_stats", "response_stats", "batch_stats", "memory_usage"]
    assert st["version"] == "1"
    assert st["inference_count"] == 7
    assert st["execution_count"] == 4
    assert st["last_inference"] > 1_600_000_000_000
    inf = st["inference_stats"]
    assert list(inf) == STAT_KEYS
    for k in ("success", "queue", "compute_input", "compute_infer", "compute_output"):
        assert inf[k]["count"] == 4, k
    assert inf["success"]["ns"] > 0 and inf["compute_infer"]["ns"] > 0
    assert inf["cache_hit"] == {"count": 0, "ns": 0}
    assert inf["cache_miss"] == {"count": 0, "ns": 0}
    batches = {b["batch_size"]: b for b in st["batch_stats"]}
    assert sorted(batches) == [1, 4]
    assert batches[1]["compute_infer"]["count"] == 3
    assert batches[4]["compute_infer"]["count"] == 1
    for b in batches.values():
        assert list(b) == ["batch_size", "compute_input", "compute_infer", "compute_output"]
    # the versioned route gives the same entry
    v = requests.get(server.http_url + "/v2/models/id_fp32/versions/1/stats").json()
    assert model_stat(v, "id_fp32")["inference_count"] == 7


def test_statistics_all_models(server):
    doc = requests.get(server.http_url + "/v2/models/stats").json()
    add_sub = model_stat(doc, "add_sub")
    assert add_sub["inference_count"] == 4 and add_sub["execution_count"] == 2
    assert add_sub["inference_stats"]["success"]["count"] == 2
    assert [b["batch_size"] for b in add_sub["batch_stats"]] == [2]
    idle = model_stat(doc, "id_int32")
    assert idle["inference_count"] == 0 and idle["execution_count"] == 0
    assert idle["last_inference"] == 0 and idle["batch_stats"] == []
    assert model_stat(doc, "id_fp32")["inference_count"] == 7


def test_statistics_errors(server):
    r = requests.get(server.http_url + "/v2/models/nope/stats")
    assert r.status_code == 400
    assert r.json() == {"error": "requested model 'nope' is not available"}
    r = requests.get(server.http_url + "/v2/models/id_fp32/versions/9/stats")
    assert r.status_code == 400
    assert r.json() == {"error": "requested model version is not available for model 'id_fp32'"}


def metric_values(text):
    values = {}
    for line in text.splitlines():
        if line.startswith("#") or not line.strip():
            continue
        m = re.match(r'^(\w+)(?:\{([^}]*)\})? (\S+)$', line)
        assert m, line
        labels = dict(re.findall(r'(\w+)="([^"]*)"', m.group(2) or ""))
        key = (m.group(1), labels.get("model"), labels.get("reason"))
        values[key] = float(m.group(3))
    return values


def test_metrics_exact(server):
    r = requests.get(server.metrics_url + "/metrics")
    assert r.status_code == 200
    assert r.headers["Content-Type"] == "text/plain; charset=utf-8"
    assert "# HELP nv_inference_request_success Number of successful inference requests, all " \
           "batch sizes" in r.text
    assert "# TYPE nv_inference_request_success counter" in r.text
    v = metric_values(r.text)
    assert v[("nv_inference_request_success", "id_fp32", None)] == 4
    assert v[("nv_inference_count", "id_fp32", None)] == 7
    assert v[("nv_inference_exec_count", "id_fp32", None)] == 4
    assert v[("nv_inference_request_success", "add_sub", None)] == 2
    assert v[("nv_inference_count", "add_sub", None)] == 4
    assert v[("nv_inference_exec_count", "add_sub", None)] == 2
    assert v[("nv_inference_request_success", "id_int32", None)] == 0
    for reason in ("REJECTED", "CANCELED", "BACKEND", "OTHER"):
        assert ("nv_inference_request_failure", "add_sub", reason) in v
        assert v[("nv_inference_request_failure", "add_sub", reason)] == 0
    assert v[("nv_inference_request_duration_us", "id_fp32", None)] > 0
    assert v[("nv_inference_pending_request_count", "id_fp32", None)] == 0
    # the endpoint and the statistics agree
    st = requests.get(server.http_url + "/v2/models/id_fp32/stats").json()["model_stats"][0]
    assert st["inference_stats"]["success"]["count"] == 4


def test_metrics_label_order(nereid_server, tmp_path):
    """Triton's label order (prometheus-cpp sorts label names): metric tags
    "_<key>" first, then model, reason (failures), version -- the QA suites'
    regexes (L0_request_cancellation, L0_model_queue) depend on it. A
    repeated tag key keeps its last value; label values are escaped."""
    repo = make_repo(tmp_path)
    with open(os.path.join(repo, "id_fp32", "config.pbtxt"), "a") as f:
        f.write('metric_tags { key: "zone" value: "a" }\n'
                'metric_tags { key: "app" value: "say \\"hi\\"" }\n'
                'metric_tags { key: "zone" value: "b" }\n')
    s = nereid_server(repo)
    text = requests.get(s.metrics_url + "/metrics").text
    assert 'nv_inference_request_failure{model="add_sub",reason="CANCELED",version="1"} 0\n' in text
    assert 'nv_inference_request_success{model="add_sub",version="1"} 0\n' in text
    assert ('nv_inference_request_failure{_app="say \\"hi\\"",_zone="b",model="id_fp32",'
            'reason="REJECTED",version="1"} 0\n') in text
    assert 'nv_inference_count{_app="say \\"hi\\"",_zone="b",model="id_fp32",version="1"} 0\n' \
        in text


def test_pinned_memory_pool_metrics(server, nereid_server, tmp_path):
    # Triton on a CPU-only build: the pool size flag is the total, 0 used.
    text = requests.get(server.metrics_url + "/metrics").text
    assert "# TYPE nv_pinned_memory_pool_total_bytes gauge\n" in text
    assert "\nnv_pinned_memory_pool_total_bytes 268435456\n" in text
    assert "\nnv_pinned_memory_pool_used_bytes 0\n" in text
    s = nereid_server(make_repo(tmp_path / "other"), "--pinned-memory-pool-byte-size=1024")
    text = requests.get(s.metrics_url + "/metrics").text
    assert "\nnv_pinned_memory_pool_total_bytes 1024\n" in text


def test_metrics_routes(server):
    assert requests.get(server.metrics_url + "/metrics/").text.startswith("# HELP")
    r = requests.get(server.metrics_url + "/other")
    assert r.status_code == 200 and r.content == b""
    r = requests.post(server.metrics_url + "/metrics")
    assert r.status_code == 405


def test_metrics_disabled(nereid_server, tmp_path):
    s = nereid_server(make_repo(tmp_path), "--allow-metrics=false")
    with pytest.raises(requests.ConnectionError):
        requests.get(s.metrics_url + "/metrics", timeout=2)
    assert requests.get(s.http_url + "/v2/health/live").status_code == 200
