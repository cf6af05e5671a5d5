"""Model management and ensembles over HTTP: explicit load / unload / reload
with overrides, repository index states and reasons, path traversal, loading
an ensemble with its composing models, load and unload under continuous
inference, poll mode, and ensemble results, parallel timing, step errors and
statistics."""
import base64
import json
import os
import shutil
import threading
import time

import numpy as np
import requests

from conftest import EXAMPLES
from http_helpers import pending_requests

F2 = 'data_type: TYPE_FP32 dims: [ 2 ]'
TESTING = f"""backend: "testing" max_batch_size: 8
input [ {{ name: "INPUT0" {F2} }} ]
output [ {{ name: "OUTPUT0" {F2} }} ]
"""


def slow_config(ms, count=1):
    return f"""backend: "testing" max_batch_size: 8
parameters {{ key: "execute_delay_ms" value {{ string_value: "{ms}" }} }}
instance_group [ {{ count: {count} kind: KIND_CPU }} ]
input [ {{ name: "INPUT0" {F2} }} ]
output [ {{ name: "OUTPUT0" {F2} }} ]
"""


PARALLEL = f"""platform: "ensemble" max_batch_size: 8
input [ {{ name: "X" {F2} }} ]
output [ {{ name: "P" {F2} }}, {{ name: "Q" {F2} }} ]
ensemble_scheduling {{ step [
  {{ model_name: "slow_a" input_map {{ key: "INPUT0" value: "X" }}
     output_map {{ key: "OUTPUT0" value: "P" }} }},
  {{ model_name: "%s" input_map {{ key: "INPUT0" value: "X" }}
     output_map {{ key: "OUTPUT0" value: "Q" }} }} ] }}
"""


def write_model(repo, name, config, versions=(1,)):
    d = os.path.join(repo, name)
    os.makedirs(d, exist_ok=True)
    for v in versions:
        os.makedirs(os.path.join(d, str(v)), exist_ok=True)
    with open(os.path.join(d, "config.pbtxt"), "w") as f:
        f.write(config)


def make_repo(tmp_path):
    repo = str(tmp_path / "models")
    os.makedirs(repo)
    write_model(repo, "plain", TESTING)
    write_model(repo, "other", TESTING)
    write_model(repo, "slow", slow_config(5, 2))
    write_model(repo, "slow_a", slow_config(300))
    write_model(repo, "slow_b", slow_config(300))
    write_model(repo, "fails", TESTING.replace(
        "max_batch_size: 8",
        'max_batch_size: 8 parameters { key: "fail_execute" value { string_value: "true" } }'))
    write_model(repo, "parallel", PARALLEL % "slow_b")
    write_model(repo, "broken_step", PARALLEL % "fails")
    return repo


def post(s, path, body=None):
    data = json.dumps(body) if body is not None else b""
    return requests.post(s.http_url + path, data=data, timeout=30)


def infer(s, model, x=(1.0, 2.0), name="INPUT0", version=None):
    body = {"inputs": [{"name": name, "datatype": "FP32", "shape": [1, 2], "data": list(x)}]}
    path = f"/v2/models/{model}" + (f"/versions/{version}" if version else "") + "/infer"
    return requests.post(s.http_url + path, json=body, timeout=30)


def index(s, ready=None):
    r = post(s, "/v2/repository/index", {"ready": ready} if ready is not None else None)
    assert r.status_code == 200, r.text
    return r.json()


def row(s, name, version=None):
    for m in index(s):
        if m["name"] == name and (version is None or m.get("version") == version):
            return m
    return None


def wait_for(cond, timeout=15):
    deadline = time.time() + timeout
    while time.time() < deadline:
        if cond():
            return True
        time.sleep(0.05)
    return False


