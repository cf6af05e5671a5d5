"""Response cache (Triton's local cache, --cache-config local,size=N) through
the real binary over HTTP and gRPC: hits return the identical response
without running the model, requests that differ in shape, datatype, input
names, version or requested outputs never share an entry, LRU eviction at the
size limit, models without response_cache and servers without a cache are
untouched, and the statistics and nv_cache_* metrics count as Triton does."""
import json
import os
import re
import subprocess
import threading
import time

import grpc
import numpy as np
import pytest
import requests

from conftest import NEREID
from grpc_util import infer_request, stubs
from http_helpers import build_infer, infer, output_array, split_response, write_model

IDENTITY = """name: "{name}"
backend: "identity"
max_batch_size: 8
{extra}
input [ {{ name: "{inp}" data_type: {dt} dims: [ -1 ] }} ]
output [ {{ name: "{out}" data_type: {dt} dims: [ -1 ] }} ]
"""
CACHE = "response_cache { enable: true }"


def identity(name, extra=CACHE, dt="TYPE_FP32", inp="INPUT0", out="OUTPUT0"):
    return IDENTITY.format(name=name, extra=extra, dt=dt, inp=inp, out=out)


ADD_SUB = """name: "add_sub"
backend: "add_sub"
max_batch_size: 8
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 16 ] },
        { name: "INPUT1" data_type: TYPE_FP32 dims: [ 16 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 16 ] },
         { name: "OUTPUT1" data_type: TYPE_FP32 dims: [ 16 ] } ]
response_cache { enable: true }
"""
SLOW = """name: "slow"
backend: "testing"
max_batch_size: 1
dynamic_batching { }
instance_group [ { count: 1 kind: KIND_CPU } ]
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ -1 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ -1 ] } ]
response_cache { enable: true }
"""


def repo_with(tmp_path, models):
    repo = str(tmp_path / "models")
    for name, config in models.items():
        write_model(repo, name, config)
    return repo


def fp32(server, model, data, shape=None, version=None, outputs=None, name="INPUT0"):
    arr = np.asarray(data, np.float32)
    body, headers = build_infer([{"name": name, "datatype": "FP32", "data": arr,
                                  "shape": shape or list(arr.shape), "binary": True}],
                                outputs=outputs)
    r = infer(server, model, body, headers, version=version)
    assert r.status_code == 200, r.text
    return split_response(r)


def stats(server, model, version=None):
    path = f"/v2/models/{model}" + (f"/versions/{version}" if version else "") + "/stats"
    doc = requests.get(server.http_url + path).json()
    assert len(doc["model_stats"]) == 1
    return doc["model_stats"][0]


def counts(server, model, version=None):
    st = stats(server, model, version)
    inf = st["inference_stats"]
    return {"hit": inf["cache_hit"]["count"], "miss": inf["cache_miss"]["count"],
            "exec": st["execution_count"]}


def metrics(server):
    values = {}
    for line in requests.get(server.metrics_url + "/metrics").text.splitlines():
        if line.startswith("#") or not line.strip():
            continue
        m = re.match(r'^(\w+)(?:\{([^}]*)\})? (\S+)$', line)
        labels = dict(re.findall(r'(\w+)="([^"]*)"', m.group(2) or ""))
        values[(m.group(1), labels.get("model"), labels.get("version"))] = float(m.group(3))
    return values


