"""Many models on one server (issue 27) through the real binary: fifty ONNX
models load and serve with a bounded number of threads (ONNX Runtime's
shared thread pools; one instance thread per model), a model that sets
intra_op_thread_count still gets a pool of its own, and the memory a burst
of large JSON requests took goes back to the system once the server is idle.
Timing and idle CPU are measured by bench/bench_scale, not asserted here."""
import concurrent.futures
import json
import os
import shutil
import subprocess
import sys
import time

import numpy as np
import pytest
import requests

from conftest import EXAMPLES, NEREID, ROOT

sys.path.insert(0, os.path.join(ROOT, "scripts"))
import make_models  # noqa: E402

MIB = 1 << 20


def proc_status(pid):
    out = {}
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            key, _, value = line.partition(":")
            out[key] = value.split()
    return int(out["Threads"][0]), int(out["VmRSS"][0]) * 1024


def add_sub_request():
    a = np.arange(16, dtype=np.float32)
    b = np.full(16, 2, dtype=np.float32)
    body = {"inputs": [
        {"name": "INPUT0", "datatype": "FP32", "shape": [1, 16], "data": a.tolist()},
        {"name": "INPUT1", "datatype": "FP32", "shape": [1, 16], "data": b.tolist()}]}
    return body, (a + b).tolist(), (a - b).tolist()


def check_add_sub(server, name):
    body, plus, minus = add_sub_request()
    r = requests.post(f"{server.http_url}/v2/models/{name}/infer", json=body, timeout=30)
    assert r.status_code == 200, r.text
    outs = {o["name"]: o["data"] for o in r.json()["outputs"]}
    assert outs == {"OUTPUT0": plus, "OUTPUT1": minus}


def test_fifty_models_serve_with_bounded_threads(nereid_server, tmp_path):
    n = 50
    repo = str(tmp_path / "models")
    make_models.make_many(repo, n)
    s = nereid_server(repo)
    index = requests.post(f"{s.http_url}/v2/repository/index", json={}, timeout=30).json()
    assert len(index) == n
    assert all(m["state"] == "READY" for m in index), index
    for name in ("add_sub_0000", "add_sub_0025", f"add_sub_{n - 1:04d}"):
        check_add_sub(s, name)
    threads, _ = proc_status(s.proc.pid)
    # One execution thread per instance; everything else (frontends, ONNX
    # Runtime's shared pools, helpers) does not grow with the model count.
    bound = n + 4 * os.cpu_count() + 32
    assert threads <= bound, f"{threads} threads for {n} models (bound {bound})"


def test_intra_op_thread_count_gets_its_own_pool(nereid_server, tmp_path):
    """Triton's onnxruntime backend gives a model that sets a thread count
    pools of its own: 8 models with intra_op_thread_count 3 start 16 pool
    threads (the caller is the third) that 8 sharing models do not. (A few
    of the server's other threads come and go: a margin of 4.)"""
    n = 8
    shared, own = str(tmp_path / "shared"), str(tmp_path / "own")
    make_models.make_many(shared, n)
    make_models.make_many(own, n, make_models._params(intra_op_thread_count="3"))
    counts = []
    for repo in (shared, own):
        s = nereid_server(repo)
        check_add_sub(s, "add_sub_0000")
        counts.append(proc_status(s.proc.pid)[0])
    assert counts[1] - counts[0] >= 2 * n - 4, counts