def test_explicit_load_unload_index(nereid_server, tmp_path):
    repo = make_repo(tmp_path)
    s = nereid_server(repo, "--model-control-mode=explicit", "--load-model=plain")
    assert row(s, "plain", "1") == {"name": "plain", "version": "1", "state": "READY"}
    assert row(s, "other") == {"name": "other"}
    assert infer(s, "other").status_code == 404

    assert post(s, "/v2/repository/models/other/load").status_code == 200
    r = infer(s, "other", (5, 6))
    assert r.status_code == 200 and r.json()["outputs"][0]["data"] == [5, 6]
    assert post(s, "/v2/repository/models/other/unload").status_code == 200
    assert row(s, "other", "1") == {"name": "other", "version": "1", "state": "UNAVAILABLE",
                                    "reason": "unloaded"}
    assert all(m["state"] == "READY" for m in index(s, ready=True))
    assert "other" not in {m["name"] for m in index(s, ready=True)}

    r = post(s, "/v2/repository/models/nope/load")
    assert r.status_code == 500
    assert r.json() == {"error": "failed to load 'nope', failed to poll from model repository"}


def test_path_traversal_rejected(nereid_server, tmp_path):
    repo = make_repo(tmp_path)
    secret = tmp_path / "secret"
    secret.mkdir()
    shutil.copytree(os.path.join(repo, "plain"), str(secret / "escaped"))
    s = nereid_server(repo, "--model-control-mode=explicit")
    for name in ("..", "..%2Fsecret%2Fescaped", "%2E%2E", "a%2Fb"):
        r = post(s, f"/v2/repository/models/{name}/load")
        assert r.status_code in (400, 404), (name, r.status_code, r.text)
        r = post(s, f"/v2/repository/models/{name}/unload")
        assert r.status_code in (400, 404), (name, r.status_code, r.text)
    assert all(m["name"] != "escaped" for m in index(s))
    # A file override cannot escape the temporary model directory either.
    cfg = json.dumps({"backend": "testing", "max_batch_size": 8,
                      "input": [{"name": "INPUT0", "data_type": "TYPE_FP32", "dims": [2]}],
                      "output": [{"name": "OUTPUT0", "data_type": "TYPE_FP32", "dims": [2]}]})
    r = post(s, "/v2/repository/models/plain/load",
             {"parameters": {"config": cfg, "file:../../evil": base64.b64encode(b"x").decode()}})
    assert r.status_code == 400
    assert "invalid file path" in r.json()["error"]


def test_model_name_rules_of_triton(nereid_server, tmp_path):
    """Triton's ValidateModelName (core #481) on explicit loads, its texts
    over HTTP and gRPC: the name trimmed of whitespace must not be empty,
    '..' or hold a '/'; '...' and 'model..' are ordinary (missing) names."""
    import grpc
    from grpc_util import stubs
    pb, pbg, _, _ = stubs()
    s = nereid_server(make_repo(tmp_path), "--model-control-mode=explicit")
    empty = "Model name cannot be empty. Please enter a valid name to deploy."
    cases = [("", empty), (" \t ", empty), ("..", None), (" .. ", None), ("a/b", None),
             ("...", "failed to poll"), ("plain..", "failed to poll")]
    with grpc.insecure_channel(s.grpc_addr) as ch:
        stub = pbg.GRPCInferenceServiceStub(ch)
        for name, text in cases:
            if text is None:
                text = (f"invalid model name '{name}', model name must not contain path "
                        "traversal characters")
            r = post(s, "/v2/repository/models/"
                     + requests.utils.quote(name, safe="").replace(".", "%2E") + "/load")
            with_grpc = None
            try:
                stub.RepositoryModelLoad(pb.RepositoryModelLoadRequest(model_name=name),
                                         timeout=30)
            except grpc.RpcError as e:
                with_grpc = e
            if text == "failed to poll":
                assert r.status_code == 500 and "failed to poll" in r.json()["error"], name
                assert with_grpc is not None and "failed to poll" in with_grpc.details()
                continue
            assert with_grpc.code() == grpc.StatusCode.INVALID_ARGUMENT, name
            assert with_grpc.details() == text, name
            if name == "" or "/" in name:
                continue  # no such HTTP route: an empty segment, a '/' in the path
            assert (r.status_code, r.json()) == (400, {"error": text}), name


