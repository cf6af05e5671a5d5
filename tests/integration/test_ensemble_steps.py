"""Which ensemble steps run, and how many at once: steps whose outputs the
response does not need are not run (Triton's L0_simple_ensemble
test_ensemble_add_sub_one_output), and ensemble_scheduling
.max_inflight_requests bounds each step's requests in flight across the
ensemble's requests."""
import os
import shutil
import threading

import pytest
import requests

from conftest import EXAMPLES

needs_onnx = pytest.mark.skipif(
    not os.path.exists(os.path.join(EXAMPLES, "add_sub_onnx", "1", "model.onnx")),
    reason="run `make models` first")

SLOW = """name: "slow"
backend: "testing"
max_batch_size: 8
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ -1 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ -1 ] } ]
dynamic_batching { max_queue_delay_microseconds: 500000 }
"""

LIMITED = """name: "limited"
platform: "ensemble"
max_batch_size: 8
input [ { name: "IN" data_type: TYPE_FP32 dims: [ -1 ] } ]
output [ { name: "OUT" data_type: TYPE_FP32 dims: [ -1 ] } ]
ensemble_scheduling {
  step [ { model_name: "slow" model_version: -1
           input_map { key: "INPUT0" value: "IN" }
           output_map { key: "OUTPUT0" value: "OUT" } } ]
  max_inflight_requests: 1
}
"""


def stats(s, model):
    r = requests.get(f"{s.http_url}/v2/models/{model}/stats", timeout=10)
    assert r.status_code == 200, r.text
    st = r.json()["model_stats"][0]
    return st["inference_stats"]["success"]["count"], {
        b["batch_size"]: b["compute_infer"]["count"] for b in st["batch_stats"]}


@needs_onnx
def test_unneeded_steps_do_not_run(nereid_server, tmp_path):
    repo = tmp_path / "models"
    for m in ("ensemble_add_sub", "add_sub", "add_sub_onnx", "identity_fp32"):
        shutil.copytree(os.path.join(EXAMPLES, m), repo / m)
    s = nereid_server(str(repo))
    x = [1.0] * 16
    body = {"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1, 16], "data": x},
                       {"name": "INPUT1", "datatype": "FP32", "shape": [1, 16], "data": x}],
            "outputs": [{"name": "OUTPUT1"}]}
    r = requests.post(f"{s.http_url}/v2/models/ensemble_add_sub/infer", json=body, timeout=60)
    assert r.status_code == 200, r.text
    out = r.json()["outputs"]
    assert [o["name"] for o in out] == ["OUTPUT1"] and out[0]["data"] == [2.0] * 16
    # OUTPUT1 needs add_sub (preprocess) and add_sub_onnx only.
    assert stats(s, "identity_fp32")[0] == 0
    assert stats(s, "add_sub_onnx")[0] == 1
    assert stats(s, "add_sub")[0] == 1
    del body["outputs"]  # every output: every step
    r = requests.post(f"{s.http_url}/v2/models/ensemble_add_sub/infer", json=body, timeout=60)
    assert r.status_code == 200, r.text
    assert stats(s, "identity_fp32")[0] == 1
    assert stats(s, "add_sub")[0] == 3


