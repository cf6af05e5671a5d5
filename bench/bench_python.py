#!/usr/bin/python3
"""Python backend against its C and ensemble counterparts, in one run.

    bench/bench_python.py [BUILD_DIR] [--rounds N] [--only latency,parallel,bls,startup,zygote]
                          [--server-arg FLAG]...

Writes scratch repositories, starts BUILD_DIR/nereid (default build) on free
ports and prints, for each of issue 24's performance goals, both sides and
their ratio or difference:

  latency   identity_py (a model.py returning its input) vs the C identity
            backend, FP32[1] and FP32[65536], HTTP binary tensors, 1
            connection (nereid-perf): p50 latency and the CPU time the server
            and its workers spend per request (from /proc: steadier than the
            latency on a shared machine). Rounds alternate the two models.
  parallel  a CPU-bound numpy model.py with 1 and with 2 instances, 4
            connections: throughput ratio, beside what the machine gives two
            busy processes and how many instances were busy at a time.
  bls       a model.py that returns an ONNX identity's answer through BLS vs
            an ensemble of identity_py and the same ONNX identity, FP32[1]
            and FP32[65536]: p50 difference (what BLS costs per call over
            an ensemble step).
  startup   20 model.py models x 2 instances: wall time to "ready" and the
            CPU time spent, with the zygote and without it
            (--backend-config=python,zygote=false).
  zygote    the same with the zygote only (a short run).

The machine's load moves the latencies; each figure is the median over the
rounds.
"""
import json
import os
import resource
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
    return tree_stat(root)["cpu"]