def test_reload_with_config_override(nereid_server, tmp_path):
    repo = make_repo(tmp_path)
    s = nereid_server(repo, "--model-control-mode=explicit", "--load-model=plain")
    cfg = {"backend": "testing", "max_batch_size": 8,
           "parameters": {"fail_execute": {"string_value": "true"}},
           "input": [{"name": "INPUT0", "data_type": "TYPE_FP32", "dims": [2]}],
           "output": [{"name": "OUTPUT0", "data_type": "TYPE_FP32", "dims": [2]}]}
    r = post(s, "/v2/repository/models/plain/load", {"parameters": {"config": json.dumps(cfg)}})
    assert r.status_code == 200, r.text
    assert "fail_execute" in requests.get(s.http_url + "/v2/models/plain/config").text
    r = infer(s, "plain")
    assert r.status_code == 500 and r.json()["error"] == "testing backend: execute failed"
    # A reload that fails keeps the old version serving and reports why.
    cfg["parameters"] = {"fail_model_init": {"string_value": "true"}}
    r = post(s, "/v2/repository/models/plain/load", {"parameters": {"config": json.dumps(cfg)}})
    assert r.status_code == 400
    assert r.json()["error"] == ("load failed for model 'plain': version 1 is at UNAVAILABLE "
                                 "state: Internal: testing backend: model init failed;")
    assert infer(s, "plain").status_code == 500  # still the fail_execute version
    m = row(s, "plain", "1")
    assert m["state"] == "READY" and "model init failed" in m["reason"]
    # Back to the repository's config: as in Triton, a load without a config
    # keeps the override until the model's files change after it
    # (L0_lifecycle test_model_config_overwite).
    time.sleep(0.05)
    os.utime(os.path.join(repo, "plain", "config.pbtxt"))
    assert post(s, "/v2/repository/models/plain/load").status_code == 200
    assert infer(s, "plain").status_code == 200
    assert "reason" not in row(s, "plain", "1")


def test_file_override(nereid_server, tmp_path):
    repo = make_repo(tmp_path)
    s = nereid_server(repo, "--model-control-mode=explicit")
    cfg = json.dumps({"backend": "testing", "max_batch_size": 8,
                      "input": [{"name": "INPUT0", "data_type": "TYPE_FP32", "dims": [2]}],
                      "output": [{"name": "OUTPUT0", "data_type": "TYPE_FP32", "dims": [2],
                                  "label_filename": "labels.txt"}]})
    files = {"file:labels.txt": base64.b64encode(b"cat\ndog\n").decode(),
             "file:7/weights.bin": base64.b64encode(b"\0\1").decode()}
    r = post(s, "/v2/repository/models/other/load", {"parameters": {"config": cfg, **files}})
    assert r.status_code == 200, r.text
    assert row(s, "other", "7")["state"] == "READY"
    body = {"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1, 2], "data": [1, 9]}],
            "outputs": [{"name": "OUTPUT0", "parameters": {"classification": 1}}]}
    r = requests.post(s.http_url + "/v2/models/other/infer", json=body, timeout=10)
    assert r.status_code == 200, r.text
    assert "dog" in r.json()["outputs"][0]["data"][0]


def test_file_override_without_config_fails_the_poll(nereid_server, tmp_path):
    # Triton (L0_lifecycle test_file_override, L0_backend_python bls
    # bls_model_loading): files without a config override are refused, the
    # served model stays as it was; even when the files alone would make a
    # model (the testing backend needs no file, ONNX models auto-complete).
    repo = make_repo(tmp_path)
    s = nereid_server(repo, "--model-control-mode=explicit", "--load-model=plain")
    files = {"file:2/weights.bin": base64.b64encode(b"\0").decode()}
    for name in ("plain", "other"):
        r = post(s, f"/v2/repository/models/{name}/load", {"parameters": files})
        assert r.status_code == 500
        assert r.json() == {"error": f"failed to load '{name}', failed to poll from model "
                                     "repository"}
    assert row(s, "plain", "1")["state"] == "READY"
    assert "plain" in {m["name"] for m in index(s, ready=True)}
    assert "other" not in {m["name"] for m in index(s, ready=True)}
    assert infer(s, "plain").status_code == 200
    assert "Load parameter 'config' must be specified for model file override" in s.output()


