#!/usr/bin/python3
"""The BLS model of bench_python.py (`bls_py`: a model.py calling an ONNX
identity by BLS with its own input and returning the answer), FP32[65536],
on one server per BUILD_DIR started side by side: alternating nereid-perf
windows (1 connection, binary tensors), each window's p50 and the CPU time
per request of the server and of its workers (from /proc). Prints numbers;
not a test. Builds compared in one run see the same machine load.

    bench/bench_python_bls_split.py BUILD_DIR [BUILD_DIR...] [--rounds N] [--elems N]
"""
import os
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "bench"))
sys.path.insert(0, os.path.join(ROOT, "scripts"))
import bench_python as bp  # noqa: E402


def main(argv):
    rounds, elems, builds = 4, 65536, []
    it = iter(argv)
    for a in it:
        if a == "--rounds":
            rounds = int(next(it))
        elif a == "--elems":
            elems = int(next(it))
        else:
            builds.append(a)
    if not builds:
        raise SystemExit(__doc__)
    import make_models
    repo = os.path.join(tempfile.mkdtemp(prefix="blssplit"), "models")
    bp.write_model(repo, "ident_onnx", bp.config("ident_onnx", "onnxruntime_onnx"),
                   onnx=make_models.identity("FP32", (-1,)).SerializeToString())
    bp.write_model(repo, "bls_py", bp.config("bls_py", "python"), bp.BLS_PY)
    servers = {b: bp.Server(b, repo) for b in builds}
    res = {b: [] for b in builds}
    try:
        for s in servers.values():  # warm-up: regions made, plans cached
            s.perf("bls_py", elems, window_ms=500)
        for _ in range(rounds):
            for b, s in servers.items():
                c0, t0 = s.count("bls_py"), bp.tree_stat(s.proc.pid)
                p50, _, _ = s.perf("bls_py", elems)
                t1, n = bp.tree_stat(s.proc.pid), max(s.count("bls_py") - c0, 1)
                res[b].append((p50, (t1["server"] - t0["server"]) * 1e6 / n,
                               (t1["workers"] - t0["workers"]) * 1e6 / n))
    finally:
        for s in servers.values():
            s.stop()
    for b, r in res.items():
        print(f"{b}: FP32[{elems}] p50 {bp.med(x[0] for x in r):.0f} us, CPU per request server "
              f"{bp.med(x[1] for x in r):.0f} us, workers {bp.med(x[2] for x in r):.0f} us "
              f"(rounds: p50 {[x[0] for x in r]}, server {[round(x[1]) for x in r]}, workers "
              f"{[round(x[2]) for x in r]})", flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
