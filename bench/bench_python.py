#!/usr/bin/python3
"""Python backend against its C and ensemble counterparts, in one run.

    bench/bench_python.py [BUILD_DIR] [--rounds N] [--only latency,parallel,bls,startup]

Writes scratch repositories, starts BUILD_DIR/nereid (default build) on free
ports and prints, for each of issue 24's performance goals, both sides and
their ratio or difference:

  latency   identity_py (a model.py returning its input) vs the C identity
            backend, FP32[1] and FP32[65536], HTTP binary tensors, 1
            connection (nereid-perf): p50 latency and the CPU time the server
            and its workers spend per request (from /proc: steadier than the
            latency on a shared machine). Rounds alternate the two models.
  parallel  a CPU-bound numpy model.py with 1 and with 2 instances, 2
            connections: throughput ratio.
  bls       a model.py that returns an ONNX identity's answer through BLS vs
            an ensemble of identity_py and the same ONNX identity: p50
            difference (what BLS costs per call over an ensemble step).
  startup   20 model.py models x 2 instances: wall time to "ready" and the
            CPU time spent, with the zygote and without it
            (--backend-config=python,zygote=false).

The machine's load moves the latencies; each figure is the median over the
rounds.
"""
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "scripts"))

IDENTITY_PY = '''
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def execute(self, requests):
        return [pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", r.inputs()[0].as_numpy())])
                for r in requests]
'''

BLS_PY = '''
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def execute(self, requests):
        out = []
        for r in requests:
            res = pb_utils.InferenceRequest(model_name="ident_onnx", inputs=r.inputs(),
                                            requested_output_names=["OUTPUT0"]).exec()
            if res.has_error():
                raise pb_utils.TritonModelException(res.error().message())
            out.append(pb_utils.InferenceResponse(res.output_tensors()))
        return out
'''

CPU_PY = '''
import numpy as np
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def initialize(self, args):
        self.m = np.random.default_rng(0).random((64, 64))

    def execute(self, requests):
        out = []
        for r in requests:
            x = r.inputs()[0].as_numpy()
            acc = 0.0
            for _ in range(400):  # pure numpy work, holding no lock the server sees
                acc += float((self.m @ self.m)[0, 0])
            out.append(pb_utils.InferenceResponse(
                [pb_utils.Tensor("OUTPUT0", (x + acc * 0).astype(np.float32))]))
        return out
'''


def config(name, backend, count=1, extra=""):
    head = f'platform: "{backend}"\n' if backend == "onnxruntime_onnx" else f'backend: "{backend}"\n'
    return (f'name: "{name}"\n{head}max_batch_size: 0\n'
            'input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ -1 ] } ]\n'
            'output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ -1 ] } ]\n'
            f'instance_group [ {{ count: {count} kind: KIND_CPU }} ]\n' + extra)


ENSEMBLE = '''name: "ens_py_onnx"
platform: "ensemble"
max_batch_size: 0
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ -1 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ -1 ] } ]
ensemble_scheduling { step [
  { model_name: "identity_py" model_version: -1
    input_map { key: "INPUT0" value: "INPUT0" } output_map { key: "OUTPUT0" value: "mid" } },
  { model_name: "ident_onnx" model_version: -1
    input_map { key: "INPUT0" value: "mid" } output_map { key: "OUTPUT0" value: "OUTPUT0" } }
] }
'''


def write_model(repo, name, cfg, model_py=None, onnx=None):
    os.makedirs(os.path.join(repo, name, "1"), exist_ok=True)
    with open(os.path.join(repo, name, "config.pbtxt"), "w") as f:
        f.write(cfg)
    if model_py is not None:
        with open(os.path.join(repo, name, "1", "model.py"), "w") as f:
            f.write(model_py)
    if onnx is not None:
        with open(os.path.join(repo, name, "1", "model.onnx"), "wb") as f:
            f.write(onnx)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def tree_cpu_s(root):
    """CPU seconds (user + system) of root and all its descendants."""
    return tree_stat(root)[0]


def tree_stat(root):
    """CPU seconds of root and its descendants, and the minor page faults of
    its descendants (the workers and the zygote) with their count."""
    tck = os.sysconf("SC_CLK_TCK")
    kids, stats, faults = {}, {}, {}
    for p in os.listdir("/proc"):
        if not p.isdigit():
            continue
        try:
            with open(f"/proc/{p}/stat") as f:
                st = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        kids.setdefault(int(st[1]), []).append(int(p))
        stats[int(p)] = (int(st[11]) + int(st[12])) / tck
        faults[int(p)] = int(st[7])
    total, minflt, n, todo = 0.0, 0, 0, [root]
    while todo:
        p = todo.pop()
        total += stats.get(p, 0.0)
        if p != root:
            minflt += faults.get(p, 0)
            n += 1
        todo.extend(kids.get(p, []))
    return total, minflt, n