def test_config_override_naming_another_model_fails_the_poll(nereid_server, tmp_path):
    # L0_backend_python model_control: curl strips the braces of
    # /models/model{test}/load, the override's config still says model{test}
    repo = make_repo(tmp_path)
    s = nereid_server(repo, "--model-control-mode=explicit")
    cfg = json.dumps({"name": "model{test}", "backend": "testing", "max_batch_size": 8,
                      "input": [{"name": "INPUT0", "data_type": "TYPE_FP32", "dims": [2]}],
                      "output": [{"name": "OUTPUT0", "data_type": "TYPE_FP32", "dims": [2]}]})
    files = {"file:1/weights.bin": base64.b64encode(b"\0").decode()}
    r = post(s, "/v2/repository/models/modeltest/load", {"parameters": {"config": cfg, **files}})
    assert r.status_code == 400
    assert r.json()["error"] == (
        "failed to load 'modeltest', failed to poll from model repository: unexpected "
        "directory name 'modeltest' for model 'model{test}', directory name must equal model "
        "name")


def test_ensemble_load_and_unload_dependents(nereid_server, tmp_path):
    repo = make_repo(tmp_path)
    s = nereid_server(repo, "--model-control-mode=explicit")
    assert post(s, "/v2/repository/models/parallel/load").status_code == 200
    assert row(s, "slow_a", "1")["state"] == "READY"
    assert row(s, "slow_b", "1")["state"] == "READY"
    assert infer(s, "parallel", name="X").status_code == 200
    r = post(s, "/v2/repository/models/parallel/unload",
             {"parameters": {"unload_dependents": True}})
    assert r.status_code == 200
    for name in ("parallel", "slow_a", "slow_b"):
        assert row(s, name, "1")["state"] == "UNAVAILABLE", name


def test_ensemble_results_timing_errors_stats(nereid_server, tmp_path):
    repo = make_repo(tmp_path)
    s = nereid_server(repo)
    t0 = time.time()
    r = infer(s, "parallel", (1.5, -2.5), name="X")
    elapsed = time.time() - t0
    assert r.status_code == 200, r.text
    outs = {o["name"]: o["data"] for o in r.json()["outputs"]}
    assert outs == {"P": [1.5, -2.5], "Q": [1.5, -2.5]}
    # Two 300 ms branches run side by side (sequential would be >= 600 ms).
    assert 0.29 <= elapsed < 0.55, elapsed

    r = infer(s, "broken_step", name="X")
    assert r.status_code == 500
    assert r.json() == {"error": "in ensemble 'broken_step', testing backend: execute failed"}

    stats = requests.get(s.http_url + "/v2/models/parallel/stats").json()["model_stats"][0]
    assert stats["inference_count"] == 1 and stats["execution_count"] == 1
    assert stats["inference_stats"]["success"]["count"] == 1
    assert stats["inference_stats"]["compute_infer"]["ns"] >= 2 * 290_000_000  # both steps
    # slow_a ran for both ensembles, slow_b for 'parallel' only.
    for step, n in (("slow_a", 2), ("slow_b", 1)):
        st = requests.get(s.http_url + f"/v2/models/{step}/stats").json()["model_stats"][0]
        assert st["execution_count"] == n and st["inference_stats"]["success"]["count"] == n
    st = requests.get(s.http_url + "/v2/models/broken_step/stats").json()["model_stats"][0]
    # Triton counts a failed ensemble request twice (error response, then
    # the end of its request tracker).
    assert st["inference_stats"]["fail"]["count"] == 2


