"""Model lifetimes against the real binary: a model whose warmup fails is
freed only after its instance threads are gone (start-up with
--exit-on-error=false, explicit loads, reloads; under ASan a thread reading
the freed model makes the server exit non-zero)."""
import json
import os

import requests

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
    text = "warmup 'zeros' failed for model '%s': testing backend: execute failed"
    # Start-up: the failed model is reported, the server serves the rest
    # (each server must exit cleanly: the fixture checks its exit code).
    for _ in range(3):
        s = nereid_server(repo, "--exit-on-error=false")
        assert row(s, "warmfail")["state"] == "UNAVAILABLE"
        assert text % "warmfail" in row(s, "warmfail")["reason"]
        assert infer(s, "good").status_code == 200
        assert s.stop() == 0, s.output()
    s = nereid_server(repo, "--exit-on-error=false", "--model-control-mode=explicit",
                      "--load-model=good")
    for _ in range(6):
        r = post(s, "/v2/repository/models/warmfail/load")
        assert r.status_code == 400 and text % "warmfail" in r.json()["error"], r.text
        # A reload that fails its warmup keeps the old version serving.
        r = post(s, "/v2/repository/models/good/load", {"parameters": {"config": WARMFAIL_JSON}})
        assert r.status_code == 400 and text % "good" in r.json()["error"], r.text
        assert infer(s, "good").status_code == 200
