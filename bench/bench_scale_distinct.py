#!/usr/bin/python3
"""Start-up with N *distinct* small ONNX models (issue 42): N MLPs 16->64->4
(MatMul, Add, Relu, MatMul, Add; FP32, max_batch_size 8, one CPU instance
each) whose weights are random and different per model, so no two files are
alike and ONNX Runtime's identical-file sharing does not apply. For each
nereid binary given, each N and each round it starts the binary on the
repository (all models loaded at start-up) and measures the time from exec
to /v2/health/ready answering 200 (polled every 2 ms), the server's CPU
time until then, its RSS and thread count at ready, and that one request to
the last model answers; with --serve-all also the RSS after one request to
every model (what the models' first runs add). With --no-config the models
have no config.pbtxt: the server autocompletes them (two instances each,
dynamic batching). The binaries take turns within a round (the order
alternates between rounds) so both sides see the same machine load;
medians over rounds are printed at the end (and the best time to ready:
on a machine others use, the wall time varies with their load far more
than the CPU time does).

    bench/bench_scale_distinct.py [-n 100 1000] [-r 5] [--hidden 64] [--no-config]
                                  [--serve-all] [--keep DIR] [BINARY ...] [-- nereid flags]

BINARY defaults to this tree's build/nereid; each binary runs with the
backends directory next to it (<build>/backends). Run with Debian's
/usr/bin/python3 (python3-onnx, numpy). docs/performance.md has figures."""
import argparse
import http.client
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "scripts"))
import make_models  # noqa: E402

CONFIG = ('name: "{name}"\nplatform: "onnxruntime_onnx"\nmax_batch_size: 8\n'
          'input [ {{ name: "INPUT0" data_type: TYPE_FP32 dims: [ 16 ] }} ]\n'
          'output [ {{ name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 4 ] }} ]\n'
          'instance_group [ {{ count: 1 kind: KIND_CPU }} ]\n')


def mlp(seed, hidden):
    """OUTPUT0 = Relu(INPUT0 @ W1 + B1) @ W2 + B2 with weights of its own."""
    from onnx import helper, numpy_helper
    rng = np.random.default_rng(seed)
    w = lambda *shape: rng.standard_normal(shape).astype(np.float32)
    inits = [numpy_helper.from_array(w(16, hidden), "W1"), numpy_helper.from_array(w(hidden), "B1"),
             numpy_helper.from_array(w(hidden, 4), "W2"), numpy_helper.from_array(w(4), "B2")]
    nodes = [helper.make_node("MatMul", ["INPUT0", "W1"], ["h0"]),
             helper.make_node("Add", ["h0", "B1"], ["h1"]),
             helper.make_node("Relu", ["h1"], ["h2"]),
             helper.make_node("MatMul", ["h2", "W2"], ["o0"]),
             helper.make_node("Add", ["o0", "B2"], ["OUTPUT0"])]
    graph = helper.make_graph(nodes, f"mlp_{seed}",
                              [helper.make_tensor_value_info("INPUT0", 1, [None, 16])],
                              [helper.make_tensor_value_info("OUTPUT0", 1, [None, 4])],
                              initializer=inits)
    return make_models._model(graph).SerializeToString()


def make_repository(root, n, hidden, config=True):
    """Writes mlp_0000 ... under root (without config.pbtxt files when config
    is false: the server autocompletes them); returns the total bytes of
    model files."""
    total = 0
    for i in range(n):
        name = f"mlp_{i:04d}"
        os.makedirs(os.path.join(root, name, "1"))
        data = mlp(i, hidden)
        total += len(data)
        with open(os.path.join(root, name, "1", "model.onnx"), "wb") as f:
            f.write(data)
        if config:
            with open(os.path.join(root, name, "config.pbtxt"), "w") as f:
                f.write(CONFIG.format(name=name))
    return total


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def get(port, path, body=None):
    """Status of one request on a new connection, 0 when it cannot connect."""
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        c.request("POST" if body else "GET", path, body=body,
                  headers={"Content-Type": "application/json"} if body else {})
        r = c.getresponse()
        r.read()
        return r.status
    except OSError:
        return 0
    finally:
        c.close()


def proc_status(pid):
    rss = threads = 0
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                rss = int(line.split()[1]) / 1024
            elif line.startswith("Threads:"):
                threads = int(line.split()[1])
    return rss, threads


def cpu_seconds(pid):
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


REQUEST = ('{"inputs":[{"name":"INPUT0","datatype":"FP32","shape":[1,16],'
           '"data":[0,1,2,3,4,5,6,7,8,9,10,11,12,13,14,15]}]}')