def test_example_ensemble(nereid_server):
    if not os.path.exists(os.path.join(EXAMPLES, "add_sub_onnx", "1", "model.onnx")):
        import pytest
        pytest.skip("make models has not generated add_sub_onnx")
    s = nereid_server(EXAMPLES)
    a = np.arange(16, dtype=np.float32)
    b = np.full(16, 0.5, dtype=np.float32)
    body = {"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1, 16],
                        "data": a.tolist()},
                       {"name": "INPUT1", "datatype": "FP32", "shape": [1, 16],
                        "data": b.tolist()}]}
    r = requests.post(s.http_url + "/v2/models/ensemble_add_sub/infer", json=body, timeout=10)
    assert r.status_code == 200, r.text
    outs = {o["name"]: o["data"] for o in r.json()["outputs"]}
    assert np.allclose(outs["OUTPUT0"], 3 * a) and np.allclose(outs["OUTPUT1"], 2 * b)


class Load:
    """Continuous inference from 4 threads; counts successes and failures."""

    def __init__(self, s, model):
        self.s, self.model = s, model
        self.ok = self.failed = 0
        self.errors = []
        self.stop = False
        self.lock = threading.Lock()
        self.threads = [threading.Thread(target=self.run) for _ in range(4)]
        for t in self.threads:
            t.start()

    def run(self):
        sess = requests.Session()
        body = {"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1, 2],
                            "data": [1, 2]}]}
        while not self.stop:
            r = sess.post(f"{self.s.http_url}/v2/models/{self.model}/infer", json=body,
                          timeout=30)
            with self.lock:
                if r.status_code == 200:
                    self.ok += 1
                else:
                    self.failed += 1
                    self.errors.append(r.text)

    def finish(self):
        self.stop = True
        for t in self.threads:
            t.join()


def test_reload_under_load_no_failures(nereid_server, tmp_path):
    repo = make_repo(tmp_path)
    s = nereid_server(repo, "--model-control-mode=explicit", "--load-model=slow")
    load = Load(s, "slow")
    try:
        for i in range(6):
            cfg = {"backend": "testing", "max_batch_size": 8,
                   "instance_group": [{"count": 2, "kind": "KIND_CPU"}],
                   "parameters": {"execute_delay_ms": {"string_value": str(3 + i % 2 * 4)}},
                   "input": [{"name": "INPUT0", "data_type": "TYPE_FP32", "dims": [2]}],
                   "output": [{"name": "OUTPUT0", "data_type": "TYPE_FP32", "dims": [2]}]}
            r = post(s, "/v2/repository/models/slow/load",
                     {"parameters": {"config": json.dumps(cfg)}})
            assert r.status_code == 200, r.text
            time.sleep(0.05)
            # The repository's version again (a plain reload).
            assert post(s, "/v2/repository/models/slow/load").status_code == 200
    finally:
        load.finish()
    assert load.ok > 20
    assert load.failed == 0, load.errors[:3]


def test_unload_under_load_in_flight_complete(nereid_server, tmp_path):
    repo = make_repo(tmp_path)
    write_model(repo, "slow", slow_config(300, 1))
    s = nereid_server(repo, "--model-control-mode=explicit", "--load-model=slow")
    results = []

    def one():
        results.append(infer(s, "slow").status_code)

    def accepted():
        # One request executing (300 ms each, one instance), the rest queued.
        pending = pending_requests(s, "slow") or 0
        return pending >= 5 or (pending >= 1 and len(results) + pending >= 5)

    threads = [threading.Thread(target=one) for _ in range(6)]
    for t in threads:
        t.start()
    assert wait_for(accepted)
    assert post(s, "/v2/repository/models/slow/unload").status_code == 200
    for t in threads:
        t.join()
    # Accepted requests finished on the unloading version; none failed.
    assert results.count(200) == 6, results
    assert infer(s, "slow").status_code in (404, 503)