def test_memory_returns_after_a_burst(nereid_server, tmp_path):
    """32 requests of 1M FP32 values as JSON, 8 at a time: RSS grows by
    ~100+ MiB during the burst and must come back near the idle size."""
    if os.environ.get("NEREID_SANITIZE"):
        pytest.skip("ASan's allocator keeps freed memory in its quarantine")
    repo = tmp_path / "models"
    os.makedirs(repo)
    shutil.copytree(os.path.join(EXAMPLES, "identity_fp32"), repo / "identity_fp32")
    s = nereid_server(str(repo))
    n_values = 1 << 20
    data = ((np.arange(n_values) % 1024) / 8).astype(np.float32)
    body = json.dumps({"inputs": [{"name": "INPUT0", "datatype": "FP32",
                                   "shape": [1, n_values], "data": data.tolist()}]}).encode()
    url = f"{s.http_url}/v2/models/identity_fp32/infer"
    requests.post(url, data=body, timeout=60).raise_for_status()  # warm: one request's worth
    time.sleep(1.5)
    _, before = proc_status(s.proc.pid)

    def one(_):
        r = requests.post(url, data=body, timeout=120)
        assert r.status_code == 200, r.text[:200]
        return len(r.content)

    peak = before
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        for size in pool.map(one, range(32)):
            assert size > n_values
            peak = max(peak, proc_status(s.proc.pid)[1])
    bound = before + 64 * MIB
    deadline = time.time() + 10
    rss = proc_status(s.proc.pid)[1]
    while rss > bound and time.time() < deadline:
        time.sleep(0.25)
        rss = proc_status(s.proc.pid)[1]
    assert rss <= bound, (f"RSS {rss / MIB:.0f} MiB 10 s after the burst "
                          f"(before {before / MIB:.0f}, peak {peak / MIB:.0f})")


# ---- Load on demand and eviction under a memory budget ----

def write_testing_model(repo, name, **params):
    """A testing-backend model (copies INPUT0 to OUTPUT0); params become
    config parameters (model_init_delay_ms, fail_model_init, ...)."""
    os.makedirs(os.path.join(repo, name, "1"), exist_ok=True)
    with open(os.path.join(repo, name, "config.pbtxt"), "w") as f:
        f.write('backend: "testing" max_batch_size: 0\n'
                'instance_group [ { count: 1 kind: KIND_CPU } ]\n'
                'input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ -1 ] } ]\n'
                'output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ -1 ] } ]\n'
                + make_models._params(**params))