def one_run(binary, repo, n, extra, serve_all=False):
    port = free_port()
    build = os.path.dirname(os.path.abspath(binary))
    argv = [binary, f"--model-repository={repo}", f"--backend-directory={build}/backends",
            f"--http-port={port}", f"--grpc-port={free_port()}", "--allow-metrics=false",
            "--log-info=false"] + extra
    t0 = time.monotonic()
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        while get(port, "/v2/health/ready") != 200:
            if proc.poll() is not None or time.monotonic() - t0 > 300:
                raise RuntimeError(f"{binary} did not become ready with {n} models")
            time.sleep(0.002)
        ready = time.monotonic() - t0
        cpu = cpu_seconds(proc.pid)
        rss, threads = proc_status(proc.pid)
        ok = get(port, f"/v2/models/mlp_{n - 1:04d}/infer", REQUEST) == 200
        served = None
        if serve_all:  # one request to every model, on one connection
            c = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
            for i in range(n):
                c.request("POST", f"/v2/models/mlp_{i:04d}/infer", body=REQUEST,
                          headers={"Content-Type": "application/json"})
                r = c.getresponse()
                r.read()
                ok = ok and r.status == 200
            c.close()
            served = proc_status(proc.pid)[0]
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    return ready, cpu, rss, threads, served, ok


def main():
    argv = sys.argv[1:]
    extra = []
    if "--" in argv:
        extra = argv[argv.index("--") + 1:]
        argv = argv[:argv.index("--")]
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("binaries", nargs="*", default=[os.path.join(ROOT, "build", "nereid")])
    ap.add_argument("-n", type=int, nargs="+", default=[100, 1000])
    ap.add_argument("-r", "--rounds", type=int, default=5)
    ap.add_argument("--hidden", type=int, default=64)
    ap.add_argument("--no-config", action="store_true",
                    help="no config.pbtxt: the server autocompletes each model's config")
    ap.add_argument("--serve-all", action="store_true",
                    help="after ready, one request to every model, then the RSS again")
    ap.add_argument("--keep", help="write the repositories under this directory and keep them")
    args = ap.parse_args(argv)
    base = args.keep or tempfile.mkdtemp(prefix="nereid-bench-distinct-")
    results = {}
    try:
        repos = {}
        for n in args.n:
            repos[n] = os.path.join(base, f"n{n}{'-auto' if args.no_config else ''}")
            if not os.path.isdir(repos[n]):
                size = make_repository(repos[n], n, args.hidden, not args.no_config)
                print(f"# {n} models, {size / n / 1024:.1f} KiB each, in {repos[n]}", flush=True)
        print(f"# load average before: {os.getloadavg()[0]:.2f} {os.getloadavg()[1]:.2f}")
        print(f"{'binary':40} {'N':>5} {'round':>5} {'ready s':>8} {'cpu s':>7} "
              f"{'RSS MiB':>8} {'threads':>7}{' served MiB' if args.serve_all else ''}",
              flush=True)
        for r in range(args.rounds):
            order = args.binaries if r % 2 == 0 else args.binaries[::-1]
            for n in args.n:
                for b in order:
                    ready, cpu, rss, threads, served, ok = one_run(b, repos[n], n, extra,
                                                                   args.serve_all)
                    results.setdefault((b, n), []).append((ready, cpu, rss, threads, served or 0))
                    print(f"{b:40} {n:5} {r:5} {ready:8.3f} {cpu:7.2f} {rss:8.1f} {threads:7}"
                          f"{f' {served:8.1f}' if served else ''}"
                          f"{'' if ok else '  (a request failed)'}", flush=True)
        print(f"# load average after: {os.getloadavg()[0]:.2f} {os.getloadavg()[1]:.2f}")
        print(f"\nmedians over {args.rounds} rounds:")
        print(f"{'binary':40} {'N':>5} {'ready s':>8} {'best s':>7} {'cpu s':>7} {'RSS MiB':>8} "
              f"{'threads':>7} {'ms/model':>9} {'KiB/model':>9}"
              f"{' served MiB' if args.serve_all else ''}")
        for n in args.n:
            for b in args.binaries:
                rows = results[(b, n)]
                med = [statistics.median(col) for col in zip(*rows)]
                best = min(row[0] for row in rows)
                print(f"{b:40} {n:5} {med[0]:8.3f} {best:7.3f} {med[1]:7.2f} {med[2]:8.1f} "
                      f"{med[3]:7.0f} "
                      f"{med[0] * 1e3 / n:9.2f} {med[2] * 1024 / n:9.1f}"
                      f"{f' {med[4]:10.1f}' if args.serve_all else ''}")
    finally:
        if not args.keep:
            shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    main()
