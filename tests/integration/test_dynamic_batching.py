"""Dynamic batching over HTTP: concurrent requests batch together (seen in
the statistics' batch_stats), a full queue answers 503 with Triton's text, a
queue timeout answers 503. NEREID_DELAY_SCHEDULER holds the first batch until
enough requests are queued, so nothing depends on timing."""
import os
import threading
import time

import requests

from http_helpers import pending_requests

CONFIG = """name: "m"
backend: "testing"
max_batch_size: 8
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ -1 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ -1 ] } ]
"""


def make_repo(tmp_path, dynamic_batching):
    repo = tmp_path / "models"
    (repo / "m" / "1").mkdir(parents=True)
    (repo / "m" / "config.pbtxt").write_text(CONFIG + dynamic_batching + "\n")
    return str(repo)


def body(i, **params):
    doc = {"id": f"r{i}",
           "inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1, 3],
                       "data": [i, i + 0.5, -i]}]}
    if params:
        doc["parameters"] = params
    return doc


def post(srv, doc):
    return requests.post(f"{srv.http_url}/v2/models/m/infer", json=doc, timeout=60)


def in_threads(srv, docs):
    results = [None] * len(docs)

    def run(k):
        results[k] = post(srv, docs[k])

    threads = [threading.Thread(target=run, args=(k,)) for k in range(len(docs))]
    for t in threads:
        t.start()
    return threads, results


def pending(srv):
    return pending_requests(srv, "m")


def wait_pending(srv, n):
    deadline = time.time() + 30
    while pending(srv) != n:
        assert time.time() < deadline, f"pending count never reached {n}"
        time.sleep(0.01)


def batch_stats(srv):
    r = requests.get(f"{srv.http_url}/v2/models/m/stats", timeout=10)
    assert r.status_code == 200, r.text
    stats = r.json()["model_stats"][0]["batch_stats"]
    return {b["batch_size"]: b["compute_infer"]["count"] for b in stats}


def test_concurrent_requests_batch(nereid_server, tmp_path, monkeypatch):
    repo = make_repo(tmp_path, "dynamic_batching { preferred_batch_size: [ 4 ] }")
    monkeypatch.setenv("NEREID_DELAY_SCHEDULER", "6")
    srv = nereid_server(repo)
    threads, results = in_threads(srv, [body(i) for i in range(6)])
    for t in threads:
        t.join(60)
    for i, r in enumerate(results):
        assert r.status_code == 200, r.text
        doc = r.json()
        assert doc["id"] == f"r{i}"
        assert doc["outputs"][0]["shape"] == [1, 3]
        assert doc["outputs"][0]["data"] == [i, i + 0.5, -i]
    assert batch_stats(srv) == {4: 1, 2: 1}
    assert pending(srv) == 0


def test_queue_full_is_503(nereid_server, tmp_path, monkeypatch):
    # Level 2 (the default) holds one request; level 1 is unbounded.
    repo = make_repo(tmp_path, "dynamic_batching { priority_levels: 2 default_priority_level: 2 "
                               "priority_queue_policy { key: 2 value { max_queue_size: 1 } } }")
    monkeypatch.setenv("NEREID_DELAY_SCHEDULER", "3")
    srv = nereid_server(repo)
    threads, results = in_threads(srv, [body(1)])
    wait_pending(srv, 1)
    r = post(srv, body(2))
    assert r.status_code == 503
    assert r.json() == {"error": "[request id: r2] Exceeds maximum queue size"}
    more, more_results = in_threads(srv, [body(3, priority=1), body(4, priority=1)])
    for t in threads + more:
        t.join(60)
    for res in results + more_results:
        assert res.status_code == 200, res.text
    assert batch_stats(srv) == {3: 1}


def test_queue_timeout_is_503(nereid_server, tmp_path, monkeypatch):
    # Level 2 (the default) times out after 100 ms; level 1 has no timeout.
    repo = make_repo(tmp_path, "dynamic_batching { priority_levels: 2 default_priority_level: 2 "
                               "priority_queue_policy { key: 2 value { "
                               "default_timeout_microseconds: 100000 } } }")
    monkeypatch.setenv("NEREID_DELAY_SCHEDULER", "2")
    srv = nereid_server(repo)
    busy = body(1, delay_ms=600, priority=1)
    late = body(2)
    late["inputs"][0]["shape"] = [1, 2]  # a different shape: never in busy's batch
    late["inputs"][0]["data"] = [1, 2]
    threads, results = in_threads(srv, [busy])
    wait_pending(srv, 1)
    r = post(srv, late)
    threads[0].join(60)
    assert results[0].status_code == 200, results[0].text
    assert r.status_code == 503
    assert r.json() == {"error": "Request timeout expired"}


def test_uint64_priority_levels(nereid_server, tmp_path, monkeypatch):
    # Triton's L0_config_json max_priority_level: any uint64 level count
    # loads (a queue exists only for a level with a policy or requests) and
    # the config echoes the 64-bit values as JSON numbers.
    repo = make_repo(tmp_path, "dynamic_batching { priority_levels: 18446744073709551615 "
                               "default_priority_level: 4294967295 "
                               "priority_queue_policy { key: 4294967296 value { "
                               "timeout_action: REJECT "
                               "default_timeout_microseconds: 18446744073709551615 "
                               "allow_timeout_override: true max_queue_size: 1 } } }")
    monkeypatch.setenv("NEREID_DELAY_SCHEDULER", "4")
    srv = nereid_server(repo)
    text = requests.get(f"{srv.http_url}/v2/models/m/config", timeout=10).text
    assert '"priority_levels":18446744073709551615' in text
    assert '"default_priority_level":4294967295' in text
    assert ('"4294967296":{"timeout_action":"REJECT","default_timeout_microseconds":'
            '18446744073709551615,"allow_timeout_override":true,"max_queue_size":10}'
            .replace("10}", "1}")) in text
    threads, results = in_threads(srv, [body(1, priority=4294967296)])
    wait_pending(srv, 1)
    r = post(srv, body(2, priority=4294967296))
    assert r.status_code == 503
    assert r.json() == {"error": "[request id: r2] Exceeds maximum queue size"}
    more, more_results = in_threads(
        srv, [body(3, priority=7), body(4), body(5, priority=18446744073709551615)])
    for t in threads + more:
        t.join(60)
    for res in results + more_results:
        assert res.status_code == 200, res.text
    assert batch_stats(srv) == {4: 1}