def infer(s, name, parameters=None):
    body = {"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [2], "data": [1, 2]}]}
    if parameters:
        body["parameters"] = parameters
    return requests.post(f"{s.http_url}/v2/models/{name}/infer", json=body, timeout=60)


def states(s):
    index = requests.post(f"{s.http_url}/v2/repository/index", json={}, timeout=30).json()
    return {m["name"]: m.get("state") for m in index}


def metric(s, name):
    for line in requests.get(f"{s.metrics_url}/metrics", timeout=10).text.splitlines():
        if line.startswith(name + " ") or line.startswith(name + "{"):
            return float(line.split()[-1])
    return None


ON_DEMAND = ("--model-control-mode=explicit", "--model-load-on-demand=true")


def test_on_demand_loads_and_evicts_least_recently_used(nereid_server, tmp_path):
    repo = str(tmp_path / "models")
    for name in ("a", "b", "c", "p"):
        write_testing_model(repo, name)
    # A budget smaller than any model keeps only the model just used (and p).
    s = nereid_server(repo, *ON_DEMAND, "--model-memory-budget=1", "--load-model=p")
    st = states(s)
    assert st["p"] == "READY" and st["a"] != "READY", st

    assert infer(s, "a").status_code == 200
    assert infer(s, "b").status_code == 200
    st = states(s)
    assert (st["a"], st["b"], st["p"]) == ("UNAVAILABLE", "READY", "READY"), st

    # b is in use (its request waits for a file): loading a must keep it.
    go, started = tmp_path / "go", tmp_path / "started"
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        slow = pool.submit(infer, s, "b", {"wait_for_file": str(go),
                                           "started_file": str(started)})
        deadline = time.time() + 30
        while not started.exists():
            assert time.time() < deadline, "b's request did not start"
            time.sleep(0.01)
        assert infer(s, "a").status_code == 200
        st = states(s)
        assert (st["a"], st["b"]) == ("READY", "READY"), st
        go.touch()
        assert slow.result().status_code == 200

    # c's load evicts both, least recently used (b) first; p is pinned.
    log_before = len(s.output())
    assert infer(s, "c").status_code == 200
    st = states(s)
    assert (st["a"], st["b"], st["c"], st["p"]) == ("UNAVAILABLE", "UNAVAILABLE", "READY",
                                                     "READY"), st
    log = s.output()[log_before:]
    assert log.index("unloading 'b'") < log.index("unloading 'a'"), log
    assert metric(s, "nereid_model_on_demand_loads_total") == 4
    assert metric(s, "nereid_model_on_demand_evictions_total") == 3
    assert metric(s, "nereid_model_on_demand_load_failures_total") == 0
    assert metric(s, 'nereid_model_memory_bytes{model="c"}') >= 1
    assert metric(s, 'nereid_model_memory_bytes{model="a"}') is None


def test_concurrent_first_requests_wait_for_one_load(nereid_server, tmp_path):
    repo = str(tmp_path / "models")
    write_testing_model(repo, "slowload", model_init_delay_ms="300")
    s = nereid_server(repo, *ON_DEMAND)
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        codes = list(pool.map(lambda _: infer(s, "slowload").status_code, range(8)))
    assert codes == [200] * 8
    assert metric(s, "nereid_model_on_demand_loads_total") == 1
    assert s.output().count("loading 'slowload' on demand") == 1
    assert metric(s, "nereid_model_on_demand_load_duration_us_total") >= 300000


def test_failed_on_demand_load_answers_and_next_request_retries(nereid_server, tmp_path):
    repo = str(tmp_path / "models")
    write_testing_model(repo, "broken", fail_model_init="true")
    s = nereid_server(repo, *ON_DEMAND)
    r = infer(s, "broken")
    assert r.status_code != 200
    assert "model init failed" in r.json()["error"], r.text
    assert metric(s, "nereid_model_on_demand_load_failures_total") == 1
    write_testing_model(repo, "broken")  # fixed on disk
    assert infer(s, "broken").status_code == 200
    assert metric(s, "nereid_model_on_demand_loads_total") == 1
    assert infer(s, "missing").status_code == 404


def test_on_demand_flags_are_checked(tmp_path):
    repo = str(tmp_path / "models")
    write_testing_model(repo, "a")
    for args, text in [
            (["--model-load-on-demand=true"], "requires --model-control-mode=explicit"),
            (["--model-control-mode=explicit", "--model-memory-budget=100"],
             "--model-memory-budget requires --model-load-on-demand=true")]:
        r = subprocess.run([NEREID, f"--model-repository={repo}", "--http-port=0",
                            "--grpc-port=0", "--allow-metrics=false", *args],
                           capture_output=True, text=True, timeout=60)
        assert r.returncode != 0 and text in r.stderr + r.stdout, (args, r.stderr)


def test_on_demand_ensemble_holds_its_steps(nereid_server, model_repo):
    for name in ("ensemble_add_sub", "add_sub", "add_sub_onnx", "identity_fp32"):
        model_repo.add(name)
    s = nereid_server(model_repo.path, *ON_DEMAND, "--model-memory-budget=1")
    a = np.arange(16, dtype=np.float32)
    b = np.ones(16, dtype=np.float32)
    body = {"inputs": [
        {"name": "INPUT0", "datatype": "FP32", "shape": [1, 16], "data": a.tolist()},
        {"name": "INPUT1", "datatype": "FP32", "shape": [1, 16], "data": b.tolist()}]}
    r = requests.post(f"{s.http_url}/v2/models/ensemble_add_sub/infer", json=body, timeout=60)
    assert r.status_code == 200, r.text
    outs = {o["name"]: o["data"] for o in r.json()["outputs"]}
    assert outs["OUTPUT0"] == (3 * a).tolist()
    # The steps stay while the ensemble is loaded, whatever the budget.
    assert all(v == "READY" for v in states(s).values()), states(s)
