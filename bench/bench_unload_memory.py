#!/usr/bin/env python3
"""Memory after unload (issue 39): N distinct ONNX models (each with its own
weights) and M Python models are loaded, each answers one request, and all
are unloaded again, CYCLES times, over the real binary's repository API.
Prints the server's RSS, open fds and descendant processes before the first
load, with everything loaded, and after each unload.

    bench/bench_unload_memory.py [BUILD] [--onnx 100] [--python 10] [--cycles 3]

tests/integration/test_unload_memory.py runs the same cycles with a
generous bound; docs/performance.md has the figures."""
import argparse
import concurrent.futures
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time

import numpy as np
import requests

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "scripts"))
import make_models  # noqa: E402

MIB = 1 << 20
WEIGHTS = 64 * 1024  # FP32 values per ONNX model: 256 KiB of its own weights


def onnx_with_weights(seed):
    """OUTPUT0 = INPUT0 + W, W a [WEIGHTS] FP32 initializer of its own."""
    from onnx import helper, numpy_helper
    w = np.random.default_rng(seed).standard_normal(WEIGHTS).astype(np.float32)
    io = lambda n: helper.make_tensor_value_info(n, 1, [WEIGHTS])
    graph = helper.make_graph([helper.make_node("Add", ["INPUT0", "W"], ["OUTPUT0"])],
                              f"weights_{seed}", [io("INPUT0")], [io("OUTPUT0")],
                              initializer=[numpy_helper.from_array(w, "W")])
    return make_models._model(graph).SerializeToString()


def make_repository(root, n_onnx, n_python, examples):
    for i in range(n_onnx):
        name = f"w_{i:04d}"
        os.makedirs(os.path.join(root, name, "1"))
        with open(os.path.join(root, name, "1", "model.onnx"), "wb") as f:
            f.write(onnx_with_weights(i))
        with open(os.path.join(root, name, "config.pbtxt"), "w") as f:
            f.write(f'name: "{name}" backend: "onnxruntime" max_batch_size: 0\n'
                    f'input [ {{ name: "INPUT0" data_type: TYPE_FP32 dims: [ {WEIGHTS} ] }} ]\n'
                    f'output [ {{ name: "OUTPUT0" data_type: TYPE_FP32 dims: [ {WEIGHTS} ] }} ]\n'
                    'instance_group [ { count: 1 kind: KIND_CPU } ]\n')
    src = os.path.join(examples, "add_sub_python")
    for i in range(n_python):
        name = f"py_{i:02d}"
        shutil.copytree(src, os.path.join(root, name))
        cfg = os.path.join(root, name, "config.pbtxt")
        with open(cfg) as f:
            text = f.read().replace('name: "add_sub_python"', f'name: "{name}"')
        with open(cfg, "w") as f:
            f.write(text)
    return ([f"w_{i:04d}" for i in range(n_onnx)], [f"py_{i:02d}" for i in range(n_python)])


def rss(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0


def fds(pid):
    return len(os.listdir(f"/proc/{pid}/fd"))


def descendants(pid):
    """Processes below pid (the Python zygote and workers)."""
    children = {}
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        children.setdefault(ppid, []).append(int(d))
    out, todo = [], [pid]
    while todo:
        for c in children.get(todo.pop(), []):
            out.append(c)
            todo.append(c)
    return len(out)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start(nereid, repo, log):
    port = free_port()
    proc = subprocess.Popen(
        [nereid, f"--model-repository={repo}", "--model-control-mode=explicit",
         f"--http-port={port}", "--http-address=127.0.0.1", "--allow-grpc=false",
         "--allow-metrics=false"], stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    deadline = time.time() + 60
    while True:
        try:
            if requests.get(f"{url}/v2/health/live", timeout=2).status_code == 200:
                return proc, url
        except requests.ConnectionError:
            pass
        if proc.poll() is not None or time.time() > deadline:
            raise RuntimeError("nereid did not start")
        time.sleep(0.05)


def infer(url, name):
    if name.startswith("w_"):
        body = {"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [WEIGHTS],
                            "parameters": {"binary_data_size": 4 * WEIGHTS}}]}
        import json
        head = json.dumps(body).encode()
        data = head + np.ones(WEIGHTS, np.float32).tobytes()
        r = requests.post(f"{url}/v2/models/{name}/infer", data=data, timeout=120,
                          headers={"Inference-Header-Content-Length": str(len(head))})
    else:
        body = {"inputs": [{"name": n, "datatype": "FP32", "shape": [4], "data": [1, 2, 3, 4]}
                           for n in ("INPUT0", "INPUT1")]}
        r = requests.post(f"{url}/v2/models/{name}/infer", json=body, timeout=120)
    assert r.status_code == 200, (name, r.text)


