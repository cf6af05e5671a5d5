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


def assert_rss_returns(s, before, peak):
    """RSS comes back within 64 MiB of before in 10 s (generous: a bound,
    not a timing)."""
    bound = before + 64 * MIB
    deadline = time.time() + 10
    rss = proc_status(s.proc.pid)[1]
    while rss > bound and time.time() < deadline:
        time.sleep(0.25)
        rss = proc_status(s.proc.pid)[1]
    assert rss <= bound, (f"RSS {rss / MIB:.0f} MiB 10 s after the burst "
                          f"(before {before / MIB:.0f}, peak {peak / MIB:.0f})")


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
    assert_rss_returns(s, before, peak)


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


def test_budget_counts_pinned_models(nereid_server, tmp_path):
    """Models pinned with --load-model are loaded, so the budget counts them:
    under a budget each pinned model's start-up load is measured (RSS growth,
    one load at a time) like an on-demand load, and on-demand models are
    unloaded to fit beside them. A pinned model holding 24 MiB under a 16 MiB
    budget leaves room for only the model used last; a 64 MiB budget keeps
    them all."""
    repo = str(tmp_path / "models")
    write_testing_model(repo, "p", model_init_resident_bytes=str(24 * MIB))
    write_testing_model(repo, "a")
    write_testing_model(repo, "b")
    s = nereid_server(repo, *ON_DEMAND, f"--model-memory-budget={16 * MIB}", "--load-model=p")
    pinned = metric(s, 'nereid_model_memory_bytes{model="p"}')
    assert pinned is not None and pinned >= 24 * MIB, pinned
    log = s.output()
    assert "loaded pinned 'p'" in log, log
    assert "pinned models (--load-model, load API) use" in log, log
    assert infer(s, "a").status_code == 200
    assert infer(s, "b").status_code == 200
    st = states(s)
    assert (st["p"], st["a"], st["b"]) == ("READY", "UNAVAILABLE", "READY"), st
    assert metric(s, "nereid_model_on_demand_evictions_total") == 1
    assert "unloading 'a'" in s.output()
    s.stop()

    s = nereid_server(repo, *ON_DEMAND, f"--model-memory-budget={64 * MIB}", "--load-model=p")
    assert "pinned models (--load-model, load API) use" not in s.output()
    assert infer(s, "a").status_code == 200
    assert infer(s, "b").status_code == 200
    assert all(v == "READY" for v in states(s).values()), states(s)
    assert metric(s, "nereid_model_on_demand_evictions_total") == 0


