"""Model lifetimes against the real binary: a model whose warmup fails is
freed only after its instance threads are gone (start-up with
--exit-on-error=false, explicit loads, reloads; under ASan a thread reading
the freed model makes the server exit non-zero); unloading an ensemble with
unload_dependents lets its accepted requests finish before its composing
models go."""
import json
import os
import threading
import time

import grpc
import pytest
import requests

from grpc_util import stubs
from http_helpers import pending_requests

F2 = 'data_type: TYPE_FP32 dims: [ 2 ]'
IO = f"""input [ {{ name: "INPUT0" {F2} }} ]
output [ {{ name: "OUTPUT0" {F2} }} ]
"""
TESTING = 'backend: "testing" max_batch_size: 8\n' + IO
WARMFAIL = """backend: "testing" max_batch_size: 8
parameters { key: "fail_execute" value { string_value: "true" } }
instance_group [ { count: 2 kind: KIND_CPU } ]
""" + IO + """model_warmup [ { name: "zeros" batch_size: 1 inputs { key: "INPUT0"
  value { data_type: TYPE_FP32 dims: [ 2 ] zero_data: true } } } ]
"""
WARMFAIL_JSON = json.dumps({
    "backend": "testing", "max_batch_size": 8,
    "parameters": {"fail_execute": {"string_value": "true"}},
    "input": [{"name": "INPUT0", "data_type": "TYPE_FP32", "dims": [2]}],
    "output": [{"name": "OUTPUT0", "data_type": "TYPE_FP32", "dims": [2]}],
    "model_warmup": [{"name": "zeros", "batch_size": 1, "inputs": {
        "INPUT0": {"data_type": "TYPE_FP32", "dims": [2], "zero_data": True}}}]})


def write_model(repo, name, config):
    os.makedirs(os.path.join(repo, name, "1"), exist_ok=True)
    with open(os.path.join(repo, name, "config.pbtxt"), "w") as f:
        f.write(config)


def post(s, path, body=None):
    data = json.dumps(body) if body is not None else b""
    return requests.post(s.http_url + path, data=data, timeout=60)