def test_hit_returns_identical_response_and_counts_as_triton(nereid_server, tmp_path):
    s = nereid_server(repo_with(tmp_path, {"cached": identity("cached")}),
                      "--cache-config=local,size=1048576")
    x = np.arange(8, dtype=np.float32).reshape(1, 8)
    first = fp32(s, "cached", x)
    # the identity backend's response parameters (param0..3) come from its
    # execution; Triton's cache entries keep outputs only, so hits lack them
    assert first[0].pop("parameters")["param1"] == 42
    before = stats(s, "cached")
    for _ in range(3):
        doc, raw = fp32(s, "cached", x)
        assert "parameters" not in doc
        assert (doc, raw) == first
    assert np.array_equal(output_array(*first, "OUTPUT0"), x)
    st = stats(s, "cached")
    inf = st["inference_stats"]
    assert inf["cache_miss"]["count"] == 1 and inf["cache_miss"]["ns"] > 0
    assert inf["cache_hit"]["count"] == 3 and inf["cache_hit"]["ns"] > 0
    # Triton: hits count as successes with queue time, not as inferences,
    # executions or compute; the last inference time is the execution's.
    assert inf["success"]["count"] == 4 and inf["queue"]["count"] == 4
    for k in ("compute_input", "compute_infer", "compute_output"):
        assert inf[k]["count"] == 1, k
    assert st["inference_count"] == 1 and st["execution_count"] == 1
    assert st["last_inference"] == before["last_inference"]
    assert st["response_stats"]["0"]["success"]["count"] == 1
    assert [b["compute_infer"]["count"] for b in st["batch_stats"]] == [1]

    v = metrics(s)
    assert v[("nv_cache_num_hits_per_model", "cached", "1")] == 3
    assert v[("nv_cache_num_misses_per_model", "cached", "1")] == 1
    assert ("nv_cache_hit_duration_per_model", "cached", "1") in v
    assert ("nv_cache_miss_duration_per_model", "cached", "1") in v
    assert v[("nv_inference_request_success", "cached", "1")] == 4
    assert v[("nv_inference_count", "cached", "1")] == 1
    assert v[("nv_inference_exec_count", "cached", "1")] == 1
    assert v[("nv_cache_num_entries", None, None)] == 1
    assert v[("nv_cache_num_lookups", None, None)] == 4
    assert v[("nv_cache_num_hits", None, None)] == 3
    assert v[("nv_cache_num_misses", None, None)] == 1
    assert v[("nv_cache_num_evictions", None, None)] == 0
    assert 0 < v[("nv_cache_util", None, None)] < 0.01
    text = requests.get(s.metrics_url + "/metrics").text
    assert "# HELP nv_cache_num_hits_per_model Number of cache hits per model\n" \
           "# TYPE nv_cache_num_hits_per_model counter\n" in text
    assert "# HELP nv_cache_util Cache utilization [0.0 - 1.0]\n# TYPE nv_cache_util gauge\n" in text


def test_grpc_and_http_share_the_cache(nereid_server, tmp_path):
    s = nereid_server(repo_with(tmp_path, {"cached": identity("cached")}),
                      "--cache-config=local,size=1048576")
    pb, pbg = stubs()[:2]
    vals = [1.5, -2.0, 3.25]
    with grpc.insecure_channel(s.grpc_addr) as ch:
        stub = pbg.GRPCInferenceServiceStub(ch)
        req = infer_request(pb, "cached", [("INPUT0", "FP32", [1, 3], np.float32(vals))], id="a")
        r1 = stub.ModelInfer(req)
        req.id = "b"
        r2 = stub.ModelInfer(req)
    assert (r1.id, r2.id) == ("a", "b")  # the id is the request's, not the cached one
    assert r1.outputs == r2.outputs and r1.raw_output_contents == r2.raw_output_contents
    assert np.frombuffer(r2.raw_output_contents[0], np.float32).tolist() == vals
    doc, raw = fp32(s, "cached", [vals])  # the same request over HTTP: a hit
    assert output_array(doc, raw, "OUTPUT0").tolist() == [vals]
    assert counts(s, "cached") == {"hit": 2, "miss": 1, "exec": 1}
    with grpc.insecure_channel(s.grpc_addr) as ch:
        st = pbg.GRPCInferenceServiceStub(ch).ModelStatistics(
            pb.ModelStatisticsRequest(name="cached")).model_stats[0]
    assert st.inference_stats.cache_hit.count == 2 and st.inference_stats.cache_miss.count == 1