def private_dirty_kb(pid):
    try:
        with open(f"/proc/{pid}/smaps_rollup") as f:
            for line in f:
                if line.startswith("Private_Dirty:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


def run_ns(pid, st):
    """Nanoseconds pid has run: /proc/<pid>/schedstat for a single-threaded
    process (it counts the main thread only), else its ticks in st (the
    fields of /proc/<pid>/stat, which include ended threads)."""
    if int(st[17]) == 1:
        try:
            with open(f"/proc/{pid}/schedstat") as f:
                return int(f.read().split()[0])
        except (OSError, ValueError, IndexError):
            pass
    return (int(st[11]) + int(st[12])) * 1_000_000_000 // os.sysconf("SC_CLK_TCK")


def tree_stat(root):
    """CPU seconds of root and its descendants (with the children they
    reaped: the zygote's probe), split into the server, the zygote and the
    workers, and the workers' minor page faults and private dirty memory
    (the processes below the server other than the zygote)."""
    tck = os.sysconf("SC_CLK_TCK")
    kids, stats, faults, cmds = {}, {}, {}, {}
    for p in os.listdir("/proc"):
        if not p.isdigit():
            continue
        try:
            with open(f"/proc/{p}/stat") as f:
                st = f.read().rsplit(")", 1)[1].split()
            with open(f"/proc/{p}/cmdline", "rb") as f:
                cmds[int(p)] = f.read()
        except OSError:
            continue
        kids.setdefault(int(st[1]), []).append(int(p))
        # on-CPU time in ns where schedstat has it (/proc/<pid>/stat's ticks
        # truncate each worker's few tens of ms to 10 ms steps) and the
        # reaped children's in ticks (the zygote's probe)
        stats[int(p)] = run_ns(p, st) / 1e9 + (int(st[13]) + int(st[14])) / tck
        faults[int(p)] = int(st[7])
    out = {"cpu": 0.0, "server": stats.get(root, 0.0), "zygote": 0.0, "workers": 0.0,
           "minflt": 0, "n": 0, "dirty_kb": 0}
    todo = [root]
    while todo:
        p = todo.pop()
        out["cpu"] += stats.get(p, 0.0)
        if p != root:
            if b"nereid_python_zygote" in cmds.get(p, b""):
                out["zygote"] += stats.get(p, 0.0)
            else:
                out["workers"] += stats.get(p, 0.0)
                out["minflt"] += faults.get(p, 0)
                out["dirty_kb"] += private_dirty_kb(p)
                out["n"] += 1
        todo.extend(kids.get(p, []))
    return out


class Server:
    def __init__(self, build, repo, args=()):
        self.build = build
        self.port = free_port()
        self.log = open(os.path.join(repo, "..", f"server-{self.port}.log"), "w+")
        self.t0 = time.monotonic()
        self.proc = subprocess.Popen(
            [os.path.join(build, "nereid"), f"--model-repository={repo}",
             f"--http-port={self.port}", f"--grpc-port={free_port()}",
             f"--metrics-port={free_port()}", *args, *SERVER_ARGS], stdout=self.log,
            stderr=subprocess.STDOUT)
        deadline = time.time() + 120
        while "nereid ready" not in open(self.log.name).read():
            if time.time() > deadline or self.proc.poll() is not None:
                raise SystemExit("server did not start:\n" + open(self.log.name).read())
            time.sleep(0.005)
        self.ready_s = time.monotonic() - self.t0

    def count(self, model):
        return self.stats(model)[0]

    def stats(self, model):
        """(successful requests, ns spent computing (compute_input, _infer
        and _output) summed over the instances) so far."""
        with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/v2/models/{model}/stats") as r:
            st = json.load(r)["model_stats"]
        return (sum(s["inference_stats"]["success"]["count"] for s in st),
                sum(s["inference_stats"][k]["ns"] for s in st
                    for k in ("compute_input", "compute_infer", "compute_output")))

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


def client_cpu_s():
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


PARALLEL_CONNECTIONS = 4  # a request always waits for each instance: the client's turnaround is not measured


def parallel_round(s, model):
    """One nereid-perf window on model: (throughput/s, instances busy:
    compute time over the window, CPU ms per request of the server
    and its workers, of the client)."""
    n0, busy0 = s.stats(model)
    cpu0, client0, t0 = tree_cpu_s(s.proc.pid), client_cpu_s(), time.monotonic()
    thr = s.perf(model, 1, concurrency=PARALLEL_CONNECTIONS, window_ms=3000)[1]
    wall = time.monotonic() - t0
    n1, busy1 = s.stats(model)
    reqs = max(n1 - n0, 1)
    return (thr, (busy1 - busy0) / 1e9 / wall, (tree_cpu_s(s.proc.pid) - cpu0) * 1e3 / reqs,
            (client_cpu_s() - client0) * 1e3 / reqs)


def bench_parallel(build, tmp, rounds):
    """The goal is that two instances run at once: the throughput ratio
    shows it only when the machine has two cores free, so beside it the
    bench prints what two busy processes get over one around the runs, and
    how many instances were busy at a time (the model's compute time
    over the wall time), which does not depend on the load."""
    repo = os.path.join(tmp, "parallel")
    write_model(repo, "cpu1", config("cpu1", "python", 1), CPU_PY)
    write_model(repo, "cpu2", config("cpu2", "python", 2), CPU_PY)
    s = Server(build, repo)
    try:
        ceilings = [machine_ceiling()]
        one, two = [], []
        for _ in range(rounds):
            one.append(parallel_round(s, "cpu1"))
            two.append(parallel_round(s, "cpu2"))
        ceilings.append(machine_ceiling())
        t1, t2 = med(x[0] for x in one), med(x[0] for x in two)
        print(f"parallel (target >= x1.8): CPU-bound numpy model, {PARALLEL_CONNECTIONS} connections: 1 instance {t1:.1f} "
              f"infer/s, 2 instances {t2:.1f} infer/s: x{t2 / t1:.2f} (rounds 1: "
              f"{[round(x[0], 1) for x in one]}, 2: {[round(x[0], 1) for x in two]}); the machine "
              f"gives two busy processes x{ceilings[0]:.2f} / x{ceilings[1]:.2f} (before / after) "
              f"the CPU of one (the model got {t2 / t1 / med(ceilings):.2f} of that) | instances busy at a time {med(x[1] for x in one):.2f} vs "
              f"{med(x[1] for x in two):.2f} | CPU per request: server and workers "
              f"{med(x[2] for x in one):.1f} / {med(x[2] for x in two):.1f} ms, client "
              f"{med(x[3] for x in one):.2f} / {med(x[3] for x in two):.2f} ms", flush=True)
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
        for n in (1, 65536):  # FP32[65536]: 256 KiB each way, in BLS regions
            (ep50, ecpu, e), (bp50, bcpu, b) = compare(s, "ens_py_onnx", "bls_py", n, rounds)
            print(f"bls FP32[{n}] (target <= +20 us): ensemble (Python step -> ONNX step) p50 "
                  f"{ep50:.0f} us, Python model calling the ONNX model by BLS p50 {bp50:.0f} us: "
                  f"BLS {bp50 - ep50:+.0f} us per call | CPU per request {ecpu:.0f} vs "
                  f"{bcpu:.0f} us: {bcpu - ecpu:+.0f} us (p50 per round ensemble {e}, BLS {b})",
                  flush=True)
    finally:
        s.stop()


def bench_zygote(build, tmp, rounds):
    """startup with the zygote only (a short run for a quiet minute)."""
    bench_startup(build, tmp, rounds, ("true",))


def bench_startup(build, tmp, rounds, modes=("true", "false")):
    repo = os.path.join(tmp, "startup")
    for i in range(20):
        write_model(repo, f"m{i}", config(f"m{i}", "python", 2), IDENTITY_PY)
    res = {z: [] for z in modes}
    for _ in range(rounds):
        for z in res:
            s = Server(build, repo, [f"--backend-config=python,zygote={z}"])
            st = tree_stat(s.proc.pid)
            res[z].append((s.ready_s, st))
            s.stop()
            n = max(st["n"], 1)
            print(f"  startup round, zygote={z}: ready in {s.ready_s:.2f} s, CPU {st['cpu']:.2f} s "
                  f"(server {st['server']:.2f}, zygote {st['zygote']:.2f}, {st['n']} workers "
                  f"{st['workers']:.2f}: {st['workers'] * 1000 / n:.0f} ms each); per worker "
                  f"{st['minflt'] / n:.0f} minor faults, {st['dirty_kb'] / n:.0f} kB private "
                  "dirty", flush=True)
    fault = {z: med(x[1]["minflt"] / max(x[1]["n"], 1) for x in res[z]) for z in res}
    fz, cz = med(x[0] for x in res["true"]), med(x[1]["cpu"] for x in res["true"])
    if "false" not in res:
        print(f"startup (target < 1.5 s): 20 models x 2 instances ready in {fz:.2f} s with the "
              f"zygote ({cz:.2f} CPU s; rounds {[round(x[0], 2) for x in res['true']]}); "
              f"minor page faults per worker process {fault['true']:.0f}", flush=True)
        return
    fs, cs = med(x[0] for x in res["false"]), med(x[1]["cpu"] for x in res["false"])
    print(f"startup (target < 1.5 s): 20 models x 2 instances ready in {fz:.2f} s with the zygote ({cz:.2f} CPU s), "
          f"{fs:.2f} s without ({cs:.2f} CPU s): x{fs / fz:.1f} faster "
          f"(rounds with {[round(x[0], 2) for x in res['true']]}, "
          f"without {[round(x[0], 2) for x in res['false']]}); minor page faults per worker "
          f"process {fault['true']:.0f} with the zygote, {fault['false']:.0f} without",
          flush=True)


SERVER_ARGS = []  # --server-arg: more flags for every server the bench starts


def main(argv):
    build, rounds, only = "build", 3, "latency,parallel,bls,startup"
    args = list(argv)
    while args:
        a = args.pop(0)
        if a == "--rounds":
            rounds = int(args.pop(0))
        elif a == "--only":
            only = args.pop(0)
        elif a == "--server-arg":  # e.g. --backend-config=python,spin-wait-us=200
            SERVER_ARGS.append(args.pop(0))
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