class Server:
    def __init__(self, build, repo, args=()):
        self.build = build
        self.port = free_port()
        self.log = open(os.path.join(repo, "..", f"server-{self.port}.log"), "w+")
        self.t0 = time.monotonic()
        self.proc = subprocess.Popen(
            [os.path.join(build, "nereid"), f"--model-repository={repo}",
             f"--http-port={self.port}", f"--grpc-port={free_port()}",
             f"--metrics-port={free_port()}", *args], stdout=self.log, stderr=subprocess.STDOUT)
        deadline = time.time() + 120
        while "nereid ready" not in open(self.log.name).read():
            if time.time() > deadline or self.proc.poll() is not None:
                raise SystemExit("server did not start:\n" + open(self.log.name).read())
            time.sleep(0.005)
        self.ready_s = time.monotonic() - self.t0

    def count(self, model):
        with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/v2/models/{model}/stats") as r:
            st = json.load(r)["model_stats"]
        return sum(s["inference_stats"]["success"]["count"] for s in st)

    def perf(self, model, n, concurrency=1, window_ms=1500):
        """(p50 us, throughput/s, server+workers CPU us per request)."""
        c0, cpu0 = self.count(model), tree_cpu_s(self.proc.pid)
        out = subprocess.run(
            [os.path.join(self.build, "nereid-perf"), "-m", model, "-u", f"127.0.0.1:{self.port}",
             "--shape", f"INPUT0:{n}", "-p", str(window_ms), "--concurrency-range",
             str(concurrency), "--input-tensor-format", "binary", "--output-tensor-format",
             "binary"], capture_output=True, text=True)
        cpu = tree_cpu_s(self.proc.pid) - cpu0
        reqs = self.count(model) - c0
        if out.returncode:  # failed requests: say so, with the server's view
            with open(self.log.name) as f:
                why = [l for l in f if "restarted" in l or l.startswith(("E", "W"))]
            print(f"warning: nereid-perf on {model}: {out.stderr.strip()}\n  server: "
                  f"{''.join(why[-5:]).strip() or 'nothing logged'}", flush=True)
        p50 = thr = None
        for line in out.stdout.splitlines():
            if "p50" in line:
                p50 = float(line.split("p50")[1].split(",")[0])
            if "Throughput:" in line:
                thr = float(line.split("Throughput:")[1].split()[0])
        return p50, thr, cpu * 1e6 / max(reqs, 1)

    def stop(self):
        self.proc.terminate()
        self.proc.wait()
        self.log.close()


def med(xs):
    return statistics.median(xs)


def compare(s, a, b, n, rounds):
    """Alternating rounds of models a and b with FP32[n]: the median p50 and
    CPU per request of each, and every round's p50."""
    res = {a: [], b: []}
    for _ in range(rounds):
        for m in res:
            res[m].append(s.perf(m, n))
    return [(med(x[0] for x in res[m]), med(x[2] for x in res[m]), [x[0] for x in res[m]])
            for m in (a, b)]


def bench_latency(build, tmp, rounds):
    repo = os.path.join(tmp, "latency")
    write_model(repo, "identity_py", config("identity_py", "python"), IDENTITY_PY)
    write_model(repo, "identity_c", config("identity_c", "identity"))
    s = Server(build, repo)
    try:
        for n in (1, 65536):
            (cp50, ccpu, c), (pp50, pcpu, p) = compare(s, "identity_c", "identity_py", n, rounds)
            goal = "target <= +25 us" if n == 1 else "target <= x1.2"
            print(f"latency FP32[{n}] ({goal}): C identity p50 {cp50:.0f} us, Python identity p50 "
                  f"{pp50:.0f} us: +{pp50 - cp50:.0f} us, x{pp50 / cp50:.2f} | CPU per "
                  f"request C {ccpu:.0f} us, Python {pcpu:.0f} us: +{pcpu - ccpu:.0f} us, "
                  f"x{pcpu / ccpu:.2f}  (p50 per round C {c}, Python {p})", flush=True)
    finally:
        s.stop()


def _burn(seconds, q):
    t = time.monotonic()
    while time.monotonic() - t < seconds:
        pass
    q.put(sum(os.times()[:2]))