def test_budget_counts_explicitly_loaded_models(nereid_server, tmp_path):
    """A model loaded over the load API under a budget is pinned like a
    --load-model one: its load is measured (alone), it counts in the
    budget, on-demand models are unloaded to make room for it, it is never
    evicted itself, and when the pinned models alone exceed the budget a
    warning says so and the metrics show it. Unloaded explicitly, it is no
    longer pinned."""
    repo = str(tmp_path / "models")
    write_testing_model(repo, "p", model_init_resident_bytes=str(24 * MIB))
    write_testing_model(repo, "q", model_init_resident_bytes=str(32 * MIB))
    write_testing_model(repo, "c", model_init_resident_bytes=str(28 * MIB))
    write_testing_model(repo, "a")
    write_testing_model(repo, "b")
    s = nereid_server(repo, *ON_DEMAND, f"--model-memory-budget={48 * MIB}")
    assert infer(s, "a").status_code == 200
    assert infer(s, "c").status_code == 200
    st = states(s)
    assert (st["a"], st["c"]) == ("READY", "READY"), st

    def load(name):
        r = requests.post(f"{s.http_url}/v2/repository/models/{name}/load", timeout=60)
        assert r.status_code == 200, r.text

    log_before = len(s.output())
    load("p")
    charged = metric(s, 'nereid_model_memory_bytes{model="p"}')
    assert charged is not None and charged >= 24 * MIB, charged
    log = s.output()[log_before:]
    assert "loaded pinned 'p'" in log, log
    # a (least recently used) and c go to make room for p
    assert log.index("unloading 'a'") < log.index("unloading 'c'"), log
    st = states(s)
    assert (st["p"], st["a"], st["c"]) == ("READY", "UNAVAILABLE", "UNAVAILABLE"), st
    assert metric(s, "nereid_model_memory_budget_bytes") == 48 * MIB
    assert metric(s, "nereid_model_memory_pinned_bytes") == charged
    if not os.environ.get("NEREID_SANITIZE"):  # ASan's quarantine keeps a and c resident,
        # and what an eviction leaves resident is charged on to p
        assert "pinned models (--load-model, load API) use" not in s.output()

    # on-demand loads never evict p
    assert infer(s, "c").status_code == 200
    assert infer(s, "b").status_code == 200
    st = states(s)
    assert (st["p"], st["b"], st["c"]) == ("READY", "READY", "UNAVAILABLE"), st

    # a second pinned model: the pinned ones alone exceed the budget
    load("q")
    assert "pinned models (--load-model, load API) use" in s.output()
    assert metric(s, "nereid_model_memory_pinned_bytes") > 48 * MIB
    assert infer(s, "a").status_code == 200
    st = states(s)
    assert (st["p"], st["q"], st["a"], st["b"]) == ("READY", "READY", "READY", "UNAVAILABLE"), st
    # loading a loaded model again keeps its charge (which evictions may
    # have moved: what an unload left resident is charged on)
    charged = metric(s, 'nereid_model_memory_bytes{model="p"}')
    load("p")
    assert metric(s, 'nereid_model_memory_bytes{model="p"}') == charged
    assert states(s)["a"] == "READY"

    r = requests.post(f"{s.http_url}/v2/repository/models/q/unload", timeout=60)
    assert r.status_code == 200, r.text
    assert metric(s, "nereid_model_memory_pinned_bytes") == charged


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


# ---- Start-up: shared sessions, lazy instance threads, backend config ----

def add_sub_variant(doc):
    """add_sub's graph with a different doc_string: other bytes, same results."""
    m = make_models.add_sub((-1, 16))
    m.doc_string = doc
    return m.SerializeToString()


def sub_add_bytes():
    """OUTPUT0 = INPUT0 - INPUT1, OUTPUT1 = INPUT0 + INPUT1: add_sub's I/O, other results."""
    from onnx import helper
    io = lambda n: helper.make_tensor_value_info(n, 1, [None, 16])
    graph = helper.make_graph(
        [helper.make_node("Sub", ["INPUT0", "INPUT1"], ["OUTPUT0"]),
         helper.make_node("Add", ["INPUT0", "INPUT1"], ["OUTPUT1"])],
        "sub_add", [io("INPUT0"), io("INPUT1")], [io("OUTPUT0"), io("OUTPUT1")])
    return make_models._model(graph).SerializeToString()


def model_file(repo, name):
    return os.path.join(repo, name, "1", "model.onnx")


