#!/usr/bin/env python3
"""Loads never stall traffic (issue 39): a small model (identity_fp32) is
served at concurrency 4 over HTTP keep-alive while 20 larger distinct ONNX
models (20 MiB of weights each) are loaded and unloaded in a loop, first
over HTTP's repository API, then over gRPC's. Prints the small model's
latency percentiles in each phase beside the quiet phase's, as ratios.

    bench/bench_load_stall.py [BUILD] [--seconds 8] [--models 20] [--mib 20]

Run it on a quiet machine (touch /tmp/perf-quiet first, remove it after):
the figures are latencies. docs/performance.md has them."""
import argparse
import json
import multiprocessing as mp
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time

import numpy as np
import requests

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "scripts"))
sys.path.insert(0, os.path.join(ROOT, "tests", "integration"))
import make_models  # noqa: E402


def big_model(seed, n_floats):
    from onnx import helper, numpy_helper
    w = np.random.default_rng(seed).standard_normal(n_floats).astype(np.float32)
    io = lambda n: helper.make_tensor_value_info(n, 1, [n_floats])
    graph = helper.make_graph([helper.make_node("Add", ["INPUT0", "W"], ["OUTPUT0"])],
                              f"big_{seed}", [io("INPUT0")], [io("OUTPUT0")],
                              initializer=[numpy_helper.from_array(w, "W")])
    return make_models._model(graph).SerializeToString()


def make_repository(root, n, mib):
    shutil.copytree(os.path.join(ROOT, "examples", "models", "identity_fp32"),
                    os.path.join(root, "identity_fp32"))
    n_floats = mib * (1 << 20) // 4
    names = []
    for i in range(n):
        name = f"big_{i:02d}"
        os.makedirs(os.path.join(root, name, "1"))
        with open(os.path.join(root, name, "1", "model.onnx"), "wb") as f:
            f.write(big_model(i, n_floats))
        with open(os.path.join(root, name, "config.pbtxt"), "w") as f:
            f.write(f'name: "{name}" backend: "onnxruntime" max_batch_size: 0\n'
                    f'input [ {{ name: "INPUT0" data_type: TYPE_FP32 dims: [ {n_floats} ] }} ]\n'
                    f'output [ {{ name: "OUTPUT0" data_type: TYPE_FP32 dims: [ {n_floats} ] }} ]\n'
                    'instance_group [ { count: 1 kind: KIND_CPU } ]\n')
        names.append(name)
    return names


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def client(url, stop, out):
    """One keep-alive connection sending identity_fp32 requests until stop;
    puts its latencies (s) with their start times on out."""
    body = json.dumps({"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1, 4],
                                   "data": [1, 2, 3, 4]}]})
    s = requests.Session()
    rows = []
    while not stop.is_set():
        t0 = time.perf_counter()
        r = s.post(f"{url}/v2/models/identity_fp32/infer", data=body, timeout=60)
        rows.append((t0, time.perf_counter() - t0))
        if r.status_code != 200:
            rows.append((t0, float("nan")))
    out.put(rows)


def measure(url, seconds, background=None):
    stop, out = mp.Event(), mp.Queue()
    procs = [mp.Process(target=client, args=(url, stop, out)) for _ in range(4)]
    for p in procs:
        p.start()
    time.sleep(0.5)  # connections up
    bg_stop = threading.Event()
    bg = threading.Thread(target=background, args=(bg_stop,)) if background else None
    if bg:
        bg.start()
    t_start = time.perf_counter()
    time.sleep(seconds)
    t_end = time.perf_counter()
    if bg:
        bg_stop.set()
        bg.join()
    stop.set()
    lat = []
    for _ in procs:
        lat += [d for t, d in out.get() if t_start <= t <= t_end]
    for p in procs:
        p.join()
    lat = np.array(lat) * 1e6
    if np.isnan(lat).any():
        raise SystemExit("a request failed")
    return lat


def http_cycle(url, names, counter):
    def run(stop):
        while not stop.is_set():
            for n in names:
                if stop.is_set():
                    return
                for op in ("load", "unload"):
                    r = requests.post(f"{url}/v2/repository/models/{n}/{op}", timeout=300)
                    assert r.status_code == 200, r.text
                counter[0] += 1
    return run


def grpc_cycle(addr, names, counter):
    import grpc
    from grpc_util import stubs
    pb, pbg, _, _ = stubs()

    def run(stop):
        stub = pbg.GRPCInferenceServiceStub(grpc.insecure_channel(addr))
        while not stop.is_set():
            for n in names:
                if stop.is_set():
                    return
                stub.RepositoryModelLoad(pb.RepositoryModelLoadRequest(model_name=n))
                stub.RepositoryModelUnload(pb.RepositoryModelUnloadRequest(model_name=n))
                counter[0] += 1
    return run


def row(label, lat, quiet):
    p50, p99 = np.percentile(lat, 50), np.percentile(lat, 99)
    ratio = "" if quiet is None else f"  p99 ×{p99 / np.percentile(quiet, 99):.2f}"
    return (f"{label:28} n={len(lat):6}  p50 {p50:7.0f} µs  p99 {p99:7.0f} µs  "
            f"max {lat.max():8.0f} µs{ratio}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("build", nargs="?", default=os.path.join(ROOT, "build"))
    ap.add_argument("--seconds", type=float, default=8)
    ap.add_argument("--models", type=int, default=20)
    ap.add_argument("--mib", type=int, default=20)
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        repo = os.path.join(tmp, "models")
        names = make_repository(repo, a.models, a.mib)
        hp, gp = free_port(), free_port()
        log = open(os.path.join(tmp, "server.log"), "w+")
        proc = subprocess.Popen(
            [os.path.join(a.build, "nereid"), f"--model-repository={repo}",
             "--model-control-mode=explicit", "--load-model=identity_fp32",
             f"--http-port={hp}", f"--grpc-port={gp}", "--http-address=127.0.0.1",
             "--grpc-address=127.0.0.1", "--allow-metrics=false"],
            stdout=log, stderr=subprocess.STDOUT)
        url, addr = f"http://127.0.0.1:{hp}", f"127.0.0.1:{gp}"
        try:
            deadline = time.time() + 60
            while True:
                try:
                    if requests.get(f"{url}/v2/health/ready", timeout=2).status_code == 200:
                        break
                except requests.ConnectionError:
                    pass
                assert time.time() < deadline and proc.poll() is None, "no server"
                time.sleep(0.05)
            print(f"identity_fp32 at c=4 over HTTP; {a.models} models of {a.mib} MiB "
                  f"loaded and unloaded in a loop; {a.seconds:.0f} s a phase")
            quiet = measure(url, a.seconds)
            print(row("quiet", quiet, None), flush=True)
            for label, make in (("loads over HTTP", lambda c: http_cycle(url, names, c)),
                                ("loads over gRPC", lambda c: grpc_cycle(addr, names, c))):
                count = [0]
                lat = measure(url, a.seconds, make(count))
                print(row(label, lat, quiet) + f"  ({count[0]} load+unload)", flush=True)
            again = measure(url, a.seconds)
            print(row("quiet again", again, quiet), flush=True)
        finally:
            proc.terminate()
            proc.wait(60)
            log.close()


if __name__ == "__main__":
    main()