def test_poll_mode(nereid_server, tmp_path):
    repo = make_repo(tmp_path)
    s = nereid_server(repo, "--model-control-mode=poll", "--repository-poll-secs=1")
    r = post(s, "/v2/repository/models/plain/load")
    assert r.status_code == 503
    assert r.json() == {"error": "explicit model load / unload is not allowed if polling is "
                                 "enabled"}
    # A new version directory is served after the next poll.
    os.makedirs(os.path.join(repo, "plain", "2"))
    assert wait_for(lambda: infer(s, "plain").json().get("model_version") == "2")
    # A broken config keeps version 2 serving and reports why.
    with open(os.path.join(repo, "plain", "config.pbtxt"), "w") as f:
        f.write("backend: \"testing\" max_batch_size: oops\n")
    assert wait_for(lambda: "reason" in (row(s, "plain", "2") or {}))
    m = row(s, "plain", "2")
    assert m["state"] == "READY" and m["reason"].startswith("Invalid argument")
    assert infer(s, "plain").status_code == 200
    # A config change.
    with open(os.path.join(repo, "plain", "config.pbtxt"), "w") as f:
        f.write(TESTING.replace('max_batch_size: 8', 'max_batch_size: 8 parameters { key: '
                                '"fail_execute" value { string_value: "true" } }'))
    assert wait_for(lambda: infer(s, "plain").status_code == 500)
    # Version removed: back to version 1.
    shutil.rmtree(os.path.join(repo, "plain", "2"))
    assert wait_for(lambda: infer(s, "plain").json().get("model_version") == "1"
                    if infer(s, "plain").status_code == 200 else
                    row(s, "plain", "1") is not None)
    # A model added, a model removed.
    write_model(repo, "added", TESTING)
    assert wait_for(lambda: infer(s, "added").status_code == 200)
    shutil.rmtree(os.path.join(repo, "other"))
    assert wait_for(lambda: infer(s, "other").status_code == 404)


def rss_bytes(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0


def test_unload_returns_memory(nereid_server, tmp_path):
    """An ONNX model holding a 64 MB weight: RSS grows on load and drops on unload."""
    import pytest
    if os.environ.get("NEREID_SANITIZE"):
        pytest.skip("ASan's quarantine keeps freed memory resident")
    onnx = pytest.importorskip("onnx")
    from onnx import TensorProto, helper, numpy_helper
    rows = 4 * 1024 * 1024  # 4M x 4 FP32 = 64 MB
    w = numpy_helper.from_array(np.random.default_rng(0).random((rows, 4), dtype=np.float32),
                                "W")
    graph = helper.make_graph(
        [helper.make_node("Gather", ["W", "I"], ["Y"], axis=0)], "big",
        [helper.make_tensor_value_info("I", TensorProto.INT64, [1])],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [1, 4])], [w])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 7
    repo = str(tmp_path / "models")
    os.makedirs(os.path.join(repo, "big", "1"))
    onnx.save(model, os.path.join(repo, "big", "1", "model.onnx"))
    with open(os.path.join(repo, "big", "config.pbtxt"), "w") as f:
        f.write('platform: "onnxruntime_onnx" max_batch_size: 0\n'
                'input [ { name: "I" data_type: TYPE_INT64 dims: [ 1 ] } ]\n'
                'output [ { name: "Y" data_type: TYPE_FP32 dims: [ 1, 4 ] } ]\n')
    s = nereid_server(repo, "--model-control-mode=explicit")
    pid = s.proc.pid
    base = rss_bytes(pid)
    r = post(s, "/v2/repository/models/big/load")
    if r.status_code != 200:
        pytest.skip(f"onnxruntime backend unavailable: {r.text}")
    body = {"inputs": [{"name": "I", "datatype": "INT64", "shape": [1], "data": [7]}]}
    r = requests.post(s.http_url + "/v2/models/big/infer", json=body, timeout=30)
    assert r.status_code == 200, r.text
    assert np.allclose(r.json()["outputs"][0]["data"], w_row(model, 7))
    loaded = rss_bytes(pid)
    assert post(s, "/v2/repository/models/big/unload").status_code == 200
    unloaded = rss_bytes(pid)
    print(f"RSS base {base >> 20} MB, loaded {loaded >> 20} MB, unloaded {unloaded >> 20} MB")
    assert loaded - base > 48 << 20
    assert loaded - unloaded > 48 << 20


