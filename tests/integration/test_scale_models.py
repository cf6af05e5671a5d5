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
import sys
import time

import numpy as np
import requests

from conftest import EXAMPLES, ROOT

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
    pools of its own: 8 models with intra_op_thread_count 2 start 8 pool
    threads (the caller is the second) that 8 sharing models do not."""
    n = 8
    shared, own = str(tmp_path / "shared"), str(tmp_path / "own")
    make_models.make_many(shared, n)
    make_models.make_many(own, n, make_models._params(intra_op_thread_count="2"))
    counts = []
    for repo in (shared, own):
        s = nereid_server(repo)
        check_add_sub(s, "add_sub_0000")
        counts.append(proc_status(s.proc.pid)[0])
    assert counts[1] - counts[0] >= n, counts


def test_memory_returns_after_a_burst(nereid_server, tmp_path):
    """32 requests of 1M FP32 values as JSON, 8 at a time: RSS grows by
    ~100+ MiB during the burst and must come back near the idle size."""
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