def machine_ceiling(seconds=2.0):
    """CPU two busy processes get together over what one gets alone: the
    best ratio any 2-instance model can reach on this machine now."""
    import multiprocessing as mp
    got = []
    for n in (1, 2):
        q = mp.Queue()
        ps = [mp.Process(target=_burn, args=(seconds, q)) for _ in range(n)]
        for p in ps:
            p.start()
        for p in ps:
            p.join()
        got.append(sum(q.get() for _ in range(n)))
    return got[1] / got[0]


def bench_parallel(build, tmp, rounds):
    repo = os.path.join(tmp, "parallel")
    write_model(repo, "cpu1", config("cpu1", "python", 1), CPU_PY)
    write_model(repo, "cpu2", config("cpu2", "python", 2), CPU_PY)
    s = Server(build, repo)
    try:
        one, two = [], []
        for _ in range(rounds):
            one.append(s.perf("cpu1", 1, concurrency=2, window_ms=3000)[1])
            two.append(s.perf("cpu2", 1, concurrency=2, window_ms=3000)[1])
        ceiling = machine_ceiling()
        print(f"parallel (target >= x1.8): CPU-bound numpy model, 2 connections: 1 instance {med(one):.1f} "
              f"infer/s, 2 instances {med(two):.1f} infer/s: x{med(two) / med(one):.2f} "
              f"(rounds 1: {one}, 2: {two}); the machine gives two busy processes "
              f"x{ceiling:.2f} the CPU of one right now", flush=True)
    finally:
        s.stop()


def bench_bls(build, tmp, rounds):
    import make_models
    repo = os.path.join(tmp, "bls")
    write_model(repo, "ident_onnx", config("ident_onnx", "onnxruntime_onnx"),
                onnx=make_models.identity("FP32", (-1,)).SerializeToString())
    write_model(repo, "identity_py", config("identity_py", "python"), IDENTITY_PY)
    write_model(repo, "bls_py", config("bls_py", "python"), BLS_PY)
    write_model(repo, "ens_py_onnx", ENSEMBLE)
    s = Server(build, repo)
    try:
        (ep50, ecpu, e), (bp50, bcpu, b) = compare(s, "ens_py_onnx", "bls_py", 1, rounds)
        print(f"bls (target <= +20 us): ensemble (Python step -> ONNX step) p50 {ep50:.0f} us, Python model "
              f"calling the ONNX model by BLS p50 {bp50:.0f} us: BLS {bp50 - ep50:+.0f} us per "
              f"call | CPU per request {ecpu:.0f} vs {bcpu:.0f} us: {bcpu - ecpu:+.0f} us "
              f"(p50 per round ensemble {e}, BLS {b})",
              flush=True)
    finally:
        s.stop()


def bench_startup(build, tmp, rounds):
    repo = os.path.join(tmp, "startup")
    for i in range(20):
        write_model(repo, f"m{i}", config(f"m{i}", "python", 2), IDENTITY_PY)
    res = {"true": [], "false": []}
    for _ in range(rounds):
        for z in res:
            s = Server(build, repo, [f"--backend-config=python,zygote={z}"])
            res[z].append((s.ready_s, *tree_stat(s.proc.pid)))
            s.stop()
    fz, fs = med(x[0] for x in res["true"]), med(x[0] for x in res["false"])
    cz, cs = med(x[1] for x in res["true"]), med(x[1] for x in res["false"])
    fault = {z: med(x[2] / max(x[3], 1) for x in res[z]) for z in res}
    print(f"startup (target < 1.5 s): 20 models x 2 instances ready in {fz:.2f} s with the zygote ({cz:.2f} CPU s), "
          f"{fs:.2f} s without ({cs:.2f} CPU s): x{fs / fz:.1f} faster "
          f"(rounds with {[round(x[0], 2) for x in res['true']]}, "
          f"without {[round(x[0], 2) for x in res['false']]}); minor page faults per worker "
          f"process {fault['true']:.0f} with the zygote, {fault['false']:.0f} without",
          flush=True)


def main(argv):
    build, rounds, only = "build", 3, "latency,parallel,bls,startup"
    args = list(argv)
    while args:
        a = args.pop(0)
        if a == "--rounds":
            rounds = int(args.pop(0))
        elif a == "--only":
            only = args.pop(0)
        else:
            build = a
    build = os.path.join(ROOT, build)
    tmp = tempfile.mkdtemp(prefix="nereid-bench-python-")
    try:
        with open("/proc/loadavg") as f:
            print(f"load average {f.read().split()[0]}, {rounds} rounds", flush=True)
        for part in only.split(","):
            globals()[f"bench_{part}"](build, tmp, rounds)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main(sys.argv[1:])