def w_row(model, i):
    from onnx import numpy_helper
    return numpy_helper.to_array(model.graph.initializer[0])[i].tolist()


ONNX_ADD_SUB = os.path.join(EXAMPLES, "add_sub_onnx")


def versions_repo(tmp_path, policy):
    """Model m: add_sub_onnx in versions 1 and 2, version 3 without its file."""
    repo = tmp_path / "models"
    os.makedirs(repo / "m" / "3")
    for v in ("1", "2"):
        shutil.copytree(os.path.join(ONNX_ADD_SUB, "1"), repo / "m" / v)
    with open(os.path.join(ONNX_ADD_SUB, "config.pbtxt")) as f:
        text = f.read().replace('name: "add_sub_onnx"', 'name: "m"')
    (repo / "m" / "config.pbtxt").write_text(text + f"version_policy: {policy}\n")
    return repo


def test_one_version_failing_unloads_the_others(nereid_server, tmp_path):
    if not os.path.exists(os.path.join(ONNX_ADD_SUB, "1", "model.onnx")):
        import pytest
        pytest.skip("run `make models` first")
    # Triton (L0_lifecycle test_parse_error_modelfail): when one version of
    # a model fails to load, every version this load loaded is unloaded.
    repo = versions_repo(tmp_path, "{ all { } }")
    s = nereid_server(str(repo), "--exit-on-error=false", "--strict-readiness=false")
    rows = {r["version"]: r for r in index(s) if r["name"] == "m"}
    assert {v: r["state"] for v, r in rows.items()} == {
        "1": "UNAVAILABLE", "2": "UNAVAILABLE", "3": "UNAVAILABLE"}
    assert rows["1"]["reason"] == rows["2"]["reason"] == "unloaded"
    assert rows["3"]["reason"] != "unloaded"
    assert requests.get(f"{s.http_url}/v2/models/m/versions/1/ready", timeout=10).status_code \
        == 400
    s.stop()
    # A reload that fails leaves what was serving before in place.
    (repo / "m" / "config.pbtxt").write_text(
        (repo / "m" / "config.pbtxt").read_text().replace("{ all { } }",
                                                         "{ specific { versions: [ 1 ] } }"))
    s = nereid_server(str(repo), "--model-control-mode=explicit", "--load-model=m")
    assert requests.get(f"{s.http_url}/v2/models/m/versions/1/ready", timeout=10).status_code \
        == 200
    (repo / "m" / "config.pbtxt").write_text(
        (repo / "m" / "config.pbtxt").read_text().replace("{ specific { versions: [ 1 ] } }",
                                                         "{ all { } }"))
    r = post(s, "/v2/repository/models/m/load", None)
    assert r.status_code == 400 and "version 3 is at UNAVAILABLE state" in r.json()["error"]
    rows = {r["version"]: r for r in index(s) if r["name"] == "m"}
    assert rows["1"]["state"] == "READY"
    assert rows["2"] == {"name": "m", "version": "2", "state": "UNAVAILABLE",
                         "reason": "unloaded"}
    assert requests.get(f"{s.http_url}/v2/models/m/versions/1/ready", timeout=10).status_code \
        == 200