def load_all(url, names):
    def one(name):
        r = requests.post(f"{url}/v2/repository/models/{name}/load", timeout=300)
        assert r.status_code == 200, (name, r.text)
        infer(url, name)
    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        list(pool.map(one, names))


def unload_all(url, names):
    def one(name):
        r = requests.post(f"{url}/v2/repository/models/{name}/unload", timeout=300)
        assert r.status_code == 200, (name, r.text)
    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        list(pool.map(one, names))
    deadline = time.time() + 120
    while True:  # unloads finish in the background: wait for the index
        index = requests.post(f"{url}/v2/repository/index", timeout=60).json()
        if all(m.get("state") != "READY" for m in index if m["name"] in names):
            break
        assert time.time() < deadline, "unloads did not finish"
        time.sleep(0.1)


def settle(pid, target, procs, limit=10.0):
    """The process after an unload, once freed memory went back (the server
    trims its heap 1 s after the last request) and the workers ended: waits
    up to limit s for RSS <= target and procs descendants."""
    deadline = time.time() + limit
    while time.time() < deadline and (rss(pid) > target or descendants(pid) > procs):
        time.sleep(0.2)
    return rss(pid), fds(pid), descendants(pid)


def run(build, n_onnx, n_python, cycles, slack=16 * MIB, report=print):
    """Returns [(label, rss, fds, procs)]: before, then loaded/unloaded per cycle."""
    nereid = os.path.join(build, "nereid")
    examples = os.path.join(ROOT, "examples", "models")
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        repo = os.path.join(tmp, "models")
        onnx, python = make_repository(repo, n_onnx, n_python, examples)
        names = onnx + python
        with open(os.path.join(tmp, "server.log"), "w+") as log:
            proc, url = start(nereid, repo, log)
            try:
                pid = proc.pid
                time.sleep(1.5)
                rows.append(("before", rss(pid), fds(pid), descendants(pid)))
                report(*rows[-1])
                for c in range(1, cycles + 1):
                    load_all(url, names)
                    rows.append((f"cycle {c} loaded", rss(pid), fds(pid), descendants(pid)))
                    report(*rows[-1])
                    unload_all(url, names)
                    first = rows[2][1] if c > 1 else rows[0][1]
                    rows.append((f"cycle {c} unloaded", *settle(pid, first + slack, rows[0][3])))
                    report(*rows[-1])
            finally:
                proc.terminate()
                proc.wait(60)
    return rows


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("build", nargs="?", default=os.path.join(ROOT, "build"))
    ap.add_argument("--onnx", type=int, default=100)
    ap.add_argument("--python", type=int, default=10)
    ap.add_argument("--cycles", type=int, default=3)
    a = ap.parse_args()
    print(f"{a.onnx} ONNX models ({WEIGHTS * 4 // 1024} KiB of weights each), "
          f"{a.python} Python models, {a.cycles} cycles")
    print(f"{'':20} {'RSS MiB':>8} {'fds':>5} {'procs':>5}")
    rows = run(a.build, a.onnx, a.python, a.cycles,
               report=lambda label, r, f, p: print(f"{label:20} {r / MIB:8.1f} {f:5} {p:5}",
                                                    flush=True))
    base = rows[0][1]
    after = [r for r in rows if r[0].endswith("unloaded")]
    print("after each unload, RSS - before: " +
          ", ".join(f"{(r[1] - base) / MIB:+.1f} MiB" for r in after))
    print("after each unload, RSS - after the first unload: " +
          ", ".join(f"{(r[1] - after[0][1]) / MIB:+.1f} MiB" for r in after))


if __name__ == "__main__":
    main()