def test_max_inflight_requests(nereid_server, tmp_path):
    repo = tmp_path / "models"
    for name, cfg in (("slow", SLOW), ("limited", LIMITED)):
        (repo / name / "1").mkdir(parents=True)
        (repo / name / "config.pbtxt").write_text(cfg)
    s = nereid_server(str(repo))
    cfg = requests.get(f"{s.http_url}/v2/models/limited/config", timeout=10).json()
    assert cfg["ensemble_scheduling"]["max_inflight_requests"] == 1
    # Triton's log line, which L0_simple_ensemble greps
    assert "Ensemble model 'limited' configured with max_inflight_requests: 1" in s.output()
    results = [None] * 4

    def run(k):
        body = {"inputs": [{"name": "IN", "datatype": "FP32", "shape": [1, 2],
                            "data": [k, k]}], "parameters": {"delay_ms": 50}}
        results[k] = requests.post(f"{s.http_url}/v2/models/limited/infer", json=body,
                                   timeout=60)

    threads = [threading.Thread(target=run, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    for k, r in enumerate(results):
        assert r.status_code == 200, r.text
        assert r.json()["outputs"][0]["data"] == [k, k]
    # One step request in flight at a time: the step model never saw two
    # queued together, so it never batched (its queue delay is 0.5 s).
    assert stats(s, "slow") == (4, {1: 4})
    # A failed ensemble request counts under reason OTHER, twice as in
    # Triton (its error response, then its request tracker's end), its
    # step's failure once under BACKEND (L0_model_queue test_policy_reject).
    body = {"inputs": [{"name": "IN", "datatype": "FP32", "shape": [1, 1], "data": [1]}],
            "parameters": {"fail": "true"}}
    r = requests.post(f"{s.http_url}/v2/models/limited/infer", json=body, timeout=60)
    assert r.status_code != 200
    text = requests.get(f"{s.metrics_url}/metrics", timeout=10).text
    assert 'nv_inference_request_failure{model="limited",reason="OTHER",version="1"} 2\n' in text
    assert 'nv_inference_request_failure{model="limited",reason="BACKEND",version="1"} 0\n' in text
    assert 'nv_inference_request_failure{model="slow",reason="BACKEND",version="1"} 1\n' in text


IDENTITY_2 = """name: "identity_2"
backend: "identity"
max_batch_size: 4
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 1 ] optional: true },
        { name: "INPUT1" data_type: TYPE_FP32 dims: [ 1 ] optional: true } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 1 ] },
         { name: "OUTPUT1" data_type: TYPE_FP32 dims: [ 1 ] } ]
"""

WRAPPER = """name: "wrapper"
platform: "ensemble"
max_batch_size: 4
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 1 ] optional: true },
        { name: "INPUT1" data_type: TYPE_FP32 dims: [ 1 ] optional: true } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 1 ] },
         { name: "OUTPUT1" data_type: TYPE_FP32 dims: [ 1 ] } ]
ensemble_scheduling { step [ { model_name: "identity_2" model_version: -1
  input_map { key: "INPUT0" value: "INPUT0" } input_map { key: "INPUT1" value: "INPUT1" }
  output_map { key: "OUTPUT0" value: "OUTPUT0" } output_map { key: "OUTPUT1" value: "OUTPUT1" }
} ] }
"""

PIPELINE = WRAPPER.replace('"wrapper"', '"pipeline"').replace(
    """ensemble_scheduling { step [ { model_name: "identity_2" model_version: -1
  input_map { key: "INPUT0" value: "INPUT0" } input_map { key: "INPUT1" value: "INPUT1" }
  output_map { key: "OUTPUT0" value: "OUTPUT0" } output_map { key: "OUTPUT1" value: "OUTPUT1" }
} ] }""",
    """ensemble_scheduling { step [
  { model_name: "identity_2" model_version: -1
    input_map { key: "INPUT0" value: "INPUT0" } input_map { key: "INPUT1" value: "INPUT1" }
    output_map { key: "OUTPUT0" value: "internal" } },
  { model_name: "identity_2" model_version: -1
    input_map { key: "INPUT1" value: "internal" }
    output_map { key: "OUTPUT0" value: "OUTPUT0" } output_map { key: "OUTPUT1" value: "OUTPUT1" } }
] }""")


def test_optional_inputs_in_ensembles(nereid_server, tmp_path):
    """Triton's L0_optional_input: an optional ensemble input the request
    lacks is left out of the steps that read it; the identity model answers
    a requested output of a missing optional input with zeros."""
    repo = tmp_path / "models"
    for name, cfg in (("identity_2", IDENTITY_2), ("wrapper", WRAPPER),
                      ("pipeline", PIPELINE)):
        (repo / name / "1").mkdir(parents=True)
        (repo / name / "config.pbtxt").write_text(cfg)
    s = nereid_server(str(repo))

    def infer(model, inputs, outputs=None):
        body = {"inputs": [{"name": n, "datatype": "FP32", "shape": [1, 1], "data": [v]}
                           for n, v in inputs]}
        if outputs:
            body["outputs"] = [{"name": o} for o in outputs]
        r = requests.post(f"{s.http_url}/v2/models/{model}/infer", json=body, timeout=60)
        assert r.status_code == 200, r.text
        return {o["name"]: o["data"] for o in r.json()["outputs"]}

    assert infer("identity_2", [("INPUT1", 5.0)], ["OUTPUT0", "OUTPUT1"]) == {
        "OUTPUT0": [0.0], "OUTPUT1": [5.0]}
    assert infer("wrapper", [("INPUT0", 3.0)], ["OUTPUT0"]) == {"OUTPUT0": [3.0]}
    assert infer("wrapper", [("INPUT1", 4.0)], ["OUTPUT1"]) == {"OUTPUT1": [4.0]}
    assert infer("wrapper", [("INPUT0", 3.0)]) == {"OUTPUT0": [3.0], "OUTPUT1": [0.0]}
    # OUTPUT0 of the second step has no input: zeros; OUTPUT1 = INPUT0.
    assert infer("pipeline", [("INPUT0", 1.0), ("INPUT1", 0.0)]) == {
        "OUTPUT0": [0.0], "OUTPUT1": [1.0]}


@needs_onnx
def test_ensemble_responses_echo_sequence_id_and_flags(nereid_server, tmp_path):
    # Triton's ensemble responses carry the request's sequence id and flags
    # (L0_simple_ensemble test_ensemble_sequence_flags) when an output came
    # from a step; an output passed straight through from an input does not.
    repo = tmp_path / "models"
    for m in ("ensemble_add_sub", "add_sub", "add_sub_onnx", "identity_fp32"):
        shutil.copytree(os.path.join(EXAMPLES, m), repo / m)
    (repo / "passthrough" / "1").mkdir(parents=True)
    (repo / "passthrough" / "config.pbtxt").write_text(
        'name: "passthrough"\nplatform: "ensemble"\nmax_batch_size: 0\n'
        'input [ { name: "IN" data_type: TYPE_FP32 dims: [ 16 ] } ]\n'
        'output [ { name: "IN" data_type: TYPE_FP32 dims: [ 16 ] },\n'
        '         { name: "OUT" data_type: TYPE_FP32 dims: [ 16 ] } ]\n'
        'ensemble_scheduling { step [ { model_name: "identity_fp32" model_version: -1\n'
        '  input_map { key: "INPUT0" value: "IN" } output_map { key: "OUTPUT0" value: "OUT" } } ] }\n')
    s = nereid_server(str(repo))
    x = [1.0] * 16
    inputs = [{"name": "INPUT0", "datatype": "FP32", "shape": [1, 16], "data": x},
              {"name": "INPUT1", "datatype": "FP32", "shape": [1, 16], "data": x}]
    url = f"{s.http_url}/v2/models/ensemble_add_sub/infer"
    for params, want in (({}, {"sequence_id": 0, "sequence_start": False, "sequence_end": False}),
                         ({"sequence_id": 7, "sequence_start": True},
                          {"sequence_id": 7, "sequence_start": True, "sequence_end": False}),
                         ({"sequence_id": "abc", "sequence_end": True},
                          {"sequence_id": "abc", "sequence_start": False, "sequence_end": True})):
        r = requests.post(url, json={"inputs": inputs, "parameters": params}, timeout=60)
        assert r.status_code == 200, r.text
        assert r.json()["parameters"] == want
    r = requests.post(f"{s.http_url}/v2/models/passthrough/infer", json={
        "inputs": [{"name": "IN", "datatype": "FP32", "shape": [16], "data": x}],
        "outputs": [{"name": "IN"}]}, timeout=60)
    assert r.status_code == 200, r.text
    assert "parameters" not in r.json()