def test_backslash_is_an_ordinary_model_name_character(nereid_server, tmp_path):
    """Triton's ValidateModelName refuses only an empty name, '..' and '/':
    a model directory named 'a\\b' loads and serves; the Python backend
    refuses such a name itself (its stub-name check, L0_backend_python
    model_control), and no name reaches outside the repository."""
    repo = make_repo(tmp_path)
    write_model(repo, "a\\b", TESTING)
    s = nereid_server(repo, "--model-control-mode=explicit")
    r = post(s, "/v2/repository/models/a%5Cb/load")
    assert r.status_code == 200, r.text
    r = infer(s, "a%5Cb")
    assert r.status_code == 200, r.text
    assert r.json()["model_name"] == "a\\b"
    for name in ("..%5C..%5Cetc", "%5C.."):  # names of directories that do not exist
        r = post(s, f"/v2/repository/models/{name}/load")
        assert r.status_code == 500, (name, r.text)
        assert "failed to poll from model repository" in r.text
    py = json.dumps({"name": "m\\x", "backend": "python",
                     "input": [{"name": "INPUT0", "data_type": "TYPE_FP32", "dims": [-1]}],
                     "output": [{"name": "OUTPUT0", "data_type": "TYPE_FP32", "dims": [-1]}]})
    code = base64.b64encode(b"class TritonPythonModel:\n    pass\n").decode()
    r = post(s, "/v2/repository/models/m%5Cx/load",
             {"parameters": {"config": py, "file:/1/model.py": code}})
    assert r.status_code == 400, r.text
    assert "Invalid stub name: contains invalid characters" in r.json()["error"]
    # Triton checks the auto-complete stub's name (the model's) before it
    # reads model.py: a quote in the name is refused even when model.py is
    # not valid Python (L0_backend_python model_control embeds the name in it).
    py = json.dumps({"name": "m'x", "backend": "python",
                     "input": [{"name": "INPUT0", "data_type": "TYPE_FP32", "dims": [-1]}],
                     "output": [{"name": "OUTPUT0", "data_type": "TYPE_FP32", "dims": [-1]}]})
    code = base64.b64encode(b"print('m'x')\n").decode()
    r = post(s, "/v2/repository/models/m'x/load",
             {"parameters": {"config": py, "file:/1/model.py": code}})
    assert r.status_code == 400, r.text
    assert "Invalid stub name: contains invalid characters" in r.json()["error"]



PY_CONST = """import os
import numpy as np
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def execute(self, requests):
        return [pb_utils.InferenceResponse([pb_utils.Tensor(
            "OUTPUT0", np.array([[os.getpid(), %d]], np.float32))]) for r in requests]
"""
PY_CONFIG = f"""backend: "python" max_batch_size: 8
input [ {{ name: "INPUT0" {F2} }} ]
output [ {{ name: "OUTPUT0" {F2} }} ]
"""


def test_load_again_reloads_a_model_whose_files_changed(nereid_server, tmp_path):
    """As Triton's ModelTimestamp: a load of a served model whose config is
    unchanged keeps it (the same worker) unless a file of the version (or
    beside the config) changed; then that version is loaded again."""
    repo = str(tmp_path / "models")
    write_model(repo, "py", PY_CONFIG)
    model_py = os.path.join(repo, "py", "1", "model.py")
    with open(model_py, "w") as f:
        f.write(PY_CONST % 1)
    s = nereid_server(repo, "--model-control-mode=explicit", "--load-model=py")
    first = infer(s, "py").json()["outputs"][0]["data"]
    assert first[1] == 1
    # Unchanged: the same worker keeps serving.
    assert post(s, "/v2/repository/models/py/load").status_code == 200
    assert infer(s, "py").json()["outputs"][0]["data"] == first
    # model.py changed, the config not: the new code serves.
    with open(model_py, "w") as f:
        f.write(PY_CONST % 2)
    st = os.stat(model_py)
    os.utime(model_py, ns=(st.st_atime_ns, st.st_mtime_ns + 2_000_000_000))
    assert post(s, "/v2/repository/models/py/load").status_code == 200
    second = infer(s, "py").json()["outputs"][0]["data"]
    assert second[1] == 2 and second[0] != first[0]