def infer(s, model):
    body = {"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1, 2], "data": [1, 2]}]}
    return requests.post(f"{s.http_url}/v2/models/{model}/infer", json=body, timeout=60)


def row(s, name):
    for m in post(s, "/v2/repository/index").json():
        if m["name"] == name and m.get("version") == "1":
            return m
    return None


def test_failed_warmup_frees_model_after_its_threads(nereid_server, tmp_path):
    repo = str(tmp_path / "models")
    write_model(repo, "good", TESTING)
    write_model(repo, "warmfail", WARMFAIL)
    text = "failed to run warmup sample 'zeros': testing backend: execute failed; "
    # Start-up: the failed model is reported, the server serves the rest
    # (each server must exit cleanly: the fixture checks its exit code).
    for _ in range(3):
        s = nereid_server(repo, "--exit-on-error=false")
        assert row(s, "warmfail")["state"] == "UNAVAILABLE"
        assert text in row(s, "warmfail")["reason"]
        assert infer(s, "good").status_code == 200
        assert s.stop() == 0, s.output()
    s = nereid_server(repo, "--exit-on-error=false", "--model-control-mode=explicit",
                      "--load-model=good")
    for _ in range(6):
        r = post(s, "/v2/repository/models/warmfail/load")
        assert r.status_code == 400 and text in r.json()["error"], r.text
        # A reload that fails its warmup keeps the old version serving.
        r = post(s, "/v2/repository/models/good/load", {"parameters": {"config": WARMFAIL_JSON}})
        assert r.status_code == 400 and text in r.json()["error"], r.text
        assert infer(s, "good").status_code == 200


# Steps listed downstream first: unload_dependents takes 'fast' before 'slow',
# while every request still has its 'fast' step ahead of it.
CHAIN = f"""platform: "ensemble" max_batch_size: 8
input [ {{ name: "X" {F2} }} ]
output [ {{ name: "Y" {F2} }} ]
ensemble_scheduling {{ step [
  {{ model_name: "fast" input_map {{ key: "INPUT0" value: "T" }}
     output_map {{ key: "OUTPUT0" value: "Y" }} }},
  {{ model_name: "slow" input_map {{ key: "INPUT0" value: "X" }}
     output_map {{ key: "OUTPUT0" value: "T" }} }} ] }}
"""


pending = pending_requests


def wait_for(cond, what):
    deadline = time.time() + 30
    while not cond():
        assert time.time() < deadline, what
        time.sleep(0.01)


@pytest.mark.parametrize("target", ["chain", "fast"])
def test_ensemble_requests_keep_composing_models(nereid_server, tmp_path, target):
    """Unloading the ensemble with unload_dependents, or one of its composing
    models directly, waits for the ensemble requests already accepted."""
    repo = str(tmp_path / "models")
    write_model(repo, "fast", TESTING)
    write_model(repo, "slow", TESTING.replace(
        "max_batch_size: 8", "max_batch_size: 8 instance_group [ { count: 1 kind: KIND_CPU } ]"))
    write_model(repo, "chain", CHAIN)
    s = nereid_server(repo, "--model-control-mode=explicit")
    assert post(s, "/v2/repository/models/chain/load").status_code == 200
    # Each request's 'slow' step waits until the gate file exists (a
    # parameter the ensemble passes to its steps): one executes, 7 queue.
    gate = str(tmp_path / "gate")
    results = [None] * 8

    def run(i):
        body = {"parameters": {"wait_for_file": gate},
                "inputs": [{"name": "X", "datatype": "FP32", "shape": [1, 2], "data": [i, -i]}]}
        r = requests.post(f"{s.http_url}/v2/models/chain/infer", json=body, timeout=60)
        results[i] = (r.status_code, r.json())

    clients = [threading.Thread(target=run, args=(i,)) for i in range(8)]
    for t in clients:
        t.start()
    wait_for(lambda: pending(s, "slow") == 7, "the 8 requests were not all accepted")
    unload = {}
    unloader = threading.Thread(target=lambda: unload.update(r=post(
        s, f"/v2/repository/models/{target}/unload", {"parameters": {"unload_dependents": True}})))
    unloader.start()
    # The unload has begun: 'fast' (the first step listed) is leaving. (Asked
    # over gRPC: the unload keeps one HTTP thread, which may own a new
    # connection.)
    pb, pbg = stubs()[:2]
    with grpc.insecure_channel(s.grpc_addr) as ch:
        stub = pbg.GRPCInferenceServiceStub(ch)

        def leaving():
            models = stub.RepositoryIndex(pb.RepositoryIndexRequest(), timeout=10).models
            return any(m.name == "fast" and m.state != "READY" for m in models)

        wait_for(leaving, "the unload did not start")
    open(gate, "w").close()
    for t in clients:
        t.join()
    unloader.join()
    for i, (status, body) in enumerate(results):
        assert status == 200, body
        assert body["outputs"][0]["data"] == [i, -i]
    assert unload["r"].status_code == 200
    # (unloading 'fast' unloads the ensemble that uses it: Triton's
    # dependency graph, L0_lifecycle test_model_control)
    gone = ("chain", "fast", "slow") if target == "chain" else ("fast", "chain")
    for name in gone:
        assert row(s, name) == {"name": name, "version": "1", "state": "UNAVAILABLE",
                                "reason": "unloaded"}
    assert infer(s, "fast").status_code == 404
    if target == "fast":
        # New requests find the ensemble unloaded with its step.
        body = {"inputs": [{"name": "X", "datatype": "FP32", "shape": [1, 2], "data": [1, 2]}]}
        r = requests.post(f"{s.http_url}/v2/models/chain/infer", json=body, timeout=60)
        assert r.json() == {"error": "Request for unknown model: 'chain' has no available versions"}
        assert infer(s, "slow").status_code == 200