def test_different_requests_never_share_an_entry(nereid_server, tmp_path):
    cached = identity("cached").replace("max_batch_size: 8",
                                        "max_batch_size: 8\nversion_policy: { all { } }")
    repo = repo_with(tmp_path, {"cached": cached, "add_sub": ADD_SUB})
    os.makedirs(os.path.join(repo, "cached", "2"))
    s = nereid_server(repo, "--cache-config=local,size=1048576")
    x = [1, 2, 3, 4]
    # same bytes, different shape
    a = fp32(s, "cached", [x], version="1")
    b = fp32(s, "cached", [[1, 2], [3, 4]], version="1")
    assert a[0]["outputs"][0]["shape"] == [1, 4] and b[0]["outputs"][0]["shape"] == [2, 2]
    # same request, other version
    c = fp32(s, "cached", [x], version="2")
    assert c[0]["model_version"] == "2"
    assert counts(s, "cached", "1") == {"hit": 0, "miss": 2, "exec": 2}
    assert counts(s, "cached", "2") == {"hit": 0, "miss": 1, "exec": 1}
    assert fp32(s, "cached", [x], version="2")[0]["model_version"] == "2"
    assert counts(s, "cached", "2") == {"hit": 1, "miss": 1, "exec": 1}

    # the same two tensors bound to the other input names
    p, q = np.arange(16, dtype=np.float32), np.full(16, 10, np.float32)

    def add_sub(in0, in1, outputs=None):
        body, headers = build_infer([{"name": "INPUT0", "datatype": "FP32", "data": [in0]},
                                     {"name": "INPUT1", "datatype": "FP32", "data": [in1]}],
                                    outputs=outputs)
        r = infer(s, "add_sub", body, headers)
        assert r.status_code == 200, r.text
        return r.json()

    d1 = add_sub(p, q)
    d2 = add_sub(q, p)
    assert d1["outputs"][1]["data"] == (p - q).tolist()
    assert d2["outputs"][1]["data"] == (q - p).tolist()
    assert counts(s, "add_sub") == {"hit": 0, "miss": 2, "exec": 2}

    # requested outputs: the backend computes only those asked for
    o0 = add_sub(p, q, [{"name": "OUTPUT0"}])
    o1 = add_sub(p, q, [{"name": "OUTPUT1"}])
    assert [o["name"] for o in o0["outputs"]] == ["OUTPUT0"]
    assert [o["name"] for o in o1["outputs"]] == ["OUTPUT1"]
    assert o1["outputs"][0]["data"] == (p - q).tolist()
    assert counts(s, "add_sub") == {"hit": 0, "miss": 4, "exec": 4}
    # the same set in another order is a hit, in the order asked for
    both = add_sub(p, q, [{"name": "OUTPUT1"}, {"name": "OUTPUT0"}])
    assert [o["name"] for o in both["outputs"]] == ["OUTPUT1", "OUTPUT0"]
    both = add_sub(p, q, [{"name": "OUTPUT0"}, {"name": "OUTPUT1"}])
    assert [o["name"] for o in both["outputs"]] == ["OUTPUT0", "OUTPUT1"]
    assert both["outputs"] == d1["outputs"]
    assert counts(s, "add_sub") == {"hit": 1, "miss": 5, "exec": 5}
    # classification is applied per request to the cached tensor
    cls = add_sub(p, q, [{"name": "OUTPUT0", "parameters": {"classification": 2}}])
    assert cls["outputs"][0]["datatype"] == "BYTES"
    assert cls["outputs"][0]["data"] == ["25.000000:15", "24.000000:14"]
    assert counts(s, "add_sub") == {"hit": 2, "miss": 5, "exec": 5}


def test_reloaded_model_with_other_datatype_or_input_name(nereid_server, tmp_path):
    repo = repo_with(tmp_path, {"cached": identity("cached")})
    s = nereid_server(repo, "--model-control-mode=explicit", "--load-model=cached",
                      "--cache-config=local,size=1048576")
    raw = np.arange(4, dtype=np.int32).tobytes()

    def send(datatype, name="INPUT0"):
        body, headers = build_infer([{"name": name, "datatype": datatype, "shape": [1, 4],
                                      "data": np.frombuffer(raw, DT[datatype]), "binary": True}],
                                    outputs=[{"name": "OUTPUT0", "parameters": {"binary_data": True}}])
        r = infer(s, "cached", body, headers)
        assert r.status_code == 200, r.text
        return split_response(r)

    DT = {"FP32": np.float32, "INT32": np.int32}
    doc, out = send("FP32")
    assert out["OUTPUT0"] == raw and doc["outputs"][0]["datatype"] == "FP32"

    def reload(config):
        r = requests.post(s.http_url + "/v2/repository/models/cached/load",
                          json={"parameters": {"config": config}})
        assert r.status_code == 200, r.text

    # same name and version, same bytes: the datatype alone tells them apart
    reload(json.dumps({"name": "cached", "backend": "identity", "max_batch_size": 8,
                       "input": [{"name": "INPUT0", "data_type": "TYPE_INT32", "dims": [-1]}],
                       "output": [{"name": "OUTPUT0", "data_type": "TYPE_INT32", "dims": [-1]}],
                       "response_cache": {"enable": True}}))
    doc, out = send("INT32")
    assert out["OUTPUT0"] == raw and doc["outputs"][0]["datatype"] == "INT32"
    assert counts(s, "cached") == {"hit": 0, "miss": 1, "exec": 1}
    # ... and the input name alone
    reload(json.dumps({"name": "cached", "backend": "identity", "max_batch_size": 8,
                       "input": [{"name": "X", "data_type": "TYPE_INT32", "dims": [-1]}],
                       "output": [{"name": "OUTPUT0", "data_type": "TYPE_INT32", "dims": [-1]}],
                       "response_cache": {"enable": True}}))
    doc, out = send("INT32", name="X")
    assert counts(s, "cached") == {"hit": 0, "miss": 1, "exec": 1}
    send("INT32", name="X")
    assert counts(s, "cached") == {"hit": 1, "miss": 1, "exec": 1}