def test_identical_models_share_sessions_and_others_do_not(nereid_server, tmp_path):
    """200 copies of one model cost one session: RSS grows far less than
    with 200 models whose bytes differ. Models whose bytes differ in their
    graph answer with their own graph (no wrong sharing), and a model whose
    file changes gets a session of the new bytes when it is reloaded."""
    n = 200
    same, distinct = str(tmp_path / "same"), str(tmp_path / "distinct")
    make_models.make_many(same, n)
    make_models.make_many(distinct, n)
    for i in range(n):
        with open(model_file(distinct, f"add_sub_{i:04d}"), "wb") as f:
            f.write(add_sub_variant(f"tenant {i}"))
    rss = []
    for repo in (same, distinct):
        s = nereid_server(repo)
        check_add_sub(s, "add_sub_0000")
        check_add_sub(s, f"add_sub_{n - 1:04d}")
        rss.append(proc_status(s.proc.pid)[1])
        s.stop()
    # A session of add_sub costs ~100 KiB here; 199 of them must be saved.
    assert rss[1] - rss[0] >= 199 * 25 * 1024, [r / MIB for r in rss]

    # Same I/O, other graph: each model runs its own.
    repo = str(tmp_path / "mixed")
    make_models.make_many(repo, 3)
    with open(model_file(repo, "add_sub_0001"), "wb") as f:
        f.write(sub_add_bytes())
    s = nereid_server(repo, "--model-control-mode=explicit", "--load-model=*")
    check_add_sub(s, "add_sub_0000")
    check_add_sub(s, "add_sub_0002")
    body, plus, minus = add_sub_request()
    r = requests.post(f"{s.http_url}/v2/models/add_sub_0001/infer", json=body, timeout=30)
    outs = {o["name"]: o["data"] for o in r.json()["outputs"]}
    assert outs == {"OUTPUT0": minus, "OUTPUT1": plus}
    # add_sub_0000's file changes to sub_add: the reload serves the new bytes,
    # and add_sub_0002 (still add_sub) keeps its results.
    with open(model_file(repo, "add_sub_0000"), "wb") as f:
        f.write(sub_add_bytes())
    # (A load with a config reloads whatever changed on disk.)
    cfg = requests.get(f"{s.http_url}/v2/models/add_sub_0000/config", timeout=30).text
    r = requests.post(f"{s.http_url}/v2/repository/models/add_sub_0000/load",
                      json={"parameters": {"config": cfg}}, timeout=60)
    assert r.status_code == 200, r.text
    r = requests.post(f"{s.http_url}/v2/models/add_sub_0000/infer", json=body, timeout=30)
    outs = {o["name"]: o["data"] for o in r.json()["outputs"]}
    assert outs == {"OUTPUT0": minus, "OUTPUT1": plus}
    check_add_sub(s, "add_sub_0002")


def test_onnx_runtime_telemetry_is_off(nereid_server, model_repo, tmp_path, monkeypatch):
    """ONNX Runtime's release builds keep a usage-telemetry store under
    ~/.cache/Microsoft/DeveloperTools (written and fsynced at every start,
    for uploads to Microsoft) unless ORT_DISABLE_TELEMETRY is set: the
    server sets it, so serving an ONNX model leaves the home directory
    untouched. ORT_DISABLE_TELEMETRY=0 from the user turns it back on.

    Whether ORT writes the store at all depends on the machine (CI's did
    not, with telemetry on): the user's setting is tried first, and where
    it leaves nothing there is nothing the default could have written."""
    monkeypatch.delenv("XDG_CACHE_HOME", raising=False)
    model_repo.add("add_sub_onnx")

    def serve_once(home, telemetry):
        home.mkdir()
        monkeypatch.setenv("HOME", str(home))
        if telemetry is None:
            monkeypatch.delenv("ORT_DISABLE_TELEMETRY", raising=False)
        else:
            monkeypatch.setenv("ORT_DISABLE_TELEMETRY", telemetry)
        s = nereid_server(model_repo.path)
        check_add_sub(s, "add_sub_onnx")
        assert s.stop() == 0
        return sorted(p.name for p in home.iterdir())

    if not (serve_once(tmp_path / "home_on", "0") and (tmp_path / "home_on" / ".cache" / "Microsoft").exists()):
        pytest.skip("this machine's ONNX Runtime writes no telemetry store even when asked to")
    assert serve_once(tmp_path / "home_default", None) == []


def test_instance_threads_start_with_the_first_request(nereid_server, tmp_path):
    """A loaded one-instance model has no thread until its first request:
    100 loaded models cost no thread each; each model served adds one."""
    n = 100
    repo = str(tmp_path / "models")
    make_models.make_many(repo, n)
    s = nereid_server(repo, "--model-control-mode=explicit", "--load-model=*")
    threads, _ = proc_status(s.proc.pid)
    assert threads <= 4 * os.cpu_count() + 32, threads
    for i in range(5):
        check_add_sub(s, f"add_sub_{i:04d}")
    after, _ = proc_status(s.proc.pid)
    assert after >= threads + 5 - 4, (threads, after)
    assert after <= threads + 5 + 4, (threads, after)
    # Unloading a model whose thread never started, and one whose did.
    for name in ("add_sub_0050", "add_sub_0000"):
        r = requests.post(f"{s.http_url}/v2/repository/models/{name}/unload", json={}, timeout=60)
        assert r.status_code == 200, r.text
    st = states(s)
    assert (st["add_sub_0050"], st["add_sub_0000"], st["add_sub_0001"]) == (
        "UNAVAILABLE", "UNAVAILABLE", "READY"), st
    check_add_sub(s, "add_sub_0001")


