#!/usr/bin/python3
"""The floor of a Python model's request: what one worker process per
instance costs, before any Python runs.

    bench/bench_python_floor.py [BUILD_DIR] [--rounds N] [--sizes 1,65536]

Builds bench/python_floor_worker.c (a worker that speaks the Python
backend's protocol and answers every EXECUTE as an identity, with no Python
in it) and starts three servers from BUILD_DIR (default build), each
serving the C identity backend beside a `backend: "python"` identity:

  python      the real worker (nereid_python_stub.py), default settings
  python/0    the real worker, --backend-config=python,spin-wait-us=0
  floor       the C worker in its place (NEREID_PYTHON, zygote=false,
              spin-wait-us=0)

For each size, N rounds; in each round every server runs a nereid-perf
window (1 connection, binary tensors, 1.5 s) on its C identity and then
on its Python model. Printed per server: the median p50 of both, the
difference, and the median of the per-round ratios (each Python window
over the C window just before it, on the same server).

What the floor measures is the process boundary itself on this machine
(two context switches and wake-ups, the copy of the request into the
EXECUTE region), so the distance between "floor" and "python/0" is what
the Python worker adds.
"""
import os
import shutil
import statistics
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "bench"))
import bench_python as bp  # noqa: E402


def build_worker(tmp):
    exe = os.path.join(tmp, "floor_worker")
    cc = shutil.which("cc") or shutil.which("gcc")
    subprocess.run([cc, "-O2", "-Wall", "-Wextra", "-Werror", "-o", exe,
                    os.path.join(ROOT, "bench", "python_floor_worker.c")], check=True)
    return exe


def main(argv):
    build, rounds, sizes = "build", 3, (1, 65536)
    args = list(argv)
    while args:
        a = args.pop(0)
        if a == "--rounds":
            rounds = int(args.pop(0))
        elif a == "--sizes":
            sizes = tuple(int(x) for x in args.pop(0).split(","))
        else:
            build = a
    build = os.path.abspath(build)
    tmp = tempfile.mkdtemp(prefix="bench-floor-")
    servers = {}
    try:
        exe = build_worker(tmp)
        repo = os.path.join(tmp, "models")
        bp.write_model(repo, "identity_py", bp.config("identity_py", "python"), bp.IDENTITY_PY)
        bp.write_model(repo, "identity_c", bp.config("identity_c", "identity"))
        off = "--backend-config=python,spin-wait-us=0"
        servers["python"] = bp.Server(build, repo)
        servers["python/0"] = bp.Server(build, repo, [off])
        os.environ["NEREID_PYTHON"] = exe
        try:
            servers["floor"] = bp.Server(build, repo, [off, "--backend-config=python,zygote=false"])
        finally:
            del os.environ["NEREID_PYTHON"]
        print(f"load average {os.getloadavg()[0]:.2f}, {rounds} rounds", flush=True)
        for n in sizes:
            res = {k: ([], []) for k in servers}
            for _ in range(rounds):
                for k, s in servers.items():
                    res[k][0].append(s.perf("identity_c", n)[0])
                    res[k][1].append(s.perf("identity_py", n)[0])
            for k, (c, p) in res.items():
                mc, mp = statistics.median(c), statistics.median(p)
                ratio = statistics.median(b / a for a, b in zip(c, p))
                print(f"FP32[{n}] {k:9s} C identity p50 {mc:.0f} us, Python model p50 {mp:.0f} us: "
                      f"{mp - mc:+.0f} us, x{ratio:.2f} (per-round ratios)  (C {c}, model {p})",
                      flush=True)
    finally:
        for s in servers.values():
            s.stop()
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main(sys.argv[1:])