def test_lru_eviction_at_the_size_limit(nereid_server, tmp_path):
    # An entry of 1000 FP32 elements costs about 8.2 kB (the response as
    # Triton packs it plus the key): two fit in 20000 bytes, three do not.
    s = nereid_server(repo_with(tmp_path, {"cached": identity("cached")}),
                      "--cache-config=local,size=20000")
    a, b, c = (np.full((1, 1000), v, np.float32) for v in (1, 2, 3))
    fp32(s, "cached", a)
    fp32(s, "cached", b)
    fp32(s, "cached", a)  # hit: a is now the most recently used
    assert counts(s, "cached") == {"hit": 1, "miss": 2, "exec": 2}
    fp32(s, "cached", c)  # evicts b, the least recently used
    v = metrics(s)
    assert v[("nv_cache_num_evictions", None, None)] == 1
    assert v[("nv_cache_num_entries", None, None)] == 2
    assert 0.75 < v[("nv_cache_util", None, None)] <= 1
    fp32(s, "cached", a)  # still cached
    fp32(s, "cached", c)  # still cached
    assert counts(s, "cached") == {"hit": 3, "miss": 3, "exec": 3}
    doc, raw = fp32(s, "cached", b)  # evicted: runs again, evicting a
    assert np.array_equal(output_array(doc, raw, "OUTPUT0"), b)
    assert counts(s, "cached") == {"hit": 3, "miss": 4, "exec": 4}
    assert metrics(s)[("nv_cache_num_evictions", None, None)] == 2

    # an entry larger than the whole cache is never inserted (nor evicts)
    big = np.full((1, 3000), 7, np.float32)
    for _ in range(2):
        doc, raw = fp32(s, "cached", big)
        assert np.array_equal(output_array(doc, raw, "OUTPUT0"), big)
    assert counts(s, "cached") == {"hit": 3, "miss": 6, "exec": 6}
    v = metrics(s)
    assert v[("nv_cache_num_entries", None, None)] == 2
    assert v[("nv_cache_num_evictions", None, None)] == 2
    assert "is greater than total cache size: 20000" in s.output()
    fp32(s, "cached", c)
    assert counts(s, "cached")["hit"] == 4


def test_cache_disabled_per_model_and_failures_not_cached(nereid_server, tmp_path):
    repo = repo_with(tmp_path, {"plain": identity("plain", extra=""),
                                "cached": identity("cached"), "slow": SLOW})
    s = nereid_server(repo, "--cache-config=local,size=1048576")
    for _ in range(3):
        fp32(s, "plain", [[1, 2]])
    assert counts(s, "plain") == {"hit": 0, "miss": 0, "exec": 3}
    v = metrics(s)
    assert ("nv_cache_num_hits_per_model", "plain", "1") not in v
    assert v[("nv_cache_num_lookups", None, None)] == 0
    # a failed response is not cached: the next identical request runs
    body, headers = build_infer([{"name": "INPUT0", "datatype": "FP32", "data": [[5, 6]]}],
                                parameters={"fail": "true"})
    assert infer(s, "slow", body, headers).status_code == 500
    fp32(s, "slow", [[5, 6]])
    fp32(s, "slow", [[5, 6]])
    assert counts(s, "slow") == {"hit": 1, "miss": 1, "exec": 2}


def pending(server, model):
    return metrics(server)[("nv_inference_pending_request_count", model, "1")]


