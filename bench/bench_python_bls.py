#!/usr/bin/python3
"""What one BLS call costs, measured from inside a Python model: a model.py
calls an ONNX identity (FP32[n]) by BLS in a loop of CALLS, and the bench
prints per call the wall time, the worker's CPU time (time.process_time:
all its threads), the server's CPU time and the context switches of both
(/proc/<pid>/task/*/status). "build only" makes the same InferenceRequest
objects without exec(): the Python side's share. Prints numbers; not a test.

    bench/bench_python_bls.py [BUILD_DIR] [--calls N] [--rounds R] [--elems N]
    bench/bench_python_bls.py BUILD_DIR BUILD_DIR... [--calls N] [--rounds R] [--elems N]

With several BUILD_DIRs, one server per build runs side by side and the
exec rounds alternate between them, so builds compared in one run see the
same machine load.
"""
import json
import os
import statistics
import sys
import tempfile
import urllib.request

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "bench"))
sys.path.insert(0, os.path.join(ROOT, "scripts"))
import bench_python as bp  # noqa: E402

LOOP_PY = '''
import json
import os
import time
import numpy as np
import triton_python_backend_utils as pb_utils


def switches():
    n = 0
    for t in os.listdir("/proc/self/task"):
        with open(f"/proc/self/task/{t}/status") as f:
            for line in f:
                if line.startswith(("voluntary_ctxt", "nonvoluntary_ctxt")):
                    n += int(line.split()[1])
    return n


class TritonPythonModel:
    def execute(self, requests):
        out = []
        for r in requests:
            mode, n, elems = json.loads(r.inputs()[0].as_numpy()[0])
            x = np.ones(elems, np.float32)
            ins = [pb_utils.Tensor("INPUT0", x)]
            def one():
                q = pb_utils.InferenceRequest(model_name="ident_onnx", inputs=ins,
                                              requested_output_names=["OUTPUT0"])
                if mode != "build":
                    res = q.exec()
                    if res.has_error():
                        raise pb_utils.TritonModelException(res.error().message())
                    res.output_tensors()[0].as_numpy()
            for _ in range(20):
                one()
            if mode == "profile":
                import cProfile, pstats, io
                pr = cProfile.Profile()
                pr.enable()
                for _ in range(n):
                    one()
                pr.disable()
                sio = io.StringIO()
                pstats.Stats(pr, stream=sio).sort_stats("tottime").print_stats(25)
                out.append(pb_utils.InferenceResponse([pb_utils.Tensor(
                    "OUT", np.array([sio.getvalue().encode()], dtype=np.object_))]))
                continue
            s0, c0, t0 = switches(), time.process_time(), time.perf_counter()
            for _ in range(n):
                one()
            t1, c1, s1 = time.perf_counter(), time.process_time(), switches()
            res = [(t1 - t0) / n * 1e6, (c1 - c0) / n * 1e6, (s1 - s0) / n]
            out.append(pb_utils.InferenceResponse([pb_utils.Tensor(
                "OUT", np.array([json.dumps(res).encode()], dtype=np.object_))]))
        return out
'''

LOOP_CONFIG = '''name: "bls_loop"
backend: "python"
input [ { name: "IN" data_type: TYPE_STRING dims: [ 1 ] } ]
output [ { name: "OUT" data_type: TYPE_STRING dims: [ 1 ] } ]
'''


def proc_stat(pid):
    """(CPU seconds, context switches) of pid's threads."""
    tck = os.sysconf("SC_CLK_TCK")
    cpu, sw = 0.0, 0
    for t in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{t}/stat") as f:
                st = f.read().rsplit(")", 1)[1].split()
            cpu += (int(st[11]) + int(st[12])) / tck
            with open(f"/proc/{pid}/task/{t}/status") as f:
                for line in f:
                    if line.startswith(("voluntary_ctxt", "nonvoluntary_ctxt")):
                        sw += int(line.split()[1])
        except OSError:
            pass
    return cpu, sw