def test_onnxruntime_backend_config(nereid_server, tmp_path):
    """--backend-config=onnxruntime,...: intra_op_thread_count sizes the
    shared pool (ONNX Runtime's own choice, one thread per physical core,
    can be one thread on a small machine: no pool thread at all),
    enable-global-threadpool=0 gives each session pools of its own
    (Triton's default), share-sessions=0 gives each model sessions of its
    own; a bad value fails the loads with Triton's text."""
    n = 8
    repo = str(tmp_path / "models")
    make_models.make_many(repo, n)
    counts = []
    for extra in ("intra_op_thread_count=1", "intra_op_thread_count=6",
                  "enable-global-threadpool=0", "share-sessions=0"):
        s = nereid_server(repo, f"--backend-config=onnxruntime,{extra}")
        for i in range(n):
            check_add_sub(s, f"add_sub_{i:04d}")
        counts.append(proc_status(s.proc.pid)[0])
        s.stop()
    # The pool of 6 runs 5 threads besides the caller.
    assert counts[1] - counts[0] >= 5 - 2, counts

    r = subprocess.run([NEREID, f"--model-repository={repo}", "--http-port=0", "--grpc-port=0",
                        "--allow-metrics=false",
                        "--backend-config=onnxruntime,enable-global-threadpool=maybe"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode != 0
    assert "failed to convert 'maybe' to boolean value" in r.stderr + r.stdout, r.stderr


def test_memory_returns_after_a_grpc_burst(nereid_server, tmp_path):
    """The trimmer the HTTP frontend uses serves gRPC too: a gRPC-only
    server's RSS comes back after a burst of large raw tensors."""
    if os.environ.get("NEREID_SANITIZE"):
        pytest.skip("ASan's allocator keeps freed memory in its quarantine")
    import grpc
    from grpc_util import stubs
    pb, pb_grpc, _, _ = stubs()
    repo = tmp_path / "models"
    os.makedirs(repo)
    shutil.copytree(os.path.join(EXAMPLES, "identity_fp32"), repo / "identity_fp32")
    s = nereid_server(str(repo), "--allow-http=false", "--allow-metrics=false", wait_port="grpc")
    n_values = 4 << 20
    raw = np.arange(n_values, dtype=np.float32).tobytes()

    def request():
        req = pb.ModelInferRequest(model_name="identity_fp32")
        t = req.inputs.add()
        t.name, t.datatype = "INPUT0", "FP32"
        t.shape.extend([1, n_values])
        req.raw_input_contents.append(raw)
        return req

    opts = [("grpc.max_send_message_length", 1 << 30),
            ("grpc.max_receive_message_length", 1 << 30)]
    with grpc.insecure_channel(s.grpc_addr, options=opts) as channel:
        stub = pb_grpc.GRPCInferenceServiceStub(channel)
        stub.ModelInfer(request(), timeout=120)
        time.sleep(1.5)
        _, before = proc_status(s.proc.pid)
        peak = before

        def one(_):
            r = stub.ModelInfer(request(), timeout=120)
            assert len(r.raw_output_contents[0]) == 4 * n_values
            return proc_status(s.proc.pid)[1]

        with concurrent.futures.ThreadPoolExecutor(8) as pool:
            for rss in pool.map(one, range(32)):
                peak = max(peak, rss)
    assert_rss_returns(s, before, peak)


def test_on_demand_in_poll_mode(nereid_server, tmp_path):
    """Poll mode with on-demand loads: nothing loads at start or when the
    poll finds a new model; a request loads it; the budget evicts."""
    repo = str(tmp_path / "models")
    for name in ("a", "b"):
        write_testing_model(repo, name)
    s = nereid_server(repo, "--model-control-mode=poll", "--repository-poll-secs=1",
                      "--model-load-on-demand=true", "--model-memory-budget=1")
    st = states(s)
    assert "a" in st and "b" in st and "READY" not in st.values(), st
    assert infer(s, "a").status_code == 200
    assert states(s)["a"] == "READY"
    write_testing_model(repo, "c")
    deadline = time.time() + 30
    while "c" not in states(s):
        assert time.time() < deadline, "the poll did not list c"
        time.sleep(0.2)
    assert states(s)["c"] != "READY"
    assert infer(s, "c").status_code == 200
    st = states(s)
    assert (st["a"], st["c"]) == ("UNAVAILABLE", "READY"), st
    assert metric(s, "nereid_model_on_demand_loads_total") == 2


def test_on_demand_load_does_not_block_other_clients(nereid_server, tmp_path):
    """One HTTP thread: while it has handed a request to an on-demand load
    that has not finished, other clients' requests are served."""
    repo = str(tmp_path / "models")
    go = tmp_path / "go"
    write_testing_model(repo, "slow", model_init_wait_for_file=str(go))
    write_testing_model(repo, "fast")
    s = nereid_server(repo, *ON_DEMAND, "--load-model=fast", "--http-thread-count=1")
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        slow = pool.submit(infer, s, "slow")
        deadline = time.time() + 30
        while "loading 'slow' on demand" not in s.output():
            assert time.time() < deadline, "slow's load did not start"
            time.sleep(0.01)
        for _ in range(5):
            assert infer(s, "fast").status_code == 200
            assert not slow.done(), slow.result().text
        go.touch()
        assert slow.result().status_code == 200
    assert states(s)["slow"] == "READY"


def write_multi_instance_model(repo, name, count):
    os.makedirs(os.path.join(repo, name, "1"), exist_ok=True)
    with open(os.path.join(repo, name, "config.pbtxt"), "w") as f:
        f.write('backend: "testing" max_batch_size: 0\n'
                f'instance_group [ {{ count: {count} kind: KIND_CPU }} ]\n'
                'input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ -1 ] } ]\n'
                'output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ -1 ] } ]\n')


def test_multi_instance_threads_start_with_the_first_request(nereid_server, tmp_path):
    """A loaded model with several instances has no thread until its first
    request, which starts all of them: 20 idle three-instance models cost no
    thread, a served one runs three requests at once, each model served adds
    its three threads, and models unload whether their threads ran or not."""
    n, count = 20, 3
    repo = str(tmp_path / "models")
    for i in range(n):
        write_multi_instance_model(repo, f"m{i:02d}", count)
    s = nereid_server(repo)
    threads0, _ = proc_status(s.proc.pid)
    assert threads0 <= 4 * os.cpu_count() + 32, threads0  # not n * count more

    go = tmp_path / "go"
    started = [tmp_path / f"started{k}" for k in range(count)]
    with concurrent.futures.ThreadPoolExecutor(count) as pool:
        futures = [pool.submit(infer, s, "m00", {"wait_for_file": str(go),
                                                 "started_file": str(started[k])})
                   for k in range(count)]
        deadline = time.time() + 30
        while not all(p.exists() for p in started):  # all instances run at once
            assert time.time() < deadline, [p.exists() for p in started]
            time.sleep(0.01)
        go.touch()
        assert [f.result().status_code for f in futures] == [200] * count
    threads1, _ = proc_status(s.proc.pid)
    for name in ("m01", "m02"):
        r = infer(s, name)
        assert r.status_code == 200, r.text
        assert r.json()["outputs"][0]["data"] == [1, 2]
    threads2, _ = proc_status(s.proc.pid)
    assert 2 * count - 2 <= threads2 - threads1 <= 2 * count + 2, (threads0, threads1, threads2)

    s.stop()
    s = nereid_server(repo, "--model-control-mode=explicit", "--load-model=*")
    assert infer(s, "m05").status_code == 200
    for name in ("m05", "m06"):  # served, never served
        r = requests.post(f"{s.http_url}/v2/repository/models/{name}/unload", json={}, timeout=60)
        assert r.status_code == 200, r.text
    st = states(s)
    assert (st["m05"], st["m06"], st["m07"]) == ("UNAVAILABLE", "UNAVAILABLE", "READY"), st
    assert infer(s, "m07").status_code == 200


def test_multi_instance_model_whose_instances_fail_to_initialize(nereid_server, tmp_path):
    repo = str(tmp_path / "models")
    write_multi_instance_model(repo, "ok", 2)
    write_multi_instance_model(repo, "bad", 3)
    with open(os.path.join(repo, "bad", "config.pbtxt"), "a") as f:
        f.write(make_models._params(fail_instance_init="true"))
    s = nereid_server(repo, "--model-control-mode=explicit", "--load-model=ok")
    r = requests.post(f"{s.http_url}/v2/repository/models/bad/load", json={}, timeout=60)
    assert r.status_code == 400, r.text
    assert "instance init failed" in r.json()["error"]
    assert infer(s, "ok").status_code == 200


def test_budget_follows_memory_that_shared_sessions_keep(nereid_server, tmp_path):
    """Identical ONNX models share one session, and the first on-demand load
    also brings ONNX Runtime in (tens of MB): evicting the model whose load
    paid for them frees almost nothing while another model still uses them,
    so their bytes are charged on to that model instead of vanishing from
    the budget. With a budget below the runtime's size, the server keeps one
    model loaded however many are used (each load evicts the previous one),
    and what the loaded models are charged covers the RSS the process
    gained (a generous half, for the frontends' own buffers)."""
    n = 6
    repo = str(tmp_path / "models")
    make_models.make_many(repo, n)
    s = nereid_server(repo, *ON_DEMAND, "--model-memory-budget=4000000")
    _, rss0 = proc_status(s.proc.pid)
    names = [f"add_sub_{i:04d}" for i in range(n)]
    for name in names:
        check_add_sub(s, name)
    st = states(s)
    assert [k for k in names if st[k] == "READY"] == [names[-1]], st
    assert metric(s, "nereid_model_on_demand_evictions_total") == n - 1
    charged = sum(metric(s, f'nereid_model_memory_bytes{{model="{k}"}}') or 0 for k in names)
    _, rss1 = proc_status(s.proc.pid)
    assert charged >= (rss1 - rss0) / 2, (charged / MIB, (rss1 - rss0) / MIB)
    assert "still holds" in s.output()
    # A budget that holds the runtime keeps every identical model loaded.
    s.stop()
    s = nereid_server(repo, *ON_DEMAND, "--model-memory-budget=1000000000")
    for name in names:
        check_add_sub(s, name)
    st = states(s)
    assert all(st[k] == "READY" for k in names), st


def test_memory_gauge_without_a_budget(nereid_server, tmp_path):
    """Without --model-memory-budget, with --metrics-config=model_memory=true,
    a load that no other load overlapped sets its model's
    nereid_model_memory_bytes to the RSS it added; an unloaded model has
    none. Without the setting (Triton's output) the family is not there."""
    repo = str(tmp_path / "models")
    write_testing_model(repo, "big", model_init_resident_bytes=str(24 * MIB))
    write_testing_model(repo, "small")
    s = nereid_server(repo, "--model-control-mode=explicit", "--load-model=small")
    assert "nereid_model_memory_bytes" not in requests.get(f"{s.metrics_url}/metrics",
                                                           timeout=10).text
    s.stop()
    s = nereid_server(repo, "--model-control-mode=explicit", "--metrics-config=model_memory=true")
    for name in ("big", "small"):
        r = requests.post(f"{s.http_url}/v2/repository/models/{name}/load", json={}, timeout=60)
        assert r.status_code == 200, r.text
    big = metric(s, 'nereid_model_memory_bytes{model="big"}')
    small = metric(s, 'nereid_model_memory_bytes{model="small"}')
    assert big is not None and big >= 24 * MIB, big
    assert small is not None and 1 <= small < 24 * MIB, small
    r = requests.post(f"{s.http_url}/v2/repository/models/big/unload", json={}, timeout=60)
    assert r.status_code == 200, r.text
    deadline = time.time() + 30
    while metric(s, 'nereid_model_memory_bytes{model="big"}') is not None:
        assert time.time() < deadline, "big's gauge stayed after its unload"
        time.sleep(0.05)
    s.stop()