def test_hits_skip_the_scheduler(nereid_server, tmp_path):
    s = nereid_server(repo_with(tmp_path, {"slow": SLOW}), "--cache-config=local,size=1048576")
    fp32(s, "slow", [[1, 2, 3]])
    # The only instance runs a request that waits for a file, a second one
    # queues behind it ...
    gate = str(tmp_path / "gate")
    held = [None, None]

    def run(i):
        body, headers = build_infer([{"name": "INPUT0", "datatype": "FP32", "data": [[i]]}],
                                    parameters={"wait_for_file": gate})
        held[i] = infer(s, "slow", body, headers)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    deadline = time.time() + 20
    while pending(s, "slow") != 1:
        assert time.time() < deadline
        time.sleep(0.01)
    # ... and a cached request is answered at once.
    doc, raw = fp32(s, "slow", [[1, 2, 3]])
    assert output_array(doc, raw, "OUTPUT0").tolist() == [[1, 2, 3]]
    assert pending(s, "slow") == 1 and all(t.is_alive() for t in threads)
    open(gate, "w").close()
    for t in threads:
        t.join(30)
    assert [r.status_code for r in held] == [200, 200]
    assert counts(s, "slow") == {"hit": 1, "miss": 3, "exec": 3}


def test_model_cache_without_server_cache(nereid_server, tmp_path):
    s = nereid_server(repo_with(tmp_path, {"cached": identity("cached")}))
    for _ in range(3):
        fp32(s, "cached", [[1, 2]])
    assert counts(s, "cached") == {"hit": 0, "miss": 0, "exec": 3}
    text = requests.get(s.metrics_url + "/metrics").text
    assert "nv_cache" not in text
    # the config still says what the model asked for
    cfg = requests.get(s.http_url + "/v2/models/cached/config").json()
    assert cfg["response_cache"] == {"enable": True}


def test_response_cache_byte_size_is_the_local_cache(nereid_server, tmp_path):
    s = nereid_server(repo_with(tmp_path, {"cached": identity("cached")}),
                      "--response-cache-byte-size=4096")
    fp32(s, "cached", [[1, 2]])
    fp32(s, "cached", [[1, 2]])
    assert counts(s, "cached") == {"hit": 1, "miss": 1, "exec": 1}
    assert ("Warning: '--response-cache-byte-size' has been deprecated! This will default to "
            "the 'local' cache implementation with the provided byte size for its config. "
            "Please use '--cache-config' instead. The equivalent --cache-config CLI args would "
            "be: '--cache-config=local,size=4096'") in s.output()


@pytest.mark.parametrize("args,code,text", [
    (["--cache-config=local,size=1", "--response-cache-byte-size=1"], 2,
     "Error: Incompatible flags --response-cache-byte-size and --cache-config both provided. "
     "Please provide one or the other."),
    (["--cache-config=size=1"], 2,
     "No cache specified. --cache-config option format is <cache name>,<setting>=<value>. "
     "Got size=1"),
    (["--cache-config=local,size"], 2,
     "--cache-config option format is '<cache name>,<setting>=<value>'. Got local,size"),
    (["--cache-config=local,size="], 2,
     "--cache-config option format is '<cache name>,<setting>=<value>'. Got local,size="),
    (["--cache-config=local,size=1", "--cache-config=redis,host=x"], 1,
     "error: creating server: Invalid argument - found multiple cache configurations, but "
     "only a single cache is currently supported"),
    (["--cache-config=redis,host=localhost"], 1,
     "error: creating server: Invalid argument - unable to find 'libtritoncache_redis.so' for "
     "cache. Searched: /opt/tritonserver/caches"),
    (["--cache-config=local,size=lots"], 1,
     "error: creating server: Internal - Failed to initialize LocalCache: stoull"),
    (["--cache-config=local,bytes=10"], 1,
     "error: creating server: Invalid argument - Failed to initialize LocalCache: config "
     "didn't contain a valid 'size' field."),
])
def test_cache_flag_errors(tmp_path, args, code, text):
    repo = repo_with(tmp_path, {"cached": identity("cached")})
    r = subprocess.run([NEREID, f"--model-repository={repo}", "--http-port=0", "--grpc-port=0",
                        "--metrics-port=0"] + args, capture_output=True, text=True, timeout=30)
    assert r.returncode == code, r.stderr
    assert text in r.stderr