def run(s, mode, calls, elems):
    body = json.dumps({"inputs": [{"name": "IN", "datatype": "BYTES", "shape": [1],
                                   "data": [json.dumps([mode, calls, elems])]}]}).encode()
    cpu0, sw0 = proc_stat(s.proc.pid)
    req = urllib.request.Request(f"http://127.0.0.1:{s.port}/v2/models/bls_loop/infer", body,
                                 {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=600) as r:
        res = json.loads(json.load(r)["outputs"][0]["data"][0])
    cpu1, sw1 = proc_stat(s.proc.pid)
    return res + [(cpu1 - cpu0) / calls * 1e6, (sw1 - sw0) / calls]


def side_by_side(builds, repo, calls, rounds, elems):
    """One server per build, exec rounds alternating between them."""
    servers = {b: bp.Server(b, repo) for b in builds}
    res = {b: [] for b in builds}
    try:
        for s in servers.values():  # warm-up: regions made
            run(s, "exec", 50, elems)
        for _ in range(rounds):
            for b, s in servers.items():
                res[b].append(run(s, "exec", calls, elems))
    finally:
        for s in servers.values():
            s.stop()
    for b, rs in res.items():
        m = [statistics.median(r[i] for r in rs) for i in range(5)]
        print(f"{b}: exec wall {m[0]:6.1f} us/call | worker CPU {m[1]:6.1f} us | server CPU "
              f"{m[3]:6.1f} us  (wall per round {[round(r[0], 1) for r in rs]}, server "
              f"{[round(r[3], 1) for r in rs]})", flush=True)


def main(argv):
    builds, calls, rounds, elems = [], 5000, 3, 1
    args = list(argv)
    while args:
        a = args.pop(0)
        if a == "--calls":
            calls = int(args.pop(0))
        elif a == "--rounds":
            rounds = int(args.pop(0))
        elif a == "--profile":
            pass
        elif a == "--elems":
            elems = int(args.pop(0))
        else:
            builds.append(a)
    import make_models
    tmp = tempfile.mkdtemp(prefix="bench-bls-")
    repo = os.path.join(tmp, "repo")
    bp.write_model(repo, "ident_onnx", bp.config("ident_onnx", "onnxruntime_onnx"),
                   onnx=make_models.identity("FP32", (-1,)).SerializeToString())
    bp.write_model(repo, "bls_loop", LOOP_CONFIG, LOOP_PY)
    with open("/proc/loadavg") as f:
        load = f.read().split()[0]
    if len(builds) > 1:
        print(f"load average {load}, {calls} calls x {rounds} rounds, FP32[{elems}], side by side",
              flush=True)
        side_by_side(builds, repo, calls, rounds, elems)
        return
    s = bp.Server(builds[0] if builds else "build", repo)
    print(f"load average {load}, {calls} calls x {rounds} rounds, FP32[{elems}]", flush=True)
    try:
        if "--profile" in argv:
            body = json.dumps({"inputs": [{"name": "IN", "datatype": "BYTES", "shape": [1],
                                           "data": [json.dumps(["profile", calls, elems])]}]})
            req = urllib.request.Request(f"http://127.0.0.1:{s.port}/v2/models/bls_loop/infer",
                                         body.encode(), {"Content-Type": "application/json"})
            with urllib.request.urlopen(req, timeout=600) as r:
                print(json.load(r)["outputs"][0]["data"][0])
            return
        for mode in ("build", "exec"):
            rs = [run(s, mode, calls, elems) for _ in range(rounds)]
            m = [statistics.median(r[i] for r in rs) for i in range(5)]
            print(f"{mode:5s}: wall {m[0]:6.1f} us/call | worker CPU {m[1]:6.1f} us | server CPU "
                  f"{m[3]:6.1f} us | switches worker {m[2]:.2f} "
                  f"server {m[4]:.2f} per call  (wall per round "
                  f"{[round(r[0], 1) for r in rs]})", flush=True)
    finally:
        s.stop()


if __name__ == "__main__":
    main(sys.argv[1:])