ENSEMBLE = """name: "ens"
platform: "ensemble"
max_batch_size: 8
input [ { name: "X" data_type: TYPE_FP32 dims: [ -1 ] } ]
output [ { name: "Y" data_type: TYPE_FP32 dims: [ -1 ] } ]
ensemble_scheduling { step [
  { model_name: "plain" model_version: -1
    input_map { key: "INPUT0" value: "X" } output_map { key: "OUTPUT0" value: "mid" } },
  { model_name: "cached" model_version: -1
    input_map { key: "INPUT0" value: "mid" } output_map { key: "OUTPUT0" value: "Y" } } ] }
response_cache { enable: true }
"""


def test_ensemble_and_its_steps(nereid_server, tmp_path):
    # The ensemble caches whole requests; its cached step caches its own.
    repo = repo_with(tmp_path, {"plain": identity("plain", extra=""), "cached": identity("cached"),
                                "ens": ENSEMBLE})
    s = nereid_server(repo, "--cache-config=local,size=1048576")
    for _ in range(3):
        doc, raw = fp32(s, "ens", [[4, 5, 6]], name="X")
        assert output_array(doc, raw, "Y").tolist() == [[4, 5, 6]]
    assert counts(s, "ens") == {"hit": 2, "miss": 1, "exec": 1}
    # Triton reports no per-model cache metrics for an ensemble
    v = metrics(s)
    assert ("nv_cache_num_hits_per_model", "ens", "1") not in v
    assert v[("nv_cache_num_hits", None, None)] == 2
    assert counts(s, "plain") == {"hit": 0, "miss": 0, "exec": 1}
    assert counts(s, "cached") == {"hit": 0, "miss": 1, "exec": 1}
    # the step alone with the same input and the output the ensemble asks
    # for is a hit of the step's entry
    fp32(s, "cached", [[4, 5, 6]], outputs=[{"name": "OUTPUT0"}])
    assert counts(s, "cached") == {"hit": 1, "miss": 1, "exec": 1}


REPEAT = """name: "repeat"
backend: "repeat"
max_batch_size: 0
model_transaction_policy { decoupled: true }
input [ { name: "IN" data_type: TYPE_INT32 dims: [ -1 ] },
        { name: "DELAY" data_type: TYPE_UINT32 dims: [ -1 ] },
        { name: "WAIT" data_type: TYPE_UINT32 dims: [ 1 ] } ]
output [ { name: "OUT" data_type: TYPE_INT32 dims: [ 1 ] },
         { name: "IDX" data_type: TYPE_UINT32 dims: [ 1 ] } ]
"""
DECOUPLED_ENSEMBLE = """name: "ens_dec"
platform: "ensemble"
max_batch_size: 0
input [ { name: "IN" data_type: TYPE_INT32 dims: [ -1 ] },
        { name: "DELAY" data_type: TYPE_UINT32 dims: [ -1 ] },
        { name: "WAIT" data_type: TYPE_UINT32 dims: [ 1 ] } ]
output [ { name: "OUT" data_type: TYPE_INT32 dims: [ 1 ] } ]
ensemble_scheduling { step [
  { model_name: "repeat" model_version: -1
    input_map { key: "IN" value: "IN" } input_map { key: "DELAY" value: "DELAY" }
    input_map { key: "WAIT" value: "WAIT" }
    output_map { key: "OUT" value: "OUT" } } ] }
response_cache { enable: true }
"""


def test_ensemble_of_a_decoupled_model_refuses_the_cache(nereid_server, tmp_path):
    # Triton: the ensemble is decoupled through its step, so its cache is
    # refused as for a decoupled model (L0_response_cache's check).
    repo = repo_with(tmp_path, {"repeat": REPEAT, "ens_dec": DECOUPLED_ENSEMBLE})
    s = nereid_server(repo, "--model-control-mode=explicit", "--cache-config=local,size=10480")
    r = requests.post(s.http_url + "/v2/repository/models/ens_dec/load")
    assert r.status_code == 400
    assert ("Response Cache does not currently support model ens_dec with 'decoupled' "
            "transaction policy. Please disable the response cache.") in r.json()["error"]
    # without the cache it loads
    with open(os.path.join(repo, "ens_dec", "config.pbtxt"), "w") as f:
        f.write(DECOUPLED_ENSEMBLE.replace("response_cache { enable: true }", ""))
    r = requests.post(s.http_url + "/v2/repository/models/ens_dec/load")
    assert r.status_code == 200, r.text
